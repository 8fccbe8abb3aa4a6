variable "name" {
  description = "Name of the IAM role (and instance profile) Silt runs as, e.g. silt-agents."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9+=,.@_-]{1,64}$", var.name))
    error_message = "The role name must be 1 to 64 characters: letters, digits and +=,.@_-."
  }
}

variable "bucket_access" {
  description = "Grant access to the archive bucket under bucket_prefix (agents, compactor); false for roles that need none (metadata nodes). A plain flag, so the plan does not depend on the bucket's ARN being known."
  type        = bool
  default     = false
  nullable    = false
}

variable "bucket_arn" {
  description = "ARN of the archive bucket; required when bucket_access is true."
  type        = string
  default     = null

  validation {
    condition     = var.bucket_arn == null || can(regex("^arn:aws[a-z-]*:s3:::[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket_arn))
    error_message = "bucket_arn must be an S3 bucket ARN (arn:aws:s3:::name)."
  }
}

variable "bucket_prefix" {
  description = "Key prefix the role may read, write and list under; empty for the whole bucket."
  type        = string
  default     = ""
  nullable    = false

  validation {
    condition     = !startswith(var.bucket_prefix, "/") && !endswith(var.bucket_prefix, "/")
    error_message = "bucket_prefix must not start or end with a slash."
  }
}

variable "readable_object_arns" {
  description = "Further S3 object ARNs the role may read, such as the silt release artifact when silt_binary_url is an s3:// URL."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition     = alltrue([for arn in var.readable_object_arns : can(regex("^arn:aws[a-z-]*:s3:::.+/.+$", arn))])
    error_message = "Each readable object must be an S3 object ARN (arn:aws:s3:::bucket/key)."
  }
}

variable "trusted_services" {
  description = "AWS services allowed to assume the role."
  type        = list(string)
  default     = ["ec2.amazonaws.com"]
  nullable    = false

  validation {
    condition     = length(var.trusted_services) > 0 && alltrue([for s in var.trusted_services : endswith(s, ".amazonaws.com")])
    error_message = "Give at least one service principal such as ec2.amazonaws.com."
  }
}

variable "create_instance_profile" {
  description = "Also create an EC2 instance profile for the role."
  type        = bool
  default     = true
  nullable    = false
}

variable "enable_ssm" {
  description = "Attach AmazonSSMManagedInstanceCore so operators reach the hosts through SSM Session Manager instead of SSH (no inbound port)."
  type        = bool
  default     = true
  nullable    = false
}

variable "permissions_boundary_arn" {
  description = "ARN of a permissions boundary policy for the role, if the account requires one."
  type        = string
  default     = null

  validation {
    condition     = var.permissions_boundary_arn == null || can(regex("^arn:aws[a-z-]*:iam::([0-9]{12}|aws):policy/.+$", var.permissions_boundary_arn))
    error_message = "permissions_boundary_arn must be an IAM policy ARN."
  }
}

variable "tags" {
  description = "Tags for the role and instance profile."
  type        = map(string)
  default     = {}
  nullable    = false
}

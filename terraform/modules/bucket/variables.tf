variable "bucket_name" {
  description = "Name of the S3 bucket that holds Silt's archived segments (globally unique)."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket_name)) && !can(regex("\\.\\.", var.bucket_name))
    error_message = "The bucket name must be 3 to 63 lowercase letters, digits, dots and hyphens, starting and ending with a letter or digit."
  }
}

variable "prefix" {
  description = "Key prefix Silt writes under (the path of s3://bucket/prefix), without leading or trailing slashes; empty for the whole bucket. The lifecycle rules apply to this prefix, as `silt bucket init` does."
  type        = string
  default     = "silt"
  nullable    = false

  validation {
    condition     = var.prefix == "" || can(regex("^[A-Za-z0-9!_.*'()=-]+(/[A-Za-z0-9!_.*'()=-]+)*$", var.prefix))
    error_message = "The prefix must not start or end with a slash, contain an empty segment (//), or use characters outside S3's safe set."
  }
}

variable "versioning" {
  description = "Turn on object versioning (as `silt bucket init --versioning`). Objects the compactor deletes or replaces then stay as noncurrent versions for 7 days before they expire."
  type        = bool
  default     = false
  nullable    = false
}

variable "writer_role_arns" {
  description = "ARNs of the IAM roles Silt runs as (agents, compactor). Only they may write or delete objects in the bucket; they may read and write only under the prefix."
  type        = list(string)

  validation {
    condition     = length(var.writer_role_arns) > 0 && alltrue([for arn in var.writer_role_arns : can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:role/.+$", arn))])
    error_message = "Give at least one IAM role ARN (arn:aws:iam::<account>:role/<name>)."
  }
}

variable "reader_principal_arns" {
  description = "ARNs of further IAM roles or users allowed to read the archive (for example analysts running DuckDB on the Parquet files). Everyone else is denied object reads."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition     = alltrue([for arn in var.reader_principal_arns : can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:(role|user)/.+$", arn))])
    error_message = "Each reader must be an IAM role or user ARN."
  }
}

variable "admin_principal_arns" {
  description = "ARNs of IAM roles or users exempt from the bucket policy's denials (break-glass access, or the role Terraform runs as when force_destroy must empty the bucket). They get no access from the policy itself."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition     = alltrue([for arn in var.admin_principal_arns : can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:(role|user)/.+$", arn))])
    error_message = "Each administrator must be an IAM role or user ARN."
  }
}

variable "force_destroy" {
  description = "Let `terraform destroy` delete the bucket even when it still holds objects (the principal running Terraform must then be in admin_principal_arns). Leave false in production: the archive is the only copy of history."
  type        = bool
  default     = false
  nullable    = false
}

variable "tags" {
  description = "Tags for the bucket."
  type        = map(string)
  default     = {}
  nullable    = false
}

variable "endpoint" {
  description = "LocalStack's edge endpoint (S3, IAM and STS)."
  type        = string
  default     = "http://127.0.0.1:4566"
  nullable    = false

  validation {
    condition     = can(regex("^https?://[^/]+$", var.endpoint))
    error_message = "endpoint must be a URL like http://127.0.0.1:4566, without a path."
  }
}

variable "region" {
  description = "Region to tell LocalStack (any region works; us-east-1 is LocalStack's default)."
  type        = string
  default     = "us-east-1"
  nullable    = false

  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]+$", var.region))
    error_message = "region must be an AWS region such as us-east-1."
  }
}

variable "access_key" {
  description = "Access key for LocalStack (it accepts any)."
  type        = string
  default     = "test"
  nullable    = false

  validation {
    condition     = length(var.access_key) > 0
    error_message = "access_key must not be empty."
  }
}

variable "secret_key" {
  description = "Secret key for LocalStack (it accepts any; not a secret)."
  type        = string
  default     = "test"
  nullable    = false

  validation {
    condition     = length(var.secret_key) > 0
    error_message = "secret_key must not be empty."
  }
}

variable "bucket_name" {
  description = "Name of the archive bucket to create in LocalStack."
  type        = string
  default     = "silt-archive"
  nullable    = false

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket_name))
    error_message = "bucket_name must be a valid S3 bucket name."
  }
}

variable "bucket_prefix" {
  description = "Key prefix of the archive in the bucket."
  type        = string
  default     = "dev"
  nullable    = false

  validation {
    condition     = !startswith(var.bucket_prefix, "/") && !endswith(var.bucket_prefix, "/")
    error_message = "bucket_prefix must not start or end with a slash."
  }
}

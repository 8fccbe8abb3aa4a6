variable "region" {
  description = "AWS region to deploy to."
  type        = string

  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]+$", var.region))
    error_message = "region must be an AWS region such as eu-west-1."
  }
}

variable "name" {
  description = "Name prefix of everything this stack creates (at most 20 characters)."
  type        = string
  default     = "silt"
  nullable    = false

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9-]{0,19}$", var.name))
    error_message = "The name must be 1 to 20 letters, digits or hyphens."
  }
}

variable "vpc_id" {
  description = "Existing VPC to deploy into."
  type        = string

  validation {
    condition     = can(regex("^vpc-[0-9a-f]+$", var.vpc_id))
    error_message = "vpc_id must look like vpc-0123456789abcdef0."
  }
}

variable "private_subnet_ids" {
  description = "Private subnets of that VPC, one per availability zone, at least 3 zones. They need a route to S3 (ideally an S3 gateway endpoint) and to SSM and the release URL (NAT or endpoints)."
  type        = list(string)

  validation {
    condition     = length(var.private_subnet_ids) >= 3
    error_message = "Give at least 3 private subnets in 3 availability zones."
  }
}

variable "bucket_name" {
  description = "Name of the archive bucket to create (globally unique)."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket_name))
    error_message = "bucket_name must be a valid S3 bucket name."
  }
}

variable "bucket_prefix" {
  description = "Key prefix of the archive in the bucket."
  type        = string
  default     = "silt"
  nullable    = false

  validation {
    condition     = !startswith(var.bucket_prefix, "/") && !endswith(var.bucket_prefix, "/")
    error_message = "bucket_prefix must not start or end with a slash."
  }
}

variable "bucket_versioning" {
  description = "Turn on versioning of the archive bucket."
  type        = bool
  default     = false
  nullable    = false
}

variable "client_cidrs" {
  description = "CIDR blocks allowed to reach the agents' load balancer (producers and consumers)."
  type        = list(string)

  validation {
    condition     = length(var.client_cidrs) > 0 && alltrue([for c in var.client_cidrs : can(cidrhost(c, 0))])
    error_message = "Give at least one valid CIDR block."
  }
}

variable "admin_cidrs" {
  description = "CIDR blocks of operators allowed to reach the metadata nodes and agents directly; empty to use SSM Session Manager only."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition     = alltrue([for c in var.admin_cidrs : can(cidrhost(c, 0))])
    error_message = "Each admin CIDR must be a valid CIDR block."
  }
}

variable "architecture" {
  description = "arm64 (Graviton) or x86_64, for every instance and the silt binary."
  type        = string
  default     = "arm64"
  nullable    = false

  validation {
    condition     = contains(["arm64", "x86_64"], var.architecture)
    error_message = "architecture must be arm64 or x86_64."
  }
}

variable "silt_binary_url" {
  description = "https:// or s3:// URL of the silt binary (or a .tar.gz holding it) for architecture."
  type        = string

  validation {
    condition     = can(regex("^(https|s3)://[^ ]+$", var.silt_binary_url))
    error_message = "silt_binary_url must be an https:// or s3:// URL."
  }
}

variable "silt_binary_sha256" {
  description = "SHA-256 of the file at silt_binary_url."
  type        = string

  validation {
    condition     = can(regex("^[0-9a-f]{64}$", var.silt_binary_sha256))
    error_message = "silt_binary_sha256 must be 64 lowercase hex digits."
  }
}

variable "metadata_bootstrap" {
  description = "Form a new metadata cluster (node 1 starts with --init). Leave true for the first apply, then set false."
  type        = bool
  default     = true
  nullable    = false
}

variable "metadata_node_count" {
  description = "3 or 5 metadata nodes."
  type        = number
  default     = 3
  nullable    = false

  validation {
    condition     = contains([3, 5], var.metadata_node_count)
    error_message = "metadata_node_count must be 3 or 5."
  }
}

variable "metadata_instance_type" {
  description = "Instance type of the metadata nodes (matching architecture)."
  type        = string
  default     = "m7g.large"
  nullable    = false

  validation {
    condition     = length(var.metadata_instance_type) > 0
    error_message = "metadata_instance_type must not be empty."
  }
}

variable "agent_instance_type" {
  description = "Instance type of the agents (matching architecture)."
  type        = string
  default     = "m7g.xlarge"
  nullable    = false

  validation {
    condition     = length(var.agent_instance_type) > 0
    error_message = "agent_instance_type must not be empty."
  }
}

variable "agent_count" {
  description = "Number of agents (the auto scaling group's minimum and desired size)."
  type        = number
  default     = 3
  nullable    = false

  validation {
    condition     = var.agent_count >= 1 && var.agent_count <= 100
    error_message = "agent_count must be from 1 to 100."
  }
}

variable "hot_tail_volume_size_gb" {
  description = "Size of each agent's hot tail EBS volume in GiB (docs/deploy.md has the formula)."
  type        = number
  default     = 500
  nullable    = false

  validation {
    condition     = var.hot_tail_volume_size_gb >= 20
    error_message = "hot_tail_volume_size_gb must be at least 20."
  }
}

variable "tags" {
  description = "Tags for every resource (also set as the provider's default tags)."
  type        = map(string)
  default     = { "app" = "silt" }
  nullable    = false
}

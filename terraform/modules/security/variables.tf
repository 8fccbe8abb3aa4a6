variable "name" {
  description = "Name prefix for the security groups, e.g. silt-prod."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9-]{1,32}$", var.name))
    error_message = "The name must be 1 to 32 letters, digits or hyphens."
  }
}

variable "vpc_id" {
  description = "VPC the security groups belong to."
  type        = string

  validation {
    condition     = can(regex("^vpc-[0-9a-f]+$", var.vpc_id))
    error_message = "vpc_id must look like vpc-0123456789abcdef0."
  }
}

variable "agent_port" {
  description = "Port the agents serve their client API on (and the load balancer's target port)."
  type        = number
  default     = 7070
  nullable    = false

  validation {
    condition     = var.agent_port >= 1024 && var.agent_port <= 65535 && floor(var.agent_port) == var.agent_port
    error_message = "agent_port must be a whole number from 1024 to 65535."
  }
}

variable "listener_port" {
  description = "Port the load balancer listens on for clients; null for the agent port."
  type        = number
  default     = null

  validation {
    condition     = var.listener_port == null || (coalesce(var.listener_port, 1) >= 1 && coalesce(var.listener_port, 1) <= 65535)
    error_message = "listener_port must be from 1 to 65535."
  }
}

variable "metadata_port" {
  description = "Port the metadata nodes serve peers, agents and operators on."
  type        = number
  default     = 7101
  nullable    = false

  validation {
    condition     = var.metadata_port >= 1024 && var.metadata_port <= 65535 && floor(var.metadata_port) == var.metadata_port
    error_message = "metadata_port must be a whole number from 1024 to 65535."
  }
}

variable "client_cidrs" {
  description = "CIDR blocks of the producers and consumers allowed to reach the load balancer. No default: decide who may talk to Silt (its API has no authentication yet)."
  type        = list(string)
  nullable    = false

  validation {
    condition     = alltrue([for c in var.client_cidrs : can(cidrhost(c, 0))])
    error_message = "Each client CIDR must be a valid IPv4 or IPv6 CIDR block such as 10.0.0.0/16."
  }
}

variable "client_security_group_ids" {
  description = "Security groups of clients allowed to reach the load balancer, in addition to client_cidrs."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition     = alltrue([for g in var.client_security_group_ids : can(regex("^sg-[0-9a-f]+$", g))])
    error_message = "Each client security group must look like sg-0123456789abcdef0."
  }
}

variable "admin_cidrs" {
  description = "CIDR blocks of operators allowed to reach the metadata nodes (silt cluster status) and the agents directly. Empty by default: operators use SSM Session Manager on the hosts."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition     = alltrue([for c in var.admin_cidrs : can(cidrhost(c, 0))])
    error_message = "Each admin CIDR must be a valid CIDR block."
  }
}

variable "egress_https_cidrs" {
  description = "Where the hosts may open HTTPS connections: S3, SSM and the silt release artifact. Narrow it when the VPC has endpoints for them."
  type        = list(string)
  default     = ["0.0.0.0/0"]
  nullable    = false

  validation {
    condition     = alltrue([for c in var.egress_https_cidrs : can(cidrhost(c, 0))])
    error_message = "Each egress CIDR must be a valid CIDR block."
  }
}

variable "egress_https_prefix_list_ids" {
  description = "Managed prefix lists the hosts may reach over HTTPS (for example the S3 gateway endpoint's pl-... list), in addition to egress_https_cidrs."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition     = alltrue([for p in var.egress_https_prefix_list_ids : can(regex("^pl-[0-9a-f]+$", p))])
    error_message = "Each prefix list id must look like pl-0123456789abcdef0."
  }
}

variable "tags" {
  description = "Tags for the security groups."
  type        = map(string)
  default     = {}
  nullable    = false
}

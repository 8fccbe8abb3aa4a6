variable "name" {
  description = "Name prefix for the agents and their resources, e.g. silt-prod (at most 20 characters: load balancer names are short)."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9-]{0,19}$", var.name))
    error_message = "The name must be 1 to 20 letters, digits or hyphens, starting with a letter or digit."
  }
}

variable "vpc_id" {
  description = "VPC of the agents and their load balancer."
  type        = string

  validation {
    condition     = can(regex("^vpc-[0-9a-f]+$", var.vpc_id))
    error_message = "vpc_id must look like vpc-0123456789abcdef0."
  }
}

variable "subnet_ids" {
  description = "Private subnets the auto scaling group spreads the agents over, one per availability zone."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) >= 2 && alltrue([for s in var.subnet_ids : can(regex("^subnet-[0-9a-f]+$", s))])
    error_message = "Give at least 2 subnet ids (subnet-...), in different availability zones."
  }
}

variable "lb_subnet_ids" {
  description = "Subnets of the network load balancer; null for subnet_ids. Public subnets only together with internal_lb = false."
  type        = list(string)
  default     = null

  validation {
    condition     = var.lb_subnet_ids == null || alltrue([for s in coalesce(var.lb_subnet_ids, []) : can(regex("^subnet-[0-9a-f]+$", s))])
    error_message = "Each load balancer subnet must look like subnet-0123456789abcdef0."
  }
}

variable "internal_lb" {
  description = "Make the network load balancer internal (reachable from the VPC and peered networks only)."
  type        = bool
  default     = true
  nullable    = false
}

variable "security_group_ids" {
  description = "Security groups of the agents (the security module's agents_security_group_id)."
  type        = list(string)

  validation {
    condition     = length(var.security_group_ids) > 0 && alltrue([for g in var.security_group_ids : can(regex("^sg-[0-9a-f]+$", g))])
    error_message = "Give at least one security group id (sg-...)."
  }
}

variable "lb_security_group_ids" {
  description = "Security groups of the network load balancer (the security module's lb_security_group_id)."
  type        = list(string)

  validation {
    condition     = length(var.lb_security_group_ids) > 0 && alltrue([for g in var.lb_security_group_ids : can(regex("^sg-[0-9a-f]+$", g))])
    error_message = "Give at least one security group id (sg-...)."
  }
}

variable "agent_port" {
  description = "Port the agents serve their client API on."
  type        = number
  default     = 7070
  nullable    = false

  validation {
    condition     = var.agent_port >= 1024 && var.agent_port <= 65535 && floor(var.agent_port) == var.agent_port
    error_message = "agent_port must be a whole number from 1024 to 65535."
  }
}

variable "listener_port" {
  description = "Port the load balancer listens on; null for agent_port."
  type        = number
  default     = null

  validation {
    condition     = var.listener_port == null || (coalesce(var.listener_port, 1) >= 1 && coalesce(var.listener_port, 1) <= 65535)
    error_message = "listener_port must be from 1 to 65535."
  }
}

variable "tls_certificate_arn" {
  description = "ACM certificate ARN: the load balancer then terminates TLS on its listener. Null for plain TCP."
  type        = string
  default     = null

  validation {
    condition     = var.tls_certificate_arn == null || can(regex("^arn:aws[a-z-]*:acm:", var.tls_certificate_arn))
    error_message = "tls_certificate_arn must be an ACM certificate ARN."
  }
}

variable "metadata_addresses" {
  description = "The metadata nodes as HOST:PORT (the metadata module's addresses output)."
  type        = list(string)

  validation {
    condition     = contains([3, 5], length(var.metadata_addresses)) && alltrue([for a in var.metadata_addresses : can(regex("^[A-Za-z0-9.-]+:[0-9]{1,5}$", a))])
    error_message = "Give the 3 or 5 metadata nodes as HOST:PORT."
  }
}

variable "bucket_arn" {
  description = "ARN of the archive bucket (the bucket module's bucket_arn)."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:s3:::[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket_arn))
    error_message = "bucket_arn must be an S3 bucket ARN (arn:aws:s3:::name)."
  }
}

variable "bucket_name" {
  description = "Name of the archive bucket (the bucket module's bucket_name)."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket_name))
    error_message = "bucket_name must be a valid S3 bucket name."
  }
}

variable "bucket_prefix" {
  description = "Key prefix Silt writes under (the bucket module's prefix); the agents' role may only touch keys under it."
  type        = string
  nullable    = false

  validation {
    condition     = !startswith(var.bucket_prefix, "/") && !endswith(var.bucket_prefix, "/")
    error_message = "bucket_prefix must not start or end with a slash."
  }
}

variable "bucket_region" {
  description = "Region of the archive bucket (the bucket module's bucket_region): the agents' AWS_REGION."
  type        = string

  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]+$", var.bucket_region))
    error_message = "bucket_region must be an AWS region such as eu-west-1."
  }
}

variable "architecture" {
  description = "CPU architecture of the instances and of the silt binary: arm64 (Graviton) or x86_64."
  type        = string
  default     = "arm64"
  nullable    = false

  validation {
    condition     = contains(["arm64", "x86_64"], var.architecture)
    error_message = "architecture must be arm64 or x86_64."
  }
}

variable "instance_type" {
  description = "Instance type of the agents; it must match architecture, and have NVMe instance storage (a 'd' type such as m7gd or i4g) when hot_tail_storage is instance-store. See docs/deploy.md for sizing."
  type        = string
  default     = "m7g.xlarge"
  nullable    = false

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]*\\.[a-z0-9]+$", var.instance_type)) && !startswith(var.instance_type, "t")
    error_message = "instance_type must be an EC2 instance type such as m7g.xlarge, and not a burstable t* type."
  }
}

variable "ami_id" {
  description = "AMI of the agents; null for the latest Amazon Linux 2023 of the architecture (from its public SSM parameter)."
  type        = string
  default     = null

  validation {
    condition     = var.ami_id == null || can(regex("^ami-[0-9a-f]+$", var.ami_id))
    error_message = "ami_id must look like ami-0123456789abcdef0."
  }
}

variable "min_size" {
  description = "Fewest agents the auto scaling group keeps."
  type        = number
  default     = 3
  nullable    = false

  validation {
    condition     = var.min_size >= 1 && floor(var.min_size) == var.min_size
    error_message = "min_size must be a whole number of at least 1."
  }
}

variable "max_size" {
  description = "Most agents the auto scaling group may run (an instance refresh briefly adds some above the desired count)."
  type        = number
  default     = 9
  nullable    = false

  validation {
    condition     = var.max_size >= 1 && floor(var.max_size) == var.max_size
    error_message = "max_size must be a whole number of at least 1."
  }
}

variable "desired_capacity" {
  description = "Number of agents to run; null to leave it to min_size and any scaling policies."
  type        = number
  default     = null
}

variable "hot_tail_storage" {
  description = "Where the hot tail lives: ebs (a gp3/io2 volume per agent, sized below) or instance-store (the instance type's first local NVMe disk: lowest fsync latency, but its data is gone when the instance stops)."
  type        = string
  default     = "ebs"
  nullable    = false

  validation {
    condition     = contains(["ebs", "instance-store"], var.hot_tail_storage)
    error_message = "hot_tail_storage must be ebs or instance-store."
  }
}

variable "hot_tail_volume_size_gb" {
  description = "Size of each agent's hot tail EBS volume in GiB: ingest per agent x (time to seal + archive lag + local.retention.ms), with headroom; see docs/deploy.md."
  type        = number
  default     = 500
  nullable    = false

  validation {
    condition     = var.hot_tail_volume_size_gb >= 20 && var.hot_tail_volume_size_gb <= 65536
    error_message = "hot_tail_volume_size_gb must be from 20 to 65536."
  }
}

variable "hot_tail_volume_type" {
  description = "EBS type of the hot tail volumes: gp3, or io2 for lower and steadier fsync latency."
  type        = string
  default     = "gp3"
  nullable    = false

  validation {
    condition     = contains(["gp3", "io2"], var.hot_tail_volume_type)
    error_message = "hot_tail_volume_type must be gp3 or io2."
  }
}

variable "hot_tail_volume_iops" {
  description = "Provisioned IOPS of each hot tail volume (gp3: 3000 to 16000; io2: 100 to 64000). Every group commit is at least one write and one flush."
  type        = number
  default     = 6000
  nullable    = false

  validation {
    condition     = var.hot_tail_volume_iops >= 100 && var.hot_tail_volume_iops <= 64000
    error_message = "hot_tail_volume_iops must be from 100 to 64000."
  }
}

variable "hot_tail_volume_throughput" {
  description = "Throughput of each gp3 hot tail volume in MiB/s (125 to 1000): the ceiling of one agent's ingest; ignored for io2."
  type        = number
  default     = 500
  nullable    = false

  validation {
    condition     = var.hot_tail_volume_throughput >= 125 && var.hot_tail_volume_throughput <= 1000
    error_message = "hot_tail_volume_throughput must be from 125 to 1000."
  }
}

variable "kms_key_id" {
  description = "ARN of the KMS key encrypting the EBS volumes; null for the account's default EBS key. Volumes are always encrypted."
  type        = string
  default     = null

  validation {
    condition     = var.kms_key_id == null || can(regex("^arn:aws[a-z-]*:kms:", var.kms_key_id))
    error_message = "kms_key_id must be a KMS key ARN."
  }
}

variable "root_volume_size_gb" {
  description = "Size of each agent's root volume in GiB (the OS and logs; the hot tail has its own disk)."
  type        = number
  default     = 20
  nullable    = false

  validation {
    condition     = var.root_volume_size_gb >= 8 && var.root_volume_size_gb <= 1024
    error_message = "root_volume_size_gb must be from 8 to 1024."
  }
}

variable "silt_binary_url" {
  description = "Where the agents download the silt binary on boot: an https:// or s3:// URL of the bare binary or of a .tar.gz holding it, built for architecture. Changing it rolls the agents (instance refresh)."
  type        = string

  validation {
    condition     = can(regex("^(https|s3)://[^ ]+$", var.silt_binary_url))
    error_message = "silt_binary_url must be an https:// or s3:// URL."
  }
}

variable "silt_binary_sha256" {
  description = "SHA-256 of the file at silt_binary_url (64 lowercase hex digits); the install stops if it differs."
  type        = string

  validation {
    condition     = can(regex("^[0-9a-f]{64}$", var.silt_binary_sha256))
    error_message = "silt_binary_sha256 must be 64 lowercase hex digits."
  }
}

variable "agent_args" {
  description = "Extra flags for `silt agent`, e.g. [\"--cache-disk-bytes\", \"10737418240\"]."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition     = alltrue([for a in var.agent_args : !can(regex("[\\s\"'$]", a))])
    error_message = "Flags must not contain spaces, quotes or dollar signs (systemd splits them at spaces)."
  }
}

variable "log_level" {
  description = "SILT_LOG of the agents (tracing env-filter syntax)."
  type        = string
  default     = "info"
  nullable    = false

  validation {
    condition     = length(var.log_level) > 0 && !can(regex("[\\s\"'$]", var.log_level))
    error_message = "log_level must be a non-empty filter without spaces, quotes or dollar signs."
  }
}

variable "health_check_grace_period" {
  description = "Seconds after launch before a failing load balancer health check gets an agent replaced (boot, install, recovery of the local log)."
  type        = number
  default     = 300
  nullable    = false

  validation {
    condition     = var.health_check_grace_period >= 0 && var.health_check_grace_period <= 7200
    error_message = "health_check_grace_period must be from 0 to 7200 seconds."
  }
}

variable "instance_warmup" {
  description = "Seconds an instance refresh waits after a new agent is healthy before it counts it and moves on."
  type        = number
  default     = 120
  nullable    = false

  validation {
    condition     = var.instance_warmup >= 0 && var.instance_warmup <= 3600
    error_message = "instance_warmup must be from 0 to 3600 seconds."
  }
}

variable "deregistration_delay" {
  description = "Seconds the load balancer keeps sending in-flight connections to an agent leaving it before closing them. Long polls last up to 60 s."
  type        = number
  default     = 75
  nullable    = false

  validation {
    condition     = var.deregistration_delay >= 0 && var.deregistration_delay <= 3600
    error_message = "deregistration_delay must be from 0 to 3600 seconds."
  }
}

variable "enable_ssm" {
  description = "Let operators reach the agents with SSM Session Manager (no SSH, no inbound port)."
  type        = bool
  default     = true
  nullable    = false
}

variable "tags" {
  description = "Tags for every resource of the module (propagated to the instances)."
  type        = map(string)
  default     = {}
  nullable    = false
}

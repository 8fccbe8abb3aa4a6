variable "name" {
  description = "Name prefix for the metadata nodes and their resources, e.g. silt-prod."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9-]{1,32}$", var.name))
    error_message = "The name must be 1 to 32 letters, digits or hyphens."
  }
}

variable "node_count" {
  description = "Number of metadata nodes: 3 (survives one failure) or 5 (survives two)."
  type        = number
  default     = 3
  nullable    = false

  validation {
    condition     = contains([3, 5], var.node_count)
    error_message = "node_count must be 3 or 5."
  }
}

variable "subnet_ids" {
  description = "Private subnets, one per availability zone (at least 3 zones). Node i goes to subnet i modulo the number of subnets, so 3 nodes land in 3 zones and 5 nodes in 2+2+1."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) >= 3 && length(distinct(var.subnet_ids)) == length(var.subnet_ids) && alltrue([for s in var.subnet_ids : can(regex("^subnet-[0-9a-f]+$", s))])
    error_message = "Give at least 3 distinct subnet ids (subnet-...), each in its own availability zone."
  }
}

variable "host_number" {
  description = "Fixed private addresses: node i gets host number host_number + floor(i / number of subnets) in its subnet's CIDR (cidrhost). Pick numbers no other instance in those subnets uses; AWS reserves the first four and the last."
  type        = number
  default     = 10
  nullable    = false

  validation {
    condition     = var.host_number >= 4 && var.host_number <= 250 && floor(var.host_number) == var.host_number
    error_message = "host_number must be a whole number from 4 to 250."
  }
}

variable "metadata_port" {
  description = "Port each node serves its peers, the agents and operators on."
  type        = number
  default     = 7101
  nullable    = false

  validation {
    condition     = var.metadata_port >= 1024 && var.metadata_port <= 65535 && floor(var.metadata_port) == var.metadata_port
    error_message = "metadata_port must be a whole number from 1024 to 65535."
  }
}

variable "security_group_ids" {
  description = "Security groups of the metadata nodes (the security module's metadata_security_group_id)."
  type        = list(string)

  validation {
    condition     = length(var.security_group_ids) > 0 && alltrue([for g in var.security_group_ids : can(regex("^sg-[0-9a-f]+$", g))])
    error_message = "Give at least one security group id (sg-...)."
  }
}

variable "bootstrap" {
  description = "Start node 1 with --init so the nodes form a new cluster. True for the first apply; then set it to false, so a node 1 that is ever rebuilt on an empty disk rejoins the cluster instead of founding another."
  type        = bool
  nullable    = false
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
  description = "Instance type of the metadata nodes; it must match architecture. Not burstable (t*) types: a node out of CPU credits misses heartbeats and causes elections."
  type        = string
  default     = "m7g.large"
  nullable    = false

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]*\\.[a-z0-9]+$", var.instance_type)) && !startswith(var.instance_type, "t")
    error_message = "instance_type must be an EC2 instance type such as m7g.large, and not a burstable t* type."
  }
}

variable "ami_id" {
  description = "AMI of the metadata nodes; null for the latest Amazon Linux 2023 of the architecture (from its public SSM parameter). Any systemd distribution with cloud-init, curl, xfsprogs and (for s3:// URLs) the aws CLI works."
  type        = string
  default     = null

  validation {
    condition     = var.ami_id == null || can(regex("^ami-[0-9a-f]+$", var.ami_id))
    error_message = "ami_id must look like ami-0123456789abcdef0."
  }
}

variable "silt_binary_url" {
  description = "Where the nodes download the silt binary on first boot: an https:// or s3:// URL of the bare binary or of a .tar.gz holding it, built for architecture."
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

variable "raft_volume_size_gb" {
  description = "Size of each node's EBS volume for the Raft log and snapshots, in GiB."
  type        = number
  default     = 50
  nullable    = false

  validation {
    condition     = var.raft_volume_size_gb >= 8 && var.raft_volume_size_gb <= 16384
    error_message = "raft_volume_size_gb must be from 8 to 16384."
  }
}

variable "raft_volume_type" {
  description = "EBS type of the Raft log volumes: gp3, or io2 for lower and steadier fsync latency."
  type        = string
  default     = "gp3"
  nullable    = false

  validation {
    condition     = contains(["gp3", "io2"], var.raft_volume_type)
    error_message = "raft_volume_type must be gp3 or io2."
  }
}

variable "raft_volume_iops" {
  description = "Provisioned IOPS of each Raft log volume (gp3: 3000 to 16000; io2: 100 to 64000)."
  type        = number
  default     = 3000
  nullable    = false

  validation {
    condition     = var.raft_volume_iops >= 100 && var.raft_volume_iops <= 64000
    error_message = "raft_volume_iops must be from 100 to 64000."
  }
}

variable "raft_volume_throughput" {
  description = "Throughput of each gp3 Raft log volume in MiB/s (125 to 1000); ignored for io2."
  type        = number
  default     = 125
  nullable    = false

  validation {
    condition     = var.raft_volume_throughput >= 125 && var.raft_volume_throughput <= 1000
    error_message = "raft_volume_throughput must be from 125 to 1000."
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

variable "final_snapshot" {
  description = "Snapshot each Raft log volume when it is destroyed."
  type        = bool
  default     = true
  nullable    = false
}

variable "root_volume_size_gb" {
  description = "Size of each node's root volume in GiB (the OS and logs; the Raft log is on its own volume)."
  type        = number
  default     = 20
  nullable    = false

  validation {
    condition     = var.root_volume_size_gb >= 8 && var.root_volume_size_gb <= 1024
    error_message = "root_volume_size_gb must be from 8 to 1024."
  }
}

variable "route53_zone_id" {
  description = "Private Route 53 zone for stable DNS names (<name>-metadata-<id>.<zone>) of the nodes; null for none. The nodes find each other by their fixed IP addresses either way."
  type        = string
  default     = null

  validation {
    condition     = var.route53_zone_id == null || can(regex("^Z[0-9A-Z]+$", var.route53_zone_id))
    error_message = "route53_zone_id must be a Route 53 zone id (Z...)."
  }
}

variable "enable_ssm" {
  description = "Let operators reach the nodes with SSM Session Manager (no SSH, no inbound port)."
  type        = bool
  default     = true
  nullable    = false
}

variable "log_level" {
  description = "SILT_LOG of the nodes (tracing env-filter syntax)."
  type        = string
  default     = "info"
  nullable    = false

  validation {
    condition     = length(var.log_level) > 0 && !can(regex("[\\s\"'$]", var.log_level))
    error_message = "log_level must be a non-empty filter without spaces, quotes or dollar signs, e.g. info or info,openraft=warn."
  }
}

variable "tags" {
  description = "Tags for every resource of the module."
  type        = map(string)
  default     = {}
  nullable    = false
}

# The whole Silt stack on AWS in an existing VPC: the archive bucket, security groups, a 3- or
# 5-node metadata cluster and agents behind a network load balancer. See docs/deploy.md.
#
#   terraform init
#   terraform apply -var-file=prod.tfvars
#   # once `silt cluster status` shows every node: metadata_bootstrap = false, apply again

provider "aws" {
  region = var.region

  default_tags {
    tags = var.tags
  }
}

module "security" {
  source = "../../modules/security"

  name         = var.name
  vpc_id       = var.vpc_id
  client_cidrs = var.client_cidrs
  admin_cidrs  = var.admin_cidrs
}

module "bucket" {
  source = "../../modules/bucket"

  bucket_name      = var.bucket_name
  prefix           = var.bucket_prefix
  versioning       = var.bucket_versioning
  writer_role_arns = [module.agents.role_arn]
}

module "metadata" {
  source = "../../modules/metadata"

  name               = var.name
  node_count         = var.metadata_node_count
  subnet_ids         = var.private_subnet_ids
  security_group_ids = [module.security.metadata_security_group_id]
  bootstrap          = var.metadata_bootstrap
  architecture       = var.architecture
  instance_type      = var.metadata_instance_type
  silt_binary_url    = var.silt_binary_url
  silt_binary_sha256 = var.silt_binary_sha256
}

module "agents" {
  source = "../../modules/agents"

  name                    = var.name
  vpc_id                  = var.vpc_id
  subnet_ids              = var.private_subnet_ids
  security_group_ids      = [module.security.agents_security_group_id]
  lb_security_group_ids   = [module.security.lb_security_group_id]
  metadata_addresses      = module.metadata.addresses
  bucket_arn              = module.bucket.bucket_arn
  bucket_name             = module.bucket.bucket_name
  bucket_prefix           = module.bucket.prefix
  bucket_region           = module.bucket.bucket_region
  architecture            = var.architecture
  instance_type           = var.agent_instance_type
  min_size                = var.agent_count
  desired_capacity        = var.agent_count
  max_size                = var.agent_count * 2
  hot_tail_volume_size_gb = var.hot_tail_volume_size_gb
  silt_binary_url         = var.silt_binary_url
  silt_binary_sha256      = var.silt_binary_sha256
}

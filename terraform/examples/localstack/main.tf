# The archive bucket and Silt's IAM role in LocalStack, with the same modules and settings as on
# AWS, so `silt dev` can archive to it on this machine. Metadata nodes and agents are EC2, ELB and
# auto scaling, which LocalStack's free edition does not run: start `silt dev` locally instead.
# docs/deploy.md has the commands (`tflocal apply`, or plain `terraform apply`: the endpoints
# below already point at LocalStack).

provider "aws" {
  region     = var.region
  access_key = var.access_key
  secret_key = var.secret_key

  skip_credentials_validation = true
  skip_metadata_api_check     = true
  skip_requesting_account_id  = true
  s3_use_path_style           = true

  endpoints {
    s3  = var.endpoint
    iam = var.endpoint
    sts = var.endpoint
  }
}

module "iam" {
  source = "../../modules/iam"

  name                    = "silt-agents-local"
  bucket_access           = true
  bucket_arn              = module.bucket.bucket_arn
  bucket_prefix           = var.bucket_prefix
  enable_ssm              = false
  create_instance_profile = false
}

module "bucket" {
  source = "../../modules/bucket"

  bucket_name      = var.bucket_name
  prefix           = var.bucket_prefix
  writer_role_arns = [module.iam.role_arn]
  # Lets `terraform destroy` empty the bucket; LocalStack's data is throwaway.
  force_destroy = true
}

output "object_store_url" {
  description = "The archive: silt dev --object-store <this>."
  value       = module.bucket.object_store_url
}

output "bucket_name" {
  description = "The bucket created in LocalStack."
  value       = module.bucket.bucket_name
}

output "role_arn" {
  description = "The IAM role created in LocalStack, the only principal the bucket policy lets write."
  value       = module.iam.role_arn
}

output "environment" {
  description = "Shell lines that point silt at LocalStack: eval \"$(terraform output -raw environment)\"."
  value       = <<-EOT
    export AWS_ENDPOINT_URL=${var.endpoint}
    export AWS_ACCESS_KEY_ID=${var.access_key}
    export AWS_SECRET_ACCESS_KEY=${var.secret_key}
    export AWS_REGION=${var.region}
    export AWS_ALLOW_HTTP=true
    export SILT_OBJECT_STORE=${module.bucket.object_store_url}
  EOT
}

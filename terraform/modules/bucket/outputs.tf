output "bucket_name" {
  description = "Name of the archive bucket."
  value       = aws_s3_bucket.this.id
}

output "bucket_arn" {
  description = "ARN of the archive bucket."
  value       = aws_s3_bucket.this.arn
}

output "bucket_region" {
  description = "Region the bucket is in (what AWS_REGION must say for Silt)."
  value       = aws_s3_bucket.this.region
}

output "prefix" {
  description = "Key prefix Silt writes under."
  value       = var.prefix
}

output "object_store_url" {
  description = "The archive as Silt's --object-store / SILT_OBJECT_STORE URL."
  value       = var.prefix == "" ? "s3://${aws_s3_bucket.this.id}" : "s3://${aws_s3_bucket.this.id}/${var.prefix}"
}

output "versioning" {
  description = "Whether object versioning is on."
  value       = length(aws_s3_bucket_versioning.this) > 0
}

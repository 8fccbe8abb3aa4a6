output "silt_server" {
  description = "The agents' API: export SILT_SERVER=<this> for the silt client commands."
  value       = module.agents.endpoint
}

output "silt_metadata" {
  description = "The metadata nodes: export SILT_METADATA=<this> for `silt cluster status` (from a host allowed by admin_cidrs, or on a node through SSM)."
  value       = join(",", module.metadata.addresses)
}

output "metadata_nodes" {
  description = "Each metadata node: instance id, private IP, zone and Raft volume."
  value       = module.metadata.nodes
}

output "object_store_url" {
  description = "The archive (s3://bucket/prefix)."
  value       = module.bucket.object_store_url
}

output "agents_autoscaling_group" {
  description = "The agents' auto scaling group."
  value       = module.agents.autoscaling_group_name
}

output "agents_role_arn" {
  description = "The IAM role the agents run as; the only writer of the archive."
  value       = module.agents.role_arn
}

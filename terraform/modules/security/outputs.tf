output "lb_security_group_id" {
  description = "Security group of the agents' network load balancer."
  value       = aws_security_group.lb.id
}

output "agents_security_group_id" {
  description = "Security group of the agents."
  value       = aws_security_group.agents.id
}

output "metadata_security_group_id" {
  description = "Security group of the metadata nodes."
  value       = aws_security_group.metadata.id
}

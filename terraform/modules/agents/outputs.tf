output "endpoint" {
  description = "The agents' API through the load balancer: the clients' --server / SILT_SERVER."
  value       = "${var.tls_certificate_arn == null ? "http" : "https"}://${aws_lb.agents.dns_name}:${local.listener_port}"
}

output "lb_dns_name" {
  description = "DNS name of the network load balancer."
  value       = aws_lb.agents.dns_name
}

output "lb_arn" {
  description = "ARN of the network load balancer."
  value       = aws_lb.agents.arn
}

output "target_group_arn" {
  description = "ARN of the agents' target group."
  value       = aws_lb_target_group.agents.arn
}

output "autoscaling_group_name" {
  description = "Name of the agents' auto scaling group (for `aws autoscaling start-instance-refresh` and scaling policies)."
  value       = aws_autoscaling_group.agents.name
}

output "launch_template_id" {
  description = "ID of the agents' launch template."
  value       = aws_launch_template.agent.id
}

output "role_arn" {
  description = "ARN of the agents' IAM role: give it to the bucket module's writer_role_arns."
  value       = module.iam.role_arn
}

output "object_store_url" {
  description = "The SILT_OBJECT_STORE the agents use."
  value       = local.object_store_url
}

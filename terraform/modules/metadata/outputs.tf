output "addresses" {
  description = "The metadata nodes as HOST:PORT, node 1 first: the agents' --metadata and `silt cluster --metadata`."
  value       = local.addresses
}

output "peers" {
  description = "The --peers value every node was started with (ID=HOST:PORT,...)."
  value       = local.peers
}

output "nodes" {
  description = "Each node by id: instance id, private IP, availability zone and Raft log volume."
  value = {
    for k, node in local.nodes : k => {
      instance_id = aws_instance.node[k].id
      private_ip  = node.ip
      zone        = node.zone
      volume_id   = aws_ebs_volume.raft[k].id
    }
  }
}

output "dns_names" {
  description = "DNS names of the nodes by id, when route53_zone_id is set."
  value       = { for k, r in aws_route53_record.node : k => r.fqdn }
}

output "role_arn" {
  description = "ARN of the metadata nodes' IAM role."
  value       = module.iam.role_arn
}

# Three security groups, each opening only what its role needs:
#
#   load balancer  in: listener port from the clients          out: agent port to the agents
#   agents         in: agent port from the load balancer,       out: agent port to agents,
#                      from other agents (forwarding to a           metadata port to metadata,
#                      partition's writer, replication),            HTTPS (S3, SSM, the release)
#                      from admin_cidrs
#   metadata       in: metadata port from agents, from the      out: metadata port to metadata,
#                      other metadata nodes, from admin_cidrs       HTTPS (SSM, the release)
#
# No SSH: operators use SSM Session Manager. DNS, NTP and the instance metadata service are not
# filtered by security groups.

locals {
  listener_port = coalesce(var.listener_port, var.agent_port)
  https_egress = merge(
    { for c in var.egress_https_cidrs : "cidr ${c}" => { cidr = c, prefix_list = null } },
    { for p in var.egress_https_prefix_list_ids : "prefix list ${p}" => { cidr = null, prefix_list = p } },
  )
  # Security groups whose hosts make outbound HTTPS calls.
  https_clients = {
    agents   = aws_security_group.agents.id
    metadata = aws_security_group.metadata.id
  }
  https_rules = merge([
    for role, sg in local.https_clients : {
      for key, target in local.https_egress : "${role} ${key}" => merge(target, { security_group_id = sg })
    }
  ]...)
}

resource "aws_security_group" "lb" {
  name_prefix = "${var.name}-lb-"
  description = "Silt load balancer: clients in, agents out"
  vpc_id      = var.vpc_id
  tags        = merge(var.tags, { Name = "${var.name}-lb" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group" "agents" {
  name_prefix = "${var.name}-agents-"
  description = "Silt agents"
  vpc_id      = var.vpc_id
  tags        = merge(var.tags, { Name = "${var.name}-agents" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group" "metadata" {
  name_prefix = "${var.name}-metadata-"
  description = "Silt metadata nodes"
  vpc_id      = var.vpc_id
  tags        = merge(var.tags, { Name = "${var.name}-metadata" })

  lifecycle {
    create_before_destroy = true
  }
}

# --- load balancer

resource "aws_vpc_security_group_ingress_rule" "lb_from_client_cidrs" {
  for_each          = toset(var.client_cidrs)
  security_group_id = aws_security_group.lb.id
  description       = "Silt clients"
  ip_protocol       = "tcp"
  from_port         = local.listener_port
  to_port           = local.listener_port
  cidr_ipv4         = strcontains(each.value, ":") ? null : each.value
  cidr_ipv6         = strcontains(each.value, ":") ? each.value : null
}

resource "aws_vpc_security_group_ingress_rule" "lb_from_client_groups" {
  for_each                     = toset(var.client_security_group_ids)
  security_group_id            = aws_security_group.lb.id
  description                  = "Silt clients"
  ip_protocol                  = "tcp"
  from_port                    = local.listener_port
  to_port                      = local.listener_port
  referenced_security_group_id = each.value
}

resource "aws_vpc_security_group_egress_rule" "lb_to_agents" {
  security_group_id            = aws_security_group.lb.id
  description                  = "Client traffic and health checks to the agents"
  ip_protocol                  = "tcp"
  from_port                    = var.agent_port
  to_port                      = var.agent_port
  referenced_security_group_id = aws_security_group.agents.id
}

# --- agents

resource "aws_vpc_security_group_ingress_rule" "agents_from_lb" {
  security_group_id            = aws_security_group.agents.id
  description                  = "Clients through the load balancer, and its health checks"
  ip_protocol                  = "tcp"
  from_port                    = var.agent_port
  to_port                      = var.agent_port
  referenced_security_group_id = aws_security_group.lb.id
}

resource "aws_vpc_security_group_ingress_rule" "agents_from_agents" {
  security_group_id            = aws_security_group.agents.id
  description                  = "Agent to agent: forwarding to a partition's writer, replication"
  ip_protocol                  = "tcp"
  from_port                    = var.agent_port
  to_port                      = var.agent_port
  referenced_security_group_id = aws_security_group.agents.id
}

resource "aws_vpc_security_group_ingress_rule" "agents_from_admins" {
  for_each          = toset(var.admin_cidrs)
  security_group_id = aws_security_group.agents.id
  description       = "Operators"
  ip_protocol       = "tcp"
  from_port         = var.agent_port
  to_port           = var.agent_port
  cidr_ipv4         = strcontains(each.value, ":") ? null : each.value
  cidr_ipv6         = strcontains(each.value, ":") ? each.value : null
}

resource "aws_vpc_security_group_egress_rule" "agents_to_agents" {
  security_group_id            = aws_security_group.agents.id
  description                  = "Agent to agent"
  ip_protocol                  = "tcp"
  from_port                    = var.agent_port
  to_port                      = var.agent_port
  referenced_security_group_id = aws_security_group.agents.id
}

resource "aws_vpc_security_group_egress_rule" "agents_to_metadata" {
  security_group_id            = aws_security_group.agents.id
  description                  = "Agents to the metadata cluster"
  ip_protocol                  = "tcp"
  from_port                    = var.metadata_port
  to_port                      = var.metadata_port
  referenced_security_group_id = aws_security_group.metadata.id
}

# --- metadata

resource "aws_vpc_security_group_ingress_rule" "metadata_from_agents" {
  security_group_id            = aws_security_group.metadata.id
  description                  = "Agents"
  ip_protocol                  = "tcp"
  from_port                    = var.metadata_port
  to_port                      = var.metadata_port
  referenced_security_group_id = aws_security_group.agents.id
}

resource "aws_vpc_security_group_ingress_rule" "metadata_from_metadata" {
  security_group_id            = aws_security_group.metadata.id
  description                  = "Raft between metadata nodes, forwarding to the leader"
  ip_protocol                  = "tcp"
  from_port                    = var.metadata_port
  to_port                      = var.metadata_port
  referenced_security_group_id = aws_security_group.metadata.id
}

resource "aws_vpc_security_group_ingress_rule" "metadata_from_admins" {
  for_each          = toset(var.admin_cidrs)
  security_group_id = aws_security_group.metadata.id
  description       = "Operators (silt cluster status)"
  ip_protocol       = "tcp"
  from_port         = var.metadata_port
  to_port           = var.metadata_port
  cidr_ipv4         = strcontains(each.value, ":") ? null : each.value
  cidr_ipv6         = strcontains(each.value, ":") ? each.value : null
}

resource "aws_vpc_security_group_egress_rule" "metadata_to_metadata" {
  security_group_id            = aws_security_group.metadata.id
  description                  = "Raft between metadata nodes"
  ip_protocol                  = "tcp"
  from_port                    = var.metadata_port
  to_port                      = var.metadata_port
  referenced_security_group_id = aws_security_group.metadata.id
}

# --- HTTPS out, for both kinds of hosts

resource "aws_vpc_security_group_egress_rule" "https" {
  for_each          = local.https_rules
  security_group_id = each.value.security_group_id
  description       = "HTTPS: S3, SSM, the silt release artifact"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = each.value.cidr != null && !strcontains(coalesce(each.value.cidr, "-"), ":") ? each.value.cidr : null
  cidr_ipv6         = each.value.cidr != null && strcontains(coalesce(each.value.cidr, "-"), ":") ? each.value.cidr : null
  prefix_list_id    = each.value.prefix_list
}

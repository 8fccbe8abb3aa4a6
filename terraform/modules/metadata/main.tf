# Three or five `silt metadata` nodes, one per availability zone (5 nodes: 2+2+1), each with a
# fixed private IP address and its own EBS volume for the Raft log. The systemd unit, its
# environment file and the install script are the ones in deploy/, which docs/deploy.md tells
# users to install by hand: one source.
#
# Replacing a node (a new AMI, a new silt release) keeps its volume, its address and so its place
# in the cluster. Terraform never does it on its own: changes to the AMI and user data are
# ignored, and docs/deploy.md upgrades one node at a time (`terraform apply -replace=...` or the
# install script in place), checking `silt cluster status` in between. Replacing all at once would
# stop the cluster.

data "aws_partition" "current" {}

data "aws_subnet" "this" {
  count = length(var.subnet_ids)
  id    = var.subnet_ids[count.index]
}

data "aws_ssm_parameter" "al2023" {
  count = var.ami_id == null ? 1 : 0
  name  = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-${var.architecture}"
}

data "aws_ec2_instance_type" "this" {
  instance_type = var.instance_type
}

data "aws_route53_zone" "this" {
  count   = var.route53_zone_id == null ? 0 : 1
  zone_id = var.route53_zone_id
}

locals {
  deploy       = "${path.module}/../../../deploy"
  ami_id       = var.ami_id != null ? var.ami_id : nonsensitive(data.aws_ssm_parameter.al2023[0].value)
  subnet_count = length(var.subnet_ids)
  zones        = distinct([for s in data.aws_subnet.this : s.availability_zone])

  nodes = {
    for i in range(var.node_count) : tostring(i + 1) => {
      id        = i + 1
      subnet_id = var.subnet_ids[i % local.subnet_count]
      zone      = data.aws_subnet.this[i % local.subnet_count].availability_zone
      ip        = cidrhost(data.aws_subnet.this[i % local.subnet_count].cidr_block, var.host_number + floor(i / local.subnet_count))
    }
  }
  addresses = [for k in sort(keys(local.nodes)) : "${local.nodes[k].ip}:${var.metadata_port}"]
  peers     = join(",", [for k in sort(keys(local.nodes)) : "${k}=${local.nodes[k].ip}:${var.metadata_port}"])

  binary_in_s3      = startswith(var.silt_binary_url, "s3://")
  binary_object_arn = "arn:${data.aws_partition.current.partition}:s3:::${trimprefix(var.silt_binary_url, "s3://")}"

  user_data = {
    for k, node in local.nodes : k => join("\n", ["#cloud-config", yamlencode({
      write_files = [
        {
          path        = "/usr/local/sbin/install-silt.sh"
          permissions = "0755"
          encoding    = "b64"
          content     = filebase64("${local.deploy}/install-silt.sh")
        },
        {
          path        = "/etc/systemd/system/silt-metadata.service"
          permissions = "0644"
          content     = file("${local.deploy}/systemd/silt-metadata.service")
        },
        {
          path        = "/etc/silt/metadata.env"
          permissions = "0644"
          content = templatefile("${local.deploy}/env/metadata.env", {
            node_id    = node.id
            listen     = "${node.ip}:${var.metadata_port}"
            peers      = local.peers
            extra_args = var.bootstrap && node.id == 1 ? "--init" : ""
            log_level  = var.log_level
          })
        },
      ]
      runcmd = [
        [
          "/usr/local/sbin/install-silt.sh", "--role", "metadata",
          "--url", var.silt_binary_url, "--sha256", var.silt_binary_sha256,
          "--disk", "ebs:${aws_ebs_volume.raft[k].id}",
        ],
        ["systemctl", "daemon-reload"],
        ["systemctl", "enable", "--now", "silt-metadata.service"],
      ]
    })])
  }
}

module "iam" {
  source = "../iam"

  name                 = "${var.name}-metadata"
  bucket_access        = false
  readable_object_arns = local.binary_in_s3 ? [local.binary_object_arn] : []
  enable_ssm           = var.enable_ssm
  tags                 = var.tags
}

# At most one node per rack, also for the two nodes that share a zone when there are five.
resource "aws_placement_group" "this" {
  name     = "${var.name}-metadata"
  strategy = "spread"
  tags     = var.tags
}

resource "aws_ebs_volume" "raft" {
  for_each = local.nodes

  availability_zone = each.value.zone
  type              = var.raft_volume_type
  size              = var.raft_volume_size_gb
  iops              = var.raft_volume_iops
  throughput        = var.raft_volume_type == "gp3" ? var.raft_volume_throughput : null
  encrypted         = true
  kms_key_id        = var.kms_key_id
  final_snapshot    = var.final_snapshot
  tags              = merge(var.tags, { Name = "${var.name}-metadata-${each.key}-raft" })

  lifecycle {
    precondition {
      condition     = var.raft_volume_type != "gp3" || (var.raft_volume_iops >= 3000 && var.raft_volume_iops <= 16000)
      error_message = "gp3 volumes take 3000 to 16000 IOPS."
    }
  }
}

resource "aws_instance" "node" {
  for_each = local.nodes

  ami                    = local.ami_id
  instance_type          = var.instance_type
  subnet_id              = each.value.subnet_id
  private_ip             = each.value.ip
  vpc_security_group_ids = var.security_group_ids
  iam_instance_profile   = module.iam.instance_profile_name
  placement_group        = aws_placement_group.this.id
  user_data_base64       = base64gzip(local.user_data[each.key])

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  root_block_device {
    volume_type = "gp3"
    volume_size = var.root_volume_size_gb
    encrypted   = true
    kms_key_id  = var.kms_key_id
    tags        = merge(var.tags, { Name = "${var.name}-metadata-${each.key}-root" })
  }

  tags = merge(var.tags, { Name = "${var.name}-metadata-${each.key}", "silt:role" = "metadata", "silt:node-id" = each.key })

  lifecycle {
    # One node at a time, by hand: see the comment at the top and docs/deploy.md.
    ignore_changes = [ami, user_data, user_data_base64]

    precondition {
      condition     = length(local.zones) >= 3
      error_message = "The metadata subnets must span at least 3 availability zones, so losing one zone keeps a quorum."
    }

    precondition {
      condition     = contains(data.aws_ec2_instance_type.this.supported_architectures, var.architecture)
      error_message = "instance_type does not run ${var.architecture} binaries; pick a type of that architecture or change architecture."
    }
  }
}

resource "aws_volume_attachment" "raft" {
  for_each = local.nodes

  device_name = "/dev/sdf"
  volume_id   = aws_ebs_volume.raft[each.key].id
  instance_id = aws_instance.node[each.key].id
  # Stop the node (silt drains on SIGTERM) before its Raft log is detached.
  stop_instance_before_detaching = true
}

resource "aws_route53_record" "node" {
  for_each = var.route53_zone_id == null ? {} : local.nodes

  zone_id = var.route53_zone_id
  name    = "${var.name}-metadata-${each.key}.${data.aws_route53_zone.this[0].name}"
  type    = "A"
  ttl     = 60
  records = [each.value.ip]
}

# Silt agents: an auto scaling group behind a network load balancer. Each agent installs the silt
# binary on first boot, mounts its hot tail disk (an EBS volume or the instance's NVMe instance
# store) at /var/lib/silt and runs silt-agent.service. The unit, its environment file and the
# install script are the ones in deploy/, which docs/deploy.md tells users to install by hand:
# one source. A new release (silt_binary_url) or AMI makes a new launch template version, and the
# group replaces its agents by instance refresh, launching before terminating.

data "aws_partition" "current" {}

data "aws_ssm_parameter" "al2023" {
  count = var.ami_id == null ? 1 : 0
  name  = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-${var.architecture}"
}

data "aws_ec2_instance_type" "this" {
  instance_type = var.instance_type
}

data "aws_ami" "selected" {
  filter {
    name   = "image-id"
    values = [local.ami_id]
  }
}

locals {
  deploy           = "${path.module}/../../../deploy"
  ami_id           = var.ami_id != null ? var.ami_id : nonsensitive(data.aws_ssm_parameter.al2023[0].value)
  listener_port    = coalesce(var.listener_port, var.agent_port)
  object_store_url = var.bucket_prefix == "" ? "s3://${var.bucket_name}" : "s3://${var.bucket_name}/${var.bucket_prefix}"

  binary_in_s3      = startswith(var.silt_binary_url, "s3://")
  binary_object_arn = "arn:${data.aws_partition.current.partition}:s3:::${trimprefix(var.silt_binary_url, "s3://")}"

  user_data = join("\n", ["#cloud-config", yamlencode({
    write_files = [
      {
        path        = "/usr/local/sbin/install-silt.sh"
        permissions = "0755"
        encoding    = "b64"
        content     = filebase64("${local.deploy}/install-silt.sh")
      },
      {
        path        = "/etc/systemd/system/silt-agent.service"
        permissions = "0644"
        content     = file("${local.deploy}/systemd/silt-agent.service")
      },
      {
        path        = "/etc/silt/agent.env"
        permissions = "0644"
        content = templatefile("${local.deploy}/env/agent.env", {
          listen       = "0.0.0.0:${var.agent_port}"
          metadata     = join(",", var.metadata_addresses)
          object_store = local.object_store_url
          aws_region   = var.bucket_region
          extra_args   = join(" ", var.agent_args)
          log_level    = var.log_level
        })
      },
    ]
    runcmd = [
      [
        "/usr/local/sbin/install-silt.sh", "--role", "agent",
        "--url", var.silt_binary_url, "--sha256", var.silt_binary_sha256,
        "--disk", var.hot_tail_storage == "ebs" ? "ebs-data" : "instance-store",
      ],
      ["systemctl", "daemon-reload"],
      ["systemctl", "enable", "--now", "silt-agent.service"],
    ]
  })])

  tags = merge(var.tags, { "silt:role" = "agent" })
}

module "iam" {
  source = "../iam"

  name                 = "${var.name}-agents"
  bucket_access        = true
  bucket_arn           = var.bucket_arn
  bucket_prefix        = var.bucket_prefix
  readable_object_arns = local.binary_in_s3 ? [local.binary_object_arn] : []
  enable_ssm           = var.enable_ssm
  tags                 = var.tags
}

resource "aws_launch_template" "agent" {
  name_prefix            = "${var.name}-agent-"
  description            = "Silt agent"
  image_id               = local.ami_id
  instance_type          = var.instance_type
  vpc_security_group_ids = var.security_group_ids
  user_data              = base64gzip(local.user_data)
  ebs_optimized          = true
  update_default_version = true

  iam_instance_profile {
    arn = module.iam.instance_profile_arn
  }

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  monitoring {
    enabled = true
  }

  block_device_mappings {
    device_name = data.aws_ami.selected.root_device_name

    ebs {
      volume_type           = "gp3"
      volume_size           = var.root_volume_size_gb
      encrypted             = true
      kms_key_id            = var.kms_key_id
      delete_on_termination = true
    }
  }

  # The hot tail's own volume; install-silt.sh finds it as the EBS disk that is not the root.
  dynamic "block_device_mappings" {
    for_each = var.hot_tail_storage == "ebs" ? [1] : []

    content {
      device_name = "/dev/sdf"

      ebs {
        volume_type           = var.hot_tail_volume_type
        volume_size           = var.hot_tail_volume_size_gb
        iops                  = var.hot_tail_volume_iops
        throughput            = var.hot_tail_volume_type == "gp3" ? var.hot_tail_volume_throughput : null
        encrypted             = true
        kms_key_id            = var.kms_key_id
        delete_on_termination = true
      }
    }
  }

  tag_specifications {
    resource_type = "instance"
    tags          = merge(local.tags, { Name = "${var.name}-agent" })
  }

  tag_specifications {
    resource_type = "volume"
    tags          = merge(local.tags, { Name = "${var.name}-agent" })
  }

  tags = local.tags

  lifecycle {
    precondition {
      condition     = var.hot_tail_volume_type != "gp3" || (var.hot_tail_volume_iops >= 3000 && var.hot_tail_volume_iops <= 16000)
      error_message = "gp3 volumes take 3000 to 16000 IOPS."
    }

    precondition {
      condition     = contains(data.aws_ec2_instance_type.this.supported_architectures, var.architecture)
      error_message = "instance_type does not run ${var.architecture} binaries; pick a type of that architecture or change architecture."
    }

    precondition {
      condition     = var.hot_tail_storage != "instance-store" || data.aws_ec2_instance_type.this.instance_storage_supported
      error_message = "hot_tail_storage is instance-store but instance_type has no instance storage; use a 'd' type (m7gd, c7gd, i4g, ...) or ebs."
    }
  }
}

resource "aws_lb" "agents" {
  name                             = "${var.name}-agents"
  load_balancer_type               = "network"
  internal                         = var.internal_lb
  subnets                          = coalesce(var.lb_subnet_ids, var.subnet_ids)
  security_groups                  = var.lb_security_group_ids
  enable_cross_zone_load_balancing = true
  tags                             = local.tags
}

resource "aws_lb_target_group" "agents" {
  name                 = "${var.name}-agents"
  port                 = var.agent_port
  protocol             = "TCP"
  vpc_id               = var.vpc_id
  target_type          = "instance"
  deregistration_delay = var.deregistration_delay
  # Close what is still open once the delay is over, so a leaving agent can stop.
  connection_termination = true
  tags                   = local.tags

  health_check {
    protocol            = "HTTP"
    path                = "/health"
    port                = "traffic-port"
    matcher             = "200"
    interval            = 10
    healthy_threshold   = 3
    unhealthy_threshold = 3
  }
}

resource "aws_lb_listener" "agents" {
  load_balancer_arn = aws_lb.agents.arn
  port              = local.listener_port
  protocol          = var.tls_certificate_arn == null ? "TCP" : "TLS"
  certificate_arn   = var.tls_certificate_arn
  ssl_policy        = var.tls_certificate_arn == null ? null : "ELBSecurityPolicy-TLS13-1-2-2021-06"
  tags              = local.tags

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.agents.arn
  }
}

resource "aws_autoscaling_group" "agents" {
  name_prefix               = "${var.name}-agents-"
  min_size                  = var.min_size
  max_size                  = var.max_size
  desired_capacity          = var.desired_capacity
  vpc_zone_identifier       = var.subnet_ids
  target_group_arns         = [aws_lb_target_group.agents.arn]
  health_check_type         = "ELB"
  health_check_grace_period = var.health_check_grace_period
  default_instance_warmup   = var.instance_warmup
  termination_policies      = ["OldestLaunchTemplate", "OldestInstance"]
  wait_for_capacity_timeout = "15m"

  launch_template {
    id      = aws_launch_template.agent.id
    version = aws_launch_template.agent.latest_version
  }

  # A new launch template version replaces the agents a few at a time: new ones are launched and
  # healthy behind the load balancer before old ones are terminated (min 100%, max 110% healthy);
  # a refresh whose new agents fail their health checks rolls back.
  instance_refresh {
    strategy = "Rolling"

    preferences {
      min_healthy_percentage = 100
      max_healthy_percentage = 110
      instance_warmup        = var.instance_warmup
      skip_matching          = true
      auto_rollback          = true
    }
  }

  dynamic "tag" {
    for_each = merge(local.tags, { Name = "${var.name}-agent" })

    content {
      key                 = tag.key
      value               = tag.value
      propagate_at_launch = true
    }
  }

  lifecycle {
    precondition {
      condition     = var.max_size >= var.min_size && (var.desired_capacity == null || (coalesce(var.desired_capacity, var.min_size) >= var.min_size && coalesce(var.desired_capacity, var.min_size) <= var.max_size))
      error_message = "Sizes must satisfy min_size <= desired_capacity <= max_size."
    }
  }
}

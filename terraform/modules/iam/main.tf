# The IAM role Silt runs as. On the archive bucket it may only do what the agents and the
# compactor do, and only under the prefix: read, conditional-create and delete objects, finish or
# abort multipart uploads, and list (`silt archive rebuild-metadata`). Creating or configuring
# buckets is not granted: Terraform (or an administrator running `silt bucket init`) does that.

data "aws_partition" "current" {}

locals {
  objects_arn = var.bucket_prefix == "" ? "${coalesce(var.bucket_arn, "-")}/*" : "${coalesce(var.bucket_arn, "-")}/${var.bucket_prefix}/*"
  statements  = var.bucket_access || length(var.readable_object_arns) > 0
}

data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = var.trusted_services
    }
  }
}

resource "aws_iam_role" "this" {
  name                 = var.name
  description          = "Silt: ${var.name}"
  assume_role_policy   = data.aws_iam_policy_document.assume.json
  permissions_boundary = var.permissions_boundary_arn
  tags                 = var.tags
}

data "aws_iam_policy_document" "access" {
  count = local.statements ? 1 : 0

  dynamic "statement" {
    for_each = var.bucket_access ? [1] : []

    content {
      sid = "ArchiveObjects"
      actions = [
        "s3:GetObject",
        "s3:PutObject",
        "s3:DeleteObject",
        "s3:AbortMultipartUpload",
        "s3:ListMultipartUploadParts",
      ]
      resources = [local.objects_arn]
    }
  }

  dynamic "statement" {
    for_each = var.bucket_access ? [1] : []

    content {
      sid       = "ListArchive"
      actions   = ["s3:ListBucket"]
      resources = [var.bucket_arn]

      dynamic "condition" {
        for_each = var.bucket_prefix == "" ? [] : [1]

        content {
          test     = "StringLike"
          variable = "s3:prefix"
          values   = [var.bucket_prefix, "${var.bucket_prefix}/*"]
        }
      }
    }
  }

  dynamic "statement" {
    for_each = length(var.readable_object_arns) > 0 ? [1] : []

    content {
      sid       = "ReadReleaseArtifacts"
      actions   = ["s3:GetObject"]
      resources = var.readable_object_arns
    }
  }
}

resource "aws_iam_role_policy" "access" {
  count  = local.statements ? 1 : 0
  name   = "silt-access"
  role   = aws_iam_role.this.id
  policy = data.aws_iam_policy_document.access[0].json

  lifecycle {
    precondition {
      condition     = !var.bucket_access || var.bucket_arn != null
      error_message = "bucket_access is true but bucket_arn is not set."
    }
  }
}

resource "aws_iam_role_policy_attachment" "ssm" {
  count      = var.enable_ssm ? 1 : 0
  role       = aws_iam_role.this.name
  policy_arn = "arn:${data.aws_partition.current.partition}:iam::aws:policy/AmazonSSMManagedInstanceCore"
}

resource "aws_iam_instance_profile" "this" {
  count = var.create_instance_profile ? 1 : 0
  name  = var.name
  role  = aws_iam_role.this.name
  tags  = var.tags
}

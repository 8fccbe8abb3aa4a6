# The S3 bucket for Silt's archive: the same settings `silt bucket init` applies
# (cli/src/bucket.rs; `silt bucket settings` prints them), which tests/tests/terraform.rs checks.
# Retention: Silt enforces `retention.ms` per topic itself (metadata first, then the objects), so
# no lifecycle rule ever expires a current object; a rule that did would delete objects metadata
# still points at, and could not follow per-topic settings (`retention.ms=-1` keeps a topic forever).

locals {
  # Objects Silt reads and writes: everything under the prefix.
  objects_arn = var.prefix == "" ? "${aws_s3_bucket.this.arn}/*" : "${aws_s3_bucket.this.arn}/${var.prefix}/*"
  # Object writes and reads are denied to everyone outside these lists.
  writers = distinct(concat(var.writer_role_arns, var.admin_principal_arns))
  readers = distinct(concat(var.writer_role_arns, var.admin_principal_arns, var.reader_principal_arns))
  # Granted access under the prefix (administrators get theirs from their own IAM policies).
  grant_write = var.writer_role_arns
  grant_read  = distinct(concat(var.writer_role_arns, var.reader_principal_arns))
}

resource "aws_s3_bucket" "this" {
  bucket        = var.bucket_name
  force_destroy = var.force_destroy
  tags          = var.tags
}

# ACLs off: the bucket policy and IAM decide everything.
resource "aws_s3_bucket_ownership_controls" "this" {
  bucket = aws_s3_bucket.this.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

# Same as `silt bucket init`: all four switches on.
resource "aws_s3_bucket_public_access_block" "this" {
  bucket                  = aws_s3_bucket.this.id
  block_public_acls       = true
  ignore_public_acls      = true
  block_public_policy     = true
  restrict_public_buckets = true
}

# Same as `silt bucket init`: SSE-S3.
resource "aws_s3_bucket_server_side_encryption_configuration" "this" {
  bucket = aws_s3_bucket.this.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "AES256"
    }
  }
}

resource "aws_s3_bucket_versioning" "this" {
  count  = var.versioning ? 1 : 0
  bucket = aws_s3_bucket.this.id

  versioning_configuration {
    status = "Enabled"
  }
}

# Same rules, ids and days as `silt bucket init`.
resource "aws_s3_bucket_lifecycle_configuration" "this" {
  bucket = aws_s3_bucket.this.id

  # A compactor that died in the middle of a multipart upload leaves parts behind.
  rule {
    id     = "silt-abort-incomplete-multipart-uploads"
    status = "Enabled"

    filter {
      prefix = var.prefix
    }

    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }

  # With versioning, an object the compactor deletes (retention.ms) stays as a noncurrent version;
  # it expires after this many days (the default retention.ms is 7 days), and so do the delete
  # markers left once no version remains.
  dynamic "rule" {
    for_each = var.versioning ? [1] : []

    content {
      id     = "silt-expire-noncurrent-versions"
      status = "Enabled"

      filter {
        prefix = var.prefix
      }

      noncurrent_version_expiration {
        noncurrent_days = 7
      }

      expiration {
        expired_object_delete_marker = true
      }
    }
  }

  depends_on = [aws_s3_bucket_versioning.this]
}

data "aws_iam_policy_document" "bucket" {
  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.this.arn, "${aws_s3_bucket.this.arn}/*"]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }

  # Only Silt's roles write or delete objects, whatever other IAM policies in the account allow.
  # Bucket configuration stays with the account's administrators, so this never locks them out.
  statement {
    sid    = "DenyObjectWritesExceptSilt"
    effect = "Deny"
    actions = [
      "s3:PutObject",
      "s3:DeleteObject",
      "s3:DeleteObjectVersion",
      "s3:AbortMultipartUpload",
      "s3:RestoreObject",
    ]
    resources = ["${aws_s3_bucket.this.arn}/*"]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "ArnNotLike"
      variable = "aws:PrincipalArn"
      values   = local.writers
    }
  }

  statement {
    sid       = "DenyObjectReadsExceptSiltAndReaders"
    effect    = "Deny"
    actions   = ["s3:GetObject", "s3:GetObjectVersion"]
    resources = ["${aws_s3_bucket.this.arn}/*"]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "ArnNotLike"
      variable = "aws:PrincipalArn"
      values   = local.readers
    }
  }

  statement {
    sid    = "SiltReadWriteUnderPrefix"
    effect = "Allow"
    actions = [
      "s3:GetObject",
      "s3:PutObject",
      "s3:DeleteObject",
      "s3:AbortMultipartUpload",
      "s3:ListMultipartUploadParts",
    ]
    resources = [local.objects_arn]

    principals {
      type        = "AWS"
      identifiers = local.grant_write
    }
  }

  statement {
    sid       = "ReadersReadUnderPrefix"
    effect    = "Allow"
    actions   = ["s3:GetObject"]
    resources = [local.objects_arn]

    principals {
      type        = "AWS"
      identifiers = local.grant_read
    }
  }

  statement {
    sid       = "ListUnderPrefix"
    effect    = "Allow"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.this.arn]

    principals {
      type        = "AWS"
      identifiers = local.grant_read
    }

    dynamic "condition" {
      for_each = var.prefix == "" ? [] : [1]

      content {
        test     = "StringLike"
        variable = "s3:prefix"
        values   = [var.prefix, "${var.prefix}/*"]
      }
    }
  }
}

resource "aws_s3_bucket_policy" "this" {
  bucket = aws_s3_bucket.this.id
  policy = data.aws_iam_policy_document.bucket.json

  # S3 refuses policies while the public access block is being written.
  depends_on = [aws_s3_bucket_public_access_block.this, aws_s3_bucket_ownership_controls.this]
}

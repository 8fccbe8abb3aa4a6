//! `silt bucket init`: creates and configures an S3 bucket for Silt through aws-sdk-s3.
//!
//! The settings here are the ones the Terraform `bucket` module (`terraform/modules/bucket`)
//! applies; `tests/tests/terraform.rs` compares them with `silt bucket settings`.

use anyhow::{bail, Context, Result};
use aws_sdk_s3::types::{
    AbortIncompleteMultipartUpload, BucketLifecycleConfiguration, BucketVersioningStatus, ExpirationStatus,
    LifecycleExpiration, LifecycleRule, LifecycleRuleFilter, NoncurrentVersionExpiration,
    PublicAccessBlockConfiguration, ServerSideEncryption, ServerSideEncryptionByDefault,
    ServerSideEncryptionConfiguration, ServerSideEncryptionRule, VersioningConfiguration,
};
use serde::Serialize;

/// What `bucket init` applies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BucketSettings {
    /// Default server-side encryption (SSE-S3).
    pub sse_algorithm: String,
    /// Public access block: all four switches on.
    pub block_public_acls: bool,
    /// Ignore public ACLs.
    pub ignore_public_acls: bool,
    /// Block public bucket policies.
    pub block_public_policy: bool,
    /// Restrict public buckets.
    pub restrict_public_buckets: bool,
    /// Incomplete multipart uploads (a compactor that died mid-upload) are aborted after this.
    pub abort_incomplete_multipart_upload_days: i32,
    /// With versioning on, an object the compactor deleted (`retention.ms`) or replaced stays as a
    /// noncurrent version this long, then expires (the default `retention.ms` is 7 days). No rule
    /// ever expires a current object: Silt enforces `retention.ms` per topic, metadata first.
    pub noncurrent_version_expiration_days: i32,
}

impl Default for BucketSettings {
    fn default() -> Self {
        BucketSettings {
            sse_algorithm: "AES256".into(),
            block_public_acls: true,
            ignore_public_acls: true,
            block_public_policy: true,
            restrict_public_buckets: true,
            abort_incomplete_multipart_upload_days: 1,
            noncurrent_version_expiration_days: 7,
        }
    }
}

/// What `bucket init` did, step by step.
#[derive(Debug, Serialize)]
pub struct InitReport {
    /// Bucket name.
    pub bucket: String,
    /// Prefix Silt writes under.
    pub prefix: String,
    /// Settings requested.
    pub settings: BucketSettings,
    /// Versioning requested.
    pub versioning: bool,
    /// Each step and its outcome (`created`, `exists`, `applied`, or `skipped: <why>`).
    pub steps: Vec<(String, String)>,
}

/// Splits `s3://bucket/prefix`.
pub fn parse_s3_url(url: &str) -> Result<(String, String)> {
    let Some(rest) = url.strip_prefix("s3://") else {
        bail!("'{url}' is not an s3:// URL; use s3://bucket or s3://bucket/prefix");
    };
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.len() < 3 || bucket.len() > 63 {
        bail!("bucket name '{bucket}' must be 3 to 63 characters");
    }
    Ok((bucket.to_string(), prefix.trim_matches('/').to_string()))
}

/// Creates the bucket if it does not exist and applies [`BucketSettings`].
pub async fn init(url: &str, versioning: bool) -> Result<InitReport> {
    let (bucket, prefix) = parse_s3_url(url)?;
    let conf = aws_config::load_from_env().await;
    let region = conf.region().map(|r| r.to_string()).unwrap_or_else(|| "us-east-1".into());
    let s3 = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(&conf).force_path_style(true).build(),
    );
    let settings = BucketSettings::default();
    let mut steps = Vec::new();

    // us-east-1 answers 200 to re-creating a bucket you own, so look before creating.
    let exists = s3.head_bucket().bucket(&bucket).send().await.is_ok();
    if exists {
        steps.push(("create bucket".into(), "exists".into()));
    } else {
        let mut create = s3.create_bucket().bucket(&bucket);
        if region != "us-east-1" {
            create = create.create_bucket_configuration(
                aws_sdk_s3::types::CreateBucketConfiguration::builder()
                    .location_constraint(aws_sdk_s3::types::BucketLocationConstraint::from(region.as_str()))
                    .build(),
            );
        }
        match create.send().await {
            Ok(_) => steps.push(("create bucket".into(), "created".into())),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_bucket_already_owned_by_you()) => {
                steps.push(("create bucket".into(), "exists".into()));
            }
            Err(e) if e.as_service_error().is_some_and(|s| s.is_bucket_already_exists()) => {
                bail!("bucket '{bucket}' exists and belongs to another account; choose another name");
            }
            Err(e) => {
                bail!("cannot create bucket '{bucket}': {}", aws_sdk_s3::error::DisplayErrorContext(&e))
            }
        }
    }

    let outcome = |r: std::result::Result<(), String>| match r {
        Ok(()) => "applied".to_string(),
        Err(e) => format!("skipped: {e}"),
    };
    let pab = PublicAccessBlockConfiguration::builder()
        .block_public_acls(settings.block_public_acls)
        .ignore_public_acls(settings.ignore_public_acls)
        .block_public_policy(settings.block_public_policy)
        .restrict_public_buckets(settings.restrict_public_buckets)
        .build();
    let r = s3.put_public_access_block().bucket(&bucket).public_access_block_configuration(pab).send().await;
    steps.push(("block public access".into(), outcome(r.map(|_| ()).map_err(err_text))));

    let sse = ServerSideEncryptionConfiguration::builder()
        .rules(
            ServerSideEncryptionRule::builder()
                .apply_server_side_encryption_by_default(
                    ServerSideEncryptionByDefault::builder()
                        .sse_algorithm(ServerSideEncryption::from(settings.sse_algorithm.as_str()))
                        .build()
                        .context("encryption rule")?,
                )
                .build(),
        )
        .build()
        .context("encryption configuration")?;
    let r = s3.put_bucket_encryption().bucket(&bucket).server_side_encryption_configuration(sse).send().await;
    steps.push(("default encryption".into(), outcome(r.map(|_| ()).map_err(err_text))));

    let rule = LifecycleRule::builder()
        .id("silt-abort-incomplete-multipart-uploads")
        .status(ExpirationStatus::Enabled)
        .filter(LifecycleRuleFilter::builder().prefix(prefix.clone()).build())
        .abort_incomplete_multipart_upload(
            AbortIncompleteMultipartUpload::builder()
                .days_after_initiation(settings.abort_incomplete_multipart_upload_days)
                .build(),
        )
        .build()
        .context("lifecycle rule")?;
    let mut lifecycle = BucketLifecycleConfiguration::builder().rules(rule);
    if versioning {
        lifecycle = lifecycle.rules(
            LifecycleRule::builder()
                .id("silt-expire-noncurrent-versions")
                .status(ExpirationStatus::Enabled)
                .filter(LifecycleRuleFilter::builder().prefix(prefix.clone()).build())
                .noncurrent_version_expiration(
                    NoncurrentVersionExpiration::builder()
                        .noncurrent_days(settings.noncurrent_version_expiration_days)
                        .build(),
                )
                .expiration(LifecycleExpiration::builder().expired_object_delete_marker(true).build())
                .build()
                .context("lifecycle rule")?,
        );
    }
    let lifecycle = lifecycle.build().context("lifecycle")?;
    let r = s3
        .put_bucket_lifecycle_configuration()
        .bucket(&bucket)
        .lifecycle_configuration(lifecycle)
        .send()
        .await;
    steps.push(("lifecycle".into(), outcome(r.map(|_| ()).map_err(err_text))));

    if versioning {
        let v = VersioningConfiguration::builder().status(BucketVersioningStatus::Enabled).build();
        let r = s3.put_bucket_versioning().bucket(&bucket).versioning_configuration(v).send().await;
        steps.push(("versioning".into(), outcome(r.map(|_| ()).map_err(err_text))));
    }
    Ok(InitReport { bucket, prefix, settings, versioning, steps })
}

fn err_text<E: std::error::Error>(e: E) -> String {
    aws_sdk_s3::error::DisplayErrorContext(&e).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_s3_urls() {
        assert_eq!(parse_s3_url("s3://bkt/a/b/").unwrap(), ("bkt".into(), "a/b".into()));
        assert_eq!(parse_s3_url("s3://bkt").unwrap(), ("bkt".into(), String::new()));
        assert!(parse_s3_url("file:///x").is_err());
        assert!(parse_s3_url("s3://ab").is_err());
    }
}

//! Object stores chosen by URL.
//!
//! - `file:///abs/dir` (or a plain local path): a local folder through `LocalFileSystem`,
//!   created if missing, wrapped in a [`DurableLocalStore`] so that a put has fsynced the file
//!   and its directories when it returns. The embedded default (`silt dev`).
//! - `s3://bucket[/prefix]`: any S3-compatible store, configured by the standard `AWS_*`
//!   variables (`AmazonS3Builder::from_env`), plus `AWS_ENDPOINT_URL` (what aws-cli and
//!   LocalStack users set) as the endpoint when `AWS_ENDPOINT` is unset. With an endpoint,
//!   requests are path-style, and plain `http://` is allowed when the endpoint uses it. The
//!   region defaults to `us-east-1`. Conditional create (`PutMode::Create`, sent as
//!   `If-None-Match: *`) is always on: the compactor relies on it so a retried upload cannot
//!   write a second object.
//! - `memory://`: an in-memory store, **for unit tests only**: every call makes a new, empty
//!   store that disappears with the process.
//!
//! The store returned is bare; wrap it in [`crate::RetryingObjectStore`] and
//! [`crate::InstrumentedObjectStore`] as needed. The S3 client's own retries are reduced to a
//! few quick ones (`S3_CLIENT_RETRIES`, `S3_CLIENT_RETRY_TIMEOUT`), so the retrying wrapper's
//! budget is what bounds a call.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, S3ConditionalPut};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, RetryConfig};

use crate::durable_local_store::DurableLocalStore;
use crate::TieringError;

/// Retries the S3 client makes by itself before an error reaches the caller's wrappers.
pub const S3_CLIENT_RETRIES: usize = 3;
/// Time the S3 client spends retrying one request by itself.
pub const S3_CLIENT_RETRY_TIMEOUT: Duration = Duration::from_secs(20);

const SUPPORTED: &str = "use file:///path, s3://bucket/prefix or memory://";

/// An object store opened from a URL, and where under it Silt's objects live.
#[derive(Debug, Clone)]
pub struct ObjectStoreUrl {
    /// The store.
    pub store: Arc<dyn ObjectStore>,
    /// Prefix inside the store under which objects are laid out (empty for `file://`).
    pub prefix: Path,
    /// The URL it was opened from.
    pub url: String,
}

/// Opens the object store a URL names. See the module documentation for the schemes.
pub fn object_store_from_url(url: &str) -> Result<ObjectStoreUrl, TieringError> {
    let env: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    open(url, &env)
}

/// Like [`object_store_from_url`], with the `AWS_*` settings taken from `env` instead of the
/// process environment (for tools and tests that talk to several stores).
pub fn object_store_from_url_with_env(
    url: &str,
    env: &[(String, String)],
) -> Result<ObjectStoreUrl, TieringError> {
    open(url, env)
}

fn invalid(url: &str, reason: impl Into<String>) -> TieringError {
    TieringError::InvalidUrl { url: url.to_string(), reason: reason.into() }
}

fn open(url: &str, env: &[(String, String)]) -> Result<ObjectStoreUrl, TieringError> {
    let trimmed = url.trim();
    let (store, prefix): (Arc<dyn ObjectStore>, Path) = if let Some(rest) = trimmed.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(invalid(url, format!("no bucket name; {SUPPORTED}")));
        }
        let prefix = Path::parse(prefix).map_err(|e| invalid(url, format!("bad prefix: {e}")))?;
        let store = s3_builder(bucket, env)
            .build()
            .map_err(|e| invalid(url, format!("cannot configure S3 client: {e}")))?;
        (Arc::new(store), prefix)
    } else if let Some(rest) = trimmed.strip_prefix("memory://") {
        let prefix = Path::parse(rest).map_err(|e| invalid(url, format!("bad prefix: {e}")))?;
        (Arc::new(InMemory::new()), prefix)
    } else if let Some(rest) = trimmed.strip_prefix("file://") {
        if !rest.starts_with('/') {
            return Err(invalid(
                url,
                format!("a file URL needs an absolute path (file:///abs/dir); {SUPPORTED}"),
            ));
        }
        let dir = percent_decode(rest).ok_or_else(|| invalid(url, "bad percent-encoding in the path"))?;
        (local_store(url, &dir)?, Path::default())
    } else if trimmed.contains("://") || trimmed.is_empty() {
        return Err(invalid(url, SUPPORTED));
    } else {
        (local_store(url, trimmed)?, Path::default())
    };
    Ok(ObjectStoreUrl { store, prefix, url: url.to_string() })
}

fn local_store(url: &str, dir: &str) -> Result<Arc<dyn ObjectStore>, TieringError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| invalid(url, format!("cannot create directory '{dir}': {e}")))?;
    let root = std::fs::canonicalize(dir)
        .map_err(|e| invalid(url, format!("cannot open directory '{dir}': {e}")))?;
    let store = LocalFileSystem::new_with_prefix(&root)
        .map_err(|e| invalid(url, format!("cannot open directory '{dir}': {e}")))?
        // Deleting the last object of a partition removes its now empty directories too.
        .with_automatic_cleanup(true);
    // LocalFileSystem never fsyncs: the wrapper makes a put durable before it returns.
    Ok(Arc::new(DurableLocalStore::new(store, root)))
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `AmazonS3Builder::from_env` over the given variables, plus Silt's rules (see the module
/// documentation).
fn s3_builder(bucket: &str, env: &[(String, String)]) -> AmazonS3Builder {
    let mut builder = AmazonS3Builder::new();
    for (key, value) in env {
        if key.starts_with("AWS_") {
            if let Ok(config_key) = key.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() {
                builder = builder.with_config(config_key, value);
            }
        }
    }
    let var = |name: &str| env.iter().find(|(k, v)| k == name && !v.trim().is_empty()).map(|(_, v)| v.trim());
    // object_store reads both AWS_ENDPOINT and AWS_ENDPOINT_URL as the endpoint, whichever
    // comes last in the environment; make AWS_ENDPOINT win, as documented.
    let endpoint =
        var("AWS_ENDPOINT").or_else(|| var("AWS_ENDPOINT_URL_S3")).or_else(|| var("AWS_ENDPOINT_URL"));
    if let Some(endpoint) = endpoint {
        builder = builder.with_endpoint(endpoint).with_virtual_hosted_style_request(false);
        if endpoint.starts_with("http://") {
            builder = builder.with_allow_http(true);
        }
    }
    if builder.get_config_value(&AmazonS3ConfigKey::Region).is_none() {
        builder = builder.with_region("us-east-1");
    }
    let conditional_put = builder.get_config_value(&AmazonS3ConfigKey::ConditionalPut);
    if conditional_put.as_deref().is_some_and(|v| v.trim() != "etag") {
        tracing::warn!(
            configured = ?conditional_put,
            "Silt needs conditional create (If-None-Match: *); ignoring the configured conditional put mode"
        );
    }
    builder
        .with_conditional_put(S3ConditionalPut::ETagMatch)
        .with_retry(RetryConfig {
            max_retries: S3_CLIENT_RETRIES,
            retry_timeout: S3_CLIENT_RETRY_TIMEOUT,
            ..RetryConfig::default()
        })
        .with_bucket_name(bucket)
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ClientConfigKey;

    fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
        vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[tokio::test]
    async fn opens_local_directories() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("a b").join("bucket");
        let url = format!("file://{}/", target.display()).replace(' ', "%20");
        let opened = object_store_from_url(&url).unwrap();
        assert!(target.is_dir(), "the directory is created");
        assert_eq!(opened.prefix, Path::default());
        assert_eq!(opened.url, url);
        opened.store.put(&Path::from("topic=a/x"), "hi".into()).await.unwrap();
        assert!(target.join("topic=a").join("x").is_file());

        let plain = object_store_from_url(target.to_str().unwrap()).unwrap();
        let got = plain.store.get(&Path::from("topic=a/x")).await.unwrap().bytes().await.unwrap();
        assert_eq!(got.as_ref(), b"hi");
    }

    #[test]
    fn opens_memory_and_s3() {
        let m = object_store_from_url("memory://").unwrap();
        assert_eq!(m.prefix, Path::default());
        let s3 = open("s3://bucket/some/prefix/", &env(&[])).unwrap();
        assert_eq!(s3.prefix, Path::from("some/prefix"));
        assert!(open("s3://bucket", &env(&[])).is_ok());
    }

    #[test]
    fn refuses_other_urls_clearly() {
        for url in ["gs://bucket", "http://x", "s3://", "s3:///prefix", "file://relative/path", ""] {
            let err = open(url, &env(&[])).unwrap_err();
            assert!(matches!(err, TieringError::InvalidUrl { .. }), "{url}: {err}");
        }
        let err = open("gs://bucket", &env(&[])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unsupported object store URL 'gs://bucket': use file:///path, s3://bucket/prefix or memory://"
        );
    }

    #[test]
    fn s3_endpoint_rules() {
        let b = s3_builder(
            "b",
            &env(&[
                ("AWS_ENDPOINT_URL", "http://127.0.0.1:4566"),
                ("AWS_ACCESS_KEY_ID", "test"),
                ("AWS_SECRET_ACCESS_KEY", "test"),
            ]),
        );
        assert_eq!(
            b.get_config_value(&AmazonS3ConfigKey::Endpoint).as_deref(),
            Some("http://127.0.0.1:4566")
        );
        assert_eq!(
            b.get_config_value(&AmazonS3ConfigKey::VirtualHostedStyleRequest).as_deref(),
            Some("false")
        );
        assert_eq!(
            b.get_config_value(&AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp)).as_deref(),
            Some("true")
        );
        assert_eq!(b.get_config_value(&AmazonS3ConfigKey::Region).as_deref(), Some("us-east-1"));
        assert_eq!(b.get_config_value(&AmazonS3ConfigKey::ConditionalPut).as_deref(), Some("etag"));
        assert_eq!(b.get_config_value(&AmazonS3ConfigKey::Bucket).as_deref(), Some("b"));
        assert!(b.build().is_ok());

        // AWS_ENDPOINT wins over AWS_ENDPOINT_URL whatever the order; https stays https-only.
        let b = s3_builder(
            "b",
            &env(&[
                ("AWS_ENDPOINT", "https://minio.example:9000"),
                ("AWS_ENDPOINT_URL", "http://127.0.0.1:4566"),
                ("AWS_REGION", "eu-west-1"),
                ("AWS_CONDITIONAL_PUT", "disabled"),
            ]),
        );
        assert_eq!(
            b.get_config_value(&AmazonS3ConfigKey::Endpoint).as_deref(),
            Some("https://minio.example:9000")
        );
        assert_ne!(
            b.get_config_value(&AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp)).as_deref(),
            Some("true")
        );
        assert_eq!(b.get_config_value(&AmazonS3ConfigKey::Region).as_deref(), Some("eu-west-1"));
        assert_eq!(b.get_config_value(&AmazonS3ConfigKey::ConditionalPut).as_deref(), Some("etag"));

        // No endpoint: AWS itself, addressing left to object_store's defaults.
        let b = s3_builder("b", &env(&[]));
        assert_eq!(b.get_config_value(&AmazonS3ConfigKey::Endpoint), None);
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("/a%20b/c").as_deref(), Some("/a b/c"));
        assert_eq!(percent_decode("/a%2"), None);
        assert_eq!(percent_decode("/a%zz"), None);
    }
}

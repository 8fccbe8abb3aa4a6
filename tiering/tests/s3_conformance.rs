//! The object-store conformance suite against every backend Silt supports: a local folder, and
//! the S3 emulators `scripts/test.sh` starts (SeaweedFS, which checks SigV4 signatures, and
//! LocalStack). Without the emulators' variables the S3 cases are skipped with a message,
//! except under `CI=true`, where that is a failure.

use silt_tiering::conformance::run_conformance;
use silt_tiering::store_url::{object_store_from_url, object_store_from_url_with_env};

fn endpoint(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{var} is not set: run scripts/test.sh");
            eprintln!("skipping: {var} is not set (scripts/test.sh starts the emulators)");
            None
        }
    }
}

/// The `AWS_*` settings for an emulator on `endpoint`.
fn aws_env(endpoint: &str, secret: &str) -> Vec<(String, String)> {
    [
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", secret),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ENDPOINT_URL", endpoint),
        ("AWS_ALLOW_HTTP", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

async fn s3(endpoint_var: &str, secret: &str) {
    let Some(endpoint) = endpoint(endpoint_var) else { return };
    let env = aws_env(&endpoint, secret);
    let url = object_store_from_url_with_env("s3://silt-test/conformance", &env).expect("open the emulator");
    run_conformance(url.store, &url.prefix).await.expect("conformance");
}

#[tokio::test]
async fn conformance_local_folder() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = object_store_from_url(&format!("file://{}", dir.path().display())).expect("open folder");
    run_conformance(url.store, &url.prefix).await.expect("conformance");
}

#[tokio::test]
async fn conformance_seaweedfs() {
    s3("SILT_TEST_SEAWEEDFS_ENDPOINT", "testsecret").await;
}

#[tokio::test]
async fn conformance_localstack() {
    s3("SILT_TEST_LOCALSTACK_ENDPOINT", "test").await;
}

#[tokio::test]
async fn seaweedfs_rejects_a_wrong_secret() {
    let Some(endpoint) = endpoint("SILT_TEST_SEAWEEDFS_ENDPOINT") else { return };
    let env = aws_env(&endpoint, "not-the-secret");
    let url = object_store_from_url_with_env("s3://silt-test/conformance", &env).expect("open");
    let err = url.store.head(&url.prefix.child("nothing")).await.expect_err("a bad signature is refused");
    assert!(
        !matches!(err, object_store::Error::NotFound { .. }),
        "got NotFound, so the signature was not checked: {err}"
    );
}

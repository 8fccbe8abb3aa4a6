//! A few seconds of `silt-bench` against a debug `silt dev`: the small-message workload with
//! tiny durations and a cold replay of 8 MiB (bucket in a local folder, and on SeaweedFS when
//! the test script runs one), without the peer. Checks that the tool starts and stops
//! everything, that `result.json` and `results.md` carry the figures and that `--compare`
//! reads them back; it asserts no timing.

use std::path::PathBuf;
use std::process::Command;

fn silt_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SILT_BIN") {
        return PathBuf::from(p);
    }
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_silt-bench"));
    let bin = bench.with_file_name("silt");
    assert!(bin.exists(), "{} not found: run `cargo build -p silt` first or set SILT_BIN", bin.display());
    bin
}

/// The SeaweedFS `scripts/test.sh` starts, for the replay with its bucket on an S3 API; under
/// CI it must be there.
fn seaweedfs() -> Option<String> {
    match std::env::var("SILT_TEST_SEAWEEDFS_ENDPOINT") {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "SILT_TEST_SEAWEEDFS_ENDPOINT is not set: run the suite with scripts/test.sh"
            );
            eprintln!(
                "no replay on SeaweedFS: SILT_TEST_SEAWEEDFS_ENDPOINT is not set (scripts/test.sh sets it)"
            );
            None
        }
    }
}

#[test]
fn a_short_run_writes_every_figure() {
    let results = tempfile::tempdir().unwrap();
    let workloads = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("workloads");
    let mut command = Command::new(env!("CARGO_BIN_EXE_silt-bench"));
    let s3 = seaweedfs();
    if let Some(endpoint) = &s3 {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        command
            .args([
                "--replay-s3",
                &format!("s3://silt-test/bench-smoke-{nanos}"),
                "--replay-s3-name",
                "SeaweedFS",
            ])
            .envs([
                ("AWS_ACCESS_KEY_ID", "test"),
                ("AWS_SECRET_ACCESS_KEY", "testsecret"),
                ("AWS_REGION", "us-east-1"),
                ("AWS_ENDPOINT_URL", endpoint.as_str()),
                ("AWS_ALLOW_HTTP", "true"),
            ]);
    }
    let out = command
        .arg("--workloads")
        .arg(&workloads)
        .args(["--only", "1-topic-1-partition-100b", "--only", "replay-cold"])
        .args(["--duration", "1s", "--warmup", "200ms", "--limits-time", "200ms", "--replay-mib", "8"])
        .args(["--drain", "5s", "--repeats", "2"])
        .arg("--results")
        .arg(results.path())
        .arg("--silt-bin")
        .arg(silt_bin())
        .env_remove("NATS_SERVER_BIN")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "silt-bench failed:\n{stderr}");

    let text = std::fs::read_to_string(results.path().join("latest/result.json")).unwrap();
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(r["limits_start"]["seq_write_fdatasync_mb_per_s"].as_f64().unwrap() > 0.0);
    assert!(r["limits_end"]["write_4k_fdatasync"]["p99_ms"].as_f64().unwrap() > 0.0);
    assert!(r["limits_end"]["loopback_round_trip"]["p99_ms"].as_f64().unwrap() > 0.0);
    assert!(r["limits_start"]["write_4k_fdatasync_cpu_us"].as_f64().is_some());
    assert!(r["limits_end"]["overwrite_4k_fdatasync"]["p99_ms"].as_f64().unwrap() > 0.0);
    let runs = r["runs"].as_array().unwrap();
    let silt: Vec<_> = runs.iter().filter(|x| x["system"] == "silt" && x["replication"] == 1).collect();
    assert_eq!(silt.len(), 6, "max, 50% of max and the fixed rate, twice: {text}");
    let rounds: Vec<u64> = silt.iter().map(|x| x["round"].as_u64().unwrap()).collect();
    assert_eq!(rounds, [0, 0, 0, 1, 1, 1]);
    // Machine-wide figures over the window, and the disk's when the results are on one.
    let disk = silt_bench::proc_stats::disk_of(results.path());
    for x in &silt {
        assert!(x["machine_cpu_cores"].as_f64().unwrap() > 0.0, "{x}");
        assert!(x["server_cpu_cores"].as_f64().unwrap() > 0.0, "{x}");
        if disk.is_some() {
            // Every acknowledged byte was fdatasynced to this disk at least once.
            assert!(x["disk_bytes_per_acked_byte"].as_f64().unwrap() > 0.5, "{x}");
        }
    }
    for x in &silt {
        assert_eq!(x["available"], true);
        assert!(x["throughput_msgs_per_s"].as_f64().unwrap() > 0.0, "{x}");
        assert!(x["produce_ack"]["p99_ms"].as_f64().unwrap() > 0.0, "{x}");
        assert!(x["end_to_end"]["count"].as_u64().unwrap() > 0, "{x}");
        assert!(x["server_cpu_s_per_gb"].as_f64().unwrap() > 0.0, "{x}");
        assert!(x["server_peak_rss_mib"].as_f64().unwrap() > 0.0, "{x}");
        assert_eq!(x["produce_errors"], 0, "{x}");
    }
    // R=3 runs against `silt dev --agents 3`: every segment on three agents' disks.
    let r3: Vec<_> = runs.iter().filter(|x| x["system"] == "silt" && x["replication"] == 3).collect();
    assert_eq!(r3.len(), 6, "{text}");
    for x in &r3 {
        assert_eq!(x["available"], true, "{x}");
        assert!(x["throughput_msgs_per_s"].as_f64().unwrap() > 0.0, "{x}");
        assert_eq!(x["produce_errors"], 0, "{x}");
    }
    // Without --nats-server the peer's rows say it was not run.
    assert!(runs.iter().filter(|x| x["system"] == "nats").all(|x| x["available"] == false));
    // The plain group-commit server ran every rate of every round; at half of max it ran at
    // Silt R=1's rate of the same round.
    let gc: Vec<_> = runs.iter().filter(|x| x["system"] == "group-commit").collect();
    assert_eq!(gc.len(), 6, "{text}");
    for x in &gc {
        assert_eq!(x["available"], true, "{x}");
        assert!(x["throughput_msgs_per_s"].as_f64().unwrap() > 0.0, "{x}");
        assert!(x["produce_ack"]["p99_ms"].as_f64().unwrap() > 0.0, "{x}");
        assert_eq!(x["produce_errors"], 0, "{x}");
    }
    for round in 0..2 {
        let at = |system: &str, rate: &str| {
            runs.iter()
                .find(|x| {
                    x["system"] == system && x["replication"] == 1 && x["rate"] == rate && x["round"] == round
                })
                .unwrap()
        };
        let silt_max = at("silt", "max");
        let sustained = silt_max["throughput_msgs_per_s"]
            .as_f64()
            .unwrap()
            .min(silt_max["consume_msgs_per_s"].as_f64().unwrap());
        let gc_half = at("group-commit", "50% of max")["target_msgs_per_s"].as_f64().unwrap();
        assert!((gc_half - sustained / 2.0).abs() < 1e-6 * sustained, "{gc_half} vs {sustained}");
    }

    let replay =
        r["replays"].as_array().unwrap().iter().find(|x| x["system"] == "silt" && x["replication"] == 1);
    let replay = &replay.unwrap()["result"];
    assert_eq!(replay["value_bytes"], 8 << 20);
    assert!(replay["puts"].as_u64().unwrap() > 0, "{replay}");
    assert!(replay["gets"].as_u64().unwrap() > 0, "{replay}");
    assert!(replay["cold_fetched_fraction"].as_f64().unwrap() > 0.5, "{replay}");
    // Each reader's pages continue one another: none of the cold reads is a seek.
    assert_eq!(replay["random_cold_reads"], 0, "{replay}");
    assert!(replay["parquet_size_ratio"].as_f64().unwrap() > 0.0, "{replay}");
    assert!(replay["raw_get_mb_per_s"].as_f64().unwrap() > 0.0, "{replay}");
    // A plain program decoded the same objects (it checks it got every row).
    assert!(replay["get_and_decode_mb_per_s"].as_f64().unwrap() > 0.0, "{replay}");
    assert!(replay["decode_cpu_s_per_gb"].as_f64().unwrap() > 0.0, "{replay}");

    // With the bucket on SeaweedFS's S3 API too, the same figures, next to GETs from there.
    if s3.is_some() {
        let on_s3 =
            r["replays"].as_array().unwrap().iter().find(|x| x["store"] == "SeaweedFS").expect("S3 replay");
        assert_eq!(on_s3["result"]["value_bytes"], 8 << 20, "{on_s3}");
        assert!(on_s3["result"]["raw_get_mb_per_s"].as_f64().unwrap() > 0.0, "{on_s3}");
        assert_eq!(on_s3["result"]["random_cold_reads"], 0, "{on_s3}");
    }

    let md = std::fs::read_to_string(results.path().join("latest/results.md")).unwrap();
    for want in [
        "### Limits",
        "| loopback TCP round trip between two threads",
        "| 4 KiB overwrite + fdatasync",
        "one loopback round trip plus one 4 KiB fdatasync alone",
        "### 1-topic-1-partition-100b",
        "### replay-cold (bucket: local folder)",
        "| replay against a plain reader, object bytes per second",
        "the plain program's Parquet decoding alone",
        "### Targets",
        "| group commit | Silt R=1/group commit |",
        "| disk bytes written per byte acknowledged |",
        "the group-commit server's at the same rate (1-topic-1-partition-100b)",
        "the disk's flush capacity",
    ] {
        assert!(md.contains(want), "results.md lacks {want}:\n{md}");
    }

    // A run compared with itself agrees on every figure.
    let json = results.path().join("latest/result.json");
    let out = Command::new(env!("CARGO_BIN_EXE_silt-bench"))
        .arg("--compare")
        .arg(&json)
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8(out.stdout).unwrap();
    let first = table.lines().next().unwrap_or_default();
    let (agree, rest) = first.split_once(" of ").expect("N of M figures");
    let total = rest.split_whitespace().next().unwrap();
    assert_eq!(agree, total, "{table}");
    assert!(agree.parse::<u32>().unwrap() >= 7, "{table}");
}

//! Two runs side by side (`silt-bench --compare A B`): every figure both runs measured, how far
//! apart they are, and whether that is within the noise the runs themselves report.
//!
//! The noise of a figure comes from the runs, never from a constant:
//! - throughput at `max`: two standard deviations of the per-second throughput, both runs'
//!   spreads combined (`throughput_cv`); at a fixed rate the rate sets the throughput, so only
//!   the latencies are compared;
//! - latency at a percentile: how far the disk's own 4 KiB write + fdatasync latency at that
//!   percentile moved among the four limit measurements (start and end of both runs), the
//!   machine's noise at that percentile;
//! - cold replay throughput: two standard deviations of the readers' own throughputs (one per
//!   partition, all at once) of both runs combined, or how far the raw GET of the same objects
//!   from the same store moved between the runs, whichever is larger.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::latency::LatencySummary;
use crate::report::Report;

/// One figure of both runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Which run and metric.
    pub what: String,
    /// Run A's value.
    pub a: f64,
    /// Run B's value.
    pub b: f64,
    /// Relative noise: the runs agree when |b/a - 1| is at most this.
    pub noise: f64,
}

impl Row {
    /// |b/a - 1|.
    pub fn change(&self) -> f64 {
        if self.a == 0.0 {
            if self.b == 0.0 {
                0.0
            } else {
                f64::INFINITY
            }
        } else {
            (self.b / self.a - 1.0).abs()
        }
    }

    /// Whether the difference is within the noise.
    pub fn agrees(&self) -> bool {
        self.change() <= self.noise
    }
}

/// The relative spread of `values`: (max - min) / min.
fn spread(values: &[f64]) -> f64 {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if min > 0.0 && min.is_finite() {
        (max - min) / min
    } else {
        f64::INFINITY
    }
}

/// Every figure both runs measured, with its noise.
pub fn rows(a: &Report, b: &Report) -> Vec<Row> {
    let disk = |f: fn(&LatencySummary) -> f64| {
        spread(&[
            f(&a.limits_start.write_4k_fdatasync),
            f(&a.limits_end.write_4k_fdatasync),
            f(&b.limits_start.write_4k_fdatasync),
            f(&b.limits_end.write_4k_fdatasync),
        ])
    };
    type Percentile = fn(&LatencySummary) -> f64;
    let latency_noise: [(&str, Percentile, f64); 2] =
        [("p50", |l| l.p50_ms, disk(|l| l.p50_ms)), ("p99", |l| l.p99_ms, disk(|l| l.p99_ms))];
    let mut out = Vec::new();
    // Round k of one run is compared with round k of the other.
    let key = |r: &crate::report::RunResult| {
        (r.workload.clone(), r.system.clone(), r.replication, r.rate.clone(), r.round)
    };
    let runs_b: BTreeMap<_, _> = b.runs.iter().filter(|r| r.available).map(|r| (key(r), r)).collect();
    for ra in a.runs.iter().filter(|r| r.available) {
        let Some(rb) = runs_b.get(&key(ra)) else { continue };
        let name = format!("{} · {} R={} · {}", ra.workload, ra.system, ra.replication, ra.rate);
        if ra.rate == "max" {
            out.push(Row {
                what: format!("{name} · produce MB/s"),
                a: ra.throughput_mb_per_s,
                b: rb.throughput_mb_per_s,
                noise: 2.0 * ra.throughput_cv.hypot(rb.throughput_cv),
            });
        }
        for (label, f, noise) in latency_noise {
            out.push(Row {
                what: format!("{name} · produce-ack {label} ms"),
                a: f(&ra.produce_ack),
                b: f(&rb.produce_ack),
                noise,
            });
        }
    }
    for ea in a.replays.iter().filter(|e| e.system == "silt") {
        let Some(ra) = &ea.result else { continue };
        let matching = b.replays.iter().find(|e| {
            e.system == ea.system
                && e.workload == ea.workload
                && e.replication == ea.replication
                && e.store == ea.store
        });
        let Some(rb) = matching.and_then(|e| e.result.as_ref()) else { continue };
        out.push(Row {
            what: format!(
                "{} · silt R={} · bucket: {} · replay object MB/s",
                ea.workload, ea.replication, ea.store
            ),
            a: ra.replay_object_mb_per_s,
            b: rb.replay_object_mb_per_s,
            noise: spread(&[ra.raw_get_mb_per_s, rb.raw_get_mb_per_s])
                .max(2.0 * ra.reader_cv.hypot(rb.reader_cv)),
        });
    }
    out
}

/// The comparison as Markdown.
pub fn markdown(a: &Report, b: &Report, a_name: &str, b_name: &str) -> String {
    let rows = rows(a, b);
    let mut s = String::new();
    let agree = rows.iter().filter(|r| r.agrees()).count();
    let _ = writeln!(
        s,
        "{agree} of {} figures measured by both runs agree within the noise the runs report \
         (A: {a_name}, B: {b_name}).\n",
        rows.len()
    );
    let _ = writeln!(s, "| figure | A | B | B/A | noise | agree |\n|---|---|---|---|---|---|");
    for r in &rows {
        let _ = writeln!(
            s,
            "| {} | {:.3} | {:.3} | {:.2} | ±{:.0}% | {} |",
            r.what,
            r.a,
            r.b,
            if r.a == 0.0 { f64::NAN } else { r.b / r.a },
            r.noise * 100.0,
            if r.agrees() { "yes" } else { "**no**" }
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::latency::Latency;
    use crate::limits::Limits;
    use crate::report::{Machine, ReplayEntry, RunResult, Settings};
    use std::time::Duration;

    fn latency(ms: &[u64]) -> LatencySummary {
        let mut l = Latency::new();
        for m in ms {
            l.record(Duration::from_micros(*m * 1000));
        }
        l.summary()
    }

    fn report(disk_p99_ms: u64, throughput: f64, cv: f64, ack_ms: u64, replay: f64, get: f64) -> Report {
        let limits = Limits {
            seq_write_fdatasync_mb_per_s: 1000.0,
            write_4k_fdatasync: latency(
                &[1; 99].iter().chain(&[disk_p99_ms; 2]).copied().collect::<Vec<_>>(),
            ),
            loopback_tcp_mb_per_s: 3000.0,
            write_4k_fdatasync_cpu_us: 50.0,
            loopback_round_trip: latency(&[1; 10]),
            overwrite_4k_fdatasync: latency(&[1; 10]),
            overwrite_4k_fdatasync_cpu_us: 40.0,
            overwrite_4k_fdatasyncs_per_s: 1000.0,
            overwrite_4k_disk_flushes_per_s: Some(1000.0),
        };
        let run = |rate: &str| RunResult {
            workload: "w".into(),
            system: "silt".into(),
            replication: 1,
            available: true,
            rate: rate.into(),
            throughput_mb_per_s: throughput,
            throughput_cv: cv,
            produce_ack: latency(&[ack_ms; 100]),
            ..RunResult::default()
        };
        let result = crate::replay::ReplayResult {
            replay_object_mb_per_s: replay,
            raw_get_mb_per_s: get,
            ..Default::default()
        };
        Report {
            started_unix_ms: 0,
            run_s: 0.0,
            machine: Machine::default(),
            settings: Settings::default(),
            limits_start: limits.clone(),
            limits_end: limits,
            runs: vec![run("max"), run("50% of max")],
            replays: vec![ReplayEntry {
                workload: "r".into(),
                system: "silt".into(),
                replication: 1,
                available: true,
                reason: None,
                result: Some(result),
                store: "local folder".into(),
            }],
        }
    }

    #[test]
    fn figures_agree_within_the_noise_the_runs_report_and_not_beyond() {
        // Throughput 5% apart with 4% per-second spreads: within 2 × √(4² + 4²) ≈ 11%.
        let a = report(10, 100.0, 0.04, 20, 300.0, 600.0);
        let b = report(10, 105.0, 0.04, 20, 310.0, 630.0);
        let rows = rows(&a, &b);
        assert_eq!(rows.len(), 3 + 2 + 1, "max: throughput and two latencies; 50%: two latencies; replay");
        assert!(rows.iter().all(Row::agrees), "{rows:?}");

        // Throughput 30% apart, a p99 that doubled while the disk's did not move, a replay 40%
        // slower while the raw GET moved 3%: none of these agree.
        let c = report(10, 130.0, 0.04, 40, 180.0, 620.0);
        let rows = super::rows(&a, &c);
        let disagree: Vec<&str> = rows.iter().filter(|r| !r.agrees()).map(|r| r.what.as_str()).collect();
        assert_eq!(
            disagree,
            vec![
                "w · silt R=1 · max · produce MB/s",
                "w · silt R=1 · max · produce-ack p50 ms",
                "w · silt R=1 · max · produce-ack p99 ms",
                "w · silt R=1 · 50% of max · produce-ack p50 ms",
                "w · silt R=1 · 50% of max · produce-ack p99 ms",
                "r · silt R=1 · bucket: local folder · replay object MB/s",
            ]
        );
        // The same p99 shift is noise when the disk's own p99 moved as much.
        let noisy_disk = report(20, 100.0, 0.04, 35, 300.0, 600.0);
        let p99 = super::rows(&a, &noisy_disk)
            .into_iter()
            .find(|r| r.what == "w · silt R=1 · max · produce-ack p99 ms")
            .unwrap();
        assert!(p99.agrees(), "{p99:?}");
        assert!(markdown(&a, &c, "a", "c").starts_with("0 of 6 figures"), "{}", markdown(&a, &c, "a", "c"));

        // A replay 10% slower with the same GETs is noise when its readers spread 5% each.
        let spread_out = |mut r: Report, mb_per_s: f64| {
            let result = r.replays[0].result.as_mut().unwrap();
            result.replay_object_mb_per_s = mb_per_s;
            result.reader_cv = 0.05;
            r
        };
        let replay = |x: &Report, y: &Report| super::rows(x, y).pop().unwrap();
        assert!(replay(&spread_out(a.clone(), 300.0), &spread_out(a.clone(), 270.0)).agrees());
        assert!(!replay(&a, &report(10, 100.0, 0.04, 20, 270.0, 600.0)).agrees());
    }

    #[test]
    fn coefficient_of_variation_is_the_relative_sample_spread() {
        use crate::report::coefficient_of_variation as cv;
        assert_eq!(cv(&[5.0]), 0.0);
        assert_eq!(cv(&[3.0, 3.0, 3.0]), 0.0);
        assert!((cv(&[90.0, 110.0]) - 200f64.sqrt() / 100.0).abs() < 1e-12);
    }
}

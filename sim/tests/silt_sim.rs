//! `silt-sim` as its users run it: a seed replays byte for byte, a deliberate defect is caught
//! within 200 seeds, and bad arguments get a clear error (from `silt-faults` too).

#![allow(clippy::unwrap_used, reason = "tests may unwrap")]

use std::process::{Command, Output};

fn silt_sim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_silt-sim")).args(args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn the_same_seed_gives_the_same_trace_byte_for_byte() {
    let first = silt_sim(&["--seed", "7", "--trace"]);
    let second = silt_sim(&["--seed", "7", "--trace"]);
    let trace = stdout(&first);
    assert!(trace.contains("schedule of seed 7:"), "{trace}");
    assert!(trace.contains("history of seed 7"), "{trace}");
    assert!(trace.lines().any(|l| l.contains("produce")), "the workload produced nothing:\n{trace}");
    assert!(
        first.stdout == second.stdout,
        "two runs of seed 7 differ; the first:\n{trace}\nthe second:\n{}",
        stdout(&second)
    );
    assert_eq!(first.status.code(), second.status.code());
    // With consumer groups too.
    let first = silt_sim(&["--seed", "7", "--groups", "--trace"]);
    let second = silt_sim(&["--seed", "7", "--groups", "--trace"]);
    let trace = stdout(&first);
    for op in ["poll exclusive/", "poll shared/", "ack exclusive", "checkpoint shared", "drained exclusive"] {
        assert!(trace.contains(op), "no '{op}' in the trace with --groups:\n{trace}");
    }
    assert!(first.stdout == second.stdout, "two runs of seed 7 with --groups differ");
    // With the archive too: segments archived, dropped by the agents, read back from the bucket.
    let first = silt_sim(&["--seed", "7", "--archive", "--trace"]);
    let second = silt_sim(&["--seed", "7", "--archive", "--trace"]);
    let trace = stdout(&first);
    for line in
        ["segment archived", "dropped local copies of archived segments", "archived silt/topic=events/"]
    {
        assert!(trace.contains(line), "no '{line}' in the trace with --archive:\n{trace}");
    }
    assert!(
        trace.lines().any(|l| l.contains("% of the calls to the bucket fail")),
        "no window of errors from the bucket in the schedule:\n{trace}"
    );
    assert!(first.stdout == second.stdout, "two runs of seed 7 with --archive differ");
    assert!(first.status.success(), "seed 7 with --archive:\n{trace}");
    // And the topic deleted and created again while it is archived.
    let first = silt_sim(&["--seed", "7", "--archive", "--recreate", "--trace"]);
    let second = silt_sim(&["--seed", "7", "--archive", "--recreate", "--trace"]);
    let trace = stdout(&first);
    assert!(trace.contains("delete the topic and create it again -> done"), "{trace}");
    assert!(first.stdout == second.stdout, "two runs of seed 7 with --archive --recreate differ");
    assert!(first.status.success(), "seed 7 with --archive --recreate:\n{trace}");
    // Three metadata nodes under faults of their own, the register in metadata read and written.
    let first = silt_sim(&["--seed", "7", "--metadata-nodes", "3", "--trace"]);
    let second = silt_sim(&["--seed", "7", "--metadata-nodes", "3", "--trace"]);
    let trace = stdout(&first);
    for line in ["register write", "register read", "initializing the metadata cluster node_id=3"] {
        assert!(trace.contains(line), "no '{line}' in the trace with --metadata-nodes 3:\n{trace}");
    }
    assert!(first.stdout == second.stdout, "two runs of seed 7 with --metadata-nodes 3 differ");
    assert!(first.status.success(), "seed 7 with --metadata-nodes 3:\n{trace}");
}

/// Every defect `--bug` names, with the options that exercise it.
const DEFECTS: &[(&str, &[&str])] = &[
    ("reuse-offset-after-crash", &[]),
    ("ack-before-quorum", &[]),
    ("serve-past-watermark", &[]),
    ("skip-fence", &[]),
    ("trim-without-epoch-check", &[]),
    ("checkpoint-in-flight", &["--groups"]),
    ("stale-metadata-read", &["--metadata-nodes", "3"]),
    ("raft-ack-before-fsync", &["--metadata-nodes", "3"]),
];

#[test]
fn deliberate_defects_are_caught_within_200_seeds() {
    // A defect turned on is found: some seed of the first 200 fails, and says which property.
    for (bug, options) in DEFECTS {
        let args = [&["--seeds", "0..200", "--bug", *bug, "--stop-at-first", "-j", "2"], *options].concat();
        let o = silt_sim(&args);
        let out = stdout(&o);
        assert!(!o.status.success(), "--bug {bug} went unnoticed in 200 seeds:\n{out}");
        let failed = out.lines().find(|l| l.contains(": failed: ")).unwrap_or_else(|| panic!("{bug}: {out}"));
        assert!(
            !failed.contains("simulation-failed") && !failed.contains(": unrecovered: "),
            "--bug {bug} was caught only as a failure to run or to recover: {failed}"
        );
        let summary = out.lines().last().unwrap();
        assert!(summary.ends_with(" failed") && !summary.ends_with(" 0 failed"), "{bug}: {summary}");
    }
}

/// Seeds that found defects, each fixed since (docs/reliability.md names them): they pass.
/// 1274, 1375 and 1440 found a writer that lost its write quorum answering reads with its end
/// while a newer writer acknowledged past it; 1286, a writer whose own write failed starting
/// again under the same epoch, so that a follower's copy of the failed write and a later
/// acknowledged message were taken for each other; 1365, an acknowledged message replaced at
/// its offset, passes since that fix; 5231, a rebalance moving a partition off a writer cut
/// off from metadata, which answered reads with its end until its lease ran out. With
/// `--disk-loss`, 48, 92 and 99 found reads stopping for good at an unacknowledged tail a lone
/// recovery sealed on a disk since replaced (declared lost since, `Command::DeclareLost`); 594
/// and 894, reads served such a tail (sealed only on W members since, while a silent member
/// may come back). With `--groups`, 6 and 26 found a deposed writer's group cursor
/// checkpointing acks after the next writer's cursor had loaded without them, which then
/// delivered them again (`CommitAcks` carries the writer epoch since); 15, messages in flight
/// not delivered again for 20 minutes after the writer's clock stepped back (visibility
/// timeouts are measured on a monotonic clock since); 33, a poll that looped without letting
/// time pass while a partition with expired leases could not be served. With `--archive
/// --recreate`, 11, 13 and 21 found agents whose copy of metadata lagged answering for a topic
/// after its deletion returned (an agent answers as a writer only while its copy is current as
/// of 7/8 of a lease ago since, and a deletion waits a lease). 163 and 179 found replays from a
/// time starting past records stamped that late, in segments the writer held no copy of
/// (`Agent::offset_for_time` looks in every segment before what the local log found since);
/// with `--metadata-nodes 3`, 7, 14 and 65 found the same where the writer's replica of a
/// sealed segment ended short of it. With `--archive --recreate --metadata-nodes 3`, 155 found
/// a writer that could not start over an unacknowledged record at the base of a segment a
/// recovery had sealed empty, which removed it (`trim::plan` cuts what lies at or past the
/// end of a chain left with no segment since).
#[test]
fn seeds_that_found_defects_pass() {
    for seed in ["163", "179", "1274", "1286", "1365", "1375", "1440", "5231"] {
        let o = silt_sim(&["--seed", seed]);
        assert!(o.status.success(), "seed {seed} fails again:\n{}", stdout(&o));
    }
    for seed in ["48", "92", "99", "594", "894"] {
        let o = silt_sim(&["--seed", seed, "--disk-loss"]);
        assert!(o.status.success(), "seed {seed} fails again with --disk-loss:\n{}", stdout(&o));
    }
    for seed in ["11", "13", "21"] {
        let o = silt_sim(&["--seed", seed, "--archive", "--recreate"]);
        assert!(o.status.success(), "seed {seed} fails again with --archive --recreate:\n{}", stdout(&o));
    }
    let o = silt_sim(&["--seed", "155", "--archive", "--recreate", "--metadata-nodes", "3"]);
    assert!(
        o.status.success(),
        "seed 155 fails again with --archive --recreate --metadata-nodes 3:\n{}",
        stdout(&o)
    );
    for seed in ["7", "14", "65"] {
        let o = silt_sim(&["--seed", seed, "--metadata-nodes", "3"]);
        assert!(o.status.success(), "seed {seed} fails again with --metadata-nodes 3:\n{}", stdout(&o));
    }
    for seed in ["6", "15", "26", "33"] {
        // In a child process of its own, killed if it runs for good (33 did).
        let o = silt_sim(&["--seeds", &format!("{seed}..{}", seed.parse::<u64>().unwrap() + 1), "--groups"]);
        assert!(o.status.success(), "seed {seed} fails again with --groups:\n{}", stdout(&o));
    }
}

#[test]
fn bad_arguments_get_a_clear_error_and_run_nothing() {
    let o = silt_sim(&["--seeds", "5..5"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("holds no seed"), "{o:?}");

    let o = silt_sim(&["--seed", "1", "--bug", "no-such-defect"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no defect is named 'no-such-defect'") && err.contains("skip-fence"), "{err}");

    let o = silt_sim(&["--seed", "1", "--metadata-nodes", "2"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("give 1, 3 or 5"), "{o:?}");

    let o = silt_sim(&[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--seeds START..END or --seed S"), "{o:?}");
}

#[test]
fn silt_faults_refuses_a_run_of_no_time_before_it_starts_anything() {
    for minutes in ["0", "-1", "2000"] {
        let o = Command::new(env!("CARGO_BIN_EXE_silt-faults"))
            .arg(format!("--minutes={minutes}"))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("--minutes must be above 0 and at most 1440"), "{err}");
    }
}

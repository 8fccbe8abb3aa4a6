//! Decisions of an open segment's recovery, without I/O: how many members must answer, what
//! to do with their answers (wait, seal empty, or seal at the longest tail after copying it to
//! the members that hold less), and who holds the segment once it is sealed. The recovery
//! itself (fences, tail copies, the seal in metadata) is `PartitionWriter::recover`.
//!
//! Every acknowledged batch is on W members (W = `min.insync.replicas`), so any R - W + 1
//! members that answer include one that holds it: the longest tail among them ends at or after
//! every acknowledged offset. A member whose data directory was replaced since the segment
//! opened (its instance changed) holds nothing of it and does not count.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// An open segment, as the recoveries of it know it: topic, partition, base offset, and the
/// epoch it was opened under.
pub(crate) type OpenSegmentKey = (String, u32, u64, u64);

/// When this process began waiting for each silent member of the open segments its recoveries
/// wait for. Metadata's record of the waits (`Segment::silent_since_ms`) bounds them whichever
/// agent recovers; this bounds them too when that record cannot be written (metadata nodes of
/// an older version refuse the command, or writes fail).
#[derive(Debug, Default)]
pub struct SilentWaits(Mutex<HashMap<OpenSegmentKey, HashMap<String, Instant>>>);

impl SilentWaits {
    /// Records that a recovery of `segment` waits for the members `silent` (and no longer for
    /// any other), and says how long this process has waited for each of them.
    pub(crate) fn waiting(&self, segment: &OpenSegmentKey, silent: &[String]) -> HashMap<String, Duration> {
        let now = Instant::now();
        let mut waits = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let since = waits.entry(segment.clone()).or_default();
        since.retain(|m, _| silent.contains(m));
        silent.iter().map(|m| (m.clone(), now - *since.entry(m.clone()).or_insert(now))).collect()
    }

    /// `segment` is sealed: nobody is waited for any more.
    pub(crate) fn sealed(&self, segment: &OpenSegmentKey) {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(segment);
    }
}

/// How a member of the open segment answered the recovering writer's fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// It holds the segment up to `end` (exclusive; the segment's base if it holds nothing).
    Holds {
        /// One past the last offset it holds.
        end: u64,
    },
    /// Its data directory is not the one the segment was opened on: what it held is gone.
    Lost,
    /// It did not answer (down, paused, cut off, an error).
    Missing,
}

/// What a recovery does with the answers it has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Fewer than [`answers_needed`] members hold the segment, and some did not answer yet:
    /// the writer does not start until enough are back (sealing now could drop acknowledged
    /// batches).
    Wait {
        /// Members that must answer.
        needed: usize,
        /// Members that answered and still hold their copy.
        counted: usize,
    },
    /// No member that answered holds a copy (every disk that held one was replaced): the
    /// segment is sealed empty.
    SealEmpty,
    /// Seal at `end`, the longest tail among the answers, held by `source`: first copy the
    /// tail `[from, end)` to each member of `copy_to`, which hold less.
    Seal {
        /// A member holding the longest tail.
        source: String,
        /// One past the last offset of the sealed segment.
        end: u64,
        /// The members that hold `end` already.
        holding: Vec<String>,
        /// Members to copy the tail to, each with where its copy ends.
        copy_to: Vec<(String, u64)>,
    },
}

/// Answers a recovery of a segment on `members` replicas, written with quorum `write_quorum`,
/// waits for: R - W + 1 (W clamped to 1..=R).
pub(crate) fn answers_needed(members: usize, write_quorum: usize) -> usize {
    let w = write_quorum.clamp(1, members.max(1));
    members + 1 - w
}

/// The plan for `answers` (one per member that answered or is known not to): wait while fewer
/// than [`answers_needed`] hold a copy and a member is missing; otherwise seal at the longest
/// tail. Members are taken in the order given; the first with the longest tail is the source.
pub(crate) fn plan(members: usize, write_quorum: usize, answers: &[(String, Answer)]) -> Plan {
    let needed = answers_needed(members, write_quorum);
    let held: Vec<(&String, u64)> = answers
        .iter()
        .filter_map(|(m, a)| match a {
            Answer::Holds { end } => Some((m, *end)),
            Answer::Lost | Answer::Missing => None,
        })
        .collect();
    let missing = answers.iter().any(|(_, a)| *a == Answer::Missing) || answers.len() < members;
    if held.len() < needed && missing {
        return Plan::Wait { needed, counted: held.len() };
    }
    let Some(end) = held.iter().map(|(_, end)| *end).max() else {
        return Plan::SealEmpty;
    };
    let holding: Vec<String> = held.iter().filter(|(_, e)| *e == end).map(|(m, _)| (*m).clone()).collect();
    Plan::Seal {
        // The first: the writer's own answer comes first when it holds the longest tail, and
        // a local read is the cheapest copy.
        source: holding[0].clone(),
        end,
        holding,
        copy_to: held.iter().filter(|(_, e)| *e < end).map(|(m, e)| ((*m).clone(), *e)).collect(),
    }
}

/// Whether a seal at `end` of the segment at `base` may go ahead with `holders` members holding
/// the whole tail after the copies, of `answered` that held a copy, while a member that did not
/// answer `may_come_back` with its copy: a tail that is not empty must be on W of them, or the
/// recovery is tried again. On fewer only once no member that did not answer may come back
/// (then all that answered hold it): a tail sealed on fewer than W disks is served from then
/// on, though nobody may have acknowledged it, and is lost with those disks (readers would
/// have seen messages no disk holds any more).
pub(crate) fn enough_holders(
    write_quorum: usize,
    answered: usize,
    holders: usize,
    may_come_back: bool,
    base: u64,
    end: u64,
) -> bool {
    end == base || holders >= write_quorum || (!may_come_back && holders >= write_quorum.min(answered))
}

/// Whether a member of the open segment that did not answer its recovery may still come back
/// with its copy, judged at metadata's clock `now_ms`: metadata knows it, on the disk recorded
/// for it when the segment opened (`recorded`, empty if unknown), and it has not been gone
/// longer than `repair_after_ms` past its lease (after that, repair replaces it anyway).
pub(crate) fn may_come_back(
    info: Option<&silt_metadata::state::AgentInfo>,
    recorded: &str,
    now_ms: u64,
    repair_after_ms: u64,
) -> bool {
    info.is_some_and(|i| {
        (recorded.is_empty() || i.instance == recorded)
            && (i.is_live(now_ms)
                || now_ms < i.last_heartbeat_ms.saturating_add(i.lease_ms).saturating_add(repair_after_ms))
    })
}

/// Who a seal after a recovery names, of `ensemble`: the holders of the whole sealed range
/// (those that answered with its end, and those the longest tail was copied to), `None` when
/// that is every member (the seal keeps the ensemble as it is); and the unverified members,
/// those that neither hold it nor are known to have lost their disk (`lost`). A member that did
/// not answer (and may hold less, or nothing) is never named a holder, so reads go to it only
/// when no holder answers, and repair copies the segment to new members until it is back to
/// its replication factor; but it stays named: it may hold acknowledged offsets that the
/// holders' disks lose before repair has copied them.
pub(crate) fn sealed_members(
    ensemble: &[String],
    holding_end: &[String],
    lost: &[String],
) -> (Option<Vec<String>>, Vec<String>) {
    let holders: Vec<String> = ensemble.iter().filter(|m| holding_end.contains(m)).cloned().collect();
    if holders.is_empty() || holders.len() == ensemble.len() {
        return (None, Vec::new());
    }
    let unverified =
        ensemble.iter().filter(|m| !holding_end.contains(m) && !lost.contains(m)).cloned().collect();
    (Some(holders), unverified)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(s: &[&str]) -> Vec<String> {
        s.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_recovery_waits_for_r_minus_w_plus_one_answers() {
        for (r, w, needed) in [(1, 1, 1), (2, 1, 2), (2, 2, 1), (3, 2, 2), (3, 3, 1), (5, 3, 3), (5, 1, 5)] {
            assert_eq!(answers_needed(r, w), needed, "R={r} W={w}");
        }
        assert_eq!(answers_needed(3, 0), 3, "W is at least 1");
        assert_eq!(answers_needed(3, 7), 1, "W is at most R");
        assert_eq!(answers_needed(0, 1), 0, "no members: nothing to wait for");
    }

    /// Every ensemble of 1 to 5 members, every W, every member holding 0, 1 or 2 offsets of the
    /// segment and answering, missing or with its disk replaced: the plan never drops an offset
    /// that W members held (the acknowledged ones) unless the disks of all of them that could
    /// say so were replaced, waits only while too few copies answered and a member may still,
    /// and copies the longest tail to exactly the members that answered with less.
    #[test]
    fn the_plan_keeps_every_acknowledged_offset_for_every_ensemble_quorum_and_answer() {
        let mut cases = 0u64;
        for r in 1..=5usize {
            let members: Vec<String> = (0..r).map(|i| format!("m{i}")).collect();
            // Per member: its true end (0..3) and how it answers (0 holds, 1 missing, 2 lost).
            for code in 0..9usize.pow(r as u32) {
                let digits: Vec<(u64, usize)> = (0..r)
                    .map(|i| (code / 9usize.pow(i as u32)) % 9)
                    .map(|d| ((d % 3) as u64, d / 3))
                    .collect();
                let answers: Vec<(String, Answer)> = members
                    .iter()
                    .zip(&digits)
                    .map(|(m, (end, how))| {
                        let a = match how {
                            0 => Answer::Holds { end: *end },
                            1 => Answer::Missing,
                            _ => Answer::Lost,
                        };
                        (m.clone(), a)
                    })
                    .collect();
                for w in 1..=r {
                    cases += 1;
                    let ends: Vec<u64> = digits.iter().map(|(e, _)| *e).collect();
                    // The acknowledged end: the offsets W members held.
                    let acked = (0..=2u64)
                        .rev()
                        .find(|a| ends.iter().filter(|e| **e >= *a).count() >= w)
                        .unwrap_or(0);
                    let held: Vec<(usize, u64)> = digits
                        .iter()
                        .enumerate()
                        .filter(|(_, (_, how))| *how == 0)
                        .map(|(i, (e, _))| (i, *e))
                        .collect();
                    let any_missing = digits.iter().any(|(_, how)| *how == 1);
                    let needed = answers_needed(r, w);
                    let case = format!("R={r} W={w} {digits:?}");
                    let planned = plan(r, w, &answers);
                    // As `recover` passes them (holders, then lost disks, then the missing), and
                    // with the members that have not answered left out: the same plan.
                    let by_kind = |k: fn(&Answer) -> bool| answers.iter().filter(move |(_, a)| k(a)).cloned();
                    let regrouped: Vec<(String, Answer)> = by_kind(|a| matches!(a, Answer::Holds { .. }))
                        .chain(by_kind(|a| *a == Answer::Lost))
                        .chain(by_kind(|a| *a == Answer::Missing))
                        .collect();
                    let answered: Vec<(String, Answer)> =
                        answers.iter().filter(|(_, a)| *a != Answer::Missing).cloned().collect();
                    assert_eq!(normalized(&plan(r, w, &regrouped)), normalized(&planned), "{case}");
                    assert_eq!(normalized(&plan(r, w, &answered)), normalized(&planned), "{case}");
                    match planned {
                        Plan::Wait { needed: n, counted } => {
                            assert_eq!((n, counted), (needed, held.len()), "{case}");
                            assert!(held.len() < needed && any_missing, "{case}: waits needlessly");
                        }
                        Plan::SealEmpty => {
                            assert!(held.is_empty() && !any_missing, "{case}: sealed empty");
                        }
                        Plan::Seal { source, end, holding, copy_to } => {
                            assert!(!held.is_empty(), "{case}");
                            let best = held.iter().map(|(_, e)| *e).max().unwrap_or(0);
                            assert_eq!(end, best, "{case}: the longest tail that answered");
                            if held.len() >= needed {
                                assert!(end >= acked, "{case}: sealed at {end}, {acked} acknowledged");
                            } else {
                                assert!(!any_missing, "{case}: sealed while a member may still answer");
                            }
                            let holders: Vec<String> = held
                                .iter()
                                .filter(|(_, e)| *e == end)
                                .map(|(i, _)| members[*i].clone())
                                .collect();
                            assert_eq!(holding, holders, "{case}");
                            assert_eq!(Some(&source), holders.first(), "{case}");
                            let shorter: Vec<(String, u64)> = held
                                .iter()
                                .filter(|(_, e)| *e < end)
                                .map(|(i, e)| (members[*i].clone(), *e))
                                .collect();
                            assert_eq!(copy_to, shorter, "{case}");
                        }
                    }
                }
            }
        }
        assert_eq!(cases, (1..=5u64).map(|r| 9u64.pow(r as u32) * r).sum::<u64>());
    }

    /// A plan with its member lists sorted, and without the choice among equal sources.
    fn normalized(p: &Plan) -> Plan {
        match p {
            Plan::Seal { end, holding, copy_to, .. } => {
                let (mut holding, mut copy_to) = (holding.clone(), copy_to.clone());
                holding.sort();
                copy_to.sort();
                Plan::Seal { source: String::new(), end: *end, holding, copy_to }
            }
            other => other.clone(),
        }
    }

    #[test]
    fn a_recovered_tail_is_sealed_only_on_w_holders_or_all_that_answered_once_no_other_may_come_back() {
        // (W, members that answered with a copy, holders after the copies, a silent member may
        // come back, base, end, seal?)
        for (w, answered, holders, back, base, end, seal) in [
            (2, 3, 2, false, 0, 10, true),
            (2, 3, 2, true, 0, 10, true),
            (2, 3, 1, false, 0, 10, false),
            (2, 1, 1, false, 0, 10, true),
            (2, 1, 1, true, 0, 10, false),
            (3, 2, 2, false, 5, 9, true),
            (3, 2, 2, true, 5, 9, false),
            (3, 3, 2, false, 5, 9, false),
            (2, 3, 0, true, 7, 7, true),
        ] {
            assert_eq!(
                enough_holders(w, answered, holders, back, base, end),
                seal,
                "W={w} {answered} {holders} back={back} {base}..{end}"
            );
        }
    }

    #[test]
    fn a_process_waits_for_each_silent_member_from_the_first_recovery_that_waited_for_it() {
        let waits = SilentWaits::default();
        let seg: OpenSegmentKey = ("t".into(), 0, 10, 2);
        let first = waits.waiting(&seg, &names(&["b", "c"]));
        assert_eq!(first.values().copied().collect::<Vec<_>>(), vec![Duration::ZERO; 2]);
        std::thread::sleep(Duration::from_millis(20));
        let again = waits.waiting(&seg, &names(&["b", "c"]));
        assert!(
            again["b"] >= Duration::from_millis(20) && again["c"] >= Duration::from_millis(20),
            "{again:?}"
        );
        // b answered a recovery in between: waited for afresh when silent again.
        waits.waiting(&seg, &names(&["c"]));
        let b_again = waits.waiting(&seg, &names(&["b", "c"]));
        assert!(b_again["b"] < Duration::from_millis(20) && b_again["c"] >= Duration::from_millis(20));
        // Another segment (or the same base under another epoch) has waits of its own.
        assert_eq!(waits.waiting(&("t".into(), 0, 10, 3), &names(&["c"]))["c"], Duration::ZERO);
        waits.sealed(&seg);
        assert_eq!(waits.waiting(&seg, &names(&["c"]))["c"], Duration::ZERO);
    }

    #[test]
    fn a_silent_member_may_come_back_until_it_has_been_gone_past_its_lease_and_the_repair_wait() {
        let info = |instance: &str, last_heartbeat_ms: u64, left: bool| silt_metadata::state::AgentInfo {
            id: "b".into(),
            addr: "b:1".into(),
            incarnation: 1,
            lease_ms: 2_000,
            registered_ms: 0,
            last_heartbeat_ms,
            instance: instance.into(),
            left,
            handed_off_ms: 0,
        };
        let after = 60_000;
        assert!(may_come_back(Some(&info("ib", 10_000, false)), "ib", 11_000, after), "live");
        assert!(may_come_back(Some(&info("ib", 10_000, false)), "ib", 71_999, after), "lapsed, not long");
        assert!(!may_come_back(Some(&info("ib", 10_000, false)), "ib", 72_000, after), "gone long");
        assert!(
            may_come_back(Some(&info("ib", 10_000, true)), "ib", 11_000, after),
            "left on purpose, lately"
        );
        assert!(!may_come_back(Some(&info("ib-new", 10_000, false)), "ib", 11_000, after), "another disk");
        assert!(may_come_back(Some(&info("ib", 10_000, false)), "", 11_000, after), "no disk recorded");
        assert!(!may_come_back(None, "ib", 11_000, after), "forgotten");
    }

    #[test]
    fn only_the_members_that_hold_the_sealed_end_are_named_holders_and_the_silent_ones_unverified() {
        let ensemble = names(&["a", "b", "c"]);
        let none: &[String] = &[];
        assert_eq!(
            sealed_members(&ensemble, &names(&["c", "a", "b"]), none),
            (None, Vec::new()),
            "every member"
        );
        assert_eq!(
            sealed_members(&ensemble, &names(&["c", "a"]), none),
            (Some(names(&["a", "c"])), names(&["b"])),
            "b did not answer: it may hold the segment"
        );
        assert_eq!(
            sealed_members(&ensemble, &names(&["c"]), &names(&["b"])),
            (Some(names(&["c"])), names(&["a"])),
            "b lost its disk: it holds nothing"
        );
        assert_eq!(
            sealed_members(&ensemble, &names(&["b", "x"]), none),
            (Some(names(&["b"])), names(&["a", "c"])),
            "not a member: ignored"
        );
        assert_eq!(sealed_members(&ensemble, &[], none), (None, Vec::new()), "nobody: an empty seal");
        // A shrunk ensemble sealed by one member: the other is named, though it did not answer.
        assert_eq!(
            sealed_members(&names(&["a", "b"]), &names(&["a"]), none),
            (Some(names(&["a"])), names(&["b"]))
        );
        for r in 1..=5usize {
            let ensemble: Vec<String> = (0..r).map(|i| format!("m{i}")).collect();
            for holding in 1..=r {
                for lost in 0..=(r - holding) {
                    let (holders, unverified) =
                        sealed_members(&ensemble, &ensemble[r - holding..], &ensemble[..lost]);
                    let want = (holding < r).then(|| ensemble[r - holding..].to_vec());
                    assert_eq!(holders, want, "R={r}, {holding} holding");
                    // Every member is a holder, unverified, or known to hold nothing.
                    let named = holders.as_ref().map_or(r, Vec::len) + unverified.len() + lost;
                    assert_eq!(named, r, "R={r}, {holding} holding, {lost} lost");
                    assert!(unverified
                        .iter()
                        .all(|m| !ensemble[r - holding..].contains(m) && !ensemble[..lost].contains(m)));
                }
            }
        }
    }
}

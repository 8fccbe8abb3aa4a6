//! Decisions of an open segment's recovery, without I/O: given what the members answered,
//! who holds the segment once it is sealed. The recovery itself (fences, tail copies, the seal
//! in metadata) is `PartitionWriter::recover`.

/// The members of `ensemble` that hold the whole sealed range `[base, end)` after a recovery:
/// those that answered with `end` already, and those the longest tail was copied to. `None`
/// when that is every member (the seal keeps the ensemble as it is); otherwise exactly those,
/// in the ensemble's order, so that a member that did not answer (and may hold less, or
/// nothing) is never named as a holder: reads are not sent to it, and repair copies the
/// segment to new members until it is back to its replication factor.
pub(crate) fn sealed_holders(ensemble: &[String], holding_end: &[String]) -> Option<Vec<String>> {
    let holders: Vec<String> = ensemble.iter().filter(|m| holding_end.contains(m)).cloned().collect();
    (holders.len() < ensemble.len() && !holders.is_empty()).then_some(holders)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(s: &[&str]) -> Vec<String> {
        s.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn only_the_members_that_hold_the_sealed_end_are_named() {
        let ensemble = names(&["a", "b", "c"]);
        assert_eq!(sealed_holders(&ensemble, &names(&["c", "a", "b"])), None, "every member");
        assert_eq!(
            sealed_holders(&ensemble, &names(&["c", "a"])),
            Some(names(&["a", "c"])),
            "b did not answer"
        );
        assert_eq!(
            sealed_holders(&ensemble, &names(&["b", "x"])),
            Some(names(&["b"])),
            "not a member: ignored"
        );
        assert_eq!(sealed_holders(&ensemble, &[]), None, "nobody: nothing to name (an empty seal)");
        for r in 1..=5usize {
            let ensemble: Vec<String> = (0..r).map(|i| format!("m{i}")).collect();
            for holding in 1..=r {
                let got = sealed_holders(&ensemble, &ensemble[r - holding..]);
                let want = (holding < r).then(|| ensemble[r - holding..].to_vec());
                assert_eq!(got, want, "R={r}, {holding} holding");
            }
        }
    }
}

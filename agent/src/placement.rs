//! Which agents hold a new segment, decided without I/O: the writer itself, then the reachable
//! live agents that are members of the fewest open segments (ties by id, so that every writer
//! decides alike), up to the replication factor.

use std::collections::BTreeMap;

/// The ensemble of a new segment written by `me`: `me` first, then up to
/// `replication_factor - 1` of `reachable` (other live agents that answered lately), the least
/// loaded first, where an agent's load is how many of `open_ensembles` it is a member of. Fewer
/// members than the replication factor when there are not enough agents.
pub(crate) fn choose_ensemble<'a>(
    me: &str,
    reachable: &[String],
    open_ensembles: impl IntoIterator<Item = &'a [String]>,
    replication_factor: usize,
) -> Vec<String> {
    let mut load: BTreeMap<&str, usize> =
        reachable.iter().filter(|a| *a != me).map(|a| (a.as_str(), 0)).collect();
    for ensemble in open_ensembles {
        for a in ensemble {
            if let Some(n) = load.get_mut(a.as_str()) {
                *n += 1;
            }
        }
    }
    let mut others: Vec<(&str, usize)> = load.into_iter().collect();
    others.sort_by_key(|(id, n)| (*n, *id));
    std::iter::once(me)
        .chain(others.into_iter().map(|(id, _)| id))
        .take(replication_factor.max(1))
        .map(String::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(s: &[&str]) -> Vec<String> {
        s.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn the_writer_comes_first_then_the_least_loaded_by_id() {
        let reachable = names(&["c", "b", "d", "a"]);
        let open = [names(&["x", "b", "c"]), names(&["y", "b"]), names(&["z", "d"])];
        let open: Vec<&[String]> = open.iter().map(Vec::as_slice).collect();
        // Loads: a 0, b 2, c 1, d 1.
        for (r, want) in [
            (1, vec!["w"]),
            (2, vec!["w", "a"]),
            (3, vec!["w", "a", "c"]),
            (4, vec!["w", "a", "c", "d"]),
            (5, vec!["w", "a", "c", "d", "b"]),
            (7, vec!["w", "a", "c", "d", "b"]),
        ] {
            assert_eq!(choose_ensemble("w", &reachable, open.iter().copied(), r), names(&want), "R={r}");
        }
        assert_eq!(choose_ensemble("w", &[], open.iter().copied(), 3), names(&["w"]), "alone");
        assert_eq!(choose_ensemble("w", &reachable, [], 0), names(&["w"]), "at least the writer");
    }

    /// Every number of other agents up to 5, every replication factor up to 5, every load of
    /// each agent up to 2 open segments: the writer first, no agent twice, none that is not
    /// reachable, as many members as there can be, and no member more loaded than an agent left
    /// out.
    #[test]
    fn an_ensemble_is_as_large_as_it_can_be_and_never_passes_over_a_less_loaded_agent() {
        for n in 0..=5usize {
            let others: Vec<String> = (0..n).map(|i| format!("a{i}")).collect();
            for loads in 0..3usize.pow(n as u32) {
                let load_of: Vec<usize> = (0..n).map(|i| (loads / 3usize.pow(i as u32)) % 3).collect();
                // Each open segment is one agent's membership, beside agents that are not
                // reachable (they count for nothing).
                let open: Vec<Vec<String>> = others
                    .iter()
                    .zip(&load_of)
                    .flat_map(|(a, l)| std::iter::repeat_n(vec![a.clone(), "gone".to_string()], *l))
                    .collect();
                for r in 1..=5usize {
                    let chosen = choose_ensemble("me", &others, open.iter().map(Vec::as_slice), r);
                    let case = format!("n={n} loads={load_of:?} R={r}");
                    assert_eq!(chosen[0], "me", "{case}");
                    assert_eq!(chosen.len(), r.min(n + 1), "{case}");
                    let mut unique = chosen.clone();
                    unique.sort();
                    unique.dedup();
                    assert_eq!(unique.len(), chosen.len(), "{case}: {chosen:?}");
                    let load = |a: &String| others.iter().position(|o| o == a).map(|i| load_of[i]);
                    assert!(chosen[1..].iter().all(|a| load(a).is_some()), "{case}: {chosen:?}");
                    let most_chosen = chosen[1..].iter().filter_map(load).max();
                    let least_left = others.iter().filter(|a| !chosen.contains(a)).filter_map(load).min();
                    if let (Some(most), Some(least)) = (most_chosen, least_left) {
                        assert!(most <= least, "{case}: {chosen:?}");
                    }
                }
            }
        }
    }
}

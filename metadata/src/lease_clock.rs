//! The clock that agents' leases and group sessions are judged by.
//!
//! The leader stamps its time on the commands whose clock decides something
//! (`Command::stamp_clock`). That time is not its wall clock, which NTP or an operator can step
//! by hours: a forward step would lapse every lease at once (every partition changes writer),
//! and a backward step would freeze lapses for the size of the step, since the state's clock
//! never goes back. It is the time the leader measured itself: when it starts to lead (a new
//! term), it takes the state's clock as it finds it and adds the elapsed time of its own
//! monotonic clock from then on. Time between two leaders (an election, a whole-cluster
//! restart) is not counted: leases lapse later, never earlier, than the agents holding them
//! expect. A fresh cluster's first leader starts from its wall clock.
//!
//! Pure logic: the node passes in its term, the state's clock, its wall clock and its
//! monotonic reading, so every rule is a function call in a test.

use std::time::Duration;

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct LeaseClock {
    base: Option<Base>,
}

#[derive(Debug, Clone, Copy)]
struct Base {
    term: u64,
    at_ms: u64,
    monotonic: Duration,
}

impl LeaseClock {
    /// The time to stamp on a command this node proposes while leading in `term`.
    /// `state_clock_ms` is the newest time the state has applied, `wall_ms` the wall clock
    /// (used only by a cluster whose state has no time yet), `monotonic` a reading of a
    /// monotonic clock.
    pub(crate) fn now_ms(
        &mut self,
        term: u64,
        state_clock_ms: u64,
        wall_ms: u64,
        monotonic: Duration,
    ) -> u64 {
        let base = match self.base {
            Some(b) if b.term == term && monotonic >= b.monotonic => b,
            _ => {
                let at_ms = if state_clock_ms == 0 { wall_ms } else { state_clock_ms };
                let b = Base { term, at_ms, monotonic };
                self.base = Some(b);
                b
            }
        };
        let elapsed_ms = u64::try_from((monotonic - base.monotonic).as_millis()).unwrap_or(u64::MAX);
        base.at_ms.saturating_add(elapsed_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR_MS: u64 = 3_600_000;

    fn at(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn a_step_of_the_leaders_wall_clock_moves_nothing() {
        let mut c = LeaseClock::default();
        let wall = 1_800_000_000_000;
        assert_eq!(c.now_ms(3, 0, wall, at(10)), wall, "a fresh cluster starts from the wall clock");
        assert_eq!(c.now_ms(3, wall, wall + 500, at(510)), wall + 500);
        // An hour forward: leases lapse no sooner.
        assert_eq!(c.now_ms(3, wall + 500, wall + HOUR_MS + 1_000, at(1_010)), wall + 1_000);
        // And back again: time goes on, lapses are not frozen.
        assert_eq!(c.now_ms(3, wall + 1_000, wall - HOUR_MS + 1_500, at(1_510)), wall + 1_500);
    }

    #[test]
    fn a_new_leader_goes_on_from_the_states_clock_with_its_own_elapsed_time() {
        let mut c = LeaseClock::default();
        assert_eq!(c.now_ms(1, 0, 5_000, at(0)), 5_000);
        assert_eq!(c.now_ms(1, 5_000, 99_999_999, at(2_000)), 7_000);
        // Term 2 (this node led again after an election): the state's clock as it is now.
        assert_eq!(c.now_ms(2, 7_100, 1, at(9_000)), 7_100);
        assert_eq!(c.now_ms(2, 7_100, 1, at(9_250)), 7_350);
        // A monotonic reading that goes back (another clock source) starts a new base.
        assert_eq!(c.now_ms(2, 7_350, 1, at(100)), 7_350);
    }
}

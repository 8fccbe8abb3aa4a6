//! What Silt's two fault harnesses share: the history of what their clients did and saw, and
//! the checker that judges it. `silt-sim` records it in one deterministic process under
//! simulated faults; `silt-faults` records it from real processes under real ones.

pub mod check;
pub mod history;
pub mod linearizable;
pub mod register;

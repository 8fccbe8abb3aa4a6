//! The replicated hot tail, writer side: [`writer`] the partition writer (an actor owning the
//! partition's log, group-committing appends), [`ensemble`] streaming each group to the open
//! segment's followers and counting the write quorum; and the decisions, which do no I/O:
//! [`placement`] (which agents hold a new segment, who repairs a sealed one) and [`recovery`]
//! (what a new writer does with an open segment's members' answers).

pub mod ensemble;
pub(crate) mod placement;
pub(crate) mod recovery;
pub mod writer;

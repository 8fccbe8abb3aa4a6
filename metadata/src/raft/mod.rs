//! openraft's side of the metadata service: its types, the durable Raft log and the snapshots
//! of the state machine (both in files of length + CRC-32C framed records, replaced
//! atomically), and the transports between nodes (none for a single node, HTTP for a cluster, in memory for the simulator's).

pub(crate) mod atomic_file;
pub(crate) mod frame;
pub mod http_network;
pub mod log_store;
pub mod memory_network;
pub mod network;
pub mod state_machine_store;
pub mod types;

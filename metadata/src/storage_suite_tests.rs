//! openraft's own conformance suite, run against [`LogStore`] and [`StateMachineStore`].

use openraft::testing::{StoreBuilder, Suite};
use tempfile::TempDir;

use crate::raft::types::{StorageError, TypeConfig};
use crate::{LogStore, StateMachineStore};

struct TempDirStores;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for TempDirStores {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError> {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = LogStore::open(&dir.path().join("log")).expect("open log store");
        let sm = StateMachineStore::open(&dir.path().join("sm")).expect("open state machine store");
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_suite() {
    Suite::test_all(TempDirStores).unwrap();
}

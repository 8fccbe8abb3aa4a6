#!/usr/bin/env bash
# Runs Silt's whole test suite on a fresh machine: installs what the tests need, checks
# formatting and lints, builds the `silt` binary the end-to-end tests start, runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/silt-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "== installing cargo-nextest"
  cargo install cargo-nextest --locked
fi

if ! command -v curl >/dev/null 2>&1 || ! python3 -m venv --help >/dev/null 2>&1; then
  echo "== installing curl and python3-venv"
  if [[ $(id -u) -eq 0 ]]; then apt-get update -qq && apt-get install -y -qq curl python3-venv >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq curl python3-venv >/dev/null; fi
fi

echo "== format"
cargo fmt --all --check

echo "== lints"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== build everything (the end-to-end tests start the silt binary built here)"
# --all-targets resolves features as the test build does, so the tests reuse this build.
cargo build --workspace --all-targets --locked

echo "== S3 emulators and Arrow tools for the tiering tests"
cleanup() {
  ./localstack/seaweedfs.sh stop || true
  ./localstack/localstack.sh stop || true
}
trap cleanup EXIT
./localstack/seaweedfs.sh start >/dev/null
./localstack/localstack.sh start >/dev/null
export SILT_TEST_SEAWEEDFS_ENDPOINT=http://127.0.0.1:${SEAWEEDFS_S3_PORT:-8333}
export SILT_TEST_LOCALSTACK_ENDPOINT=http://127.0.0.1:4566
SILT_TEST_PYTHON=$(./localstack/python-tools.sh)
export SILT_TEST_PYTHON

status=0
# First, so that the last lines a reader sees are the whole suite's summary.
echo "== tiering and retention tests with the clocks 30 days ahead"
./scripts/faketime-tests.sh +30d || status=$?

echo "== tests"
cargo nextest run --workspace --locked --no-fail-fast || status=$?

# A short schedule of the deterministic simulator (docs/reliability.md); scripts/sim.sh runs
# it for hours. A failing seed replays alone: silt-sim --seed S --trace.
echo "== simulation: seeds 0..${SILT_SIM_SEEDS:-100}"
"$CARGO_TARGET_DIR/debug/silt-sim" --seeds "0..${SILT_SIM_SEEDS:-100}" -j "$(nproc)" || status=$?
echo "== simulation with a writer's disk replaced: seeds 0..${SILT_SIM_DISK_LOSS_SEEDS:-30}"
"$CARGO_TARGET_DIR/debug/silt-sim" --seeds "0..${SILT_SIM_DISK_LOSS_SEEDS:-30}" --disk-loss -j "$(nproc)" || status=$?
echo "== simulation with consumer groups: seeds 0..${SILT_SIM_GROUPS_SEEDS:-30}"
"$CARGO_TARGET_DIR/debug/silt-sim" --seeds "0..${SILT_SIM_GROUPS_SEEDS:-30}" --groups -j "$(nproc)" || status=$?
echo "== simulation with the archive: seeds 0..${SILT_SIM_ARCHIVE_SEEDS:-30}"
"$CARGO_TARGET_DIR/debug/silt-sim" --seeds "0..${SILT_SIM_ARCHIVE_SEEDS:-30}" --archive -j "$(nproc)" || status=$?
echo "== simulation with the archive and the topic deleted and created again: seeds 0..${SILT_SIM_ARCHIVE_SEEDS:-30}"
"$CARGO_TARGET_DIR/debug/silt-sim" --seeds "0..${SILT_SIM_ARCHIVE_SEEDS:-30}" --archive --recreate -j "$(nproc)" || status=$?
echo "== simulation with three metadata nodes under faults of their own, agents paused: seeds 0..${SILT_SIM_METADATA_SEEDS:-60}"
"$CARGO_TARGET_DIR/debug/silt-sim" --seeds "0..${SILT_SIM_METADATA_SEEDS:-60}" --metadata-nodes 3 -j "$(nproc)" || status=$?
# A short schedule of real processes under real faults (docs/reliability.md); scripts/faults.sh
# MINUTES runs it longer.
if [[ $(id -u) -eq 0 ]]; then
  echo "== real processes under faults: ${SILT_FAULTS_MINUTES:-1} minute(s)"
  SILT_FAULTS_BIN="$CARGO_TARGET_DIR/debug/silt-faults" ./scripts/faults.sh "${SILT_FAULTS_MINUTES:-1}" 1 || status=$?
else
  echo "== real processes under faults: skipped (network namespaces and nftables need root)"
fi
if [[ $status -ne 0 ]]; then
  # The emulators are stopped (and their logs overwritten by the next start) after this: show
  # what they logged last, for a failure that was theirs.
  emulators_dir="${SILT_EMULATORS_DIR:-$HOME/.cache/silt-emulators}"
  for log in "$emulators_dir/localstack.log" "$emulators_dir/seaweedfs.log"; do
    if [[ -f $log ]]; then
      echo "== last lines of $log"
      tail -n 60 "$log"
    fi
  done
fi
exit "$status"

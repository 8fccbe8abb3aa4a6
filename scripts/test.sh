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

echo "== format"
cargo fmt --all --check

echo "== lints"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== build the silt binary for the end-to-end tests"
cargo build -p silt --locked

echo "== tests"
cargo nextest run --workspace --locked --no-fail-fast

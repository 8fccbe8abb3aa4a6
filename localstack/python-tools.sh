#!/usr/bin/env bash
# Creates a venv with pyarrow and duckdb (the tools the archive tests read Parquet with) and
# prints the path of its python. Idempotent.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
venv="$EMULATORS_DIR/arrow-venv"
if ! "$venv/bin/python" -c 'import pyarrow, duckdb' 2>/dev/null; then
  echo "installing pyarrow and duckdb into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check pyarrow duckdb
fi
echo "$venv/bin/python"

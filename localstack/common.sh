# Shared helpers for the emulator scripts. Sourced, not run.
EMULATORS_DIR="${SILT_EMULATORS_DIR:-$HOME/.cache/silt-emulators}"
mkdir -p "$EMULATORS_DIR"

# wait_until SECONDS DESCRIPTION COMMAND...: runs COMMAND until it succeeds or time runs out.
wait_until() {
  local seconds=$1 what=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      echo "timed out after ${seconds}s waiting for $what" >&2
      return 1
    fi
    sleep 0.2
  done
}

stop_pidfile() {
  local pidfile=$1
  if [[ -f $pidfile ]]; then
    local pid
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
  fi
}

#!/usr/bin/env bash
# Runs the deterministic simulator (`silt-sim`, see docs/reliability.md) on fresh seeds until
# HOURS are up, in rounds of 100 seeds on every core, and reports the seeds run, the seeds that
# failed (each replays alone with `silt-sim --seed S --trace`) and seeds per minute of one core.
#
#   scripts/sim.sh HOURS [FIRST_SEED]      e.g. scripts/sim.sh 6, scripts/sim.sh 0.1 50000
#
# $SILT_SIM_OPTIONS adds silt-sim's options (e.g. "--archive --groups", "--metadata-nodes 3"); the
# log of every round goes to $SILT_SIM_LOG (default target/sim-<first seed>.log).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ $# -ge 1 && $# -le 2 ]] || usage
hours=$1
first=${2:-0}
[[ $hours =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "sim.sh: HOURS must be a number, not '$hours'" >&2; usage; }
[[ $first =~ ^[0-9]+$ ]] || { echo "sim.sh: FIRST_SEED must be a whole number, not '$first'" >&2; usage; }

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/silt-target}"
cargo build --release --locked -p silt-sim
sim="$CARGO_TARGET_DIR/release/silt-sim"
jobs=$(nproc)
read -r -a options <<<"${SILT_SIM_OPTIONS:-}"
for ((i = 0; i < ${#options[@]}; i++)); do
  case ${options[i]} in
    --archive | --groups | --disk-loss | --recreate | --metadata-nodes=[135]) ;;
    --metadata-nodes)
      i=$((i + 1))
      [[ ${options[i]:-} =~ ^[135]$ ]] || { echo "sim.sh: --metadata-nodes takes 1, 3 or 5, not '${options[i]:-}'" >&2; exit 2; }
      ;;
    *)
      echo "sim.sh: SILT_SIM_OPTIONS may hold --archive, --groups, --disk-loss, --recreate and --metadata-nodes N, not '${options[i]}'" >&2
      exit 2
      ;;
  esac
done
log=${SILT_SIM_LOG:-target/sim-$first.log}
mkdir -p "$(dirname "$log")"
: >"$log"

round=100
seed=$first
ran=0
failed=0
started=$(date +%s)
deadline=$(awk -v s="$started" -v h="$hours" 'BEGIN { printf "%d", s + h * 3600 }')
while (($(date +%s) < deadline)); do
  out=$("$sim" --seeds "$seed..$((seed + round))" -j "$jobs" "${options[@]}" || true)
  printf '%s\n' "$out" >>"$log"
  summary=$(printf '%s\n' "$out" | tail -n 1)
  if [[ ! $summary =~ ^([0-9]+)\ seeds,\ ([0-9]+)\ failed$ ]]; then
    echo "sim.sh: silt-sim ended without its summary line; see $log" >&2
    exit 1
  fi
  ran=$((ran + BASH_REMATCH[1]))
  failed=$((failed + BASH_REMATCH[2]))
  printf '%s\n' "$out" | grep -v ' seeds, ' || true
  seed=$((seed + round))
done
elapsed=$(($(date +%s) - started))
echo "seeds $first..$seed on $jobs core(s) in ${elapsed}s: $(awk -v n="$ran" -v s="$elapsed" -v j="$jobs" \
  'BEGIN { printf "%.1f", n * 60 / (s * j) }') seeds per minute of one core"
echo "$ran seeds, $failed failed"
((failed == 0))

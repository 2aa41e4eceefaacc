#!/usr/bin/env bash
# The browser tests run again and again while every core is kept busy, to catch a test that
# races the browser: one CPU burner per core (each also stops by itself after STRESS_LIMIT
# seconds, should this script be killed outright), killed when the script ends however it
# ends (pass, failure, Ctrl-C), and N runs in a row that stop at the first failed one.
#
#   tests/browser/stress.sh [N] [PYTEST ARGS...]     default: 5 runs of tests/browser
#
# STRESS_CORES: how many burners (default: every core; 0 runs without load).
# STRESS_LIMIT: the longest a burner lives, in seconds (default: 1800 per run).
# CI is set, so a missing Chromium fails the run instead of skipping the tests.
set -euo pipefail
cd "$(dirname "$0")/../.."

runs=${1:-5}
shift || true
(($# > 0)) || set -- tests/browser
cores=${STRESS_CORES:-$(nproc)}
limit=${STRESS_LIMIT:-$((runs * 1800))}
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "stress: N must be a positive number, not '$runs'" >&2; exit 2; }

burners=()
stop_burners() {
  for pid in "${burners[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${burners[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
}
trap stop_burners EXIT
trap 'echo "stress: interrupted" >&2; exit 130' INT TERM HUP

for _ in $(seq 1 "$cores"); do
  python3 -c "
import time
end = time.monotonic() + $limit
while time.monotonic() < end:
    pass
" &
  burners+=("$!")
done

export CI=${CI:-true}
passed=0
for run in $(seq 1 "$runs"); do
  for pid in "${burners[@]}"; do
    kill -0 "$pid" 2>/dev/null || {
      echo "stress: a CPU burner has stopped (STRESS_LIMIT=$limit s reached?): not under load" >&2
      exit 1
    }
  done
  printf '\n==> stress run %d of %d, %d CPU burner(s): pytest %s\n' "$run" "$runs" "$cores" "$*"
  if ! .venv/bin/pytest -q -p no:cacheprovider "$@"; then
    echo "stress: run $run of $runs FAILED ($passed passed before it)" >&2
    exit 1
  fi
  passed=$((passed + 1))
done
echo "stress: $passed of $runs runs passed, $cores CPU burner(s) running throughout"

#!/usr/bin/env bash
# Run a pytest selection RUNS times under CPU load, to show that timing-sensitive tests (the multi-rank
# fault tests) do not depend on the machine being quiet. Not part of CI.
#
#   bash scripts/stress_tests.sh [-n RUNS] [-l LOOPS] [pytest arguments...]
#   bash scripts/stress_tests.sh -n 20 packages/parallel/tests/test_parallel_faults.py
#
# LOOPS busy loops (default: one per CPU) run beside the tests for as long as they run; the tests and the
# loops all run at nice 19, so the tests get what the loops and everything else on the machine leave them
# (on a shared machine: very little) while other users' work keeps its priority. Logs of failed runs are
# kept in $STRESS_LOGS (default: a temporary folder). Exits non-zero when any run failed.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=20
loops=$(nproc)
while getopts "n:l:" opt; do
    case $opt in
        n) runs=$OPTARG ;;
        l) loops=$OPTARG ;;
        *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
python=${PYTHON:-.venv/bin/python}
logs=${STRESS_LOGS:-$(mktemp -d -t stress-tests-XXXXXX)}
mkdir -p "$logs"

pids=()
stop_loops() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop_loops EXIT
for _ in $(seq "$loops"); do
    nice -n 19 "$python" -c "while True: pass" &
    pids+=($!)
done

failed=0
start=$(date +%s)
for i in $(seq "$runs"); do
    t0=$(date +%s)
    if nice -n 19 "$python" -m pytest -q "$@" > "$logs/run_$i.log" 2>&1; then
        status=passed
    else
        status="FAILED (log: $logs/run_$i.log)"
        failed=$((failed + 1))
    fi
    echo "run $i/$runs: $status in $(( $(date +%s) - t0 )) s ($(tail -1 "$logs/run_$i.log")); load" \
         "$(cut -d' ' -f1-3 /proc/loadavg)"
    [ "$status" = passed ] && rm -f "$logs/run_$i.log"
done
echo "$((runs - failed))/$runs runs passed in $(( $(date +%s) - start )) s with $loops busy loops (nice 19)"
[ "$failed" -eq 0 ]

#!/usr/bin/env bash
# Before/after inference latency on the same machine, interleaved: bench/infer_latency.py run R times in
# turn by an older checkout's venv (the "before"), this checkout's venv with its defaults (inference
# folding on), and this checkout with CAFFE_FOLD=0; then the medians of the R medians per net and batch.
#
#   bash bench/before_after.sh /path/to/old-checkout/.venv/bin/python [REPEATS] [infer_latency.py args...]
#
# Make the old checkout with `git worktree add ../before <commit> && (cd ../before && bash scripts/install.sh)`.
set -euo pipefail
cd "$(dirname "$0")/.."
before=${1:?usage: before_after.sh OLD_PYTHON [REPEATS] [args...]}
reps=${2:-3}
shift $(( $# >= 2 ? 2 : 1 ))
now=.venv/bin/python
out=$(mktemp)
for r in $(seq "$reps"); do
    "$before" bench/infer_latency.py --label before "$@" >> "$out"
    "$now" bench/infer_latency.py --label after "$@" >> "$out"
    CAFFE_FOLD=0 "$now" bench/infer_latency.py --label "after, fold off" "$@" >> "$out"
done
"$now" - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
keys = sorted({(r["net"], r["batch"]) for r in rows}, key=lambda k: ([r["net"] for r in rows].index(k[0]), k[1]))
labels = ["before", "after", "after, fold off"]
print(f"{'net':14s} {'batch':>5s} " + " ".join(f"{l + ' ms':>18s}" for l in labels) + f" {'after/before':>12s}  max load")
for net, batch in keys:
    med = {l: statistics.median(r["ms"] for r in rows if (r["net"], r["batch"], r["label"]) == (net, batch, l))
           for l in labels}
    load = max(r["load"] for r in rows if (r["net"], r["batch"]) == (net, batch))
    print(f"{net:14s} {batch:5d} " + " ".join(f"{med[l]:18.1f}" for l in labels)
          + f" {med['after'] / med['before']:12.2f}  {load:.1f}")
PY
rm -f "$out"

"""Whole-net training steps of two checkouts, interleaved: Net.ForwardBackward of the same DummyData net
(bench_nets.NETS) in one worker process per checkout (its own venv's Python), the two timed in turn.

Usage:  python bench/ab_trees.py BEFORE_DIR [--after DIR] [--nets lenet,cifar10_quick] [--reps 20] [--rounds 30]

BEFORE_DIR and --after (default: this checkout) are checkouts with their kernels built and a venv in .venv (a git
worktree at another commit, say). Each round times --reps steps in each worker (the order alternating), median
per round; printed: the medians over the rounds, and the median and range of the per-round ratios after / before
(on a VM whose speed moves from minute to minute, the per-round ratio is the figure to read).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("--after", default=str(HERE.parent))
    ap.add_argument("--nets", default="lenet,cifar10_quick")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=30)
    a = ap.parse_args()
    trees = {"before": a.before, "after": a.after}
    for net in a.nets.split(","):
        procs = {k: subprocess.Popen([f"{t}/.venv/bin/python", str(HERE / "ab_trees_worker.py"), t, net],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=t)
                 for k, t in trees.items()}
        for k, p in procs.items():
            if p.stdout.readline().strip() != "ready":
                raise SystemExit(f"the {k} worker ({trees[k]}) did not start")
        res = {k: [] for k in trees}
        for r in range(a.rounds):
            for k in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
                procs[k].stdin.write(f"{a.reps}\n")
                procs[k].stdin.flush()
                res[k].append(float(procs[k].stdout.readline()))
        for p in procs.values():
            p.stdin.close()
            p.wait()
        ratios = [x / y for x, y in zip(res["after"], res["before"])]
        print(f"{net}: before {statistics.median(res['before']):.2f} ms, after {statistics.median(res['after']):.2f} ms"
              f" (medians of {a.rounds} rounds of {a.reps} steps); after / before per round: median "
              f"{statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

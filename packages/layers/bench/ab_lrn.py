"""LRN across channels (local_size 5, alpha 1e-4, beta 0.75): another build's kernels ("old") against this
checkout's ("new"), interleaved in one process, as the layer calls them in the TRAIN phase.

Usage:  python packages/layers/bench/ab_lrn.py OLD_KERNELS_DIR [--build avx512] [--repeats 25] [--cached]
        OMP_NUM_THREADS=1 python packages/layers/bench/ab_lrn.py OLD_KERNELS_DIR   # per-thread CPU time
        python packages/layers/bench/ab_lrn.py OLD_BUILD_OF_THIS_BRANCH --old-recomputes   # a change of this branch

OLD_KERNELS_DIR holds the compiled kernels of another checkout (its caffe/layers/kernels folder). The old
layer's TRAIN forward wrote the scale (x in, y and scale out) and its backward read it (x, y, scale, dy in, dx
out); this checkout's forward leaves the scale out and its backward recomputes it from x (scale None): those
are the "TRAIN forward" and "backward" rows, and the two in a row "TRAIN step". "backward, scale read" is this
checkout's backward given the scale (what the layer runs after a forward kept it), to tell the recomputation's
cost from the read it saves. Each row first checks that both give the same bits (the step: dx). The memory
ideal beside them: forward one np.copyto of the blob (one read, one write), backward two (three reads, one
write), the step three. --cached: the compute alone (see the option's help).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_kernels import pair  # noqa: E402

SHAPES = {"resnet": (8, 256, 56 * 56), "mobilenet": (8, 64, 112 * 112), "caffenet": (8, 96, 55 * 55),
          "googlenet": (8, 64, 56 * 56),
          # CaffeNet's norm1 / norm2 (after pooling): 2.2 and 1.4 MB blobs, read from L3
          "caffenet_norm1": (8, 96, 27 * 27), "caffenet_norm2": (8, 256, 13 * 13)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", help="the other build's caffe/layers/kernels folder")
    ap.add_argument("--build", default="avx512" if _has_avx512() else "avx2", choices=["base", "avx2", "avx512"])
    ap.add_argument("--repeats", type=int, default=25)
    ap.add_argument("--shapes", default="resnet,mobilenet,caffenet,googlenet")
    ap.add_argument("--cached", action="store_true",
                    help="each shape cut to one image of about 256K values (1 MB a blob, cache-resident): the "
                         "compute alone, times scaled to the full shape's count (bench_layers --floor's idea)")
    ap.add_argument("--old-recomputes", action="store_true",
                    help="OLD is a build of this branch (its forward leaves the scale out, its backward recomputes it): "
                         "old and new called alike, to time a change of the recomputing kernels")
    args = ap.parse_args(argv)
    one = os.environ.get("OMP_NUM_THREADS") == "1"
    clk = time.thread_time if one else time.perf_counter
    old, new = pair("normalization" + ("" if args.build == "base" else "_" + args.build), args.old)
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  load avg {' '.join(f'{v:.2f}' for v in os.getloadavg())}  "
          f"OMP_NUM_THREADS {os.environ.get('OMP_NUM_THREADS', 'unset')}  {args.build}  "
          f"{'thread CPU time' if one else 'wall'} ms, median of {args.repeats}")
    rng = np.random.default_rng(0)
    for name in args.shapes.split(","):
        N, C, S = SHAPES[name.strip()]
        full = N * C * S
        if args.cached:
            N, S = 1, (1 << 18) // C
        scale = full / (N * C * S)
        x = rng.standard_normal(N * C * S).astype(np.float32)
        dy = rng.standard_normal(x.size).astype(np.float32)
        y_old, sc, y_new, dx_old, dx_new, dx_read, cp = (np.empty_like(x) for _ in range(7))
        a = (N, C, S, 5, 1e-4)

        def copy():
            np.copyto(cp, x)

        osc, okw = (None, {"k": 1.0}) if args.old_recomputes else (sc, {})
        runs = {
            "TRAIN forward": (lambda: old.lrn_across_forward(x, y_old, osc, *a, 1.0, 0.75),
                              lambda: new.lrn_across_forward(x, y_new, None, *a, 1.0, 0.75), (y_old, y_new), 1),
            "backward": (lambda: old.lrn_across_backward(x, y_old, osc, dy, dx_old, *a, 0.75, **okw),
                         lambda: new.lrn_across_backward(x, y_old, None, dy, dx_new, *a, 0.75, k=1.0),
                         (dx_old, dx_new), 2),
            "TRAIN step (fwd + bwd)": (lambda: (old.lrn_across_forward(x, y_old, osc, *a, 1.0, 0.75),
                                                old.lrn_across_backward(x, y_old, osc, dy, dx_old, *a, 0.75, **okw)),
                                       lambda: (new.lrn_across_forward(x, y_new, None, *a, 1.0, 0.75),
                                                new.lrn_across_backward(x, y_new, None, dy, dx_new, *a, 0.75, k=1.0)),
                                       (dx_old, dx_new), 3),
            "backward, scale read": (lambda: old.lrn_across_backward(x, y_old, sc, dy, dx_old, *a, 0.75),
                                     lambda: new.lrn_across_backward(x, y_old, sc, dy, dx_read, *a, 0.75),
                                     (dx_old, dx_read), 2),
        }
        print(f"{name} {N}x{C}x{S} float32 ({x.nbytes / 1e6:.1f} MB)" +
              (f", times scaled by {scale:.1f} to {full} values" if args.cached else ""))
        for what, (ro, rn, (oo, on), copies) in runs.items():
            ro()
            rn()
            same = np.array_equal(oo.view(np.uint32), on.view(np.uint32))
            got = {"old": [], "new": [], "copy": []}
            for i in range(args.repeats + 2):
                order = (("old", ro), ("new", rn), ("copy", copy))
                for k, f in (order if i % 2 else order[::-1]):
                    t0 = clk()
                    f()
                    if i >= 2:
                        got[k].append(clk() - t0)
            o, n, c = (statistics.median(got[k]) * 1e3 * scale for k in ("old", "new", "copy"))
            ideal = copies * c
            print(f"  {what:24s} old {o:7.2f}  new {n:7.2f}  old / new {o / n:5.2f}   ideal {ideal:6.2f}  "
                  f"x old {o / ideal:4.2f} new {n / ideal:4.2f}  {'same bits' if same else 'OUTPUTS DIFFER'}",
                  flush=True)


def _has_avx512():
    from caffe.layers import _cpu
    return _cpu.cpu_has_avx512()


if __name__ == "__main__":
    main()

"""Swish out of place: another build's kernels with the kept sigmoid state ("old": the forward writes y and
sigmoid_output_, the backward reads y, the state and dy) against this checkout's with the state left out ("new":
the forward writes y only, the backward reads x, y and dy and recomputes the sigmoid), interleaved in one process.

Usage:  python packages/layers/bench/ab_swish.py OLD_KERNELS_DIR [--repeats 15] [--builds base,avx2,avx512]
        OMP_NUM_THREADS=1 python packages/layers/bench/ab_swish.py OLD_KERNELS_DIR   # one thread's CPU time

OLD_KERNELS_DIR: e.g. /work/main/packages/layers/src/caffe/layers/kernels. Float32, x ~ 3 N(0, 1), beta 1, at the
bench shapes (resnet 8x256x56x56, mobilenet 8x64x112x112: main memory) and at 65536 elements (L2: the compute).
Printed per build: median ms of wall time and of process CPU time (all threads), old / new, and whether old and
new gave the same bits (top, bottom diff), beside a np.copyto of the bottom (one read and one write).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ab_kernels import family_pairs  # (this folder: the script's own, first on sys.path)

SWISH = 11
SIZES = [("resnet", 8 * 256 * 56 * 56), ("mobilenet", 8 * 64 * 112 * 112), ("L2", 65536)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", help="the other build's caffe/layers/kernels folder")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--builds", default="base,avx2,avx512")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    e = np.empty(0, np.float32)
    print(f"# median of {args.repeats}")
    for build, old, new in family_pairs("elementwise", args.old, args.builds.split(",")):
        for label, n in SIZES:
            x = (rng.standard_normal(n) * 3).astype(np.float32)
            dy = rng.standard_normal(n).astype(np.float32)
            y, s, dx, c = (np.empty_like(x) for _ in range(4))
            reps = max(1, 20_000_000 // n)

            def fwd(k):
                if k is old:
                    k.neuron_forward(SWISH, x, y, s, e, 1.0)
                else:
                    k.neuron_forward(SWISH, x, y, e, e, 1.0)

            def bwd(k):
                if k is old:
                    k.neuron_backward(SWISH, e, y, s, dy, dx, 1.0)
                else:
                    k.neuron_backward(SWISH, x, y, e, dy, dx, 1.0)

            outs = []
            for k in (old, new):
                fwd(k)
                bwd(k)
                outs.append((y.copy(), dx.copy()))
            same = all(np.array_equal(p, q) for p, q in zip(*outs))
            fwd(old)  # the state the old backward reads
            for step, fn in (("forward", fwd), ("backward", bwd)):
                t = {0: [], 1: [], 2: []}
                for i in range(args.repeats + 1):
                    for kk in ((0, 1, 2) if i % 2 else (2, 1, 0)):
                        w0, c0 = time.perf_counter(), time.process_time()
                        for _ in range(reps):
                            if kk == 2:
                                np.copyto(c, x)
                            else:
                                fn((old, new)[kk])
                        if i:
                            t[kk].append(((time.perf_counter() - w0) / reps * 1e3,
                                          (time.process_time() - c0) / reps * 1e3))
                (ow, oc), (nw, nc), (cw, _) = [[statistics.median(v[j] for v in t[kk]) for j in (0, 1)]
                                               for kk in (0, 1, 2)]
                print(f"  {build:6s} {label:9s} {n:8d} {step:8s} old {ow:7.3f} / {oc:7.3f}  new {nw:7.3f} / {nc:7.3f}  "
                      f"old/new wall {ow / nw:5.2f} cpu {oc / nc:5.2f}  copy {cw:7.3f}  "
                      f"{'same bits' if same else 'BITS DIFFER'}", flush=True)


if __name__ == "__main__":
    main()

"""Another build's neuron kernels ("old") against this checkout's ("new"), interleaved in one process, in the build
the layers load here (elementwise_avx512 on a CPU with AVX-512, else elementwise_avx2 / elementwise).

Usage:  python packages/layers/bench/ab_neurons.py OLD_KERNELS_DIR [--sizes 65536,6422528] [--repeats 9]
        OMP_NUM_THREADS=1 python packages/layers/bench/ab_neurons.py OLD_KERNELS_DIR   # one thread's CPU time

OLD_KERNELS_DIR: the kernels folder of another worktree (e.g. /work/main/packages/layers/src/caffe/layers/kernels).
For Sigmoid, TanH, BNLL, Swish, ReLU, ELU, Exp and Log (--only: some of them; float32, x ~ 3 N(0, 1)) forward and backward at each size (65536: in L2,
the compute; 6422528 = 8x256x56x56: main memory), old and new alternate (order flipped every repetition); printed:
the medians of wall time and of process CPU time (all threads) per element, and whether both builds gave the same
bits. On a busy machine the CPU time is the steadier figure.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from ab_kernels import pair, same_bits  # (this folder: the script's own, first on sys.path)

# name, op (kernels.elementwise.Neuron), a, b, c, d
OPS = [("Sigmoid", 1, 0, 0, 0, 0), ("TanH", 2, 0, 0, 0, 0), ("BNLL", 8, 0, 0, 0, 0), ("Swish", 11, 1.0, 0, 0, 0),
       ("ReLU", 0, 0, 0, 0, 0), ("ELU", 3, 1.0, 0, 0, 0), ("Exp", 5, 1.0, 1.0, 0, 0), ("Exp-scaled", 5, 0.5, 1.2, 0, 0),
       ("Log", 6, 1.0, 10.0, 1.0, 1.0)]  # (Log: x + 10 > 0 for all but ~0.04% of x ~ 3 N(0, 1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", help="the other build's caffe/layers/kernels folder")
    ap.add_argument("--sizes", default="65536,6422528")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--only", default="", help="comma-separated names from OPS (default: all)")
    args = ap.parse_args(argv)
    from caffe.layers import _cpu
    old, new = pair(_cpu.elementwise.__name__.split(".")[-1], args.old)
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  load avg {' '.join(f'{v:.2f}' for v in os.getloadavg())}  "
          f"OMP_NUM_THREADS {os.environ.get('OMP_NUM_THREADS', 'unset')}  {new.__name__}  ns per element: "
          f"wall / process CPU, median of {args.repeats}")
    rng = np.random.default_rng(0)
    e = np.empty(0, np.float32)
    for n in (int(s) for s in args.sizes.split(",")):
        x = (rng.standard_normal(n) * 3).astype(np.float32)
        dy = rng.standard_normal(n).astype(np.float32)
        y, aux, dx = np.empty_like(x), np.empty_like(x), np.empty_like(x)
        reps = max(1, 30_000_000 // n)
        for name, op, a, b, c, d in OPS:
            if args.only and name not in args.only.split(","):
                continue
            new.neuron_forward(op, x, y, aux if op == 11 else e, e, a, b, c)
            y0, aux0 = y.copy(), aux.copy()

            def fwd(k, op=op, a=a, b=b, c=c):
                k.neuron_forward(op, x, y, aux if op == 11 else e, e, a, b, c)

            def bwd(k, op=op, a=a, b=b, c=c, d=d):
                k.neuron_backward(op, x, y0, aux0 if op == 11 else e, dy, dx, a, b, c, d)

            for step, fn, outs in (("forward", fwd, (y, aux)), ("backward", bwd, (dx,))):
                same = same_bits(fn, old, new, outs)
                t = {0: [], 1: []}
                for i in range(args.repeats + 1):
                    for kk in ((0, 1) if i % 2 else (1, 0)):
                        w0, c0 = time.perf_counter(), time.process_time()
                        for _ in range(reps):
                            fn((old, new)[kk])
                        if i:
                            t[kk].append(((time.perf_counter() - w0) / reps / n * 1e9,
                                          (time.process_time() - c0) / reps / n * 1e9))
                (ow, oc), (nw, nc) = [[statistics.median(v[j] for v in t[kk]) for j in (0, 1)] for kk in (0, 1)]
                print(f"  n {n:8d} {name:8s} {step:8s} old {ow:6.3f} / {oc:6.3f}   new {nw:6.3f} / {nc:6.3f}   "
                      f"old/new wall {ow / nw:5.2f} cpu {oc / nc:5.2f}  {'same bits' if same else 'bits differ'}",
                      flush=True)


if __name__ == "__main__":
    main()

"""BatchNorm with batch statistics (TRAIN): another build's normalization kernels ("old") against this checkout's
("new"), interleaved in one process, in every build (baseline, AVX2, AVX-512 where the CPU has it).

Usage:  python packages/layers/bench/ab_batch_norm.py OLD_KERNELS_DIR [--repeats 15] [--builds base,avx2,avx512]
        OMP_NUM_THREADS=1 python packages/layers/bench/ab_batch_norm.py OLD_KERNELS_DIR   # one thread's CPU time

OLD_KERNELS_DIR: e.g. /work/main/packages/layers/src/caffe/layers/kernels. Float32 at the bench shapes (resnet
8x256x56x56, mobilenet 8x64x112x112: main memory) and their cache-resident cuts (1x256x32x32, 1x64x64x64: the
compute); cases: forward in place keeping x_norm (the layer in place), forward out of place, backward from x (out of
place) and from x_norm (in place, dx over dy). Printed: median ms of wall time and of process CPU time, old / new,
whether both gave the same bits (top, x_norm, statistics, bottom diff), and a np.copyto of the bottom beside.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ab_kernels import family_pairs  # (this folder: the script's own, first on sys.path)

SHAPES = [("resnet", (8, 256, 3136)), ("mobilenet", (8, 64, 12544)), ("resnet L2", (1, 256, 1024)),
          ("mobilenet L2", (1, 64, 4096))]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", help="the other build's caffe/layers/kernels folder")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--builds", default="base,avx2,avx512")
    ap.add_argument("--only", default="", help="comma-separated substrings of case names")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    e = np.empty(0, np.float32)
    print(f"# median of {args.repeats}")
    for build, old, new in family_pairs("normalization", args.old, args.builds.split(",")):
        for label, (N, C, S) in SHAPES:
            n = N * C * S
            x0 = (rng.standard_normal(n) * 2 + 1).astype(np.float32)
            dy0 = rng.standard_normal(n).astype(np.float32)
            x, y, xn, dx, dyc, c = x0.copy(), *(np.empty_like(x0) for _ in range(5))
            m, v = np.zeros(C), np.zeros(C)
            reps = max(1, 10_000_000 // n)
            mean, inv = np.zeros(C, np.float32), np.ones(C, np.float32)

            def restore():
                x[...] = x0

            cases = {
                "fwd in-place+x_norm": (lambda k: k.batch_norm_train_forward(x, x, xn, m, v, N, C, S, 1e-5),
                                        restore, (x, xn, m, v)),
                "fwd": (lambda k: k.batch_norm_train_forward(x0, y, e, m, v, N, C, S, 1e-5), None, (y, m, v)),
                "bwd from x": (lambda k: k.batch_norm_train_backward(dy0, e, x0, mean, inv, dx, N, C, S), None, (dx,)),
                "bwd in-place x_norm": (lambda k: k.batch_norm_train_backward(dyc, xn, e, mean, inv, dyc, N, C, S),
                                        lambda: np.copyto(dyc, dy0), (dyc,)),
            }
            new.batch_norm_train_forward(x0, y, xn, m, v, N, C, S, 1e-5)  # the state backward reads
            mean[...], inv[...] = m, 1 / np.sqrt(v + 1e-5)
            for name, (fn, prep, outs) in cases.items():
                if args.only and not any(s in name for s in args.only.split(",")):
                    continue
                got = []
                for k in (old, new):
                    if prep:
                        prep()
                    fn(k)
                    got.append([o.copy() for o in outs])
                same = all(np.array_equal(p, q) for p, q in zip(*got))
                t = {0: [], 1: [], 2: []}
                for i in range(args.repeats + 1):
                    for kk in ((0, 1, 2) if i % 2 else (2, 1, 0)):
                        wall = cpu = 0.0
                        for _ in range(reps):
                            if prep:
                                prep()
                            w0, c0 = time.perf_counter(), time.process_time()
                            if kk == 2:
                                np.copyto(c, x0)
                            else:
                                fn((old, new)[kk])
                            wall += time.perf_counter() - w0
                            cpu += time.process_time() - c0
                        if i:
                            t[kk].append((wall / reps * 1e3, cpu / reps * 1e3))
                (ow, oc), (nw, nc), (cw, _) = [[statistics.median(u[j] for u in t[kk]) for j in (0, 1)]
                                               for kk in (0, 1, 2)]
                print(f"  {build:6s} {label:12s} {name:20s} old {ow:7.3f} / {oc:7.3f}  new {nw:7.3f} / {nc:7.3f}  "
                      f"old/new wall {ow / nw:5.2f} cpu {oc / nc:5.2f}  copy {cw:6.3f}  "
                      f"{'same bits' if same else 'BITS DIFFER'}", flush=True)
            del x, y, xn, dx, dyc, c


if __name__ == "__main__":
    main()

"""InnerProduct's three products at a short batch: kernels.skinny_gemm against NumPy's GEMM (OpenBLAS), interleaved.

Usage:  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python packages/layers/bench/ab_skinny_gemm.py [--repeats 9]
        python packages/layers/bench/ab_skinny_gemm.py            # both threads

For each (M, N, K): the InnerProduct layer's NumPy code for the forward (x @ W^T + b), the bottom diff
(dy @ W) and the weight diff (W_diff += dy^T x through its scratch block) against skinny_gemm's dots,
combine and rank_update; each pair alternating which goes first; medians (and minima) in ms, ours / NumPy,
and the weights' bytes per second of the faster. The shapes: CaffeNet's fc6 / fc7 / fc8 and a 2048 -> 1000
classifier, at batches 1, 2, 8, 16 and 32.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from caffe.layers import _cpu, inner_product

SHAPES = [(4096, 9216), (4096, 4096), (1000, 4096), (1000, 2048)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--batches", default="1,2,8,16,32")
    args = ap.parse_args(argv)
    sg = _cpu.skinny_gemm
    if sg is None:
        raise SystemExit("kernels.skinny_gemm is not built")
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  load avg {os.getloadavg()[0]:.2f}  {sg.__name__} "
          f"({sg.LANES} lanes)  OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}  "
          f"median (min) of {args.repeats}, ms; ratio = ours / NumPy")
    rng = np.random.default_rng(0)
    for N, K in SHAPES:
        W = rng.standard_normal((N, K), dtype=np.float32)
        b = rng.standard_normal(N, dtype=np.float32)
        Wd = np.zeros((N, K), np.float32)
        for M in (int(m) for m in args.batches.split(",")):
            x = rng.standard_normal((M, K), dtype=np.float32)
            dy = rng.standard_normal((M, N), dtype=np.float32)
            y = np.empty((M, N), np.float32)
            dx = np.empty((M, K), np.float32)
            rows = max(1, min(N, inner_product.WGRAD_BLOCK // K))
            tmp = np.empty((rows, K), np.float32)

            def np_fwd():
                np.matmul(x, W.T, out=y)
                y.__iadd__(b)

            def np_data():
                np.matmul(dy, W, out=dx)

            def np_wgt():
                for r0 in range(0, N, rows):
                    r1 = min(r0 + rows, N)
                    part = tmp[: r1 - r0]
                    np.matmul(dy.T[r0:r1], x, out=part)
                    Wd[r0:r1] += part

            pairs = [("fwd", np_fwd, lambda: sg.dots(x.ravel(), W.ravel(), y.ravel(), b, M, N, K)),
                     ("data", np_data, lambda: sg.combine(dy.ravel(), W.ravel(), dx.ravel(), None, M, N, K)),
                     ("wgt", np_wgt, lambda: sg.rank_update(dy.ravel(), x.ravel(), Wd.ravel(), M, N, K))]
            cols = []
            for name, ref, ours in pairs:
                ref(), ours()
                t = {0: [], 1: []}
                for i in range(args.repeats):
                    for j in ((0, 1) if i % 2 == 0 else (1, 0)):
                        f = (ref, ours)[j]
                        t0 = time.perf_counter()
                        f()
                        t[j].append(time.perf_counter() - t0)
                med = [statistics.median(t[j]) * 1e3 for j in (0, 1)]
                best = min(med)
                traffic = W.nbytes * (2 if name == "wgt" else 1)
                cols.append(f"{name} {med[0]:7.2f} ({min(t[0]) * 1e3:6.2f}) / {med[1]:7.2f} ({min(t[1]) * 1e3:6.2f})"
                            f" {med[1] / med[0]:4.2f} {traffic / best / 1e6:4.1f} GB/s")
            print(f"M {M:2d} N {N:4d} K {K:4d} | " + " | ".join(cols), flush=True)


if __name__ == "__main__":
    main()

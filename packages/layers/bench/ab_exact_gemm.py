"""The exact short-K forward: kernels.exact_gemm against the float64-GEMM path and a plain float32 sgemm.

Usage:  python packages/layers/bench/ab_exact_gemm.py [--repeats 21] [--only mobilenet] [--cpu-time]

Each case is one float32 Convolution layer at a real net's shape whose dot products are at most
conv_base.EXACT_FORWARD_MAX_K long (so its forward is the exact one). Its forward (conv_cpu.blocked_forward,
the plan these layers take) runs three ways, interleaved in one process with the order rotated each
round, after a warm-up:
  old    conv_cpu.EXACT_GEMM = False: the column block lowered into float64 (1x1: the images copied
         widened), a float64 GEMM, a rounding store with the bias
  new    conv_cpu.EXACT_GEMM = True: kernels.exact_gemm from the float32 data (the same bits)
  sgemm  not exact (EXACT_FORWARD_MAX_K = 0 for the run): the float32 lowering and OpenBLAS sgemm, the
         float32 rounding Caffe itself has; the speed the exact forward is measured against
Medians in ms, GFLOP/s (2 M K N P), the new/old and new/sgemm ratios, and whether old and new gave the
same bits. --cpu-time times by the process's CPU time (all threads), less disturbed by other
processes on a busy machine than the wall clock. `uptime` is printed before and after: say the load.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # before NumPy loads (see bench_layers.py)

import numpy as np  # noqa: E402

from caffe.blob import Blob, context  # noqa: E402
from caffe.layers import conv_base, conv_cpu  # noqa: E402
from caffe.layers.testing import make_layer  # noqa: E402

# (name, bottom shape, num_output, kernel, stride, pad)
CASES = [
    ("mobilenet_v1 conv2_1/sep b8", (8, 32, 112, 112), 64, 1, 1, 0),
    ("mobilenet_v1 conv2_1/sep b1", (1, 32, 112, 112), 64, 1, 1, 0),
    ("mobilenet_v1 conv1 b8", (8, 3, 224, 224), 32, 3, 2, 1),
    ("mobilenet_v1 conv1 b1", (1, 3, 224, 224), 32, 3, 2, 1),
    ("squeezenet1.1 conv1 b8", (8, 3, 227, 227), 64, 3, 2, 0),
    ("mobilenet_v2 conv2_1/expand b8", (8, 16, 112, 112), 96, 1, 1, 0),
    ("lenet conv1 b64", (64, 1, 28, 28), 20, 5, 1, 0),
]


def make(shape, num_output, kernel, stride, pad):
    context.set_random_seed(0)
    layer = make_layer("Convolution", f"convolution_param {{ num_output: {num_output} kernel_size: {kernel} "
                       f"stride: {stride} pad: {pad} weight_filler {{ type: 'gaussian' std: 0.1 }} "
                       "bias_filler { type: 'gaussian' std: 0.1 } }")
    bottom = Blob(shape, dtype=np.float32)
    bottom.data[...] = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    top = Blob((1,), dtype=np.float32)
    layer.SetUp([bottom], [top])
    assert layer.exact_forward(np.float32), "not an exact-forward layer"
    return layer, bottom, top


def forward(layer, bottom, top, way):
    conv_cpu.EXACT_GEMM = way == "new"
    max_k = conv_base.EXACT_FORWARD_MAX_K
    if way == "sgemm":
        conv_base.EXACT_FORWARD_MAX_K = 0
    try:
        N = bottom.shape[0]
        im = bottom.data
        out = top.mutable_cpu_data().reshape(N, layer.conv_out_channels, -1)
        conv_cpu.blocked_forward(layer, im, out, layer.blobs[0].data, layer.blobs[1].data)
    finally:
        conv_base.EXACT_FORWARD_MAX_K = max_k


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--only", default="", help="comma-separated substrings of case names")
    ap.add_argument("--cpu-time", action="store_true")
    args = ap.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    if not conv_cpu.EXACT_GEMM:
        raise SystemExit("ab_exact_gemm: kernels.exact_gemm is not built or not vectorized here (EXACT_GEMM off)")
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(f"threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}; "
          f"{'process CPU time' if args.cpu_time else 'wall clock'}, median of {args.repeats}")
    print(f"{'case':34s} {'old':>8s} {'new':>8s} {'sgemm':>8s}   {'GFLOP/s old/new/sgemm':>22s} "
          f"{'new/old':>7s} {'new/sgemm':>9s}  same")
    ways = ["old", "new", "sgemm"]
    only = [s for s in args.only.split(",") if s]
    for name, shape, num_output, kernel, stride, pad in CASES:
        if only and not any(s in name for s in only):
            continue
        layer, bottom, top = make(shape, num_output, kernel, stride, pad)
        results = {}
        for way in ways:  # warm-up (buffers, OpenBLAS threads) and the outputs compared
            forward(layer, bottom, top, way)
            results[way] = top.data.copy()
        same = np.array_equal(results["old"], results["new"])
        times = {w: [] for w in ways}
        for r in range(args.repeats):
            for way in ways[r % 3:] + ways[:r % 3]:
                t = clock()
                forward(layer, bottom, top, way)
                times[way].append(clock() - t)
        med = {w: statistics.median(times[w]) for w in ways}
        flops = 2.0 * layer.kernel_dim * top.count
        gf = "/".join(f"{flops / med[w] / 1e9:.0f}" for w in ways)
        print(f"{name:34s} {med['old'] * 1e3:8.2f} {med['new'] * 1e3:8.2f} {med['sgemm'] * 1e3:8.2f}   {gf:>22s} "
              f"{med['new'] / med['old']:7.2f} {med['new'] / med['sgemm']:9.2f}  {same}")
    conv_cpu.EXACT_GEMM = True
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()

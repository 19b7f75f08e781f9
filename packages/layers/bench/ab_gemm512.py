"""The 1x1 plan's float32 forward with kernels.gemm (conv_cpu.GEMM512 True) against np.matmul (False), interleaved.

Usage:  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python packages/layers/bench/ab_gemm512.py [--repeats 21]
        OPENBLAS_CORETYPE=SkylakeX OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python .../ab_gemm512.py
                                        # against OpenBLAS's own AVX-512 kernels
        python .../ab_gemm512.py --batches 1,8 --relu --only 7x7

Each case is one Convolution layer (kernel 1, bias, optionally the fused ReLU epilogue) of ResNet-50's 1x1
shapes at batch 1 and 8; its Forward runs with np.matmul (NumPy's OpenBLAS, whatever core type the environment
gives it: printed) and with kernels.gemm, alternating, --repeats times each after a warm-up; the figures are the
minimum and the median wall time (--backward: of Backward, the bias, weight and bottom diffs: zeroing the
parameter diffs included), the GFLOP/s of the minimum, and old / new (the speed-up). Both outputs are
compared first (max |diff| over max |y|). With one thread, the process's CPU time (min) is printed too: far less
disturbed by other processes on a shared machine than the wall clock. Both settings run even where the
default choice (conv_cpu.GEMM512) is False, as long as the CPU has AVX-512F.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from caffe.layers import conv_cpu
from caffe.layers.testing import blobs_from_arrays, empty_tops, make_layer

SHAPES = [(64, 64, 56), (64, 256, 56), (256, 64, 56), (128, 512, 28), (512, 128, 28), (256, 1024, 14),
          (1024, 256, 14), (512, 2048, 7), (2048, 512, 7)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--relu", action="store_true", help="the fused ReLU epilogue (inference folding)")
    ap.add_argument("--backward", action="store_true",
                    help="time Backward (weight, bias and bottom diffs) instead of Forward")
    ap.add_argument("--only", default="", help="substring of the case name (e.g. 7x7, 64->256)")
    args = ap.parse_args()
    if not conv_cpu.gemm512_supported():
        raise SystemExit("kernels.gemm cannot run here (no AVX-512F)")
    one = os.environ.get("OMP_NUM_THREADS") == "1" and os.environ.get("OPENBLAS_NUM_THREADS") == "1"
    print(f"OpenBLAS core: {conv_cpu.blas_corename()}  default GEMM512: {conv_cpu.GEMM512}  "
          f"OMP/OPENBLAS threads: {os.environ.get('OMP_NUM_THREADS')}/{os.environ.get('OPENBLAS_NUM_THREADS')}  "
          f"tile {conv_cpu._gm.TILE} blocks {conv_cpu._gm.BLOCKS}", flush=True)
    rng = np.random.default_rng(0)
    ratios = []
    for b in [int(x) for x in args.batches.split(",")]:
        for ci, co, s in SHAPES:
            name = f"b{b} {ci}->{co} {s}x{s}"
            if args.only and args.only not in name:
                continue
            layer = make_layer("Convolution", f"convolution_param {{ num_output: {co} kernel_size: 1 "
                               "weight_filler { type: 'gaussian' std: 0.05 } bias_filler { type: 'gaussian' std: 0.5 } }")
            x = rng.standard_normal((b, ci, s, s)).astype(np.float32)
            bottom, top = blobs_from_arrays([x], np.float32), empty_tops(1, np.float32)
            layer.SetUp(bottom, top)
            if args.relu:
                layer.epilogue = (1, 0.0, 0.0)
            top[0].diff[...] = rng.standard_normal(top[0].shape).astype(np.float32)

            def run():
                if args.backward:
                    for blob in layer.blobs:
                        blob.diff[...] = 0
                    layer.Backward(top, [True], bottom)
                else:
                    layer.Forward(bottom, top)

            outs = {}
            layer.Forward(bottom, top)
            for use in (False, True):
                conv_cpu.GEMM512 = use
                run()
                outs[use] = [bottom[0].diff.copy(), layer.blobs[0].diff.copy()] if args.backward \
                    else [top[0].data.copy()]
            err = max(float(np.abs(a - b).max() / np.abs(b).max()) for a, b in zip(outs[True], outs[False]))
            wall = {False: [], True: []}
            cpu = {False: [], True: []}
            for i in range(args.repeats):
                for use in ((False, True) if i % 2 == 0 else (True, False)):
                    conv_cpu.GEMM512 = use
                    t0, c0 = time.perf_counter(), time.process_time()
                    run()
                    wall[use].append(time.perf_counter() - t0)
                    cpu[use].append(time.process_time() - c0)
            fl = 2 * b * ci * co * s * s / 1e9 * (2 if args.backward else 1)
            old, new = min(wall[False]), min(wall[True])
            ratios.append(old / new)
            line = (f"{name:22s} matmul {old * 1e3:7.3f} ms (med {statistics.median(wall[False]) * 1e3:7.3f}, "
                    f"{fl / old:4.0f} GF/s)  gemm {new * 1e3:7.3f} ms (med {statistics.median(wall[True]) * 1e3:7.3f}, "
                    f"{fl / new:4.0f} GF/s)  speed-up {old / new:4.2f}")
            if one:
                line += f"  cpu-time speed-up {min(cpu[False]) / min(cpu[True]):4.2f}"
            print(line + f"  err {err:.1e}", flush=True)
    if ratios:
        print(f"geometric mean speed-up {float(np.exp(np.mean(np.log(ratios)))):.2f}")


if __name__ == "__main__":
    main()

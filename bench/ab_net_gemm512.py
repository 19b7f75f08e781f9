"""A net's folded TEST forward with conv_cpu.GEMM512 on (the 1x1 convolutions' GEMMs by kernels.gemm) and off
(np.matmul), interleaved in one process on the same net and weights (bench_infer.py's seeded ones).

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python bench/ab_net_gemm512.py [--nets resnet50] [--batches 1,8]
        [--repeats 11]

Prints per net and batch: the minimum and median forward time with each setting, the speed-up (off / on, of
the minima), and the outputs' max relative difference. With one thread (the environment above) the process
CPU time's minimum is printed too (less disturbed on a shared machine).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("GLOG_minloglevel", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_infer  # noqa: E402  (its models folder, seeded weights, output names)

import caffe  # noqa: E402
from caffe.layers import conv_cpu  # noqa: E402
from caffe.net import Net  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nets", default="resnet50")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--repeats", type=int, default=11)
    args = ap.parse_args()
    if not conv_cpu.gemm512_supported():
        print("kernels.gemm cannot run here (no AVX-512F)")
        return 1
    print(f"OpenBLAS core {conv_cpu.blas_corename()}, default GEMM512 {conv_cpu.GEMM512}, "
          f"OMP/OPENBLAS threads {os.environ.get('OMP_NUM_THREADS')}/{os.environ.get('OPENBLAS_NUM_THREADS')}")
    for name in args.nets.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            net = Net(str(bench_infer.MODELS / f"{name}_deploy.prototxt"), caffe.TEST, fold=True)
            shape = list(net.blobs["data"].shape)
            net.blobs["data"].reshape([batch] + shape[1:])
            net.Reshape()
            bench_infer.randomize(net)
            net.blobs["data"].data[...] = np.random.default_rng(bench_infer.SEED + 1).standard_normal(
                net.blobs["data"].shape)
            outs = bench_infer.logits_and_outputs(net)
            got = {}
            for use in (False, True):
                conv_cpu.GEMM512 = use
                net.Forward()
                got[use] = [net.blobs[o].data.copy() for o in outs]
            err = max(bench_infer.max_rel(a, b) for a, b in zip(got[True], got[False]))
            wall = {False: [], True: []}
            cpu = {False: [], True: []}
            for r in range(args.repeats):
                for use in ((False, True) if r % 2 == 0 else (True, False)):
                    conv_cpu.GEMM512 = use
                    t, c = time.perf_counter(), time.process_time()
                    net.Forward()
                    wall[use].append(time.perf_counter() - t)
                    cpu[use].append(time.process_time() - c)
            off, on = min(wall[False]) * 1e3, min(wall[True]) * 1e3
            line = (f"{name} b{batch}: off {off:8.2f} ms (med {statistics.median(wall[False]) * 1e3:8.2f})  "
                    f"on {on:8.2f} ms (med {statistics.median(wall[True]) * 1e3:8.2f})  speed-up {off / on:4.2f}")
            if os.environ.get("OMP_NUM_THREADS") == "1":
                line += f"  cpu {min(cpu[False]) * 1e3:8.2f} / {min(cpu[True]) * 1e3:8.2f} ms"
            print(line + f"  outputs max rel diff {err:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Peak resident memory of a CaffeNet forward+backward loop (a benchmark, not a test).

Runs in a fresh subprocess and reports ru_maxrss: CaffeNet's train_val.prototxt
(../shared/caffe-models) in TRAIN phase, its Data layers replaced by one Input
layer of 8x3x227x227 images and 8 labels, then `--iters` rounds of
ClearParamDiffs + ForwardBackward + Update. BVLC Caffe (CPU) peaks at 587 MB here;
the budget is 650 MB.

    python packages/net/bench/bench_memory.py [--iters 3] [--batch 8]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

BUDGET_MB = 650
CAFFE_MB = 587
PROTOTXT = Path(__file__).resolve().parents[3].parent / "shared" / "caffe-models" / "models" / \
    "bvlc_reference_caffenet" / "train_val.prototxt"


def caffenet_with_inputs(batch: int):
    from caffe.net.upgrade import ReadNetParamsFromTextFileOrDie
    from caffe.proto import caffe_pb2
    param = ReadNetParamsFromTextFileOrDie(PROTOTXT)
    layers = [l for l in param.layer if l.type != "Data"]
    data = caffe_pb2.LayerParameter(name="data", type="Input", top=["data", "label"])
    data.input_param.shape.add(dim=[batch, 3, 227, 227])
    data.input_param.shape.add(dim=[batch])
    del param.layer[:]
    param.layer.append(data)
    param.layer.extend(layers)
    return param


def child(iters: int, batch: int) -> None:
    import numpy as np
    import caffe
    start = time.perf_counter()
    net = caffe.Net(caffenet_with_inputs(batch), caffe.TRAIN)
    built = time.perf_counter() - start
    rng = np.random.default_rng(0)
    net.blobs["data"].data[...] = rng.standard_normal(net.blobs["data"].shape, dtype=np.float32)
    net.blobs["label"].data[...] = rng.integers(0, 1000, batch)
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        net.ClearParamDiffs()
        loss = net.ForwardBackward()
        net.Update()
        times.append(time.perf_counter() - t)
    report = net.memory_report()
    print(json.dumps({
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "blob_bytes_mb": report["total_bytes"] / 2**20, "param_bytes_mb": report["param_bytes"] / 2**20,
        "activation_bytes_mb": report["activation_bytes"] / 2**20,
        "build_s": built, "iter_s": times, "loss": loss, "iters": iters, "batch": batch}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.iters, args.batch)
        return 0
    if not PROTOTXT.exists():
        print(f"skipped: {PROTOTXT} is absent")
        return 0
    out = subprocess.run([sys.executable, __file__, "--child", "--iters", str(args.iters),
                          "--batch", str(args.batch)], capture_output=True, text=True)
    if out.returncode:
        print(out.stdout, out.stderr, file=sys.stderr)
        return out.returncode
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"CaffeNet train, batch {r['batch']}, {r['iters']} x (ClearParamDiffs + ForwardBackward + Update)")
    print(f"  peak RSS          {r['peak_rss_mb']:8.1f} MB   (BVLC Caffe: {CAFFE_MB} MB, budget {BUDGET_MB} MB)")
    print(f"  held by blobs     {r['blob_bytes_mb']:8.1f} MB   (params {r['param_bytes_mb']:.1f} MB data+diff, "
          f"activations {r['activation_bytes_mb']:.1f} MB)")
    print(f"  build {r['build_s']:.2f} s; iterations " + ", ".join(f"{t:.2f}" for t in r["iter_s"]) + " s")
    print("  within budget" if r["peak_rss_mb"] <= BUDGET_MB else "  OVER BUDGET")
    return 0 if r["peak_rss_mb"] <= BUDGET_MB else 1


if __name__ == "__main__":
    sys.exit(main())

"""Forward latency of the bench/models deploy nets with whatever `caffe` this Python imports: the same
seeded weights and inputs as bench_infer.py, one JSON line per net and batch. It uses only the pycaffe
API every version of this project has, so it times an older checkout too (run it with that checkout's
venv) for before/after figures on the same machine, interleaved by bench/before_after.sh.

    python bench/infer_latency.py [--nets resnet50,...] [--batches 1,8] [--repeats 5] [--warmup 2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("GLOG_minloglevel", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from bench_infer import MODELS, NETS, SEED, randomize  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    import caffe

    for name in args.nets.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            net = caffe.Net(str(MODELS / f"{name}_deploy.prototxt"), caffe.TEST)
            shape = list(net.blobs["data"].shape)
            net.blobs["data"].reshape(batch, *shape[1:])
            net.reshape()
            randomize(net)
            net.blobs["data"].data[...] = np.random.default_rng(SEED + 1).standard_normal(net.blobs["data"].shape)
            times = []
            for r in range(args.warmup + args.repeats):
                t = time.perf_counter()
                net.forward()
                if r >= args.warmup:
                    times.append((time.perf_counter() - t) * 1e3)
            print(json.dumps({"label": args.label, "net": name, "batch": batch,
                              "ms": round(statistics.median(times), 2), "load": round(os.getloadavg()[0], 2)}),
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Per-call overhead of the framework: what small batches pay between layers.

    python bench/bench_dispatch.py [--rounds 7] [--threads 1]

Prints (medians over --rounds, wall and process CPU time; CPU time is what the code costs even when the
machine is loaded):
- per layer: a chain of 40 ReLU layers on a 1x1x2x2 blob, forward + backward (force_backward), divided by
  40: the net loop, Layer.Forward/Backward dispatch, Blob views, the layer's own few NumPy calls;
- LeNet's TRAIN net (DummyData inputs) `ForwardBackward()` at batch 1 and 64.
Run it on two checkouts (or with another tree first on PYTHONPATH) to compare before and after.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

# Net construction logs Caffe's glog lines to stderr by default; the figures are what this prints.
os.environ.setdefault("GLOG_minloglevel", "1")

ROOT = Path(__file__).resolve().parents[1]


def timed(fn, calls: int, rounds: int) -> tuple[float, float]:
    """(median wall ms, median CPU ms) per call."""
    wall, cpu = [], []
    for _ in range(rounds):
        t, c = time.perf_counter(), time.process_time()
        for _ in range(calls):
            fn()
        wall.append((time.perf_counter() - t) / calls * 1e3)
        cpu.append((time.process_time() - c) / calls * 1e3)
    return statistics.median(wall), statistics.median(cpu)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1, help="BLAS/OpenMP threads (0: the libraries' default)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_infer import limit_threads
    limit_threads(args.threads)
    import caffe
    from caffe.net import Net
    from bench_nets import dummy_data_net

    layers = 40
    text = ['force_backward: true',
            'layer { name: "data" type: "Input" top: "x0" input_param { shape { dim: 1 dim: 1 dim: 2 dim: 2 } } }']
    text += [f'layer {{ name: "r{i}" type: "ReLU" bottom: "x{i}" top: "x{i + 1}" }}' for i in range(layers)]
    net = Net("\n".join(text), caffe.TRAIN)
    for _ in range(100):
        net.ForwardBackward()
    wall, cpu = timed(net.ForwardBackward, 300, args.rounds)
    print(f"load average {os.getloadavg()[0]:.1f}; threads {args.threads or 'default'}")
    print(f"per layer (ReLU chain), forward + backward: wall {wall / layers * 1e3:7.2f} us  "
          f"CPU {cpu / layers * 1e3:7.2f} us")
    for batch, calls in ((1, 200), (64, 10)):
        net = Net(dummy_data_net(ROOT / "examples/mnist/lenet_train_test.prototxt", (batch, 1, 28, 28),
                                 (batch,)), caffe.TRAIN)
        for _ in range(10):
            net.ForwardBackward()
        wall, cpu = timed(net.ForwardBackward, calls, args.rounds)
        print(f"LeNet batch {batch:2d} ForwardBackward:        wall {wall:7.3f} ms  CPU {cpu:7.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

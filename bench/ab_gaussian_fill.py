"""A/B in one process: LeNet b64 training (bench_nets' DummyData net) with the gaussian fill by kernels.rng
(the fillers' code now) and by NumPy's Generator.normal (the code before session 15), in interleaved rounds.

Prints each side's ForwardBackward median and DummyData's forward alone (its refill), and the per-round
ratio. Run from the repo root:

    python bench/ab_gaussian_fill.py [--rounds 6] [--steps 40]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_nets  # noqa: E402  (sets GLOG_minloglevel before caffe logs)
import caffe  # noqa: E402
from caffe.layers import filler  # noqa: E402
from caffe.net import Net  # noqa: E402


def numpy_normal(rng, mean, std, out):
    """The fill before: float64 draws of NumPy's ziggurat, rounded to the blob's dtype."""
    out[...] = filler._draw(lambda k: rng.normal(mean, std, size=k), out.shape, out.dtype)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=40, help="ForwardBackward calls timed per round")
    args = ap.parse_args()
    path = bench_nets.NETS["lenet"][0]
    net = Net(bench_nets.dummy_data_net(path, (64, 1, 28, 28), (64,)), caffe.TRAIN)
    i = [layer.type for layer in net.layers].index("DummyData")
    layer, bottom, top = net.layers[i], net.bottom_vecs[i], net.top_vecs[i]
    sides = {"numpy normal": numpy_normal, "kernels.rng": filler._normal}
    fb = {name: [] for name in sides}
    data = {name: [] for name in sides}
    for _ in range(10):
        net.ForwardBackward()
    try:
        for _ in range(args.rounds):
            for name, fn in sides.items():
                filler._normal = fn
                fb[name].append(bench_nets.median_ms(net.ForwardBackward, args.steps))
                data[name].append(bench_nets.median_ms(lambda: layer.Forward(bottom, top), 100))
    finally:
        filler._normal = sides["kernels.rng"]
    for name in sides:
        print(f"{name:13s} ForwardBackward median {statistics.median(fb[name]):.2f} ms (rounds "
              f"{' '.join(f'{x:.2f}' for x in fb[name])}); DummyData's refill {statistics.median(data[name]):.3f} ms")
    ratios = [b / a for a, b in zip(*fb.values())]
    print(f"ForwardBackward kernels.rng / numpy normal per round: {' '.join(f'{r:.3f}' for r in ratios)} "
          f"(median {statistics.median(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A fairness check for bench_infer.py's PyTorch twin: ResNet-50 written the idiomatic PyTorch way.

The twin (bench/torch_twin.py) is built generically from our parsed net (functional ops, Caffe's Scale as
a multiply and an add), so it may be slower than a model written with torch.nn modules. This script builds
ResNet-50 v1 (the bottleneck layout bench/models/resnet50.prototxt follows) from nn.Conv2d/BatchNorm2d in
eval mode, random weights, and prints the median forward latency at each batch under torch.inference_mode,
so the twin's figures can be put beside it. Runs only where torch is installed (it is never a dependency):

    /work/torchvenv/bin/python bench/torch_resnet50_eager.py [--batches 1,8] [--repeats 5] [--threads 2]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn


class Bottleneck(nn.Module):
    def __init__(self, cin, mid, cout, stride):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(cin, mid, 1, stride, bias=False), nn.BatchNorm2d(mid)
        self.c2, self.b2 = nn.Conv2d(mid, mid, 3, 1, 1, bias=False), nn.BatchNorm2d(mid)
        self.c3, self.b3 = nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                      if cin != cout or stride != 1 else nn.Identity())

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)))
        return torch.relu(self.b3(self.c3(y)) + self.short(x))


def resnet50() -> nn.Module:
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for mid, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, mid, mid * 4, stride if i == 0 else 1))
            cin = mid * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
    return nn.Sequential(*layers).eval()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = resnet50()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, ResNet-50 (nn modules, eval)")
    for batch in (int(b) for b in args.batches.split(",")):
        x = torch.randn(batch, 3, 224, 224)
        times = []
        with torch.inference_mode():
            for r in range(args.warmup + args.repeats):
                t = time.perf_counter()
                model(x)
                if r >= args.warmup:
                    times.append((time.perf_counter() - t) * 1e3)
        print(f"batch {batch}: median {statistics.median(times):.1f} ms  (runs: "
              f"{', '.join(f'{v:.0f}' for v in times)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

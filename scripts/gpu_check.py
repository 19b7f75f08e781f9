"""Helpers of scripts/gpu_check.sh (issue 14, item 5): benchmark nets, PyTorch side by side, report tables.

    python scripts/gpu_check.py prepare DIR             # DummyData TRAIN nets + solvers of the benchmark nets
    python scripts/gpu_check.py time-table DIR          # table from DIR/time_<net>.log (+ DIR/torch.json)
    python scripts/gpu_check.py torch OUT.json [--device cuda] [--iterations 20] [--nets lenet,...]
    python scripts/gpu_check.py throughput LOG1 LOG2    # 1-GPU vs 2-GPU training rate from caffe-cli logs

`torch` needs only PyTorch (it runs in any Python that has it); the others need the caffe packages.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATCH = {"lenet": 64, "cifar10_quick": 100, "caffenet": 8}


def _bench_nets():
    spec = importlib.util.spec_from_file_location("bench_nets", ROOT / "bench" / "bench_nets.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def prepare(out: Path) -> None:
    """DIR/<net>.prototxt (bench_nets' DummyData TRAIN nets) and DIR/<net>_solver.prototxt (GPU, display 20)."""
    from google.protobuf import text_format
    bn = _bench_nets()
    out.mkdir(parents=True, exist_ok=True)
    for name, (path, dshape, lshape, *_) in bn.NETS.items():
        net = bn.dummy_data_net(path, dshape, lshape)
        (out / f"{name}.prototxt").write_text(text_format.MessageToString(net))
        (out / f"{name}_solver.prototxt").write_text(
            f'net: "{out / (name + ".prototxt")}"\nbase_lr: 0.001\nmomentum: 0.9\nlr_policy: "fixed"\n'
            f"display: 20\nmax_iter: 200\nsnapshot_after_train: false\nsolver_mode: GPU\nrandom_seed: 1\n")
        print(f"{name}: batch {dshape[0]}, {out / (name + '.prototxt')}")


def _avg_ms(log: Path):
    if not log.exists():
        return None
    m = re.search(r"Average Forward-Backward: ([\d.e+-]+) ms", log.read_text(errors="replace"))
    return float(m.group(1)) if m else None


def time_table(folder: Path) -> None:
    torch = {}
    if (folder / "torch.json").exists():
        torch = json.loads((folder / "torch.json").read_text())
    print("caffe: `caffe-cli time --gpu=0` (forward + backward); PyTorch: forward + backward + SGD step.\n")
    print("| net | batch | caffe GPU ms/iter | img/s | PyTorch ms/iter | caffe / PyTorch |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, batch in BATCH.items():
        ms = _avg_ms(folder / f"time_{name}.log")
        t = torch.get(name)
        cells = [name, str(batch), f"{ms:.2f}" if ms else "n/a", f"{batch / ms * 1e3:,.0f}" if ms else "n/a",
                 f"{t:.2f}" if t else "n/a", f"{ms / t:.2f}x" if ms and t else "n/a"]
        print("| " + " | ".join(cells) + " |")
    if torch.get("_device"):
        print(f"\nPyTorch {torch.get('_version')} on {torch['_device']} ({torch.get('_name', '')}).")


def _rates(log: Path) -> list[float]:
    text = log.read_text(errors="replace") if log.exists() else ""
    return [float(x) for x in re.findall(r"Iteration \d+ \(([\d.e+-]+) iter/s", text)]


def throughput(one: Path, two: Path, batch: int) -> None:
    r1, r2 = _rates(one)[1:], _rates(two)[1:]  # the first display includes the start-up
    if not r1 or not r2:
        print(f"throughput: no 'Iteration N (x iter/s' lines to compare ({len(r1)} / {len(r2)})")
        return
    a, b = sorted(r1)[len(r1) // 2], sorted(r2)[len(r2) // 2]
    print(f"1 GPU: {a:.2f} iter/s = {a * batch:,.0f} img/s; 2 GPUs: {b:.2f} iter/s = {2 * b * batch:,.0f} img/s; "
          f"speed-up {2 * b / a:.2f}x (target >= 1.8x)")


# ------------------------------------------------------------------------------------------ PyTorch side

def torch_nets(nn):
    def lenet():
        return nn.Sequential(nn.Conv2d(1, 20, 5), nn.MaxPool2d(2, 2), nn.Conv2d(20, 50, 5), nn.MaxPool2d(2, 2),
                             nn.Flatten(), nn.Linear(800, 500), nn.ReLU(), nn.Linear(500, 10))

    def cifar10_quick():
        return nn.Sequential(nn.Conv2d(3, 32, 5, padding=2), nn.MaxPool2d(3, 2, ceil_mode=True), nn.ReLU(),
                             nn.Conv2d(32, 32, 5, padding=2), nn.ReLU(), nn.AvgPool2d(3, 2, ceil_mode=True),
                             nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.AvgPool2d(3, 2, ceil_mode=True),
                             nn.Flatten(), nn.Linear(64 * 4 * 4, 64), nn.Linear(64, 10))

    def caffenet():
        return nn.Sequential(nn.Conv2d(3, 96, 11, 4), nn.ReLU(), nn.MaxPool2d(3, 2), nn.LocalResponseNorm(5),
                             nn.Conv2d(96, 256, 5, padding=2, groups=2), nn.ReLU(), nn.MaxPool2d(3, 2),
                             nn.LocalResponseNorm(5), nn.Conv2d(256, 384, 3, padding=1), nn.ReLU(),
                             nn.Conv2d(384, 384, 3, padding=1, groups=2), nn.ReLU(),
                             nn.Conv2d(384, 256, 3, padding=1, groups=2), nn.ReLU(), nn.MaxPool2d(3, 2),
                             nn.Flatten(), nn.Linear(9216, 4096), nn.ReLU(), nn.Dropout(), nn.Linear(4096, 4096),
                             nn.ReLU(), nn.Dropout(), nn.Linear(4096, 1000))

    return {"lenet": (lenet, (1, 28, 28), 10), "cifar10_quick": (cifar10_quick, (3, 32, 32), 10),
            "caffenet": (caffenet, (3, 227, 227), 1000)}


def torch_bench(out: Path, device: str, iterations: int, nets: list[str]) -> None:
    """Forward + backward + SGD step per iteration (what `caffe-cli time` times, plus the update)."""
    import torch
    from torch import nn
    dev = torch.device(device)
    result = {"_version": torch.__version__, "_device": device,
              "_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"}
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for name in nets:
        make, shape, classes = torch_nets(nn)[name]
        torch.manual_seed(0)
        model = make().to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
        x = torch.randn(BATCH[name], *shape, device=dev)
        y = torch.randint(0, classes, (BATCH[name],), device=dev)
        loss_fn = nn.CrossEntropyLoss()

        def step():
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()
        for _ in range(3):
            step()
        sync()
        t0 = time.perf_counter()
        for _ in range(iterations):
            step()
        sync()
        result[name] = (time.perf_counter() - t0) / iterations * 1e3
        print(f"PyTorch {name}: {result[name]:.2f} ms/iter on {device}", flush=True)
        out.write_text(json.dumps(result, indent=1))  # after each net: a timeout keeps what was measured


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare").add_argument("dir", type=Path)
    sub.add_parser("time-table").add_argument("dir", type=Path)
    t = sub.add_parser("torch")
    t.add_argument("out", type=Path)
    t.add_argument("--device", default="cuda")
    t.add_argument("--iterations", type=int, default=20)
    t.add_argument("--nets", default=",".join(BATCH))
    th = sub.add_parser("throughput")
    th.add_argument("one", type=Path)
    th.add_argument("two", type=Path)
    th.add_argument("--batch", type=int, default=BATCH["cifar10_quick"])
    args = ap.parse_args()
    if args.cmd == "prepare":
        prepare(args.dir)
    elif args.cmd == "time-table":
        time_table(args.dir)
    elif args.cmd == "torch":
        torch_bench(args.out, args.device, args.iterations, args.nets.split(","))
    else:
        throughput(args.one, args.two, args.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())

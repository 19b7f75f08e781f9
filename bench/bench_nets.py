"""Whole-net training speed: LeNet (batch 64, and batch 1), CIFAR10-quick (100), CaffeNet (8x3x227x227).

Each net's data layers are replaced by DummyData of the real shapes (gaussian data, constant labels). Per net:

- `caffe-cli time` in a fresh process (Caffe's own timing loop and output: "Average Forward-Backward"),
  unless --no-cli;
- in this process, `Net.ForwardBackward()` (the framework's own loop, without time's per-layer timers):
  median of --repeats after --warmup; this is the figure the batch-1 row is about (per-layer overhead);
- when PyTorch is available (importable, or --torch-python PYTHON running bench/torch_twin.py in a
  subprocess) a PyTorch twin of the same net with the same weights and data, in train mode, forward + loss
  + backward, checked first against ours (loss, and every parameter gradient when the net has no Dropout;
  with Dropout the check runs both in eval mode) and timed the same way; the ratio is ours / PyTorch.
  With --rounds R (default 1), ours and the twin are timed R times in turn (ours, twin, ours, ...): the
  figures are the medians of the R medians, the ratio the median of the R rounds' ratios (on a VM whose
  speed moves by 20-40% from minute to minute, a ratio from one pair of runs is only as good as that minute).

GFLOP/s counts the multiply-adds of the convolution and inner-product layers (forward, weight and bottom
gradients). Run from the repo root:

    python bench/bench_nets.py [--nets lenet,lenet_b1,cifar10_quick,caffenet] [--iterations 20]
        [--repeats 10] [--warmup 3] [--rounds 1] [--torch-python /work/torchvenv/bin/python] [--no-torch]
        [--no-cli] [--threads N] [--layers]

Prints one line per net; `--layers` also prints the slowest layers of each (from caffe-cli time). Figures go
in bench/README.md.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import subprocess
import time
import sys
import tempfile
from pathlib import Path

# Net construction logs Caffe's glog lines to stderr by default; the figures are what this prints.
os.environ.setdefault("GLOG_minloglevel", "1")

from google.protobuf import text_format

ROOT = Path(__file__).resolve().parents[1]
NETS = {
    # name: (prototxt, data shape, label shape, BVLC Caffe ms, PyTorch 2.13 CPU ms, target ms)
    "lenet": (ROOT / "examples/mnist/lenet_train_test.prototxt", (64, 1, 28, 28), (64,), "45-60", "12-14", 11),
    "lenet_b1": (ROOT / "examples/mnist/lenet_train_test.prototxt", (1, 1, 28, 28), (1,), "-", "-", 0),
    "cifar10_quick": (ROOT / "bench/models/cifar10_quick_train_test.prototxt", (100, 3, 32, 32), (100,),
                      "340", "60", 48),
    "caffenet": (ROOT / "bench/models/caffenet_train_val.prototxt", (8, 3, 227, 227), (8,), "1090", "400", 320),
}


def dummy_data_net(path: Path, data_shape, label_shape):
    """The TRAIN net of `path` with its data layers replaced by one DummyData layer of the given shapes."""
    from caffe.proto import caffe_pb2
    net = caffe_pb2.NetParameter()
    text_format.Parse(path.read_text(), net)
    out = caffe_pb2.NetParameter(name=net.name)
    data_done = False
    for layer in net.layer:
        phases = [r.phase for r in layer.include if r.HasField("phase")]
        if phases and caffe_pb2.TRAIN not in phases:
            continue
        if layer.type in ("Data", "ImageData", "HDF5Data", "MemoryData"):
            if not data_done:
                d = out.layer.add(name="data", type="DummyData")
                d.top.extend(list(layer.top))
                p = d.dummy_data_param
                p.data_filler.add(type="gaussian", std=1.0)
                p.data_filler.add(type="constant", value=1.0)
                p.shape.add().dim.extend(data_shape)
                p.shape.add().dim.extend(label_shape)
                data_done = True
            continue
        new = out.layer.add()
        new.CopyFrom(layer)
        del new.include[:]
    return out


def flops(net_param) -> tuple[float, float]:
    """(forward, backward) multiply-add FLOPs of the convolution and inner-product layers."""
    import caffe
    from caffe.net import Net
    net = Net(net_param, caffe.TRAIN)
    fwd = bwd = 0.0
    first_param_layer = True
    for i, layer in enumerate(net.layers):
        if layer.type not in ("Convolution", "InnerProduct"):
            continue
        w = layer.blobs[0]
        out = net.top_vecs[i][0]
        if layer.type == "Convolution":
            macs = out.count() * w.count() / w.shape[0]  # each output: C_in/group * prod(kernel)
        else:
            macs = out.count() * w.count() / w.shape[0] if not layer.layer_param.inner_product_param.transpose \
                else out.count() * w.count() / w.shape[1]
        f = 2.0 * macs
        fwd += f
        # backward: the weight gradient always, the bottom gradient except for the first layer (data)
        bwd += f if first_param_layer else 2 * f
        first_param_layer = False
    return fwd, bwd


def time_net(prototxt: Path, iterations: int, env) -> tuple[float, list[tuple[str, float, float]], str]:
    proc = subprocess.run([sys.executable, "-m", "caffe.cli.main", "time", f"--model={prototxt}",
                           f"--iterations={iterations}"], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    m = re.search(r"Average Forward-Backward: ([\d.e+-]+) ms", proc.stderr)
    layers = {}
    for name, kind, ms in re.findall(r"\] +(\S+)\t(forward|backward): ([\d.e+-]+) ms\.", proc.stderr):
        layers.setdefault(name, [0.0, 0.0])[0 if kind == "forward" else 1] = float(ms)
    return float(m.group(1)), [(k, v[0], v[1]) for k, v in layers.items()], proc.stderr


def in_process(net_param, repeats: int, warmup: int) -> tuple[float, object]:
    """(median ms of Net.ForwardBackward(), the net)."""
    import caffe
    from caffe.net import Net
    net = Net(net_param, caffe.TRAIN)
    return time_steps(net, repeats, warmup), net


def median_ms(fn, repeats: int, warmup: int = 0) -> float:
    """Median ms of fn() over repeats calls after warmup (the A/B scripts use it too)."""
    times = []
    for r in range(warmup + repeats):
        t = time.perf_counter()
        fn()
        if r >= warmup:
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def time_steps(net, repeats: int, warmup: int) -> float:
    """Median ms of net.ForwardBackward() over repeats calls after warmup."""
    return median_ms(net.ForwardBackward, repeats, warmup)


def dummy_data_ms(net, repeats: int) -> float:
    """Median ms of the DummyData layer's forward alone (its gaussian refill)."""
    i = [layer.type for layer in net.layers].index("DummyData")
    layer, bottom, top = net.layers[i], net.bottom_vecs[i], net.top_vecs[i]
    return median_ms(lambda: layer.Forward(bottom, top), repeats)


def torch_twin_ms(net, net_param, runner, tmp: Path):
    """(median ms of the PyTorch twin's forward + backward, max relative error of the check)."""
    import caffe
    from caffe.net import Net
    from torch_twin import spec_of
    losses = [n for n in net.outputs if net.blob_loss_weights[n]]
    if any(layer.type == "Dropout" for layer in net.layers):
        ref = Net(net_param, caffe.TEST, fold=False)  # Dropout is the identity: a deterministic check
        ref.share_with(net)
        ref.Forward()
        spec_of(ref, tmp, losses, grads=False)
    else:
        net.ClearParamDiffs()
        net.ForwardBackward()
        spec_of(net, tmp, losses, grads=True)
    res = runner(tmp, "train")  # (the spec stays in tmp: twin_again times it again)
    worst = max(res["max_rel_err"], key=res["max_rel_err"].get)
    if res["max_rel_err"][worst] > 1e-4:
        print(f"    twin check: largest relative difference {res['max_rel_err'][worst]:.1e} at {worst}")
    return statistics.median(res["ms"]), res["max_rel_err"][worst]


def twin_again(runner, tmp: Path) -> float:
    """Median ms of the twin whose spec torch_twin_ms wrote into tmp, timed again."""
    return statistics.median(runner(tmp, "train")["ms"])


def main() -> int:
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_infer import limit_threads, torch_runner
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=20, help="caffe-cli time iterations")
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--repeats", type=int, default=10, help="timed ForwardBackward calls in process")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1, help="ours and the twin timed this many times in turn")
    ap.add_argument("--torch-python", default=None, help="a Python with torch: the twin runs there")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-cli", action="store_true", help="skip caffe-cli time (in-process figures only)")
    ap.add_argument("--threads", type=int, default=0, help="BLAS/OpenMP threads (0: the libraries' default)")
    ap.add_argument("--layers", action="store_true", help="also print the slowest layers")
    args = ap.parse_args()
    limit_threads(args.threads)
    env = dict(os.environ, GLOG_minloglevel="0")  # caffe-cli time reports its figures at INFO
    runner = torch_runner(args)
    print(f"load average {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs); PyTorch twin: "
          f"{'yes' if runner else 'no'}")
    print(f"{'net':14s} {'batch':>6s} {'cli ms':>8s} {'fwd+bwd ms':>10s} {'GFLOP/iter':>11s} {'GFLOP/s':>8s} "
          f"{'torch ms':>9s} {'ours/torch':>10s} {'twin err':>9s} {'target ms':>9s} {'Caffe ms':>9s} {'load':>5s}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.nets.split(","):
            path, dshape, lshape, caffe_ms, torch_ms_issue, target = NETS[name]
            net_param = dummy_data_net(path, dshape, lshape)
            proto = Path(tmp) / f"{name}.prototxt"
            proto.write_text(text_format.MessageToString(net_param))
            fwd, bwd = flops(net_param)
            gflop = (fwd + bwd) / 1e9
            cli_ms, layers = (None, [])
            if not args.no_cli:
                cli_ms, layers, _ = time_net(proto, args.iterations, env)
            ms, net = in_process(net_param, args.repeats, args.warmup)
            ours, twins = [ms], []
            t_ms = err = None
            if runner is not None:
                t_ms, err = torch_twin_ms(net, net_param, runner, Path(tmp) / f"{name}_twin")
                twins.append(t_ms)
            for _ in range(1, args.rounds):
                ours.append(time_steps(net, args.repeats, args.warmup))
                if runner is not None:
                    twins.append(twin_again(runner, Path(tmp) / f"{name}_twin"))
            ms = statistics.median(ours)
            ratio = None
            if twins:
                t_ms = statistics.median(twins)
                ratio = statistics.median(o / t for o, t in zip(ours, twins))
            cli = f"{cli_ms:8.2f}" if cli_ms is not None else f"{'-':>8s}"
            tcol = f"{t_ms:9.2f} {ratio:10.2f} {err:9.1e}" if twins else f"{'-':>9s} {'-':>10s} {'-':>9s}"
            print(f"{name:14s} {dshape[0]:6d} {cli} {ms:10.2f} {gflop:11.3f} {gflop / (ms / 1e3):8.1f} "
                  f"{tcol} {target or '-':>9} {caffe_ms:>9s} {os.getloadavg()[0]:5.1f}", flush=True)
            data_ms = dummy_data_ms(net, args.repeats)
            print(f"    of which DummyData's refill (new gaussian data every iteration, as Caffe's DummyData; the "
                  f"twin reads one fixed tensor): {data_ms:.2f} ms" + (f"; without it ours / PyTorch "
                  f"{(ms - data_ms) / t_ms:.2f}" if t_ms else ""), flush=True)
            if args.rounds > 1:
                rounds = [f"{o:.2f} / {t:.2f}" for o, t in zip(ours, twins)] if twins else [f"{o:.2f}" for o in ours]
                print("    rounds, ours / twin ms: " + ", ".join(rounds), flush=True)
            if args.layers:
                for lname, f, b in sorted(layers, key=lambda x: -(x[1] + x[2]))[:6]:
                    print(f"    {lname:12s} forward {f:8.2f} ms  backward {b:8.2f} ms")
            del net
    return 0


if __name__ == "__main__":
    sys.exit(main())

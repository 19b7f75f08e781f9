"""Whole-net speed: `caffe-cli time` on LeNet (batch 64), CIFAR10-quick (100) and CaffeNet (8x3x227x227).

Each net's data layers are replaced by DummyData of the real shapes (gaussian data, constant labels), the
net is timed by `caffe-cli time` in a fresh process (Caffe's own output: "Average Forward-Backward: X ms."),
and the arithmetic of its convolution and inner-product layers gives GFLOP/s. Run from the repo root:

    python bench/bench_nets.py [--iterations 20] [--nets lenet,cifar10_quick,caffenet] [--threads N]

Prints one line per net; `--layers` also prints the slowest layers of each. Figures go in bench/README.md.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from google.protobuf import text_format

ROOT = Path(__file__).resolve().parents[1]
NETS = {
    # name: (prototxt, data shape, label shape, BVLC Caffe ms, PyTorch 2.13 CPU ms, target ms)
    "lenet": (ROOT / "examples/mnist/lenet_train_test.prototxt", (64, 1, 28, 28), (64,), "45-60", "12-14", 11),
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--threads", type=int, default=0, help="BLAS/OpenMP threads (0: the libraries' default)")
    ap.add_argument("--layers", action="store_true", help="also print the slowest layers")
    args = ap.parse_args()
    env = dict(os.environ)
    if args.threads:
        env.update(OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))
    print(f"{'net':14s} {'batch':>6s} {'ms/iter':>9s} {'GFLOP/iter':>11s} {'GFLOP/s':>8s} "
          f"{'target ms':>9s} {'Caffe ms':>9s} {'PyTorch ms':>10s}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.nets.split(","):
            path, dshape, lshape, caffe_ms, torch_ms, target = NETS[name]
            net_param = dummy_data_net(path, dshape, lshape)
            proto = Path(tmp) / f"{name}.prototxt"
            proto.write_text(text_format.MessageToString(net_param))
            fwd, bwd = flops(net_param)
            ms, layers, _ = time_net(proto, args.iterations, env)
            gflop = (fwd + bwd) / 1e9
            print(f"{name:14s} {dshape[0]:6d} {ms:9.2f} {gflop:11.3f} {gflop / (ms / 1e3):8.1f} "
                  f"{target:9d} {caffe_ms:>9s} {torch_ms:>10s}", flush=True)
            if args.layers:
                for lname, f, b in sorted(layers, key=lambda x: -(x[1] + x[2]))[:6]:
                    print(f"    {lname:12s} forward {f:8.2f} ms  backward {b:8.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

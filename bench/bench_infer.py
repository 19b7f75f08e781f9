"""Inference latency: ResNet-50, GoogLeNet, SqueezeNet 1.1, MobileNet v1 and v2 at batch 1 and 8.

For each net and batch: our TEST-phase net with inference folding (caffe.net.fold) and without it, with the
same seeded random weights (He-normal convolutions, BatchNorm statistics near unit variance), timed
interleaved (median of --repeats forwards after --warmup); GFLOP/s of the Convolution and InnerProduct
arithmetic; the time per layer type (one extra instrumented pass each); and, when PyTorch is available
(importable here, or through --torch-python PYTHON, a Python that has torch: it runs bench/torch_twin.py in
a subprocess), a PyTorch twin of the same net with the same weights, checked against our outputs (max
relative error over the logits and probabilities, printed: ~1e-5 means the comparison is fair) and timed
in the same run. Ratios are ours / PyTorch (< 1: we are faster).

    python bench/bench_infer.py [--nets resnet50,googlenet,squeezenet1_1,mobilenet_v1,mobilenet_v2]
        [--batches 1,8] [--repeats 5] [--warmup 2] [--torch-python /work/torchvenv/bin/python] [--no-torch]
        [--threads N] [--layers] [--no-unfolded]

The machine's memory bandwidth (a large np.copyto) is printed first: the memory-bound layers are
measured against it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

# Net construction logs Caffe's glog lines to stderr by default; the figures are what this prints.
os.environ.setdefault("GLOG_minloglevel", "1")

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "bench" / "models"
NETS = ["resnet50", "googlenet", "squeezenet1_1", "mobilenet_v1", "mobilenet_v2"]
SEED = 1234


def randomize(net, seed: int = SEED) -> None:
    """Seeded random parameters that keep activations O(1) through deep nets."""
    rng = np.random.default_rng(seed)
    for layer in net.layers:
        blobs = layer.blobs
        if layer.type in ("Convolution", "InnerProduct", "Deconvolution"):
            w = blobs[0]
            fan_in = w.count() // w.shape[0]
            w.data[...] = rng.standard_normal(w.shape) * np.sqrt(2.0 / fan_in)
            if len(blobs) > 1:
                blobs[1].data[...] = rng.normal(0, 0.01, blobs[1].shape)
        elif layer.type == "BatchNorm":
            c = blobs[0].count()
            blobs[0].data[...] = rng.normal(0, 0.1, c)
            blobs[1].data[...] = rng.uniform(0.5, 1.5, c)
            blobs[2].data[...] = 1.0
        elif layer.type == "Scale":
            blobs[0].data[...] = rng.uniform(0.5, 1.0, blobs[0].shape)
            if len(blobs) > 1:
                blobs[1].data[...] = rng.normal(0, 0.05, blobs[1].shape)


def flops(net) -> float:
    """Forward FLOPs (2 x multiply-adds) of the Convolution and InnerProduct layers."""
    total = 0.0
    for i, layer in enumerate(net.layers):
        if layer.type in ("Convolution", "InnerProduct"):
            w = layer.blobs[0]
            per_output = w.count() / (w.shape[1] if layer.type == "InnerProduct"
                                      and layer.layer_param.inner_product_param.transpose else w.shape[0])
            total += 2.0 * net.top_vecs[i][0].count() * per_output
    return total


def logits_and_outputs(net) -> list[str]:
    names = list(net.outputs)
    for i, layer in enumerate(net.layers):
        if layer.type == "Softmax" and net.top_names[net.layer_names[i]][0] in names:
            names.insert(0, net.bottom_names[net.layer_names[i]][0])
    return names


def max_rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def per_type(net, passes: int = 2) -> dict:
    """ms per layer type (a folded chain counts as its own type), mean of `passes` instrumented passes."""
    acc = defaultdict(float)
    steps = net.forward_steps()
    labels = []
    for first, last, _ in steps:
        types = [net.layers[k].type for k in range(first, last + 1)]
        labels.append(types[0] if first == last else "+".join(t.replace("BatchNorm", "BN") for t in types))
    for _ in range(passes):
        for (_, _, run), label in zip(steps, labels):
            t = time.perf_counter()
            run()
            acc[label] += (time.perf_counter() - t) * 1e3 / passes
    return dict(acc)


def memory_bandwidth() -> float:
    """GB/s of one read + one write (np.copyto of 256 MB), best of 5."""
    src = np.ones(64 << 20, np.float32)
    dst = np.empty_like(src)
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(5))
    return 2 * src.nbytes / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def limit_threads(n: int) -> None:
    """n BLAS/OpenMP threads in this process (the libraries are loaded already: threadpoolctl), and in the
    subprocesses it starts (environment)."""
    if not n:
        return
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        print("threadpoolctl is not installed: --threads only reaches subprocesses", file=sys.stderr)
        return
    threadpool_limits(n)


def torch_runner(args):
    """A function (folder, mode) -> result dict, or None when PyTorch is not available."""
    if args.no_torch:
        return None
    twin = ROOT / "bench" / "torch_twin.py"
    common = ["--repeats", str(args.repeats), "--warmup", str(args.warmup)]
    if args.threads:
        common += ["--threads", str(args.threads)]
    if args.torch_python:
        # PyTorch's thread pools with their own defaults: without the settings `import caffe` made in this
        # process's environment (caffe.thread_env_set; before session 14 the twin inherited
        # OMP_WAIT_POLICY=PASSIVE, which slowed its small operations)
        import caffe
        env = {k: v for k, v in os.environ.items() if k not in caffe.thread_env_set}

        def run(folder, mode):
            proc = subprocess.run([args.torch_python, str(twin), str(folder), "--mode", mode] + common,
                                  capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                raise RuntimeError(f"torch twin failed:\n{proc.stderr[-3000:]}")
            return json.loads(proc.stdout.strip().splitlines()[-1])
        return run
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    sys.path.insert(0, str(ROOT / "bench"))
    import io
    from contextlib import redirect_stdout
    import torch_twin

    def run_inline(folder, mode):
        out = io.StringIO()
        with redirect_stdout(out):
            torch_twin.main([str(folder), "--mode", mode] + common)
        return json.loads(out.getvalue().strip().splitlines()[-1])
    return run_inline


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--torch-python", default=None, help="a Python with torch: the twin runs there")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--threads", type=int, default=0, help="BLAS/OpenMP/torch threads (0: the default)")
    ap.add_argument("--layers", action="store_true", help="print the time per layer type")
    ap.add_argument("--no-unfolded", action="store_true", help="time only the folded net")
    args = ap.parse_args()
    if args.threads:
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ[var] = str(args.threads)
    limit_threads(args.threads)
    import caffe
    from caffe.net import Net

    runner = torch_runner(args)
    print(f"load average {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs); memory bandwidth "
          f"{memory_bandwidth():.1f} GB/s (copy: read + write); PyTorch twin: "
          f"{'yes' if runner else 'no'}", flush=True)
    head = (f"{'net':14s} {'batch':>5s} {'GFLOP':>7s} {'folded ms':>10s} {'GFLOP/s':>8s} {'unfolded ms':>11s} "
            f"{'torch ms':>9s} {'fold/torch':>10s} {'unf/torch':>9s} {'fold err':>9s} {'torch err':>9s} {'load':>5s}")
    print(head, flush=True)
    for name in args.nets.split(","):
        path = MODELS / f"{name}_deploy.prototxt"
        for batch in (int(b) for b in args.batches.split(",")):
            folded = Net(str(path), caffe.TEST, fold=True)
            unfolded = Net(str(path), caffe.TEST, fold=False)
            for net in (folded, unfolded):
                shape = list(net.blobs["data"].shape)
                net.blobs["data"].reshape([batch] + shape[1:])
                net.Reshape()
            randomize(folded)
            unfolded.share_with(folded)
            x = np.random.default_rng(SEED + 1).standard_normal(folded.blobs["data"].shape)
            folded.blobs["data"].data[...] = x
            unfolded.blobs["data"].data[...] = x
            outs = logits_and_outputs(unfolded)
            folded.Forward()
            unfolded.Forward()
            fold_err = max(max_rel(folded.blobs[o].data, unfolded.blobs[o].data) for o in outs)
            nets = [("fold", folded)] + ([] if args.no_unfolded else [("unfold", unfolded)])
            times = {k: [] for k, _ in nets}
            for r in range(args.warmup + args.repeats):
                for key, net in nets:  # interleaved
                    t = _timed(net.Forward)
                    if r >= args.warmup:
                        times[key].append(t * 1e3)
            ms = {k: statistics.median(v) for k, v in times.items()}
            gflop = flops(unfolded) / 1e9
            torch_ms = torch_err = None
            if runner is not None:
                from torch_twin import spec_of
                with tempfile.TemporaryDirectory() as tmp:
                    spec_of(unfolded, tmp, outs)
                    res = runner(tmp, "infer")
                torch_ms = statistics.median(res["ms"])
                torch_err = max(res["max_rel_err"].values())
            f = lambda v, w=9, p=2: f"{v:{w}.{p}f}" if v is not None else f"{'-':>{w}s}"  # noqa: E731
            ratio = lambda a: f"{a / torch_ms:10.2f}" if torch_ms and a else f"{'-':>10s}"  # noqa: E731
            print(f"{name:14s} {batch:5d} {gflop:7.2f} {ms['fold']:10.2f} {gflop / ms['fold'] * 1e3:8.1f} "
                  f"{f(ms.get('unfold'), 11)} {f(torch_ms)} {ratio(ms['fold'])} "
                  f"{ratio(ms.get('unfold'))[1:]} {fold_err:9.1e} "
                  f"{f'{torch_err:9.1e}' if torch_err is not None else f'{chr(45):>9s}'} "
                  f"{os.getloadavg()[0]:5.1f}", flush=True)
            if args.layers:
                for key, net in nets:
                    types = sorted(per_type(net).items(), key=lambda kv: -kv[1])
                    print(f"    {key:6s} " + ", ".join(f"{t} {v:.1f}" for t, v in types[:8]), flush=True)
            del folded, unfolded
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())

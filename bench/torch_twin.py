"""A PyTorch twin of a Caffe net, for side-by-side timing (PyTorch is never a dependency of this project).

Two halves, so the twin can run in another Python (a venv that has torch but not caffe):

- `spec_of(net, path)` (our side, needs caffe): writes the net's layers after Net::Init (Split layers
  included; in-place tops are just rebound names) as JSON plus every parameter blob, input and reference
  output as .npy files in the folder `path`.
- `python bench/torch_twin.py FOLDER --mode infer|train --repeats R --warmup W --threads T` (the twin side,
  needs only torch and numpy): builds the twin from FOLDER, checks it against the reference outputs (and,
  for training, the reference parameter gradients), times it, and prints one JSON line:
  {"ms": [...], "max_rel_err": {...}}.

Caffe semantics kept: Pooling with Caffe's output size (ceil, and the last window starting inside the image
or its padding: PyTorch's ceil_mode is the same rule) and Caffe's average (divisor = window clipped to
the padded image, i.e. count_include_pad with ceil_mode's clipping), BatchNorm's stored statistics scaled by
1/blobs[2], Scale/Bias along axis 1, LRN across channels (alpha / local_size), InnerProduct flattening from
its axis, Dropout scaling in training, SoftmaxWithLoss with VALID normalization. Layers the twin does not
know raise an error naming them.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

INPUT_TYPES = ("Input", "DummyData", "Data", "ImageData", "MemoryData", "HDF5Data")
SKIPPED = ("Accuracy", "Silence")


# ---------------------------------------------------------------------------------------- our side (caffe)
def _spatial(p, name, h, w, default):
    if h and (p.HasField(h) or p.HasField(w)):
        return [int(getattr(p, h)), int(getattr(p, w))]
    values = [int(v) for v in getattr(p, name)] if name else []
    if not values:
        return [default, default]
    return values * 2 if len(values) == 1 else values


def _layer_spec(layer, net, i):
    lp = layer.layer_param
    t = layer.type
    spec = {"name": layer.name, "type": t, "bottom": [net.blob_names[j] for j in net.bottom_id_vecs[i]],
            "top": [net.blob_names[j] for j in net.top_id_vecs[i]], "nblobs": len(layer.blobs)}
    if t in ("Convolution", "Deconvolution"):
        p = lp.convolution_param
        spec.update(kernel=_spatial(p, "kernel_size", "kernel_h", "kernel_w", None),
                    stride=_spatial(p, "stride", "stride_h", "stride_w", 1),
                    pad=_spatial(p, "pad", "pad_h", "pad_w", 0), dilation=_spatial(p, "dilation", None, None, 1),
                    group=int(p.group), bias=bool(p.bias_term))
    elif t == "Pooling":
        p = lp.pooling_param
        spec.update(pool=int(p.pool), global_pooling=bool(p.global_pooling),
                    kernel=_spatial(p, None, "kernel_h", "kernel_w", None) if not p.HasField("kernel_size")
                    else [int(p.kernel_size)] * 2,
                    stride=_spatial(p, None, "stride_h", "stride_w", 1) if not p.HasField("stride")
                    else [int(p.stride)] * 2,
                    pad=_spatial(p, None, "pad_h", "pad_w", 0) if not p.HasField("pad") else [int(p.pad)] * 2)
    elif t == "InnerProduct":
        p = lp.inner_product_param
        spec.update(axis=int(p.axis), transpose=bool(p.transpose), bias=bool(p.bias_term))
    elif t == "ReLU":
        spec.update(slope=float(lp.relu_param.negative_slope))
    elif t == "Clip":
        spec.update(min=float(lp.clip_param.min), max=float(lp.clip_param.max))
    elif t == "BatchNorm":
        p = lp.batch_norm_param
        spec.update(eps=float(p.eps), global_stats=bool(p.use_global_stats) if p.HasField("use_global_stats")
                    else layer.phase == 1)
    elif t == "Scale":
        p = lp.scale_param
        spec.update(axis=int(p.axis), num_axes=int(p.num_axes), bias=bool(p.bias_term))
    elif t == "LRN":
        p = lp.lrn_param
        if p.norm_region != 0:
            raise ValueError(f"torch twin: LRN '{layer.name}': only ACROSS_CHANNELS")
        spec.update(size=int(p.local_size), alpha=float(p.alpha), beta=float(p.beta), k=float(p.k))
    elif t == "Eltwise":
        p = lp.eltwise_param
        spec.update(op=int(p.operation), coeff=[float(c) for c in p.coeff])
    elif t == "Concat":
        p = lp.concat_param
        spec.update(axis=int(p.axis) if not p.HasField("concat_dim") else int(p.concat_dim))
    elif t == "Dropout":
        spec.update(ratio=float(lp.dropout_param.dropout_ratio), train=layer.phase == 0)
    elif t == "Softmax":
        spec.update(axis=int(lp.softmax_param.axis))
    elif t == "SoftmaxWithLoss":
        if lp.loss_param.HasField("ignore_label"):
            raise ValueError(f"torch twin: SoftmaxWithLoss '{layer.name}': ignore_label is not supported")
        spec.update(axis=int(lp.softmax_param.axis), weight=float(layer.loss(0)))
    elif t in ("Split", "Flatten", "Sigmoid", "TanH") + INPUT_TYPES + SKIPPED:
        pass
    else:
        raise ValueError(f"torch twin: layer '{layer.name}' of type {t} is not supported")
    return spec


def spec_of(net, path, outputs, grads=False) -> None:
    """Write net (after a Forward, and a Backward when grads) to the folder path for the twin."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    layers = [_layer_spec(layer, net, i) for i, layer in enumerate(net.layers)]
    inputs = sorted({t for spec in layers if spec["type"] in INPUT_TYPES for t in spec["top"]})
    for name in inputs:
        np.save(path / f"in_{_safe(name)}.npy", net.blobs[name].data)
    for i, layer in enumerate(net.layers):
        for j, blob in enumerate(layer.blobs):
            np.save(path / f"p{i}_{j}.npy", blob.data)
            if grads:
                np.save(path / f"g{i}_{j}.npy", blob.diff)
    for name in outputs:
        np.save(path / f"out_{_safe(name)}.npy", net.blobs[name].data)
    (path / "spec.json").write_text(json.dumps({"layers": layers, "inputs": inputs, "outputs": list(outputs),
                                                "grads": grads}))


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


# ---------------------------------------------------------------------------------------- the twin (torch)
def build(folder):
    import torch
    import torch.nn.functional as F

    folder = Path(folder)
    spec = json.loads((folder / "spec.json").read_text())
    params = {}
    for i, s in enumerate(spec["layers"]):
        for j in range(s["nblobs"]):
            arr = np.load(folder / f"p{i}_{j}.npy")
            params[(i, j)] = torch.nn.Parameter(torch.from_numpy(np.ascontiguousarray(arr)))

    def run(blobs, training):
        for i, s in enumerate(spec["layers"]):
            t = s["type"]
            if t in INPUT_TYPES or t in SKIPPED:
                continue
            x = [blobs[b] for b in s["bottom"]]
            p = [params[(i, j)] for j in range(s["nblobs"])]
            if t == "Convolution":
                y = F.conv2d(x[0], p[0], p[1] if s["bias"] else None, tuple(s["stride"]), tuple(s["pad"]),
                             tuple(s["dilation"]), s["group"])
            elif t == "Pooling":
                h, w = x[0].shape[2:]
                k, st, pd = (s["kernel"], s["stride"], s["pad"]) if not s["global_pooling"] else \
                    ([h, w], [1, 1], [0, 0])
                if s["pool"] == 0:
                    y = F.max_pool2d(x[0], tuple(k), tuple(st), tuple(pd), ceil_mode=True)
                else:
                    y = F.avg_pool2d(x[0], tuple(k), tuple(st), tuple(pd), ceil_mode=True, count_include_pad=True)
            elif t == "InnerProduct":
                a = s["axis"] % x[0].dim()
                flat = x[0].reshape(int(np.prod(x[0].shape[:a])), -1)
                w = p[0].t() if s["transpose"] else p[0]
                y = F.linear(flat, w, p[1] if s["bias"] else None)
            elif t == "ReLU":
                y = F.relu(x[0]) if s["slope"] == 0 else F.leaky_relu(x[0], s["slope"])
            elif t == "Clip":
                y = torch.clamp(x[0], s["min"], s["max"])
            elif t == "Sigmoid":
                y = torch.sigmoid(x[0])
            elif t == "TanH":
                y = torch.tanh(x[0])
            elif t == "BatchNorm":
                if not s["global_stats"]:
                    raise ValueError(f"torch twin: BatchNorm '{s['name']}' with batch statistics")
                f = float(p[2].detach().reshape(-1)[0])
                f = 0.0 if f == 0 else 1.0 / f
                y = F.batch_norm(x[0], p[0].detach() * f, p[1].detach() * f, None, None, False, 0.0, s["eps"])
            elif t == "Scale":
                shape = (1, -1) + (1,) * (x[0].dim() - 2)
                y = x[0] * p[0].reshape(shape)
                if s["bias"]:
                    y = y + p[1].reshape(shape)
            elif t == "LRN":
                y = F.local_response_norm(x[0], s["size"], s["alpha"], s["beta"], s["k"])
            elif t == "Eltwise":
                if s["op"] == 1:  # SUM
                    coeff = s["coeff"] or [1.0] * len(x)
                    y = x[0] * coeff[0] if coeff[0] != 1 else x[0]
                    for c, b in zip(coeff[1:], x[1:]):
                        y = y + (b * c if c != 1 else b)
                elif s["op"] == 0:  # PROD
                    y = x[0]
                    for b in x[1:]:
                        y = y * b
                else:
                    y = x[0]
                    for b in x[1:]:
                        y = torch.maximum(y, b)
            elif t == "Concat":
                y = torch.cat(x, s["axis"])
            elif t == "Dropout":
                y = F.dropout(x[0], s["ratio"], training=training and s["train"])
            elif t == "Softmax":
                y = torch.softmax(x[0], s["axis"])
            elif t == "SoftmaxWithLoss":
                logits = x[0]
                y = s["weight"] * F.cross_entropy(logits, x[1].reshape(logits.shape[0], *logits.shape[2:]).long())
            elif t == "Flatten":
                y = x[0].reshape(x[0].shape[0], -1)
            elif t == "Split":
                for top in s["top"]:
                    blobs[top] = x[0]
                continue
            else:
                raise ValueError(f"torch twin: layer '{s['name']}' of type {t} is not supported")
            blobs[s["top"][0]] = y
        return blobs

    inputs = {name: torch.from_numpy(np.load(folder / f"in_{_safe(name)}.npy")) for name in spec["inputs"]}
    return spec, params, run, inputs


def main(argv=None) -> int:
    import argparse
    import torch

    ap = argparse.ArgumentParser(description="time the PyTorch twin of a net written by spec_of")
    ap.add_argument("folder")
    ap.add_argument("--mode", choices=("infer", "train"), default="infer")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    spec, params, run, inputs = build(args.folder)
    folder = Path(args.folder)
    err = {}
    # the fairness check: same outputs (and gradients) as ours
    with torch.no_grad():
        blobs = run(dict(inputs), training=False)
    for name in spec["outputs"]:
        ref = np.load(folder / f"out_{_safe(name)}.npy")
        got = blobs[name].detach().numpy().reshape(ref.shape)
        err[name] = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
    if spec["grads"]:
        blobs = run(dict(inputs), training=False)
        loss = sum(blobs[n].sum() for n in spec["outputs"])
        loss.backward()
        for (i, j), prm in params.items():
            ref = np.load(folder / f"g{i}_{j}.npy")
            if prm.grad is None:
                continue
            err[f"grad {spec['layers'][i]['name']}[{j}]"] = float(
                np.abs(prm.grad.numpy() - ref).max() / max(np.abs(ref).max(), 1e-30))
            prm.grad = None
    times = []
    if args.mode == "infer":
        with torch.inference_mode():
            for r in range(args.warmup + args.repeats):
                t = time.perf_counter()
                run(dict(inputs), training=False)
                if r >= args.warmup:
                    times.append((time.perf_counter() - t) * 1e3)
    else:
        for r in range(args.warmup + args.repeats):
            t = time.perf_counter()
            blobs = run(dict(inputs), training=True)
            loss = sum(blobs[n].sum() for n in spec["outputs"] if blobs[n].requires_grad)
            loss.backward()
            if r >= args.warmup:
                times.append((time.perf_counter() - t) * 1e3)
            for prm in params.values():
                prm.grad = None
    print(json.dumps({"ms": times, "max_rel_err": err, "threads": torch.get_num_threads(),
                      "torch": torch.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Test helpers: random weights and inputs, and the ONNX Runtime vs net.forward() comparison.

Needs onnxruntime (the `test` extra) for `run_onnxruntime` and `compare_with_onnxruntime`.
"""
from __future__ import annotations

import os

import numpy as np

from caffe.onnx.export import to_onnx


def randomize(net, rng, scale: float = 0.5) -> None:
    """Give every parameter blob random values (BatchNorm's variances positive, its factor 1 or more)."""
    for i, layer in enumerate(net.layers):
        for j, blob in enumerate(layer.blobs):
            data = blob.data
            if layer.type == "BatchNorm":
                data[...] = ([rng.normal(0, 1, data.shape), rng.uniform(0.5, 2, data.shape),
                              rng.uniform(1, 3, data.shape)][j])
            else:
                fan_in = max(1, int(np.prod(data.shape[1:]))) if data.ndim > 1 else 1
                data[...] = rng.normal(0, scale, data.shape) / np.sqrt(fan_in) * (2 if data.ndim > 1 else 1)


def random_inputs(net, rng, low: float = -1.0, high: float = 1.0) -> dict:
    return {name: rng.uniform(low, high, net.blobs[name].shape).astype(net.dtype)
            for name in (net.blob_names[i] for i in net.input_blob_indices)}


def run_onnxruntime(model, feeds: dict) -> dict:
    """Run a ModelProto (or a path) in ONNX Runtime on the CPU; {output name: array}."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # tests run beside others; one thread is plenty for small nets
    options.log_severity_level = 3
    data = os.fspath(model) if isinstance(model, (str, os.PathLike)) else model.SerializeToString()
    sess = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def caffe_forward(net, feeds: dict) -> dict:
    for name, value in feeds.items():
        net.blobs[name].reshape(value.shape)
    net.Reshape()
    for name, value in feeds.items():
        net.blobs[name].data[...] = value
    net.Forward()
    return {name: np.array(net.blobs[name].data, copy=True) for name in net.output_blob_names}


def max_relative_error(expected: np.ndarray, got: np.ndarray) -> float:
    """max |got - expected| over max |expected| (1 where expected is all zero): the scale-relative error."""
    expected = np.asarray(expected, np.float64)
    got = np.asarray(got, np.float64)
    if expected.shape != got.shape:
        return float("inf")
    if not expected.size:
        return 0.0
    same_nan = np.isnan(expected) & np.isnan(got)
    diff = np.where(same_nan, 0.0, np.abs(got - expected))
    scale = np.nanmax(np.abs(np.where(np.isfinite(expected), expected, 0.0)))
    return float(np.nanmax(np.where(np.isnan(diff), np.inf, diff)) / (scale if scale > 0 else 1.0))


def compare_with_onnxruntime(net, rng, *, model=None, feeds=None, rtol: float = 1e-4, every_blob: bool = True,
                             **export_kw) -> dict:
    """Export `net`, run it in ONNX Runtime and in Caffe on the same random inputs; assert every output
    agrees within `rtol` relative to its largest magnitude, with the same names and shapes; with
    every_blob, every intermediate blob as well. Returns the ONNX values compared."""
    if model is None:
        model = to_onnx(net, **export_kw)
    feeds = random_inputs(net, rng) if feeds is None else feeds
    got = run_onnxruntime(model, feeds)
    want = caffe_forward(net, feeds)
    assert sorted(got) == sorted(want), f"ONNX outputs {sorted(got)} != net outputs {sorted(want)}"
    if every_blob:  # the intermediate blobs too: each blob's last value is the tensor named after it
        got = run_onnxruntime(with_blob_outputs(net, model), feeds)
        want = {name: np.array(net.blobs[name].data, copy=True) for name in got}
    for name, expected in want.items():
        assert got[name].shape == expected.shape, f"{name}: ONNX shape {got[name].shape} != Caffe {expected.shape}"
        err = max_relative_error(expected, got[name])
        assert err <= rtol, f"blob '{name}': relative error {err:.3g} > {rtol:g}"
    return got


def with_blob_outputs(net, model):
    """A copy of `model` whose outputs are also every net blob computed by a node (under the blob's name)."""
    import onnx
    from onnx import helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    produced = {o for node in m.graph.node for o in node.output}
    have = {o.name for o in m.graph.output}
    elem = m.graph.input[0].type.tensor_type.elem_type if len(m.graph.input) else 1
    for name in net.blob_names:
        if name in produced and name not in have:
            m.graph.output.append(helper.make_tensor_value_info(name, elem, None))
    return m

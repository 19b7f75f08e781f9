"""Test helpers: random weights and inputs, and the ONNX Runtime vs net.forward() comparison.

Needs onnxruntime (the `test` extra) for `run_onnxruntime` and `compare_with_onnxruntime`.
"""
from __future__ import annotations

import os

import numpy as np

from caffe.onnx.exporter import to_onnx


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


def _magnitude(a) -> float:
    a = np.asarray(a, np.float64)
    finite = np.abs(a[np.isfinite(a)])
    return float(finite.max()) if finite.size else 0.0


def max_relative_error(expected: np.ndarray, got: np.ndarray, floor: float = 0.0) -> float:
    """max |got - expected| over max(max |expected|, floor) (1 when both are 0): the scale-relative error.
    NaN matches NaN; inf must match exactly."""
    expected = np.asarray(expected, np.float64)
    got = np.asarray(got, np.float64)
    if expected.shape != got.shape:
        return float("inf")
    if not expected.size:
        return 0.0
    with np.errstate(invalid="ignore"):
        diff = np.abs(got - expected)
    same = (np.isnan(expected) & np.isnan(got)) | (np.isinf(expected) & (expected == got))
    diff = np.where(same, 0.0, diff)
    scale = max(_magnitude(expected), floor)
    return float(np.max(np.where(np.isnan(diff), np.inf, diff)) / (scale if scale > 0 else 1.0))


def compare_with_onnxruntime(net, rng, *, model=None, feeds=None, rtol: float = 1e-4, every_blob: bool = True,
                             **export_kw) -> dict:
    """Export `net`, run it in ONNX Runtime and in Caffe on the same random inputs; assert every output
    agrees within `rtol` relative to its largest magnitude (see operand_floors for blobs that cancel to
    ~0), with the same names and shapes; with
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
    floors = operand_floors(net)
    for name, expected in want.items():
        assert got[name].shape == expected.shape, f"{name}: ONNX shape {got[name].shape} != Caffe {expected.shape}"
        err = max_relative_error(expected, got[name], floors.get(name, 0.0))
        assert err <= rtol, f"blob '{name}': relative error {err:.3g} > {rtol:g}"
    return got


def operand_floors(net, fraction: float = 1e-2) -> dict:
    """Per blob, `fraction` of the largest value among the other bottoms of the layers that write it.

    A blob that cancels to ~0 (a + b with b ~ -a) holds rounding noise of its operands' size, not of
    its own: measured against its own scale, any two correct float implementations differ by 100%.
    So a blob's error is taken relative to at least 1% of its layer's inputs (1e-4 relative then still
    means within ~1e-6 of the operands: a few float32 ulps), and to at least its inputs' own floors."""
    floors = {}
    for bottoms, tops in zip(net.bottom_id_vecs, net.top_id_vecs):
        names = [net.blob_names[b] for b in bottoms if b not in tops]
        # the operands' own noise carries on (a view or a scaling of a cancelled blob is as noisy)
        floor = max([fraction * _magnitude(net.blobs[n].data) for n in names] + [floors.get(n, 0.0) for n in names]
                    + [0.0])
        for t in tops:
            name = net.blob_names[t]
            floors[name] = max(floors.get(name, 0.0), floor)
    return floors


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

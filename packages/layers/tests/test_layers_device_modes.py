"""Layers on the device: CPU/GPU parity on random shapes, and Forward in one mode with Backward in the other.

Caffe keeps every piece of state that Backward needs in Blobs, so a net may run Forward in GPU mode and
Backward in CPU mode (or the reverse) and get what one mode gives. The property below checks it for
every layer that keeps state, with random shapes and values: Forward in mode A and Backward in mode B
must equal Forward and Backward in mode A. Both properties need a device: a real GPU, or the CuPy
stand-in (scripts/test.sh's second run, CAFFE_CUPY_STANDIN=1).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from caffe.blob import context
from caffe.layers.registry import create_layer
from caffe.layers.testing import blobs_from_arrays, empty_tops, gpu_available, layer_param
from caffe.proto import caffe_pb2

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no GPU (CuPy with a CUDA device, or the CuPy stand-in)")]


@dataclass
class Case:
    id: str
    type: str
    text: str
    bottoms: Callable  # (rng, n, c, h, w) -> list of arrays
    n_top: int = 1
    down: list | None = None
    in_place: bool = False
    min_hw: int = 1
    phase: int = caffe_pb2.TRAIN
    marks: list = field(default_factory=list)


def one(rng, n, c, h, w):
    return [rng.normal(size=(n, c, h, w))]


def positive(rng, n, c, h, w):
    return [rng.uniform(0.1, 2.0, size=(n, c, h, w))]


def two(rng, n, c, h, w):
    return [rng.normal(size=(n, c, h, w)), rng.normal(size=(n, c, h, w))]


def labels(rng, n, c, h, w):
    return [rng.normal(size=(n, c, h, w)), rng.integers(0, c, size=(n, 1, h, w)).astype(float)]


def item_labels(rng, n, c, h, w):
    return [rng.normal(size=(n, c, h, w)), rng.integers(0, c * h * w, size=(n,)).astype(float)]


def lstm(rng, n, c, h, w):
    return [rng.normal(size=(1, n, c)), rng.normal(size=(1, n, 4 * c)), (rng.random((1, n)) < 0.7).astype(float)]


def contrastive(rng, n, c, h, w):
    return [rng.normal(size=(n, c * h, 1, 1)), rng.normal(size=(n, c * h, 1, 1)),
            rng.integers(0, 2, size=(n, 1, 1, 1)).astype(float)]


def sigmoid_ce(rng, n, c, h, w):
    return [rng.normal(size=(n, c, h, w)), rng.integers(0, 2, size=(n, c, h, w)).astype(float)]


def infogain(rng, n, c, h, w):
    return [rng.normal(size=(n, c, h, w)), rng.integers(0, c, size=(n, 1, h, w)).astype(float),
            rng.uniform(0, 1, size=(c, c))]


def multinomial(rng, n, c, h, w):
    p = rng.uniform(0.05, 1, size=(n, c, 1, 1))
    return [p / p.sum(axis=1, keepdims=True), rng.integers(0, c, size=(n, 1, 1, 1)).astype(float)]


def reindex(rng, n, c, h, w):
    return [rng.normal(size=(n, c, h, w)), rng.integers(0, n, size=(n + 1,)).astype(float)]


def selector(rng, n, c, h, w):
    sel = (rng.random((n, 1)) < 0.6).astype(float)
    sel[0] = 1  # at least one item passes
    return [rng.normal(size=(n, c, h, w)), sel]


def embed(rng, n, c, h, w):
    return [rng.integers(0, 5, size=(n, c)).astype(float)]


FILLER = "filler { type: 'gaussian' std: 0.5 }"
CASES = [
    # layers that keep state between Forward and Backward
    Case("Dropout", "Dropout", "dropout_param { dropout_ratio: 0.3 }", one),
    Case("Dropout-in-place", "Dropout", "dropout_param { dropout_ratio: 0.3 }", one, in_place=True),
    Case("Eltwise-MAX", "Eltwise", "eltwise_param { operation: MAX }", two),
    Case("Eltwise-PROD", "Eltwise", "eltwise_param { operation: PROD }", two),
    Case("BatchNorm", "BatchNorm", "", one, min_hw=2),
    Case("MVN", "MVN", "", one, min_hw=2),
    Case("MVN-across", "MVN", "mvn_param { across_channels: true }", one),
    Case("MVN-in-place", "MVN", "", one, in_place=True, min_hw=2),
    Case("LSTMUnit", "LSTMUnit", "", lstm, n_top=2, down=[True, True, False]),
    Case("Pooling-MAX", "Pooling", "pooling_param { pool: MAX kernel_size: 2 stride: 1 }", one, min_hw=2),
    Case("Pooling-MAX-strided", "Pooling", "pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 1 }", one),
    Case("Pooling-STOCHASTIC", "Pooling", "pooling_param { pool: STOCHASTIC kernel_size: 2 stride: 1 }", positive,
         min_hw=2),
    Case("Pooling-AVE", "Pooling", "pooling_param { pool: AVE kernel_size: 2 stride: 1 }", one, min_hw=2),
    Case("SPP", "SPP", "spp_param { pyramid_height: 2 }", one, min_hw=2),
    Case("LRN", "LRN", "lrn_param { local_size: 3 alpha: 0.5 }", one),
    Case("LRN-within", "LRN", "lrn_param { local_size: 3 alpha: 0.5 norm_region: WITHIN_CHANNEL }", one),
    # neurons computed in place (Backward needs the input that Forward overwrote)
    Case("ReLU-in-place", "ReLU", "relu_param { negative_slope: 0.1 }", one, in_place=True),
    Case("BNLL-in-place", "BNLL", "", one, in_place=True),
    Case("Clip-in-place", "Clip", "clip_param { min: -0.5 max: 0.5 }", one, in_place=True),
    Case("ELU-in-place", "ELU", "", one, in_place=True),
    Case("Log-in-place", "Log", "", positive, in_place=True),
    Case("Power-in-place", "Power", "power_param { power: 2 scale: 0.5 shift: 1 }", one, in_place=True),
    Case("PReLU-in-place", "PReLU", "", one, in_place=True),
    Case("Scale-in-place", "Scale", f"scale_param {{ bias_term: true {FILLER} }}", one, in_place=True),
    Case("Sigmoid-in-place", "Sigmoid", "", one, in_place=True),
    Case("TanH-in-place", "TanH", "", one, in_place=True),
    Case("Swish", "Swish", "", one),
    Case("Softmax", "Softmax", "", one),
    # losses (their Backward reads what Forward computed)
    Case("SoftmaxWithLoss", "SoftmaxWithLoss", "", labels, n_top=1, down=[True, False]),
    Case("SigmoidCrossEntropyLoss", "SigmoidCrossEntropyLoss", "", sigmoid_ce, down=[True, False]),
    Case("SigmoidCrossEntropyLoss-VALID", "SigmoidCrossEntropyLoss",
         "loss_param { ignore_label: 1 normalization: VALID }", sigmoid_ce, down=[True, False]),
    Case("SoftmaxWithLoss-ignore", "SoftmaxWithLoss", "loss_param { ignore_label: 0 }", labels, down=[True, False]),
    Case("EuclideanLoss", "EuclideanLoss", "", two, down=[True, True]),
    Case("ContrastiveLoss", "ContrastiveLoss", "contrastive_loss_param { margin: 2 }", contrastive,
         down=[True, True, False]),
    Case("InfogainLoss", "InfogainLoss", "", infogain, down=[True, False, False]),
    Case("MultinomialLogisticLoss", "MultinomialLogisticLoss", "", multinomial, down=[True, False]),
    Case("HingeLoss", "HingeLoss", "", item_labels, down=[True, False]),
    Case("HingeLoss-L2", "HingeLoss", "hinge_loss_param { norm: L2 }", item_labels, down=[True, False]),
    # layers with parameters or index bottoms
    Case("Convolution", "Convolution", f"convolution_param {{ num_output: 3 kernel_size: 2 pad: 1 weight_{FILLER} "
                                       f"bias_{FILLER} }}", one),
    Case("Deconvolution", "Deconvolution", f"convolution_param {{ num_output: 2 kernel_size: 2 stride: 2 "
                                           f"weight_{FILLER} }}", one),
    Case("InnerProduct", "InnerProduct", f"inner_product_param {{ num_output: 4 weight_{FILLER} bias_{FILLER} }}", one),
    Case("Embed", "Embed", f"embed_param {{ num_output: 3 input_dim: 5 weight_{FILLER} }}", embed, down=[False]),
    Case("BatchReindex", "BatchReindex", "", reindex, down=[True, False]),
    Case("Bias", "Bias", f"bias_param {{ {FILLER} }}", one),
    Case("Tile", "Tile", "tile_param { axis: 1 tiles: 2 }", one),
    Case("Filter", "Filter", "", selector, down=[True, False]),
    Case("Exp-in-place", "Exp", "exp_param { scale: 0.5 }", one, in_place=True),
    Case("Reduction-SUMSQ", "Reduction", "reduction_param { operation: SUMSQ axis: 1 }", one),
    Case("Im2col", "Im2col", "convolution_param { kernel_size: 2 pad: 1 stride: 2 }", one),
]

# Layer types whose Backward reads nothing that Forward computed except bottoms, tops and parameter blobs (which
# move with the mode), or that have no Backward: Forward in one mode and Backward in the other agree by
# construction. RNN and LSTM (caffe.net.recurrent) keep their state in the blobs of their unrolled net; their
# property lives in packages/net/tests/test_net_recurrent_device_modes.py.
STATELESS = {
    "AbsVal", "Accuracy", "ArgMax", "Clip", "Concat", "Crop", "Data", "DummyData", "ELU", "Flatten", "HDF5Data",
    "HDF5Output", "ImageData", "Input", "MemoryData", "Parameter", "Python", "Reshape", "Silence", "Slice",
    "Split", "Threshold", "WindowData",
}
ELSEWHERE = {"RNN", "LSTM"}

SHAPES = st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 5), st.integers(1, 5), st.integers(0, 2**31))


def test_every_layer_type_is_covered():
    from caffe.layers.registry import layer_type_list
    covered = {c.type for c in CASES} | STATELESS | ELSEWHERE
    missing = sorted(set(layer_type_list()) - covered)
    assert not missing, (f"layer types neither in CASES nor declared stateless: {missing}; add a Case (Forward in "
                         f"one mode, Backward in the other) or, if its Backward reads no forward state, STATELESS")


def run(case: Case, arrays, fwd: int, bwd: int, dtype, seed: int = 1701):
    """Forward in mode `fwd`, Backward in mode `bwd`; tops, checked bottom diffs and parameter diffs."""
    try:
        context.set_mode(fwd)
        context.set_random_seed(seed)
        layer = create_layer(layer_param(case.type, case.text, phase=case.phase))
        bottom = blobs_from_arrays(arrays, dtype)
        top = [bottom[0]] if case.in_place else empty_tops(case.n_top, dtype)
        layer.SetUp(bottom, top)
        layer.Forward(bottom, top)
        tops = [t.data.copy() for t in top]
        diff_rng = np.random.default_rng(seed)
        for t in top:
            t.diff[...] = diff_rng.normal(size=t.shape)
        for p in layer.blobs:
            p.diff[...] = 0
        down = case.down or [True] * len(bottom)
        context.set_mode(bwd)
        layer.Backward(top, down, bottom)
        diffs = [b.diff.copy() for b, d in zip(bottom, down) if d] + [p.diff.copy() for p in layer.blobs]
        return tops, diffs
    finally:
        context.set_mode_cpu()


def draw_arrays(case: Case, shape):
    n, c, h, w, seed = shape
    h, w = max(h, case.min_hw), max(w, case.min_hw)
    return case.bottoms(np.random.default_rng(seed), n, c, h, w)


def params(cases):
    return [pytest.param(case, id=case.id, marks=list(case.marks)) for case in cases]


@pytest.mark.parametrize("case", params(CASES))
@settings(max_examples=8)
@given(shape=SHAPES)
def test_cpu_gpu_parity_on_random_shapes(case, shape):
    arrays = draw_arrays(case, shape)
    (ct, cd), (gt, gd) = (run(case, arrays, m, m, np.float32) for m in (context.CPU, context.GPU))
    for a, b in zip(ct + cd, gt + gd):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", params(CASES))
@settings(max_examples=8)
@given(shape=SHAPES, modes=st.sampled_from([(context.CPU, context.GPU), (context.GPU, context.CPU)]))
def test_forward_and_backward_in_different_modes_equal_one_mode(case, shape, modes):
    arrays = draw_arrays(case, shape)
    fwd, bwd = modes
    ref_tops, ref = run(case, arrays, fwd, fwd, np.float64)
    tops, got = run(case, arrays, fwd, bwd, np.float64)
    # one assertion site, so that a defect whose wrong values vary (an uninitialised buffer) always fails alike
    bad = [i for i, (a, b) in enumerate(zip(ref_tops + ref, tops + got))
           if a.shape != b.shape or not np.allclose(b, a, rtol=1e-6, atol=1e-9)]
    assert not bad, f"outputs {bad} (tops first, then bottom and parameter diffs) differ from one mode's"

"""SoftmaxWithLoss: normalization modes, ignore_label, any axis, second top, gradients, bad input."""
import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from caffe.layers import LayerError
from caffe.layers.strategies import random_array, seeds, shapes
from caffe.layers.testing import blobs_from_arrays, check_layer_gradient, empty_tops, make_layer, run_forward

MODES = ["FULL", "VALID", "BATCH_SIZE", "NONE"]


def loss_text(axis=1, normalization=None, ignore=None, normalize=None):
    lp = []
    if normalization is not None:
        lp.append(f"normalization: {normalization}")
    if ignore is not None:
        lp.append(f"ignore_label: {ignore}")
    if normalize is not None:
        lp.append(f"normalize: {str(normalize).lower()}")
    return f"softmax_param {{ axis: {axis} }} loss_param {{ {' '.join(lp)} }}"


def reference(x, labels, axis, mode, ignore):
    """Caffe's loss: -sum log p[label] over non-ignored positions / max(1, normalizer)."""
    outer = int(np.prod(x.shape[:axis]))
    inner = int(np.prod(x.shape[axis + 1:]))
    c = x.shape[axis]
    x3 = x.reshape(outer, c, inner)
    p = np.exp(x3 - x3.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    lab = labels.reshape(outer, inner).astype(int)
    loss, valid = 0.0, 0
    for i in range(outer):
        for j in range(inner):
            if ignore is not None and lab[i, j] == ignore:
                continue
            loss -= np.log(max(p[i, lab[i, j], j], np.finfo(np.float32).tiny))
            valid += 1
    norm = {"FULL": outer * inner, "VALID": valid, "BATCH_SIZE": outer, "NONE": 1}[mode]
    return loss / max(1.0, norm)


@st.composite
def problems(draw, max_side=3):
    shape = draw(shapes(min_dims=2, max_dims=4, max_side=max_side))
    axis = draw(st.integers(1, len(shape) - 1))  # LossLayer needs labels' first dim == data's first dim
    seed = draw(seeds())
    x = random_array(seed, shape, -3, 3)
    label_shape = shape[:axis] + shape[axis + 1:]
    rng = np.random.default_rng(seed + 1)
    labels = rng.integers(0, shape[axis], size=label_shape).astype(float)
    ignore = draw(st.sampled_from([None, 0, shape[axis] - 1, -1]))
    if ignore is not None and labels.size:
        labels.flat[rng.integers(0, labels.size)] = ignore  # at least one ignored position
    return x, labels, axis, ignore


_SPATIAL = np.random.default_rng(7).uniform(-3, 3, (2, 3, 2, 2))
_SPATIAL_LABELS = np.array([[[0.0, 2.0], [1.0, 1.0]], [[2.0, 0.0], [0.0, 1.0]]])


# VALID without an ignore_label normalizes by every position (outer x inner), as FULL does
@given(problem=problems(max_side=4), mode=st.sampled_from(MODES))
@example(problem=(_SPATIAL, _SPATIAL_LABELS, 1, None), mode="VALID")
@example(problem=(_SPATIAL, np.where(_SPATIAL_LABELS == 2, 255.0, _SPATIAL_LABELS), 1, 255), mode="VALID")
def test_softmax_loss_forward_matches_reference(problem, mode):
    x, labels, axis, ignore = problem
    layer = make_layer("SoftmaxWithLoss", loss_text(axis, mode, ignore))
    _, top = run_forward(layer, [x, labels], n_top=2)
    np.testing.assert_allclose(top[0].data, reference(x, labels, axis, mode, ignore), rtol=1e-12)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    np.testing.assert_allclose(top[1].data, e / e.sum(axis=axis, keepdims=True), rtol=1e-12)


@given(problem=problems(), mode=st.sampled_from(MODES))
def test_softmax_loss_gradient(problem, mode):
    x, labels, axis, ignore = problem
    layer = make_layer("SoftmaxWithLoss", loss_text(axis, mode, ignore))
    check_layer_gradient(layer, [x, labels], mode="exhaustive", check_bottom=0, stepsize=1e-4, threshold=1e-6)


# -- a hand-computed example ------------------------------------------------------------------

# outer 2, C = 3, inner 2; logits are logs of counts, so the probabilities are exact fractions.
_COUNTS = np.array([[[1, 1], [1, 2], [2, 1]],
                    [[1, 3], [1, 1], [1, 4]]], dtype=float)
_X = np.log(_COUNTS)
_LABELS = np.array([[2, 0], [-1, 1]], dtype=float)  # position (1, 0) is ignored
# p[label]: 2/4, 1/4, (ignored), 1/8  ->  -sum log = ln 2 + ln 4 + ln 8 = 6 ln 2 over 3 valid of 4.
_SUM = 6 * np.log(2)


@pytest.mark.parametrize("text, expect", [
    ("normalization: FULL", _SUM / 4),
    ("normalization: VALID", _SUM / 3),
    ("", _SUM / 3),                       # default VALID
    ("normalization: BATCH_SIZE", _SUM / 2),
    ("normalization: NONE", _SUM),
    ("normalize: true", _SUM / 3),        # legacy: VALID
    ("normalize: false", _SUM / 2),       # legacy: BATCH_SIZE
    ("normalize: false normalization: FULL", _SUM / 4),  # an explicit normalization wins
])
def test_softmax_loss_hand_computed_normalization(text, expect):
    layer = make_layer("SoftmaxWithLoss", f"loss_param {{ ignore_label: -1 {text} }}")
    bottom, top = run_forward(layer, [_X, _LABELS])
    np.testing.assert_allclose(top[0].data, expect, rtol=1e-14)
    top[0].diff[...] = 1.0  # Forward does not touch it; the loss weight preset it to 1
    layer.Backward(top, [True, False], bottom)
    norm = _SUM / expect
    p = _COUNTS / _COUNTS.sum(axis=1, keepdims=True)
    g = bottom[0].diff
    np.testing.assert_allclose(g[0, :, 0], (p[0, :, 0] - [0, 0, 1]) / norm, rtol=1e-14)
    np.testing.assert_allclose(g[0, :, 1], (p[0, :, 1] - [1, 0, 0]) / norm, rtol=1e-14)
    np.testing.assert_array_equal(g[1, :, 0], 0)  # ignored: no gradient
    np.testing.assert_allclose(g[1, :, 1], (p[1, :, 1] - [0, 1, 0]) / norm, rtol=1e-14)


def test_softmax_loss_all_ignored_is_zero_not_nan():
    layer = make_layer("SoftmaxWithLoss", "loss_param { ignore_label: 5 }")
    bottom, top = run_forward(layer, [np.zeros((2, 3)), np.array([5.0, 5.0])])
    assert top[0].data == 0
    layer.Backward(top, [True, False], bottom)
    np.testing.assert_array_equal(bottom[0].diff, 0)


def test_softmax_loss_weight_scales_loss_and_gradient():
    x = np.random.default_rng(0).uniform(-1, 1, (4, 3))
    labels = np.array([0.0, 2.0, 1.0, 1.0])
    plain = make_layer("SoftmaxWithLoss")
    b1, t1 = run_forward(plain, [x, labels])
    plain.Backward(t1, [True, False], b1)
    weighted = make_layer("SoftmaxWithLoss", "loss_weight: 2.5")
    b2 = blobs_from_arrays([x, labels])
    t2 = empty_tops(1)
    weighted.SetUp(b2, t2)
    loss = weighted.Forward(b2, t2)
    np.testing.assert_allclose(loss, 2.5 * float(t1[0].data), rtol=1e-14)
    weighted.Backward(t2, [True, False], b2)
    np.testing.assert_allclose(b2[0].diff, 2.5 * b1[0].diff, rtol=1e-14)


def test_softmax_loss_second_top_has_zero_loss_weight_by_default():
    layer = make_layer("SoftmaxWithLoss")
    bottom = blobs_from_arrays([np.zeros((2, 3)), np.array([0.0, 1.0])])
    top = empty_tops(2)
    layer.SetUp(bottom, top)
    assert layer.loss(0) == 1 and layer.loss(1) == 0
    assert np.isclose(layer.Forward(bottom, top), np.log(3))


# -- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [3.0, -1.0, 7.0])
def test_softmax_loss_label_out_of_range(bad):
    layer = make_layer("SoftmaxWithLoss", name="loss")
    with pytest.raises(LayerError, match=rf"'loss' \(SoftmaxWithLoss\): label value {bad:g} is out of range.*\[0, 3\)"):
        run_forward(layer, [np.zeros((2, 3)), np.array([0.0, bad])])


def test_softmax_loss_out_of_range_message_names_the_ignore_label():
    layer = make_layer("SoftmaxWithLoss", "loss_param { ignore_label: 255 }")
    with pytest.raises(LayerError, match=r"label value 4 is out of range: labels must be integers in \[0, 3\) or "
                                         r"the ignore_label 255$"):
        run_forward(layer, [np.zeros((2, 3)), np.array([255.0, 4.0])])


def test_softmax_loss_label_count_mismatch():
    layer = make_layer("SoftmaxWithLoss", name="loss")
    with pytest.raises(LayerError, match=r"number of labels must match.*needs 8 labels.*holds 2"):
        run_forward(layer, [np.zeros((2, 3, 4)), np.zeros((2, 1))])


def test_softmax_loss_refuses_label_gradient_and_three_tops():
    layer = make_layer("SoftmaxWithLoss", name="loss")
    bottom, top = run_forward(layer, [np.zeros((2, 3)), np.array([0.0, 1.0])])
    with pytest.raises(LayerError, match="cannot backpropagate to label"):
        layer.Backward(top, [True, True], bottom)
    assert not layer.allow_force_backward(1) and layer.allow_force_backward(0)
    with pytest.raises(LayerError, match="at most 2 top"):
        make_layer("SoftmaxWithLoss").SetUp(blobs_from_arrays([np.zeros((2, 3)), np.zeros(2)]), empty_tops(3))

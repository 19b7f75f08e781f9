"""EuclideanLoss, SigmoidCrossEntropyLoss and ContrastiveLoss."""
import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from caffe.layers import LayerError
from caffe.layers.strategies import random_array, seeds, shapes
from caffe.layers.testing import blobs_from_arrays, check_layer_gradient, empty_tops, make_layer, run_forward

# -- EuclideanLoss -------------------------------------------------------------------------------


@given(shape=shapes(min_dims=1, max_dims=4, max_side=3), seed=seeds(), flat_label=st.booleans())
def test_euclidean_forward_and_gradient_to_both_bottoms(shape, seed, flat_label):
    a = random_array(seed, shape)
    b = random_array(seed + 1, shape)
    if flat_label:
        b = b.reshape(shape[0], -1)  # same count(1), another layout: allowed as in Caffe
    _, top = run_forward(make_layer("EuclideanLoss"), [a, b])
    np.testing.assert_allclose(top[0].data, ((a - b.reshape(shape)) ** 2).sum() / shape[0] / 2, rtol=1e-12)
    check_layer_gradient(make_layer("EuclideanLoss"), [a, b], mode="exhaustive", stepsize=1e-4, threshold=1e-6)


def test_euclidean_gradient_signs_and_loss_weight():
    a, b = np.array([[1.0, 2.0], [3.0, 5.0]]), np.array([[0.0, 2.0], [4.0, 1.0]])
    layer = make_layer("EuclideanLoss", "loss_weight: 3")
    bottom = blobs_from_arrays([a, b])
    top = empty_tops(1)
    layer.SetUp(bottom, top)
    assert layer.Forward(bottom, top) == pytest.approx(3 * (1 + 1 + 16) / 2 / 2)
    layer.Backward(top, [True, True], bottom)
    np.testing.assert_allclose(bottom[0].diff, 3 * (a - b) / 2)
    np.testing.assert_allclose(bottom[1].diff, -3 * (a - b) / 2)
    assert layer.allow_force_backward(0) and layer.allow_force_backward(1)


def test_euclidean_rejects_different_counts():
    with pytest.raises(LayerError, match=r"'l2' \(EuclideanLoss\): inputs must have the same dimension.*\(2, 3\).*\(2, 4\)"):
        run_forward(make_layer("EuclideanLoss", name="l2"), [np.zeros((2, 3)), np.zeros((2, 4))])
    with pytest.raises(LayerError, match="same first dimension"):
        run_forward(make_layer("EuclideanLoss"), [np.zeros((2, 3)), np.zeros((3, 2))])


# -- SigmoidCrossEntropyLoss -----------------------------------------------------------------------

def sce_reference(x, t, mode, ignore):
    s = 1 / (1 + np.exp(-x))
    elem = -(t * np.log(s) + (1 - t) * np.log(1 - s))
    valid = np.ones(x.shape, bool) if ignore is None else t.astype(int) != ignore
    outer = x.shape[0]
    norm = {"FULL": x.size, "VALID": valid.sum(), "BATCH_SIZE": outer, "NONE": 1}[mode]
    return elem[valid].sum() / max(1.0, norm)


@given(shape=shapes(min_dims=1, max_dims=4, max_side=3), seed=seeds(),
       mode=st.sampled_from([None, "FULL", "VALID", "BATCH_SIZE", "NONE"]), ignore=st.sampled_from([None, -1]))
@example(shape=(3, 4), seed=5, mode="VALID", ignore=-1)  # ignored positions: no loss, no gradient
@example(shape=(2, 2, 3), seed=6, mode=None, ignore=-1)
def test_sigmoid_cross_entropy_forward_and_gradient(shape, seed, mode, ignore):
    x = random_array(seed, shape, -4, 4)
    rng = np.random.default_rng(seed)
    if ignore is None:
        t = rng.uniform(0, 1, shape)  # soft targets
    else:
        t = rng.integers(-1, 2, shape).astype(float)  # 0/1 targets and ignored (-1) positions
    lp = " ".join(([f"normalization: {mode}"] if mode else []) + ([f"ignore_label: {ignore}"] if ignore is not None else []))
    text = f"loss_param {{ {lp} }}"
    _, top = run_forward(make_layer("SigmoidCrossEntropyLoss", text), [x, t])
    np.testing.assert_allclose(top[0].data, sce_reference(x, t, mode or "BATCH_SIZE", ignore), rtol=1e-10)
    check_layer_gradient(make_layer("SigmoidCrossEntropyLoss", text), [x, t], mode="exhaustive",
                         check_bottom=0, stepsize=1e-4, threshold=1e-6)


@pytest.mark.parametrize("text, norm", [("", 2), ("normalize: true", 5), ("normalize: false", 2),
                                        ("normalization: FULL", 6), ("normalize: true normalization: NONE", 1)])
def test_sigmoid_cross_entropy_default_is_batch_size_and_legacy_normalize(text, norm):
    x = np.zeros((2, 3))
    t = np.array([[1.0, 0.0, 1.0], [0.0, 9.0, 1.0]])  # one target ignored (9)
    _, top = run_forward(make_layer("SigmoidCrossEntropyLoss", f"loss_param {{ ignore_label: 9 {text} }}"), [x, t])
    np.testing.assert_allclose(top[0].data, 5 * np.log(2) / norm, rtol=1e-14)


def test_sigmoid_cross_entropy_is_stable_for_large_inputs():
    x = np.array([[800.0, -800.0, 800.0, -800.0]])
    t = np.array([[1.0, 0.0, 0.0, 1.0]])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        layer = make_layer("SigmoidCrossEntropyLoss")
        bottom, top = run_forward(layer, [x, t])
        layer.Backward(top, [True, False], bottom)
    np.testing.assert_allclose(top[0].data, 1600.0)
    np.testing.assert_allclose(bottom[0].diff, [[0.0, 0.0, 1.0, -1.0]])


def test_sigmoid_cross_entropy_compares_the_integer_part_of_targets_with_ignore_label():
    # Caffe: static_cast<int>(target) == ignore_label, so with ignore_label 0 a soft target of 0.5 is ignored
    x = np.array([[0.3, -1.2, 2.0]])
    t = np.array([[0.5, 1.0, 0.0]])
    _, top = run_forward(make_layer("SigmoidCrossEntropyLoss", "loss_param { ignore_label: 0 normalization: NONE }"),
                         [x, t])
    np.testing.assert_allclose(top[0].data, np.log1p(np.exp(1.2)), rtol=1e-12)  # only the target 1.0 counts


def test_sigmoid_cross_entropy_bad_input():
    with pytest.raises(LayerError, match=r"'sce' \(SigmoidCrossEntropyLoss\): inputs must have the same count"):
        run_forward(make_layer("SigmoidCrossEntropyLoss", name="sce"), [np.zeros((2, 3)), np.zeros((2, 2))])
    layer = make_layer("SigmoidCrossEntropyLoss")
    bottom, top = run_forward(layer, [np.zeros((2, 3)), np.zeros((2, 3))])
    with pytest.raises(LayerError, match="cannot backpropagate to label"):
        layer.Backward(top, [True, True], bottom)


# -- ContrastiveLoss ------------------------------------------------------------------------------

def contrastive_reference(a, b, y, margin, legacy):
    d2 = ((a - b) ** 2).sum(axis=1)
    sim = y.astype(int) != 0
    dis = np.maximum(margin - d2, 0) if legacy else np.maximum(margin - np.sqrt(d2), 0) ** 2
    return np.where(sim, d2, dis).sum() / a.shape[0] / 2


def contrastive_pairs(seed, n, c, margin, legacy):
    """Pairs away from the non-differentiable points (distance 0, distance at the margin)."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (n, c))
    b = rng.uniform(-1, 1, (n, c))
    for i in range(n):
        while True:
            d2 = ((a[i] - b[i]) ** 2).sum()
            hinge = margin - d2 if legacy else margin - np.sqrt(d2)
            if d2 > 0.04 and abs(hinge) > 0.05:
                break
            b[i] = rng.uniform(-1, 1, c)
    y = rng.integers(0, 2, n).astype(float)
    return a, b, y


@given(seed=seeds(), n=st.integers(1, 5), c=st.integers(1, 4), margin=st.sampled_from([1.0, 0.5, 2.0]),
       legacy=st.booleans(), four_d=st.booleans())
def test_contrastive_forward_and_gradient(seed, n, c, margin, legacy, four_d):
    a, b, y = contrastive_pairs(seed, n, c, margin, legacy)
    text = f"contrastive_loss_param {{ margin: {margin} legacy_version: {str(legacy).lower()} }}"
    shape = (n, c, 1, 1) if four_d else (n, c)
    bottoms = [a.reshape(shape), b.reshape(shape), y.reshape((n, 1, 1, 1) if four_d else (n,))]
    _, top = run_forward(make_layer("ContrastiveLoss", text), bottoms)
    np.testing.assert_allclose(top[0].data, contrastive_reference(a, b, y, margin, legacy), rtol=1e-12)
    # Caffe's non-legacy gradient divides by (distance + 1e-4): a relative error of at most 1e-4 / 0.2.
    for i in (0, 1):
        check_layer_gradient(make_layer("ContrastiveLoss", text), bottoms, mode="exhaustive",
                             check_bottom=i, stepsize=1e-4, threshold=1e-3 if not legacy else 1e-6)


def test_contrastive_hand_computed():
    a = np.array([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    b = np.array([[3.0, 4.0], [0.3, 0.4], [0.6, 0.8]])  # distances 5, 0.5, 1
    y = np.array([1.0, 0.0, 0.0])
    _, top = run_forward(make_layer("ContrastiveLoss", "contrastive_loss_param { margin: 2 }"), [a, b, y])
    np.testing.assert_allclose(top[0].data, (25 + 1.5 ** 2 + 1.0 ** 2) / 3 / 2)
    _, top = run_forward(make_layer("ContrastiveLoss", "contrastive_loss_param { margin: 2 legacy_version: true }"),
                         [a, b, y])
    np.testing.assert_allclose(top[0].data, (25 + 1.75 + 1.0) / 3 / 2)


def test_contrastive_similarity_and_gradient_follow_caffe():
    # the similarity label is static_cast<int>: 0.5 means dissimilar
    a, b = np.array([[0.0, 0.0]]), np.array([[0.3, 0.4]])  # distance 0.5
    _, top = run_forward(make_layer("ContrastiveLoss", "contrastive_loss_param { margin: 2 }"), [a, b, np.array([0.5])])
    np.testing.assert_allclose(top[0].data, 1.5 ** 2 / 2)
    # non-legacy dissimilar gradient: -(margin - d) / (d + 1e-4) * (a - b) / N, Caffe's epsilon pinned where it
    # matters (a small distance)
    a, b = np.array([[0.0, 0.0]]), np.array([[3e-4, 4e-4]])  # distance 5e-4
    layer = make_layer("ContrastiveLoss", "contrastive_loss_param { margin: 1 }")
    bottom, top = run_forward(layer, [a, b, np.array([0.0])])
    top[0].diff[...] = 1
    layer.Backward(top, [True, True, False], bottom)
    d = 5e-4
    np.testing.assert_allclose(bottom[0].diff, -(1 - d) / (d + 1e-4) * (a - b), rtol=1e-10)
    with pytest.raises(LayerError, match=r"bottom\[2\] \(similarity\) must be \(N, 1, 1, 1\)"):
        run_forward(make_layer("ContrastiveLoss"), [np.zeros((2, 3)), np.zeros((2, 3)), np.zeros(3)])


def test_contrastive_bad_input():
    layer = make_layer("ContrastiveLoss", name="c")
    with pytest.raises(LayerError, match=r"'c' \(ContrastiveLoss\): bottom\[0\] and bottom\[1\] must have the same channels"):
        run_forward(layer, [np.zeros((2, 3)), np.zeros((2, 4)), np.zeros(2)])
    with pytest.raises(LayerError, match=r"bottom\[2\] \(similarity\) must be \(N, 1, 1, 1\)"):
        run_forward(make_layer("ContrastiveLoss"), [np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((2, 2))])
    with pytest.raises(LayerError, match=r"bottom\[0\] must be \(N, C, 1, 1\)"):
        run_forward(make_layer("ContrastiveLoss"), [np.zeros((2, 3, 2)), np.zeros((2, 3, 2)), np.zeros(2)])
    with pytest.raises(LayerError, match="exactly 3 bottom"):
        run_forward(make_layer("ContrastiveLoss"), [np.zeros((2, 3)), np.zeros((2, 3))])
    layer = make_layer("ContrastiveLoss")
    bottom, top = run_forward(layer, [np.ones((2, 3)), np.zeros((2, 3)), np.ones(2)])
    with pytest.raises(LayerError, match=r"cannot backpropagate to the similarity label"):
        layer.Backward(top, [True, True, True], bottom)
    assert layer.allow_force_backward(1) and not layer.allow_force_backward(2)

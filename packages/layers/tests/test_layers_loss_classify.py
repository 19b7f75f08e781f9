"""MultinomialLogisticLoss, InfogainLoss and HingeLoss."""
import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from caffe.blob.proto_io import array_to_blob_proto
from caffe.layers import LayerError
from caffe.layers.strategies import random_array, seeds, shapes
from caffe.layers.testing import check_layer_gradient, make_layer, run_forward

# -- MultinomialLogisticLoss ------------------------------------------------------------------------


@given(seed=seeds(), n=st.integers(1, 4), c=st.integers(1, 5), spatial=st.booleans())
def test_multinomial_logistic_forward_and_gradient(seed, n, c, spatial):
    rng = np.random.default_rng(seed)
    shape = (n, c, 2, 1) if spatial else (n, c)  # dim = count / num: extra axes just widen the row
    p = rng.uniform(0.05, 1.0, shape)
    dim = p.size // n
    labels = rng.integers(0, dim, n).astype(float)
    _, top = run_forward(make_layer("MultinomialLogisticLoss"), [p, labels])
    rows = p.reshape(n, dim)
    np.testing.assert_allclose(top[0].data, -np.log(rows[np.arange(n), labels.astype(int)]).mean(), rtol=1e-12)
    check_layer_gradient(make_layer("MultinomialLogisticLoss"), [p, labels.reshape(n, 1, 1, 1)],
                         mode="exhaustive", check_bottom=0, stepsize=1e-5, threshold=1e-5)


def test_multinomial_logistic_clamps_zero_probability():
    p = np.array([[0.0, 1.0], [0.5, 0.5]])
    layer = make_layer("MultinomialLogisticLoss")
    bottom, top = run_forward(layer, [p, np.array([0.0, 1.0])])
    np.testing.assert_allclose(top[0].data, (-np.log(1e-20) - np.log(0.5)) / 2)
    layer.Backward(top, [True, False], bottom)
    np.testing.assert_allclose(bottom[0].diff, [[-0.5 / 1e-20, 0.0], [0.0, -1.0]])


def test_multinomial_logistic_bad_input():
    with pytest.raises(LayerError, match=r"'m' \(MultinomialLogisticLoss\): label value 2 is out of range"):
        run_forward(make_layer("MultinomialLogisticLoss", name="m"), [np.full((2, 2), 0.5), np.array([0.0, 2.0])])
    with pytest.raises(LayerError, match="one label per item"):
        run_forward(make_layer("MultinomialLogisticLoss"), [np.full((2, 2), 0.5), np.zeros((2, 2))])
    layer = make_layer("MultinomialLogisticLoss")
    bottom, top = run_forward(layer, [np.full((2, 2), 0.5), np.zeros(2)])
    with pytest.raises(LayerError, match="cannot backpropagate to label"):
        layer.Backward(top, [True, True], bottom)


# -- InfogainLoss --------------------------------------------------------------------------------------

def infogain_reference(x, labels, h, axis, mode, ignore):
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
            for k in range(c):
                loss -= h[lab[i, j], k] * np.log(max(p[i, k, j], 1e-20))
            valid += 1
    norm = {"FULL": outer * inner, "VALID": valid, "BATCH_SIZE": outer, "NONE": 1}[mode]
    return loss / max(1.0, norm)


@st.composite
def infogain_problems(draw):
    shape = draw(shapes(min_dims=2, max_dims=3, max_side=3))
    axis = draw(st.integers(1, len(shape) - 1))
    seed = draw(seeds())
    rng = np.random.default_rng(seed)
    c = shape[axis]
    x = rng.uniform(-2, 2, shape)
    labels = rng.integers(0, c, shape[:axis] + shape[axis + 1:]).astype(float)
    ignore = draw(st.sampled_from([None, 0]))
    h = rng.uniform(0, 1, (c, c))
    mode = draw(st.sampled_from(["FULL", "VALID", "BATCH_SIZE", "NONE"]))
    return x, labels, h, axis, mode, ignore


def infogain_text(axis, mode, ignore=None, source=None):
    ip = f"axis: {axis}" + (f" source: '{source}'" if source else "")
    lp = f"normalization: {mode}" + (f" ignore_label: {ignore}" if ignore is not None else "")
    return f"infogain_loss_param {{ {ip} }} loss_param {{ {lp} }}"


@given(problem=infogain_problems())
@example(problem=(np.random.default_rng(3).uniform(-2, 2, (3, 3, 2)), np.array([[0.0, 2.0], [1.0, 0.0], [2.0, 2.0]]),
                  np.random.default_rng(4).uniform(0, 1, (3, 3)), 1, "VALID", 0))  # ignored positions: no gradient
def test_infogain_forward_and_gradient_with_h_as_bottom(problem):
    x, labels, h, axis, mode, ignore = problem
    text = infogain_text(axis, mode, ignore)
    _, top = run_forward(make_layer("InfogainLoss", text), [x, labels, h], n_top=2)
    np.testing.assert_allclose(top[0].data, infogain_reference(x, labels, h, axis, mode, ignore), rtol=1e-12)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    np.testing.assert_allclose(top[1].data, e / e.sum(axis=axis, keepdims=True), rtol=1e-12)
    check_layer_gradient(make_layer("InfogainLoss", text), [x, labels, h], mode="exhaustive", check_bottom=0,
                         stepsize=1e-4, threshold=1e-6)


def test_infogain_with_identity_h_equals_softmax_loss():
    x = np.random.default_rng(0).uniform(-2, 2, (3, 4, 2))
    labels = np.array([[0.0, 3.0], [2.0, 1.0], [1.0, 1.0]])
    _, t1 = run_forward(make_layer("InfogainLoss"), [x, labels, np.eye(4)])
    _, t2 = run_forward(make_layer("SoftmaxWithLoss"), [x, labels])
    np.testing.assert_allclose(t1[0].data, t2[0].data, rtol=1e-14)


@pytest.mark.parametrize("legacy_4d", [False, True])
def test_infogain_reads_h_from_source(tmp_path, legacy_4d):
    rng = np.random.default_rng(1)
    h = rng.uniform(0, 2, (3, 3)).astype(np.float32)
    path = tmp_path / "H.binaryproto"
    path.write_bytes(array_to_blob_proto(h.reshape(1, 1, 3, 3) if legacy_4d else h).SerializeToString())
    x = rng.uniform(-1, 1, (4, 3))
    labels = np.array([0.0, 2.0, 1.0, 2.0])
    layer = make_layer("InfogainLoss", f"infogain_loss_param {{ source: '{path}' }}")
    bottom, top = run_forward(layer, [x, labels])
    _, top_b = run_forward(make_layer("InfogainLoss"), [x, labels, h.astype(np.float64)])
    np.testing.assert_allclose(top[0].data, top_b[0].data, rtol=1e-14)
    check_layer_gradient(make_layer("InfogainLoss", f"infogain_loss_param {{ source: '{path}' }}"), [x, labels],
                         mode="exhaustive", check_bottom=0, stepsize=1e-4, threshold=1e-6)


def test_infogain_bad_input(tmp_path):
    x, labels = np.zeros((2, 3)), np.array([0.0, 1.0])
    with pytest.raises(LayerError, match=r"'ig' \(InfogainLoss\): the infogain matrix source must be specified"):
        run_forward(make_layer("InfogainLoss", name="ig"), [x, labels])
    missing = tmp_path / "nope.binaryproto"
    with pytest.raises(LayerError, match=r"cannot read infogain_param.source .*nope.binaryproto"):
        run_forward(make_layer("InfogainLoss", f"infogain_loss_param {{ source: '{missing}' }}"), [x, labels])
    garbage = tmp_path / "garbage.binaryproto"
    garbage.write_bytes(b"\xff\xff\xff\xff")
    with pytest.raises(LayerError, match="is not a valid BlobProto"):
        run_forward(make_layer("InfogainLoss", f"infogain_loss_param {{ source: '{garbage}' }}"), [x, labels])
    small = tmp_path / "small.binaryproto"
    small.write_bytes(array_to_blob_proto(np.eye(2, dtype=np.float32)).SerializeToString())
    with pytest.raises(LayerError, match=r"infogain matrix \(infogain_param.source '.*small.binaryproto', shape "
                                         r"\(2, 2\)\) must be 3 x 3"):
        run_forward(make_layer("InfogainLoss", f"infogain_loss_param {{ source: '{small}' }}"), [x, labels])
    with pytest.raises(LayerError, match=r"infogain matrix \(bottom\[2\], shape \(2, 2\)\) must be 3 x 3"):
        run_forward(make_layer("InfogainLoss"), [x, labels, np.eye(2)])
    with pytest.raises(LayerError, match="label value 3 is out of range"):
        run_forward(make_layer("InfogainLoss"), [x, np.array([0.0, 3.0]), np.eye(3)])
    with pytest.raises(LayerError, match="number of labels must match"):
        run_forward(make_layer("InfogainLoss"), [np.zeros((2, 3, 2)), labels, np.eye(3)])
    layer = make_layer("InfogainLoss")
    bottom, top = run_forward(layer, [x, labels, np.eye(3)])
    with pytest.raises(LayerError, match="cannot backpropagate to the infogain matrix"):
        layer.Backward(top, [True, False, True], bottom)
    assert layer.allow_force_backward(0) and not layer.allow_force_backward(2)


# -- HingeLoss ------------------------------------------------------------------------------------------

def hinge_reference(x, labels, l2):
    n = x.shape[0]
    rows = x.reshape(n, -1).copy()
    rows[np.arange(n), labels.astype(int)] *= -1
    m = np.maximum(0, 1 + rows)
    return (m ** 2 if l2 else m).sum() / n


@given(shape=shapes(min_dims=2, max_dims=3, max_side=4), seed=seeds(), l2=st.booleans())
def test_hinge_forward_and_gradient(shape, seed, l2):
    x = random_array(seed, shape, -2, 2)
    dim = x.size // shape[0]
    labels = np.random.default_rng(seed).integers(0, dim, shape[0]).astype(float)
    text = f"hinge_loss_param {{ norm: {'L2' if l2 else 'L1'} }}"
    _, top = run_forward(make_layer("HingeLoss", text), [x, labels])
    np.testing.assert_allclose(top[0].data, hinge_reference(x, labels, l2), rtol=1e-12)
    # The hinge kinks at 1 + t = 0, i.e. |x| = 1: the checker skips values within 2e-3 of it.
    check_layer_gradient(make_layer("HingeLoss", text), [x, labels], mode="exhaustive", check_bottom=0,
                         stepsize=1e-4, threshold=1e-6, kink=1.0, kink_range=2e-3)


def test_hinge_hand_computed():
    x = np.array([[2.0, -0.5, 0.5], [0.0, 3.0, -2.0]])
    labels = np.array([0.0, 2.0])
    # t = [[-2, -0.5, 0.5], [0, 3, 2]] -> margins [[0, 0.5, 1.5], [1, 4, 3]]
    layer = make_layer("HingeLoss")
    bottom, top = run_forward(layer, [x, labels])
    np.testing.assert_allclose(top[0].data, 10.0 / 2)
    layer.Backward(top, [True, False], bottom)
    np.testing.assert_allclose(bottom[0].diff, [[0, 0.5, 0.5], [0.5, 0.5, -0.5]])
    layer = make_layer("HingeLoss", "hinge_loss_param { norm: L2 }")
    bottom, top = run_forward(layer, [x, labels])
    np.testing.assert_allclose(top[0].data, (0.25 + 2.25 + 1 + 16 + 9) / 2)
    layer.Backward(top, [True, False], bottom)
    np.testing.assert_allclose(bottom[0].diff, [[0, 0.5, 1.5], [1, 4, -3]])


def test_hinge_bad_input():
    with pytest.raises(LayerError, match=r"'h' \(HingeLoss\): label value -1 is out of range"):
        run_forward(make_layer("HingeLoss", name="h"), [np.zeros((2, 3)), np.array([0.0, -1.0])])
    with pytest.raises(LayerError, match="one label per item"):
        run_forward(make_layer("HingeLoss"), [np.zeros((2, 3)), np.zeros((2, 3))])

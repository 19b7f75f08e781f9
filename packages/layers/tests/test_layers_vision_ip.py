"""InnerProduct: forward against NumPy, transpose, axis, gradients, loaded weights, errors."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from caffe.blob import context
from caffe.layers import LayerError
from caffe.layers.strategies import random_array
from caffe.layers.testing import (blobs_from_arrays, check_cpu_gpu_parity, check_layer_gradient, empty_tops,
                                  gpu_available, layer_param, make_layer, run_forward)
from caffe.layers.registry import create_layer

FILL = "weight_filler { type: 'gaussian' std: 0.5 } bias_filler { type: 'gaussian' std: 0.5 }"


@st.composite
def ip_cases(draw, max_side=3):
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.integers(1, max_side)) for _ in range(ndim))
    axis = draw(st.integers(-ndim, ndim - 1))
    num_output = draw(st.integers(1, 4))
    transpose = draw(st.booleans())
    bias = draw(st.booleans())
    text = (f"inner_product_param {{ num_output: {num_output} axis: {axis} transpose: {str(transpose).lower()} "
            f"bias_term: {str(bias).lower()} {FILL} }}")
    return dict(shape=shape, axis=axis % ndim, num_output=num_output, transpose=transpose, bias=bias, text=text,
                seed=draw(st.integers(0, 2**31 - 1)))


@given(case=ip_cases())
def test_inner_product_forward(case):
    x = random_array(case["seed"], case["shape"])
    context.set_random_seed(case["seed"])
    layer = make_layer("InnerProduct", case["text"])
    _, top = run_forward(layer, [x])
    a, n = case["axis"], case["num_output"]
    K = int(np.prod(case["shape"][a:]))
    w = layer.blobs[0].data
    assert w.shape == ((K, n) if case["transpose"] else (n, K))
    y = x.reshape(-1, K) @ (w if case["transpose"] else w.T)
    if case["bias"]:
        assert layer.blobs[1].shape == (n,)
        y = y + layer.blobs[1].data
    assert top[0].shape == case["shape"][:a] + (n,)
    np.testing.assert_allclose(top[0].data.reshape(-1, n), y, rtol=1e-12, atol=1e-12)


@given(case=ip_cases())
def test_inner_product_gradient(case):
    context.set_random_seed(case["seed"])
    x = random_array(case["seed"], case["shape"])
    check_layer_gradient(make_layer("InnerProduct", case["text"]), [x], mode="exhaustive")


def test_transpose_matches_the_plain_layer_with_transposed_weights():
    x = random_array(0, (3, 2, 2, 2))
    context.set_random_seed(1)
    plain = make_layer("InnerProduct", f"inner_product_param {{ num_output: 5 {FILL} }}")
    bottom, top = blobs_from_arrays([x]), empty_tops(1)
    plain.SetUp(bottom, top)
    trans = make_layer("InnerProduct", f"inner_product_param {{ num_output: 5 transpose: true {FILL} }}")
    tb, tt = blobs_from_arrays([x]), empty_tops(1)
    trans.SetUp(tb, tt)
    trans.blobs[0].data[...] = plain.blobs[0].data.T
    trans.blobs[1].data[...] = plain.blobs[1].data
    for layer, b, t in ((plain, bottom, top), (trans, tb, tt)):
        layer.Forward(b, t)
        t[0].diff[...] = np.arange(15.0).reshape(3, 5)
        layer.Backward(t, [True], b)
    np.testing.assert_allclose(tt[0].data, top[0].data, rtol=1e-12)
    np.testing.assert_allclose(tb[0].diff, bottom[0].diff, rtol=1e-12)
    np.testing.assert_allclose(trans.blobs[0].diff, plain.blobs[0].diff.T, rtol=1e-12)


def test_parameter_gradients_accumulate():
    layer = make_layer("InnerProduct", f"inner_product_param {{ num_output: 2 {FILL} }}")
    bottom, top = blobs_from_arrays([np.ones((2, 3))]), empty_tops(1)
    layer.SetUp(bottom, top)
    layer.Forward(bottom, top)
    top[0].diff[...] = 1
    for _ in range(2):
        layer.Backward(top, [False], bottom)
    np.testing.assert_allclose(layer.blobs[0].diff, 2 * 2 * np.ones((2, 3)))
    np.testing.assert_allclose(layer.blobs[1].diff, [4, 4])


def test_loaded_weights_kept_including_legacy_4d_shapes():
    rng = np.random.default_rng(0)
    param = layer_param("InnerProduct", "inner_product_param { num_output: 2 }", name="fc")
    w = rng.normal(size=(2, 3))
    for arr, legacy in ((w, (1, 1, 2, 3)), (np.array([0.5, -1.0]), (1, 1, 1, 2))):
        bp = param.blobs.add()
        bp.num, bp.channels, bp.height, bp.width = legacy
        bp.data.extend(arr.ravel().tolist())
    layer = create_layer(param)
    x = rng.normal(size=(4, 3))
    _, top = run_forward(layer, [x])
    assert layer.blobs[0].shape == (2, 3)
    np.testing.assert_allclose(top[0].data, x @ w.T + [0.5, -1.0], rtol=1e-6)
    bad = layer_param("InnerProduct", "inner_product_param { num_output: 3 }", name="fc")
    bad.blobs.extend(param.blobs)
    with pytest.raises(LayerError, match=r"Layer 'fc' \(InnerProduct\): Incorrect weight shape"):
        run_forward(create_layer(bad), [x])


@pytest.mark.parametrize("text,shape,match", [
    ("inner_product_param { num_output: 0 }", (2, 3), r"inner_product_param.num_output must be positive"),
    ("inner_product_param { num_output: 2 axis: 2 }", (2, 3), r"inner_product_param.axis 2 is out of range"),
    ("inner_product_param { num_output: 2 weight_filler { type: 'bogus' } }", (2, 3),
     r"inner_product_param.weight_filler"),
])
def test_bad_parameters_name_the_layer_and_field(text, shape, match):
    with pytest.raises(LayerError, match=r"Layer 'fc' \(InnerProduct\): " + match):
        run_forward(make_layer("InnerProduct", text, name="fc"), [np.ones(shape)])


def test_input_size_change_is_an_error():
    layer = make_layer("InnerProduct", "inner_product_param { num_output: 2 }", name="fc")
    bottom, top = blobs_from_arrays([np.ones((2, 3))]), empty_tops(1)
    layer.SetUp(bottom, top)
    bottom[0].reshape(2, 4)
    with pytest.raises(LayerError, match="Input size incompatible with inner product parameters"):
        layer.Forward(bottom, top)
    bottom[0].reshape(5, 3)  # a new batch size is fine
    layer.Forward(bottom, top)
    assert top[0].shape == (5, 2)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no GPU (CuPy with a CUDA device) available")
@pytest.mark.parametrize("transpose", ["false", "true"])
def test_cpu_gpu_parity(transpose):
    x = np.random.default_rng(0).normal(size=(4, 3, 2))
    check_cpu_gpu_parity(layer_param("InnerProduct", f"inner_product_param {{ num_output: 5 transpose: {transpose} "
                                                     f"{FILL} }}"), [x], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("block", [1, 7, 12, 10**6])
def test_inner_product_weight_gradient_in_blocks_accumulates(monkeypatch, transpose, block):
    """The weight gradient goes through a scratch block of WGRAD_BLOCK elements (several blocks, a partial
    last one, a block smaller than one row) and is added to the diff already there, as Caffe's GEMM with
    beta = 1 does (iter_size and shared weights rely on it)."""
    from caffe.layers import inner_product
    monkeypatch.setattr(inner_product, "WGRAD_BLOCK", block)
    M, K, N = 3, 5, 7
    text = (f"inner_product_param {{ num_output: {N} transpose: {str(transpose).lower()} {FILL} }}")
    x = random_array(1, (M, K))
    layer = make_layer("InnerProduct", text)
    bottom, top = run_forward(layer, [x])
    dy = random_array(2, (M, N))
    top[0].diff[...] = dy
    before = random_array(3, layer.blobs[0].shape)
    layer.blobs[0].diff[...] = before
    layer.blobs[1].diff[...] = 0
    layer.Backward(top, [True], bottom)
    grad = x.T @ dy if transpose else dy.T @ x  # (K, N) or (N, K)
    np.testing.assert_allclose(layer.blobs[0].diff, before + grad, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer.blobs[1].diff, dy.sum(axis=0), rtol=1e-5, atol=1e-6)

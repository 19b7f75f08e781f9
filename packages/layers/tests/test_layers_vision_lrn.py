"""LRN: ACROSS_CHANNELS and WITHIN_CHANNEL against the formula, gradients, errors."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from caffe.layers import LayerError
from caffe.layers.strategies import random_array
from caffe.layers.testing import (check_cpu_gpu_parity, check_layer_gradient, gpu_available, layer_param,
                                  make_layer, run_forward)

f32 = lambda v: float(np.float32(v))  # parameter fields are float32  # noqa: E731


def ref_lrn(x, size, alpha, beta, k, region):
    """Caffe's LRN by its definition, element by element."""
    N, C, H, W = x.shape
    r = (size - 1) // 2
    y = np.empty_like(x)
    for n, c, h, w in np.ndindex(*x.shape):
        if region == "ACROSS_CHANNELS":
            s = (x[n, max(0, c - r):min(C, c + r + 1), h, w] ** 2).sum()
            scale = k + alpha / size * s
        else:  # Caffe composes AVE pooling (pad r, divisor size^2) and power with shift 1
            s = (x[n, c, max(0, h - r):min(H, h + r + 1), max(0, w - r):min(W, w + r + 1)] ** 2).sum()
            scale = 1.0 + alpha * s / size ** 2
        y[n, c, h, w] = x[n, c, h, w] * scale ** -beta
    return y


@st.composite
def lrn_cases(draw, max_side=4):
    size = draw(st.sampled_from([1, 3, 5]))
    alpha = draw(st.sampled_from([1.0, 0.5, 2e-4, 3.0]))
    beta = draw(st.sampled_from([0.75, 0.5, 1.3]))
    k = draw(st.sampled_from([1.0, 2.0, 0.7]))
    region = draw(st.sampled_from(["ACROSS_CHANNELS", "WITHIN_CHANNEL"]))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 6)), draw(st.integers(1, max_side)),
             draw(st.integers(1, max_side)))
    text = (f"lrn_param {{ local_size: {size} alpha: {alpha} beta: {beta} k: {k} norm_region: {region} }}")
    return dict(size=size, alpha=f32(alpha), beta=f32(beta), k=f32(k), region=region, shape=shape, text=text,
                seed=draw(st.integers(0, 2**31 - 1)))


@given(case=lrn_cases())
def test_lrn_forward_matches_definition(case):
    x = random_array(case["seed"], case["shape"], -2, 2)
    _, top = run_forward(make_layer("LRN", case["text"]), [x])
    ref = ref_lrn(x, case["size"], case["alpha"], case["beta"], case["k"], case["region"])
    np.testing.assert_allclose(top[0].data, ref, rtol=1e-12, atol=1e-14)


@given(case=lrn_cases(max_side=3))
def test_lrn_gradient(case):
    x = random_array(case["seed"], case["shape"][:1] + (min(case["shape"][1], 4),) + case["shape"][2:], -2, 2)
    check_layer_gradient(make_layer("LRN", case["text"]), [x], mode="exhaustive", stepsize=1e-3, threshold=1e-3)


def test_caffe_default_parameters_and_known_value():
    # defaults: local_size 5, alpha 1, beta 0.75, k 1, ACROSS_CHANNELS
    x = np.zeros((1, 7, 1, 1))
    x[0, 3] = 2.0
    _, top = run_forward(make_layer("LRN"), [x])
    assert top[0].data[0, 3, 0, 0] == pytest.approx(2.0 * (1 + 1.0 / 5 * 4.0) ** -0.75, rel=1e-12)
    assert (top[0].data[0, [0, 1, 2, 4, 5, 6]] == 0).all()


def test_float32_matches_float64():
    x = random_array(3, (2, 8, 5, 5), -3, 3)
    text = "lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 }"
    _, t64 = run_forward(make_layer("LRN", text), [x])
    _, t32 = run_forward(make_layer("LRN", text), [x], dtype=np.float32)
    np.testing.assert_allclose(t32[0].data, t64[0].data, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("text,shape,match", [
    ("lrn_param { local_size: 4 }", (1, 3, 2, 2), r"LRN only supports odd values for lrn_param.local_size, got 4"),
    ("lrn_param { local_size: 3 }", (1, 3, 2), r"Input must have 4 axes"),
])
def test_bad_parameters_name_the_layer_and_field(text, shape, match):
    with pytest.raises(LayerError, match=r"Layer 'norm' \(LRN\): " + match):
        run_forward(make_layer("LRN", text, name="norm"), [np.ones(shape)])


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no GPU (CuPy with a CUDA device) available")
@pytest.mark.parametrize("region", ["ACROSS_CHANNELS", "WITHIN_CHANNEL"])
def test_cpu_gpu_parity(region):
    x = np.random.default_rng(0).normal(size=(2, 6, 5, 4))
    check_cpu_gpu_parity(layer_param("LRN", f"lrn_param {{ local_size: 3 alpha: 0.5 norm_region: {region} }}"),
                         [x], rtol=1e-4, atol=1e-5)

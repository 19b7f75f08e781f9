"""Pooling and convolution geometry, drawn at random: Caffe's ceil/floor rounding, its last-window rule,
the AVE divisor over the padded extent, windows that start behind the image, groups, dilation, pads."""

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import caffe
from caffe.onnx import to_onnx
from caffe.onnx.testing import compare_with_onnxruntime, randomize

pytest.importorskip("onnxruntime")


def build(body, shape, name="t", phase=caffe.TEST, seed=0):
    dims = " ".join(f"dim: {d}" for d in shape)
    text = (f'name: "{name}"\nlayer {{ name: "data" type: "Input" top: "data" '
            f'input_param {{ shape {{ {dims} }} }} }}\n{body}')
    try:
        net = caffe.Net(text, phase)
    except Exception as exc:  # a configuration Caffe itself refuses
        raise _Refused(str(exc)) from exc
    randomize(net, np.random.default_rng(seed))
    return net


class _Refused(Exception):
    pass


def built_or_assume(body, shape, **kw):
    try:
        return build(body, shape, **kw)
    except _Refused:
        assume(False)


@st.composite
def pool_cases(draw):
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    sh, sw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    method = draw(st.sampled_from(["MAX", "AVE"]))
    ph, pw = draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1))
    ceil = draw(st.booleans())
    return h, w, (kh, kw), (sh, sw), (ph, pw), method, ceil


@given(pool_cases(), st.integers(0, 2 ** 16))
def test_onnx_pooling_geometry(case, seed):
    h, w, (kh, kw), (sh, sw), (ph, pw), method, ceil = case
    body = (f'layer {{ name: "pool" type: "Pooling" bottom: "data" top: "pool" pooling_param {{ pool: {method} '
            f'kernel_h: {kh} kernel_w: {kw} stride_h: {sh} stride_w: {sw} pad_h: {ph} pad_w: {pw} '
            f'round_mode: {"CEIL" if ceil else "FLOOR"} }} }}')
    net = built_or_assume(body, (2, 3, h, w))
    compare_with_onnxruntime(net, np.random.default_rng(seed))


@pytest.mark.parametrize("h,k,s,pad,method", [
    (5, 1, 3, 0, "MAX"),  # ceil mode without padding: the last window starts behind the image (-FLT_MAX)
    (5, 1, 3, 0, "AVE"),  # ... and Caffe's AVE divides 0 by a non-positive divisor there
    (6, 3, 2, 1, "AVE"),  # the last window reaches past size + pad: a smaller divisor
    (7, 3, 2, 2, "AVE"),  # padding on both sides counts in the divisor
    (4, 4, 4, 3, "MAX"),  # the window dropped by Caffe's start-inside rule
    (6, 2, 2, 0, "MAX"),  # LeNet's 2x2/2
])
def test_onnx_pooling_edge_windows(h, k, s, pad, method):
    body = (f'layer {{ name: "pool" type: "Pooling" bottom: "data" top: "pool" pooling_param {{ pool: {method} '
            f'kernel_size: {k} stride: {s} pad: {pad} }} }}')
    net = build(body, (1, 2, h, h))
    compare_with_onnxruntime(net, np.random.default_rng(0))


@pytest.mark.parametrize("method", ["MAX", "AVE", "STOCHASTIC"])
def test_onnx_global_and_stochastic_test_pooling(method):
    body = (f'layer {{ name: "pool" type: "Pooling" bottom: "data" top: "pool" pooling_param {{ pool: {method} '
            f'global_pooling: true }} }}\n'
            f'layer {{ name: "pool2" type: "Pooling" bottom: "data" top: "pool2" pooling_param {{ pool: {method} '
            f'kernel_size: 3 stride: 2 }} }}')
    net = build(body, (2, 3, 6, 5))
    feeds = {"data": np.random.default_rng(1).uniform(0.1, 1, (2, 3, 6, 5)).astype(np.float32)}
    compare_with_onnxruntime(net, np.random.default_rng(0), feeds=feeds)


@given(st.integers(2, 8), st.integers(2, 8), st.integers(1, 3), st.integers(1, 3), st.integers(0, 2 ** 16))
def test_onnx_max_pooling_mask_top_with_ties(h, w, k, s, seed):
    """Caffe's mask top (h * W + w of the first maximum) with many ties in the window."""
    body = (f'layer {{ name: "pool" type: "Pooling" bottom: "data" top: "pool" top: "mask" pooling_param {{ '
            f'pool: MAX kernel_size: {k} stride: {s} round_mode: FLOOR }} }}')
    net = built_or_assume(body, (2, 2, h, w))
    feeds = {"data": np.random.default_rng(seed).integers(0, 3, (2, 2, h, w)).astype(np.float32)}
    compare_with_onnxruntime(net, np.random.default_rng(seed), feeds=feeds)


@st.composite
def conv_cases(draw):
    group = draw(st.integers(1, 3))
    cin, cout = group * draw(st.integers(1, 3)), group * draw(st.integers(1, 3))
    k = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    p = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    d = draw(st.integers(1, 2))
    hw = (draw(st.integers(3, 8)), draw(st.integers(3, 8)))
    deconv = draw(st.booleans())
    bias = draw(st.booleans())
    return group, cin, cout, k, s, p, d, hw, deconv, bias


@given(conv_cases(), st.integers(0, 2 ** 16))
def test_onnx_convolution_geometry(case, seed):
    group, cin, cout, k, s, p, d, hw, deconv, bias = case
    body = (f'layer {{ name: "conv" type: "{"Deconvolution" if deconv else "Convolution"}" bottom: "data" '
            f'top: "conv" convolution_param {{ num_output: {cout} kernel_h: {k[0]} kernel_w: {k[1]} '
            f'stride_h: {s[0]} stride_w: {s[1]} pad_h: {p[0]} pad_w: {p[1]} dilation: {d} group: {group} '
            f'bias_term: {str(bias).lower()} }} }}')
    net = built_or_assume(body, (2, cin, *hw), seed=seed)
    compare_with_onnxruntime(net, np.random.default_rng(seed))


def test_onnx_convolution_nd_and_two_bottoms():
    """3-D convolution, and Caffe's several bottom/top pairs convolved with one set of weights."""
    body = ('layer { name: "conv3d" type: "Convolution" bottom: "data" top: "c3" convolution_param { '
            'num_output: 4 kernel_size: 2 kernel_size: 3 kernel_size: 2 pad: 1 stride: 2 } }\n'
            'layer { name: "relu" type: "ReLU" bottom: "data" top: "r" }\n'
            'layer { name: "conv2" type: "Convolution" bottom: "data" bottom: "r" top: "a" top: "b" '
            'convolution_param { num_output: 3 kernel_size: 3 kernel_size: 3 kernel_size: 3 pad: 1 } }')
    net = build(body, (1, 2, 4, 5, 6))
    model = to_onnx(net)
    assert sum(n.op_type == "Conv" for n in model.graph.node) == 3
    compare_with_onnxruntime(net, np.random.default_rng(0), model=model)


def test_onnx_conv_channel_axis_other_than_one_is_refused():
    body = ('layer { name: "conv" type: "Convolution" bottom: "data" top: "c" convolution_param { '
            'num_output: 2 kernel_size: 1 axis: 2 } }')
    net = build(body, (1, 2, 3, 4, 5))
    with pytest.raises(caffe.onnx.UnsupportedLayersError, match=r"'conv' \(Convolution\).*axis 2"):
        to_onnx(net)

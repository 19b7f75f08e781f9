"""Convolution and Deconvolution: forward against direct references, gradients, Caffe's fixed cases, errors."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from caffe.blob import context
from caffe.layers import LayerError, conv_base
from caffe.layers.strategies import random_array
from caffe.layers.testing import (blobs_from_arrays, check_layer_gradient, empty_tops, gpu_available,
                                  check_cpu_gpu_parity, layer_param, make_layer, run_forward)
from caffe.layers.registry import create_layer

FILL = "weight_filler { type: 'gaussian' std: 0.7 } bias_filler { type: 'gaussian' std: 0.5 }"


# -- independent references ------------------------------------------------------------------

def out_size(n, k, s, p, d):
    return (n + 2 * p - (d * (k - 1) + 1)) // s + 1


def ref_conv(x, w, b, axis, stride, pad, dil, group):
    """Direct convolution: for every output position, a dot product of the dilated patch with the filters."""
    outer, C, S = x.shape[:axis], x.shape[axis], x.shape[axis + 1:]
    nd, k = len(S), w.shape[2:]
    xs = np.pad(x.reshape((-1, C) + S), [(0, 0), (0, 0)] + [(p, p) for p in pad])
    out_sp = tuple(out_size(S[i], k[i], stride[i], pad[i], dil[i]) for i in range(nd))
    O = w.shape[0]
    cg, og = C // group, O // group
    y = np.zeros((xs.shape[0], O) + out_sp)
    for pos in np.ndindex(*out_sp):
        idx = tuple(slice(pos[i] * stride[i], pos[i] * stride[i] + dil[i] * (k[i] - 1) + 1, dil[i])
                    for i in range(nd))
        patch = xs[(slice(None), slice(None)) + idx]
        for g in range(group):
            y[(slice(None), slice(g * og, (g + 1) * og)) + pos] = np.tensordot(
                patch[:, g * cg:(g + 1) * cg], w[g * og:(g + 1) * og],
                axes=(list(range(1, nd + 2)), list(range(1, nd + 2))))
    if b is not None:
        y += b.reshape((1, O) + (1,) * nd)
    return y.reshape(outer + (O,) + out_sp)


def ref_deconv(x, w, b, axis, stride, pad, dil, group):
    """Direct transposed convolution: every input value scatters its filter into the (padded) output."""
    outer, C, S = x.shape[:axis], x.shape[axis], x.shape[axis + 1:]
    nd, k = len(S), w.shape[2:]
    O = w.shape[1] * group
    cg, og = C // group, O // group
    out_sp = tuple(stride[i] * (S[i] - 1) + dil[i] * (k[i] - 1) + 1 - 2 * pad[i] for i in range(nd))
    xs = x.reshape((-1, C) + S)
    yp = np.zeros((xs.shape[0], O) + tuple(o + 2 * p for o, p in zip(out_sp, pad)))
    for pos in np.ndindex(*S):
        idx = tuple(slice(pos[i] * stride[i], pos[i] * stride[i] + dil[i] * (k[i] - 1) + 1, dil[i])
                    for i in range(nd))
        for g in range(group):
            v = xs[(slice(None), slice(g * cg, (g + 1) * cg)) + pos]
            yp[(slice(None), slice(g * og, (g + 1) * og)) + idx] += np.tensordot(v, w[g * cg:(g + 1) * cg], 1)
    y = yp[(slice(None), slice(None)) + tuple(slice(p, p + o) for p, o in zip(pad, out_sp))]
    if b is not None:
        y = y + b.reshape((1, O) + (1,) * nd)
    return y.reshape(outer + (O,) + out_sp)


# -- random convolution problems ----------------------------------------------------------------

def _repeated(draw, name, values, default=None):
    """A repeated field given once (all equal), once per axis, or (for defaults) not at all."""
    if default is not None and all(v == default for v in values) and draw(st.booleans()):
        return ""
    if all(v == values[0] for v in values) and draw(st.booleans()):
        return f"{name}: {values[0]} "
    return "".join(f"{name}: {v} " for v in values)


@st.composite
def conv_cases(draw, max_nd=3, max_side=4, deconv=False):
    nd = draw(st.integers(1, max_nd))
    group = draw(st.integers(1, 2))
    cg, og = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    kernel = [draw(st.integers(1, 3)) for _ in range(nd)]
    stride = [draw(st.integers(1, 2)) for _ in range(nd)]
    dil = [draw(st.integers(1, 2)) for _ in range(nd)]
    pad = [draw(st.integers(0, 1)) for _ in range(nd)]
    if deconv:
        sizes = [draw(st.integers(1, 3)) for _ in range(nd)]
        for i in range(nd):  # the output must be positive
            while stride[i] * (sizes[i] - 1) + dil[i] * (kernel[i] - 1) + 1 - 2 * pad[i] < 1:
                pad[i] -= 1
    else:
        sizes = []
        for i in range(nd):
            ext = dil[i] * (kernel[i] - 1) + 1
            sizes.append(draw(st.integers(max(1, ext - 2 * pad[i]), max(1, ext - 2 * pad[i]) + max_side - 1)))
    extra_outer = draw(st.booleans()) and nd <= 2
    num = draw(st.integers(1, 2))
    outer = (num, 2) if extra_outer else (num,)
    axis = len(outer)
    C = cg * group
    shape = outer + (C,) + tuple(sizes)
    text = f"num_output: {og * group} group: {group} "
    if nd == 2 and draw(st.booleans()):
        text += f"kernel_h: {kernel[0]} kernel_w: {kernel[1]} "
    else:
        text += _repeated(draw, "kernel_size", kernel)
    if nd == 2 and draw(st.booleans()):
        text += f"stride_h: {stride[0]} stride_w: {stride[1]} pad_h: {pad[0]} pad_w: {pad[1]} "
    else:
        text += _repeated(draw, "stride", stride, 1) + _repeated(draw, "pad", pad, 0)
    text += _repeated(draw, "dilation", dil, 1)
    if axis != 1:
        text += f"axis: {axis} " if draw(st.booleans()) else f"axis: {axis - len(shape)} "
    bias = draw(st.booleans())
    if not bias:
        text += "bias_term: false "
    if draw(st.booleans()):
        text += "force_nd_im2col: true "
    return dict(shape=shape, text=f"convolution_param {{ {text} {FILL} }}", axis=axis, kernel=kernel,
                stride=stride, pad=pad, dil=dil, group=group, bias=bias, seed=draw(st.integers(0, 2**31 - 1)))


def _forward(type_name, case, dtype=np.float64):
    context.set_random_seed(case["seed"])
    layer = make_layer(type_name, case["text"])
    x = random_array(case["seed"], case["shape"])
    bottom, top = run_forward(layer, [x], dtype=dtype)
    w = layer.blobs[0].data.astype(np.float64)
    b = layer.blobs[1].data.astype(np.float64) if case["bias"] else None
    return layer, x, w, b, top[0].data.copy()


@given(case=conv_cases())
def test_convolution_forward_matches_direct_reference(case):
    layer, x, w, b, y = _forward("Convolution", case)
    assert layer.blobs[0].shape == (y.shape[case["axis"]], x.shape[case["axis"]] // case["group"]) + tuple(case["kernel"])
    ref = ref_conv(x, w, b, case["axis"], case["stride"], case["pad"], case["dil"], case["group"])
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=1e-10, atol=1e-10)


@given(case=conv_cases(deconv=True))
def test_deconvolution_forward_matches_direct_reference(case):
    layer, x, w, b, y = _forward("Deconvolution", case)
    C = x.shape[case["axis"]]
    assert layer.blobs[0].shape == (C, y.shape[case["axis"]] // case["group"]) + tuple(case["kernel"])
    ref = ref_deconv(x, w, b, case["axis"], case["stride"], case["pad"], case["dil"], case["group"])
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=1e-10, atol=1e-10)


@given(case=conv_cases(max_nd=2, max_side=2))
def test_convolution_gradient(case):
    context.set_random_seed(case["seed"])
    x = random_array(case["seed"], case["shape"])
    check_layer_gradient(make_layer("Convolution", case["text"]), [x], mode="single")


@given(case=conv_cases(max_nd=2, deconv=True))
def test_deconvolution_gradient(case):
    context.set_random_seed(case["seed"])
    x = random_array(case["seed"], case["shape"])
    check_layer_gradient(make_layer("Deconvolution", case["text"]), [x], mode="single")


@pytest.mark.parametrize("type_name", ["Convolution", "Deconvolution"])
def test_gradient_exhaustive_two_bottoms_grouped(type_name):
    # Caffe's TestGradientGroup / TestGradient with two bottom/top pairs sharing the weights.
    rng = np.random.default_rng(3)
    text = f"convolution_param {{ num_output: 2 kernel_size: 2 stride: 2 pad: 1 group: 2 {FILL} }}"
    side = 3 if type_name == "Convolution" else 2  # tops 2x2 / 2x2
    context.set_random_seed(5)
    check_layer_gradient(make_layer(type_name, text),
                         [rng.normal(size=(1, 2, side, side)), rng.normal(size=(1, 2, side, side))],
                         n_top=2, mode="exhaustive")


# -- fixed values ------------------------------------------------------------------------------

def test_known_small_convolution():
    x = np.arange(1.0, 10.0).reshape(1, 1, 3, 3)
    layer = make_layer("Convolution", "convolution_param { num_output: 1 kernel_size: 2 "
                                      "weight_filler { type: 'constant' value: 1 } "
                                      "bias_filler { type: 'constant' value: 0.5 } }")
    _, top = run_forward(layer, [x])
    np.testing.assert_array_equal(top[0].data, [[[[12.5, 16.5], [24.5, 28.5]]]])
    layer = make_layer("Convolution", "convolution_param { num_output: 1 kernel_size: 3 pad: 1 stride: 2 "
                                      "bias_term: false weight_filler { type: 'constant' value: 1 } }")
    _, top = run_forward(layer, [x])
    np.testing.assert_array_equal(top[0].data, [[[[12, 16], [24, 28]]]])  # corners: 2x2 sums


def test_caffe_simple_convolution_shapes():
    # Caffe's TestSetup: 2x3x6x4 bottom, kernel 3 stride 2, 4 outputs -> 2x4x2x1; group 3 ->
    # weights 3x1x3x3; deconvolution of the same -> 2x4x13x9.
    b = np.ones((2, 3, 6, 4))
    _, top = run_forward(make_layer("Convolution", "convolution_param { num_output: 4 kernel_size: 3 stride: 2 }"), [b])
    assert top[0].shape == (2, 4, 2, 1)
    layer = make_layer("Convolution", "convolution_param { num_output: 3 kernel_size: 3 stride: 2 group: 3 }")
    run_forward(layer, [b])
    assert layer.blobs[0].shape == (3, 1, 3, 3) and layer.blobs[1].shape == (3,)
    layer = make_layer("Deconvolution", "convolution_param { num_output: 4 kernel_size: 3 stride: 2 }")
    _, top = run_forward(layer, [b])
    assert top[0].shape == (2, 4, 13, 9) and layer.blobs[0].shape == (3, 4, 3, 3)


def test_dilated_convolution_shape_and_value():
    x = np.arange(25.0).reshape(1, 1, 5, 5)
    layer = make_layer("Convolution", "convolution_param { num_output: 1 kernel_size: 2 dilation: 2 "
                                      "bias_term: false weight_filler { type: 'constant' value: 1 } }")
    _, top = run_forward(layer, [x])
    assert top[0].shape == (1, 1, 3, 3)
    assert top[0].data[0, 0, 0, 0] == x[0, 0, 0, 0] + x[0, 0, 0, 2] + x[0, 0, 2, 0] + x[0, 0, 2, 2]


def test_two_bottoms_share_weights_and_accumulate_gradients():
    rng = np.random.default_rng(0)
    x1, x2 = rng.normal(size=(2, 2, 4, 4)), rng.normal(size=(2, 2, 4, 4))
    text = f"convolution_param {{ num_output: 3 kernel_size: 3 {FILL} }}"
    context.set_random_seed(1)
    layer = make_layer("Convolution", text)
    bottom, top = blobs_from_arrays([x1, x2]), empty_tops(2)
    layer.SetUp(bottom, top)
    layer.Forward(bottom, top)
    w, b = layer.blobs[0].data.copy(), layer.blobs[1].data.copy()
    np.testing.assert_allclose(top[0].data, ref_conv(x1, w, b, 1, (1, 1), (0, 0), (1, 1), 1), rtol=1e-12)
    np.testing.assert_allclose(top[1].data, ref_conv(x2, w, b, 1, (1, 1), (0, 0), (1, 1), 1), rtol=1e-12)
    for t in top:
        t.diff[...] = 1.0
    for p in layer.blobs:
        p.diff[...] = 0
    layer.Backward(top, [True, True], bottom)
    once = layer.blobs[0].diff.copy()
    np.testing.assert_allclose(layer.blobs[1].diff, 2 * 2 * 2 * 2)  # two tops, 2 images, 2x2 outputs each
    layer.Backward(top, [True, True], bottom)  # parameter gradients accumulate, as in Caffe
    np.testing.assert_allclose(layer.blobs[0].diff, 2 * once, rtol=1e-12)


def test_param_propagate_down_off_leaves_param_diffs():
    layer = make_layer("Convolution", f"convolution_param {{ num_output: 2 kernel_size: 1 {FILL} }}")
    bottom, top = blobs_from_arrays([np.ones((1, 1, 2, 2))]), empty_tops(1)
    layer.SetUp(bottom, top)
    layer.set_param_propagate_down(0, False)
    layer.set_param_propagate_down(1, False)
    for p in layer.blobs:
        p.diff[...] = 7
    layer.Forward(bottom, top)
    top[0].diff[...] = 1
    layer.Backward(top, [True], bottom)
    assert (layer.blobs[0].diff == 7).all() and (layer.blobs[1].diff == 7).all()
    np.testing.assert_allclose(bottom[0].diff, layer.blobs[0].data.sum())


@pytest.mark.parametrize("type_name", ["Convolution", "Deconvolution"])
def test_chunked_batches_match_one_chunk(monkeypatch, type_name):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(5, 4, 5, 5))
    dy_seed = 11
    text = f"convolution_param {{ num_output: 4 kernel_size: 3 pad: 1 group: 2 {FILL} }}"
    results = []
    for limit in (conv_base.COL_BUFFER_LIMIT, 100):
        monkeypatch.setattr(conv_base, "COL_BUFFER_LIMIT", limit)
        context.set_random_seed(3)
        layer = make_layer(type_name, text)
        bottom, top = blobs_from_arrays([x]), empty_tops(1)
        layer.SetUp(bottom, top)
        assert layer.chunk == (5 if limit > 1000 else 1)
        layer.Forward(bottom, top)
        top[0].diff[...] = np.random.default_rng(dy_seed).normal(size=top[0].shape)
        layer.Backward(top, [True], bottom)
        results.append((top[0].data.copy(), bottom[0].diff.copy(), layer.blobs[0].diff.copy(),
                        layer.blobs[1].diff.copy()))
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_float32_matches_float64_and_fast_path_matches_nd_path():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, 4, 7, 6))
    outs = []
    for dtype, nd in ((np.float64, False), (np.float32, False), (np.float64, True)):
        text = (f"convolution_param {{ num_output: 6 kernel_size: 3 stride: 2 pad: 1 dilation: 1 group: 2 "
                f"force_nd_im2col: {str(nd).lower()} {FILL} }}")
        context.set_random_seed(9)
        layer = make_layer("Convolution", text)
        bottom, top = blobs_from_arrays([x], dtype), empty_tops(1, dtype)
        layer.SetUp(bottom, top)
        assert layer.blobs[0].dtype == dtype
        layer.Forward(bottom, top)
        top[0].diff[...] = 1
        layer.Backward(top, [True], bottom)
        outs.append((top[0].data.astype(np.float64), bottom[0].diff.astype(np.float64),
                     layer.blobs[0].diff.astype(np.float64)))
    for a, b in zip(outs[0], outs[1]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    for a, b in zip(outs[0], outs[2]):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_backward_without_forward_relowers_the_bottom():
    rng = np.random.default_rng(4)
    text = f"convolution_param {{ num_output: 2 kernel_size: 2 {FILL} }}"
    layer = make_layer("Convolution", text)
    bottom, top = blobs_from_arrays([rng.normal(size=(2, 1, 3, 3))]), empty_tops(1)
    layer.SetUp(bottom, top)
    layer.Forward(bottom, top)
    top[0].diff[...] = 1
    layer.Backward(top, [False], bottom)
    first = layer.blobs[0].diff.copy()
    layer.blobs[0].diff[...] = 0
    layer.Backward(top, [False], bottom)  # the kept column buffer was used up: lowered again
    np.testing.assert_allclose(layer.blobs[0].diff, first, rtol=1e-12)


def test_weights_from_layer_param_are_kept_and_checked():
    context.set_random_seed(1)
    src = make_layer("Convolution", f"convolution_param {{ num_output: 2 kernel_size: 2 {FILL} }}")
    run_forward(src, [np.ones((1, 3, 4, 4))])
    param = src.to_proto()
    layer = create_layer(param)
    run_forward(layer, [np.ones((1, 3, 4, 4))])
    np.testing.assert_allclose(layer.blobs[0].data, src.blobs[0].data, rtol=1e-6)
    bad = layer_param("Convolution", "convolution_param { num_output: 2 kernel_size: 3 }", name="c")
    bad.blobs.extend(param.blobs)
    with pytest.raises(LayerError, match=r"Layer 'c' \(Convolution\).*Incorrect weight shape"):
        run_forward(create_layer(bad), [np.ones((1, 3, 4, 4))])
    nobias = layer_param("Convolution", "convolution_param { num_output: 2 kernel_size: 2 bias_term: false }",
                         name="c")
    nobias.blobs.extend(param.blobs)
    with pytest.raises(LayerError, match="Incorrect number of weight blobs"):
        run_forward(create_layer(nobias), [np.ones((1, 3, 4, 4))])


def test_reshape_to_a_new_batch_size():
    layer = make_layer("Convolution", f"convolution_param {{ num_output: 2 kernel_size: 2 {FILL} }}")
    rng = np.random.default_rng(0)
    bottom, top = blobs_from_arrays([rng.normal(size=(1, 1, 3, 3))]), empty_tops(1)
    layer.SetUp(bottom, top)
    layer.Forward(bottom, top)
    x = rng.normal(size=(3, 1, 3, 3))
    bottom[0].reshape(x.shape)
    bottom[0].data[...] = x
    layer.Forward(bottom, top)
    w, b = layer.blobs[0].data, layer.blobs[1].data
    np.testing.assert_allclose(top[0].data, ref_conv(x, w, b, 1, (1, 1), (0, 0), (1, 1), 1), rtol=1e-12)


# -- bad input ---------------------------------------------------------------------------------

BAD = [
    ("convolution_param { num_output: 2 kernel_size: 0 }", (1, 1, 4, 4), r"kernel_size"),
    ("convolution_param { num_output: 2 kernel_size: 2 kernel_h: 2 kernel_w: 2 }", (1, 1, 4, 4),
     r"Either convolution_param.kernel_size or kernel_h/kernel_w"),
    ("convolution_param { num_output: 2 kernel_h: 2 kernel_w: 2 }", (1, 1, 4, 4, 4), r"kernel_h & kernel_w can only"),
    ("convolution_param { num_output: 2 kernel_size: 2 kernel_size: 2 kernel_size: 2 }", (1, 1, 4, 4),
     r"kernel_size must be specified once, or once per spatial dimension \(kernel_size specified 3 times; 2"),
    ("convolution_param { num_output: 2 kernel_size: 2 stride: 1 stride: 1 stride: 1 }", (1, 1, 4, 4),
     r"convolution_param.stride must be specified once"),
    ("convolution_param { num_output: 2 kernel_size: 2 pad: 1 pad_h: 1 }", (1, 1, 4, 4),
     r"Either convolution_param.pad or pad_h/pad_w"),
    ("convolution_param { num_output: 2 kernel_size: 2 stride: 0 }", (1, 1, 4, 4), r"stride"),
    ("convolution_param { num_output: 2 kernel_size: 2 dilation: 0 }", (1, 1, 4, 4), r"dilation"),
    ("convolution_param { num_output: 0 kernel_size: 2 }", (1, 1, 4, 4), r"convolution_param.num_output"),
    ("convolution_param { num_output: 2 kernel_size: 2 group: 2 }", (1, 3, 4, 4),
     r"convolution_param.group 2 must divide the 3 input channels"),
    ("convolution_param { num_output: 3 kernel_size: 2 group: 2 }", (1, 2, 4, 4),
     r"num_output 3 is not a multiple of convolution_param.group 2"),
    ("convolution_param { num_output: 2 kernel_size: 5 }", (1, 1, 4, 4), r"kernel extent 5"),
    # the boundaries: group 0, and a kernel one past the padded input (4 > 1 + 2*1)
    ("convolution_param { num_output: 2 kernel_size: 2 group: 0 }", (1, 2, 4, 4),
     r"convolution_param.group must be positive, got 0"),
    ("convolution_param { num_output: 2 kernel_size: 4 pad: 1 }", (1, 1, 1, 4), r"kernel extent 4 .* input size 1 \+ 2\*1"),
    ("convolution_param { num_output: 2 kernel_size: 2 axis: 4 }", (1, 1, 4, 4), r"convolution_param.axis 4"),
    ("convolution_param { num_output: 2 kernel_size: 2 weight_filler { type: 'nope' } }", (1, 1, 4, 4),
     r"convolution_param.weight_filler"),
]


@pytest.mark.parametrize("type_name", ["Convolution", "Deconvolution"])
@pytest.mark.parametrize("text,shape,match", BAD)
def test_bad_parameters_name_the_layer_and_field(type_name, text, shape, match):
    if type_name == "Deconvolution" and "kernel extent" in match:
        return  # a deconvolution's output grows: no such limit
    layer = make_layer(type_name, text, name="bad")
    with pytest.raises(LayerError, match=rf"Layer 'bad' \({type_name}\).*" + match):
        run_forward(layer, [np.ones(shape)])


def test_deconvolution_nonpositive_output_is_an_error():
    layer = make_layer("Deconvolution", "convolution_param { num_output: 1 kernel_size: 1 pad: 1 }", name="d")
    with pytest.raises(LayerError, match=r"Layer 'd' \(Deconvolution\): output size -1"):
        run_forward(layer, [np.ones((1, 1, 1, 1))])


@pytest.mark.parametrize("type_name", ["Convolution", "Deconvolution"])
def test_bottoms_of_different_shapes_are_an_error(type_name):
    layer = make_layer(type_name, "convolution_param { num_output: 2 kernel_size: 2 }", name="two")
    bottom, top = blobs_from_arrays([np.ones((1, 1, 4, 4)), np.ones((1, 1, 4, 5))]), empty_tops(2)
    with pytest.raises(LayerError, match=r"Layer 'two'.*All inputs must have the same shape: bottom\[1\]"):
        layer.SetUp(bottom, top)


def test_bottom_changing_channels_or_axes_is_an_error():
    layer = make_layer("Convolution", "convolution_param { num_output: 2 kernel_size: 2 }", name="c")
    bottom, top = blobs_from_arrays([np.ones((1, 2, 4, 4))]), empty_tops(1)
    layer.SetUp(bottom, top)
    bottom[0].reshape(1, 3, 4, 4)
    with pytest.raises(LayerError, match="Input size incompatible with convolution kernel"):
        layer.Forward(bottom, top)
    bottom[0].reshape(1, 2, 4, 4, 4)
    with pytest.raises(LayerError, match="bottom num_axes may not change"):
        layer.Forward(bottom, top)


def test_unequal_bottom_and_top_counts_are_an_error():
    layer = make_layer("Convolution", "convolution_param { num_output: 2 kernel_size: 2 }", name="c")
    with pytest.raises(LayerError, match="as many top blobs as bottom blobs"):
        layer.SetUp(blobs_from_arrays([np.ones((1, 1, 3, 3))]), empty_tops(2))


# -- GPU ---------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no GPU (CuPy with a CUDA device) available")
@pytest.mark.parametrize("type_name", ["Convolution", "Deconvolution"])
def test_cpu_gpu_parity(type_name):
    rng = np.random.default_rng(0)
    param = layer_param(type_name, f"convolution_param {{ num_output: 4 kernel_size: 3 stride: 2 pad: 1 "
                                   f"group: 2 {FILL} }}")
    check_cpu_gpu_parity(param, [rng.normal(size=(2, 4, 6, 5))], rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no GPU (CuPy with a CUDA device) available")
@pytest.mark.parametrize("type_name", ["Convolution", "Deconvolution"])
@pytest.mark.parametrize("dtype, channels, num", [(np.float64, 4, 2), (np.float32, 8, 2), (np.float32, 8, 1),
                                                 (np.float64, 4, 1)])
def test_cpu_gpu_parity_past_the_exact_forward(type_name, dtype, channels, num):
    """The device's plain (not float64-exact) GEMM: float64 blobs, or float32 with more than
    EXACT_FORWARD_MAX_K terms per dot product (8 channels x 3x3 = 72), one image and several."""
    rng = np.random.default_rng(1)
    param = layer_param(type_name, f"convolution_param {{ num_output: 4 kernel_size: 3 stride: 2 pad: 1 "
                                   f"{FILL} }}")
    tol = 1e-9 if dtype == np.float64 else 1e-4
    check_cpu_gpu_parity(param, [rng.normal(size=(num, channels, 6, 5))], rtol=tol, atol=tol, dtype=dtype)


@pytest.mark.parametrize("type_name", ["Convolution", "Deconvolution"])
def test_no_spatial_axes_is_a_fully_connected_layer(type_name):
    # Caffe allows num_spatial_axes == 0 (bottom (N, C)): a grouped inner product.
    x = np.random.default_rng(0).normal(size=(3, 4))
    text = f"convolution_param {{ num_output: 2 group: 2 {FILL} }}"
    context.set_random_seed(2)
    layer = make_layer(type_name, text)
    _, top = run_forward(layer, [x])
    w, b = layer.blobs[0].data, layer.blobs[1].data
    if type_name == "Convolution":
        assert w.shape == (2, 2)
        ref = np.concatenate([x[:, :2] @ w[:1].T, x[:, 2:] @ w[1:].T], axis=1) + b
    else:
        assert w.shape == (4, 1)
        ref = np.stack([x[:, :2] @ w[:2, 0], x[:, 2:] @ w[2:, 0]], axis=1) + b
    np.testing.assert_allclose(top[0].data, ref, rtol=1e-12)
    context.set_random_seed(2)
    check_layer_gradient(make_layer(type_name, text), [x], mode="exhaustive")


@pytest.mark.parametrize("num, group", [(1, 1), (3, 1), (2, 2)])
def test_short_float32_forward_is_the_correctly_rounded_float64_one(num, group):
    """Dot products of <= EXACT_FORWARD_MAX_K terms are taken in float64 and rounded once (LeNet's conv1
    fidelity to BVLC Caffe depends on it): float32 output == float64 output rounded to float32."""
    from caffe.layers import conv_base
    rng = np.random.default_rng(7)
    x = rng.normal(size=(num, 2, 9, 8)).astype(np.float32)
    outs = []
    for dtype in (np.float32, np.float64):
        context.set_random_seed(3)
        layer = make_layer("Convolution", f"convolution_param {{ num_output: 4 kernel_size: 3 group: {group} "
                                          f"weight_filler {{ type: 'gaussian' std: 0.5 }} "
                                          f"bias_filler {{ type: 'gaussian' std: 0.5 }} }}")
        bottom, top = blobs_from_arrays([x], dtype), empty_tops(1, dtype)
        layer.SetUp(bottom, top)
        assert layer.kernel_dim <= conv_base.EXACT_FORWARD_MAX_K
        for b in layer.blobs:  # the same float32-representable parameters in both runs
            b.data[...] = b.data.astype(np.float32)
        layer.Forward(bottom, top)
        outs.append(top[0].data.copy())
    np.testing.assert_array_equal(outs[0], outs[1].astype(np.float32))


@pytest.mark.parametrize("type_name", ["Convolution", "Deconvolution"])
@pytest.mark.parametrize("path", ["cpu", "xp"])
def test_backward_touches_only_what_was_asked(type_name, path):
    """As Caffe's Backward loops over the bottom/top pairs: a bottom diff only with its propagate_down, the
    weight (bias) diff only with param_propagate_down(0) (1), from every pair, whichever bottoms are off."""
    rng = np.random.default_rng(3)
    xs = [rng.normal(size=(2, 2, 4, 3)) for _ in range(2)]
    dys = None

    def run(propagate_down, params):
        nonlocal dys
        context.set_random_seed(5)
        layer = make_layer(type_name, f"convolution_param {{ num_output: 3 kernel_size: 2 pad: 1 {FILL} }}")
        bottom, top = blobs_from_arrays(xs), empty_tops(2)
        layer.SetUp(bottom, top)
        layer.Forward(bottom, top)
        if dys is None:
            dys = [rng.normal(size=t.shape) for t in top]
        for t, d in zip(top, dys):
            t.diff[...] = d
        for b in bottom + layer.blobs:
            b.diff[...] = 7.0
        for i, on in enumerate(params):
            layer.set_param_propagate_down(i, on)
        if path == "cpu":
            layer.Backward(top, propagate_down, bottom)
        else:
            layer.backward_xp(np, top, propagate_down, bottom)
        return [b.diff.copy() for b in bottom + layer.blobs]

    full = run([True, True], [True, True])
    for pd, params in [([False, True], [False, False]), ([False, False], [True, False]),
                       ([True, False], [False, True]), ([False, False], [False, False])]:
        got = run(pd, params)
        for j, on in enumerate(pd + params):
            if on:
                np.testing.assert_allclose(got[j], full[j], rtol=1e-12, err_msg=f"{pd} {params} [{j}]")
            else:
                assert (got[j] == 7.0).all(), f"{pd} {params}: diff [{j}] written though not asked for"

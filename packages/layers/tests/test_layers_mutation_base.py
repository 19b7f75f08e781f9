"""Mutation survivors (docs/MUTATION.md: layers-11 to layers-13, the leftovers of layers-5, -7, -8, and the
retests of the earlier groups):
behaviour the earlier tests did not pin down."""
import numpy as np
import pytest

from caffe.blob import Blob, context
from caffe.layers import GradientChecker, GradientCheckError, LayerError, conv_cpu, pooling
from caffe.layers.layer import Layer, NeuronLayer
from caffe.layers.registry import create_layer
from caffe.layers.testing import (blobs_from_arrays, check_layer_gradient, empty_tops, layer_param, make_layer,
                                 run_forward)

# -- layers-7: Deconvolution's bottom diff is a convolution forward: float32 short-K goes exact ------------


@pytest.mark.parametrize("weights", [True, False])
@pytest.mark.parametrize("text, shape", [
    ("num_output: 3 kernel_size: 3 stride: 2 pad: 1", (3, 2, 5, 4)),   # blocked, 27 terms
    ("num_output: 7 kernel_size: 1", (3, 4, 6, 5)),                     # 1x1, 7 terms
])
def test_deconv_bottom_diff_is_the_exact_forward(weights, text, shape):
    """float32 bottom diff == the float64 layer's rounded once (conv_base.EXACT_FORWARD_MAX_K), in
    blocks of images and bands, with and without the weight diff asked."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=shape).astype(np.float32)
    diffs = []
    for dtype in (np.float32, np.float64):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(conv_cpu, "COL_BLOCK_BYTES", 600)
            mp.setattr(conv_cpu, "MIN_BLOCK_COLS", 8)
            context.set_random_seed(3)
            layer = make_layer("Deconvolution", f"convolution_param {{ {text} "
                               "weight_filler { type: 'gaussian' } bias_term: false }")
            bottom, top = blobs_from_arrays([x], dtype), empty_tops(1, dtype)
            layer.SetUp(bottom, top)
            assert layer.exact_forward(np.float32)
            layer.blobs[0].data[...] = layer.blobs[0].data.astype(np.float32)
            layer.Forward(bottom, top)
            top[0].diff[...] = np.random.default_rng(8).normal(size=top[0].shape).astype(np.float32)
            layer.set_param_propagate_down(0, weights)
            layer.Backward(top, [True], bottom)
            diffs.append(bottom[0].diff.copy())
    np.testing.assert_array_equal(diffs[0], diffs[1].astype(np.float32))


# -- layers-8: InnerProduct's stored blobs, parameter dtype and errors -----------------------------------


def _ip_with_blobs(shapes, text="num_output: 2"):
    param = layer_param("InnerProduct", f"inner_product_param {{ {text} }}", name="fc")
    for shape in shapes:
        bp = param.blobs.add()
        bp.shape.dim.extend(shape)
        bp.data.extend([0.5] * int(np.prod(shape)))
    return create_layer(param)


@pytest.mark.parametrize("shapes, match", [
    ([(2, 3)], r"'fc' \(InnerProduct\): Incorrect number of weight blobs: expected 2 \(bias_term True\), got 1"),
    ([(2, 3), (3,)], r"'fc' \(InnerProduct\): Incorrect bias shape: expected shape \(2,\); instead.*\(3,\)"),
])
def test_inner_product_stored_blobs_checked_by_name(shapes, match):
    with pytest.raises(LayerError, match=match):
        run_forward(_ip_with_blobs(shapes), [np.zeros((4, 3))])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bias", [True, False])
def test_inner_product_parameters_follow_the_bottom_dtype(dtype, bias):
    layer = make_layer("InnerProduct", f"inner_product_param {{ num_output: 2 bias_term: {str(bias).lower()} }}")
    run_forward(layer, [np.zeros((4, 3))], dtype=dtype)
    assert [b.dtype for b in layer.blobs] == [np.dtype(dtype)] * (1 + bias)


def test_inner_product_errors_name_the_bias_filler_and_the_input_count():
    text = "inner_product_param { num_output: 2 bias_filler { type: 'bogus' } }"
    with pytest.raises(LayerError, match=r"inner_product_param\.bias_filler: "):
        run_forward(make_layer("InnerProduct", text), [np.zeros((4, 3))])
    layer = make_layer("InnerProduct", "inner_product_param { num_output: 2 }")
    bottom, top = run_forward(layer, [np.zeros((2, 3, 4))])  # K = 12 from axis 1
    bottom[0].reshape((2, 5, 4))
    with pytest.raises(LayerError, match=r"shape \(2, 5, 4\) has 20 inputs from axis 1, the layer was set up "
                                         r"for 12"):
        layer.Reshape(bottom, top)


# -- layers-5: STOCHASTIC pooling's draw, as Caffe's StoPoolForwardTrain computes it ----------------------


def test_stochastic_train_threshold_rounds_in_the_blob_dtype():
    """Caffe's threshold is the float32 product draw * window sum: with a draw just above 1/3 and the sum
    3, it rounds to exactly the first cumulative sum 1, which then takes the draw (a float64 product,
    1 + 3e-8, would pass on to the second element)."""
    x = np.array([1.0, 2.0, 0.0, 0.0], np.float32).reshape(1, 1, 2, 2)
    u = np.float32(1 / 3)
    u = np.nextafter(u, np.float32(1)) if np.float64(u) * 3 <= 1 else u
    assert np.float64(u) * 3 > 1 and np.float32(u) * np.float32(3) == 1
    spec = pooling.PoolSpec(pooling.STOCHASTIC, (2, 2), (1, 1), (0, 0))
    y, idx = np.zeros((1, 1, 1, 1), np.float32), np.zeros((1, 1, 1, 1), np.int32)
    pooling.stochastic_forward_train(np, spec, x, y, idx, np.full((1, 1, 1, 1), u, np.float64))
    assert idx.item() == 0 and y.item() == 1


def test_stochastic_train_window_without_a_hit_takes_its_own_last_element():
    """A window whose running sums never reach the threshold (a negative sum) takes its last element
    inside the image, each window on its own: a partial window at the CEIL edge stops at the image."""
    x = -np.arange(1.0, 6.0).reshape(1, 1, 1, 5)           # windows [-1 -2] [-3 -4] [-5 | outside]
    spec = pooling.PoolSpec(pooling.STOCHASTIC, (1, 2), (1, 2), (0, 0))
    y, idx = np.zeros((1, 1, 1, 3)), np.zeros((1, 1, 1, 3), np.int32)
    uniform = np.array([0.9, 0.1, 0.1]).reshape(1, 1, 1, 3)  # first window: a hit at its first element
    pooling.stochastic_forward_train(np, spec, x, y, idx, uniform)
    assert idx.ravel().tolist() == [0, 3, 4]
    assert y.ravel().tolist() == [-1.0, -4.0, -5.0]


# -- layers-5 (retest): Bias and Scale without the kernels, a reloaded Scale's bias, one draw per window ----

_CHANNELWISE_CASES = [
    ("Bias", "bias_param { axis: 1 num_axes: 1 filler { type: 'gaussian' } }", 1),
    ("Bias", "bias_param { axis: 1 }", 2),
    ("Scale", "scale_param { axis: 1 num_axes: 1 filler { type: 'gaussian' } bias_term: true "
              "bias_filler { type: 'gaussian' } }", 1),
    ("Scale", "scale_param { axis: 1 bias_term: true bias_filler { type: 'gaussian' } }", 2),
]


def _channelwise_run(type_name, text, n_bottom, dtype):
    rng = np.random.default_rng(5)
    arrays = [rng.normal(size=(2, 3, 4)), rng.normal(size=(3, 4))][:n_bottom]
    context.set_random_seed(9)
    layer = make_layer(type_name, text)
    bottom, top = run_forward(layer, arrays, dtype=dtype)
    top[0].diff[...] = rng.normal(size=top[0].shape)
    layer.Backward(top, [True] * n_bottom, bottom)
    return [top[0].data.copy()] + [b.diff.copy() for b in bottom] + [p.diff.copy() for p in layer.blobs]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("type_name, text, n_bottom", _CHANNELWISE_CASES)
def test_bias_and_scale_without_the_kernels_match_the_kernels(monkeypatch, type_name, text, n_bottom, dtype):
    """The CPU path without the compiled channelwise kernels (forward_xp/backward_xp on NumPy) computes
    what the kernels compute: top, bottom diffs and parameter diffs."""
    from caffe.layers import _cpu
    want = _channelwise_run(type_name, text, n_bottom, dtype)
    monkeypatch.setattr(_cpu, "channelwise", None)
    got = _channelwise_run(type_name, text, n_bottom, dtype)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def test_bias_generic_backward_touches_only_what_was_asked(monkeypatch):
    """BiasLayer::Backward on the generic path (the GPU's; the CPU's without the kernels): the bottom diff
    only with propagate_down[0], the learned bias's diff only with param_propagate_down(0), a second
    bottom's diff only with propagate_down[1]."""
    from caffe.layers import _cpu
    monkeypatch.setattr(_cpu, "channelwise", None)
    rng = np.random.default_rng(0)
    x, dy = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 3, 4))
    layer = make_layer("Bias", "bias_param { axis: 1 num_axes: 1 }")
    bottom, top = run_forward(layer, [x])
    top[0].diff[...] = dy
    layer.set_param_propagate_down(0, False)
    layer.Backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, dy)
    assert not layer.blobs[0].diff.any()
    bottom[0].diff[...] = 0
    layer.set_param_propagate_down(0, True)
    layer.Backward(top, [False], bottom)
    assert not bottom[0].diff.any()
    np.testing.assert_allclose(layer.blobs[0].diff, dy.sum(axis=(0, 2)))
    layer = make_layer("Bias", "bias_param { axis: 1 }")
    bottom, top = run_forward(layer, [x, rng.normal(size=(3, 4))])
    top[0].diff[...] = dy
    layer.Backward(top, [True, False], bottom)
    np.testing.assert_array_equal(bottom[0].diff, dy)
    assert not bottom[1].diff.any()


@pytest.mark.parametrize("n_bottom", [1, 2])
def test_scale_reloaded_with_its_bias_keeps_the_bias_and_its_own_propagate_flag(n_bottom):
    """A Scale with bias_term loaded from a caffemodel (its bias among the stored blobs: the last one,
    also with two bottoms, where it is the only one) computes as the original; the bias's diff follows
    param_propagate_down of the bias's own index, not the scale's."""
    rng = np.random.default_rng(4)
    x, s = rng.normal(size=(2, 3, 4)), rng.normal(size=(3,))
    text = ("scale_param { axis: 1 num_axes: 1 filler { type: 'gaussian' } bias_term: true "
            "bias_filler { type: 'gaussian' } }")
    arrays = [x, s][:n_bottom]
    a = make_layer("Scale", text)
    _, top_a = run_forward(a, arrays)
    b = create_layer(a.to_proto())
    assert len(b.blobs) == len(a.blobs) == 3 - n_bottom
    bottom, top = run_forward(b, arrays)
    np.testing.assert_allclose(top[0].data, top_a[0].data, rtol=1e-6)  # blobs stored as float
    if n_bottom == 2:
        return
    top[0].diff[...] = dy = rng.normal(size=x.shape)
    for scale_flag, bias_flag in ((False, True), (True, False)):
        for p in b.blobs:
            p.diff[...] = 0
        b.set_param_propagate_down(0, scale_flag)
        b.set_param_propagate_down(1, bias_flag)
        b.Backward(top, [False], bottom)
        want_s = (dy * x).sum(axis=(0, 2)) if scale_flag else np.zeros(3)
        want_b = dy.sum(axis=(0, 2)) if bias_flag else np.zeros(3)
        np.testing.assert_allclose(b.blobs[0].diff, want_s, atol=1e-12)
        np.testing.assert_allclose(b.blobs[1].diff, want_b, atol=1e-12)


def _scale_with_a_stored_bias():
    """A Scale (axis 1, a scale per channel, bias_term) whose stored blobs (a LayerParameter's, as a net
    with its weights in the prototxt gives) hold a bias spanning (channels, height); x, the scale, the bias."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 3, 4))
    s, b = rng.normal(size=3).astype(np.float32), rng.normal(size=(3, 4)).astype(np.float32)
    a = make_layer("Scale", "scale_param { axis: 1 num_axes: 1 bias_term: true }")
    a.SetUp(blobs_from_arrays([x]), empty_tops(1))
    a.blobs[0].data[...] = s
    a.blobs[1] = Blob([3, 4])
    a.blobs[1].data[...] = b
    return a.to_proto(), x, s, b


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scale_with_a_stored_bias_of_another_geometry(dtype, in_place):
    """The bias layer adds such a bias and takes its gradient, as Caffe's CPU Scale does; the CPU kernels'
    one pass (scale and bias per channel) does not fit it. A bug found in session 7 (the float32 kernel path
    indexed the bias by channel: wrong tops; its backward crashed reshaping the bias diff); Scale.forward_xp
    40 (the same check inverted on the device path) in the host test below."""
    param, x, s, b = _scale_with_a_stored_bias()
    layer = create_layer(param)
    bottom = blobs_from_arrays([x], dtype)
    top = [bottom[0]] if in_place else empty_tops(1, dtype)
    layer.SetUp(bottom, top)
    layer.Forward(bottom, top)
    xs = x.astype(dtype)
    tol = 1e-6 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(top[0].data, xs * s[:, None] + b, rtol=tol, atol=tol)
    dy = np.random.default_rng(4).normal(size=x.shape).astype(dtype)
    top[0].diff[...] = dy
    layer.Backward(top, [True], bottom)
    np.testing.assert_allclose(bottom[0].diff, dy * s[:, None], rtol=tol, atol=tol)
    # the stored blobs are float32 whatever the bottoms' dtype (a LayerParameter holds floats)
    np.testing.assert_allclose(layer.blobs[0].diff, (dy * xs).sum(axis=(0, 2)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(layer.blobs[1].diff, dy.sum(axis=0), rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not __import__("caffe.layers.cuda_host", fromlist=["x"]).available(),
                    reason="no host C++ compiler to run the CUDA sources")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scale_with_a_stored_bias_of_another_geometry_on_the_host(dtype):
    """The device path with the CUDA kernels (run on the host): the fused scale-and-bias kernel indexes the
    bias by channel, so it must not be chosen (session 7: Scale.forward_xp 40)."""
    from caffe.layers import cuda_host
    param, x, s, b = _scale_with_a_stored_bias()
    layer = create_layer(param)
    bottom, top = blobs_from_arrays([x], dtype), empty_tops(1, dtype)
    layer.SetUp(bottom, top)
    with cuda_host.emulating():
        layer.forward_xp(np, bottom, top)
    tol = 1e-6 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(top[0].data, x.astype(dtype) * s[:, None] + b, rtol=tol, atol=tol)


def test_stochastic_train_draws_one_uniform_per_window():
    """Caffe's StoPoolForwardTrain draws one uniform per top element: each window takes the first element
    whose running sum reaches draw * window sum, with its own draw."""
    x = np.random.default_rng(2).uniform(0.1, 1.0, size=(2, 2, 6, 6))
    layer = make_layer("Pooling", "pooling_param { pool: STOCHASTIC kernel_size: 2 stride: 2 }", phase=0)
    bottom, top = blobs_from_arrays([x]), empty_tops(1)
    layer.SetUp(bottom, top)
    context.set_random_seed(11)
    layer.Forward(bottom, top)
    context.set_random_seed(11)
    u = context.rng().random(top[0].shape)
    want = np.empty(top[0].shape)
    for n, c, i, j in np.ndindex(*want.shape):
        win = x[n, c, 2 * i:2 * i + 2, 2 * j:2 * j + 2].ravel()
        want[n, c, i, j] = win[np.argmax(np.cumsum(win) >= u[n, c, i, j] * win.sum())]
    np.testing.assert_array_equal(top[0].data, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stochastic_test_guards_the_division_with_flt_min(dtype):
    """Caffe's StoPoolForwardTest starts the window sum at FLT_MIN: a window of zeros gives +0 and one whose
    only nonzero is FLT_MIN (its square underflows in float32) 0, not 0/0 (session 7: stochastic_forward_test
    27, the guard subtracted)."""
    flt_min = np.finfo(np.float32).tiny
    x = np.zeros((1, 1, 2, 4))
    x[0, 0, 0, 2] = flt_min
    layer = make_layer("Pooling", "pooling_param { pool: STOCHASTIC kernel_size: 2 stride: 2 }", phase=1)
    bottom, top = blobs_from_arrays([x], dtype), empty_tops(1, dtype)
    layer.SetUp(bottom, top)
    layer.Forward(bottom, top)
    xs = x.astype(dtype)
    want = np.array([0.0, (xs[0, 0, 0, 2] * xs[0, 0, 0, 2]) / (xs[0, 0, 0, 2] + dtype(flt_min))], dtype)
    got = top[0].data.reshape(-1)
    assert np.isfinite(got).all() and not np.signbit(got).any()
    np.testing.assert_array_equal(got, want)


# -- layers-11: LRN's scratch buffers follow the blobs' dtype --------------------------------------------


@pytest.mark.parametrize("region", ["ACROSS_CHANNELS", "WITHIN_CHANNEL"])
def test_lrn_reused_with_another_dtype_computes_in_it(monkeypatch, region):
    """The generic path's scratch buffers are kept per name across calls: a layer set up on float32 and
    then run on float64 bottoms of the same shape must not go on computing in the float32 buffers."""
    from caffe.layers import _cpu
    monkeypatch.setattr(_cpu, "normalization", None)  # the generic path (the GPU's, and without kernels)
    text = f"lrn_param {{ local_size: 3 alpha: 2.5 beta: 0.6 norm_region: {region} }}"
    x = np.random.default_rng(3).normal(size=(2, 4, 3, 3))
    layer = make_layer("LRN", text)
    run_forward(layer, [x], dtype=np.float32)
    bottom, top = blobs_from_arrays([x], np.float64), empty_tops(1, np.float64)
    layer.Forward(bottom, top)  # no second SetUp (which would drop the buffers)
    top[0].diff[...] = 1.0
    layer.Backward(top, [True], bottom)
    fresh = make_layer("LRN", text)
    fb, ft = run_forward(fresh, [x], dtype=np.float64)
    ft[0].diff[...] = 1.0
    fresh.Backward(ft, [True], fb)
    np.testing.assert_array_equal(top[0].data, ft[0].data)
    np.testing.assert_array_equal(bottom[0].diff, fb[0].diff)



@pytest.mark.parametrize("beta", [0.75, 1.75])
def test_lrn_generic_path_matches_the_kernel_for_beta(monkeypatch, beta):
    """beta 0.75 takes a sqrt shortcut on the generic path, any other beta pow: both agree with the
    compiled kernel's scale^-beta (beta 1.75 is one past the shortcut)."""
    from caffe.layers import _cpu
    text = f"lrn_param {{ local_size: 3 alpha: 1.5 beta: {beta} k: 1.5 }}"
    x = np.random.default_rng(5).normal(size=(2, 5, 3, 2))
    _, kernel_top = run_forward(make_layer("LRN", text), [x])
    monkeypatch.setattr(_cpu, "normalization", None)
    _, generic_top = run_forward(make_layer("LRN", text), [x])
    np.testing.assert_allclose(generic_top[0].data, kernel_top[0].data, rtol=1e-12, atol=1e-14)

# -- layers-12: the Layer base ------------------------------------------------------------------------


def test_a_zero_loss_weight_skips_only_its_own_top():
    """loss_weight per top (Caffe's SetLossWeights): a 0 before a non-zero weight leaves that top alone
    and goes on to the next; Forward's loss sums only the weighted tops, whatever the others' diffs hold."""
    layer = make_layer("Slice", "slice_param { axis: 1 } loss_weight: 0 loss_weight: 2.5")
    x = np.arange(1.0, 7.0).reshape(1, 2, 3)
    bottom, top = blobs_from_arrays([x]), empty_tops(2)
    layer.SetUp(bottom, top)
    assert [layer.loss(0), layer.loss(1)] == [0.0, 2.5]
    np.testing.assert_array_equal(top[1].diff, 2.5)
    np.testing.assert_array_equal(top[0].diff, 0)
    top[0].diff[...] = 7.0  # e.g. left from a backward: not a loss
    assert layer.Forward(bottom, top) == pytest.approx(2.5 * x[:, 1].sum(), rel=1e-12)
    both = make_layer("Slice", "slice_param { axis: 1 } loss_weight: 0.5 loss_weight: 2.5")
    top = empty_tops(2)
    both.SetUp(bottom, top)
    assert both.Forward(bottom, top) == pytest.approx(0.5 * x[:, 0].sum() + 2.5 * x[:, 1].sum(), rel=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_to_proto_writes_float_data_and_the_diff_when_asked(dtype):
    """Caffe's Layer::ToProto(param, write_diff): each parameter blob as a BlobProto of float data (a
    caffemodel holds floats, whatever the blob's dtype here), with its diff only when asked."""
    layer = make_layer("PReLU", "prelu_param { filler { type: 'constant' value: 0.5 } }")
    run_forward(layer, [np.ones((1, 3, 2))], dtype=dtype)
    layer.blobs[0].diff[...] = [1.0, 2.0, 3.0]
    plain, with_diff = layer.to_proto(), layer.to_proto(write_diff=True)
    for proto in (plain, with_diff):
        assert list(proto.blobs[0].data) == [0.5] * 3 and not len(proto.blobs[0].double_data)
    assert not len(plain.blobs[0].diff)
    assert list(with_diff.blobs[0].diff) == [1.0, 2.0, 3.0] and not len(with_diff.blobs[0].double_diff)


# -- layers-12: the gradient checker's refusals and whole-net mode ------------------------------------


class _Square(NeuronLayer):
    """y = x^2, its gradient off by `factor`."""
    type = "TestSquareBase"
    factor = 1.0

    def forward_xp(self, xp, bottom, top):
        top[0].mutable_data_xp(xp)[...] = bottom[0].data_xp(xp) ** 2

    def backward_xp(self, xp, top, propagate_down, bottom):
        bottom[0].mutable_diff_xp(xp)[...] = 2 * self.factor * bottom[0].data_xp(xp) * top[0].diff_xp(xp)


def _square(factor=1.0, name="sq"):
    layer = _Square(layer_param("TestSquareBase", name=name))
    layer.factor = factor
    return layer


X = np.array([[-1.5, -0.7, 0.3], [0.9, 1.2, 2.0]])


def test_gradient_checker_refuses_what_it_cannot_check():
    checker = GradientChecker(1e-3, 1e-6)
    with pytest.raises(GradientCheckError, match="exhaustive mode needs at least one top blob"):
        checker.check_gradient_exhaustive(make_layer("Silence"), blobs_from_arrays([X]), [])
    pool = make_layer("Pooling", "pooling_param { pool: AVE kernel_size: 2 }")  # 4 inputs, 1 output
    with pytest.raises(GradientCheckError, match="element-wise mode needs bottoms with the top's count"):
        checker.check_gradient_eltwise(pool, blobs_from_arrays([X[:, :2].reshape(1, 1, 2, 2)]), empty_tops(1))
    bottom, top = blobs_from_arrays([X]), empty_tops(1)
    layer = _square()
    layer.SetUp(bottom, top)
    for top_id, top_data_id in ((-1, 0), (0, -1)):
        with pytest.raises(GradientCheckError, match="element-wise mode needs a top_id and a top_data_id"):
            checker.check_gradient_single(layer, bottom, top, -1, top_id, top_data_id, element_wise=True)
    with pytest.raises(GradientCheckError, match="no blobs to check"):  # no bottom (-2) and no parameters
        checker.check_gradient_single(layer, bottom, top, -2, -1, -1)
    ip = make_layer("InnerProduct", "inner_product_param { num_output: 6 }")
    ip.SetUp(bottom, top)
    with pytest.raises(GradientCheckError, match="element-wise mode is for layers without parameter blobs"):
        checker.check_gradient_single(ip, bottom, top, -1, 0, 0, element_wise=True)


def test_gradient_checker_single_mode_sums_every_top():
    """The single-output objective is 0.5 * the sum of squares over every top (Caffe's top_id < 0): a
    layer with two tops is checked against both."""
    x = np.random.default_rng(2).normal(size=(2, 4, 3))
    check_layer_gradient(make_layer("Slice", "slice_param { axis: 1 slice_point: 1 }"), [x], n_top=2,
                         mode="single")


def test_gradient_checker_with_check_bottom_below_minus_one_checks_only_the_parameters():
    ip = make_layer("InnerProduct", "inner_product_param { num_output: 2 weight_filler { type: 'gaussian' } "
                                    "bias_filler { type: 'gaussian' } }")
    bottom, top = blobs_from_arrays([X]), empty_tops(1)
    checker = GradientChecker(1e-3, 1e-6)
    checker.check_gradient(ip, bottom, top, check_bottom=-2)
    real = ip.backward_xp

    def wrong_bottom(xp, top_, propagate_down, bottom_):
        real(xp, top_, [True], bottom_)
        bottom_[0].diff[...] *= 1.3  # checked only when a bottom is asked
    ip.backward_xp = wrong_bottom
    ip.backward_cpu = lambda top_, pd, bottom_: wrong_bottom(np, top_, pd, bottom_)
    checker.check_gradient(ip, bottom, top, check_bottom=-2)
    with pytest.raises(GradientCheckError, match="bottom 0 element"):
        checker.check_gradient(ip, bottom, top, check_bottom=0)


class _TinyNet:
    """What check_gradient_net needs of a net: layers, bottom_vecs, top_vecs, forward()."""

    def __init__(self, layers, x):
        self.layers = layers
        self.bottom_vecs, self.top_vecs = [], []
        blobs = blobs_from_arrays([x])
        for layer in layers:
            top = empty_tops(1)
            layer.SetUp(blobs, top)
            self.bottom_vecs.append(blobs)
            self.top_vecs.append(top)
            blobs = top
        self.forwards = 0

    def forward(self):
        self.forwards += 1
        for layer, b, t in zip(self.layers, self.bottom_vecs, self.top_vecs):
            layer.Forward(b, t)


def test_gradient_check_net_checks_every_layer_on_the_activations_the_net_feeds_it():
    x = X / 2
    net = _TinyNet([_square(name="a"), _square(name="b")], x)
    GradientChecker(1e-4, 1e-6).check_gradient_net(net)
    assert net.forwards == 2
    np.testing.assert_array_equal(net.bottom_vecs[1][0].data, x ** 2)  # restored after the check
    with pytest.raises(GradientCheckError, match=r"in layer 'b' \(TestSquareBase\)"):
        GradientChecker(1e-4, 1e-6).check_gradient_net(_TinyNet([_square(name="a"), _square(1.01, "b")], x))


# -- layers-12: Python layers ---------------------------------------------------------------------------


@pytest.fixture
def pymodule(monkeypatch):
    """A module of user layers that python_param.module can import (registered in sys.modules)."""
    import sys
    import types

    import caffe.layers.python_layer as pl

    mod = types.ModuleType("mutation_base_pylayers")

    class Doubler(pl.Layer):
        def setup(self, bottom, top):
            self.seen = (bottom[0].shape, len(top))

        def reshape(self, bottom, top):
            top[0].reshape(bottom[0].shape)

        def forward(self, bottom, top):
            top[0].data[...] = 2 * bottom[0].data

        def backward(self, top, propagate_down, bottom):
            if propagate_down[0]:
                bottom[0].diff[...] = 2 * top[0].diff

    class PlainListBlobs(Doubler):
        def __init__(self):
            self.blobs = []  # not a BlobVec: the wrapper keeps its own

    class Broken(Doubler):
        def __init__(self):
            raise RuntimeError("no GPU for this one")

    mod.Doubler, mod.PlainListBlobs, mod.Broken = Doubler, PlainListBlobs, Broken
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return mod


def _py(layer, extra=""):
    return make_layer("Python", f"python_param {{ module: 'mutation_base_pylayers' layer: '{layer}' {extra} }}",
                      name="py")


def test_python_layer_construction_errors_and_blobs(pymodule):
    with pytest.raises(LayerError, match=r"'py' \(Python\): cannot construct Python layer "
                                         r"mutation_base_pylayers\.Broken: no GPU for this one"):
        _py("Broken")
    layer = _py("PlainListBlobs")
    layer.blobs.add_blob()  # still pycaffe's BlobVec; no shape: an empty blob
    layer.blobs.add_blob(2, 3)
    assert layer.blobs is layer.impl.blobs and [b.shape for b in layer.blobs] == [(), (2, 3)]
    assert _py("Doubler", "share_in_parallel: true").share_in_parallel
    assert not _py("Doubler").share_in_parallel


def test_python_layer_runs_the_same_code_in_gpu_mode(pymodule):
    """A Python layer has one forward/backward: Caffe calls it in either mode (data moved as needed)."""
    layer = _py("Doubler")
    bottom, top = run_forward(layer, [np.arange(3.0)])
    assert layer.impl.seen == ((3,), 1)  # setup(bottom, top) sees the blobs
    top[0].data[...] = 0
    layer.forward_gpu(bottom, top)
    np.testing.assert_array_equal(top[0].data, [0.0, 2.0, 4.0])
    top[0].diff[...] = 1.5
    layer.backward_gpu(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, 3.0)
    layer.backward_gpu(top, [False], bottom)  # propagate_down reaches the user's backward
    np.testing.assert_array_equal(bottom[0].diff, 3.0)


def test_package_getattr_loads_submodules_and_names_what_is_missing():
    import importlib

    import caffe.layers as layers_pkg
    assert layers_pkg.__getattr__("testing") is importlib.import_module("caffe.layers.testing")
    with pytest.raises(AttributeError, match=r"module 'caffe.layers' has no attribute 'no_such_thing' "
                                             r"\(NetSpec layer builders are layer type names, with a capital"):
        layers_pkg.no_such_thing  # noqa: B018  (lowercase: not taken for a NetSpec layer builder)


# -- layers-13: the CPU paths' helpers (caffe.layers._cpu) -----------------------------------------------


def test_kernels_usable_only_when_every_blob_has_one_float_dtype():
    from caffe.blob import Blob
    from caffe.layers import _cpu
    f32, f64 = Blob((2,), dtype=np.float32), Blob((2,), dtype=np.float64)
    module = object()  # any built module
    assert _cpu.usable(module, f32, f32, f32) and _cpu.usable(module, f64, f64)
    assert not _cpu.usable(module, f32, f32, f64) and not _cpu.usable(module, f64, f32, f64)
    assert not _cpu.usable(module, f64, f32, f32)  # the first blob's dtype is the one all must have
    assert not _cpu.usable(None, f32, f32)
    assert not _cpu.usable(module, Blob((2,), dtype=np.float16), Blob((2,), dtype=np.float16))


@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize("type_name", ["ELU", "BNLL", "Clip"])
def test_in_place_neuron_after_a_reshape(monkeypatch, type_name, kernels):
    """In place, forward saves the bottom (Caffe's bottom_memory_) for backward: after the blob is reshaped
    the saved copy follows the new shape; a backward before the next forward is refused by name. Both CPU
    paths: the kernels and the generic one (the GPU's, and the CPU's without the kernels)."""
    from caffe.layers import _cpu
    if not kernels:
        monkeypatch.setattr(_cpu, "elementwise", None)
    text = "clip_param { min: -0.5 max: 0.5 }" if type_name == "Clip" else ""
    rng = np.random.default_rng(4)
    layer = make_layer(type_name, text, name="n")
    blob = blobs_from_arrays([rng.normal(size=(2, 3))])[0]
    layer.SetUp([blob], [blob])
    for shape in ((2, 3), (4, 5)):
        x = rng.normal(size=shape)
        blob.reshape(shape)
        blob.data[...] = x
        layer.Forward([blob], [blob])
        blob.diff[...] = 1.0
        layer.Backward([blob], [True], [blob])
        fresh = make_layer(type_name, text)
        fb, ft = run_forward(fresh, [x])
        ft[0].diff[...] = 1.0
        fresh.Backward(ft, [True], fb)
        np.testing.assert_array_equal(blob.diff, fb[0].diff)
    blob.reshape((3, 3))
    with pytest.raises(LayerError, match=rf"'n' \({type_name}\): backward in place needs a forward pass first"):
        layer.Backward([blob], [True], [blob])
    fresh = make_layer(type_name, text, name="n")  # in place, no forward yet
    blob = blobs_from_arrays([np.ones((2, 2))])[0]
    fresh.SetUp([blob], [blob])
    with pytest.raises(LayerError, match=rf"'n' \({type_name}\): backward in place needs a forward pass first"):
        fresh.Backward([blob], [True], [blob])


@pytest.mark.parametrize("limits, ok, bad", [
    (dict(exact_num_bottom_blobs=0), [(0, 1)], [(1, 1)]),                       # a data layer: no bottom
    (dict(min_bottom_blobs=2, max_bottom_blobs=3), [(2, 1), (3, 1)], [(1, 1), (4, 1)]),
    (dict(min_top_blobs=1, max_top_blobs=2), [(1, 1), (1, 2)], [(1, 0), (1, 3)]),
    (dict(exact_num_top_blobs=0), [(1, 0)], [(1, 1)]),                          # Silence
])
def test_blob_count_limits_are_inclusive(limits, ok, bad):
    """Caffe's ExactNum/MinBottom/MaxTop...Blobs(): the bounds themselves are allowed, 0 is a real exact
    count, and one past a bound is refused."""
    cls = type("Counted", (Layer,), dict(limits, type="Counted", reshape=lambda self, bottom, top: None))
    for nb, nt in ok:
        cls(layer_param("Counted")).check_blob_counts([None] * nb, [None] * nt)
    for nb, nt in bad:
        with pytest.raises(LayerError, match=r"\(Counted\): expects (exactly|at least|at most) \d+ "
                                             rf"(bottom|top) blob\(s\), got ({nb}|{nt})"):
            cls(layer_param("Counted")).check_blob_counts([None] * nb, [None] * nt)


def test_cpu_feature_probe_answers_for_the_feature_asked():
    from caffe.layers import _cpu
    assert _cpu.cpu_has_avx2("NO_SUCH_FEATURE") is False
    assert _cpu.cpu_has_avx2() is _cpu.cpu_has_avx2("AVX2")  # the default asks for AVX2
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:  # pragma: no cover - NumPy < 2
        from numpy.core._multiarray_umath import __cpu_features__
    have = [name for name, on in __cpu_features__.items() if on]
    assert all(_cpu.cpu_has_avx2(name) is True for name in have[:3])  # as NumPy's own dispatch sees it


def test_kernel_loader_prefers_the_avx2_build_and_falls_back():
    """_load takes name_avx2 when asked and built, else the baseline build, else None (no kernels)."""
    from caffe.layers import _cpu
    base = "caffe.layers.kernels.elementwise"
    assert _cpu._load("elementwise", avx2=False).__name__ == base
    assert _cpu._load("elementwise", avx2=True).__name__ == base + "_avx2"
    assert _cpu._load("channelwise", avx2=True).__name__ == "caffe.layers.kernels.channelwise"  # one build
    assert _cpu._load("no_such_kernels", avx2=True) is None


def test_kernel_loader_prefers_the_avx512_build_and_falls_back():
    """_load takes name_avx512 when asked and built, else name_avx2 (when asked), else the baseline build; the
    AVX-512 probe asks NumPy for every subset the builds are compiled for."""
    from caffe.layers import _cpu
    base = "caffe.layers.kernels."
    assert _cpu._load("elementwise", avx2=True, avx512=True).__name__ == base + "elementwise_avx512"
    assert _cpu._load("softmax", avx2=False, avx512=True).__name__ == base + "softmax_avx512"
    assert _cpu._load("depthwise", avx2=True, avx512=True).__name__ == base + "depthwise_avx2"  # none
    assert _cpu._load("depthwise", avx2=False, avx512=True).__name__ == base + "depthwise"
    assert _cpu._load("elementwise", avx2=True, avx512=False).__name__ == base + "elementwise_avx2"
    assert _cpu._load("normalization", avx2=True, avx512=True).__name__ == base + "normalization_avx512"
    assert _cpu._load("pooling", avx2=True, avx512=False).__name__ == base + "pooling_avx2"
    assert _cpu.cpu_has_avx512() == all(_cpu.cpu_has_avx2(f) for f in ("AVX512F", "AVX512DQ", "AVX512VL", "AVX512BW"))


@pytest.mark.gpu
@pytest.mark.skipif(not context.gpu_available(), reason="needs a usable CUDA GPU (CuPy)")
def test_gpu_forward_returns_the_loss_as_a_deferred_device_scalar():
    """In GPU mode Forward's loss stays on the device until read (no copy per iteration), and reads as the
    CPU's float; without a loss weight it is 0.0."""
    from caffe.blob.deferred import DeviceScalar
    x, y = np.array([[1.0, 2.0], [0.5, -1.0]]), np.zeros((2, 2))
    context.set_mode_gpu()
    try:
        layer = make_layer("EuclideanLoss", "loss_weight: 3")
        bottom, top = blobs_from_arrays([x, y], np.float32), empty_tops(1, np.float32)
        layer.SetUp(bottom, top)
        loss = layer.Forward(bottom, top)
        assert isinstance(loss, DeviceScalar)
        assert float(loss) == pytest.approx(3 * (x ** 2).sum() / 4, rel=1e-6)
        sig = make_layer("Sigmoid")
        b, t = blobs_from_arrays([x], np.float32), empty_tops(1, np.float32)
        sig.SetUp(b, t)
        assert sig.Forward(b, t) == 0.0
    finally:
        context.set_mode_cpu()


def test_layer_base_defaults():
    """The base class's answers for what a layer does not override (Caffe's Layer defaults)."""
    layer = make_layer("Sigmoid", name="s")
    assert layer.AllowForceBackward(0) is True and layer.AllowForceBackward(3) is True
    assert repr(layer) == "<SigmoidLayer 's' type=Sigmoid>"
    layer.set_param_propagate_down(0, True)
    layer.set_param_propagate_down(2, False)  # extends the list by what is missing, no more
    assert [layer.param_propagate_down(i) for i in range(5)] == [True, True, False, False, False]

    class Bare(Layer):
        type = "Bare"
    bare = Bare(layer_param("Bare"))
    with pytest.raises(NotImplementedError, match="Bare must implement reshape"):
        bare.Reshape([], [])
    with pytest.raises(NotImplementedError, match="Bare implements no forward"):
        bare.forward_xp(np, [], [])
    with pytest.raises(NotImplementedError, match="Bare implements no backward"):
        bare.backward_xp(np, [], [], [])


def test_loss_bottoms_first_dimension_and_zero_axis_bottoms():
    """LossLayer checks the first dimensions (the message names both shapes); a 0-axis bottom has none to
    compare: EuclideanLoss takes it as one item of one value (it raised an IndexError before)."""
    with pytest.raises(LayerError, match=r"same first dimension: bottom\[0\] \(2, 3\) vs bottom\[1\] \(3, 2\)"):
        run_forward(make_layer("EuclideanLoss"), [np.zeros((2, 3)), np.zeros((3, 2))])
    for shapes in (((), ()), ((), (1,)), ((1,), ())):
        layer = make_layer("EuclideanLoss")
        bottom, top = run_forward(layer, [np.full(shapes[0], 3.0), np.full(shapes[1], 1.0)])
        assert top[0].data.item() == 2.0  # (3 - 1)^2 / 2, N = 1
        layer.Backward(top, [True, True], bottom)
        assert bottom[0].diff.item() == 2.0 and bottom[1].diff.item() == -2.0
    with pytest.raises(LayerError, match=r"inputs must have the same dimension: bottom\[0\] \(2,\)"):
        run_forward(make_layer("EuclideanLoss"), [np.zeros(2), np.zeros(())])


def test_gradient_checker_defaults():
    c = GradientChecker()
    assert (c.stepsize, c.threshold, c.seed, c.kink, c.kink_range) == (1e-2, 1e-3, 1701, 0.0, -1.0)


def _check(factor, x, **kw):
    layer = _square(factor)
    bottom, top = blobs_from_arrays([np.asarray(x, np.float64)]), empty_tops(1)
    GradientChecker(**kw).check_gradient_eltwise(layer, bottom, top)


def test_gradient_checker_tolerance_is_relative_to_the_larger_magnitude_and_one():
    """Caffe's rule: |g - e| <= threshold * max(|g|, |e|, 1), each term of the max needed, the bound
    itself allowed. x^2 at x = 2: e = 4 (exact in float64 for these steps)."""
    thr = 1e-3
    _check(1 + 1.0005 * thr, [2.0], threshold=thr)       # within thr * |g|, not thr * |e|
    _check(1 - 0.9995 * thr, [2.0], threshold=thr)       # within thr * |e|, not thr * |g|
    with pytest.raises(GradientCheckError):
        _check(1 + 1.5 * thr, [2.0], threshold=thr)
    # |g|, |e| < 1: the absolute floor thr * 1, not 2 (x = 0.05: g = 0.2 * factor)
    _check(1 + 0.5 * thr / 0.2, [0.05], threshold=thr)
    with pytest.raises(GradientCheckError):
        _check(1 + 1.5 * thr / 0.2, [0.05], threshold=thr)
    # the bound itself: x = 0.25, stepsize 0.5: e = 1 exactly, g = 2, |g - e| = 0.5 * max(2, 1, 1)
    _check(2.0, [0.25], threshold=0.5, stepsize=0.5)


def test_gradient_checker_kink_range_bounds_are_skipped():
    """Elements with |x| in [kink - range, kink + range] are not checked (Caffe's strict comparisons
    outside): a wrong gradient exactly on either bound is not reported, just outside it is."""
    kw = dict(threshold=1e-6, stepsize=1e-4, kink=0.5, kink_range=0.25)
    _check(1.5, [0.25, -0.75, 0.5], **kw)
    for x in (0.2, 0.8):
        with pytest.raises(GradientCheckError):
            _check(1.5, [x], **kw)


@pytest.mark.gpu
@pytest.mark.skipif(not context.gpu_available(), reason="needs a usable CUDA GPU (CuPy)")
def test_gpu_mode_falls_back_to_the_cpu_code_of_a_layer_without_forward_xp():
    """A layer with only forward_cpu / backward_cpu runs them in GPU mode (Caffe's default Forward_gpu);
    a layer with forward_xp runs it with CuPy."""
    class CpuOnly(NeuronLayer):
        type = "CpuOnly"

        def forward_cpu(self, bottom, top):
            top[0].mutable_cpu_data()[...] = 3 * bottom[0].cpu_data()

        def backward_cpu(self, top, propagate_down, bottom):
            if propagate_down[0]:
                bottom[0].mutable_cpu_diff()[...] = 3 * top[0].cpu_diff()

    x = np.array([[1.0, -2.0, 0.5]])
    context.set_mode_gpu()
    try:
        for layer, scale in ((CpuOnly(layer_param("CpuOnly")), 3.0), (_square(), None)):
            bottom, top = blobs_from_arrays([x]), empty_tops(1)
            layer.SetUp(bottom, top)
            layer.Forward(bottom, top)
            top[0].diff[...] = 1.0
            layer.Backward(top, [True], bottom)
            want_y, want_dx = (scale * x, np.full(x.shape, scale)) if scale else (x ** 2, 2 * x)
            np.testing.assert_array_equal(top[0].data, want_y)
            np.testing.assert_array_equal(bottom[0].diff, want_dx)
            bottom[0].diff[...] = 5.0
            layer.Backward(top, [False], bottom)
            if scale:  # propagate_down reaches the layer's own backward
                np.testing.assert_array_equal(bottom[0].diff, 5.0)
    finally:
        context.set_mode_cpu()


_NEURONS = [("ReLU", "relu_param { negative_slope: 0.1 }"), ("Sigmoid", ""), ("TanH", ""), ("ELU", ""),
            ("BNLL", ""), ("Swish", ""), ("Clip", "clip_param { min: -0.5 max: 0.5 }"), ("AbsVal", "")]


@pytest.mark.parametrize("type_name, text, in_place", [(t, x, p) for t, x in _NEURONS for p in (False, True)
                                                       if not (t == "AbsVal" and p)])  # AbsVal refuses in place
def test_neuron_kernels_in_float32(type_name, text, in_place):
    """The CPU kernels take float32 blobs (the nets' dtype) through caffe.layers._cpu: its unused operands
    are empty arrays of the blobs' dtype, not float64."""
    x = np.array([[-1.5, -0.2, 0.3, 2.0]])
    results = []
    for dtype in (np.float32, np.float64):
        layer = make_layer(type_name, text)
        bottom = blobs_from_arrays([x], dtype)
        top = bottom if in_place else empty_tops(1, dtype)
        layer.SetUp(bottom, top)
        layer.Forward(bottom, top)
        y = top[0].data.copy()
        top[0].diff[...] = 1.0
        layer.Backward(top, [True], bottom)
        results.append((y, bottom[0].diff.copy()))
    (y32, dx32), (y64, dx64) = results
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, y64, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dx32, dx64, rtol=1e-6, atol=1e-7)


# -- layers-8, session 7: Eltwise's fused device backward (the CUDA sources run on the host) ------------------


@pytest.mark.skipif(not __import__("caffe.layers.cuda_host", fromlist=["x"]).available(),
                    reason="no host C++ compiler to run the CUDA sources")
@pytest.mark.parametrize("op", ["SUM", "MAX"])
def test_eltwise_device_backward_writes_only_the_bottoms_asked_for(op):
    """Caffe's Eltwise Backward writes the diffs of the bottoms propagate_down asks for, no other: the fused
    device kernels (one pass per bottom asked) must leave bottom[1]'s diff as it was, as the array path does."""
    from caffe.layers import cuda_host, device
    rng = np.random.default_rng(3)
    x0, x1, dy = (rng.normal(size=(2, 3)) for _ in range(3))
    ran = []
    with cuda_host.emulating():
        build = device.raw_kernel
        device.raw_kernel = lambda name, source, dt: ran.append(name) or build(name, source, dt)
        try:
            layer = make_layer("Eltwise", f"eltwise_param {{ operation: {op} }}")
            bottom, top = blobs_from_arrays([x0, x1], np.float32), empty_tops(1, np.float32)
            layer.SetUp(bottom, top)
            layer.forward_xp(np, bottom, top)
            top[0].mutable_diff_xp(np)[...] = dy
            bottom[1].mutable_diff_xp(np)[...] = 7.0
            del ran[:]
            layer.backward_xp(np, top, [True, False], bottom)
        finally:
            device.raw_kernel = build
    assert ran, "the fused backward did not run"
    np.testing.assert_array_equal(bottom[1].cpu_diff(), 7.0)
    won = 1.0 if op == "SUM" else (x0.astype(np.float32) > x1.astype(np.float32))  # Caffe: a tie goes to bottom 1
    np.testing.assert_allclose(bottom[0].cpu_diff(), dy.astype(np.float32) * won, rtol=1e-6)


# -- layers-1 retest (session 8): Accuracy's device path, its count boundaries and per-class denominators ----

_ACC_SCORES = np.array([[3, 1, 0, 0], [0, 0, 0, 5], [0, 1, 4, 0], [0, 0, 2, 1]], np.float32)  # argmax 0, 3, 2, 2


@pytest.mark.gpu
@pytest.mark.skipif(not context.gpu_available(), reason="needs a usable CUDA GPU (CuPy)")
@pytest.mark.parametrize("labels, accuracy, per_class", [
    ([0, 255, 1, 2], 2 / 3, [1, 0, 1, 0]),    # an ignored position (gathers class 0), class 3 never a label
    ([255, 255, 255, 255], 0.0, [0, 0, 0, 0]),  # nothing counted: Caffe's 0, not a division
    ([0, 255, 255, 255], 1.0, [1, 0, 0, 0]),    # a count of exactly 1
])
@pytest.mark.parametrize("mode", ["CPU", "GPU"])
def test_accuracy_counts_only_the_labels_not_ignored_in_both_modes(labels, accuracy, per_class, mode):
    """Caffe's Accuracy: correct / count of non-ignored labels (0 when there are none), per class over that
    class's non-ignored labels; the device path (weighted bincounts, a where on the device) the same."""
    context.set_mode_gpu() if mode == "GPU" else context.set_mode_cpu()
    try:
        layer = make_layer("Accuracy", "accuracy_param { ignore_label: 255 }")
        bottom = blobs_from_arrays([_ACC_SCORES, np.array(labels, np.float32)], np.float32)
        top = empty_tops(2, np.float32)
        layer.SetUp(bottom, top)
        layer.Forward(bottom, top)
        got, got_per_class = float(top[0].data), top[1].data.copy()
    finally:
        context.set_mode_cpu()
    assert got == pytest.approx(accuracy, rel=1e-6)
    np.testing.assert_allclose(got_per_class, per_class, rtol=1e-6)


# -- layers-2 retest (session 8): MVN's Backward reads the statistics its Forward saved, or says it has none --


def test_mvn_backward_without_its_forward_is_a_named_error():
    """MVN (normalize_variance) keeps z and std in its temp_/variance_ blobs for Backward: a Backward with no
    Forward before it, or after a Reshape to another shape, is the layer's error, not a crash or stale data."""
    x = np.random.default_rng(0).normal(size=(2, 3, 4)).astype(np.float32)
    layer = make_layer("MVN", "mvn_param { normalize_variance: true }", name="mvn")
    bottom, top = blobs_from_arrays([x], np.float32), empty_tops(1, np.float32)
    layer.SetUp(bottom, top)
    top[0].diff[...] = 1.0
    with pytest.raises(LayerError, match=r"'mvn' \(MVN\): backward needs a forward pass first \(no saved statistics\)"):
        layer.Backward(top, [True], bottom)
    layer.Forward(bottom, top)
    layer.Backward(top, [True], bottom)  # now it has them
    bottom[0].reshape(3, 3, 4)
    layer.Reshape(bottom, top)
    top[0].diff[...] = 1.0
    with pytest.raises(LayerError, match="backward needs a forward pass first"):
        layer.Backward(top, [True], bottom)


# -- layers-3 retest (session 8): SigmoidCrossEntropyLoss's targets of another shape; Backward before Forward -


def test_sigmoid_cross_entropy_reads_targets_of_any_shape_with_the_count():
    """Caffe checks only the counts: targets shaped (N, 6) for scores (N, 3, 2) are the same targets."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, 3, 2)).astype(np.float32)
    t = (rng.uniform(size=(2, 3, 2)) > 0.5).astype(np.float32)
    results = []
    for target in (t, t.reshape(2, 6)):
        layer = make_layer("SigmoidCrossEntropyLoss")
        bottom, top = blobs_from_arrays([x, target], np.float32), empty_tops(1, np.float32)
        layer.SetUp(bottom, top)
        layer.Forward(bottom, top)
        top[0].diff[...] = 1.0
        layer.Backward(top, [True, False], bottom)
        results.append((float(top[0].data), bottom[0].diff.copy()))
    expected = -(x * (t - (x >= 0)) - np.log1p(np.exp(-np.abs(x)))).sum() / 2
    assert results[0][0] == pytest.approx(expected, rel=1e-5)
    assert results[1][0] == results[0][0]
    np.testing.assert_array_equal(results[1][1], results[0][1])


@pytest.mark.parametrize("type_name, text, n_bottom, saved", [
    ("SigmoidCrossEntropyLoss", "", 2, "no saved sigmoid output"),
    ("EuclideanLoss", "", 2, "no saved difference"),
    ("ContrastiveLoss", "", 3, "no saved differences"),
])
def test_loss_backward_without_its_forward_is_a_named_error(type_name, text, n_bottom, saved):
    """Backward reads what Forward saved (Caffe's sigmoid_output_, diff_): with no Forward before it, or after
    a Reshape to another batch, it is the layer's error naming what is missing, not an AttributeError."""
    rng = np.random.default_rng(1)
    arrays = [rng.normal(size=(2, 3)), rng.normal(size=(2, 3)), np.array([1.0, 0.0])][:n_bottom]
    layer = make_layer(type_name, text, name="loss")
    bottom, top = blobs_from_arrays(arrays, np.float32), empty_tops(1, np.float32)
    layer.SetUp(bottom, top)
    down = [True] + [False] * (n_bottom - 1)
    top[0].diff[...] = 1.0
    message = rf"'loss' \({type_name}\): backward needs a forward pass first \({saved}\)$"
    with pytest.raises(LayerError, match=message):
        layer.Backward(top, down, bottom)
    layer.Forward(bottom, top)
    layer.Backward(top, down, bottom)
    arrays = [np.concatenate([a, a]) for a in arrays]  # a batch of 4
    for b, a in zip(bottom, arrays):
        b.reshape(a.shape)
        b.data[...] = a
    layer.Reshape(bottom, top)
    top[0].diff[...] = 1.0
    with pytest.raises(LayerError, match=message):
        layer.Backward(top, down, bottom)


def test_label_out_of_range_message_names_the_ignore_label_only_when_there_is_one():
    scores = np.zeros((2, 5))
    with pytest.raises(LayerError, match=r"label value 7 is out of range: labels must be integers in \[0, 5\)$"):
        run_forward(make_layer("SoftmaxWithLoss"), [scores, np.array([0.0, 7.0])])
    with pytest.raises(LayerError, match=r"in \[0, 5\) or the ignore_label 255$"):
        run_forward(make_layer("SoftmaxWithLoss", "loss_param { ignore_label: 255 }"), [scores, np.array([7.0, 0.0])])


def test_softmax_loss_backward_without_its_forward_is_a_named_error():
    """SoftmaxWithLoss's Backward reads the normalizer its Forward kept (normalizer_): with no Forward before
    it, the layer's error naming it (was reached by no test: an AttributeError or another text survived)."""
    layer = make_layer("SoftmaxWithLoss", "", name="loss")
    bottom = blobs_from_arrays([np.random.default_rng(1).normal(size=(2, 3)), np.array([1.0, 0.0])], np.float32)
    top = empty_tops(1, np.float32)
    layer.SetUp(bottom, top)
    top[0].diff[...] = 1.0
    with pytest.raises(LayerError, match=r"'loss' \(SoftmaxWithLoss\): backward needs a forward pass first "
                                         r"\(no saved normalizer\)$"):
        layer.Backward(top, [True, False], bottom)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("text", ["", "loss_param { ignore_label: 1 }", "loss_param { normalization: BATCH_SIZE }",
                                  "loss_param { ignore_label: 0 normalization: FULL }"])
def test_softmax_loss_without_the_compiled_kernel_matches_it(monkeypatch, text, dtype):
    """SoftmaxWithLoss's NumPy fallback (no compiled softmax kernel: forward_cpu's and backward_cpu's other
    branch, reached by no test before) gives the kernel's loss, probabilities and diff."""
    from caffe.layers import _cpu
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 4, 3))
    labels = rng.integers(0, 4, size=(2, 3)).astype(np.float64)
    results = []
    for kernel in (_cpu.softmax, None):
        monkeypatch.setattr(_cpu, "softmax", kernel)
        layer = make_layer("SoftmaxWithLoss", text, name="loss")
        bottom, top = blobs_from_arrays([x, labels], dtype), empty_tops(2, dtype)
        layer.SetUp(bottom, top)
        layer.Forward(bottom, top)
        top[0].diff[...] = 2.0
        layer.Backward(top, [True, False], bottom)
        results.append((top[0].data.copy(), top[1].data.copy(), bottom[0].diff.copy()))
    assert _cpu.softmax is None and results[0][0] != 0
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def _softmax_loss_on_host_and_device(text, x, labels):
    """[(loss, bottom diff) in CPU mode, the same in GPU mode] of a SoftmaxWithLoss forward and backward."""
    results = []
    for mode in (context.CPU, context.GPU):
        context.set_mode(mode)
        try:
            layer = make_layer("SoftmaxWithLoss", text, name="loss")
            bottom, top = run_forward(layer, [x, np.array(labels)])
            top[0].diff[...] = 1.0
            layer.Backward(top, [True, False], bottom)
            results.append((float(top[0].data), bottom[0].diff.copy()))
        finally:
            context.set_mode_cpu()
    return results


@pytest.mark.gpu
@pytest.mark.skipif(not context.gpu_available(), reason="needs a usable CUDA GPU (CuPy)")
def test_softmax_loss_on_the_device_with_one_valid_label_and_a_bad_one():
    """On the device, VALID divides by the count of non-ignored labels with a floor of 1 (here exactly 1: a
    floor of 2 halved it), as on the host; a label out of range is the layer's error naming the first one,
    raised at the next read of a loss (the parity tests had neither)."""
    from caffe.blob import deferred
    x = np.random.default_rng(2).normal(size=(3, 4))
    text = "loss_param { ignore_label: 255 normalization: VALID }"
    results = _softmax_loss_on_host_and_device(text, x, [2.0, 255.0, 255.0])
    p = np.exp(x[0]) / np.exp(x[0]).sum()
    assert results[0][0] == pytest.approx(-np.log(p[2]), rel=1e-9)
    assert results[1][0] == pytest.approx(results[0][0], rel=1e-9)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-9, atol=1e-12)
    context.set_mode_gpu()
    try:
        deferred.discard()
        run_forward(make_layer("SoftmaxWithLoss", text, name="loss"), [x, np.array([2.0, 7.0, 4.0])])
        with pytest.raises(LayerError, match=r"'loss' \(SoftmaxWithLoss\): label value 7 is out of range: labels must "
                                             r"be integers in \[0, 4\) or the ignore_label 255 \(found on the "
                                             r"device; raised at the next read of a loss\)$"):
            deferred.flush()
    finally:
        deferred.discard()
        context.set_mode_cpu()


@pytest.mark.gpu
@pytest.mark.skipif(not context.gpu_available(), reason="needs a usable CUDA GPU (CuPy)")
def test_softmax_loss_on_the_device_with_a_single_class_and_an_ignored_label():
    """An ignored position gathers class 0, the only class there is (gathering class 1 ran past the axis)."""
    x = np.random.default_rng(2).normal(size=(3, 1))
    results = _softmax_loss_on_host_and_device("loss_param { ignore_label: 255 }", x, [0.0, 255.0, 0.0])
    assert results[0][0] == 0.0 and results[1][0] == 0.0  # softmax over one class is 1
    np.testing.assert_array_equal(results[1][1], results[0][1])

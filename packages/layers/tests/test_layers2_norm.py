"""BatchNorm, MVN, Scale and Bias: gradient properties, Caffe's forward formulas, stored blobs, errors."""
import numpy as np
import pytest
from hypothesis import assume, example, given, strategies as st

from caffe.blob import Blob
from caffe.layers import LayerError, create_layer
from caffe.layers.strategies import random_array, seeds, shapes
from caffe.layers.testing import check_layer_gradient, make_layer, run_forward

TRAIN, TEST = 0, 1


class BottomOnly:
    """Gradient-check only the bottoms: Caffe defines no gradient for BatchNorm's statistics blobs."""

    def __init__(self, layer):
        self.layer, self.blobs, self.name, self.type = layer, [], layer.name, layer.type

    def SetUp(self, bottom, top):
        self.layer.SetUp(bottom, top)

    def Forward(self, bottom, top):
        return self.layer.Forward(bottom, top)

    def Backward(self, top, propagate_down, bottom):
        self.layer.Backward(top, propagate_down, bottom)


def channel_stats(x):
    xr = x.reshape(x.shape[0], x.shape[1] if x.ndim > 1 else 1, -1)
    return xr.mean(axis=(0, 2)), xr.var(axis=(0, 2)), xr


# -- BatchNorm ------------------------------------------------------------------------------------
bn_shapes = shapes(2, 4, 1, 3).filter(lambda s: int(np.prod(s)) // s[1] >= 3 and int(np.prod(s)) <= 24)


@given(shape=bn_shapes, seed=seeds(), eps=st.sampled_from([1e-5, 1e-3, 0.1]),
       maf=st.sampled_from([0.999, 0.5, 0.0]))
def test_batch_norm_gradient_train(shape, seed, eps, maf):
    x = random_array(seed, shape)
    assume(channel_stats(x)[1].min() > 0.02)
    layer = make_layer("BatchNorm", f"batch_norm_param {{ eps: {eps} moving_average_fraction: {maf} }}",
                       phase=TRAIN)
    check_layer_gradient(layer, [x])
    assert layer.use_global_stats is False


@given(shape=bn_shapes, seed=seeds(), eps=st.sampled_from([1e-5, 0.1]), factor=st.sampled_from([0.0, 1.0, 2.5]))
def test_batch_norm_gradient_global_stats(shape, seed, eps, factor):
    x = random_array(seed, shape)
    c = shape[1]
    layer = make_layer("BatchNorm", f"batch_norm_param {{ use_global_stats: true eps: {eps} }}", phase=TRAIN)
    bottom, top = run_forward(layer, [x])
    rng = np.random.default_rng(seed)
    layer.blobs[0].data[...] = rng.uniform(-1, 1, c)
    layer.blobs[1].data[...] = rng.uniform(0.2, 2, c)
    layer.blobs[2].data[...] = factor
    check_layer_gradient(BottomOnly(layer), [x])
    # forward uses the stored statistics divided by the scale factor (0 when the factor is 0)
    layer.Forward(bottom, top)
    f = 0.0 if factor == 0 else 1.0 / factor
    mean = layer.blobs[0].data * f
    var = layer.blobs[1].data * f
    xr = x.reshape(shape[0], c, -1)
    want = (xr - mean[None, :, None]) / np.sqrt(var[None, :, None] + np.float32(eps))
    np.testing.assert_allclose(top[0].data.reshape(want.shape), want, rtol=1e-12)


def test_batch_norm_moving_averages_as_caffe_stores_them():
    rng = np.random.default_rng(0)
    x1, x2 = rng.normal(size=(4, 3, 2, 2)), rng.normal(size=(4, 3, 2, 2))
    maf = 0.75
    layer = make_layer("BatchNorm", f"batch_norm_param {{ moving_average_fraction: {maf} }}", phase=TRAIN)
    bottom, top = run_forward(layer, [x1])
    bottom[0].data[...] = x2
    layer.Forward(bottom, top)
    m = x1.size // 3
    mu1, v1, _ = channel_stats(x1)
    mu2, v2, xr2 = channel_stats(x2)
    np.testing.assert_allclose(layer.blobs[2].data, [maf * 1 + 1])
    np.testing.assert_allclose(layer.blobs[0].data, maf * mu1 + mu2, rtol=1e-12)
    np.testing.assert_allclose(layer.blobs[1].data, maf * (m / (m - 1) * v1) + m / (m - 1) * v2, rtol=1e-12)
    # TRAIN output uses the batch statistics (biased variance)
    want = (xr2 - mu2[None, :, None]) / np.sqrt(v2[None, :, None] + np.float32(1e-5))
    np.testing.assert_allclose(top[0].data.reshape(want.shape), want, rtol=1e-10)
    # lr_mult 0 forced on the three statistics blobs
    assert [p.lr_mult for p in layer.layer_param.param] == [0, 0, 0]


def test_batch_norm_test_phase_defaults_to_global_stats_and_loads_blobs():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(5, 2, 3))
    train = make_layer("BatchNorm", phase=TRAIN)
    run_forward(train, [rng.normal(size=(5, 2, 3))])
    saved = train.to_proto()
    saved.phase = TEST
    test = create_layer(saved)
    assert len(test.blobs) == 3
    _, top = run_forward(test, [x])
    assert test.use_global_stats is True
    s = test.blobs[2].data[0]
    mean, var = test.blobs[0].data / s, test.blobs[1].data / s
    want = (x - mean[None, :, None]) / np.sqrt(var[None, :, None] + np.float32(1e-5))
    np.testing.assert_allclose(top[0].data, want, rtol=1e-6)
    # an explicit use_global_stats: false wins over the TEST default
    forced = make_layer("BatchNorm", "batch_norm_param { use_global_stats: false }", phase=TEST)
    run_forward(forced, [x])
    assert forced.use_global_stats is False


def test_batch_norm_in_place_matches_out_of_place():
    rng = np.random.default_rng(2)
    x, dy = rng.normal(size=(3, 2, 4)), rng.normal(size=(3, 2, 4))
    a = make_layer("BatchNorm", phase=TRAIN)
    bottom, top = run_forward(a, [x])
    top[0].diff[...] = dy
    a.Backward(top, [True], bottom)
    b = make_layer("BatchNorm", phase=TRAIN)
    blob = Blob(x.shape, dtype=np.float64)
    blob.data[...] = x
    b.SetUp([blob], [blob])
    b.Forward([blob], [blob])
    np.testing.assert_allclose(blob.data, top[0].data)
    blob.diff[...] = dy
    b.Backward([blob], [True], [blob])
    np.testing.assert_allclose(blob.diff, bottom[0].diff)


def test_batch_norm_errors():
    with pytest.raises(LayerError, match=r"param\[0\]\.lr_mult"):
        run_forward(make_layer("BatchNorm", "param { lr_mult: 1 }"), [np.ones((2, 3))])
    layer = make_layer("BatchNorm")
    bottom, top = run_forward(layer, [np.arange(6.0).reshape(2, 3)])
    bottom[0].reshape(2, 4)
    with pytest.raises(LayerError, match=r"BatchNorm.*4 channels.*\(2, 4\).*set up with 3"):
        layer.Forward(bottom, top)


# -- MVN --------------------------------------------------------------------------------------------
@given(shape=shapes(2, 4, 1, 3).filter(lambda s: 2 <= int(np.prod(s[2:])) and int(np.prod(s)) <= 24),
       seed=seeds(), across=st.booleans(), normalize=st.booleans(), eps=st.sampled_from([1e-9, 1e-3, 0.5]))
def test_mvn_gradient(shape, seed, across, normalize, eps):
    x = random_array(seed, shape)
    rows = shape[0] if across else shape[0] * shape[1]
    assume(x.reshape(rows, -1).std(axis=1).min() > 0.1)
    text = (f"mvn_param {{ across_channels: {str(across).lower()} "
            f"normalize_variance: {str(normalize).lower()} eps: {eps} }}")
    bottom, top = check_layer_gradient(make_layer("MVN", text), [x])
    xr = x.reshape(rows, -1)
    want = xr - xr.mean(axis=1, keepdims=True)
    if normalize:  # Caffe adds eps to the standard deviation
        want = want / (xr.std(axis=1, keepdims=True) + np.float32(eps))
    layer = make_layer("MVN", text)
    _, top = run_forward(layer, [x])
    np.testing.assert_allclose(top[0].data.reshape(rows, -1), want, rtol=1e-10, atol=1e-12)


def test_mvn_constant_rows_have_finite_gradient():
    layer = make_layer("MVN")
    bottom, top = run_forward(layer, [np.full((2, 2, 3), 0.5)])
    top[0].diff[...] = np.random.default_rng(0).normal(size=(2, 2, 3))
    layer.Backward(top, [True], bottom)
    assert np.isfinite(bottom[0].diff).all()
    np.testing.assert_allclose(top[0].data, 0)


# -- Scale and Bias ---------------------------------------------------------------------------------
@st.composite
def broadcast_case(draw, max_count=18):
    shape = draw(shapes(1, 4, 1, 3).filter(lambda s: int(np.prod(s)) <= max_count))
    n = len(shape)
    axis = draw(st.integers(-n, n - 1))
    a = axis % n
    num_axes = draw(st.integers(-1, n - a))
    operand = shape[a:] if num_axes == -1 else shape[a:a + num_axes]
    return shape, axis, num_axes, tuple(operand), draw(seeds())


# Two bottoms: the scale's (and the bias's) shape is bottom[1]'s, whatever scale_param.num_axes says (Caffe
# gives the internal Bias layer bottom[1]'s num_axes); the examples pin that with num_axes left at its
# default (1) and a scale of 2, 3 and 0 axes, plus the one-bottom boundaries num_axes -1 and 0.
@given(case=broadcast_case(), two_bottoms=st.booleans(), bias_term=st.booleans(), write_num_axes=st.booleans())
@example(case=((2, 3, 2), 0, 2, (2, 3), 11), two_bottoms=True, bias_term=True, write_num_axes=False)
@example(case=((2, 3, 2, 2), 1, -1, (3, 2, 2), 12), two_bottoms=True, bias_term=True, write_num_axes=False)
@example(case=((3, 2), -1, 0, (), 13), two_bottoms=True, bias_term=True, write_num_axes=False)
@example(case=((2, 3, 2), 1, -1, (3, 2), 14), two_bottoms=False, bias_term=True, write_num_axes=True)
@example(case=((2, 3, 2), 1, 0, (), 15), two_bottoms=False, bias_term=True, write_num_axes=True)
def test_scale_gradient(case, two_bottoms, bias_term, write_num_axes):
    shape, axis, num_axes, sshape, seed = case
    x = random_array(seed, shape)
    # num_axes may be left out where it is the default (1) or where bottom[1] decides the shape anyway
    num_axes_text = f"num_axes: {num_axes} " if write_num_axes or not (two_bottoms or num_axes == 1) else ""
    text = (f"scale_param {{ axis: {axis} {num_axes_text}filler {{ type: 'gaussian' std: 1 }} "
            f"bias_term: {str(bias_term).lower()} bias_filler {{ type: 'uniform' min: -1 max: 1 }} }}")
    bottoms = [x, random_array(seed + 1, sshape)] if two_bottoms else [x]
    layer = make_layer("Scale", text)
    bottom, top = check_layer_gradient(layer, bottoms)
    s = bottom[1].data if two_bottoms else layer.blobs[0].data
    assert s.shape == sshape
    a = axis % len(shape) if sshape else 0
    want = x * s.reshape(sshape + (1,) * (len(shape) - a - len(sshape)))
    if bias_term:
        bias = layer.blobs[-1].data
        assert bias.shape == sshape and len(layer.blobs) == (1 if two_bottoms else 2)
        want = want + bias.reshape(sshape + (1,) * (len(shape) - a - len(sshape)))
    layer.Forward(bottom, top)
    np.testing.assert_allclose(top[0].data, want, rtol=1e-12)


@given(case=broadcast_case(), two_bottoms=st.booleans())
def test_bias_gradient(case, two_bottoms):
    shape, axis, num_axes, bshape, seed = case
    x = random_array(seed, shape)
    text = f"bias_param {{ axis: {axis} num_axes: {num_axes} filler {{ type: 'gaussian' std: 1 }} }}"
    bottoms = [x, random_array(seed + 1, bshape)] if two_bottoms else [x]
    layer = make_layer("Bias", text)
    bottom, top = check_layer_gradient(layer, bottoms)
    b = bottom[1].data if two_bottoms else layer.blobs[0].data
    a = axis % len(shape) if bshape else 0
    layer.Forward(bottom, top)  # the checker leaves the top of a perturbed forward
    np.testing.assert_allclose(top[0].data, x + b.reshape(bshape + (1,) * (len(shape) - a - len(bshape))))


def test_scale_default_fillers_and_param_diff_accumulates():
    layer = make_layer("Scale", "scale_param { bias_term: true }")
    bottom, top = run_forward(layer, [np.arange(12.0).reshape(2, 3, 2)])
    np.testing.assert_array_equal(layer.blobs[0].data, 1)   # scale: constant 1
    np.testing.assert_array_equal(layer.blobs[1].data, 0)   # bias: constant 0
    np.testing.assert_array_equal(top[0].data, bottom[0].data)
    top[0].diff[...] = 1
    for b in layer.blobs:
        b.diff[...] = 0
    layer.Backward(top, [True], bottom)
    layer.Backward(top, [True], bottom)
    np.testing.assert_allclose(layer.blobs[0].diff, 2 * bottom[0].data.sum(axis=(0, 2)))
    np.testing.assert_allclose(layer.blobs[1].diff, 2 * 4)


def test_scale_in_place_and_reload():
    rng = np.random.default_rng(3)
    x, dy = rng.normal(size=(2, 3, 2)), rng.normal(size=(2, 3, 2))
    text = "scale_param { bias_term: true filler { type: 'gaussian' } bias_filler { type: 'gaussian' } }"
    a = make_layer("Scale", text)
    bottom, top = run_forward(a, [x])
    top[0].diff[...] = dy
    a.Backward(top, [True], bottom)
    # a reloaded copy (caffemodel blobs) used in place gives the same forward and gradients
    b = create_layer(a.to_proto())
    blob = Blob(x.shape, dtype=np.float64)
    blob.data[...] = x
    b.SetUp([blob], [blob])
    np.testing.assert_allclose(b.blobs[0].data, a.blobs[0].data, rtol=1e-6)
    np.testing.assert_allclose(b.blobs[1].data, a.blobs[1].data, rtol=1e-6)
    for p in b.blobs:
        p.diff[...] = 0
    b.Forward([blob], [blob])
    np.testing.assert_allclose(blob.data, top[0].data, rtol=1e-6)
    blob.diff[...] = dy
    b.Backward([blob], [True], [blob])
    np.testing.assert_allclose(blob.diff, bottom[0].diff, rtol=1e-6)
    np.testing.assert_allclose(b.blobs[0].diff, a.blobs[0].diff, rtol=1e-6)
    np.testing.assert_allclose(b.blobs[1].diff, a.blobs[1].diff, rtol=1e-6)


def test_scale_bias_shape_errors():
    with pytest.raises(LayerError, match=r"Scale.*bottom\[1\] \(the scale\) shape \(4,\).*\(2, 3, 2\)"):
        run_forward(make_layer("Scale"), [np.ones((2, 3, 2)), np.ones(4)])
    with pytest.raises(LayerError, match=r"Bias.*bias_param.*too few axes"):
        run_forward(make_layer("Bias", "bias_param { axis: 1 num_axes: 3 }"), [np.ones((2, 3, 2))])
    with pytest.raises(LayerError, match=r"scale_param.axis 5 is out of range.*\(2, 3\)"):
        run_forward(make_layer("Scale", "scale_param { axis: 5 }"), [np.ones((2, 3))])


@pytest.mark.parametrize("across", [False, True])
def test_mvn_on_1d_and_2d_bottoms(across):
    # rows are (num, channels) unless across_channels; a 1-d bottom has one channel
    x = np.array([[1.0, 3.0, 5.0], [2.0, 2.0, 8.0]])
    text = f"mvn_param {{ across_channels: {str(across).lower()} normalize_variance: false }}"
    _, top = run_forward(make_layer("MVN", text), [x])
    want = x - x.mean(axis=1, keepdims=True) if across else np.zeros_like(x)  # (n, c) rows hold one value
    np.testing.assert_allclose(top[0].data, want)
    _, top = run_forward(make_layer("MVN", text), [np.array([1.0, 4.0])])
    np.testing.assert_allclose(top[0].data, [0.0, 0.0])

    with pytest.raises(LayerError, match=r"bottom\[0\] must have at least one axis, got shape \(\)"):
        run_forward(make_layer("MVN", text), [np.array(1.0)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bias_backward_touches_only_what_was_asked(dtype):
    """Caffe's BiasLayer::Backward: the bottom diff only with propagate_down[0], the learned bias's diff only
    with param_propagate_down(0), a second bottom's diff only with propagate_down[1]."""
    rng = np.random.default_rng(0)
    x, dy = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 3, 4))
    layer = make_layer("Bias", "bias_param { axis: 1 num_axes: 1 }")
    bottom, top = run_forward(layer, [x], dtype=dtype)
    top[0].diff[...] = dy
    layer.set_param_propagate_down(0, False)  # a fixed bias (lr_mult 0): the bottom still gets its diff
    layer.Backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, dy.astype(dtype))
    assert not layer.blobs[0].diff.any()
    bottom[0].diff[...] = 0
    layer.set_param_propagate_down(0, True)
    layer.Backward(top, [False], bottom)
    assert not bottom[0].diff.any()
    np.testing.assert_allclose(layer.blobs[0].diff, dy.sum(axis=(0, 2)), rtol=1e-5)
    # two bottoms: the bias bottom's diff only when asked
    layer = make_layer("Bias", "bias_param { axis: 1 }")
    bottom, top = run_forward(layer, [x, rng.normal(size=(3, 4))], dtype=dtype)
    top[0].diff[...] = dy
    layer.Backward(top, [True, False], bottom)
    np.testing.assert_array_equal(bottom[0].diff, dy.astype(dtype))
    assert not bottom[1].diff.any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("in_place", [False, True])
def test_scale_backward_touches_only_what_was_asked(dtype, in_place):
    """As Caffe's ScaleLayer::Backward: the bottom diff only with propagate_down[0], the learned scale's diff
    only with param_propagate_down(0); in place, the scale's diff still uses the bottom's data."""
    rng = np.random.default_rng(1)
    x, dy = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 3, 4))
    layer = make_layer("Scale", "scale_param { axis: 1 num_axes: 1 filler { type: 'gaussian' } }")
    b = Blob(x.shape, dtype=dtype)
    b.data[...] = x
    top = [b] if in_place else [Blob(dtype=dtype)]
    layer.SetUp([b], top)
    layer.Forward([b], top)
    s = layer.blobs[0].data.astype(np.float64).reshape(1, 3, 1)
    top[0].diff[...] = dy
    layer.set_param_propagate_down(0, False)
    layer.Backward(top, [True], [b])
    np.testing.assert_allclose(b.diff, dy * s, rtol=1e-5)
    assert not layer.blobs[0].diff.any()
    if in_place:
        return
    b.diff[...] = 0
    layer.set_param_propagate_down(0, True)
    layer.Backward(top, [False], [b])
    assert not b.diff.any()
    np.testing.assert_allclose(layer.blobs[0].diff, (dy * x).sum(axis=(0, 2)), rtol=1e-5)


def test_scale_in_place_gradient_of_the_scale_uses_the_bottom_data():
    rng = np.random.default_rng(2)
    x, dy = rng.normal(size=(2, 3, 4)).astype(np.float32), rng.normal(size=(2, 3, 4)).astype(np.float32)
    layer = make_layer("Scale", "scale_param { axis: 1 num_axes: 1 filler { type: 'gaussian' } }")
    b = Blob(x.shape, dtype=np.float32)
    b.data[...] = x
    layer.SetUp([b], [b])
    layer.Forward([b], [b])
    b.diff[...] = dy
    layer.Backward([b], [True], [b])
    np.testing.assert_allclose(layer.blobs[0].diff, (dy * x).sum(axis=(0, 2)), rtol=1e-4)


@pytest.mark.parametrize("path", ["cpu", "xp"])
def test_scale_in_place_backward_before_forward_is_named(path):
    """In place, the scale's gradient needs the bottom data forward saved (Caffe's temp_): a backward with no
    forward before it (or after a reshape to a new shape) is refused by name, on both paths."""
    layer = make_layer("Scale", "scale_param { axis: 1 num_axes: 1 }", name="sc")
    b = Blob((2, 3, 4), dtype=np.float32)
    layer.SetUp([b], [b])
    backward = layer.backward_cpu if path == "cpu" else (lambda *a: layer.backward_xp(np, *a))
    with pytest.raises(LayerError, match=r"'sc' \(Scale\): backward in place needs a forward pass first"):
        backward([b], [True], [b])
    layer.Forward([b], [b])
    b.Reshape((2, 3, 5))
    layer.reshape([b], [b])
    with pytest.raises(LayerError, match=r"'sc' \(Scale\): backward in place needs a forward pass first"):
        backward([b], [True], [b])

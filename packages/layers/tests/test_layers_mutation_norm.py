"""Mutation survivors of BatchNorm, LRN and Dropout (docs/MUTATION.md, layers-11): the CPU path (compiled
kernels) and the generic NumPy path (the kernel module set to None: the GPU's code, run on the CPU) against
Caffe's formulas, in and out of place, both dtypes; state checks (backward before forward, after a
reshape), `propagate_down` False, and the stored-blob checks."""
import numpy as np
import pytest

from caffe.blob import Blob, context
from caffe.layers import LayerError, _cpu
from caffe.layers.testing import blobs_from_arrays, empty_tops, make_layer

TRAIN, TEST = 0, 1
f32 = lambda v: float(np.float32(v))  # noqa: E731  parameter fields are float32
PATHS = pytest.mark.parametrize("generic", [False, True], ids=["cpu", "generic"])
# The CPU path through each build of kernels.normalization too (base, avx2, avx512: a skip where this CPU cannot
# run it), beside the loaded one ("cpu") and the generic NumPy path.
BUILD_PATHS = pytest.mark.parametrize("generic, build", [(False, None), (True, None), (False, "base"), (False, "avx2"),
                                                         (False, "avx512")],
                                      ids=["cpu", "generic", "base", "avx2", "avx512"])


def use_path(monkeypatch, generic, build):
    if generic:
        monkeypatch.setattr(_cpu, "normalization", None)
    elif build is not None:
        import os
        import sys
        sys.path.insert(0, os.path.dirname(__file__))
        from kernels_harness import build_module
        monkeypatch.setattr(_cpu, "normalization", build_module("normalization", build))
DTYPES = pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])


def forward_backward(layer, x, dy, dtype, in_place=False):
    if in_place:
        blob = blobs_from_arrays([x], dtype)[0]
        bottom = top = [blob]
    else:
        bottom, top = blobs_from_arrays([x], dtype), empty_tops(1, dtype)
    layer.SetUp(bottom, top)
    layer.Forward(bottom, top)
    y = top[0].data.copy()
    top[0].diff[...] = dy
    layer.Backward(top, [True], bottom)
    return y, bottom[0].diff.copy()


def tol(dtype):
    return dict(rtol=2e-4, atol=2e-5) if dtype == np.float32 else dict(rtol=1e-9, atol=1e-11)


# -- BatchNorm ------------------------------------------------------------------------------------

def bn_reference(x, dy, eps, stats=None):
    """Caffe's BatchNorm: batch statistics (biased variance) or the stored (mean, var); y and dx."""
    n = x.shape[0]
    c = 1 if x.ndim == 1 else x.shape[1]
    xr, dyr = x.reshape(n, c, -1), dy.reshape(n, c, -1)
    mean, var = stats if stats is not None else (xr.mean(axis=(0, 2)), xr.var(axis=(0, 2)))
    inv = 1 / np.sqrt(var + eps)
    y = (xr - mean[None, :, None]) * inv[None, :, None]
    if stats is not None:
        dx = dyr * inv[None, :, None]
    else:
        dx = (dyr - dyr.mean(axis=(0, 2), keepdims=True)
              - y * (dyr * y).mean(axis=(0, 2), keepdims=True)) * inv[None, :, None]
    return y.reshape(x.shape), dx.reshape(x.shape)


BN_SHAPES = [(5,), (4, 3), (3, 2, 5), (2, 3, 2, 3)]


@BUILD_PATHS
@DTYPES
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "inplace"])
@pytest.mark.parametrize("shape", BN_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_batch_norm_batch_statistics_both_paths(shape, in_place, dtype, generic, build, monkeypatch):
    use_path(monkeypatch, generic, build)
    rng = np.random.default_rng(len(shape))
    x, dy = rng.normal(1.0, 2.0, shape), rng.normal(size=shape)
    maf = 0.5
    layer = make_layer("BatchNorm", f"batch_norm_param {{ eps: 0.01 moving_average_fraction: {maf} }}", phase=TRAIN)
    y, dx = forward_backward(layer, x, dy, dtype, in_place)
    want_y, want_dx = bn_reference(x, dy, f32(0.01))
    np.testing.assert_allclose(y, want_y, **tol(dtype))
    np.testing.assert_allclose(dx, want_dx, **tol(dtype))
    # one forward from zeroed blobs: the sums are the batch's mean and unbiased variance, the factor 1
    n = shape[0]
    xr = x.reshape(n, 1 if x.ndim == 1 else shape[1], -1)
    m = xr.shape[0] * xr.shape[2]
    np.testing.assert_allclose(layer.blobs[0].data, xr.mean(axis=(0, 2)), **tol(dtype))
    np.testing.assert_allclose(layer.blobs[1].data, xr.var(axis=(0, 2)) * m / (m - 1), **tol(dtype))
    np.testing.assert_array_equal(layer.blobs[2].data, [1.0])


@PATHS
@DTYPES
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "inplace"])
@pytest.mark.parametrize("factor", [0.0, 2.0])
def test_batch_norm_global_statistics_both_paths(factor, in_place, dtype, generic, monkeypatch):
    if generic:
        monkeypatch.setattr(_cpu, "normalization", None)
    rng = np.random.default_rng(7)
    shape = (3, 2, 4)
    x, dy = rng.normal(size=shape), rng.normal(size=shape)
    layer = make_layer("BatchNorm", "batch_norm_param { eps: 0.1 }", phase=TEST)
    blob = blobs_from_arrays([x], dtype)[0]
    layer.SetUp([blob], [blob] if in_place else empty_tops(1, dtype))
    sums = (np.array([0.5, -1.5]), np.array([1.0, 3.0]))
    layer.blobs[0].data[...], layer.blobs[1].data[...], layer.blobs[2].data[...] = sums[0], sums[1], factor
    f = 0.0 if factor == 0 else 1 / factor
    y, dx = forward_backward(layer, x, dy, dtype, in_place)
    want_y, want_dx = bn_reference(x, dy, f32(0.1), stats=(sums[0] * f, sums[1] * f))
    np.testing.assert_allclose(y, want_y, **tol(dtype))
    np.testing.assert_allclose(dx, want_dx, **tol(dtype))
    np.testing.assert_array_equal(layer.blobs[2].data, [factor])  # global statistics are not updated


@PATHS
def test_batch_norm_moving_average_with_one_and_two_samples_per_channel(generic, monkeypatch):
    """m = 1: Caffe's bias correction is 1 (no 1 / 0); m = 2: it is 2. Two forwards fold with maf."""
    if generic:
        monkeypatch.setattr(_cpu, "normalization", None)
    for shape, corr in (((1, 3), 1.0), ((2, 3), 2.0), ((1, 3, 2), 2.0)):
        rng = np.random.default_rng(3)
        x1, x2 = rng.normal(size=shape), rng.normal(size=shape)
        layer = make_layer("BatchNorm", "batch_norm_param { moving_average_fraction: 0.25 }", phase=TRAIN)
        bottom, top = blobs_from_arrays([x1]), empty_tops(1)
        layer.SetUp(bottom, top)
        layer.Forward(bottom, top)
        bottom[0].data[...] = x2
        layer.Forward(bottom, top)
        r1, r2 = x1.reshape(shape[0], 3, -1), x2.reshape(shape[0], 3, -1)
        np.testing.assert_allclose(layer.blobs[2].data, [1.25])
        np.testing.assert_allclose(layer.blobs[0].data, 0.25 * r1.mean(axis=(0, 2)) + r2.mean(axis=(0, 2)))
        np.testing.assert_allclose(layer.blobs[1].data,
                                   corr * (0.25 * r1.var(axis=(0, 2)) + r2.var(axis=(0, 2))), atol=1e-15)


@PATHS
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "inplace"])
@pytest.mark.parametrize("phase", [TRAIN, TEST], ids=["train", "test"])
def test_batch_norm_backward_before_forward_is_named(phase, in_place, generic, monkeypatch):
    if generic:
        monkeypatch.setattr(_cpu, "normalization", None)
    layer = make_layer("BatchNorm", phase=phase, name="bn")
    blob = blobs_from_arrays([np.ones((2, 3))])[0]
    top = [blob] if in_place else empty_tops(1)
    layer.SetUp([blob], top)
    top[0].diff[...] = 1
    with pytest.raises(LayerError, match=r"'bn' \(BatchNorm\): backward needs a forward pass first"):
        layer.Backward(top, [True], [blob])


@PATHS
@pytest.mark.parametrize("phase", [TRAIN, TEST], ids=["train", "test"])
def test_batch_norm_without_propagate_down_leaves_the_diff(phase, generic, monkeypatch):
    if generic:
        monkeypatch.setattr(_cpu, "normalization", None)
    layer = make_layer("BatchNorm", phase=phase)
    bottom, top = blobs_from_arrays([np.arange(12.0).reshape(4, 3)]), empty_tops(1)
    layer.SetUp(bottom, top)
    layer.Forward(bottom, top)
    top[0].diff[...] = 1
    bottom[0].diff[...] = 7
    layer.Backward(top, [False], bottom)
    assert (bottom[0].diff == 7).all()


def test_batch_norm_stored_blob_checks_and_new_blobs():
    layer = make_layer("BatchNorm", name="bn")
    bottom, top = blobs_from_arrays([np.ones((2, 3, 2))], np.float32), empty_tops(1, np.float32)
    layer.SetUp(bottom, top)
    assert [b.shape for b in layer.blobs] == [(3,), (3,), (1,)]
    assert all(b.dtype == np.float32 and (b.data == 0).all() for b in layer.blobs)
    good = [Blob((3,)), Blob((3,)), Blob((1,))]
    for blobs, match in (
            (good[:2], r"'bn' \(BatchNorm\): expects 3 blobs \(mean, variance, scale factor\), got 2"),
            ([Blob((4,)), Blob((3,)), Blob((1,))], r"stored blobs have shapes .*expected \[3\], \[3\], \[1\]"),
            ([Blob((3,)), Blob((2,)), Blob((1,))], r"stored blobs have shapes"),
            ([Blob((3,)), Blob((3,)), Blob((2,))], r"stored blobs have shapes")):
        layer = make_layer("BatchNorm", name="bn")
        layer.blobs = blobs
        with pytest.raises(LayerError, match=match):
            layer.SetUp(blobs_from_arrays([np.ones((2, 3, 2))]), empty_tops(1))
    layer = make_layer("BatchNorm", name="bn")
    layer.blobs = good
    layer.SetUp(blobs_from_arrays([np.ones((2, 3, 2))]), empty_tops(1))  # the right shapes are accepted
    # a second param spec with lr_mult != 0 is named by its index; lr_mult 0 given explicitly is kept
    with pytest.raises(LayerError, match=r"param\[1\]\.lr_mult is 2"):
        make_layer("BatchNorm", "param { lr_mult: 0 } param { lr_mult: 2 }").SetUp(
            blobs_from_arrays([np.ones((2, 3))]), empty_tops(1))
    layer = make_layer("BatchNorm", "param { lr_mult: 0 }")
    layer.SetUp(blobs_from_arrays([np.ones((2, 3))]), empty_tops(1))
    assert [p.lr_mult for p in layer.layer_param.param] == [0, 0, 0]


def test_batch_norm_zero_axis_bottom_is_named():
    with pytest.raises(LayerError, match=r"'bn' \(BatchNorm\): bottom\[0\] must have at least one axis"):
        make_layer("BatchNorm", name="bn").SetUp([Blob(())], empty_tops(1))


# -- LRN --------------------------------------------------------------------------------------

def lrn_reference(x, dy, size, alpha, beta, k, across):
    """Caffe's LRN and its gradient (dense NumPy, zero-padded windows)."""
    N, C, H, W = x.shape
    r = (size - 1) // 2

    def window(v):
        if across:
            p = np.pad(v, ((0, 0), (r, r), (0, 0), (0, 0)))
            return sum(p[:, o:o + C] for o in range(size))
        p = np.pad(v, ((0, 0), (0, 0), (r, r), (r, r)))
        return sum(p[:, :, i:i + H, j:j + W] for i in range(size) for j in range(size))

    a, shift = (alpha / size, k) if across else (alpha / size ** 2, 1.0)
    scale = shift + a * window(x * x)
    y = x * scale ** -beta
    dx = dy * scale ** -beta - 2 * a * beta * x * window(dy * y / scale)
    return y, dx


LRN_CASES = [  # local_size, alpha, beta, k, region
    (3, 0.5, 0.75, 2.0, "ACROSS_CHANNELS"),
    (5, 2.0, 1.5, 1.0, "ACROSS_CHANNELS"),
    (1, 1.0, 0.75, 0.5, "ACROSS_CHANNELS"),
    (3, 0.5, 0.75, 2.0, "WITHIN_CHANNEL"),
    (5, 3.0, 0.5, 1.0, "WITHIN_CHANNEL"),
]


@BUILD_PATHS
@DTYPES
@pytest.mark.parametrize("case", LRN_CASES, ids=lambda c: f"{c[4][:6]}-{c[0]}-{c[2]}")
def test_lrn_both_paths_match_caffe(case, dtype, generic, build, monkeypatch):
    use_path(monkeypatch, generic, build)
    size, alpha, beta, k, region = case
    rng = np.random.default_rng(size)
    x, dy = rng.normal(size=(2, 6, 4, 5)), rng.normal(size=(2, 6, 4, 5))
    text = f"lrn_param {{ local_size: {size} alpha: {alpha} beta: {beta} k: {k} norm_region: {region} }}"
    layer = make_layer("LRN", text)
    y, dx = forward_backward(layer, x, dy, dtype)
    want_y, want_dx = lrn_reference(x, dy, size, f32(alpha), f32(beta), f32(k), region == "ACROSS_CHANNELS")
    np.testing.assert_allclose(y, want_y, **tol(dtype))
    np.testing.assert_allclose(dx, want_dx, **tol(dtype))
    # a second shape (the scratch buffers resized) and back to the dtype's first shape
    for shape in ((1, 3, 6, 2), (2, 6, 4, 5)):
        x2, dy2 = rng.normal(size=shape), rng.normal(size=shape)
        bottom, top = blobs_from_arrays([x2], dtype), empty_tops(1, dtype)
        layer.Reshape(bottom, top)
        layer.Forward(bottom, top)
        top[0].diff[...] = dy2
        layer.Backward(top, [True], bottom)
        want_y, want_dx = lrn_reference(x2, dy2, size, f32(alpha), f32(beta), f32(k), region == "ACROSS_CHANNELS")
        np.testing.assert_allclose(top[0].data, want_y, **tol(dtype))
        np.testing.assert_allclose(bottom[0].diff, want_dx, **tol(dtype))


@PATHS
@pytest.mark.parametrize("region", ["ACROSS_CHANNELS", "WITHIN_CHANNEL"])
def test_lrn_state_and_propagate_down(region, generic, monkeypatch):
    if generic:
        monkeypatch.setattr(_cpu, "normalization", None)
    text = f"lrn_param {{ local_size: 3 norm_region: {region} }}"
    layer = make_layer("LRN", text, name="norm")
    bottom, top = blobs_from_arrays([np.ones((1, 3, 2, 2))]), empty_tops(1)
    layer.SetUp(bottom, top)
    top[0].diff[...] = 1
    with pytest.raises(LayerError, match=r"'norm' \(LRN\): backward needs a forward pass first"):
        layer.Backward(top, [True], bottom)
    layer.Forward(bottom, top)
    bottom[0].diff[...] = 7
    layer.Backward(top, [False], bottom)
    assert (bottom[0].diff == 7).all()
    bottom[0].reshape(1, 3, 2, 3)  # a reshape since the forward: the saved scale_ no longer fits
    layer.Reshape(bottom, top)
    top[0].diff[...] = 1
    with pytest.raises(LayerError, match=r"backward needs a forward pass first \(no scale_\)"):
        layer.Backward(top, [True], bottom)


# -- Dropout ------------------------------------------------------------------------------------

def dropout_run(ratio, dtype, phase=TRAIN, generic=False, monkeypatch=None, seed=5, shape=(3, 7, 5)):
    if generic:
        monkeypatch.setattr(_cpu, "elementwise", None)
    rng = np.random.default_rng(0)
    x, dy = rng.uniform(0.5, 1.5, shape), rng.uniform(-1, 1, shape)
    context.set_random_seed(seed)
    layer = make_layer("Dropout", f"dropout_param {{ dropout_ratio: {ratio} }}", phase=phase)
    y, dx = forward_backward(layer, x, dy, dtype)
    return layer, x, dy, y, dx


@DTYPES
@pytest.mark.parametrize("ratio", [0.0, 0.5, 0.3])
def test_dropout_generic_path_draws_the_kernels_mask(ratio, dtype, monkeypatch):
    from caffe.layers.dropout import mask_reference, mask_threshold
    layer, x, dy, y, dx = dropout_run(ratio, dtype)
    mask = layer.rand_vec_.data.copy()
    context.set_random_seed(5)
    seed = int(context.rng().integers(0, 2 ** 63))
    np.testing.assert_array_equal(mask.reshape(-1), mask_reference(seed, x.size, mask_threshold(ratio)))
    if ratio == 0:
        assert mask.all()
    scale = dtype(1) / (dtype(1) - dtype(f32(ratio)))
    np.testing.assert_allclose(y, x * mask * scale, **tol(dtype))
    np.testing.assert_allclose(dx, dy * mask * scale, **tol(dtype))
    g_layer, _, _, gy, gdx = dropout_run(ratio, dtype, generic=True, monkeypatch=monkeypatch)
    np.testing.assert_array_equal(g_layer.rand_vec_.data, mask)
    np.testing.assert_allclose(gy, y, **tol(dtype))
    np.testing.assert_allclose(gdx, dx, **tol(dtype))


def test_dropout_forward_xp_on_numpy_draws_the_same_mask():
    """The generic forward on NumPy with the kernels built (the mask drawn by the kernel alone)."""
    layer, x, _, y, _ = dropout_run(0.4, np.float32)
    context.set_random_seed(5)
    other = make_layer("Dropout", "dropout_param { dropout_ratio: 0.4 }")
    bottom, top = blobs_from_arrays([x], np.float32), empty_tops(1, np.float32)
    other.SetUp(bottom, top)
    other.forward_xp(np, bottom, top)
    np.testing.assert_array_equal(other.rand_vec_.data, layer.rand_vec_.data)
    np.testing.assert_allclose(top[0].data, y, rtol=1e-6)


@PATHS
@pytest.mark.parametrize("phase", [TRAIN, TEST], ids=["train", "test"])
def test_dropout_state_and_propagate_down(phase, generic, monkeypatch):
    if generic:
        monkeypatch.setattr(_cpu, "elementwise", None)
    layer = make_layer("Dropout", phase=phase, name="d")
    bottom, top = blobs_from_arrays([np.ones((4, 5))], np.float32), empty_tops(1, np.float32)
    layer.SetUp(bottom, top)
    top[0].diff[...] = 1
    if phase == TRAIN:
        with pytest.raises(LayerError, match=r"'d' \(Dropout\): backward in TRAIN phase needs a forward pass"):
            layer.Backward(top, [True], bottom)
    layer.Forward(bottom, top)
    bottom[0].diff[...] = 7
    layer.Backward(top, [False], bottom)
    assert (bottom[0].diff == 7).all()
    if phase == TRAIN:  # a reshape since the forward: the mask no longer fits
        bottom[0].reshape(4, 6)
        layer.Reshape(bottom, top)
        with pytest.raises(LayerError, match=r"needs a forward pass first \(no dropout mask\)"):
            layer.Backward(top, [True], bottom)


@PATHS
def test_dropout_without_scale_train_both_paths(generic, monkeypatch):
    from caffe.layers.dropout import DropoutLayer
    if generic:
        monkeypatch.setattr(_cpu, "elementwise", None)

    class Unscaled(DropoutLayer):
        def read_scale_train(self):
            return False

    x = np.random.default_rng(0).uniform(0.5, 1.5, (6, 7))
    for phase in (TRAIN, TEST):
        layer = Unscaled(make_layer("Dropout", "dropout_param { dropout_ratio: 0.25 }", phase=phase).layer_param)
        y, dx = forward_backward(layer, x, np.full_like(x, 2.0), np.float64)
        if phase == TRAIN:
            kept = layer.rand_vec_.data.astype(bool)
            np.testing.assert_array_equal(y, x * kept)
            np.testing.assert_array_equal(dx, 2.0 * kept)
        else:
            np.testing.assert_allclose(y, x * 0.75)
            np.testing.assert_allclose(dx, np.full_like(x, 1.5))


def test_dropout_mask_threshold():
    from caffe.layers.dropout import mask_threshold
    assert [mask_threshold(r) for r in (0.0, 0.5, 0.25, 0.1)] == [0, 32768, 16384, 6554]


def splitmix_bits(seed, count):
    """16-bit draws of SplitMix64 outputs 1, 2, ... (Python integers: the definition, not the code)."""
    out, M = [], (1 << 64) - 1
    for i in range((count + 3) // 4):
        z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & M
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
        z ^= z >> 31
        out += [(z >> (16 * j)) & 0xFFFF for j in range(4)]
    return out[:count]


@PATHS
def test_dropout_keeps_an_element_whose_draw_equals_the_threshold(generic, monkeypatch):
    """Kept when the 16 bits are >= the threshold (so P(keep) = 1 - ratio): a ratio whose threshold is
    exactly the first element's draw keeps it; one more drops it."""
    if generic:
        monkeypatch.setattr(_cpu, "elementwise", None)
    context.set_random_seed(11)
    seed = int(context.rng().integers(0, 2 ** 63))
    bits = splitmix_bits(seed, 6)
    for threshold in (bits[0], bits[0] + 1):
        ratio = threshold / 2 ** 16  # exact in float32
        context.set_random_seed(11)
        layer = make_layer("Dropout", f"dropout_param {{ dropout_ratio: {ratio!r} }}")
        bottom, top = blobs_from_arrays([np.ones(6)], np.float32), empty_tops(1, np.float32)
        layer.SetUp(bottom, top)
        assert layer.threshold == threshold
        layer.Forward(bottom, top)
        np.testing.assert_array_equal(layer.rand_vec_.data, [int(b >= threshold) for b in bits])
        assert layer.rand_vec_.data[0] == (threshold == bits[0])

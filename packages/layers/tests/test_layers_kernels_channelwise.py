"""kernels.channelwise and kernels.normalization against the layers' NumPy paths: Scale, Bias, PReLU,
BatchNorm (global and batch statistics, moving averages), LRN."""
import os
import sys

import numpy as np
import pytest
from hypothesis import given, strategies as st

from caffe.blob import Blob
from caffe.layers import _cpu
from caffe.layers.kernels import channelwise, normalization
from caffe.layers.testing import blobs_from_arrays, empty_tops, make_layer
from caffe.proto import caffe_pb2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # for the helper module kernels_harness
from kernels_harness import DTYPES, arrays, build_module, check_paths, layers_use, run, shapes  # noqa: E402

# The builds of kernels.channelwise: the baseline and the AVX-512 one (no AVX2 build; the AVX-512 cases skip, with
# the reason, on a CPU without it). The layers' NumPy paths are the reference for both.
CW_BUILDS = ["base", "avx512"]

SEEDS = st.integers(0, 2**31 - 1)


def _fill_params(seed):
    """Random parameter values (so scales, biases and slopes are not the fillers' constants)."""
    def setup(layer):
        rng = np.random.default_rng(seed)
        for b in layer.blobs:
            b.data[...] = rng.uniform(-1.5, 1.5, b.shape)
            b.diff[...] = rng.uniform(-1, 1, b.shape)  # parameter gradients accumulate onto this
    return setup


@pytest.mark.parametrize("build", CW_BUILDS)
@given(shape=shapes(min_dims=2), dtype=DTYPES, seed=SEEDS, bias=st.booleans(), in_place=st.booleans(),
       data=st.data())
def test_scale_kernels_match_numpy(build, shape, dtype, seed, bias, in_place, data):
    with layers_use("channelwise", build_module("channelwise", build)):
        axis = data.draw(st.integers(0, len(shape) - 1))
        num_axes = data.draw(st.integers(-1, len(shape) - axis))
        text = f"scale_param {{ axis: {axis} num_axes: {num_axes} bias_term: {str(bias).lower()} }}"
        x, dy = arrays(seed, shape), arrays(seed + 1, shape)
        check_paths("Scale", text, [x], [dy], dtype, in_place=in_place, setup=_fill_params(seed))


@pytest.mark.parametrize("build", CW_BUILDS)
@given(shape=shapes(min_dims=2), dtype=DTYPES, seed=SEEDS, bias=st.booleans(), pd=st.sampled_from(
    [(True, True), (True, False), (False, True)]), data=st.data())
def test_scale_by_a_second_bottom_matches_numpy(build, shape, dtype, seed, bias, pd, data):
    with layers_use("channelwise", build_module("channelwise", build)):
        axis = data.draw(st.integers(0, len(shape) - 1))
        end = data.draw(st.integers(axis, len(shape)))
        s = arrays(seed + 2, shape[axis:end])
        text = f"scale_param {{ axis: {axis} bias_term: {str(bias).lower()} }}"
        check_paths("Scale", text, [arrays(seed, shape), s], [arrays(seed + 1, shape)], dtype, propagate_down=pd,
                    setup=_fill_params(seed))


@pytest.mark.parametrize("build", CW_BUILDS)
def test_scale_by_a_scalar_second_bottom_long_cancelling_sum(build):
    # The long hypothesis profile's example: the scalar scale's gradient sums 120,033 products (their magnitudes
    # 120,719) to 0.286021; NumPy's float32 pairwise sum (the reference path) gives 0.285950, 2.5e-4 off, while
    # the kernels give the float64 answer's float32. check_paths accepts a result no farther from the float64
    # answer than the float32 reference; a wrong gradient stays far from both.
    with layers_use("channelwise", build_module("channelwise", build)):
        shape, seed = (3, 40011), 2307611
        args = ("Scale", "scale_param { axis: 0 bias_term: false }",
                [arrays(seed, shape), arrays(seed + 2, ())], [arrays(seed + 1, shape)], np.float32)
        check_paths(*args, propagate_down=(True, True), setup=_fill_params(seed))
        got = run(*args, propagate_down=(True, True), setup=_fill_params(seed))["bottom_diff"][1]
        x = arrays(seed, shape).astype(np.float32).astype(np.float64)
        dy = arrays(seed + 1, shape).astype(np.float32).astype(np.float64)
        assert abs(float(got) - float((x * dy).sum())) < 1e-6  # the kernels' double accumulators


@pytest.mark.parametrize("build", CW_BUILDS)
@given(shape=shapes(min_dims=1), dtype=DTYPES, seed=SEEDS, in_place=st.booleans(), two=st.booleans(),
       data=st.data())
def test_bias_kernels_match_numpy(build, shape, dtype, seed, in_place, two, data):
    with layers_use("channelwise", build_module("channelwise", build)):
        axis = data.draw(st.integers(0, len(shape) - 1))
        x, dy = arrays(seed, shape), arrays(seed + 1, shape)
        if two:
            end = data.draw(st.integers(axis, len(shape)))
            check_paths("Bias", f"bias_param {{ axis: {axis} }}", [x, arrays(seed + 2, shape[axis:end])], [dy], dtype,
                        in_place=in_place, setup=_fill_params(seed))
        else:
            check_paths("Bias", f"bias_param {{ axis: {axis} num_axes: 1 }}", [x], [dy], dtype, in_place=in_place,
                        setup=_fill_params(seed))


@pytest.mark.parametrize("build", CW_BUILDS)
@given(shape=shapes(min_dims=2), dtype=DTYPES, seed=SEEDS, shared=st.booleans(), in_place=st.booleans())
def test_prelu_kernels_match_numpy(build, shape, dtype, seed, shared, in_place):
    with layers_use("channelwise", build_module("channelwise", build)):
        x = arrays(seed, shape)
        check_paths("PReLU", f"prelu_param {{ channel_shared: {str(shared).lower()} }}", [x], [arrays(seed + 1, shape)],
                    dtype, in_place=in_place, setup=_fill_params(seed))


def _bn_stats_setup(seed):
    def setup(layer):
        rng = np.random.default_rng(seed)
        c = layer.blobs[0].count()
        layer.blobs[0].data[...] = rng.uniform(-1, 1, c) * 3
        layer.blobs[1].data[...] = rng.uniform(0.5, 2, c) * 3
        layer.blobs[2].data[...] = 3
    return setup


@pytest.mark.parametrize("build", CW_BUILDS)
@given(shape=shapes(min_dims=1), dtype=DTYPES, seed=SEEDS, in_place=st.booleans(),
       mode=st.sampled_from(["train", "global", "test"]), offset=st.sampled_from([0.0, 100.0]))
def test_batch_norm_kernels_match_numpy(build, shape, dtype, seed, in_place, mode, offset):
    with layers_use("channelwise", build_module("channelwise", build)):  # (global statistics)
        x = arrays(seed, shape) * 2 + offset  # an offset far from the spread: the statistics must not cancel
        dy = arrays(seed + 1, shape)
        text = "batch_norm_param { use_global_stats: true eps: 0.001 }" if mode == "global" else \
            "batch_norm_param { moving_average_fraction: 0.9 }"
        phase = caffe_pb2.TEST if mode == "test" else caffe_pb2.TRAIN  # TEST defaults to the global statistics
        # float32 backward subtracts means of the order of |dy|: compare relative to that
        check_paths("BatchNorm", text, [x], [dy], dtype, in_place=in_place, phase=phase, setup=_bn_stats_setup(seed),
                    rtol=1e-4 if dtype == np.float32 else None)


def test_batch_norm_train_statistics_are_exact_in_float32_far_from_zero():
    """Per-channel sums in double: mean and variance of float32 data at an offset of 1e4 times the spread."""
    rng = np.random.default_rng(0)
    x = (1e4 + rng.standard_normal((16, 3, 50, 50))).astype(np.float32)
    out = run("BatchNorm", "batch_norm_param { moving_average_fraction: 0 }", [x], dtype=np.float32)
    xd = x.astype(np.float64)
    m = xd.size // 3
    np.testing.assert_allclose(out["params"][0], xd.mean(axis=(0, 2, 3)), rtol=1e-7)
    np.testing.assert_allclose(out["params"][1], xd.var(axis=(0, 2, 3)) * m / (m - 1), rtol=1e-5)
    y = out["top"][0].astype(np.float64)
    np.testing.assert_allclose(y.mean(axis=(0, 2, 3)), 0, atol=1e-3)
    np.testing.assert_allclose(y.std(axis=(0, 2, 3)), 1, rtol=1e-3)


def test_batch_norm_in_place_backward_reads_x_norm_and_out_of_place_recomputes_it():
    x = arrays(0, (2, 3, 5, 7)).astype(np.float32)
    dy = arrays(1, x.shape).astype(np.float32)
    a = run("BatchNorm", "", [x], [dy], np.float32, in_place=True)
    b = run("BatchNorm", "", [x], [dy], np.float32, in_place=False)
    np.testing.assert_array_equal(a["top"][0], b["top"][0])
    np.testing.assert_array_equal(a["bottom_diff"][0], b["bottom_diff"][0])  # the same bits


@pytest.mark.parametrize("offset", [0, 1, 3])
def test_batch_norm_streamed_x_norm_is_the_top_bit_for_bit(offset):
    """From 4 MB up, x_norm goes out by non-temporal stores (its aligned middle; offset misaligns the start):
    the same bits as the top, and the layer in place (which keeps x_norm) agrees with out of place."""
    shape = (2, 3, 419, 421)  # 4.2 MB of float32, rows of odd length
    n, c, s = shape[0], shape[1], shape[2] * shape[3]
    x = (arrays(2, shape) * 3 + 1).astype(np.float32).ravel()
    y = np.empty_like(x)
    for module in {normalization, _cpu.normalization}:  # the baseline build (SSE2) and the layers' (AVX2)
        keep = np.empty(x.size + offset, np.float32)[offset:]
        module.batch_norm_train_forward(x, y, keep, np.zeros(c), np.zeros(c), n, c, s, 1e-5)
        np.testing.assert_array_equal(keep, y)
        y2 = np.empty_like(x)
        module.batch_norm_train_forward(x, y2, np.empty(0, np.float32), np.zeros(c), np.zeros(c), n, c, s, 1e-5)
        np.testing.assert_array_equal(y2, y)
    if offset == 0:
        dy = arrays(3, shape).astype(np.float32)
        a = run("BatchNorm", "", [x.reshape(shape)], [dy], np.float32, in_place=True)
        b = run("BatchNorm", "", [x.reshape(shape)], [dy], np.float32, in_place=False)
        np.testing.assert_array_equal(a["top"][0], b["top"][0])
        np.testing.assert_array_equal(a["bottom_diff"][0], b["bottom_diff"][0])


def test_batch_norm_state_lives_in_blobs():
    x = arrays(0, (2, 3, 4))
    layer = make_layer("BatchNorm")
    bottom = blobs_from_arrays([x])
    layer.SetUp(bottom, bottom)
    layer.Forward(bottom, bottom)
    for name in ("mean_", "inv_std_", "x_norm_"):
        assert isinstance(getattr(layer, name), Blob), name
    assert not any(isinstance(v, np.ndarray) for v in vars(layer).values())


# LRN's pieces: (2, 7, 67, 101) is cut into four per image for the threads, with a short last piece;
# (9, 2, 65, 70) has pieces of the 4096-position cap plus a remainder; (1, 3, 300, 2) is cut to the
# 256-position minimum (batch 1).
@given(shape=shapes(min_dims=4, max_dims=4, max_side=6, big=[(2, 7, 67, 101), (1, 3, 300, 2), (9, 2, 65, 70)]),
       dtype=DTYPES, seed=SEEDS, size=st.sampled_from([1, 3, 5, 7]), beta=st.sampled_from([0.75, 0.6]),
       k=st.sampled_from([1.0, 2.0]))
def test_lrn_across_channels_kernels_match_numpy(shape, dtype, seed, size, beta, k):
    text = f"lrn_param {{ local_size: {size} alpha: 0.3 beta: {beta} k: {k} }}"
    check_paths("LRN", text, [arrays(seed, shape)], [arrays(seed + 1, shape)], dtype)


@pytest.mark.parametrize("shape", [(2, 7, 67, 101), (1, 3, 300, 2), (9, 2, 65, 70)])
def test_lrn_across_channels_every_piece_cut_matches_numpy(shape):
    """The piece cuts above, each drawn every run (the property draws them only sometimes)."""
    text = "lrn_param { local_size: 5 alpha: 0.3 beta: 0.75 }"
    check_paths("LRN", text, [arrays(1, shape)], [arrays(2, shape)], np.float32, mixed=False)


def test_lrn_within_channel_keeps_its_scale_in_a_blob():
    x = arrays(0, (2, 3, 5, 4))
    ref = check_paths("LRN", "lrn_param { local_size: 3 norm_region: WITHIN_CHANNEL alpha: 0.5 }", [x],
                      [arrays(1, x.shape)], np.float64)
    assert ref["top"][0].shape == x.shape


def test_channel_kernels_refuse_short_buffers():
    x = np.zeros(12, np.float32)
    e = np.empty(0, np.float32)
    with pytest.raises(ValueError, match="scale holds 2 elements, needs 3"):
        channelwise.channel_forward(_cpu.CH_AFFINE, x, np.ones(2, np.float32), e, x.copy(), e, 2, 3, 2)
    with pytest.raises(ValueError, match="mean holds 1 elements, needs 3"):
        normalization.batch_norm_train_forward(x, x.copy(), e, np.zeros(1), np.zeros(3), 2, 3, 2, 1e-5)
    with pytest.raises(ValueError, match="scale holds 11"):
        normalization.lrn_across_forward(x, x.copy(), x[:11].copy(), 1, 3, 4, 3, 1.0, 1.0, 0.75)


@pytest.mark.parametrize("type_name, text, n_bottom", [
    ("Scale", "scale_param { bias_term: true }", 1), ("Bias", "", 1), ("PReLU", "", 1),
    ("BatchNorm", "", 1), ("BatchNorm", "batch_norm_param { use_global_stats: true }", 1),
    ("LRN", "lrn_param { local_size: 3 }", 1)])
def test_the_cpu_path_runs_the_kernels(type_name, text, n_bottom):
    """forward_cpu / backward_cpu never fall back to the NumPy path for float32 / float64 blobs."""
    for dtype in (np.float32, np.float64):
        layer = make_layer(type_name, text)
        bottom = blobs_from_arrays([arrays(0, (2, 3, 4, 5))], dtype)
        top = empty_tops(1, dtype)
        layer.SetUp(bottom, top)

        def fail(*_):
            raise AssertionError("fell back to the NumPy path")
        layer.forward_xp = layer.backward_xp = fail
        layer.Forward(bottom, top)
        top[0].diff[...] = 1
        layer.Backward(top, [True], bottom)


@pytest.mark.parametrize("type_name, text, in_place", [
    ("BatchNorm", "", False), ("BatchNorm", "", True), ("BatchNorm", "batch_norm_param { use_global_stats: true }", True),
    ("Scale", "scale_param { bias_term: true }", True), ("Bias", "", False), ("PReLU", "", True),
    ("LRN", "lrn_param { local_size: 5 alpha: 0.5 }", False), ("Softmax", "", False), ("ReLU", "", True),
    ("Sigmoid", "", False), ("ELU", "", True), ("Dropout", "", True)])
def test_big_blobs_use_every_thread_and_piece_and_still_match(type_name, text, in_place):
    """A blob past PARALLEL_MIN_WORK and the piece sizes, with odd dimensions: both threads, remainders."""
    shape = (3, 7, 67, 101)
    setup = _bn_stats_setup(5) if type_name == "BatchNorm" else _fill_params(5)
    ref = check_paths(type_name, text, [arrays(5, shape)], [arrays(6, shape)], np.float32, in_place=in_place,
                      setup=setup, rtol=1e-4)
    assert all(np.isfinite(a).all() for v in ref.values() for a in v)


# LRN's CPU forward leaves scale_ out in either phase: its CPU backward recomputes the scale from the bottom in
# its own pass (the forward's window sum: the same bits, so the dx a kept scale gives). An array-module Backward
# after it (the GPU's) recomputes scale_ (into a scratch top: the net's top may have been changed in place since)
# and from then on every forward keeps it, which the CPU backward then reads.
@given(shape=shapes(min_dims=4, max_dims=4, max_side=6, big=[(2, 7, 67, 101)]), dtype=DTYPES, seed=SEEDS,
       size=st.sampled_from([1, 3, 5]), beta=st.sampled_from([0.75, 0.6]),
       phase=st.sampled_from([caffe_pb2.TRAIN, caffe_pb2.TEST]))
def test_lrn_cpu_forward_leaves_the_scale_out_and_backward_recomputes_it(shape, dtype, seed, size, beta, phase):
    text = f"lrn_param {{ local_size: {size} alpha: 0.3 beta: {beta} k: 2 }}"
    x, dy = arrays(seed, shape).astype(dtype), arrays(seed + 1, shape).astype(dtype)
    N, C, H, W = shape
    kern = _cpu.normalization
    alpha, beta32 = float(np.float32(0.3)), float(np.float32(beta))  # as the layer reads the proto's floats

    def kernel_dx(y, scale):
        dx = np.empty(x.size, dtype)
        kern.lrn_across_backward(x.ravel(), y.ravel(), scale.ravel(), dy.ravel(), dx, N, C, H * W, size, alpha, beta32)
        return dx.reshape(shape)

    def same(got, want):
        # beta 0.75: square roots and a division, the same bits; another beta calls pow, libmvec's in the vector
        # loops and libm's in their scalar tails, which fall elsewhere for a scale row at another address
        if beta == 0.75:
            np.testing.assert_array_equal(got, want)
        else:
            r = 4e-7 if dtype == np.float32 else 2e-15
            np.testing.assert_allclose(got, want, rtol=r, atol=r * max(1.0, float(np.abs(want).max())))

    # the reference: the kernels with the scale a forward kept
    y_kept, scale = np.empty(x.size, dtype), np.empty(x.size, dtype)
    kern.lrn_across_forward(x.ravel(), y_kept, scale, N, C, H * W, size, alpha, 2.0, beta32)
    y_kept = y_kept.reshape(shape)

    layer = make_layer("LRN", text, phase=phase)
    bottom, top = blobs_from_arrays([x], dtype), empty_tops(1, dtype)
    layer.SetUp(bottom, top)
    layer.Forward(bottom, top)
    assert layer.scale_state.stale and getattr(layer, "scale_", None) is None
    same(top[0].data, y_kept)
    y = top[0].data.copy()
    top[0].diff[...] = dy
    layer.Backward(top, [True], bottom)
    same(bottom[0].diff, kernel_dx(y, scale))
    assert layer.scale_state.stale and getattr(layer, "scale_", None) is None  # nothing kept for the CPU backward

    layer.backward_xp(np, top, [True], bottom)  # asks for scale_: recomputed, the forward's bits
    np.testing.assert_array_equal(layer.scale_.data.ravel(), scale)
    np.testing.assert_array_equal(top[0].data, y)  # the recomputation wrote a scratch top
    layer.Forward(bottom, top)  # after that, every forward keeps the scale
    assert not layer.scale_state.stale
    np.testing.assert_array_equal(layer.scale_.data.ravel(), scale)
    layer.scale_.data[...] *= 2  # the CPU backward reads a kept scale (as one an array-module forward wrote)
    layer.Backward(top, [True], bottom)
    same(bottom[0].diff, kernel_dx(top[0].data, scale * 2))


def test_lrn_backward_without_the_scale_needs_k():
    x = np.ones(12, np.float32)
    with pytest.raises(ValueError, match="without the scale needs k"):
        normalization.lrn_across_backward(x, x, None, x, x.copy(), 1, 3, 4, 3, 1.0, 0.75)


def test_lrn_kernel_without_the_scale_is_the_same_top():
    x = arrays(4, (2, 7, 67, 101)).astype(np.float32).ravel()
    for module in {normalization, _cpu.normalization}:
        y, y_alone, sc = np.empty_like(x), np.empty_like(x), np.empty_like(x)
        module.lrn_across_forward(x, y, sc, 2, 7, 67 * 101, 5, 0.3, 2.0, 0.75)
        module.lrn_across_forward(x, y_alone, None, 2, 7, 67 * 101, 5, 0.3, 2.0, 0.75)
        np.testing.assert_array_equal(y_alone.view(np.uint32), y.view(np.uint32))

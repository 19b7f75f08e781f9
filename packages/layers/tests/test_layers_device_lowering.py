"""The device's constant-launch paths against the NumPy references: the lowering (im2col as one gather,
col2im as one scatter-add; caffe.layers.conv_device), convolution with groups in one batched matmul
(depthwise included), and pooling by one gather of every window (caffe.layers.pool_device).

They need a device: a real GPU, or the CuPy stand-in (scripts/test.sh's second run, CAFFE_CUPY_STANDIN=1),
where these paths run on NumPy behind CuPy's API: the formulation is checked, not GPU numerics.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

from caffe.blob import context
from caffe.layers import conv_base, conv_device
from caffe.layers.registry import create_layer
from caffe.layers.testing import blobs_from_arrays, empty_tops, gpu_available, layer_param

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no GPU (CuPy with a CUDA device, or the CuPy stand-in)")]


def _cupy():
    import cupy
    return cupy


@st.composite
def geometries(draw, max_axes=3):
    nsp = draw(st.integers(1, max_axes))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(nsp))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(nsp))
    pad = tuple(draw(st.integers(0, 2)) for _ in range(nsp))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(nsp))
    im = tuple(draw(st.integers(1, 6 if nsp < 3 else 4)) for _ in range(nsp))
    col = []
    for n, k, s, p, d in zip(im, kernel, stride, pad, dilation):
        ext = d * (k - 1) + 1
        assume(n + 2 * p >= ext)
        col.append((n + 2 * p - ext) // s + 1)
    return conv_base.ConvGeometry(kernel, stride, pad, dilation, im, tuple(col))


@given(geom=geometries(), nb=st.integers(1, 3), c=st.integers(1, 3), layout=st.sampled_from(["batch", "image"]),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**31 - 1))
def test_lowering_on_the_device_matches_the_numpy_reference(geom, nb, c, layout, dtype, seed):
    cp = _cupy()
    rng = np.random.default_rng(seed)
    K, P = geom.kernel_count, geom.col_count
    im = rng.normal(size=(nb, c) + geom.im_shape).astype(dtype)
    col_shape = (c * K, nb * P) if layout == "batch" else (nb, c * K, P)
    ref = np.empty(col_shape, dtype)
    conv_base.im2col(np, im, ref, geom, layout, force_nd=True)  # the per-offset reference
    col = cp.empty(col_shape, dtype)
    conv_base.im2col(cp, cp.asarray(im), col, geom, layout)
    np.testing.assert_array_equal(cp.asnumpy(col), ref)
    col64 = cp.empty(col_shape, np.float64)  # the exact forward's lowering: cast in the gather's copy
    conv_device.im2col(cp, cp.asarray(im), col64, geom, layout)
    np.testing.assert_array_equal(cp.asnumpy(col64), ref.astype(np.float64))

    dcol = rng.normal(size=col_shape).astype(dtype)
    ref_im = np.empty(im.shape, dtype)
    conv_base.col2im(np, dcol, ref_im, geom, layout, force_nd=True)
    out = cp.full(im.shape, np.nan, dtype)  # overwritten, not accumulated
    conv_base.col2im(cp, cp.asarray(dcol), out, geom, layout)
    tol = 1e-6 if dtype == np.float32 else 1e-13  # the (at most K) terms per pixel in another order
    np.testing.assert_allclose(cp.asnumpy(out), ref_im, rtol=tol, atol=tol)


def _run(mode, type_name, text, x, dtype, top_diff_seed):
    context.set_mode(mode)
    try:
        context.set_random_seed(1701)
        layer = create_layer(layer_param(type_name, text))
        bottom, top = blobs_from_arrays([x], dtype), empty_tops(1, dtype)
        layer.SetUp(bottom, top)
        for b in layer.blobs:  # float32-representable parameters, so the exact forward is comparable
            b.data[...] = b.data.astype(np.float32)
        layer.Forward(bottom, top)
        top[0].diff[...] = np.random.default_rng(top_diff_seed).normal(size=top[0].shape)
        for b in layer.blobs:
            b.diff[...] = 0
        layer.Backward(top, [True], bottom)
        return layer, [top[0].data.copy(), bottom[0].diff.copy()] + [b.diff.copy() for b in layer.blobs]
    finally:
        context.set_mode_cpu()


@given(type_name=st.sampled_from(["Convolution", "Deconvolution"]), n=st.integers(1, 3),
       groups=st.integers(1, 3), per_group_in=st.integers(1, 2), per_group_out=st.integers(1, 2),
       depthwise=st.booleans(), k=st.integers(1, 3), stride=st.integers(1, 2), pad=st.integers(0, 1),
       dilation=st.integers(1, 2), hw=st.tuples(st.integers(3, 7), st.integers(3, 7)), bias=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_grouped_and_depthwise_convolution_on_the_device_match_the_cpu(
        type_name, n, groups, per_group_in, per_group_out, depthwise, k, stride, pad, dilation, hw, bias, seed):
    """One batched matmul over the groups (depthwise: group = channels, one output each) == the CPU plans;
    a forward with at most EXACT_FORWARD_MAX_K terms per dot product is the correctly rounded one on both
    (at most one float32 ulp apart: the float64 sums may round differently on the way)."""
    c = groups * per_group_in
    out = groups if depthwise else groups * per_group_out
    if type_name == "Convolution":
        assume(min(hw) + 2 * pad >= dilation * (k - 1) + 1)
    text = (f"convolution_param {{ num_output: {out} group: {groups} kernel_size: {k} stride: {stride} pad: {pad} "
            f"dilation: {dilation} bias_term: {str(bias).lower()} weight_filler {{ type: 'gaussian' std: 0.5 }} "
            f"bias_filler {{ type: 'gaussian' std: 0.5 }} }}")
    x = np.random.default_rng(seed).normal(size=(n, c) + hw).astype(np.float32)
    cpu_layer, cpu = _run(context.CPU, type_name, text, x, np.float32, seed + 1)
    _, gpu = _run(context.GPU, type_name, text, x, np.float32, seed + 1)
    if type_name == "Convolution" and cpu_layer.exact_forward(np.float32):
        ulps = np.abs(cpu[0].view(np.int32).astype(np.int64) - gpu[0].view(np.int32).astype(np.int64))
        assert ulps.max(initial=0) <= 1
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


@given(method=st.sampled_from(["MAX", "AVE"]), n=st.integers(1, 2), c=st.integers(1, 3),
       hw=st.tuples(st.integers(1, 7), st.integers(1, 7)), k=st.tuples(st.integers(1, 4), st.integers(1, 4)),
       stride=st.tuples(st.integers(1, 3), st.integers(1, 3)), pad=st.tuples(st.integers(0, 2), st.integers(0, 2)),
       floor=st.booleans(), glob=st.booleans(), mask_top=st.booleans(), ties=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_pooling_on_the_device_matches_the_cpu(method, n, c, hw, k, stride, pad, floor, glob, mask_top, ties, seed):
    """One gather of every window (and one scatter-add back) == the CPU kernels: MAX's first maximum in
    row-major order (ties), its argmax (mask top), -inf entries never chosen; AVE's clipped divisor."""
    rng = np.random.default_rng(seed)
    if glob:
        geometry = "global_pooling: true"
    else:
        assume(pad[0] < k[0] and pad[1] < k[1])
        assume(hw[0] + 2 * pad[0] >= k[0] and hw[1] + 2 * pad[1] >= k[1])
        geometry = (f"kernel_h: {k[0]} kernel_w: {k[1]} stride_h: {stride[0]} stride_w: {stride[1]} "
                    f"pad_h: {pad[0]} pad_w: {pad[1]}")
    text = (f"pooling_param {{ pool: {method} {geometry} {'round_mode: FLOOR' if floor else ''} }}")
    x = rng.integers(-2, 3, size=(n, c) + hw).astype(np.float32) if ties else \
        rng.normal(size=(n, c) + hw).astype(np.float32)
    if method == "MAX" and ties:
        x[rng.random(x.shape) < 0.2] = -np.inf
    n_top = 2 if method == "MAX" and mask_top else 1
    results = []
    for mode in (context.CPU, context.GPU):
        context.set_mode(mode)
        try:
            layer = create_layer(layer_param("Pooling", text))
            bottom, top = blobs_from_arrays([x], np.float32), empty_tops(n_top, np.float32)
            layer.SetUp(bottom, top)
            layer.Forward(bottom, top)
            top[0].diff[...] = np.random.default_rng(seed + 1).normal(size=top[0].shape)
            layer.Backward(top, [True], bottom)
            results.append([t.data.copy() for t in top] + [bottom[0].diff.copy()])
        finally:
            context.set_mode_cpu()
    (cpu, gpu) = results
    if method == "MAX":
        for a, b in zip(cpu[:-1], gpu[:-1]):
            np.testing.assert_array_equal(b, a)
        np.testing.assert_allclose(gpu[-1], cpu[-1], rtol=1e-6, atol=1e-6)
    else:
        with np.errstate(invalid="ignore"):
            for a, b in zip(cpu, gpu):
                np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


@given(n=st.integers(1, 2), c=st.integers(1, 2), hw=st.tuples(st.integers(2, 6), st.integers(2, 6)),
       k=st.integers(2, 3), stride=st.integers(1, 2), phase=st.sampled_from([0, 1]), seed=st.integers(0, 2**31 - 1))
def test_stochastic_pooling_on_the_device_matches_the_cpu(n, c, hw, k, stride, phase, seed):
    """STOCHASTIC's windows by one gather: the same draws (one uniform per window from the shared stream) pick
    the same elements in TRAIN, the same weighted average in TEST, and the same backward."""
    assume(min(hw) >= k)
    x = np.random.default_rng(seed).uniform(0.1, 1, size=(n, c) + hw).astype(np.float32)
    results = []
    for mode in (context.CPU, context.GPU):
        context.set_mode(mode)
        try:
            context.set_random_seed(seed)
            layer = create_layer(layer_param("Pooling", f"pooling_param {{ pool: STOCHASTIC kernel_size: {k} "
                                                        f"stride: {stride} }}", phase=phase))
            bottom, top = blobs_from_arrays([x], np.float32), empty_tops(1, np.float32)
            layer.SetUp(bottom, top)
            layer.Forward(bottom, top)
            top[0].diff[...] = 1.0
            layer.Backward(top, [True], bottom)
            results.append([top[0].data.copy(), bottom[0].diff.copy()])
        finally:
            context.set_mode_cpu()
    for a, b in zip(*results):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_max_pooling_edge_values_on_the_device_match_the_cpu():
    """Caffe's running max from -FLT_MAX with a strict >: -inf, -FLT_MAX and NaN are never chosen; a window
    holding nothing else gives -FLT_MAX and no argmax (-1), and its top diff goes nowhere."""
    fmax = np.finfo(np.float32).max
    x = np.array([[[[-np.inf, -np.inf, 1.0], [-np.inf, np.nan, 2.0]],
                   [[-fmax, np.nan, -np.inf], [-fmax, 3.0, 3.0]]]], np.float32)
    text = "pooling_param { pool: MAX kernel_size: 1 stride: 1 }", "pooling_param { pool: MAX kernel_size: 2 pad: 1 }"
    for t in text:
        results = []
        for mode in (context.CPU, context.GPU):
            context.set_mode(mode)
            try:
                layer = create_layer(layer_param("Pooling", t))
                bottom, top = blobs_from_arrays([x], np.float32), empty_tops(2, np.float32)
                layer.SetUp(bottom, top)
                layer.Forward(bottom, top)
                top[0].diff[...] = 1.0
                layer.Backward(top, [True], bottom)
                results.append([top[0].data.copy(), top[1].data.copy(), bottom[0].diff.copy()])
            finally:
                context.set_mode_cpu()
        assert (results[0][1] == -1).any()
        for a, b in zip(*results):
            np.testing.assert_array_equal(b, a)


@given(n=st.integers(1, 2), c=st.integers(1, 2), hw=st.tuples(st.integers(1, 6), st.integers(1, 6)),
       k=st.integers(1, 3), stride=st.integers(1, 3), pad=st.integers(0, 2), seed=st.integers(0, 2**31 - 1))
def test_argmax_backward_on_the_device_matches_the_reference_for_any_index(n, c, hw, k, stride, pad, seed):
    """The scatter-add backward of MAX/STOCHASTIC == the per-offset reference for ANY index (-1, out of range,
    outside its own window: a stale STOCHASTIC index in TEST): only an index inside its window adds."""
    from caffe.layers import pool_device, pooling
    assume(pad < k and min(hw) + 2 * pad >= k)
    cp = _cupy()
    spec = pooling.PoolSpec(pooling.MAX, (k, k), (stride, stride), (pad, pad))
    PH, PW = (pooling.pooled_size(s, k, stride, pad) for s in hw)
    rng = np.random.default_rng(seed)
    dy = rng.normal(size=(n, c, PH, PW)).astype(np.float32)
    index = rng.integers(-1, hw[0] * hw[1] + 1, size=dy.shape).astype(np.int32)
    ref = np.empty((n, c) + hw, np.float32)
    pooling._scatter_back(np, spec, dy, index, ref)
    out = cp.full(ref.shape, np.nan, np.float32)
    pool_device.scatter_back(cp, spec, cp.asarray(dy), cp.asarray(index), out)
    np.testing.assert_allclose(cp.asnumpy(out), ref, rtol=1e-6, atol=1e-6)

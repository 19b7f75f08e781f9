"""The hand-written CUDA kernels (caffe.layers.cuda_kernels, caffe.layers.kernels.cuda_*) against the
array-API paths they replace, on two backends:

- "gpu" (marked gpu): the kernels on a real GPU (caffe.layers.device.kernels), against the array-API path on
  the same GPU (CAFFE_DEVICE_KERNELS=0). Skips elsewhere, the CuPy stand-in included (it cannot run CUDA).
  NO GPU has run them yet: scripts/gpu_check.sh runs them.
- "host": the same CUDA sources compiled for the host and run by caffe.layers.cuda_host (blocks of a few real
  threads meeting at __syncthreads), against the array-API path with NumPy: indexing and arithmetic checked
  in the default suite. Skips without a C++ compiler. Out-of-bounds accesses of the kernels show under
  AddressSanitizer: CAFFE_CUDA_HOST_FLAGS="-fsanitize=address" LD_PRELOAD=$(gcc -print-file-name=libasan.so)
  ASAN_OPTIONS=detect_leaks=0 python -m pytest packages/layers/tests/test_layers_device_kernels.py
"""
from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

from caffe.blob import context
from caffe.layers import conv_base, conv_device, cuda_host, cuda_kernels, device, pool_device, pooling
from caffe.layers.kernels import cuda_channelwise, cuda_elementwise, cuda_norm, cuda_pooling, cuda_softmax
from caffe.layers.testing import blobs_from_arrays, empty_tops, gpu_available, make_layer


def _real_kernels() -> bool:
    if not gpu_available():
        return False
    import cupy
    return device.kernels(cupy)


needs_kernels = pytest.mark.skipif(not _real_kernels(), reason="hand-written CUDA kernels need a real GPU (not the "
                                   "CuPy stand-in; CAFFE_DEVICE_KERNELS=0 turns them off)")
needs_compiler = pytest.mark.skipif(not cuda_host.available(), reason="no host C++ compiler to run the CUDA sources")


@contextlib.contextmanager
def kernels_env(on: str):
    old = os.environ.get("CAFFE_DEVICE_KERNELS")
    os.environ["CAFFE_DEVICE_KERNELS"] = on
    try:
        yield
    finally:
        if old is None:
            del os.environ["CAFFE_DEVICE_KERNELS"]
        else:
            os.environ["CAFFE_DEVICE_KERNELS"] = old


class Backend:
    """Where a parity property runs: xp, host <-> backend arrays, kernels on / off."""

    def __init__(self, name):
        self.name = name
        if name == "gpu":
            import cupy
            self.xp, self.to, self.back = cupy, cupy.asarray, cupy.asnumpy
        else:
            self.xp, self.to, self.back = np, np.array, np.asarray

    def kernels(self, on: bool):
        if self.name == "gpu":
            return kernels_env("1" if on else "0")
        return cuda_host.emulating() if on else contextlib.nullcontext()

    def tol(self, dtype):
        return 2e-5 if dtype == np.float32 else 1e-12


BACKENDS = [pytest.param("gpu", marks=[pytest.mark.gpu, needs_kernels], id="gpu"),
            pytest.param("host", marks=needs_compiler, id="host")]
backends = pytest.mark.parametrize("where", BACKENDS)
DTYPES = st.sampled_from([np.float32, np.float64])


@contextlib.contextmanager
def counting(names):
    """Records the name of every kernel built through device.raw_kernel (what ran with the kernels on)."""
    build = device.raw_kernel

    def counted(name, source, dtype):
        names.append(name)
        return build(name, source, dtype)
    device.raw_kernel = counted
    try:
        yield
    finally:
        device.raw_kernel = build


def both(B, fn, expect=True):
    """fn() (returning host arrays) with the kernels on, then off; with them on a kernel must have run
    (expect=False: a case no kernel takes), else the property would compare the array-API path with itself."""
    outs, names = [], []
    for on in (True, False):
        with B.kernels(on), (counting(names) if on else contextlib.nullcontext()):
            outs.append(fn())
    assert bool(names) == expect, f"kernels run: {names}"
    return outs


def assert_close(a, b, dtype, B, scale=1.0):
    tol = B.tol(dtype)
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * scale)


@pytest.mark.gpu
def test_kernels_are_never_chosen_without_a_real_gpu():
    """On the stand-in (or NumPy) the array-API paths run: the kernel entry points decline."""
    assert not device.kernels(np)
    if not gpu_available() or not context.cupy_standin():
        pytest.skip("checks the CuPy stand-in")
    import cupy
    assert not device.kernels(cupy)
    x = cupy.zeros((1, 1, 4, 4), np.float32)
    spec = pooling.PoolSpec(pooling.MAX, (2, 2), (2, 2), (0, 0))
    assert not cuda_pooling.max_pool_forward(cupy, spec, x, cupy.zeros((1, 1, 2, 2), np.float32),
                                             cupy.zeros((1, 1, 2, 2), np.int32))


SOURCES = {"cuda_kernels": cuda_kernels._COL2IM, "cuda_pooling": cuda_pooling._SOURCE,
           "cuda_softmax": cuda_softmax._SOURCE, "cuda_norm": cuda_norm._SOURCE,
           "cuda_elementwise": cuda_elementwise._SOURCE, "cuda_channelwise": cuda_channelwise._SOURCE}


@pytest.mark.parametrize("ctype", ["float", "double"])
@pytest.mark.parametrize("module", sorted(SOURCES))
def test_kernel_sources_compile_with_nvrtc(module, ctype):
    """Every CUDA source through NVRTC, CUDA's own front end (as CuPy's RawModule compiles it; no GPU needed)."""
    if not cuda_host.nvrtc_available():
        pytest.skip("libnvrtc not found (the nvidia-cuda-nvrtc-cu12 wheel, a CUDA toolkit, or CAFFE_NVRTC)")
    ok, log = cuda_host.nvrtc_compile(SOURCES[module], ctype)
    assert ok, log


@backends
@given(k=st.tuples(st.integers(1, 3), st.integers(1, 3)), s=st.integers(1, 3), p=st.integers(0, 2),
       d=st.integers(1, 2), hw=st.tuples(st.integers(1, 7), st.integers(1, 7)), nb=st.integers(1, 3),
       c=st.integers(1, 3), layout=st.sampled_from(["batch", "image"]),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**31 - 1))
def test_col2im_kernel_matches_the_scatter_add(where, k, s, p, d, hw, nb, c, layout, dtype, seed):
    B = Backend(where)
    col_shape = []
    for n, kk in zip(hw, k):
        ext = d * (kk - 1) + 1
        assume(n + 2 * p >= ext)
        col_shape.append((n + 2 * p - ext) // s + 1)
    geom = conv_base.ConvGeometry(k, (s, s), (p, p), (d, d), hw, tuple(col_shape))
    K, P = geom.kernel_count, geom.col_count
    shape = (c * K, nb * P) if layout == "batch" else (nb, c * K, P)
    col = B.to(np.random.default_rng(seed).normal(size=shape).astype(dtype))

    def run():
        im = B.xp.full((nb, c) + hw, np.nan, dtype)
        conv_device.col2im(B.xp, col, im, geom, layout)
        return B.back(im)
    assert_close(*both(B, run, expect=not conv_device.trivial(geom)), dtype, B)


def _pool_case(k, s, p, hw):
    assume(p < min(k) and hw[0] + 2 * p >= k[0] and hw[1] + 2 * p >= k[1])
    return tuple(pooling.pooled_size(n, kk, s, p) for n, kk in zip(hw, k))


POOL = dict(k=st.tuples(st.integers(1, 4), st.integers(1, 4)), s=st.integers(1, 3), p=st.integers(0, 2),
            hw=st.tuples(st.integers(1, 7), st.integers(1, 7)), nc=st.tuples(st.integers(1, 2), st.integers(1, 3)),
            dtype=DTYPES, seed=st.integers(0, 2**31 - 1))


@backends
@given(ties=st.booleans(), **POOL)
def test_max_pool_kernel_matches_the_gather(where, k, s, p, hw, nc, ties, dtype, seed):
    B = Backend(where)
    PH, PW = _pool_case(k, s, p, hw)
    spec = pooling.PoolSpec(pooling.MAX, k, (s, s), (p, p))
    rng = np.random.default_rng(seed)
    x = rng.integers(-2, 3, size=nc + hw) if ties else rng.normal(size=nc + hw)
    x = x.astype(dtype)
    if ties:
        x[rng.random(x.shape) < 0.2] = -np.inf
    xd = B.to(x)

    def run():
        y, mask = B.xp.empty(nc + (PH, PW), dtype), B.xp.empty(nc + (PH, PW), np.int32)
        pool_device.max_forward(B.xp, spec, xd, y, mask)
        return B.back(y), B.back(mask)
    (y1, m1), (y0, m0) = both(B, run)
    np.testing.assert_array_equal(y1, y0)
    np.testing.assert_array_equal(m1, m0)


@backends
@given(stochastic=st.booleans(), **POOL)
def test_pool_backward_kernel_matches_the_scatter(where, k, s, p, hw, nc, stochastic, dtype, seed):
    """MAX (padded windows) and STOCHASTIC (unpadded) backward: indices from a forward, plus stale / -1 ones."""
    B = Backend(where)
    if stochastic:
        p = 0
    PH, PW = _pool_case(k, s, p, hw)
    spec = pooling.PoolSpec(pooling.MAX, k, (s, s), (p, p))
    rng = np.random.default_rng(seed)
    x = rng.integers(-2, 3, size=nc + hw).astype(dtype)
    y, mask = np.empty(nc + (PH, PW), dtype), np.empty(nc + (PH, PW), np.int32)
    pool_device.max_forward(np, spec, x, y, mask)
    junk = rng.random(mask.shape) < 0.2  # an index outside its window (or -1) adds nothing
    mask[junk] = rng.integers(-1, hw[0] * hw[1], size=int(junk.sum()))
    dy, md = B.to(rng.normal(size=mask.shape).astype(dtype)), B.to(mask)

    def run():
        dx = B.xp.full(nc + hw, np.nan, dtype)
        pool_device.scatter_back(B.xp, spec, dy, md, dx, pad=not stochastic)
        return B.back(dx)
    assert_close(*both(B, run), dtype, B)


@backends
@given(**POOL)
def test_ave_pool_kernels_match_the_gather(where, k, s, p, hw, nc, dtype, seed):
    B = Backend(where)
    PH, PW = _pool_case(k, s, p, hw)
    spec = pooling.PoolSpec(pooling.AVE, k, (s, s), (p, p))
    rng = np.random.default_rng(seed)
    x, dy = B.to(rng.normal(size=nc + hw).astype(dtype)), B.to(rng.normal(size=nc + (PH, PW)).astype(dtype))
    sizes = pooling.ave_pool_sizes(B.xp, spec, *hw, PH, PW, dtype)

    def run():
        y, dx = B.xp.full(nc + (PH, PW), np.nan, dtype), B.xp.full(nc + hw, np.nan, dtype)
        with np.errstate(invalid="ignore"):  # inf - inf past the edge (Caffe's x / 0), on NumPy
            pool_device.ave_forward(B.xp, spec, x, y, sizes)
            pool_device.ave_backward(B.xp, spec, dy, dx, sizes)
        return B.back(y), B.back(dx)
    (y1, dx1), (y0, dx0) = both(B, run)
    assert_close(y1, y0, dtype, B)
    assert_close(dx1, dx0, dtype, B)


# -- layer-level kernels: the layer's forward_xp / backward_xp with the kernels on and off -----------------
def run_layer(B, type_name, text, arrays, dtype, phase=0, n_top=1, propagate=None, seed=0, inplace=False,
              setup=None):
    """Set a fresh layer up (then setup(layer)), forward_xp and backward_xp on B (top diffs drawn from seed); the
    tops' data, the bottoms' diffs and the layer's blobs (data, then diffs: the parameter gradients) on the
    host. inplace: top[0] is bottom[0]."""
    context.set_random_seed(seed)  # the fillers
    layer = make_layer(type_name, text, phase=phase)
    bottom = blobs_from_arrays(arrays, dtype)
    top = [bottom[0]] if inplace else empty_tops(n_top, dtype)
    layer.SetUp(bottom, top)
    if setup is not None:
        setup(layer)
    context.set_random_seed(seed)
    layer.forward_xp(B.xp, bottom, top)
    datas = [t.cpu_data().copy() for t in top]
    rng = np.random.default_rng(seed)
    for i, t in enumerate(top):
        d = np.full(t.shape, layer.loss(i), dtype) if layer.loss(i) else rng.normal(size=t.shape).astype(dtype)
        t.mutable_diff_xp(B.xp)[...] = B.to(d)
    layer.backward_xp(B.xp, top, propagate or [True] * len(bottom), bottom)
    return (datas + [b.cpu_diff().copy() for b in bottom] + [b.cpu_data().copy() for b in layer.blobs]
            + [b.cpu_diff().copy() for b in layer.blobs])


def layer_parity(B, dtype, *args, scale=1.0, **kwargs):
    on, off = both(B, lambda: run_layer(B, *args, dtype=dtype, **kwargs))
    for a, b in zip(on, off):
        assert_close(a, b, dtype, B, scale)


SHAPES = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple)


@backends
@given(shape=SHAPES, axis=st.integers(0, 3), wide=st.booleans(), dtype=DTYPES, seed=st.integers(0, 2**31 - 1))
def test_softmax_kernels_match_the_array_api(where, shape, axis, wide, dtype, seed):
    B = Backend(where)
    axis = axis % len(shape)
    if wide:  # past a row block: the block reductions' strides
        shape = shape[:axis] + (shape[axis] * 67,) + shape[axis + 1:]
    x = np.random.default_rng(seed).normal(scale=3, size=shape)
    layer_parity(B, dtype, "Softmax", f"softmax_param {{ axis: {axis} }}", [x], seed=seed)


@backends
@given(shape=SHAPES, axis=st.integers(1, 3), ignore=st.sampled_from([None, 0, 2]),
       norm=st.sampled_from(["FULL", "VALID", "BATCH_SIZE", "NONE"]), weight=st.sampled_from([1.0, 0.5]),
       dtype=DTYPES, seed=st.integers(0, 2**31 - 1))
def test_softmax_loss_kernels_match_the_array_api(where, shape, axis, ignore, norm, weight, dtype, seed):
    B = Backend(where)
    shape = (2,) + shape
    axis = axis % len(shape) or 1
    rng = np.random.default_rng(seed)
    x = rng.normal(scale=3, size=shape)
    labels = rng.integers(0, shape[axis], size=shape[:axis] + shape[axis + 1:]).astype(float)
    text = f"softmax_param {{ axis: {axis} }} loss_param {{ normalization: {norm} "
    text += (f"ignore_label: {ignore} }} " if ignore is not None else "} ") + f"loss_weight: {weight} loss_weight: 0"
    layer_parity(B, dtype, "SoftmaxWithLoss", text, [x, labels], n_top=2, propagate=[True, False], seed=seed)


@backends
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple), glob=st.booleans(),
       inplace=st.booleans(), dtype=DTYPES, seed=st.integers(0, 2**31 - 1))
def test_batch_norm_kernels_match_the_array_api(where, shape, glob, inplace, dtype, seed):
    B = Backend(where)
    rng = np.random.default_rng(seed)
    x = rng.normal(loc=rng.normal(), scale=2, size=(3,) + shape)  # n >= 2 per channel: a variance
    c = x.shape[1] if x.ndim > 1 else 1

    def stored(layer):  # moving sums to normalize by in the global case, a running history in the other
        r = np.random.default_rng(seed)
        for b, v in zip(layer.blobs, (r.normal(size=c), r.random(c) + 0.5, [r.random() + 0.5])):
            b.mutable_cpu_data()[...] = np.asarray(v).reshape(b.shape)
    text = f"batch_norm_param {{ use_global_stats: {str(glob).lower()} moving_average_fraction: 0.9 }}"

    def run():
        return run_layer(B, "BatchNorm", text, [x], dtype, inplace=inplace, seed=seed, setup=stored)
    for a, b in zip(*both(B, run)):
        assert_close(a, b, dtype, B, scale=10)


@backends
@given(shape=st.tuples(st.integers(1, 2), st.integers(1, 9), st.integers(1, 3), st.integers(1, 3)),
       size=st.sampled_from([1, 3, 5]), beta=st.sampled_from([0.75, 0.6]), k=st.sampled_from([1.0, 2.0]),
       region=st.sampled_from(["ACROSS_CHANNELS", "WITHIN_CHANNEL"]), inplace=st.booleans(), dtype=DTYPES,
       seed=st.integers(0, 2**31 - 1))
def test_lrn_kernels_match_the_array_api(where, shape, size, beta, k, region, inplace, dtype, seed):
    B = Backend(where)
    if region == "WITHIN_CHANNEL":
        inplace = False  # a pixel's box reads its neighbours: the kernels decline in place
        shape = shape[:2] + (shape[2] * 2, shape[3] * 2)
    x = np.random.default_rng(seed).normal(scale=2, size=shape)
    text = f"lrn_param {{ local_size: {size} alpha: 0.7 beta: {beta} k: {k} norm_region: {region} }}"
    on, off = both(B, lambda: run_layer(B, "LRN", text, [x], dtype, inplace=inplace, seed=seed))
    for a, b in zip(on, off):
        assert_close(a, b, dtype, B)


NEURONS = [("ReLU", ""), ("ReLU", "relu_param { negative_slope: 0.1 }"),
           ("ReLU", "relu_param { negative_slope: -0.5 }"), ("Sigmoid", ""), ("TanH", ""),
           ("ELU", "elu_param { alpha: 0.7 }"), ("BNLL", ""), ("Swish", "swish_param { beta: 1.3 }"),
           ("Dropout", "dropout_param { dropout_ratio: 0.3 }"), ("Dropout", "dropout_param { dropout_ratio: 0.0 }")]


@backends
@given(case=st.sampled_from(NEURONS), shape=SHAPES, inplace=st.booleans(), dtype=DTYPES,
       seed=st.integers(0, 2**31 - 1))
def test_neuron_kernels_match_the_array_api(where, case, shape, inplace, dtype, seed):
    """ReLU, Sigmoid, TanH, ELU, BNLL, Swish, Dropout (TRAIN: the same mask bits from the same seed)."""
    B = Backend(where)
    x = np.random.default_rng(seed).normal(scale=4, size=shape)
    layer_parity(B, dtype, *case, [x], inplace=inplace, seed=seed)


@backends
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple), axis=st.integers(0, 3),
       num_axes=st.integers(0, 2), bias=st.booleans(), second_bottom=st.booleans(), inplace=st.booleans(),
       dtype=DTYPES, seed=st.integers(0, 2**31 - 1))
def test_scale_kernels_match_the_array_api(where, shape, axis, num_axes, bias, second_bottom, inplace, dtype, seed):
    B = Backend(where)
    axis %= len(shape)
    num_axes = min(num_axes, len(shape) - axis)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape)
    arrays = [x, rng.normal(size=shape[axis:axis + num_axes])] if second_bottom else [x]
    text = f"scale_param {{ axis: {axis} num_axes: {num_axes} bias_term: {str(bias).lower()} " \
           "filler { type: 'gaussian' } bias_filler { type: 'gaussian' } }"
    layer_parity(B, dtype, "Scale", text, arrays, inplace=inplace, seed=seed)


@backends
@given(k=st.integers(2, 4), op=st.sampled_from(["SUM", "MAX"]), coeff=st.booleans(), shape=SHAPES,
       inplace=st.booleans(), dtype=DTYPES, seed=st.integers(0, 2**31 - 1))
def test_eltwise_kernels_match_the_array_api(where, k, op, coeff, shape, inplace, dtype, seed):
    """SUM (with coefficients) and MAX (ties: small integers, so Caffe's tie rule shows)."""
    B = Backend(where)
    rng = np.random.default_rng(seed)
    arrays = [rng.integers(-2, 3, size=shape) if op == "MAX" else rng.normal(size=shape) for _ in range(k)]
    coeffs = "".join(f"coeff: {c} " for c in rng.normal(size=k)) if coeff and op == "SUM" else ""
    text = f"eltwise_param {{ operation: {op} {coeffs}}}"
    layer_parity(B, dtype, "Eltwise", text, arrays, inplace=inplace, seed=seed)


@backends
@given(bad=st.sampled_from([-1.0, 4.0, 3.5e3]), ignore=st.sampled_from([None, 1]), dtype=DTYPES)
def test_softmax_loss_kernel_reports_the_first_bad_label(where, bad, ignore, dtype):
    """A label neither ignored nor in [0, C): the same error by both paths (deferred on the device)."""
    from caffe.blob import deferred
    B = Backend(where)
    x = np.random.default_rng(0).normal(size=(4, 4))
    text = f"loss_param {{ ignore_label: {ignore} }}" if ignore is not None else ""

    def run():
        layer = make_layer("SoftmaxWithLoss", text)
        bottom, top = blobs_from_arrays([x, [1, 2, bad, -2.0]], dtype), empty_tops(1, dtype)
        layer.SetUp(bottom, top)
        with pytest.raises(Exception) as failure:
            layer.forward_xp(B.xp, bottom, top)
            deferred.flush()
        return str(failure.value)
    on, off = both(B, run)
    assert on == off and f"label value {bad:g} is out of range" in on


@backends
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple), axis=st.integers(0, 3),
       num_axes=st.integers(0, 2), second_bottom=st.booleans(), inplace=st.booleans(), dtype=DTYPES,
       seed=st.integers(0, 2**31 - 1))
def test_bias_kernel_matches_the_array_api(where, shape, axis, num_axes, second_bottom, inplace, dtype, seed):
    B = Backend(where)
    axis %= len(shape)
    num_axes = min(num_axes, len(shape) - axis)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape)
    arrays = [x, rng.normal(size=shape[axis:axis + num_axes])] if second_bottom else [x]
    text = f"bias_param {{ axis: {axis} num_axes: {num_axes} filler {{ type: 'gaussian' }} }}"
    layer_parity(B, dtype, "Bias", text, arrays, inplace=inplace, seed=seed)


@backends
@given(outer=st.integers(1, 3), dim=st.integers(1, 3), inner=st.sampled_from([1, 7, 9001]), dtype=DTYPES,
       seed=st.integers(0, 2**31 - 1))
def test_channel_dot_kernel_sums_every_part(where, outer, dim, inner, dtype, seed):
    """Scale's scale gradient: a channel cut into several blocks' parts once it is long (inner 9001)."""
    B = Backend(where)
    rng = np.random.default_rng(seed)
    a, b = (rng.normal(size=(outer, dim, inner)).astype(dtype) for _ in range(2))
    with B.kernels(True):
        got = B.back(cuda_channelwise.channel_dot(B.xp, B.to(a), B.to(b), outer, dim, inner))
    terms = a.astype(np.float64) * b
    assert got.dtype == dtype
    np.testing.assert_allclose(got, terms.sum(axis=(0, 2)), rtol=0, atol=10 * B.tol(dtype) * np.abs(terms).sum())


@backends
@given(k=st.tuples(st.integers(1, 4), st.integers(1, 4)), s=st.integers(1, 4),
       hw=st.tuples(st.integers(1, 7), st.integers(1, 7)), nc=st.tuples(st.integers(1, 2), st.integers(1, 3)),
       signed=st.booleans(), dtype=DTYPES, seed=st.integers(0, 2**31 - 1))
def test_stochastic_pool_kernels_match_the_array_api(where, k, s, hw, nc, signed, dtype, seed):
    """TRAIN (the sampled value and position from the same uniforms; negative windows: the last element;
    windows past the edge: 0 and -1) and TEST (Caffe's non-negative inputs)."""
    B = Backend(where)
    PH, PW = _pool_case(k, s, 0, hw)
    spec = pooling.PoolSpec(pooling.STOCHASTIC, k, (s, s), (0, 0))
    rng = np.random.default_rng(seed)
    x = rng.normal(size=nc + hw) if signed else rng.random(nc + hw)
    xd, u = B.to(x.astype(dtype)), B.to(rng.random(nc + (PH, PW)))

    def run():
        y, idx, yt = (B.xp.full(nc + (PH, PW), np.nan, dtype), B.xp.full(nc + (PH, PW), -7, np.int32),
                      B.xp.full(nc + (PH, PW), np.nan, dtype))
        pooling.stochastic_forward_train(B.xp, spec, xd, y, idx, u)
        pooling.stochastic_forward_test(B.xp, spec, xd, yt)
        return B.back(y), B.back(idx), B.back(yt)
    (y1, i1, t1), (y0, i0, t0) = both(B, run)
    np.testing.assert_array_equal(i1, i0)
    np.testing.assert_array_equal(y1, y0)
    if not signed:  # TEST divides by the window sum: near 0 (signed inputs) the summation order shows
        assert_close(t1, t0, dtype, B)


@backends
@given(shape=st.lists(st.integers(1, 5), min_size=2, max_size=4).map(tuple), shared=st.booleans(),
       inplace=st.booleans(), dtype=DTYPES, seed=st.integers(0, 2**31 - 1))
def test_prelu_kernels_match_the_array_api(where, shape, shared, inplace, dtype, seed):
    """y, the bottom diff and the slope gradient (per channel or one shared slope)."""
    B = Backend(where)
    x = np.random.default_rng(seed).normal(size=shape)
    text = f"prelu_param {{ channel_shared: {str(shared).lower()} filler {{ type: 'gaussian' }} }}"
    layer_parity(B, dtype, "PReLU", text, [x], inplace=inplace, seed=seed, scale=10)

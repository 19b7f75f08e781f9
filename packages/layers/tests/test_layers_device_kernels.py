"""The hand-written CUDA kernels (caffe.layers.cuda_kernels) against the array-API paths they replace.

The kernels run only on a real GPU (caffe.layers.device.kernels); their parity properties skip elsewhere,
the CuPy stand-in included (it cannot run CUDA). NO GPU has run them yet: scripts/gpu_check.sh runs them.
"""
from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

from caffe.blob import context
from caffe.layers import conv_base, cuda_kernels, device, pool_device, pooling
from caffe.layers.testing import gpu_available

pytestmark = pytest.mark.gpu


def _real_kernels() -> bool:
    if not gpu_available():
        return False
    import cupy
    return device.kernels(cupy)


needs_kernels = pytest.mark.skipif(not _real_kernels(), reason="hand-written CUDA kernels need a real GPU (not the "
                                   "CuPy stand-in; CAFFE_DEVICE_KERNELS=0 turns them off)")


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


def test_kernels_are_never_chosen_without_a_real_gpu():
    """On the stand-in (or NumPy) the array-API paths run: the kernel entry points decline."""
    assert not device.kernels(np)
    if not gpu_available() or not context.cupy_standin():
        pytest.skip("checks the CuPy stand-in")
    import cupy
    assert not device.kernels(cupy)
    x = cupy.zeros((1, 1, 4, 4), np.float32)
    spec = pooling.PoolSpec(pooling.MAX, (2, 2), (2, 2), (0, 0))
    assert not cuda_kernels.max_pool_forward(cupy, spec, x, cupy.zeros((1, 1, 2, 2), np.float32),
                                             cupy.zeros((1, 1, 2, 2), np.int32))


@needs_kernels
@given(k=st.tuples(st.integers(1, 3), st.integers(1, 3)), s=st.integers(1, 3), p=st.integers(0, 2),
       d=st.integers(1, 2), hw=st.tuples(st.integers(1, 7), st.integers(1, 7)), nb=st.integers(1, 3),
       c=st.integers(1, 3), layout=st.sampled_from(["batch", "image"]),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**31 - 1))
def test_col2im_kernel_matches_the_scatter_add(k, s, p, d, hw, nb, c, layout, dtype, seed):
    import cupy as cp
    col_shape = []
    for n, kk in zip(hw, k):
        ext = d * (kk - 1) + 1
        assume(n + 2 * p >= ext)
        col_shape.append((n + 2 * p - ext) // s + 1)
    geom = conv_base.ConvGeometry(k, (s, s), (p, p), (d, d), hw, tuple(col_shape))
    K, P = geom.kernel_count, geom.col_count
    shape = (c * K, nb * P) if layout == "batch" else (nb, c * K, P)
    col = cp.asarray(np.random.default_rng(seed).normal(size=shape).astype(dtype))
    outs = []
    for on in ("1", "0"):
        im = cp.full((nb, c) + hw, np.nan, dtype)
        with kernels_env(on):
            conv_base.col2im(cp, col, im, geom, layout)
        outs.append(cp.asnumpy(im))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(outs[0], outs[1], rtol=tol, atol=tol)


@needs_kernels
@given(k=st.tuples(st.integers(1, 4), st.integers(1, 4)), s=st.integers(1, 3), p=st.integers(0, 2),
       hw=st.tuples(st.integers(1, 7), st.integers(1, 7)), nc=st.tuples(st.integers(1, 2), st.integers(1, 3)),
       ties=st.booleans(), dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**31 - 1))
def test_max_pool_kernel_matches_the_gather(k, s, p, hw, nc, ties, dtype, seed):
    import cupy as cp
    assume(p < min(k) and hw[0] + 2 * p >= k[0] and hw[1] + 2 * p >= k[1])
    spec = pooling.PoolSpec(pooling.MAX, k, (s, s), (p, p))
    PH, PW = (pooling.pooled_size(n, kk, s, p) for n, kk in zip(hw, k))
    rng = np.random.default_rng(seed)
    x = rng.integers(-2, 3, size=nc + hw) if ties else rng.normal(size=nc + hw)
    x = x.astype(dtype)
    if ties:
        x[rng.random(x.shape) < 0.2] = -np.inf
    xd = cp.asarray(x)
    outs = []
    for on in ("1", "0"):
        y, mask = cp.empty(nc + (PH, PW), dtype), cp.empty(nc + (PH, PW), np.int32)
        with kernels_env(on):
            pool_device.max_forward(cp, spec, xd, y, mask)
        outs.append((cp.asnumpy(y), cp.asnumpy(mask)))
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])

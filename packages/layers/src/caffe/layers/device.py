"""What the layers' device (CuPy) paths share: when hand-written CUDA kernels run, compiled kernels, caches.

A layer's GPU path is its array-module-generic code (forward_xp / backward_xp with xp = cupy). Where that
code would take many passes over memory (or one launch per kernel offset), a hand-written CUDA kernel
(cupy.RawKernel / ElementwiseKernel) may replace it; such a kernel runs only where `kernels(xp)` is true: a
real GPU (caffe.blob.context.device_kernels_available()), never the CuPy stand-in (which cannot run CUDA)
and never NumPy. The array-API formulation it replaces stays the path everywhere else, and each kernel has a
parity property against it (marked gpu: it runs wherever a real GPU is;
packages/layers/tests/test_layers_device_kernels.py, which also runs every kernel on the host through
caffe.layers.cuda_host).

The kernels: caffe.layers.cuda_kernels (col2im), caffe.layers.kernels.cuda_pooling (MAX/AVE/STOCHASTIC),
cuda_softmax (Softmax, SoftmaxWithLoss), cuda_norm (BatchNorm, LRN), cuda_elementwise (Dropout, ReLU,
Sigmoid, TanH, ELU, BNLL, Swish, Eltwise SUM/MAX), cuda_channelwise (Scale, Bias, PReLU). NONE HAS RUN ON A
GPU YET.

CAFFE_DEVICE_KERNELS=0 turns the hand-written kernels off (the array-API paths run on the GPU too).
"""
from __future__ import annotations

import os
import threading

import numpy as np

from caffe.blob import context

CUDA_NUM_THREADS = 512  # Caffe's CAFFE_CUDA_NUM_THREADS
_lock = threading.Lock()
_modules: dict = {}
_cache: dict = {}


def kernels(xp) -> bool:
    """Whether hand-written CUDA kernels run for arrays of module xp (a real GPU, not turned off)."""
    return (xp is not np and os.environ.get("CAFFE_DEVICE_KERNELS", "1") != "0"
            and context.device_kernels_available())


def device_id(xp) -> int:
    return -1 if xp is np else xp.cuda.Device().id


def cached(xp, key, build):
    """A value built once per (array module, current device, key): index arrays, divisors (kept on the device,
    so calls move nothing between host and device). Bounded: cleared past 512 entries."""
    full = (xp.__name__, device_id(xp)) + tuple(key)
    value = _cache.get(full)
    if value is None:
        value = build()
        with _lock:
            if len(_cache) > 512:
                _cache.clear()
            _cache[full] = value
    return value


CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}

# What every kernel family's source starts with: Caffe's grid-stride loop, and a sum over a block's threads
# (blockDim.x a power of two, buf one entry per thread in shared memory) for the one-block-per-row kernels.
CUDA_COMMON = r"""
#define CUDA_KERNEL_LOOP(i, n) \
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); \
       i += (long long)blockDim.x * gridDim.x)

template <typename A>
__device__ A block_sum(A v, A* buf) {
  buf[threadIdx.x] = v;
  __syncthreads();
  for (unsigned int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) buf[threadIdx.x] += buf[threadIdx.x + k];
    __syncthreads();
  }
  const A r = buf[0];
  __syncthreads();
  return r;
}
"""


def raw_kernel(name: str, source: str, dtype):
    """The CUDA kernel `name` of `source` compiled for dtype (T = float or double), once per device."""
    import cupy
    ctype = CTYPES[np.dtype(dtype)]
    key = (source, ctype, cupy.cuda.Device().id)
    module = _modules.get(key)
    if module is None:
        module = cupy.RawModule(code=f"typedef {ctype} T;\n{source}", options=("--std=c++11",))
        with _lock:
            _modules[key] = module
    return module.get_function(name)


def launch(kernel, n: int, args) -> None:
    """Run a grid-stride kernel over n items (Caffe's CAFFE_GET_BLOCKS / CUDA_KERNEL_LOOP)."""
    if n <= 0:
        return
    blocks = min((n + CUDA_NUM_THREADS - 1) // CUDA_NUM_THREADS, 65535 * 8)
    kernel((blocks,), (CUDA_NUM_THREADS,), tuple(args))


def floats(xp, *arrays) -> bool:
    """All arrays float32 (or all float64) and C-contiguous: what the hand-written kernels take."""
    dt = arrays[0].dtype
    return dt in CTYPES and all(a.dtype == dt and a.flags.c_contiguous for a in arrays)


def address(a) -> int:
    """Where an array's data starts (a CuPy device pointer, or a NumPy host address): kernels that would read
    what they already wrote (in place) compare them and decline."""
    return a.data.ptr if hasattr(a.data, "ptr") else a.ctypes.data

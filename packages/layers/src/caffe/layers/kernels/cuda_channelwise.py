"""Hand-written CUDA kernels for the layers with a per-channel operand on (outer, channels, inner): Scale (+ its
bias), Bias, PReLU (a real GPU only: caffe.layers.device.kernels). Elementwise: one thread per element; the
parameter gradients: blocks per channel part, partial sums in double.

Passes over memory, array-API path -> kernel (the copy into the top / bottom diff counted):
  Scale (+ its bias) forward  multiply, copy, add, copy: 4 -> 1;  bottom diff: multiply, copy: 2 -> 1
  Bias forward        add, copy: 2 -> 1
  Scale's scale gradient  multiply (a temporary), reduce: 2 -> 1 (+ a small sum of the parts)
  PReLU forward       maximum, minimum, multiply, add, copy: 5 -> 1;  bottom diff: compare, where, multiply,
                      copy: 4 -> 1;  slope gradient: compare, 2 multiplies, reduce: 4 -> 1 (+ the parts)
Each entry point returns False (channel_dot: None) where it does not apply (no real GPU, other dtypes or
layouts); the array-API path then runs. NEVER RUN ON A GPU YET: parity properties in
tests/test_layers_device_kernels.py (gpu-marked), and on the host by caffe.layers.cuda_host in the default suite.
"""
from __future__ import annotations

import numpy as np

from caffe.layers import device

_SOURCE = device.CUDA_COMMON + r"""

// y = x (* s[ch]) (+ b[ch]) on (outer, dim, inner)
extern "C" __global__ void channel_scale(const long long n, const T* x, const T* s, const int has_s, const T* b,
    const int has_b, const int dim, const long long inner, T* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const int ch = (int)((i / inner) % dim);
    const T v = has_s ? x[i] * s[ch] : x[i];
    y[i] = has_b ? v + b[ch] : v;
  }
}

// PReLU: y = max(x, 0) + a[ch] * min(x, 0); dx = dy * (x <= 0 ? a[ch] : 1) (ch 0 for one shared slope)
extern "C" __global__ void prelu_forward(const long long n, const T* x, const T* a, const int dim,
    const long long inner, T* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const T v = x[i];
    y[i] = (v > 0 ? v : (T)0) + a[(i / inner) % dim] * (v < 0 ? v : (T)0);
  }
}

extern "C" __global__ void prelu_backward(const long long n, const T* x, const T* dy, const T* a, const int dim,
    const long long inner, T* dx) {
  CUDA_KERNEL_LOOP(i, n) dx[i] = dy[i] * (x[i] <= 0 ? a[(i / inner) % dim] : (T)1);
}

// Block (ch, part) of `parts`: partial[ch * parts + part] = the part's share of sum over (outer, inner) of
// a * b (negative_only: (a * b) * (b <= 0), PReLU's slope gradient) in channel ch (a and b as (outer, dim,
// inner)), in double.
extern "C" __global__ void channel_dot(const T* a, const T* b, const long long outer, const int dim,
    const long long inner, const int parts, const int negative_only, double* partial) {
  __shared__ double buf[256];
  const int ch = blockIdx.x / parts, part = blockIdx.x % parts;
  const long long m = outer * inner;
  double acc = 0;
  for (long long j = (long long)part * blockDim.x + threadIdx.x; j < m; j += (long long)parts * blockDim.x) {
    const long long i = ((j / inner) * dim + ch) * inner + j % inner;
    const T p = negative_only ? (a[i] * b[i]) * (T)(b[i] <= 0 ? 1 : 0) : a[i] * b[i];
    acc += (double)p;
  }
  buf[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = buf[0];
}
"""


def _run(name, dtype, n, *args):
    device.launch(device.raw_kernel(name, _SOURCE, dtype), n, (np.int64(n),) + args)


def _ok(xp, *arrays):
    return device.kernels(xp) and device.floats(xp, *arrays)


def channel_scale(xp, x, s, b, y, dim, inner) -> bool:
    """y = x (* s[channel]) (+ b[channel]) on x as (outer, dim, inner), s or b None: left out; y may be x."""
    if not _ok(xp, *(a for a in (x, s, b, y) if a is not None)):
        return False
    _run("channel_scale", x.dtype, x.size, x, x if s is None else s, np.int32(s is not None), x if b is None else b,
         np.int32(b is not None), np.int32(dim), np.int64(inner), y)
    return True


DOT_THREADS = 256  # the block of channel_dot (a power of two, <= its shared buffer)


def channel_dot(xp, a, b, outer, dim, inner, negative_only=False):
    """The per-channel sum over (outer, inner) of a * b (Scale's scale gradient; negative_only: where b <= 0,
    PReLU's slope gradient), in a's dtype: one read of each; a channel is cut into parts (blocks) so that few
    channels still fill the device. None where the kernel does not apply."""
    if not _ok(xp, a, b) or a.size == 0:
        return None
    m = outer * inner
    parts = int(max(1, min(64, -(-m // (DOT_THREADS * 64)))))  # a part: 64 elements a thread or more
    partial = xp.empty(dim * parts, np.float64)
    device.raw_kernel("channel_dot", _SOURCE, a.dtype)((dim * parts,), (DOT_THREADS,),
                                                       (a, b, np.int64(outer), np.int32(dim), np.int64(inner),
                                                        np.int32(parts), np.int32(negative_only), partial))
    return partial.reshape(dim, parts).sum(axis=1).astype(a.dtype)


def prelu_forward(xp, x, a, y, dim, inner) -> bool:
    """PReLU's y with slopes a (dim of them: 1 shared, or one per channel of x as (outer, dim, inner))."""
    if not _ok(xp, x, a, y):
        return False
    _run("prelu_forward", x.dtype, x.size, x, a, np.int32(dim), np.int64(inner), y)
    return True


def prelu_backward(xp, x, dy, a, dx, dim, inner) -> bool:
    if not _ok(xp, x, dy, a, dx):
        return False
    _run("prelu_backward", x.dtype, x.size, x, dy, a, np.int32(dim), np.int64(inner), dx)
    return True

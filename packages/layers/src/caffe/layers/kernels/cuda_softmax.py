"""Hand-written CUDA kernels for Softmax and SoftmaxWithLoss (a real GPU only: caffe.layers.device.kernels).

The array (outer, C, inner) is softmaxed over C. inner == 1 (classification): one block per row, the
threads striding over C, block reductions for the max and the exp-sum (shared memory, a power-of-two
block). inner > 1: one thread per (outer, inner) position looping over C (Caffe's kernel_channel_* family,
fused). Passes over memory, array-API path -> kernel:
  softmax_forward        max, subtract, exp, sum, divide, copy into the top: 6 -> 1
  softmax_backward       dy * y, sum, subtract, multiply, copy: 5 -> 1
  softmax_loss_forward   (after softmax_forward) label cast, masks and the deferred check (~12 small), gather,
                         clamp, log, mask, sum, count: ~20 launches over the labels -> 1 (one block)
  softmax_loss_backward  label cast and masks (~6 small), one-hot (3 full), subtract, mask, scale, copy: ~12 -> 1
    (the scale, top diff / normalizer, stays a device scalar: read by the kernel, never synced)
Each entry point returns False where it does not apply (no real GPU, other dtypes or layouts); the
array-API path then runs. NEVER RUN ON A GPU YET: parity properties in tests/test_layers_device_kernels.py
(gpu-marked), and on the host by caffe.layers.cuda_host in the default suite.
"""
from __future__ import annotations

import numpy as np

from caffe.layers import device

ROW_THREADS = 256  # the block of the row kernels (a power of two, <= the shared buffers below)

_SOURCE = device.CUDA_COMMON + r"""

// The block's max of v (every thread gets it; device.CUDA_COMMON has the sum); buf holds blockDim.x (a power of two) values.
__device__ T block_max(T v, T* buf) {
  buf[threadIdx.x] = v;
  __syncthreads();
  for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s && buf[threadIdx.x + s] > buf[threadIdx.x]) buf[threadIdx.x] = buf[threadIdx.x + s];
    __syncthreads();
  }
  const T r = buf[0];
  __syncthreads();  // buf is reused by the next reduction
  return r;
}

// inner == 1: block b softmaxes row b (C values).
extern "C" __global__ void softmax_rows(const T* x, T* y, const int C) {
  __shared__ T buf[256];
  const T* xr = x + (long long)blockIdx.x * C;
  T* yr = y + (long long)blockIdx.x * C;
  T m = xr[0];
  for (int c = threadIdx.x; c < C; c += blockDim.x) m = xr[c] > m ? xr[c] : m;
  m = block_max(m, buf);
  T s = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) s += exp(xr[c] - m);
  s = block_sum(s, buf);
  for (int c = threadIdx.x; c < C; c += blockDim.x) yr[c] = exp(xr[c] - m) / s;
}

// inner > 1: one thread per (outer, inner) position.
extern "C" __global__ void softmax_strided(const long long n, const T* x, T* y, const int C, const int inner) {
  CUDA_KERNEL_LOOP(i, n) {
    const long long base = (i / inner) * C * inner + i % inner;
    T m = x[base];
    for (int c = 1; c < C; ++c) m = x[base + (long long)c * inner] > m ? x[base + (long long)c * inner] : m;
    T s = 0;
    for (int c = 0; c < C; ++c) s += exp(x[base + (long long)c * inner] - m);
    for (int c = 0; c < C; ++c) y[base + (long long)c * inner] = exp(x[base + (long long)c * inner] - m) / s;
  }
}

// dx = (dy - sum_c(dy * y)) * y
extern "C" __global__ void softmax_backward_rows(const T* y, const T* dy, T* dx, const int C) {
  __shared__ T buf[256];
  const long long off = (long long)blockIdx.x * C;
  T s = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) s += dy[off + c] * y[off + c];
  s = block_sum(s, buf);
  for (int c = threadIdx.x; c < C; c += blockDim.x) dx[off + c] = (dy[off + c] - s) * y[off + c];
}

extern "C" __global__ void softmax_backward_strided(const long long n, const T* y, const T* dy, T* dx,
    const int C, const int inner) {
  CUDA_KERNEL_LOOP(i, n) {
    const long long base = (i / inner) * C * inner + i % inner;
    T s = 0;
    for (int c = 0; c < C; ++c) s += dy[base + (long long)c * inner] * y[base + (long long)c * inner];
    for (int c = 0; c < C; ++c) {
      const long long j = base + (long long)c * inner;
      dx[j] = (dy[j] - s) * y[j];
    }
  }
}

// One block: SoftmaxWithLoss's loss sum -log(max(p[label], FLT_MIN)) over the non-ignored positions and
// their count (sums, double), and the first position whose label is neither ignored nor in [0, C) (n when
// none; such a label reads class 0, as read_labels' gather does).
extern "C" __global__ void softmax_loss_forward(const long long n, const T* prob, const T* label, const int C,
    const int inner, const int has_ignore, const long long ignore, double* sums, long long* first_bad) {
  __shared__ double buf[256];
  __shared__ long long low[256];
  double loss = 0, count = 0;
  long long bad = n;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) {
    const long long l = (long long)label[i];
    if (has_ignore && l == ignore) continue;
    const bool out = l < 0 || l >= C;
    if (out && i < bad) bad = i;
    const T p = prob[(i / inner) * C * inner + (out ? 0 : l) * inner + i % inner];
    const T floor = (T)1.17549435082228750797e-38;  // FLT_MIN, for float and double alike (Caffe's)
    loss -= (double)log(p < floor ? floor : p);
    count += 1;
  }
  loss = block_sum(loss, buf);
  count = block_sum(count, buf);
  low[threadIdx.x] = bad;
  __syncthreads();
  for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s && low[threadIdx.x + s] < low[threadIdx.x]) low[threadIdx.x] = low[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) { sums[0] = loss; sums[1] = count; first_bad[0] = low[0]; }
}

// SoftmaxWithLoss: dx = (prob - onehot(label)) * valid * scale[0]; a label that is neither ignored nor in
// [0, C) counts as class 0 (its error is raised by the forward's deferred check).
extern "C" __global__ void softmax_loss_backward(const long long n, const T* prob, const T* label, const T* scale,
    const int C, const int inner, const int has_ignore, const long long ignore, T* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int c = (int)((i / inner) % C);
    const long long pos = (i / ((long long)inner * C)) * inner + i % inner;
    const long long l = (long long)label[pos];  // Caffe's static_cast<int>: toward zero
    const bool valid = !has_ignore || l != ignore;
    const long long target = (l < 0 || l >= C) ? 0 : l;
    const T hit = (T)(c == target ? 1 : 0);
    dx[i] = ((prob[i] - hit) * (T)(valid ? 1 : 0)) * scale[0];
  }
}
"""


def _shape3(shape, axis):
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    return outer, int(shape[axis]), inner


def _rows(name, dtype, rows, args, width=ROW_THREADS):
    """One block per row; the block a power of two from 32 (a warp) to ROW_THREADS, about the row's width."""
    if rows > 0:
        threads = min(ROW_THREADS, max(32, 1 << max(int(width) - 1, 0).bit_length()))
        device.raw_kernel(name, _SOURCE, dtype)((rows,), (threads,), args)


def softmax_forward(xp, x, y, axis) -> bool:
    """y = softmax(x) over axis in one pass; False where the kernel does not apply."""
    if not (device.kernels(xp) and device.floats(xp, x, y)) or x.size == 0:
        return False
    outer, C, inner = _shape3(x.shape, axis)
    if inner == 1:
        _rows("softmax_rows", x.dtype, outer, (x, y, np.int32(C)), C)
    else:
        device.launch(device.raw_kernel("softmax_strided", _SOURCE, x.dtype), outer * inner,
                      (np.int64(outer * inner), x, y, np.int32(C), np.int32(inner)))
    return True


def softmax_backward(xp, y, dy, dx, axis) -> bool:
    """dx = (dy - sum(dy * y, axis)) * y in one pass."""
    if not (device.kernels(xp) and device.floats(xp, y, dy, dx)) or y.size == 0:
        return False
    outer, C, inner = _shape3(y.shape, axis)
    if inner == 1:
        _rows("softmax_backward_rows", y.dtype, outer, (y, dy, dx, np.int32(C)), C)
    else:
        device.launch(device.raw_kernel("softmax_backward_strided", _SOURCE, y.dtype), outer * inner,
                      (np.int64(outer * inner), y, dy, dx, np.int32(C), np.int32(inner)))
    return True


def softmax_loss_forward(xp, prob, label, num_classes, inner, ignore):
    """SoftmaxWithLoss's loss terms in one kernel (one block): (sums, first_bad), device arrays: sums[0] the loss
    sum, sums[1] the count of non-ignored labels (float64), first_bad[0] the first position of a label neither
    ignored nor in [0, num_classes) (label.size: none). None where the kernel does not apply."""
    if not (device.kernels(xp) and device.floats(xp, prob, label)) or label.size == 0:
        return None
    sums, first_bad = xp.empty(2, np.float64), xp.empty(1, np.int64)
    has_ignore = ignore is not None
    _rows("softmax_loss_forward", prob.dtype, 1, (np.int64(label.size), prob, label, np.int32(num_classes),
                                                  np.int32(inner), np.int32(has_ignore),
                                                  np.int64(ignore if has_ignore else 0), sums, first_bad))
    return sums, first_bad


def softmax_loss_backward(xp, prob, label, scale, dx, num_classes, inner, ignore) -> bool:
    """SoftmaxWithLoss's gradient (prob - onehot(label)) * (label != ignore) * scale, scale a device scalar
    (top diff / normalizer); labels as stored (floats, cast toward zero)."""
    if not (device.kernels(xp) and device.floats(xp, prob, label, dx)) or prob.size == 0:
        return False
    scale = xp.ascontiguousarray(scale, dtype=prob.dtype).reshape(1)
    has_ignore = ignore is not None
    args = (np.int64(prob.size), prob, label, scale, np.int32(num_classes), np.int32(inner), np.int32(has_ignore),
            np.int64(ignore if has_ignore else 0), dx)
    device.launch(device.raw_kernel("softmax_loss_backward", _SOURCE, prob.dtype), prob.size, args)
    return True

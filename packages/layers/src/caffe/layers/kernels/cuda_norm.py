"""Hand-written CUDA kernels for BatchNorm and LRN (a real GPU only: caffe.layers.device.kernels).

BatchNorm on x as (n, c, s): the statistics of a channel are reduced by one block (double accumulators,
two reads of the channel: mean, then the squared deviations, as the array-API path's mean and var), the
normalization is one elementwise pass. Passes over memory, array-API path -> kernels:
  train forward    mean, var (~4: mean, subtract, square, mean), subtract, multiply, x_norm and top copies: ~9 -> 2
  global forward   subtract, multiply, copy: 3 -> 1;   global backward  multiply, copy: 2 -> 1
  train backward   (recompute y: 2), mean(dy), dy * y, mean, the gradient (4 + temporaries), copy: ~10 -> 2
LRN ACROSS_CHANNELS, one thread per (n, h, w) column sliding its window over the channels (sums in double,
as the CPU kernel), as Caffe's LRNFillScale / LRNComputeOutput / LRNComputeDiff fused:
  forward    square, local_size shifted adds, scale, power (3 for beta 0.75), multiply: ~local_size + 8 -> 1
  backward   power, multiply, divide, local_size shifted adds, 3 multiplies, subtract: ~local_size + 9 -> 1
LRN WITHIN_CHANNEL, one thread per pixel summing its local_size x local_size box (as the array-API path: rows,
then the sum of the rows):
  forward    square, pad, 2 * local_size shifted adds, scale, power, multiply: ~2 * local_size + 9 -> 1
  backward   power, multiply, divide, pad, 2 * local_size adds, 3 multiplies, subtract: ~2 * local_size + 10 -> 1
Each entry point returns False (or None) where it does not apply; the array-API path then runs.
NEVER RUN ON A GPU YET: parity properties in tests/test_layers_device_kernels.py (gpu-marked), and on the
host by caffe.layers.cuda_host in the default suite.
"""
from __future__ import annotations

import numpy as np

from caffe.layers import device

STAT_THREADS = 256  # the block reducing one channel (a power of two, <= the shared buffer)

_SOURCE = device.CUDA_COMMON + r"""

// Block ch: mean and (population) variance of channel ch of x (n, c, s), in double.
extern "C" __global__ void bn_stats(const T* x, const int n, const int c, const long long s,
    double* mean, double* var) {
  __shared__ double buf[256];
  const int ch = blockIdx.x;
  const long long m = (long long)n * s;
  double acc = 0;
  for (long long j = threadIdx.x; j < m; j += blockDim.x) acc += (double)x[((j / s) * c + ch) * s + j % s];
  const double mu = block_sum(acc, buf) / (double)m;
  acc = 0;
  for (long long j = threadIdx.x; j < m; j += blockDim.x) {
    const double d = (double)x[((j / s) * c + ch) * s + j % s] - mu;
    acc += d * d;
  }
  const double v = block_sum(acc, buf) / (double)m;
  if (threadIdx.x == 0) { mean[ch] = mu; var[ch] = v; }
}

// y = (x - mean[ch]) * inv[ch] (mean 0 when !has_mean); also into y2 when has_y2 (BatchNorm's x_norm_).
extern "C" __global__ void channel_affine(const long long n, const T* x, const T* mean, const T* inv,
    const int has_mean, const int c, const long long s, T* y, T* y2, const int has_y2) {
  CUDA_KERNEL_LOOP(i, n) {
    const int ch = (int)((i / s) % c);
    const T v = (has_mean ? x[i] - mean[ch] : x[i]) * inv[ch];
    y[i] = v;
    if (has_y2) y2[i] = v;
  }
}

// Block ch: mean(dy) and mean(dy * y) over channel ch, y = x_norm (from_x == 0) or (x - mean) * inv.
extern "C" __global__ void bn_backward_stats(const T* dy, const T* src, const int from_x, const T* mean,
    const T* inv, const int n, const int c, const long long s, T* mean_dy, T* mean_dyy) {
  __shared__ double buf[256];
  const int ch = blockIdx.x;
  const long long m = (long long)n * s;
  double a = 0, b = 0;
  for (long long j = threadIdx.x; j < m; j += blockDim.x) {
    const long long i = ((j / s) * c + ch) * s + j % s;
    const T y = from_x ? (src[i] - mean[ch]) * inv[ch] : src[i];
    const T g = dy[i], gy = g * y;
    a += (double)g;
    b += (double)gy;
  }
  a = block_sum(a, buf);
  b = block_sum(b, buf);
  if (threadIdx.x == 0) { mean_dy[ch] = (T)(a / (double)m); mean_dyy[ch] = (T)(b / (double)m); }
}

// dx = (dy - mean_dy - y * mean_dyy) * inv
extern "C" __global__ void bn_backward_apply(const long long n, const T* dy, const T* src, const int from_x,
    const T* mean, const T* inv, const T* mean_dy, const T* mean_dyy, const int c, const long long s, T* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int ch = (int)((i / s) % c);
    const T y = from_x ? (src[i] - mean[ch]) * inv[ch] : src[i];
    dx[i] = (dy[i] - mean_dy[ch] - y * mean_dyy[ch]) * inv[ch];
  }
}

__device__ T pow_neg_beta(const T v, const T beta, const int three_quarters) {
  if (three_quarters) {  // v^-0.75 as the array-API path: 1 / (sqrt(sqrt(v)) * sqrt(v))
    const T r = sqrt(v);
    return (T)1 / (sqrt(r) * r);
  }
  return pow(v, -beta);
}

// One thread per (n, h, w) column: scale = k + alpha_n * (window sum of x^2), y = x * scale^-beta.
extern "C" __global__ void lrn_forward(const long long n, const T* x, const int C, const long long S,
    const int size, const T alpha_n, const T k, const T beta, const int three_quarters, T* scale, T* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const long long base = (i / S) * C * S + i % S;
    const int post = size - (size - 1) / 2 - 1;
    double acc = 0;
    for (int head = 0; head < C + post; ++head) {
      if (head < C) { const T v = x[base + head * S]; acc += (double)(v * v); }
      if (head >= size) { const T v = x[base + (head - size) * S]; acc -= (double)(v * v); }
      if (head >= post) scale[base + (head - post) * S] = (T)acc * alpha_n + k;
    }
    for (int ch = 0; ch < C; ++ch) {  // a second loop: y may be x (in place)
      const long long j = base + ch * S;
      y[j] = x[j] * pow_neg_beta(scale[j], beta, three_quarters);
    }
  }
}

// WITHIN_CHANNEL: v's size x size box sum around (h, w) of a plane, zero-padded, summed as the array-API path
// (each row's sum left to right, then the rows top to bottom). ratio: v = dy * y / scale, else v = x * x.
__device__ T box_sum(const T* a, const T* b, const T* c, const int ratio, const int H, const int W, const int h,
    const int w, const int size) {
  const int r = (size - 1) / 2;
  T out = 0;
  for (int oh = 0; oh < size; ++oh) {
    const int hh = h + oh - r;
    T row = 0;
    if (hh >= 0 && hh < H)
      for (int ow = 0; ow < size; ++ow) {
        const int ww = w + ow - r;
        if (ww < 0 || ww >= W) continue;
        const int j = hh * W + ww;
        row += ratio ? a[j] * b[j] / c[j] : a[j] * a[j];
      }
    out += row;
  }
  return out;
}

// WITHIN_CHANNEL forward: scale = 1 + alpha_n * box sum of x^2 (Caffe's shift there is 1), y = x * scale^-beta.
extern "C" __global__ void lrn_within_forward(const long long n, const T* x, const int H, const int W,
    const int size, const T alpha_n, const T beta, const int three_quarters, T* scale, T* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const long long plane = (i / ((long long)H * W)) * H * W;
    const int w = (int)(i % W), h = (int)((i / W) % H);
    const T s = box_sum(x + plane, x + plane, x + plane, 0, H, W, h, w, size) * alpha_n + (T)1;
    scale[i] = s;
    y[i] = x[i] * pow_neg_beta(s, beta, three_quarters);
  }
}

// WITHIN_CHANNEL backward: dx = dy * scale^-beta - ratio * x * box sum of dy * y / scale; dx must not alias.
extern "C" __global__ void lrn_within_backward(const long long n, const T* x, const T* y, const T* scale,
    const T* dy, const int H, const int W, const int size, const T ratio, const T beta, const int three_quarters,
    T* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const long long plane = (i / ((long long)H * W)) * H * W;
    const int w = (int)(i % W), h = (int)((i / W) % H);
    const T acc = box_sum(dy + plane, y + plane, scale + plane, 1, H, W, h, w, size);
    dx[i] = dy[i] * pow_neg_beta(scale[i], beta, three_quarters) - acc * x[i] * ratio;
  }
}

// dx = dy * scale^-beta - ratio * x * (window sum of dy * y / scale); dx must not alias dy, x or y.
extern "C" __global__ void lrn_backward(const long long n, const T* x, const T* y, const T* scale, const T* dy,
    const int C, const long long S, const int size, const T ratio, const T beta, const int three_quarters, T* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const long long base = (i / S) * C * S + i % S;
    const int post = size - (size - 1) / 2 - 1;
    double acc = 0;
    for (int head = 0; head < C + post; ++head) {
      if (head < C) { const long long j = base + head * S; acc += (double)(dy[j] * y[j] / scale[j]); }
      if (head >= size) { const long long j = base + (head - size) * S; acc -= (double)(dy[j] * y[j] / scale[j]); }
      if (head >= post) {
        const long long j = base + (head - post) * S;
        dx[j] = dy[j] * pow_neg_beta(scale[j], beta, three_quarters) - (T)acc * x[j] * ratio;
      }
    }
  }
}
"""


def _kernel(name, dtype):
    return device.raw_kernel(name, _SOURCE, dtype)


def _i(v):
    return np.int32(v)


def _shape3(x):
    n = x.shape[0]
    c = x.shape[1] if x.ndim > 1 else 1
    return n, c, x.size // max(n * c, 1)


def batch_norm_stats(xp, x):
    """(mean, var) per channel of x (n, c, ...) in float64, one kernel; None where it does not apply."""
    if not (device.kernels(xp) and device.floats(xp, x)) or x.size == 0:
        return None
    n, c, s = _shape3(x)
    mean, var = xp.empty(c, np.float64), xp.empty(c, np.float64)
    _kernel("bn_stats", x.dtype)((c,), (STAT_THREADS,), (x, _i(n), _i(c), np.int64(s), mean, var))
    return mean, var


def channel_affine(xp, x, mean, inv, y, y2=None) -> bool:
    """y (and y2) = (x - mean[channel]) * inv[channel] (mean None: x * inv), one pass; x may be y."""
    arrays = [a for a in (x, mean, inv, y, y2) if a is not None]
    if not (device.kernels(xp) and device.floats(xp, *arrays)) or x.size == 0:
        return False
    n, c, s = _shape3(x)
    args = (np.int64(x.size), x, inv if mean is None else mean, inv, _i(mean is not None), _i(c), np.int64(s), y,
            y if y2 is None else y2, _i(y2 is not None))
    device.launch(_kernel("channel_affine", x.dtype), x.size, args)
    return True


def batch_norm_backward(xp, dy, src, from_x, mean, inv, dx) -> bool:
    """BatchNorm's gradient with batch statistics: dx = (dy - mean(dy) - y * mean(dy * y)) * inv, y = src
    (x_norm) or (src - mean) * inv (from_x); the means per channel in double. Two kernels; dx may be dy."""
    if not (device.kernels(xp) and device.floats(xp, dy, src, mean, inv, dx)) or dy.size == 0:
        return False
    n, c, s = _shape3(dy)
    mdy, mdyy = xp.empty(c, dy.dtype), xp.empty(c, dy.dtype)
    _kernel("bn_backward_stats", dy.dtype)((c,), (STAT_THREADS,),
                                           (dy, src, _i(from_x), mean, inv, _i(n), _i(c), np.int64(s), mdy, mdyy))
    device.launch(_kernel("bn_backward_apply", dy.dtype), dy.size,
                  (np.int64(dy.size), dy, src, _i(from_x), mean, inv, mdy, mdyy, _i(c), np.int64(s), dx))
    return True


def lrn_forward(xp, x, scale, y, size, alpha, k, beta, within=False) -> bool:
    """LRN forward: scale (Caffe's scale_) and y, one pass; ACROSS_CHANNELS, or WITHIN_CHANNEL (within: k unused,
    1 as Caffe's); x may be y only across channels."""
    if not (device.kernels(xp) and device.floats(xp, x, scale, y)) or x.size == 0:
        return False
    N, C, H, W = x.shape
    t = x.dtype.type
    if within:
        if device.address(y) == device.address(x):
            return False
        args = (np.int64(x.size), x, _i(H), _i(W), _i(size), t(alpha / (size * size)), t(beta), _i(beta == 0.75),
                scale, y)
        device.launch(_kernel("lrn_within_forward", x.dtype), x.size, args)
        return True
    args = (np.int64(N * H * W), x, _i(C), np.int64(H * W), _i(size), t(alpha / size), t(k), t(beta),
            _i(beta == 0.75), scale, y)
    device.launch(_kernel("lrn_forward", x.dtype), N * H * W, args)
    return True


def lrn_backward(xp, x, y, scale, dy, dx, size, alpha, beta, within=False) -> bool:
    """LRN backward in one pass (ACROSS_CHANNELS, or WITHIN_CHANNEL); declines when dx shares memory with an
    input (in place)."""
    if not (device.kernels(xp) and device.floats(xp, x, y, scale, dy, dx)) or x.size == 0:
        return False
    if device.address(dx) in {device.address(a) for a in (x, y, scale, dy)}:
        return False
    N, C, H, W = x.shape
    t = x.dtype.type
    if within:
        args = (np.int64(x.size), x, y, scale, dy, _i(H), _i(W), _i(size), t(2.0 * (alpha / (size * size)) * beta),
                t(beta), _i(beta == 0.75), dx)
        device.launch(_kernel("lrn_within_backward", x.dtype), x.size, args)
        return True
    args = (np.int64(N * H * W), x, y, scale, dy, _i(C), np.int64(H * W), _i(size), t(2.0 * (alpha / size) * beta),
            t(beta), _i(beta == 0.75), dx)
    device.launch(_kernel("lrn_backward", x.dtype), N * H * W, args)
    return True

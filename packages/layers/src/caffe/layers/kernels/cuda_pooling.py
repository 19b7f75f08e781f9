"""Hand-written CUDA kernels for 2-D pooling (a real GPU only: caffe.layers.device.kernels), as Caffe's
pooling_layer.cu (MAX, AVE, STOCHASTIC), one pass each, one thread per output (forward) or per bottom pixel
(backward: a gather over the windows that cover it, in ascending window order: no atomics, the same bits run
after run).

Each replaces a caffe.layers.pool_device path (which stays the path everywhere else: the CuPy stand-in,
CAFFE_DEVICE_KERNELS=0) and returns False where it does not apply (no real GPU, other dtypes or layouts).
Passes over memory, array-API path -> kernel:
  max_pool_forward   gather, select, argmax, take, where x2, copies: ~8 launches, K x top scratch -> 1
  pool_backward      (MAX, STOCHASTIC) zeros, index math (~8 small launches), add.at, copy -> 1
  ave_pool_forward   pad copy, gather (K x top), sum, divide, copy -> 1
  ave_pool_backward  divide, zeros, broadcast add.at (atomics), copy -> 1
  sto_pool_forward_train  gather (K x top), cumsum, scale, 2 compares, any, argmax, max, where, 2 take: ~12 -> 1
  sto_pool_forward_test   gather, square, 2 sums, add, divide, copy: ~7 -> 1
NEVER RUN ON A GPU YET: their parity properties are in tests/test_layers_device_kernels.py (gpu-marked);
caffe.layers.cuda_host runs the same sources on the host in the default suite.
"""
from __future__ import annotations

import numpy as np

from caffe.layers import device

_SOURCE = device.CUDA_COMMON + r"""

extern "C" __global__ void max_pool_forward(const long long n, const T* x, const int H, const int W,
    const int PH, const int PW, const int kh, const int kw, const int sh, const int sw, const int ph, const int pw,
    T* y, int* mask) {
  CUDA_KERNEL_LOOP(i, n) {
    const int q = (int)(i % PW), p = (int)((i / PW) % PH);
    const T* plane = x + (i / ((long long)PW * PH)) * H * W;
    int hs = p * sh - ph, ws = q * sw - pw;
    const int he = min(hs + kh, H), we = min(ws + kw, W);
    hs = max(hs, 0);
    ws = max(ws, 0);
    T best = (T)(-3.40282346638528859811704183484516925440e+38);  // -FLT_MAX exactly, replaced only by a greater value
    int arg = -1;
    for (int h = hs; h < he; ++h)
      for (int w = ws; w < we; ++w)
        if (plane[h * W + w] > best) { best = plane[h * W + w]; arg = h * W + w; }
    y[i] = best;
    mask[i] = arg;
  }
}

// dx[pixel] = sum of dy over the windows covering the pixel whose index (argmax or sample) is that pixel.
extern "C" __global__ void pool_backward(const long long n, const T* dy, const int* index, const int H,
    const int W, const int PH, const int PW, const int kh, const int kw, const int sh, const int sw,
    const int ph, const int pw, T* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int w = (int)(i % W), h = (int)((i / W) % H);
    const long long plane = i / ((long long)W * H);
    const int p0 = (h + ph < kh) ? 0 : (h + ph - kh) / sh + 1, p1 = min((h + ph) / sh + 1, PH);
    const int q0 = (w + pw < kw) ? 0 : (w + pw - kw) / sw + 1, q1 = min((w + pw) / sw + 1, PW);
    const T* g = dy + plane * PH * PW;
    const int* at = index + plane * PH * PW;
    const int self = h * W + w;
    T sum = 0;
    for (int p = p0; p < p1; ++p)
      for (int q = q0; q < q1; ++q)
        if (at[p * PW + q] == self) sum += g[p * PW + q];
    dx[i] = sum;
  }
}

extern "C" __global__ void ave_pool_forward(const long long n, const T* x, const int H, const int W,
    const int PH, const int PW, const int kh, const int kw, const int sh, const int sw, const int ph, const int pw,
    T* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const int q = (int)(i % PW), p = (int)((i / PW) % PH);
    const T* plane = x + (i / ((long long)PW * PH)) * H * W;
    int hs = p * sh - ph, ws = q * sw - pw;
    int he = min(hs + kh, H + ph), we = min(ws + kw, W + pw);
    const int size = (he - hs) * (we - ws);  // Caffe's divisor: the window clipped to the padded extent
    hs = max(hs, 0);
    ws = max(ws, 0);
    he = min(he, H);
    we = min(we, W);
    T sum = 0;
    for (int h = hs; h < he; ++h)
      for (int w = ws; w < we; ++w) sum += plane[h * W + w];
    y[i] = sum / (T)size;
  }
}

// STOCHASTIC (no padding), TRAIN: the first window element (row-major) whose running sum reaches u * the
// window sum; none (a negative sum): the window's last element; an empty window (past the edge): 0, -1.
extern "C" __global__ void sto_pool_forward_train(const long long n, const T* x, const T* u, const int H,
    const int W, const int PH, const int PW, const int kh, const int kw, const int sh, const int sw, T* y,
    int* index) {
  CUDA_KERNEL_LOOP(i, n) {
    const int q = (int)(i % PW), p = (int)((i / PW) % PH);
    const T* plane = x + (i / ((long long)PW * PH)) * H * W;
    const int hs = p * sh, ws = q * sw, he = min(hs + kh, H), we = min(ws + kw, W);
    if (he <= hs || we <= ws) { y[i] = 0; index[i] = -1; continue; }
    T total = 0;
    for (int h = hs; h < he; ++h)
      for (int w = ws; w < we; ++w) total += plane[h * W + w];
    const T thres = u[i] * total;
    T cum = 0;
    int at = (he - 1) * W + (we - 1);
    for (int h = hs; h < he && at >= 0; ++h)
      for (int w = ws; w < we; ++w) {
        cum += plane[h * W + w];
        if (cum >= thres) { at = -1 - (h * W + w); break; }  // found: kept negative to end both loops
      }
    at = at < 0 ? -1 - at : at;
    y[i] = plane[at];
    index[i] = at;
  }
}

// STOCHASTIC, TEST: the activation-weighted average sum(x^2) / (FLT_MIN + sum(x)) of the window.
extern "C" __global__ void sto_pool_forward_test(const long long n, const T* x, const int H, const int W,
    const int PH, const int PW, const int kh, const int kw, const int sh, const int sw, T* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const int q = (int)(i % PW), p = (int)((i / PW) % PH);
    const T* plane = x + (i / ((long long)PW * PH)) * H * W;
    const int hs = p * sh, ws = q * sw, he = min(hs + kh, H), we = min(ws + kw, W);
    T sum = 0, sq = 0;
    for (int h = hs; h < he; ++h)
      for (int w = ws; w < we; ++w) {
        const T v = plane[h * W + w];
        sum += v;
        sq += v * v;
      }
    y[i] = sq / (sum + (T)1.17549435082228750797e-38);  // + FLT_MIN, as Caffe
  }
}

extern "C" __global__ void ave_pool_backward(const long long n, const T* dy, const int H, const int W,
    const int PH, const int PW, const int kh, const int kw, const int sh, const int sw, const int ph, const int pw,
    T* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int w = (int)(i % W) + pw, h = (int)((i / W) % H) + ph;  // in padded coordinates
    const T* g = dy + (i / ((long long)W * H)) * PH * PW;
    const int p0 = (h < kh) ? 0 : (h - kh) / sh + 1, p1 = min(h / sh + 1, PH);
    const int q0 = (w < kw) ? 0 : (w - kw) / sw + 1, q1 = min(w / sw + 1, PW);
    T sum = 0;
    for (int p = p0; p < p1; ++p)
      for (int q = q0; q < q1; ++q) {
        const int hs = p * sh - ph, ws = q * sw - pw;
        const int size = (min(hs + kh, H + ph) - hs) * (min(ws + kw, W + pw) - ws);
        sum += g[p * PW + q] / (T)size;
      }
    dx[i] = sum;
  }
}
"""


def _ints(*values):
    return tuple(np.int32(v) for v in values)


def _run(name, dtype, n, *args):
    device.launch(device.raw_kernel(name, _SOURCE, dtype), n, (np.int64(n),) + args)


def _usable(xp, *arrays, index=None):
    return (device.kernels(xp) and device.floats(xp, *arrays)
            and (index is None or (index.dtype == np.int32 and index.flags.c_contiguous)))


def max_pool_forward(xp, spec, x, y, mask) -> bool:
    """Caffe's MaxPoolForward: y = the first window maximum above -FLT_MAX, mask = its h * W + w (-1: none)."""
    if not _usable(xp, x, y, index=mask):
        return False
    N, C, H, W = x.shape
    _run("max_pool_forward", x.dtype, y.size, x, *_ints(H, W, *y.shape[2:], *spec.window_args()), y, mask)
    return True


def pool_backward(xp, spec, dy, index, dx, pad=True) -> bool:
    """Caffe's MaxPoolBackward / StoPoolBackward: dx = the sum of dy over the windows whose index is the pixel
    (an index outside its own window, -1 included, adds nothing). pad=False: STOCHASTIC's unpadded windows."""
    if not _usable(xp, dy, dx, index=index):
        return False
    N, C, H, W = dx.shape
    ph, pw = (spec.ph, spec.pw) if pad else (0, 0)
    _run("pool_backward", dx.dtype, dx.size, dy, index,
         *_ints(H, W, *dy.shape[2:], spec.kh, spec.kw, spec.sh, spec.sw, ph, pw), dx)
    return True


def ave_pool_forward(xp, spec, x, y) -> bool:
    """Caffe's AvePoolForward: the window sum over Caffe's divisor (the window clipped to H + pad, W + pad)."""
    if not _usable(xp, x, y):
        return False
    N, C, H, W = x.shape
    _run("ave_pool_forward", x.dtype, y.size, x, *_ints(H, W, *y.shape[2:], *spec.window_args()), y)
    return True


def sto_pool_forward_train(xp, spec, x, y, index, uniform) -> bool:
    """Caffe's StoPoolForwardTrain with the uniforms given (one per output); False where it does not apply."""
    if not _usable(xp, x, y, index=index):
        return False
    u = xp.ascontiguousarray(uniform, dtype=x.dtype)
    N, C, H, W = x.shape
    _run("sto_pool_forward_train", x.dtype, y.size, x, u,
         *_ints(H, W, *y.shape[2:], spec.kh, spec.kw, spec.sh, spec.sw), y, index)
    return True


def sto_pool_forward_test(xp, spec, x, y) -> bool:
    """Caffe's StoPoolForwardTest: sum(x^2) / (FLT_MIN + sum(x)) per window."""
    if not _usable(xp, x, y):
        return False
    N, C, H, W = x.shape
    _run("sto_pool_forward_test", x.dtype, y.size, x, *_ints(H, W, *y.shape[2:], spec.kh, spec.kw, spec.sh, spec.sw),
         y)
    return True


def ave_pool_backward(xp, spec, dy, dx) -> bool:
    """Caffe's AvePoolBackward: each pixel gathers dy / divisor of every window covering it."""
    if not _usable(xp, dy, dx):
        return False
    N, C, H, W = dx.shape
    _run("ave_pool_backward", dx.dtype, dx.size, dy, *_ints(H, W, *dy.shape[2:], *spec.window_args()), dx)
    return True

"""Hand-written CUDA kernels for the memory-bound elementwise layers (a real GPU only:
caffe.layers.device.kernels): one thread per element (Dropout: per 4 elements, one SplitMix64 draw each).
The per-channel operands (Scale, Bias, PReLU) are caffe.layers.kernels.cuda_channelwise.

Passes over memory, array-API path -> kernel (the copy into the top / bottom diff counted):
  Dropout forward     the mask: arange, ~9 uint64 ops on count / 4, bit split, compare, cast; the apply:
                      cast, scale, multiply, copy: ~16 -> 1 (the same mask bits: caffe.layers.dropout)
  Dropout backward    cast, scale, multiply, copy: 4 -> 1
  ReLU (negative_slope != 0) forward / backward: compare, where, cast, multiply: 4 -> 1 each; backward with
                      negative_slope 0: compare, multiply: 2 -> 1
  Sigmoid forward     2 scales, tanh, add, copy: 5 -> 1;  backward: 3 arithmetic ops, copy: 4 -> 1
  TanH forward        tanh, copy: 2 -> 1;  backward: 3 arithmetic ops, copy: 4 -> 1
  ELU forward         maximum, minimum, expm1, scale, add, copy: 6 -> 1;  backward: compare, add, where,
                      multiply, copy: 5 -> 1
  BNLL forward        maximum, abs, negate, exp, log1p, add, copy: 7 -> 1;  backward: minimum, exp, multiply,
                      add, divide, copy: 6 -> 1
  Swish forward       scale, 2 multiplies, tanh, multiply, add (the sigmoid), copy, multiply, copy: 9 -> 1;
                      backward: 6 arithmetic ops, copy: 7 -> 1
  Eltwise SUM forward  a scale per bottom, an add per bottom but one, copy: 2k -> k - 1;
                      backward: a scale and a copy per bottom: 2 -> 1 each
  Eltwise MAX forward  compare, 2 selects, a cast, 2 copies for two bottoms, 3 more per further bottom:
                      3k -> k - 1;  backward: compare, select, copy per bottom: 3 -> 1 each
Each entry point returns False where it does not apply (no real GPU, other dtypes or layouts); the
array-API path then runs. NEVER RUN ON A GPU YET: parity properties in tests/test_layers_device_kernels.py
(gpu-marked), and on the host by caffe.layers.cuda_host in the default suite.
"""
from __future__ import annotations

import numpy as np

from caffe.layers import device

_SOURCE = device.CUDA_COMMON + r"""

// caffe.layers.dropout's mask: element e is kept when 16 bits (e % 4) of SplitMix64 draw e / 4 + 1 are
// >= threshold; y = x * (kept ? scale : 0) when apply.
extern "C" __global__ void dropout_forward(const long long n, const unsigned long long seed,
    const unsigned int threshold, unsigned char* mask, const T* x, T* y, const T scale, const int apply) {
  const long long groups = (n + 3) / 4;
  CUDA_KERNEL_LOOP(g, groups) {
    unsigned long long z = seed + ((unsigned long long)g + 1ULL) * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z = z ^ (z >> 31);
    for (int k = 0; k < 4; ++k) {
      const long long e = g * 4 + k;
      if (e >= n) break;
      const bool keep = ((z >> (16 * k)) & 0xFFFFULL) >= threshold;
      mask[e] = keep ? 1 : 0;
      if (apply) y[e] = x[e] * (keep ? scale : (T)0);
    }
  }
}

extern "C" __global__ void masked_scale(const long long n, const T* dy, const unsigned char* mask, const T scale,
    T* dx) {
  CUDA_KERNEL_LOOP(i, n) dx[i] = dy[i] * (mask[i] ? scale : (T)0);
}

// out = v * (x > 0 ? 1 : slope): ReLU's forward (v = x) and backward (v = dy)
extern "C" __global__ void sign_scale(const long long n, const T* x, const T* v, const T slope, T* out) {
  CUDA_KERNEL_LOOP(i, n) out[i] = v[i] * (x[i] > 0 ? (T)1 : slope);
}

extern "C" __global__ void elu_forward(const long long n, const T* x, const T alpha, T* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const T v = x[i];
    y[i] = (v > 0 ? v : (T)0) + alpha * expm1(v < 0 ? v : (T)0);
  }
}

extern "C" __global__ void elu_backward(const long long n, const T* x, const T* y, const T* dy, const T alpha,
    T* dx) {
  CUDA_KERNEL_LOOP(i, n) dx[i] = dy[i] * (x[i] > 0 ? (T)1 : alpha + y[i]);
}

extern "C" __global__ void bnll_forward(const long long n, const T* x, T* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const T v = x[i];
    y[i] = (v > 0 ? v : (T)0) + log1p(exp(-fabs(v)));
  }
}

extern "C" __global__ void bnll_backward(const long long n, const T* x, const T* dy, T* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const T e = exp(x[i] < (T)50 ? x[i] : (T)50);  // Caffe's kBNLL_THRESHOLD
    dx[i] = dy[i] * e / (e + (T)1);
  }
}

// Sigmoid (0.5 * tanh(0.5 * x) + 0.5, as caffe.layers.sigmoid) and TanH: y from x, dx from y and dy
extern "C" __global__ void sigmoid_forward(const long long n, const T* x, T* y) {
  CUDA_KERNEL_LOOP(i, n) y[i] = (T)0.5 * tanh((T)0.5 * x[i]) + (T)0.5;
}

extern "C" __global__ void sigmoid_backward(const long long n, const T* y, const T* dy, T* dx) {
  CUDA_KERNEL_LOOP(i, n) dx[i] = dy[i] * y[i] * ((T)1 - y[i]);
}

extern "C" __global__ void tanh_forward(const long long n, const T* x, T* y) {
  CUDA_KERNEL_LOOP(i, n) y[i] = tanh(x[i]);
}

extern "C" __global__ void tanh_backward(const long long n, const T* y, const T* dy, T* dx) {
  CUDA_KERNEL_LOOP(i, n) dx[i] = dy[i] * ((T)1 - y[i] * y[i]);
}

// s = sigmoid(beta * x) as 0.5 * tanh(0.5 * beta * x) + 0.5 (caffe.layers.sigmoid), y = x * s
extern "C" __global__ void swish_forward(const long long n, const T* x, const T beta, T* s, T* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const T v = x[i];
    const T sv = (T)0.5 * tanh((T)0.5 * (v * beta)) + (T)0.5;
    s[i] = sv;
    y[i] = v * sv;
  }
}

extern "C" __global__ void swish_backward(const long long n, const T* y, const T* s, const T* dy, const T beta,
    T* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const T by = beta * y[i];
    dx[i] = dy[i] * (by + s[i] * ((T)1 - by));
  }
}

// y = a * x0 (+ b * x1): Eltwise SUM's first pair (two = 1), its later bottoms (a = 1 on y), its gradients
extern "C" __global__ void axpby(const long long n, const T a, const T* x0, const T b, const T* x1, const int two,
    T* y) {
  CUDA_KERNEL_LOOP(i, n) y[i] = two ? a * x0[i] + b * x1[i] : a * x0[i];
}

// Eltwise MAX: the first pair (bottom 1 wins a tie), then each later bottom only where strictly greater.
extern "C" __global__ void max_pair(const long long n, const T* x0, const T* x1, T* y, int* mask) {
  CUDA_KERNEL_LOOP(i, n) {
    const bool first = x0[i] > x1[i];
    y[i] = first ? x0[i] : x1[i];
    mask[i] = first ? 0 : 1;
  }
}

extern "C" __global__ void max_next(const long long n, const T* x, const int index, T* y, int* mask) {
  CUDA_KERNEL_LOOP(i, n) if (x[i] > y[i]) { y[i] = x[i]; mask[i] = index; }
}

extern "C" __global__ void max_route(const long long n, const T* dy, const int* mask, const int index, T* dx) {
  CUDA_KERNEL_LOOP(i, n) dx[i] = mask[i] == index ? dy[i] : (T)0;
}

extern "C" __global__ void accumulate(const long long n, const T b, const T* x, T* y) {
  CUDA_KERNEL_LOOP(i, n) y[i] = y[i] + b * x[i];
}
"""


def _run(name, dtype, n, *args):
    device.launch(device.raw_kernel(name, _SOURCE, dtype), n, (np.int64(n),) + args)


def _ok(xp, *arrays):
    return device.kernels(xp) and device.floats(xp, *arrays)


def _u8(a):
    return a.dtype == np.uint8 and a.flags.c_contiguous


def dropout_forward(xp, new_seed, threshold, mask, x=None, y=None, scale=1.0) -> bool:
    """Draw caffe.layers.dropout's mask (uint8) from new_seed() (called only when the kernel runs) and, given
    x and y, y = x * mask * scale in the same pass."""
    apply = x is not None
    if not (device.kernels(xp) and _u8(mask) and (not apply or device.floats(xp, x, y))):
        return False
    dt = x.dtype if apply else np.dtype(np.float32)
    x = x if apply else mask  # placeholders, never read or written
    y = y if apply else mask
    _run("dropout_forward", dt, mask.size, np.uint64(new_seed()), np.uint32(threshold), mask, x, y,
         dt.type(scale), np.int32(apply))
    return True


def dropout_backward(xp, dy, mask, scale, dx) -> bool:
    if not (_ok(xp, dy, dx) and _u8(mask)):
        return False
    _run("masked_scale", dy.dtype, dy.size, dy, mask, dy.dtype.type(scale), dx)
    return True


def relu(xp, x, v, slope, out) -> bool:
    """out = v * (x > 0 ? 1 : slope) (forward: v = x; backward: v = dy)."""
    if not _ok(xp, x, v, out):
        return False
    _run("sign_scale", x.dtype, x.size, x, v, x.dtype.type(slope), out)
    return True


def elu_forward(xp, x, alpha, y) -> bool:
    if not _ok(xp, x, y):
        return False
    _run("elu_forward", x.dtype, x.size, x, x.dtype.type(alpha), y)
    return True


def elu_backward(xp, x, y, dy, alpha, dx) -> bool:
    if not _ok(xp, x, y, dy, dx):
        return False
    _run("elu_backward", x.dtype, x.size, x, y, dy, x.dtype.type(alpha), dx)
    return True


def bnll_forward(xp, x, y) -> bool:
    if not _ok(xp, x, y):
        return False
    _run("bnll_forward", x.dtype, x.size, x, y)
    return True


def bnll_backward(xp, x, dy, dx) -> bool:
    if not _ok(xp, x, dy, dx):
        return False
    _run("bnll_backward", x.dtype, x.size, x, dy, dx)
    return True


def unary(xp, name, x, y) -> bool:
    """y = name(x): "sigmoid_forward", "tanh_forward"."""
    if not _ok(xp, x, y):
        return False
    _run(name, x.dtype, x.size, x, y)
    return True


def unary_backward(xp, name, y, dy, dx) -> bool:
    """dx from the top's data and diff: "sigmoid_backward", "tanh_backward"."""
    if not _ok(xp, y, dy, dx):
        return False
    _run(name, y.dtype, y.size, y, dy, dx)
    return True


def swish_forward(xp, x, beta, s, y) -> bool:
    if not _ok(xp, x, s, y):
        return False
    _run("swish_forward", x.dtype, x.size, x, x.dtype.type(beta), s, y)
    return True


def swish_backward(xp, y, s, dy, beta, dx) -> bool:
    if not _ok(xp, y, s, dy, dx):
        return False
    _run("swish_backward", y.dtype, y.size, y, s, dy, y.dtype.type(beta), dx)
    return True


def eltwise_sum(xp, coeffs, xs, y) -> bool:
    """y = sum of coeffs[i] * xs[i] (as the array-API path: pairwise left to right); y may be any of xs only
    as xs[0] or xs[1] (read before written at each element)."""
    if not _ok(xp, y, *xs) or len(xs) < 2:
        return False
    t = y.dtype.type
    if device.address(y) in {device.address(x) for x in xs[2:]}:
        return False
    _run("axpby", y.dtype, y.size, t(coeffs[0]), xs[0], t(coeffs[1]), xs[1], np.int32(1), y)
    for c, x in zip(coeffs[2:], xs[2:]):
        _run("accumulate", y.dtype, y.size, t(c), x, y)
    return True


def _int32(a):
    return a.dtype == np.int32 and a.flags.c_contiguous


def eltwise_max(xp, xs, y, mask) -> bool:
    """Eltwise MAX: y = the maximum (Caffe's ties), mask (int32) = the winning bottom; y may be xs[0] or xs[1]."""
    if not (_ok(xp, y, *xs) and _int32(mask)) or len(xs) < 2:
        return False
    if device.address(y) in {device.address(x) for x in xs[2:]}:
        return False
    _run("max_pair", y.dtype, y.size, xs[0], xs[1], y, mask)
    for i, x in enumerate(xs[2:], 2):
        _run("max_next", y.dtype, y.size, x, np.int32(i), y, mask)
    return True


def eltwise_max_backward(xp, dy, mask, dxs) -> bool:
    """dxs[i] = dy where bottom i won, else 0 (None: not wanted); no dx may be dy (in place)."""
    wanted = [(i, dx) for i, dx in enumerate(dxs) if dx is not None]
    if not (_ok(xp, dy, *(dx for _, dx in wanted)) and _int32(mask)):
        return False
    if any(device.address(dx) == device.address(dy) for _, dx in wanted):
        return False
    for i, dx in wanted:
        _run("max_route", dy.dtype, dy.size, dy, mask, np.int32(i), dx)
    return True


def eltwise_sum_backward(xp, coeffs, dy, dxs) -> bool:
    """dxs[i] = coeffs[i] * dy (None: not wanted), one pass each; no dx may be dy (in place)."""
    wanted = [(c, dx) for c, dx in zip(coeffs, dxs) if dx is not None]
    if not _ok(xp, dy, *(dx for _, dx in wanted)) or any(device.address(dx) == device.address(dy) for _, dx in wanted):
        return False
    t = dy.dtype.type
    for c, dx in wanted:
        _run("axpby", dy.dtype, dy.size, t(c), dy, t(0), dy, np.int32(0), dx)
    return True

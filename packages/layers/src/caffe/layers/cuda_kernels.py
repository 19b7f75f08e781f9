"""Hand-written CUDA kernels for a real GPU (chosen only where caffe.layers.device.kernels(xp) is true).

Each replaces an array-API path that stays everywhere else (and is what the CuPy stand-in runs):
- col2im_2d: conv_device.col2im's scatter-add (atomics: a varying summation order) as Caffe's
  col2im_gpu_kernel: one thread per image pixel summing the column entries that read it, in Caffe's
  order, so the gradient is the same bits run after run.
- max_pool_forward: pool_device.max_forward's gather + argmax + selects (K times the top in scratch) as
  Caffe's MaxPoolForward: one pass, one thread per output.
NOT RUN HERE: no GPU has been available to this project; packages/layers/tests/test_layers_device_kernels.py holds their
parity properties against the array-API paths (marked gpu; they skip without a real GPU).
"""
from __future__ import annotations

import numpy as np

from caffe.layers import device

_COL2IM = r"""
extern "C" __global__ void col2im_2d(const long long n, const T* col, const int C, const int H, const int W,
    const int kh, const int kw, const int ph, const int pw, const int sh, const int sw, const int dh, const int dw,
    const int Hc, const int Wc, const long long rs, const long long ns, T* im) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)blockDim.x * gridDim.x) {
    const int w = (int)(i % W), h = (int)((i / W) % H), c = (int)((i / ((long long)W * H)) % C);
    const long long b = i / ((long long)W * H * C);
    T val = 0;
    for (int ki = kh - 1; ki >= 0; --ki) {          // ascending h_col, as Caffe sums
      const int hp = h + ph - ki * dh;
      if (hp < 0 || hp % sh != 0 || hp / sh >= Hc) continue;
      for (int kj = kw - 1; kj >= 0; --kj) {
        const int wp = w + pw - kj * dw;
        if (wp < 0 || wp % sw != 0 || wp / sw >= Wc) continue;
        const long long r = ((long long)c * kh + ki) * kw + kj;
        val += col[r * rs + b * ns + (long long)(hp / sh) * Wc + wp / sw];
      }
    }
    im[i] = val;
  }
}
"""

_MAX_POOL = r"""
extern "C" __global__ void max_pool_forward(const long long n, const T* x, const int H, const int W,
    const int PH, const int PW, const int kh, const int kw, const int sh, const int sw, const int ph, const int pw,
    T* y, int* mask) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)blockDim.x * gridDim.x) {
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
"""


def col2im_2d(xp, col, im, geom, rs, ns) -> bool:
    """im (nb, C, H, W) = Caffe's col2im of col with row stride rs and image stride ns; False when the
    kernel does not apply (no real GPU, N-d, other dtypes or layouts)."""
    if not (device.kernels(xp) and len(geom.kernel) == 2 and device.floats(xp, col, im)):
        return False
    nb, C, H, W = im.shape
    i32 = np.int32
    args = (np.int64(im.size), col, i32(C), i32(H), i32(W), *(i32(v) for v in geom.kernel),
            *(i32(v) for v in geom.pad), *(i32(v) for v in geom.stride), *(i32(v) for v in geom.dilation),
            *(i32(v) for v in geom.col_shape), np.int64(rs), np.int64(ns), im)
    device.launch(device.raw_kernel("col2im_2d", _COL2IM, im.dtype), im.size, args)
    return True


def max_pool_forward(xp, spec, x, y, mask) -> bool:
    """Caffe's MaxPoolForward; False when the kernel does not apply."""
    if not (device.kernels(xp) and device.floats(xp, x, y) and mask.dtype == np.int32
            and mask.flags.c_contiguous):
        return False
    N, C, H, W = x.shape
    PH, PW = y.shape[2:]
    i32 = np.int32
    args = (np.int64(y.size), x, i32(H), i32(W), i32(PH), i32(PW), *(i32(v) for v in spec.window_args()), y, mask)
    device.launch(device.raw_kernel("max_pool_forward", _MAX_POOL, x.dtype), y.size, args)
    return True

"""Hand-written CUDA kernels of convolution's lowering for a real GPU (chosen only where
caffe.layers.device.kernels(xp) is true).

Each replaces an array-API path that stays everywhere else (and is what the CuPy stand-in runs):
- col2im_2d: conv_device.col2im's scatter-add (atomics: a varying summation order) as Caffe's
  col2im_gpu_kernel: one thread per image pixel summing the column entries that read it, in Caffe's
  order, so the gradient is the same bits run after run.
The other families live in caffe.layers.kernels.cuda_* (pooling, softmax, norm, elementwise,
channelwise).
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

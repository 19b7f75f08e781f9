"""InnerProduct: a fully connected layer (Caffe's InnerProductLayer).

The bottom is read as (M, K) with M = count(0, axis) and K = count(axis);
top (M, N) = bottom @ W^T + b with W (N, K), or bottom @ W with W (K, N) when
inner_product_param.transpose is set. One GEMM each way, written into the blobs'
memory; parameter gradients accumulate, as in Caffe.

On the CPU, at a short batch (M in SKINNY_M: 1-16 or 2-8, by product) and float32, the three products run in
caffe.layers.kernels.skinny_gemm, which reads the weights (and reads and writes the weight diff) once;
NumPy's GEMM (OpenBLAS) packs the weight panel first and is shaped for a long M. The sums round
differently from OpenBLAS's, within float32 summation error (the kernels' properties bound it).
"""
from __future__ import annotations

import math

import numpy as np

from caffe.blob import Blob
from caffe.layers import _cpu, conv_cpu, filler
from caffe.layers.conv_base import adopt_param_shape
from caffe.layers.layer import Layer, dtype_of
from caffe.layers.registry import register_layer


WGRAD_BLOCK = 1 << 20  # elements of the weight-gradient scratch block

# The batch sizes M at which skinny_gemm's kernels run each product, measured against NumPy's OpenBLAS sgemm
# (its Haswell kernels on the development VM) on CaffeNet's fc6 / fc7 / fc8 and a 2048 -> 1000 classifier,
# quiet machine, medians of 9 interleaved (packages/layers/bench/ab_skinny_gemm.py; table in bench/README.md):
# at batch 8, two threads, ours / NumPy's time forward 0.78-0.90, bottom diff 0.57-0.74, weight diff 0.38-0.50
# (one thread 0.50-0.81, 0.60-0.89, 0.40-0.84); at batch 2 0.34-0.49 for all three; at batch 16 the forward
# and bottom diff are mixed (0.70-1.22 and 0.72-1.25 on two threads, up to 1.41 on one), the weight diff
# 0.56-0.86 (one fc6 case 1.25 on one thread). At batch 1 NumPy's GEMV already streams the weights at memory
# speed (ours 0.90-1.48); its weight diff (a GER through the scratch block) does not (ours 0.08-0.13).
SKINNY = True  # False: NumPy's GEMM for every product (A/B and tests)
SKINNY_M = {"dots": (2, 8), "combine": (2, 8), "rank": (1, 16)}

# Past the skinny range, the float32 backward's two GEMMs (the weight diff, accumulated in place: beta 1, no
# scratch block; the bottom diff) run kernels.gemm where conv_cpu.GEMM512 is set (an AVX-512 CPU) and NumPy's
# OpenBLAS runs its own AVX-512 kernels (conv_cpu.BLAS512), for products of at least GEMM512_MIN_MACS
# multiply-adds. LeNet's ip1 at batch 64 (Intel Xeon VM, two threads, medians of 41): weight diff 0.281 -> 0.198 ms,
# bottom diff 0.239 -> 0.194 (OpenBLAS's SkylakeX kernels -> kernels.gemm); the LeNet trace stays where those
# kernels' sums put it (ip1's bias 2.08% from Caffe's at iteration 100). Where OpenBLAS runs its Haswell kernels,
# whose sums are the reference's (the trace within 2.7e-6), kernels.gemm here moved it to 8.8e-3 / 2.08% (inside
# the 5% bound, but off Caffe's path): np.matmul stays there. The forward stays NumPy's everywhere: its bias is per
# column, which kernels.gemm's store does not add.
GEMM512_BACKWARD = True
GEMM512_MIN_MACS = 1_000_000


@register_layer("InnerProduct")
class InnerProductLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.inner_product_param
        self.num_output = int(p.num_output)
        self.check(self.num_output > 0, f"inner_product_param.num_output must be positive, got {p.num_output}")
        self.bias_term = bool(p.bias_term)
        self.transpose = bool(p.transpose)
        self.axis = self._axis(bottom[0])
        self.K = bottom[0].count(self.axis)
        weight_shape = (self.K, self.num_output) if self.transpose else (self.num_output, self.K)
        if self.blobs:  # weights given with the layer (a caffemodel): keep them
            expected = 1 + self.bias_term
            self.check(len(self.blobs) == expected, f"Incorrect number of weight blobs: expected {expected} "
                                                    f"(bias_term {self.bias_term}), got {len(self.blobs)}")
            adopt_param_shape(self, self.blobs[0], weight_shape, "weight")
            if self.bias_term:
                adopt_param_shape(self, self.blobs[1], (self.num_output,), "bias")
        else:
            dtype = dtype_of(bottom)
            self.blobs = [self._filled(weight_shape, dtype, p.weight_filler, "weight_filler")]
            if self.bias_term:
                self.blobs.append(self._filled((self.num_output,), dtype, p.bias_filler, "bias_filler"))
        for i in range(len(self.blobs)):
            self.set_param_propagate_down(i, True)
        self._scratch = {}

    def _axis(self, blob):
        try:
            return blob.canonical_axis_index(self.layer_param.inner_product_param.axis)
        except IndexError:
            raise self.error(f"inner_product_param.axis {self.layer_param.inner_product_param.axis} is out "
                             f"of range for bottom[0] with shape {blob.shape}") from None

    def _filled(self, shape, dtype, filler_param, field):
        blob = Blob(shape, dtype=dtype)
        try:
            filler.fill(blob, filler_param)
        except filler.FillerError as e:
            raise self.error(f"inner_product_param.{field}: {e}") from None
        return blob

    def reshape(self, bottom, top):
        x = bottom[0]
        axis = self._axis(x)
        self.check(x.count(axis) == self.K, f"Input size incompatible with inner product parameters: "
                                            f"bottom[0] with shape {x.shape} has {x.count(axis)} inputs "
                                            f"from axis {axis}, the layer was set up for {self.K}")
        self.axis = axis
        self.M = math.prod(x.shape[:axis])
        top[0].reshape(x.shape[:axis] + (self.num_output,))

    def _weight2d(self, arr):
        return arr.reshape((self.K, self.num_output) if self.transpose else (self.num_output, self.K))

    def _tmp(self, xp, shape, dtype, fill=None):
        """A scratch array kept across iterations (one per shape: the shapes are fixed by the layer)."""
        key = (xp.__name__, shape, dtype, fill)
        buf = self._scratch.get(key)
        if buf is None:
            buf = self._scratch[key] = xp.empty(shape, dtype=dtype) if fill is None else \
                xp.full(shape, fill, dtype=dtype)
        return buf

    def _skinny(self, xp, product, *arrays):
        """kernels.skinny_gemm when it runs this product (CPU, every operand float32, M in SKINNY_M[product]),
        else None."""
        lo, hi = SKINNY_M[product]
        if (SKINNY and xp is np and _cpu.skinny_gemm is not None and lo <= self.M <= hi
                and all(a.dtype == np.float32 for a in arrays)):
            return _cpu.skinny_gemm
        return None

    def _gemm512(self, xp, *arrays):
        """kernels.gemm for a backward GEMM past the skinny range (GEMM512_BACKWARD), else None."""
        if (GEMM512_BACKWARD and xp is np and conv_cpu.GEMM512 and conv_cpu.BLAS512
                and self.M * self.K * self.num_output >= GEMM512_MIN_MACS and all(a.dtype == np.float32 for a in arrays)):
            return conv_cpu._gm
        return None

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp).reshape(self.M, self.K)
        w = self._weight2d(self.blobs[0].data_xp(xp))
        y = top[0].mutable_data_xp(xp).reshape(self.M, self.num_output)
        b = self.blobs[1].data_xp(xp).reshape(-1) if self.bias_term else None
        sk = self._skinny(xp, "combine" if self.transpose else "dots", x, w, y, *([b] if b is not None else []))
        if sk is not None:
            if self.transpose:  # y = x (M, K) @ W (K, N)
                sk.combine(x.reshape(-1), w.reshape(-1), y.reshape(-1), b, self.M, self.K, self.num_output)
            else:  # y = x (M, K) @ W (N, K)^T
                sk.dots(x.reshape(-1), w.reshape(-1), y.reshape(-1), b, self.M, self.num_output, self.K)
            return
        xp.matmul(x, w if self.transpose else w.T, out=y)
        if self.bias_term:
            y += b.reshape(1, self.num_output)

    def backward_xp(self, xp, top, propagate_down, bottom):
        dy = top[0].diff_xp(xp).reshape(self.M, self.num_output)
        if self.param_propagate_down(0):
            x = bottom[0].data_xp(xp).reshape(self.M, self.K)
            wd = self._weight2d(self.blobs[0].mutable_diff_xp(xp))
            sk = self._skinny(xp, "rank", x, dy, wd)
            gm = self._gemm512(xp, x, dy, wd) if sk is None else None
            if sk is not None:
                if self.transpose:  # wd (K, N) += x^T dy
                    sk.rank_update(x.reshape(-1), dy.reshape(-1), wd.reshape(-1), self.M, self.K, self.num_output)
                else:  # wd (N, K) += dy^T x
                    sk.rank_update(dy.reshape(-1), x.reshape(-1), wd.reshape(-1), self.M, self.num_output, self.K)
            elif gm is not None:  # accumulated in place (beta 1), as Caffe's GEMM
                gm.gemm(x.T, dy, wd, None, 1) if self.transpose else gm.gemm(dy.T, x, wd, None, 1)
            else:
                # Caffe accumulates into the diff (GEMM with beta = 1); NumPy cannot, so the product goes
                # through a scratch block of at most WGRAD_BLOCK elements, not a second weight-sized array.
                a, b = (x.T, dy) if self.transpose else (dy.T, x)  # wd = a @ b, (rows, cols)
                rows = max(1, min(wd.shape[0], WGRAD_BLOCK // max(wd.shape[1], 1)))
                tmp = self._tmp(xp, (rows, wd.shape[1]), wd.dtype)
                for r0 in range(0, wd.shape[0], rows):
                    r1 = min(r0 + rows, wd.shape[0])
                    part = tmp[: r1 - r0]
                    xp.matmul(a[r0:r1], b, out=part)
                    wd[r0:r1] += part
        if self.bias_term and self.param_propagate_down(1):
            bd = self.blobs[1].mutable_diff_xp(xp).reshape(self.num_output)
            ones = self._tmp(xp, (self.M,), dy.dtype, fill=1)
            bd += xp.matmul(ones, dy, out=self._tmp(xp, (self.num_output,), dy.dtype))
        if propagate_down[0]:
            w = self._weight2d(self.blobs[0].data_xp(xp))
            dx = bottom[0].mutable_diff_xp(xp).reshape(self.M, self.K)
            sk = self._skinny(xp, "dots" if self.transpose else "combine", dy, w, dx)
            gm = self._gemm512(xp, dy, w, dx) if sk is None else None
            if gm is not None:
                gm.gemm(dy, w.T if self.transpose else w, dx)
            elif sk is None:
                xp.matmul(dy, w.T if self.transpose else w, out=dx)
            elif self.transpose:  # dx (M, K) = dy (M, N) @ W (K, N)^T
                sk.dots(dy.reshape(-1), w.reshape(-1), dx.reshape(-1), None, self.M, self.K, self.num_output)
            else:  # dx (M, K) = dy (M, N) @ W (N, K)
                sk.combine(dy.reshape(-1), w.reshape(-1), dx.reshape(-1), None, self.M, self.num_output, self.K)

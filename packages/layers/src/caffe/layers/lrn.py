"""LRN: local response normalization (Caffe's LRNLayer).

ACROSS_CHANNELS (Caffe's CrossChannelForward/Backward):
    scale_c = k + alpha / n * sum_{c' in [c - (n-1)/2, c + (n-1)/2]} x_c'^2   (zero outside)
    top = x * scale^-beta
    dx = dy * scale^-beta - 2 * alpha * beta / n * x * sum_{c' window of c} dy_c' * top_c' / scale_c'
WITHIN_CHANNEL (Caffe composes split, power, AVE pooling with pad (n-1)/2, power, eltwise;
note Caffe's shift there is 1, not k):
    scale = 1 + alpha * (n x n zero-padded box sum of x^2) / n^2,  top = x * scale^-beta
    dx = dy * scale^-beta - 2 * alpha * beta / n^2 * x * boxsum(dy * top / scale)
(the box is symmetric, so the backward box sum is the forward one).
beta = 0.75 (AlexNet's) takes scale^-0.75 as 1 / (sqrt(scale) * sqrt(sqrt(scale))), much faster
than pow. scale lives in the scale_ blob (Caffe's), which the array-module backward reads (recomputing
scale^-beta), so a forward in one mode and a backward in the other agree. CPU: ACROSS_CHANNELS is one
kernel pass each way (caffe.layers.kernels.normalization; the window sums slide in double);
WITHIN_CHANNEL and the GPU run the array-module-generic code below.
The CPU ACROSS_CHANNELS backward recomputes the scale from the bottom in its own pass (the forward's window
sum, the same bits) instead of reading scale_: so the CPU forward, in either phase, leaves scale_ out (a
third of its memory traffic) and the backward reads bottom, top and top diff only. scale_ is written where
an array-module backward (GPU, after a CPU forward) asks for it (_cpu.DeferredState), and read by the CPU
backward where a forward kept it.
"""
from __future__ import annotations

import numpy as np

from caffe.layers import _cpu
from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer

ACROSS_CHANNELS, WITHIN_CHANNEL = 0, 1


@register_layer("LRN")
class LRNLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.lrn_param
        self.size = int(p.local_size)
        self.check(self.size % 2 == 1, f"LRN only supports odd values for lrn_param.local_size, got {self.size}")
        self.pre_pad = (self.size - 1) // 2
        self.alpha, self.beta, self.k = float(p.alpha), float(p.beta), float(p.k)
        self.region = int(p.norm_region)
        self.check(self.region in (ACROSS_CHANNELS, WITHIN_CHANNEL),
                   f"Unknown normalization region lrn_param.norm_region = {p.norm_region}")
        self._buffers = {}
        self.scale_state = _cpu.DeferredState(self, keep=False)
        self._forward_shape = None  # the bottom's shape at the last CPU forward (what a recomputed scale needs)

    def reshape(self, bottom, top):
        x = bottom[0]
        self.check(x.num_axes == 4, f"Input must have 4 axes, corresponding to (num, channels, height, "
                                    f"width): bottom[0] has shape {x.shape}")
        top[0].reshape_like(x)

    def _buf(self, xp, name, shape, dtype):
        key = (name, xp.__name__)
        b = self._buffers.get(key)
        if b is None or b.shape != tuple(shape) or b.dtype != dtype:
            b = self._buffers[key] = xp.empty(shape, dtype=dtype)
        return b

    def _window_sum(self, xp, v, out, padded_name):
        """out = sum of v over the window (channels, or an n x n box in each plane), zero-padded."""
        N, C, H, W = v.shape
        r = self.pre_pad
        if self.region == ACROSS_CHANNELS:
            pad = self._buf(xp, padded_name, (N, C + 2 * r, H, W), v.dtype)
            pad[:, :r] = 0
            pad[:, C + r:] = 0
            pad[:, r:r + C] = v
            out[...] = pad[:, 0:C]
            for o in range(1, self.size):
                out += pad[:, o:o + C]
        else:
            pad = self._buf(xp, padded_name, (N, C, H + 2 * r, W + 2 * r), v.dtype)
            pad[...] = 0
            pad[:, :, r:r + H, r:r + W] = v
            # separable box sum: rows, then columns
            rows = self._buf(xp, padded_name + "_rows", (N, C, H + 2 * r, W), v.dtype)
            rows[...] = pad[:, :, :, 0:W]
            for o in range(1, self.size):
                rows += pad[:, :, :, o:o + W]
            out[...] = rows[:, :, 0:H]
            for o in range(1, self.size):
                out += rows[:, :, o:o + H]

    def _pow_neg_beta(self, xp, scale, out, tmp):
        if self.beta == 0.75:
            xp.sqrt(scale, out=tmp)
            xp.sqrt(tmp, out=out)
            out *= tmp
            xp.reciprocal(out, out=out)
        else:
            xp.power(scale, -self.beta, out=out)

    def _coefficients(self):
        n = self.size if self.region == ACROSS_CHANNELS else self.size * self.size
        shift = self.k if self.region == ACROSS_CHANNELS else 1.0
        return self.alpha / n, shift

    def _kernel_usable(self, bottom, top):
        return self.region == ACROSS_CHANNELS and _cpu.usable(_cpu.normalization, bottom[0], top[0])

    def forward_cpu(self, bottom, top):
        if not self._kernel_usable(bottom, top):
            return self.forward_xp(np, bottom, top)
        self._across_forward(bottom, top[0].mutable_cpu_data(), keep=self.scale_state.keep)

    def _across_forward(self, bottom, y, keep):
        N, C, H, W = bottom[0].shape
        scale = _cpu.flat(_cpu.state_blob(self, "scale_", bottom[0]).mutable_cpu_data()) if keep else None
        _cpu.normalization.lrn_across_forward(_cpu.flat(bottom[0].cpu_data()), _cpu.flat(y), scale, N, C, H * W,
                                              self.size, self.alpha, self.k, self.beta)
        self.scale_state.written(kept=keep)
        self._forward_shape = bottom[0].shape

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if not self._kernel_usable(bottom, top):
            return self.backward_xp(np, top, propagate_down, bottom)
        N, C, H, W = bottom[0].shape
        if self.scale_state.stale:  # recomputed from the bottom, as the forward computed it
            if self._forward_shape != bottom[0].shape:
                raise self.error("backward needs a forward pass first (no scale_)")
            scale = None
        else:  # a forward kept it (or an array-module forward wrote it): read it
            scale = _cpu.flat(self._scale_state(bottom).cpu_data())
        _cpu.normalization.lrn_across_backward(_cpu.flat(bottom[0].cpu_data()), _cpu.flat(top[0].cpu_data()), scale,
                                               _cpu.flat(top[0].cpu_diff()), _cpu.flat(bottom[0].mutable_cpu_diff()),
                                               N, C, H * W, self.size, self.alpha, self.beta, k=self.k)

    def _scale_state(self, bottom):
        if self.scale_state.recompute():  # into a scratch top: the net's top may have changed since
            self._across_forward(bottom, np.empty(bottom[0].shape, bottom[0].dtype), keep=True)
        scale = getattr(self, "scale_", None)
        if scale is None or scale.shape != bottom[0].shape:
            raise self.error("backward needs a forward pass first (no scale_)")
        return scale

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        y = top[0].mutable_data_xp(xp)
        scale = _cpu.state_blob(self, "scale_", bottom[0]).mutable_data_xp(xp)
        self.scale_state.written()
        from caffe.layers.kernels import cuda_norm  # a real GPU: one pass
        if cuda_norm.lrn_forward(xp, x, scale, y, self.size, self.alpha, self.k, self.beta,
                                 self.region == WITHIN_CHANNEL):
            return
        sq = self._buf(xp, "sq", x.shape, x.dtype)
        xp.multiply(x, x, out=sq)
        self._window_sum(xp, sq, scale, "padded")
        a, shift = self._coefficients()
        scale *= a
        scale += shift
        powed = self._buf(xp, "scale_pow", x.shape, x.dtype)
        self._pow_neg_beta(xp, scale, powed, sq)
        xp.multiply(x, powed, out=y)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x = bottom[0].data_xp(xp)
        y = top[0].data_xp(xp)
        dy = top[0].diff_xp(xp)
        dx = bottom[0].mutable_diff_xp(xp)
        scale = self._scale_state(bottom).data_xp(xp)
        from caffe.layers.kernels import cuda_norm  # a real GPU: one pass
        if cuda_norm.lrn_backward(xp, x, y, scale, dy, dx, self.size, self.alpha, self.beta,
                                  self.region == WITHIN_CHANNEL):
            return
        powed = self._buf(xp, "scale_pow", x.shape, x.dtype)
        ratio = self._buf(xp, "sq", x.shape, x.dtype)
        self._pow_neg_beta(xp, scale, powed, ratio)
        xp.multiply(dy, y, out=ratio)
        ratio /= scale
        acc = self._buf(xp, "acc", x.shape, x.dtype)
        self._window_sum(xp, ratio, acc, "padded")
        a, _ = self._coefficients()
        acc *= x
        acc *= 2.0 * a * self.beta
        xp.multiply(dy, powed, out=dx)
        dx -= acc

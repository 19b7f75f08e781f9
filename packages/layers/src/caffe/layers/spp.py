"""SPP: spatial pyramid pooling (Caffe's SPPLayer).

Caffe builds it from Split, one Pooling per pyramid level, Flatten and Concat;
here the levels run directly on the pooling kernels with the same parameters
and the same output layout. Level l has 2^l bins per axis:
    kernel = ceil(size / bins), pad = (kernel * bins - size + 1) // 2, stride = kernel
(round_mode CEIL). The top is (N, sum_l C * PH_l * PW_l), each level flattened
channel-major in order; with pyramid_height 1 it is the single pooling output
(N, C, PH, PW) itself, as in Caffe.
"""
from __future__ import annotations

import math

import numpy as np

from caffe.blob import Blob, context
from caffe.layers import pooling as P
from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer


def level_params(level: int, height: int, width: int):
    """kernel, pad, stride (each (h, w)) of pyramid level `level` (Caffe's GetPoolingParam)."""
    bins = 2 ** level
    kh = math.ceil(height / bins)
    kw = math.ceil(width / bins)
    ph = (kh * bins - height + 1) // 2
    pw = (kw * bins - width + 1) // 2
    return (kh, kw), (ph, pw), (kh, kw)


@register_layer("SPP")
class SPPLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.spp_param
        self.pyramid_height = int(p.pyramid_height)
        self.check(self.pyramid_height > 0, f"spp_param.pyramid_height must be positive, got {p.pyramid_height}")
        self.method = int(p.pool)
        self.check(self.method in P.METHOD_NAMES, f"Unknown pooling method spp_param.pool = {p.pool}")
        self._shape = None

    def reshape(self, bottom, top):
        x = bottom[0]
        self.check(x.num_axes == 4, f"Input must have 4 axes, corresponding to (num, channels, height, "
                                    f"width): bottom[0] has shape {x.shape}")
        N, C, H, W = x.shape
        self.check(H > 0 and W > 0, f"Input dimensions cannot be zero: bottom[0] has shape {x.shape}")
        if x.shape != self._shape:
            self.levels = []
            for level in range(self.pyramid_height):
                kernel, pad, stride = level_params(level, H, W)
                if any(pad):
                    self.check(self.method in (P.MAX, P.AVE),
                               f"spp_param.pool {P.METHOD_NAMES[self.method]}: pyramid level {level} needs "
                               f"padding {pad} for input {H}x{W}, implemented only for MAX and AVE")
                    self.check(pad[0] < kernel[0] and pad[1] < kernel[1],
                               f"pyramid level {level} ({2 ** level} bins) needs pad {pad} >= kernel "
                               f"{kernel}: bottom[0] {H}x{W} is too small for spp_param.pyramid_height "
                               f"{self.pyramid_height}")
                PH = P.pooled_size(H, kernel[0], stride[0], pad[0])
                PW = P.pooled_size(W, kernel[1], stride[1], pad[1])
                self.levels.append((P.PoolSpec(self.method, kernel, stride, pad), (N, C, PH, PW)))
            self._shape = x.shape
            # Backward's state per level in a Blob (the argmax / sampled position), as Pooling's max_idx_,
            # so a forward in one mode and a backward in the other agree.
            self.level_idx_ = [Blob(shape, dtype=np.int32) for _, shape in self.levels]
        if self.pyramid_height == 1:
            top[0].reshape(self.levels[0][1])
        else:
            top[0].reshape(N, sum(C * s[2] * s[3] for _, s in self.levels))

    def _level_index(self, xp, i, write=False):
        blob = self.level_idx_[i]
        return blob.mutable_data_xp(xp) if write else blob.data_xp(xp)

    def _level_views(self, arr):
        """Per level, the (N, C, PH, PW) view of the top's slice."""
        N = arr.shape[0]
        flat = arr.reshape(N, -1)
        views, off = [], 0
        for _, shape in self.levels:
            size = shape[1] * shape[2] * shape[3]
            views.append(flat[:, off:off + size].reshape(shape))
            off += size
        return views

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        y = top[0].mutable_data_xp(xp)
        single = self.pyramid_height == 1
        for i, ((spec, shape), view) in enumerate(zip(self.levels, self._level_views(y))):
            out = view if single else xp.empty(shape, dtype=x.dtype)
            if self.method == P.MAX:
                P.max_forward(xp, spec, x, out, self._level_index(xp, i, write=True))
            elif self.method == P.AVE:
                P.ave_forward(xp, spec, x, out)
            elif self.phase == 0:
                uniform = xp.asarray(context.rng().random(shape))
                P.stochastic_forward_train(xp, spec, x, out, self._level_index(xp, i, write=True), uniform)
            else:
                P.stochastic_forward_test(xp, spec, x, out)
            if not single:
                view[...] = out

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].diff_xp(xp)
        dx = bottom[0].mutable_diff_xp(xp)
        part = xp.empty(dx.shape, dtype=dx.dtype) if self.pyramid_height > 1 else None
        for i, ((spec, shape), view) in enumerate(zip(self.levels, self._level_views(dy))):
            g = xp.ascontiguousarray(view)
            target = dx if i == 0 else part
            if self.method == P.MAX:
                P.max_backward(xp, spec, g, self._level_index(xp, i), target)
            elif self.method == P.AVE:
                P.ave_backward(xp, spec, g, target)
            else:
                P.stochastic_backward(xp, spec, g, self._level_index(xp, i), target)
            if i > 0:
                dx += part

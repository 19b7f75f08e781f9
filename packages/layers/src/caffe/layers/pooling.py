"""Pooling: MAX, AVE and STOCHASTIC 2-D pooling (Caffe's PoolingLayer).

Output size per axis (round_mode CEIL, the default, or FLOOR):
    pooled = ceil_or_floor((size + 2 * pad - kernel) / stride) + 1
and, with padding, one less when the last window would start in the padding:
    if pad > 0 and (pooled - 1) * stride >= size + pad: pooled -= 1.
MAX takes the first maximum of each window in row-major order (a running max
from -FLT_MAX replaced only by a strictly greater value); its argmax, h * W + w
within the channel plane, is kept for backward and, with a second top, output
as floats (Caffe's mask top). AVE divides by the window clipped to the padded
extent (size + pad), computed before clipping the window to the image.
STOCHASTIC (no padding): in TRAIN a window element is drawn with probability
proportional to its activation (a uniform from caffe.blob.context.rng() times
the window sum, against the running sum); in TEST the output is the
activation-weighted average sum(x^2) / (FLT_MIN + sum(x)).

The CPU runs MAX/AVE through the Cython/OpenMP kernels (caffe.layers.kernels.pooling); the
NumPy code below (one strided slice per kernel offset) serves STOCHASTIC and any other
dtype, and is the reference for the device. The device (CuPy) runs caffe.layers.pool_device:
one gather of every window and one reduction, a constant number of launches. Checked against
the CuPy stand-in only (no GPU here).
"""
from __future__ import annotations

import os
from itertools import product

import numpy as np

from caffe.blob import context
from caffe.layers import _cpu, device, pool_device
from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer

# (OMP_WAIT_POLICY / OPENBLAS_THREAD_TIMEOUT are set in caffe/__init__.py, before any thread pool loads.)

# The kernels' AVX-512 / AVX2 build where the CPU has it (caffe.layers._cpu); None in a source tree without
# the build.
_k = _cpu._load("pooling", avx512=_cpu.USE_AVX512)

FLT_MAX = float(np.finfo(np.float32).max)
FLT_MIN = float(np.finfo(np.float32).tiny)
MAX, AVE, STOCHASTIC = 0, 1, 2
METHOD_NAMES = {MAX: "MAX", AVE: "AVE", STOCHASTIC: "STOCHASTIC"}


def pooled_size(size: int, kernel: int, stride: int, pad: int, ceil_mode: bool = True) -> int:
    """Caffe's pooled output size on one axis (see the module doc)."""
    num = size + 2 * pad - kernel
    out = (-(-num // stride) if ceil_mode else num // stride) + 1
    if pad > 0 and (out - 1) * stride >= size + pad:
        out -= 1
    return out


class PoolSpec:
    """One 2-D pooling configuration: method, kernel, stride, pad."""
    __slots__ = ("method", "kh", "kw", "sh", "sw", "ph", "pw")

    def __init__(self, method, kernel, stride, pad):
        self.method = int(method)
        self.kh, self.kw = (int(v) for v in kernel)
        self.sh, self.sw = (int(v) for v in stride)
        self.ph, self.pw = (int(v) for v in pad)

    def window_args(self):
        return (self.kh, self.kw, self.sh, self.sw, self.ph, self.pw)

    def __repr__(self):
        return (f"PoolSpec({METHOD_NAMES.get(self.method, self.method)}, kernel=({self.kh}, {self.kw}), "
                f"stride=({self.sh}, {self.sw}), pad=({self.ph}, {self.pw}))")


def _fast(xp, *arrays) -> bool:
    return (xp is np and _k is not None and arrays[0].dtype in (np.float32, np.float64)
            and all(a.flags.c_contiguous for a in arrays))


def _offsets(spec):
    return product(range(spec.kh), range(spec.kw))


def _window_slices(spec, i, j, PH, PW):
    # In padded coordinates (h + pad) window (ph, pw) covers [ph * sh, ph * sh + kh).
    return (slice(None), slice(None), slice(i, i + spec.sh * (PH - 1) + 1, spec.sh),
            slice(j, j + spec.sw * (PW - 1) + 1, spec.sw))


def _padded(xp, x, spec, PH, PW, fill, pad=True):
    """x placed in an array covering every window; `fill` elsewhere."""
    N, C, H, W = x.shape
    ph, pw = (spec.ph, spec.pw) if pad else (0, 0)
    Hp = max(H + ph, (PH - 1) * spec.sh + spec.kh)
    Wp = max(W + pw, (PW - 1) * spec.sw + spec.kw)
    out = xp.full((N, C, Hp, Wp), fill, dtype=x.dtype)
    out[:, :, ph:ph + H, pw:pw + W] = x
    return out


def _positions(xp, spec, i, j, H, W, PH, PW, pad=True):
    """h * W + w of kernel offset (i, j) in every window; -1 where it falls outside the image."""
    ph, pw = (spec.ph, spec.pw) if pad else (0, 0)
    h = xp.arange(PH) * spec.sh - ph + i
    w = xp.arange(PW) * spec.sw - pw + j
    inside = ((h >= 0) & (h < H))[:, None] & ((w >= 0) & (w < W))[None, :]
    return xp.where(inside, h[:, None] * W + w[None, :], -1).astype(xp.int32)


def ave_pool_sizes(xp, spec, H, W, PH, PW, dtype):
    """Caffe's AVE divisor per window: the window clipped to the padded extent (H + pad). Built with xp (on
    the device in GPU mode) once per geometry and kept, so a call moves nothing between host and device."""
    def build():
        hs = xp.arange(PH) * spec.sh - spec.ph
        ws = xp.arange(PW) * spec.sw - spec.pw
        hh = xp.minimum(hs + spec.kh, H + spec.ph) - hs
        ww = xp.minimum(ws + spec.kw, W + spec.pw) - ws
        return (hh[:, None] * ww[None, :]).astype(dtype)
    return device.cached(xp, ("ave_divisor", spec.window_args(), H, W, PH, PW, np.dtype(dtype).str), build)


def _scatter_back(xp, spec, dy, index, dx, pad=True):
    """dx = 0, then dx[index] += dy per plane (index = h * W + w, -1 = nowhere)."""
    if xp is not np:
        pool_device.scatter_back(xp, spec, dy, index, dx, pad)
        return
    N, C, H, W = dx.shape
    PH, PW = dy.shape[2:]
    padded = _padded(xp, xp.zeros_like(dx), spec, PH, PW, 0, pad)
    for i, j in _offsets(spec):
        pos = _positions(xp, spec, i, j, H, W, PH, PW, pad)
        # Distinct windows map one offset to distinct pixels: no duplicates in this update.
        padded[_window_slices(spec, i, j, PH, PW)] += xp.where(index == pos, dy, 0)
    ph, pw = (spec.ph, spec.pw) if pad else (0, 0)
    dx[...] = padded[:, :, ph:ph + H, pw:pw + W]


def max_forward(xp, spec, x, y, mask):
    """y = window max, mask (int32) = its position."""
    N, C, H, W = x.shape
    PH, PW = y.shape[2:]
    if _fast(xp, x, y, mask):
        _k.max_pool_forward(x.reshape(-1), y.reshape(-1), mask.reshape(-1), N * C, H, W, PH, PW,
                            *spec.window_args())
        return
    if xp is not np:
        pool_device.max_forward(xp, spec, x, y, mask)
        return
    padded = _padded(xp, x, spec, PH, PW, -np.inf)
    best = xp.full(y.shape, -FLT_MAX, dtype=x.dtype)
    idx = xp.full(y.shape, -1, dtype=xp.int32)
    for i, j in _offsets(spec):
        v = padded[_window_slices(spec, i, j, PH, PW)]
        better = v > best
        best = xp.where(better, v, best)
        idx = xp.where(better, _positions(xp, spec, i, j, H, W, PH, PW), idx)
    y[...] = best
    mask[...] = idx


def max_forward_values(xp, spec, x, y) -> bool:
    """y = window max without the argmax (the same values as max_forward's), where the CPU kernels
    take it; False where they do not (the caller then runs max_forward)."""
    if not _fast(xp, x, y):
        return False
    N, C, H, W = x.shape
    PH, PW = y.shape[2:]
    _k.max_pool_forward(x.reshape(-1), y.reshape(-1), None, N * C, H, W, PH, PW, *spec.window_args())
    return True


def max_backward(xp, spec, dy, mask, dx):
    N, C, H, W = dx.shape
    PH, PW = dy.shape[2:]
    if _fast(xp, dx, dy, mask):
        # (2x2 / stride 2 windows tiling the plane: row by row, no scatter)
        whole_2x2 = spec.window_args() == (2, 2, 2, 2, 0, 0) and (H, W) == (2 * PH, 2 * PW)
        _k.max_pool_backward(dy.reshape(-1), mask.reshape(-1), dx.reshape(-1), N * C, H * W, PH * PW,
                             *((W, PW) if whole_2x2 else ()))
        return
    _scatter_back(xp, spec, dy, mask, dx)


def ave_forward(xp, spec, x, y):
    N, C, H, W = x.shape
    PH, PW = y.shape[2:]
    if _fast(xp, x, y):
        _k.ave_pool_forward(x.reshape(-1), y.reshape(-1), N * C, H, W, PH, PW, *spec.window_args())
        return
    if xp is not np:
        pool_device.ave_forward(xp, spec, x, y, ave_pool_sizes(xp, spec, H, W, PH, PW, x.dtype))
        return
    padded = _padded(xp, x, spec, PH, PW, 0)
    acc = xp.zeros(y.shape, dtype=x.dtype)
    for i, j in _offsets(spec):
        acc += padded[_window_slices(spec, i, j, PH, PW)]
    with np.errstate(divide="ignore", invalid="ignore"):  # Caffe's 0/0 past the edge: nan, silently
        y[...] = acc / ave_pool_sizes(xp, spec, H, W, PH, PW, x.dtype)


def ave_backward(xp, spec, dy, dx):
    N, C, H, W = dx.shape
    PH, PW = dy.shape[2:]
    if _fast(xp, dx, dy):
        _k.ave_pool_backward(dy.reshape(-1), dx.reshape(-1), N * C, H, W, PH, PW, *spec.window_args())
        return
    if xp is not np:
        pool_device.ave_backward(xp, spec, dy, dx, ave_pool_sizes(xp, spec, H, W, PH, PW, dy.dtype))
        return
    with np.errstate(divide="ignore", invalid="ignore"):  # Caffe's x/0 past the edge, silently
        g = dy / ave_pool_sizes(xp, spec, H, W, PH, PW, dy.dtype)
        padded = _padded(xp, xp.zeros_like(dx), spec, PH, PW, 0)
        for i, j in _offsets(spec):
            padded[_window_slices(spec, i, j, PH, PW)] += g
    dx[...] = padded[:, :, spec.ph:spec.ph + H, spec.pw:spec.pw + W]


def _stochastic_windows(xp, spec, x, PH, PW):
    """Window values (K, N, C, PH, PW) in row-major window order (0 outside the image), positions."""
    if xp is not np:
        return pool_device.stochastic_windows(xp, spec, x, PH, PW)
    N, C, H, W = x.shape
    padded = _padded(xp, x, spec, PH, PW, 0, pad=False)
    vals = xp.stack([padded[_window_slices(spec, i, j, PH, PW)] for i, j in _offsets(spec)])
    pos = xp.stack([_positions(xp, spec, i, j, H, W, PH, PW, pad=False) for i, j in _offsets(spec)])
    return vals, pos


def stochastic_forward_train(xp, spec, x, y, rand_idx, uniform):
    """Sample one element per window with probability proportional to its value."""
    from caffe.layers.kernels import cuda_pooling  # a real GPU: Caffe's StoPoolForwardTrain, one pass
    if cuda_pooling.sto_pool_forward_train(xp, spec, x, y, rand_idx, uniform):
        return
    PH, PW = y.shape[2:]
    vals, pos = _stochastic_windows(xp, spec, x, PH, PW)
    cums = xp.cumsum(vals, axis=0)
    thres = uniform.astype(x.dtype) * cums[-1]
    valid = (pos >= 0)[:, None, None]
    hit = (cums >= thres) & valid
    # Caffe leaves a window without a hit (a negative window sum) untouched; take its last
    # element so the output is always one of the window's values.
    last = (valid * xp.arange(vals.shape[0]).reshape(-1, 1, 1, 1, 1)).max(axis=0)
    first = xp.where(hit.any(axis=0), xp.argmax(hit, axis=0), last)
    y[...] = xp.take_along_axis(vals, first[None], axis=0)[0]
    pos_b = xp.broadcast_to(pos[:, None, None], vals.shape)
    rand_idx[...] = xp.take_along_axis(pos_b, first[None], axis=0)[0]


def stochastic_forward_test(xp, spec, x, y):
    """The activation-weighted average sum(x^2) / (FLT_MIN + sum(x))."""
    from caffe.layers.kernels import cuda_pooling  # a real GPU: Caffe's StoPoolForwardTest, one pass
    if cuda_pooling.sto_pool_forward_test(xp, spec, x, y):
        return
    PH, PW = y.shape[2:]
    vals, _ = _stochastic_windows(xp, spec, x, PH, PW)
    y[...] = (vals * vals).sum(axis=0) / (vals.sum(axis=0) + x.dtype.type(FLT_MIN))


def stochastic_backward(xp, spec, dy, rand_idx, dx):
    _scatter_back(xp, spec, dy, rand_idx, dx, pad=False)


@register_layer("Pooling")
class PoolingLayer(Layer):
    exact_num_bottom_blobs = 1
    min_top_blobs = 1
    max_top_blobs = 2  # the second (the argmax mask) for MAX only

    def layer_setup(self, bottom, top):
        p = self.layer_param.pooling_param
        has = p.HasField
        self.method = int(p.pool)
        self.check(self.method in METHOD_NAMES, f"Unknown pooling method pooling_param.pool = {p.pool}")
        if len(top) > 1:
            self.check(self.method == MAX, f"only MAX pooling has a second (mask) top; pooling_param.pool "
                                           f"is {METHOD_NAMES[self.method]} with {len(top)} tops")
        self.global_pooling = bool(p.global_pooling)
        if self.global_pooling:
            self.check(not (has("kernel_size") or has("kernel_h") or has("kernel_w")),
                       "With Global_pooling: true Filter size cannot specified "
                       "(pooling_param.kernel_size / kernel_h / kernel_w given)")
        else:
            self.check(not (has("kernel_size") and (has("kernel_h") or has("kernel_w"))),
                       "Filter size is pooling_param.kernel_size OR kernel_h and kernel_w; not both")
            self.check(has("kernel_size") or (has("kernel_h") and has("kernel_w")),
                       "pooling_param needs kernel_size, or both kernel_h and kernel_w (for non-square "
                       "filters)")
        self.check((not has("pad") and has("pad_h") and has("pad_w")) or (not has("pad_h") and not has("pad_w")),
                   "pooling_param: pad is pad OR pad_h and pad_w are required")
        self.check((not has("stride") and has("stride_h") and has("stride_w"))
                   or (not has("stride_h") and not has("stride_w")),
                   "pooling_param: Stride is stride OR stride_h and stride_w are required")
        if not self.global_pooling:
            self.kernel = ((p.kernel_size, p.kernel_size) if has("kernel_size") else (p.kernel_h, p.kernel_w))
            self.check(min(self.kernel) > 0, f"Filter dimensions cannot be zero: pooling_param kernel "
                                             f"{self.kernel}")
        self.pad = (p.pad_h, p.pad_w) if has("pad_h") else (p.pad, p.pad)
        self.stride = (p.stride_h, p.stride_w) if has("stride_h") else (p.stride, p.stride)
        self.check(min(self.stride) > 0, f"pooling_param stride must be nonzero, got {self.stride}")
        if self.global_pooling:
            self.check(self.pad == (0, 0) and self.stride == (1, 1),
                       f"With Global_pooling: true; only pad = 0 and stride = 1 (pooling_param pad "
                       f"{self.pad}, stride {self.stride})")
        if any(self.pad):
            self.check(self.method in (MAX, AVE), f"Padding implemented only for average and max pooling: "
                                                  f"pooling_param.pad {self.pad} with "
                                                  f"{METHOD_NAMES[self.method]}")
            if not self.global_pooling:
                self.check(self.pad[0] < self.kernel[0] and self.pad[1] < self.kernel[1],
                           f"pooling_param pad {self.pad} must be smaller than the kernel {self.kernel}")
        self.ceil_mode = p.round_mode == 0  # CEIL
        self.max_idx_ = None
        self.rand_idx_ = None
        # MAX in a TEST-phase net: the argmax (its write and bookkeeping are a fifth of the traffic and
        # most of the compares) only once a Backward asks for it (_cpu.DeferredState)
        self.mask_state = _cpu.DeferredState(self)

    def reshape(self, bottom, top):
        x = bottom[0]
        self.check(x.num_axes == 4, f"Input must have 4 axes, corresponding to (num, channels, height, "
                                    f"width): bottom[0] has shape {x.shape}")
        N, C, H, W = x.shape
        kernel = (H, W) if self.global_pooling else self.kernel
        self.spec = PoolSpec(self.method, kernel, self.stride, self.pad)
        PH = pooled_size(H, kernel[0], self.stride[0], self.pad[0], self.ceil_mode)
        PW = pooled_size(W, kernel[1], self.stride[1], self.pad[1], self.ceil_mode)
        self.check(PH > 0 and PW > 0, f"pooled output size {PH}x{PW} is not positive: kernel {kernel} is "
                                      f"larger than the padded input of bottom[0] with shape {x.shape}")
        top[0].reshape(N, C, PH, PW)
        if len(top) > 1:
            top[1].reshape_like(top[0])
        self.top_shape = (N, C, PH, PW)
        # Backward's state, in blobs (Caffe's max_idx_ / rand_idx_): the argmax or the sampled position
        # per output, h * W + w (-1: none), so a forward in one mode and a backward in the other agree.
        if self.method == MAX:
            _cpu.state_blob(self, "max_idx_", self.top_shape, np.int32)
        elif self.method == STOCHASTIC:
            _cpu.state_blob(self, "rand_idx_", self.top_shape, np.int32)

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        y = top[0].mutable_data_xp(xp)
        spec = self.spec
        if self.method == MAX:
            if len(top) == 1 and not self.mask_state.keep and max_forward_values(xp, spec, x, y):
                self.mask_state.written(kept=False)
                return
            mask = self.max_idx_.mutable_data_xp(xp)
            max_forward(xp, spec, x, y, mask)
            self.mask_state.written()
            if len(top) > 1:
                top[1].mutable_data_xp(xp)[...] = mask
        elif self.method == AVE:
            ave_forward(xp, spec, x, y)
        elif self.phase == 0:  # TRAIN
            uniform = xp.asarray(context.rng().random(self.top_shape))
            stochastic_forward_train(xp, spec, x, y, self.rand_idx_.mutable_data_xp(xp), uniform)
        else:
            stochastic_forward_test(xp, spec, x, y)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].diff_xp(xp)
        dx = bottom[0].mutable_diff_xp(xp)
        if self.method == MAX:
            if len(top) > 1:  # Caffe reads the argmax back from the mask top
                mask = top[1].data_xp(xp).astype(xp.int32)
            else:
                if self.mask_state.recompute():  # into a scratch top: the net's top may have changed since
                    max_forward(xp, self.spec, bottom[0].data_xp(xp), xp.empty(self.top_shape, dy.dtype),
                                self.max_idx_.mutable_data_xp(xp))
                mask = self.max_idx_.data_xp(xp)
            max_backward(xp, self.spec, dy, mask, dx)
        elif self.method == AVE:
            ave_backward(xp, self.spec, dy, dx)
        else:
            stochastic_backward(xp, self.spec, dy, self.rand_idx_.data_xp(xp), dx)

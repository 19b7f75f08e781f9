"""Pooling on the device (CuPy) in a constant number of launches, whatever the window.

The generic code in caffe.layers.pooling (the NumPy reference) takes one strided slice, compare and
select per window offset: kh * kw rounds of several launches each on a GPU. Here every window is read by
ONE gather (`take` with a (K, PH * PW) index array into a padded plane, built on the device and kept per
geometry by caffe.layers.device.cached), then reduced over its K elements:
- MAX: Caffe's running max from -FLT_MAX replaced only by a strictly greater value is the first maximum
  of the window with every value not above -FLT_MAX (padding, -inf, NaN) taken as -FLT_MAX, and no
  argmax (-1) when nothing beat -FLT_MAX: argmax (first occurrence) over the window, then a select.
- AVE: a sum over the window and Caffe's divisor (caffe.layers.pooling.ave_pool_sizes).
- the backward passes: one scatter-add (`add.at`) of the top diff into a zeroed plane (argmax -1 lands
  in a spare slot that is dropped), then one copy into the bottom diff. On a real GPU add.at sums with
  atomics: pixels shared by overlapping windows get their terms in a varying order (float rounding).
A global pooling window (kernel = the image, no padding) is read in place, without the gather.
"""
from __future__ import annotations

import numpy as np

from caffe.layers import device
from caffe.layers.kernels import cuda_pooling

FLT_MAX = float(np.finfo(np.float32).max)


def plane_shape(spec, H, W, PH, PW, pad=True):
    """The padded plane covering every window (as caffe.layers.pooling._padded)."""
    ph, pw = (spec.ph, spec.pw) if pad else (0, 0)
    return max(H + ph, (PH - 1) * spec.sh + spec.kh), max(W + pw, (PW - 1) * spec.sw + spec.kw)


def _key(spec, H, W, PH, PW, pad):
    return spec.window_args() + (H, W, PH, PW, pad)


def _window_grid(xp, spec, PH, PW):
    """Window offsets (i, j) as (K, 1) columns and window origins (a * sh, b * sw) as (1, PH * PW) rows."""
    i = xp.repeat(xp.arange(spec.kh, dtype=np.int32), spec.kw).reshape(-1, 1)
    j = xp.tile(xp.arange(spec.kw, dtype=np.int32), spec.kh).reshape(-1, 1)
    a = xp.repeat(xp.arange(PH, dtype=np.int32) * spec.sh, PW).reshape(1, -1)
    b = xp.tile(xp.arange(PW, dtype=np.int32) * spec.sw, PH).reshape(1, -1)
    return i, j, a, b


def window_index(xp, spec, H, W, PH, PW, pad=True):
    """(K, PH * PW): the flat position in the padded plane of window element k of window p."""
    def build():
        _, Wp = plane_shape(spec, H, W, PH, PW, pad)
        i, j, a, b = _window_grid(xp, spec, PH, PW)
        return ((a + i) * Wp + (b + j)).astype(np.int32)
    return device.cached(xp, ("pool_windows",) + _key(spec, H, W, PH, PW, pad), build)


def window_positions(xp, spec, H, W, PH, PW, pad=True):
    """(K, PH * PW): h * W + w of window element k of window p in the image; -1 where it is padding."""
    def build():
        ph, pw = (spec.ph, spec.pw) if pad else (0, 0)
        i, j, a, b = _window_grid(xp, spec, PH, PW)
        h, w = a + i - ph, b + j - pw
        inside = (h >= 0) & (h < H) & (w >= 0) & (w < W)
        return xp.where(inside, h * W + w, -1).astype(np.int32)
    return device.cached(xp, ("pool_positions",) + _key(spec, H, W, PH, PW, pad), build)


def _is_global(spec, H, W, PH, PW, pad):
    return PH == 1 and PW == 1 and (spec.kh, spec.kw) == (H, W) and not (pad and (spec.ph or spec.pw))


def windows(xp, spec, x, PH, PW, fill, pad=True):
    """Every window's values, (N * C, K, PH * PW); `fill` where a window covers no image pixel."""
    N, C, H, W = x.shape
    if _is_global(spec, H, W, PH, PW, pad):
        return x.reshape(N * C, H * W, 1)
    Hp, Wp = plane_shape(spec, H, W, PH, PW, pad)
    ph, pw = (spec.ph, spec.pw) if pad else (0, 0)
    if (Hp, Wp) == (H, W):
        src = x.reshape(N * C, H * W)
    else:
        src = xp.full((N * C, Hp, Wp), fill, dtype=x.dtype)
        src[:, ph:ph + H, pw:pw + W] = x.reshape(N * C, H, W)
        src = src.reshape(N * C, Hp * Wp)
    return xp.take(src, window_index(xp, spec, H, W, PH, PW, pad), axis=1)


def max_forward(xp, spec, x, y, mask):
    if cuda_pooling.max_pool_forward(xp, spec, x, y, mask):
        return  # a real GPU: Caffe's MaxPoolForward in one pass
    N, C, H, W = x.shape
    PH, PW = y.shape[2:]
    vals = windows(xp, spec, x, PH, PW, -np.inf)
    floor = x.dtype.type(-FLT_MAX)
    cand = xp.where(vals > floor, vals, floor)  # never chosen by Caffe's strict >: -FLT_MAX and below, NaN
    k = xp.argmax(cand, axis=1)  # (N*C, PH*PW): the first maximum
    best = xp.take_along_axis(cand, k[:, None, :], axis=1)[:, 0]
    y[...] = best.reshape(y.shape)
    pos = window_positions(xp, spec, H, W, PH, PW)
    cols = device.cached(xp, ("arange", PH * PW), lambda: xp.arange(PH * PW, dtype=np.int32))
    at = xp.take(pos.reshape(-1), k * (PH * PW) + cols)
    mask[...] = xp.where(best > floor, at, -1).reshape(mask.shape)


def window_starts(xp, spec, PH, PW, pad=True):
    """(1, PH * PW) first image row and column of each window (negative: it starts in the padding)."""
    def build():
        ph, pw = (spec.ph, spec.pw) if pad else (0, 0)
        _, _, a, b = _window_grid(xp, spec, PH, PW)
        return a - ph, b - pw
    return device.cached(xp, ("pool_starts", spec.window_args(), PH, PW, pad), build)


def scatter_back(xp, spec, dy, index, dx, pad=True):
    """dx = 0, then dx[plane, index] += dy (index = h * W + w per plane): Caffe's argmax backward (MAX,
    STOCHASTIC). As Caffe's GPU kernels (a gather over the windows covering each pixel), an index that does
    not lie in its own window (-1, or a stale STOCHASTIC index in TEST) adds nothing."""
    if cuda_pooling.pool_backward(xp, spec, dy, index, dx, pad):
        return  # a real GPU: Caffe's MaxPoolBackward gather, one pass
    N, C, H, W = dx.shape
    L = H * W
    NC, P = N * C, dy.shape[2] * dy.shape[3]
    hs, ws = window_starts(xp, spec, dy.shape[2], dy.shape[3], pad)
    ii = index.reshape(NC, P)
    h = ii // W
    w = ii - h * W
    ok = (ii >= 0) & (ii < L) & (h >= hs) & (h < hs + spec.kh) & (w >= ws) & (w < ws + spec.kw)
    rows = device.cached(xp, ("pool_rows", NC, L), lambda: (xp.arange(NC, dtype=np.int64) * (L + 1)).reshape(NC, 1))
    idx = xp.where(ok, ii, L) + rows  # L: the spare slot of each plane, dropped below
    dst = xp.zeros((NC, L + 1), dtype=dx.dtype)
    xp.add.at(dst.reshape(-1), idx, dy.reshape(NC, P))
    dx[...] = dst[:, :L].reshape(dx.shape)


def ave_forward(xp, spec, x, y, sizes):
    if cuda_pooling.ave_pool_forward(xp, spec, x, y):
        return  # a real GPU: Caffe's AvePoolForward, one pass
    PH, PW = y.shape[2:]
    acc = windows(xp, spec, x, PH, PW, 0).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):  # Caffe's 0/0 past the edge: nan, silently
        y[...] = (acc / sizes.reshape(1, -1)).reshape(y.shape)


def ave_backward(xp, spec, dy, dx, sizes):
    if cuda_pooling.ave_pool_backward(xp, spec, dy, dx):
        return  # a real GPU: Caffe's AvePoolBackward gather, one pass
    N, C, H, W = dx.shape
    PH, PW = dy.shape[2:]
    NC, P, K = N * C, PH * PW, spec.kh * spec.kw
    with np.errstate(divide="ignore", invalid="ignore"):  # Caffe's x/0 past the edge, silently
        g = dy.reshape(NC, 1, P) / sizes.reshape(1, 1, P)
    if _is_global(spec, H, W, PH, PW, True):
        dx[...] = xp.broadcast_to(g.reshape(NC, 1), (NC, H * W)).reshape(dx.shape)
        return
    Hp, Wp = plane_shape(spec, H, W, PH, PW)
    dst = xp.zeros((NC, Hp * Wp), dtype=dx.dtype)
    xp.add.at(dst, (slice(None), window_index(xp, spec, H, W, PH, PW)), xp.broadcast_to(g, (NC, K, P)))
    dx[...] = dst.reshape(NC, Hp, Wp)[:, spec.ph:spec.ph + H, spec.pw:spec.pw + W].reshape(dx.shape)


def stochastic_windows(xp, spec, x, PH, PW):
    """caffe.layers.pooling._stochastic_windows on the device: values (K, N, C, PH, PW), positions (K, PH, PW)."""
    N, C, H, W = x.shape
    vals = windows(xp, spec, x, PH, PW, 0, pad=False)
    K = vals.shape[1]
    vals = xp.moveaxis(vals.reshape(N, C, K, PH, PW), 2, 0)
    pos = window_positions(xp, spec, H, W, PH, PW, pad=False).reshape(K, PH, PW)
    return vals, pos

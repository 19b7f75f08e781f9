"""The convolution lowering on the device (CuPy): im2col as one gather, col2im as one scatter-add.

The generic lowering (conv_base.im2col/col2im with NumPy) copies one strided slice per kernel offset:
on a GPU that is K = prod(kernel) launches per call (and K more for col2im). Here each direction takes a
constant number of launches whatever the kernel:
- im2col: copy the image into a zero-bordered buffer (only with padding, or to reorder a batch), then
  ONE `take` with a precomputed index array: the flat position in the padded image plane of every
  (kernel offset, output position) pair, built on the device with arange arithmetic (no host upload) and
  kept per geometry (caffe.layers.device.cached).
- col2im: zero a padded buffer, ONE `add.at` (a scatter-add: several column entries read the same pixel)
  with the same index array, and one copy of the interior into the image.
- a trivial geometry (1x1 kernel, stride 1, no padding: Caffe's is_1x1) is a single copy (or none).
On a real GPU add.at accumulates with atomics, so the order of the (at most K) terms summed into one pixel
varies from run to run (results within float rounding of Caffe's fixed-order col2im_gpu); where the
hand-written kernels run (caffe.layers.device.kernels), the 2-D col2im is Caffe's own deterministic order.
"""
from __future__ import annotations

import math

import numpy as np

from caffe.layers import cuda_kernels, device

INT32_MAX = 2 ** 31 - 1


def trivial(geom) -> bool:
    """A 1x1 kernel with stride 1 and no padding: the column buffer is the image itself (reordered)."""
    return (all(k == 1 for k in geom.kernel) and all(s == 1 for s in geom.stride)
            and not any(geom.pad))


def padded_shape(geom) -> tuple:
    return tuple(n + 2 * p for n, p in zip(geom.im_shape, geom.pad))


def _key(geom) -> tuple:
    return (geom.kernel, geom.stride, geom.pad, geom.dilation, geom.im_shape, geom.col_shape)


def offset_index(xp, geom):
    """(K, P) flat position in the padded image plane read by kernel offset k at output position p."""
    def build():
        nsp = len(geom.kernel)
        plane = padded_shape(geom)
        mult = [math.prod(plane[i + 1:]) for i in range(nsp)]
        idx = xp.zeros((1,) * (2 * nsp), dtype=np.int64)
        for i in range(nsp):
            o_shape, q_shape = [1] * (2 * nsp), [1] * (2 * nsp)
            o_shape[i], q_shape[nsp + i] = geom.kernel[i], geom.col_shape[i]
            o = (xp.arange(geom.kernel[i], dtype=np.int64) * geom.dilation[i]).reshape(o_shape)
            q = (xp.arange(geom.col_shape[i], dtype=np.int64) * geom.stride[i]).reshape(q_shape)
            idx = idx + (o + q) * mult[i]
        return _narrow(xp, idx.reshape(geom.kernel_count, geom.col_count), math.prod(plane))
    return device.cached(xp, ("conv_offsets",) + _key(geom), build)


def batch_index(xp, geom, nb):
    """(K, nb, P): offset_index shifted to image n of nb images laid side by side, (C, nb * plane)."""
    def build():
        plane = math.prod(padded_shape(geom))
        shift = (xp.arange(nb, dtype=np.int64) * plane).reshape(1, nb, 1)
        return _narrow(xp, offset_index(xp, geom).astype(np.int64)[:, None, :] + shift, nb * plane)
    return device.cached(xp, ("conv_batch", nb) + _key(geom), build)


def _narrow(xp, idx, bound):
    """int32 indices where they fit: half the index traffic of int64."""
    return idx.astype(np.int32) if bound <= INT32_MAX else idx


def _out_view(a, shape):
    """a reshaped without a copy (a gather's or scatter's out= must be the array itself)."""
    if not a.flags.c_contiguous:
        raise ValueError(f"the device lowering needs a C-contiguous buffer, got strides {a.strides}")
    return a.reshape(shape)


def _interior(geom):
    return tuple(slice(p, p + n) for n, p in zip(geom.im_shape, geom.pad))


def im2col(xp, im, col, geom, layout: str) -> None:
    """conv_base.im2col for device arrays: col (C*K, nb*P) "batch" or (nb, C*K, P) "image". col may have
    another dtype than im (the exact float64 forward): the image is cast in the copy the gather reads."""
    nb, C = im.shape[0], im.shape[1]
    K, P = geom.kernel_count, geom.col_count
    if trivial(geom):
        if layout == "batch":
            _out_view(col, (C, nb, P))[...] = im.reshape(nb, C, P).swapaxes(0, 1)
        else:
            col[...] = im.reshape(col.shape)
        return
    plane = math.prod(padded_shape(geom))
    if layout == "batch":
        # the source laid out (C, nb, *padded): one gather then writes col's (C, K, nb, P) order directly
        if any(geom.pad):
            src = xp.zeros((C, nb) + padded_shape(geom), dtype=col.dtype)
            src[(slice(None), slice(None)) + _interior(geom)] = im.swapaxes(0, 1)
        elif nb == 1 and im.dtype == col.dtype:
            src = im[0]
        else:
            src = xp.ascontiguousarray(im.swapaxes(0, 1), dtype=col.dtype)
        xp.take(src.reshape(C, nb * plane), batch_index(xp, geom, nb), axis=1,
                out=_out_view(col, (C, K, nb, P)))
        return
    if any(geom.pad):
        src = xp.zeros((nb, C) + padded_shape(geom), dtype=col.dtype)
        src[(slice(None), slice(None)) + _interior(geom)] = im
    else:
        src = xp.ascontiguousarray(im, dtype=col.dtype)
    xp.take(src.reshape(nb, C, plane), offset_index(xp, geom), axis=2, out=_out_view(col, (nb, C, K, P)))


def col2im(xp, col, im, geom, layout: str) -> None:
    """conv_base.col2im for device arrays: im (overwritten) = the sum of the column entries reading it."""
    nb, C = im.shape[0], im.shape[1]
    K, P = geom.kernel_count, geom.col_count
    if trivial(geom):
        if layout == "batch":
            _out_view(im, (nb, C, P))[...] = col.reshape(C, nb, P).swapaxes(0, 1)
        else:
            im[...] = col.reshape(im.shape)
        return
    if cuda_kernels.col2im_2d(xp, col, im, geom, *((nb * P, P) if layout == "batch" else (P, C * K * P))):
        return  # a real GPU: Caffe's deterministic col2im kernel
    plane = math.prod(padded_shape(geom))
    crop = (slice(None), slice(None)) + _interior(geom)
    if layout == "batch":
        dst = xp.zeros((C, nb * plane), dtype=im.dtype)
        xp.add.at(dst, (slice(None), batch_index(xp, geom, nb)), col.reshape(C, K, nb, P))
        im[...] = dst.reshape((C, nb) + padded_shape(geom))[crop].swapaxes(0, 1)
        return
    dst = xp.zeros((nb, C, plane), dtype=im.dtype)
    xp.add.at(dst, (slice(None), slice(None), offset_index(xp, geom)), col.reshape(nb, C, K, P))
    im[...] = dst.reshape((nb, C) + padded_shape(geom))[crop]

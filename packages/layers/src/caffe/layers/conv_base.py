"""What Convolution, Deconvolution and Im2col share (Caffe's base_conv_layer and util/im2col).

Geometry. A convolution maps an "image side" blob (N, C_in, *S_im) to a "column side"
blob (N, C_out, *S_col): Convolution has bottom = image side, top = column side;
Deconvolution is the transpose (top = image side, bottom = column side), exactly
as Caffe's reverse_dimensions(). On each spatial axis
    S_col = (S_im + 2 * pad - (dilation * (kernel - 1) + 1)) // stride + 1.
The weight blob is (C_out, C_in / group, *kernel); with group > 1 each group is an
independent convolution over its own slice of channels.

Plans (BaseConvolutionLayer.plan picks one per call):
- "1x1", "direct", "dense", "blocked": the CPU's (caffe.layers.conv_cpu): Caffe's is_1x1 as
  a plain GEMM on the blobs; a direct kernel for depthwise / small-group layers; direct AVX2
  kernels for float32 stride-1 layers where they measure faster (conv_cpu.dense_rule:
  CIFAR10-quick, LeNet conv2's forward, GoogLeNet's 5x5); and a lowering cut into
  cache-sized blocks for the rest of the 2-D layers.
- "batched": the array-module-generic path, the GPU's (CuPy) and the one for N-d
  convolutions and force_nd_im2col. A whole batch is lowered at once (im2col in
  "batch layout": the column buffer is (C_in * prod(kernel), N * P) with the images
  side by side), so each group runs ONE large GEMM; the GEMM's (C_out, N * P) result
  is transposed into the (N, C_out, P) top in the same pass that adds the bias. Above
  COL_BUFFER_LIMIT elements the batch goes in chunks. Its forward keeps its column
  buffer for the backward's weight gradient when the batch is one chunk.
CPU_PATHS = False sends every call down the batched path (the benchmarks compare).
Scratch buffers are reused across iterations and shared by the layers of a thread.

GPU: the batched path runs with xp = cupy. The lowering is conv_device's (one gather for
im2col, one scatter-add for col2im, whatever the kernel size), and the groups of a layer go
in ONE batched matmul (depthwise included: no GEMM per channel). The exact short-K forward
(EXACT_FORWARD_MAX_K) stays float64 on the device too: the lowering gathers straight from a
float64 copy of the image, and with K <= 32 the GEMM reads each column entry once for C_out
multiply-adds, so it is bound by memory (twice float32's bytes), not by the GPU's float64 rate.
Checked against the CuPy stand-in only (no GPU here): figures on a GPU are gpu_check.sh's.
"""
from __future__ import annotations

import math
import os
import threading
from itertools import product

import numpy as np

from caffe.blob import Blob
from caffe.layers import filler
from caffe.layers.layer import Layer, dtype_of

# (OMP_WAIT_POLICY / OPENBLAS_THREAD_TIMEOUT are set in caffe/__init__.py, before any thread pool loads.)

from caffe.layers import conv_cpu, conv_device

_k = conv_cpu._k  # the compiled lowering the CPU plans use (None without the build)

# The CPU plans (1x1, direct, blocked); False runs the generic batched path everywhere.
CPU_PATHS = True

# Largest column buffer (elements) the batched path lowers at once; bigger batches go in chunks.
COL_BUFFER_LIMIT = 1 << 21

# Forward GEMMs whose dot products are at most this long accumulate in float64 (see gemm_forward).
EXACT_FORWARD_MAX_K = 32

# The forward epilogue's activations (BaseConvolutionLayer.epilogue; the codes of kernels.lowering's Act).
ACT_NONE, ACT_RELU, ACT_CLIP = 0, 1, 2

_WORKSPACE = threading.local()


def apply_epilogue(xp, out, act) -> None:
    """out = act(out) in place, as the ReLU / Clip layer computes it on that device (the batched path and
    a folded InnerProduct's activation; the CPU plans fuse it into their stores: conv_cpu)."""
    code, a, b = act
    if code == ACT_RELU:
        if a == 0:
            if xp is np:  # the CPU ReLU layer's kernel (and conv_cpu's stores): x <= 0 ? 0 : x, NaN stays NaN
                np.copyto(out, 0, where=out <= 0)
            else:  # the layer's forward_xp: max(x, 0), NaN stays NaN
                xp.maximum(out, 0, out=out)
        else:
            xp.multiply(out, xp.where(out > 0, 1.0, a).astype(out.dtype, copy=False), out=out)
    elif code == ACT_CLIP:
        xp.clip(out, a, b, out=out)
    elif code != ACT_NONE:
        raise ValueError(f"unknown activation code {code}")


def _shared_workspace() -> dict:
    """This thread's scratch buffers, shared by all its convolution layers (they run one at a time)."""
    ws = getattr(_WORKSPACE, "buffers", None)
    if ws is None:
        ws = _WORKSPACE.buffers = {}
    return ws


class ConvGeometry:
    """Kernel, stride, pad, dilation per spatial axis; image-side and column-side spatial shapes."""
    __slots__ = ("kernel", "stride", "pad", "dilation", "im_shape", "col_shape")

    def __init__(self, kernel, stride, pad, dilation, im_shape, col_shape):
        self.kernel = tuple(kernel)
        self.stride = tuple(stride)
        self.pad = tuple(pad)
        self.dilation = tuple(dilation)
        self.im_shape = tuple(im_shape)
        self.col_shape = tuple(col_shape)

    @property
    def kernel_count(self) -> int:
        return math.prod(self.kernel)

    @property
    def col_count(self) -> int:
        return math.prod(self.col_shape)

    @property
    def im_count(self) -> int:
        return math.prod(self.im_shape)


def kernel_extent(k: int, d: int) -> int:
    return d * (k - 1) + 1


# -- the spatial parameters of a ConvolutionParameter ----------------------------------------

def _spatial_values(layer, p, name, h_name, w_name, nsp, default):
    """One value per spatial axis from a repeated field (once, or once per axis) or its _h/_w pair."""
    if h_name is not None and (p.HasField(h_name) or p.HasField(w_name)):
        if nsp != 2:
            raise layer.error(f"convolution_param.{h_name} & {w_name} can only be used for 2D "
                              f"convolution ({nsp} spatial axes here)")
        if len(getattr(p, name)):
            raise layer.error(f"Either convolution_param.{name} or {h_name}/{w_name} should be "
                              f"specified; not both")
        return (int(getattr(p, h_name)), int(getattr(p, w_name)))
    values = [int(v) for v in getattr(p, name)]
    allowed = (1, nsp) if default is None else (0, 1, nsp)
    if len(values) not in allowed:
        raise layer.error(f"convolution_param.{name} must be specified once, or once per spatial "
                          f"dimension ({name} specified {len(values)} times; {nsp} spatial dims)")
    if not values:
        return (default,) * nsp
    return tuple(values[0] if len(values) == 1 else values[i] for i in range(nsp))


def parse_conv_spatial(layer, bottom0):
    """channel_axis, kernel, stride, pad, dilation from layer.layer_param.convolution_param.

    Caffe's BaseConvolutionLayer::LayerSetUp checks, with errors that name the field.
    """
    p = layer.layer_param.convolution_param
    try:
        axis = bottom0.canonical_axis_index(p.axis)
    except IndexError:
        raise layer.error(f"convolution_param.axis {p.axis} is out of range for bottom[0] with "
                          f"shape {bottom0.shape}") from None
    nsp = bottom0.num_axes - axis - 1
    kernel = _spatial_values(layer, p, "kernel_size", "kernel_h", "kernel_w", nsp, None)
    stride = _spatial_values(layer, p, "stride", "stride_h", "stride_w", nsp, 1)
    pad = _spatial_values(layer, p, "pad", "pad_h", "pad_w", nsp, 0)
    dilation = _spatial_values(layer, p, "dilation", None, None, nsp, 1)
    if any(k <= 0 for k in kernel):
        raise layer.error(f"Filter dimensions must be nonzero: convolution_param.kernel_size "
                          f"(or kernel_h/kernel_w) gives {kernel}")
    if any(s <= 0 for s in stride):
        raise layer.error(f"Stride dimensions must be nonzero: convolution_param.stride "
                          f"(or stride_h/stride_w) gives {stride}")
    if any(d <= 0 for d in dilation):
        raise layer.error(f"Dilation must be nonzero: convolution_param.dilation gives {dilation}")
    return axis, nsp, kernel, stride, pad, dilation


def conv_output_shape(layer, in_shape, kernel, stride, pad, dilation, blob_shape):
    """Caffe's ConvolutionLayer::compute_output_shape, refusing kernels larger than the padded input."""
    out = []
    for i, (n, k, s, p, d) in enumerate(zip(in_shape, kernel, stride, pad, dilation)):
        ext = kernel_extent(k, d)
        if n + 2 * p < ext:
            raise layer.error(f"kernel extent {ext} (kernel_size {k}, dilation {d}) exceeds the padded "
                              f"input size {n} + 2*{p} on spatial axis {i} of bottom shape {blob_shape}")
        out.append((n + 2 * p - ext) // s + 1)
    return tuple(out)


def adopt_param_shape(layer, blob, shape, what):
    """Check a loaded parameter blob's shape; a legacy 4-d (num, channels, height, width) blob whose
    dims are `shape` left-padded with ones (old caffemodels) is reshaped to `shape`."""
    shape = tuple(shape)
    if blob.shape == shape:
        return
    legacy = (1,) * (4 - len(shape)) + shape if len(shape) <= 4 else None
    if blob.num_axes == 4 and blob.shape == legacy:
        blob.reshape(shape)
        return
    raise layer.error(f"Incorrect {what} shape: expected shape {shape}; instead, shape was {blob.shape}")


# -- im2col / col2im -------------------------------------------------------------------------

def _fast_2d(xp, geom, arr, force_nd) -> bool:
    return (xp is np and _k is not None and not force_nd and len(geom.kernel) == 2
            and arr.dtype in (np.float32, np.float64))


def _fast_layout(xp, a, b) -> bool:
    return (xp is np and _k is not None and a.dtype == b.dtype and a.dtype in (np.float32, np.float64)
            and a.flags.c_contiguous and b.flags.c_contiguous)


def _regroup(xp, rows, out, bias) -> None:
    """out (nb, C_out, P) = rows (C_out, nb * P, or per group (g, C_out / g, nb * P)) regrouped per image,
    plus bias (C_out) in the precision the caller gave it; the sum is rounded once into out."""
    nb, c_out, P = out.shape
    src = rows.reshape(c_out, nb, P).transpose(1, 0, 2)
    if bias is None:
        out[...] = src
    else:
        xp.add(src, bias.reshape(1, c_out, 1), out=out)


def _strides(layout, nb, rows, P):
    # batch layout: col[r, n * P + p]; image layout: col[n, r, p]
    return (nb * P, P) if layout == "batch" else (P, rows * P)


def _slices(geom, offsets):
    return tuple(slice(o * d, o * d + s * (n - 1) + 1, s)
                 for o, d, s, n in zip(offsets, geom.dilation, geom.stride, geom.col_shape))


def im2col(xp, im, col, geom: ConvGeometry, layout: str = "batch", force_nd: bool = False) -> None:
    """Lower im (nb, C, *im_shape) into col: (C*K, nb*P) for "batch", (nb, C*K, P) for "image"."""
    if xp is not np:  # the device: one gather, not one launch per kernel offset (conv_device)
        conv_device.im2col(xp, im, col, geom, layout)
        return
    nb, C = im.shape[0], im.shape[1]
    K, P = geom.kernel_count, geom.col_count
    if _fast_2d(xp, geom, im, force_nd) and im.flags.c_contiguous and col.flags.c_contiguous:
        rs, ns = _strides(layout, nb, C * K, P)
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = geom.kernel, geom.stride, geom.pad, geom.dilation
        _k.im2col_2d(im.reshape(-1), col.reshape(-1), nb, C, geom.im_shape[0], geom.im_shape[1],
                     kh, kw, ph, pw, sh, sw, dh, dw, geom.col_shape[0], geom.col_shape[1], rs, ns)
        return
    # Generic N-d path (NumPy): one strided slice of the zero-padded input per kernel offset.
    # Kept simple: it is the reference for the device lowering and the path for N-d kernels.
    padded_shape = (nb, C) + tuple(n + 2 * p for n, p in zip(geom.im_shape, geom.pad))
    if any(geom.pad):
        padded = xp.zeros(padded_shape, dtype=im.dtype)
        padded[(slice(None), slice(None)) + tuple(slice(p, p + n) for n, p in
                                                  zip(geom.im_shape, geom.pad))] = im
    else:
        padded = im
    if layout == "batch":
        cv = col.reshape((C, K, nb) + geom.col_shape)
    else:
        cv = col.reshape((nb, C, K) + geom.col_shape)
    for kidx, offsets in enumerate(product(*(range(k) for k in geom.kernel))):
        src = padded[(slice(None), slice(None)) + _slices(geom, offsets)]
        if layout == "batch":
            cv[:, kidx] = src.swapaxes(0, 1)
        else:
            cv[:, :, kidx] = src


def col2im(xp, col, im, geom: ConvGeometry, layout: str = "batch", force_nd: bool = False) -> None:
    """Overwrite im (nb, C, *im_shape) with the sum of every column entry that reads each pixel."""
    if xp is not np:  # the device: one scatter-add (conv_device)
        conv_device.col2im(xp, col, im, geom, layout)
        return
    nb, C = im.shape[0], im.shape[1]
    K, P = geom.kernel_count, geom.col_count
    if _fast_2d(xp, geom, im, force_nd) and im.flags.c_contiguous and col.flags.c_contiguous:
        rs, ns = _strides(layout, nb, C * K, P)
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = geom.kernel, geom.stride, geom.pad, geom.dilation
        _k.col2im_2d(col.reshape(-1), im.reshape(-1), nb, C, geom.im_shape[0], geom.im_shape[1],
                     kh, kw, ph, pw, sh, sw, dh, dw, geom.col_shape[0], geom.col_shape[1], rs, ns)
        return
    padded_shape = (nb, C) + tuple(n + 2 * p for n, p in zip(geom.im_shape, geom.pad))
    padded = xp.zeros(padded_shape, dtype=im.dtype)
    if layout == "batch":
        cv = col.reshape((C, K, nb) + geom.col_shape)
    else:
        cv = col.reshape((nb, C, K) + geom.col_shape)
    for kidx, offsets in enumerate(product(*(range(k) for k in geom.kernel))):
        # For one kernel offset distinct output positions read distinct pixels: no duplicate
        # indices within this slice update, so += is exact on NumPy and CuPy alike.
        dst = padded[(slice(None), slice(None)) + _slices(geom, offsets)]
        dst += cv[:, kidx].swapaxes(0, 1) if layout == "batch" else cv[:, :, kidx]
    im[...] = padded[(slice(None), slice(None)) + tuple(slice(p, p + n) for n, p in
                                                        zip(geom.im_shape, geom.pad))]


# -- the layer base ----------------------------------------------------------------------------

class BaseConvolutionLayer(Layer):
    """Convolution's and Deconvolution's setup, reshape, plans and batched GEMM primitives."""
    min_bottom_blobs = 1
    min_top_blobs = 1
    equal_num_bottom_top_blobs = True
    reverse_dimensions = False  # Deconvolution: the image side is the top

    # -- setup ---------------------------------------------------------------------------
    def layer_setup(self, bottom, top):
        p = self.layer_param.convolution_param
        (self.channel_axis, self.num_spatial_axes, self.kernel_shape, self.stride, self.pad,
         self.dilation) = parse_conv_spatial(self, bottom[0])
        self.force_nd_im2col = bool(p.force_nd_im2col)
        self.channels = bottom[0].shape[self.channel_axis]
        self.num_output = int(p.num_output)
        self.group = int(p.group)
        self.check(self.num_output > 0, f"convolution_param.num_output must be positive, got {p.num_output}")
        self.check(self.group > 0, f"convolution_param.group must be positive, got {p.group}")
        self.check(self.channels % self.group == 0,
                   f"convolution_param.group {self.group} must divide the {self.channels} input channels "
                   f"of bottom[0] (shape {bottom[0].shape}, channel axis {self.channel_axis})")
        self.check(self.num_output % self.group == 0,
                   f"Number of output should be multiples of group: convolution_param.num_output "
                   f"{self.num_output} is not a multiple of convolution_param.group {self.group}")
        if self.reverse_dimensions:
            self.conv_out_channels, self.conv_in_channels = self.channels, self.num_output
        else:
            self.conv_out_channels, self.conv_in_channels = self.num_output, self.channels
        weight_shape = (self.conv_out_channels, self.conv_in_channels // self.group) + self.kernel_shape
        self.bias_term = bool(p.bias_term)
        bias_shape = (self.num_output,)
        if self.blobs:  # weights given with the layer (a caffemodel): keep them
            expected = 1 + self.bias_term
            self.check(len(self.blobs) == expected,
                       f"Incorrect number of weight blobs: expected {expected} "
                       f"(bias_term {self.bias_term}), got {len(self.blobs)}")
            adopt_param_shape(self, self.blobs[0], weight_shape, "weight")
            if self.bias_term:
                adopt_param_shape(self, self.blobs[1], bias_shape, "bias")
        else:
            dtype = dtype_of(bottom)
            self.blobs = [self._filled(weight_shape, dtype, p.weight_filler, "weight_filler")]
            if self.bias_term:
                self.blobs.append(self._filled(bias_shape, dtype, p.bias_filler, "bias_filler"))
        for i in range(len(self.blobs)):
            self.set_param_propagate_down(i, True)
        self.kernel_dim = self.conv_in_channels // self.group * math.prod(self.kernel_shape)
        # Caffe's is_1x1: the bottom already is the column buffer (no lowering)
        self.is_1x1 = all(k == 1 and s == 1 and q == 0
                          for k, s, q in zip(self.kernel_shape, self.stride, self.pad))
        self._buffers = {}
        self._kept_col = {}
        self._blocks = {}
        # An activation applied to the forward's output in the same pass as the bias (inference folding's
        # Convolution + ReLU/Clip, set on its clone): None, or (code, a, b) with the codes of
        # kernels.lowering (ACT_RELU: negative slope a; ACT_CLIP: [a, b]). Forward only: a layer with an
        # epilogue has no backward (folding never runs in a net that takes gradients).
        self.epilogue = None
        self._shape_key = None
        self._top_shape = None

    def _filled(self, shape, dtype, filler_param, field):
        blob = Blob(shape, dtype=dtype)
        try:
            filler.fill(blob, filler_param)
        except filler.FillerError as e:
            raise self.error(f"convolution_param.{field}: {e}") from None
        return blob

    # -- reshape ---------------------------------------------------------------------------
    def compute_output_shape(self, in_shape, blob_shape):
        raise NotImplementedError

    def reshape(self, bottom, top):
        b0 = bottom[0]
        # Called before every forward: skip the work when nothing changed since the last call.
        key = (tuple(b.shape for b in bottom), b0.dtype)
        if key == self._shape_key and all(t.shape == self._top_shape for t in top):
            return
        axis, nsp = self.channel_axis, self.num_spatial_axes
        self.check(b0.num_axes == axis + 1 + nsp,
                   f"bottom num_axes may not change: bottom[0] has shape {b0.shape}, the layer was "
                   f"set up for {axis + 1 + nsp} axes")
        self.check(b0.shape[axis] == self.channels,
                   f"Input size incompatible with convolution kernel: bottom[0] (shape {b0.shape}) has "
                   f"{b0.shape[axis]} channels on axis {axis}, the layer was set up for {self.channels}")
        for i, b in enumerate(bottom[1:], 1):
            self.check(b.shape == b0.shape, f"All inputs must have the same shape: bottom[{i}] has "
                                            f"shape {b.shape}, bottom[0] has shape {b0.shape}")
        self.num = math.prod(b0.shape[:axis])
        in_spatial = b0.shape[axis + 1:]
        out_spatial = self.compute_output_shape(in_spatial, b0.shape)
        top_shape = b0.shape[:axis] + (self.num_output,) + out_spatial
        for t in top:
            t.reshape(top_shape)
        self._top_shape = top_shape
        im_spatial, col_spatial = ((out_spatial, in_spatial) if self.reverse_dimensions
                                   else (in_spatial, out_spatial))
        self.geom = ConvGeometry(self.kernel_shape, self.stride, self.pad, self.dilation,
                                 im_spatial, col_spatial)
        rows = self.kernel_dim * self.group
        per_image = max(1, rows * self.geom.col_count, self.conv_out_channels * self.geom.col_count)
        self.chunk = max(1, min(self.num, COL_BUFFER_LIMIT // per_image))
        self._kept_col.clear()
        self._blocks.clear()
        self._shape_key = key

    def chunks(self):
        return [(n0, min(n0 + self.chunk, self.num)) for n0 in range(0, self.num, self.chunk)]

    # -- plans -------------------------------------------------------------------------------
    def plan(self, xp, dtype) -> str:
        """"1x1", "direct", "dense" or "blocked" (the CPU's, conv_cpu) or "batched" (generic: GPU, N-d)."""
        if not (CPU_PATHS and xp is np and conv_cpu.fits(dtype)):
            return "batched"
        if self.is_1x1:
            return "1x1"
        if self.num_spatial_axes != 2 or self.force_nd_im2col:
            return "batched"
        if conv_cpu.direct_fits(self):
            return "direct"
        return "dense" if conv_cpu.dense_fits(self, dtype) else "blocked"

    def exact_forward(self, dtype) -> bool:
        """A float32 forward with dot products of at most EXACT_FORWARD_MAX_K terms goes in float64."""
        return np.dtype(dtype) == np.float32 and self.kernel_dim <= EXACT_FORWARD_MAX_K

    def cpu_blocks(self, num, dtype, exact):
        """The blocked plan's blocks for num images (cached until the next reshape)."""
        key = (num, np.dtype(dtype).str, exact, conv_cpu.tunables())
        b = self._blocks.get(key)
        if b is None:
            b = self._blocks[key] = conv_cpu.Blocks(self, num, dtype, exact)
        return b

    def conv_forward(self, xp, im, out, weight, bias=None, keep=None):
        """out (N, C_col, P) = the convolution of im (N, C_im, *S_im) + bias. `keep`: a key under which
        the batched path keeps its column buffer for conv_backward (one-chunk batches only)."""
        plan = self.plan(xp, out.dtype)
        act = self.epilogue
        if plan != "batched":
            key = (keep, xp.__name__)
            self._kept_col.pop(key, None)
            if plan == "direct":
                conv_cpu.direct_forward(self, im, out, weight, bias, act)
                return
            if plan == "dense":
                conv_cpu.dense_forward(self, im, out, weight, bias, act)
                return
            col = conv_cpu.blocked_forward(self, im, out, weight, bias,
                                           keep=("col", keep) if keep is not None else None, act=act)
            if col is not None:
                self._kept_col[key] = (plan, col)
            return
        self._conv_forward_batched(xp, plan, im, out, weight, bias, keep)
        if act is not None:  # the batched path's GEMMs write the blob: the activation after them
            apply_epilogue(xp, out, act)

    def _conv_forward_batched(self, xp, plan, im, out, weight, bias, keep):
        single = self.chunk >= self.num
        col = None
        if xp is not np and self.exact_forward(out.dtype):
            # the device's exact forward lowers straight into float64 (the cast rides on the gather's copy);
            # that buffer is not kept: the backward lowers again in the blob's dtype
            single = False
        for n0, n1 in self.chunks():
            col = self.lower(xp, im[n0:n1], ("col", keep) if single and keep is not None else "col",
                             exact=xp is not np and self.exact_forward(out.dtype))
            self.gemm_forward(xp, col, weight, out[n0:n1], bias)
        if single and keep is not None and col is not None:
            self._kept_col[(keep, xp.__name__)] = (plan, col)

    def conv_backward(self, xp, dout, weight, im=None, weight_diff=None, im_diff=None, bias_diff=None,
                      fwd_out=None, kept=None):
        """From dout (N, C_col, P): weight_diff += dout (x) im, im_diff = W^T * dout (overwritten),
        bias_diff += the sum of dout, fwd_out = W * im (no bias); each only when given."""
        if weight_diff is None and im_diff is None and bias_diff is None and fwd_out is None:
            return
        plan = self.plan(xp, dout.dtype)
        kept_plan, kept_col = self._kept_col.pop((kept, xp.__name__), (None, None)) if kept is not None \
            else (None, None)
        if kept_plan != plan:  # kept by another plan's forward (CPU_PATHS changed): not this layout
            kept_col = None
        if plan == "direct":
            conv_cpu.direct_backward(self, dout, weight, im, weight_diff, im_diff, bias_diff, fwd_out)
            return
        if plan == "dense":
            conv_cpu.dense_backward(self, dout, weight, im, weight_diff, im_diff, bias_diff, fwd_out)
            return
        if plan != "batched":
            conv_cpu.blocked_backward(self, dout, weight, im, weight_diff, im_diff, bias_diff, fwd_out,
                                      kept=kept_col)
            return
        for n0, n1 in self.chunks():
            rows = None
            if weight_diff is not None or im_diff is not None or bias_diff is not None:
                rows = self.to_rows(xp, dout[n0:n1])
            if bias_diff is not None:
                bias_diff += xp.matmul(rows, self.ones(xp, rows.shape[1], rows.dtype),
                                       out=self.buffer(xp, "bgrad", (rows.shape[0],), rows.dtype))
            col = None
            if weight_diff is not None or fwd_out is not None:
                col = kept_col if kept_col is not None else self.lower(xp, im[n0:n1])
            if weight_diff is not None:
                self.gemm_weight(xp, col, rows, weight_diff)
            if fwd_out is not None:
                self.gemm_forward(xp, col, weight, fwd_out[n0:n1])
            if im_diff is not None:
                self.unlower(xp, self.gemm_backward(xp, rows, weight), im_diff[n0:n1])

    # -- scratch buffers ---------------------------------------------------------------------
    def buffer(self, xp, name, shape, dtype):
        """A reusable scratch array (grown on demand, never shrunk; one per name and array module).

        Buffers named by a tuple (a column buffer kept from forward for backward) belong to this
        layer; all others only live during one call, so every layer of this thread shares them:
        a net holds one set of scratch buffers, not one per convolution (Caffe's memory, not more).
        """
        size = math.prod(shape)
        key = (name, xp.__name__, np.dtype(dtype).str)
        store = self._buffers if isinstance(name, tuple) else _shared_workspace()
        buf = store.get(key)
        if buf is None or buf.size < size:
            buf = store[key] = xp.empty(max(size, 1), dtype=dtype)
        return buf[:size].reshape(shape)

    def ones(self, xp, n, dtype):
        key = ("ones", xp.__name__, np.dtype(dtype).str)
        buf = self._buffers.get(key)
        if buf is None or buf.size < n:
            buf = self._buffers[key] = xp.ones(max(n, 1), dtype=dtype)
        return buf[:n]

    # -- the batched primitives (chunk of nb images) ----------------------------------------------
    def lower(self, xp, im, name="col", exact=False):
        """im2col of the image-side chunk im (nb, C_in, *S_im) -> (C_in * K, nb * P) column buffer
        (float64 with exact: the device's exact forward)."""
        nb = im.shape[0]
        dtype, name = (np.float64, name + "64" if isinstance(name, str) else name) if exact else (im.dtype, name)
        col = self.buffer(xp, name, (self.kernel_dim * self.group, nb * self.geom.col_count), dtype)
        im2col(xp, im, col, self.geom, "batch", self.force_nd_im2col)
        return col

    def to_rows(self, xp, out):
        """The column-side chunk out (nb, C_out, P) as (C_out, nb * P): the GEMMs' layout."""
        nb, c, P = out.shape
        if nb == 1:
            return out[0]
        rows = self.buffer(xp, "rows", (c, nb * P), out.dtype)
        if _fast_layout(xp, out, rows):
            _k.batch_to_rows(out.reshape(-1), rows.reshape(-1), nb, c, P)
        else:
            rows.reshape(c, nb, P)[...] = out.transpose(1, 0, 2)
        return rows

    def gemm_forward(self, xp, col, weight, out, bias=None):
        """out (nb, C_out, P) = W_g @ col_g per group (+ bias), written straight into out."""
        nb, c_out, P = out.shape
        g, og, kd = self.group, c_out // self.group, self.kernel_dim
        w3 = weight.reshape(g, og, kd)
        if xp is not np:
            self._gemm_forward_device(xp, col, w3, out, bias)
            return
        if self.exact_forward(out.dtype):
            # Short dot products are cheap to take in float64 (bias included) and round once: the outputs
            # are then the correctly rounded values, so max pooling's near-ties fall as in exact arithmetic
            # (and as in BVLC Caffe; sgemm's own rounding of LeNet's conv1 flipped some, and training left
            # Caffe's trajectory within 10 iterations).
            col64 = self.buffer(xp, "col64", col.shape, np.float64)
            col64[...] = col
            res64 = self.buffer(xp, "gemm64", (c_out, nb * P), np.float64)
            w64 = w3.astype(np.float64)
            for gi in range(g):
                xp.matmul(w64[gi], col64[gi * kd:(gi + 1) * kd], out=res64[gi * og:(gi + 1) * og])
            if bias is not None:
                res64 += bias.astype(np.float64).reshape(c_out, 1)
            out[...] = res64.reshape(c_out, nb, P).transpose(1, 0, 2)
            return
        res = out[0] if nb == 1 else self.buffer(xp, "gemm", (c_out, nb * P), out.dtype)
        for gi in range(g):
            xp.matmul(w3[gi], col[gi * kd:(gi + 1) * kd], out=res[gi * og:(gi + 1) * og])
        if nb == 1:
            if bias is not None:
                res += bias.reshape(c_out, 1)
            return
        if _fast_layout(xp, res, out) and (bias is None or bias.dtype == res.dtype):
            _k.rows_to_batch(res.reshape(-1), out.reshape(-1), bias, nb, c_out, P)
            return
        _regroup(xp, res, out, bias)

    def _gemm_forward_device(self, xp, col, w3, out, bias):
        """gemm_forward on the device: every group in ONE batched matmul (a depthwise layer too); the exact
        forward (col already float64, see lower) in float64 with the bias, rounded once into out."""
        nb, c_out, P = out.shape
        g, og, kd = w3.shape
        if self.exact_forward(out.dtype):
            col64 = col if col.dtype == np.float64 else col.astype(np.float64)  # (Deconvolution's backward)
            res = self.buffer(xp, "gemm64", (g, og, nb * P), np.float64)
            xp.matmul(w3.astype(np.float64), col64.reshape(g, kd, nb * P), out=res)
            # the bias added in float64, the sum rounded once into out
            _regroup(xp, res, out, None if bias is None else bias.astype(np.float64))
            return
        res = out[0].reshape(g, og, P) if nb == 1 else self.buffer(xp, "gemm", (g, og, nb * P), out.dtype)
        xp.matmul(w3, col.reshape(g, kd, nb * P), out=res)
        if nb == 1:
            if bias is not None:
                out[0] += bias.reshape(c_out, 1)
            return
        _regroup(xp, res, out, bias)

    def gemm_backward(self, xp, rows, weight):
        """The column buffer W_g^T @ rows_g per group: the gradient (or deconvolution) before col2im."""
        g, kd = self.group, self.kernel_dim
        og = rows.shape[0] // g
        w3 = weight.reshape(g, og, kd)
        dcol = self.buffer(xp, "dcol", (kd * g, rows.shape[1]), rows.dtype)
        if xp is not np:  # one batched matmul over the groups
            xp.matmul(w3.transpose(0, 2, 1), rows.reshape(g, og, -1), out=dcol.reshape(g, kd, -1))
            return dcol
        for gi in range(g):
            xp.matmul(w3[gi].T, rows[gi * og:(gi + 1) * og], out=dcol[gi * kd:(gi + 1) * kd])
        return dcol

    def gemm_weight(self, xp, col, rows, weight_diff):
        """weight_diff_g += rows_g @ col_g^T per group (Caffe accumulates parameter gradients)."""
        g, kd = self.group, self.kernel_dim
        og = rows.shape[0] // g
        wd3 = weight_diff.reshape(g, og, kd)
        if xp is not np:  # one batched matmul over the groups
            tmp = self.buffer(xp, "wgrad", (g, og, kd), weight_diff.dtype)
            xp.matmul(rows.reshape(g, og, -1), col.reshape(g, kd, -1).transpose(0, 2, 1), out=tmp)
            wd3 += tmp
            return
        tmp = self.buffer(xp, "wgrad", (og, kd), weight_diff.dtype)
        for gi in range(g):
            xp.matmul(rows[gi * og:(gi + 1) * og], col[gi * kd:(gi + 1) * kd].T, out=tmp)
            wd3[gi] += tmp

    def unlower(self, xp, col, im):
        """col2im of a column buffer into the image-side chunk im (overwritten)."""
        col2im(xp, col, im, self.geom, "batch", self.force_nd_im2col)

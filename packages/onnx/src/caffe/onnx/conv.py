"""Convolution, Deconvolution, InnerProduct and Embed: the layers with weight matrices."""
from __future__ import annotations

import numpy as np

from caffe.layers.conv_base import parse_conv_spatial
from caffe.onnx.registry import converter


class _ShapeOnly:
    """The two Blob methods parse_conv_spatial reads, over a bare shape."""

    def __init__(self, shape):
        self.shape = tuple(shape)
        self.num_axes = len(self.shape)

    def canonical_axis_index(self, axis):
        if not -self.num_axes <= axis < self.num_axes:
            raise IndexError(axis)
        return axis % self.num_axes


def _conv_geometry(ctx):
    axis, nsp, kernel, stride, pad, dilation = parse_conv_spatial(ctx.layer, _ShapeOnly(ctx.bottom_shapes[0]))
    return axis, kernel, stride, pad, dilation


def _check_conv(ctx):
    axis = _conv_geometry(ctx)[0]
    if axis != 1:
        return (f"convolution_param.axis {ctx.param.convolution_param.axis} puts the channels on axis {axis}; "
                f"ONNX convolves with channels on axis 1")
    return None


@converter("Convolution", "Deconvolution", check=_check_conv)
def convolution(ctx):
    # ONNX Conv / ConvTranspose have Caffe's weight layouts: (C_out, C_in / group, *k) for Conv and
    # (C_in, C_out / group, *k) for ConvTranspose, and Caffe's output sizes with symmetric pads.
    _, kernel, stride, pad, dilation = _conv_geometry(ctx)
    p = ctx.param.convolution_param
    inputs = [ctx.const(ctx.params[0], "weight")]
    if p.bias_term:
        inputs.append(ctx.const(ctx.params[1].reshape(-1), "bias"))
    op = "Conv" if ctx.type == "Convolution" else "ConvTranspose"
    for x, top in zip(ctx.bottoms, ctx.tops):  # Caffe convolves each bottom with the same weights
        ctx.node(op, [x] + inputs, out=top, kernel_shape=list(kernel), strides=list(stride),
                 pads=list(pad) * 2, dilations=list(dilation), group=int(p.group))


@converter("InnerProduct")
def inner_product(ctx):
    p = ctx.param.inner_product_param
    shape = ctx.bottom_shapes[0]
    axis = p.axis % len(shape)
    k = int(np.prod(shape[axis:], dtype=np.int64))
    w = ctx.params[0].reshape((k, -1) if p.transpose else (-1, k))
    x = ctx.bottoms[0]
    bias = ctx.const(ctx.params[1].reshape(-1), "bias") if p.bias_term else None
    if axis == 1:
        if len(shape) != 2:
            x = ctx.node("Flatten", [x], what="flatten", axis=1)
        inputs = [x, ctx.const(w, "weight")] + ([bias] if bias else [])
        ctx.node("Gemm", inputs, out=ctx.tops[0], transB=0 if p.transpose else 1)
        return
    # Other axes: (*shape[:axis], K) @ W^T, broadcast over the leading axes.
    x = ctx.reshape(x, [0] * axis + [k], what="flatten")
    wt = ctx.const(w if p.transpose else np.ascontiguousarray(w.T), "weight")
    if bias is None:
        ctx.node("MatMul", [x, wt], out=ctx.tops[0])
    else:
        ctx.node("Add", [ctx.node("MatMul", [x, wt], what="matmul"), bias], out=ctx.tops[0])


@converter("Embed")
def embed(ctx):
    p = ctx.param.embed_param
    # Caffe reads the indices as floats and uses their integer value.
    idx = ctx.node("Cast", [ctx.bottoms[0]], what="index", to=7)  # INT64
    table = ctx.const(ctx.params[0], "weight")
    if not p.bias_term:
        ctx.node("Gather", [table, idx], out=ctx.tops[0], axis=0)
        return
    rows = ctx.node("Gather", [table, idx], what="gather", axis=0)
    ctx.node("Add", [rows, ctx.const(ctx.params[1].reshape(-1), "bias")], out=ctx.tops[0])

"""LRN, BatchNorm, Scale, Bias and MVN."""
from __future__ import annotations

import numpy as np

from caffe.onnx.registry import converter

ACROSS_CHANNELS, WITHIN_CHANNEL = 0, 1


@converter("LRN")
def lrn(ctx):
    p = ctx.param.lrn_param
    x, top = ctx.bottoms[0], ctx.tops[0]
    n = int(p.local_size)
    if p.norm_region == ACROSS_CHANNELS:  # ONNX's LRN is Caffe's: x / (k + alpha / n * window sum)^beta
        ctx.node("LRN", [x], out=top, size=n, alpha=float(p.alpha), beta=float(p.beta), bias=float(p.k))
        return
    # WITHIN_CHANNEL (Caffe's own composition): x * (1 + alpha * boxmean(x^2))^-beta, the n x n box
    # zero-padded, so its mean always divides by n^2.
    r = (n - 1) // 2
    sq = ctx.node("Mul", [x, x], what="square")
    box = ctx.node("AveragePool", [sq], what="box", kernel_shape=[n, n], strides=[1, 1], pads=[r, r, r, r],
                   count_include_pad=1)
    scale = ctx.scalar_op("Add", ctx.scalar_op("Mul", box, float(p.alpha), "alpha"), 1.0, "one")
    powed = ctx.scalar_op("Pow", scale, -float(p.beta), "neg_beta")
    ctx.node("Mul", [x, powed], out=top)


def _batch_norm_stats(ctx):
    """(mean, var) in use at global statistics: blobs[0] and blobs[1] over the scale factor blobs[2]."""
    mean, var, factor = (np.asarray(a, dtype=np.float64).reshape(-1) for a in ctx.params)
    f = 0.0 if factor[0] == 0 else 1.0 / factor[0]
    return mean * f, var * f


def uses_global_stats(ctx) -> bool:
    p = ctx.param.batch_norm_param
    return p.use_global_stats if p.HasField("use_global_stats") else ctx.param.phase == 1


def can_fold_scale(bn, sc) -> bool:
    """A Scale right after a BatchNorm (global statistics) on its output, one learned factor per channel."""
    p = sc.param.scale_param
    shape = bn.top_shapes[0]
    return (uses_global_stats(bn) and len(shape) >= 2 and len(sc.bottoms) == 1 and sc.bottoms[0] == bn.tops[0]
            and len(sc.layer.blobs) == 1 + bool(p.bias_term) and tuple(sc.layer.blobs[0].shape) == (shape[1],)
            and p.axis % len(shape) == 1)


@converter("BatchNorm")
def batch_norm(ctx):
    p = ctx.param.batch_norm_param
    x, top = ctx.bottoms[0], ctx.tops[0]
    shape = ctx.bottom_shapes[0]
    eps = float(p.eps)
    if uses_global_stats(ctx):
        mean, var = _batch_norm_stats(ctx)
        if len(shape) >= 2:
            c = shape[1]
            gamma, beta, doc = np.ones(c), np.zeros(c), None
            if ctx.fold is not None:  # the Scale layer that follows, in the same node
                sc = ctx.fold
                gamma = sc.params[0].reshape(-1)
                beta = sc.params[1].reshape(-1) if sc.param.scale_param.bias_term else beta
                doc = f"Caffe BatchNorm '{ctx.name}' with Scale '{sc.name}' folded in"
            ctx.node("BatchNormalization", [x, ctx.const(gamma, "scale"), ctx.const(beta, "bias"),
                                            ctx.const(mean, "mean"), ctx.const(var, "var")],
                     out=top, epsilon=eps, doc=doc)
            return
        centered = ctx.node("Sub", [x, ctx.const(mean.reshape(()), "mean")], what="centered")
        ctx.node("Div", [centered, ctx.const(np.sqrt(var.reshape(()) + eps), "std")], out=top)
        return
    # Batch statistics (use_global_stats false): Caffe's forward normalizes with this batch's moments.
    axes = [0] + list(range(2, len(shape)))
    mean = ctx.reduce("ReduceMean", x, axes, keepdims=1, what="mean")
    centered = ctx.node("Sub", [x, mean], what="centered")
    var = ctx.reduce("ReduceMean", ctx.node("Mul", [centered, centered], what="sq"), axes, 1, what="var")
    std = ctx.node("Sqrt", [ctx.scalar_op("Add", var, eps, "eps")], what="std")
    ctx.node("Div", [centered, std], out=top)


def _broadcast(ctx, operand, operand_shape, axis_param, what):
    """Caffe's Scale/Bias broadcast: operand spans x's axes [axis, axis + rank); trailing 1 axes added."""
    ndim = len(ctx.bottom_shapes[0])
    rank = len(operand_shape)
    axis = 0 if rank == 0 else axis_param % ndim
    trailing = ndim - axis - rank
    if isinstance(operand, np.ndarray):
        return ctx.const(operand.reshape(tuple(operand_shape) + (1,) * trailing), what)
    return ctx.unsqueeze_to(operand, rank, rank + trailing, what=f"{what}_unsqueeze")


@converter("Scale")
def scale(ctx):
    p = ctx.param.scale_param
    x, top = ctx.bottoms[0], ctx.tops[0]
    if len(ctx.bottoms) > 1:
        s = _broadcast(ctx, ctx.bottoms[1], ctx.bottom_shapes[1], p.axis, "scale")
        bias_shape = ctx.bottom_shapes[1]
    else:
        s = _broadcast(ctx, ctx.params[0], ctx.params[0].shape, p.axis, "scale")
        bias_shape = ctx.params[0].shape
    if not p.bias_term:
        ctx.node("Mul", [x, s], out=top)
        return
    b = _broadcast(ctx, ctx.params[-1].reshape(bias_shape), bias_shape, p.axis, "bias")
    ctx.node("Add", [ctx.node("Mul", [x, s], what="mul"), b], out=top)


@converter("Bias")
def bias(ctx):
    p = ctx.param.bias_param
    if len(ctx.bottoms) > 1:
        b = _broadcast(ctx, ctx.bottoms[1], ctx.bottom_shapes[1], p.axis, "bias")
    else:
        b = _broadcast(ctx, ctx.params[0], ctx.params[0].shape, p.axis, "bias")
    ctx.node("Add", [ctx.bottoms[0], b], out=ctx.tops[0])


@converter("MVN")
def mvn(ctx):
    # Caffe: per (item, channel) row, or per item across channels: y = (x - mean) / (std + eps)
    p = ctx.param.mvn_param
    x, top = ctx.bottoms[0], ctx.tops[0]
    ndim = len(ctx.bottom_shapes[0])
    rows = ctx.reshape(x, [0, -1] if p.across_channels or ndim < 2 else [0, 0, -1], what="rows")
    axis = 1 if p.across_channels or ndim < 2 else 2
    mean = ctx.reduce("ReduceMean", rows, [axis], keepdims=1, what="mean")
    z = ctx.node("Sub", [rows, mean], what="centered")
    if p.normalize_variance:
        var = ctx.reduce("ReduceMean", ctx.node("Mul", [z, z], what="sq"), [axis], 1, what="var")
        std = ctx.scalar_op("Add", ctx.node("Sqrt", [var], what="std"), float(p.eps), "eps")
        z = ctx.node("Div", [z, std], what="normalized")
    ctx.node("Reshape", [z, ctx.node("Shape", [x], what="shape")], out=top)

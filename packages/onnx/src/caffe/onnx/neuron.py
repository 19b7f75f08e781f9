"""Element-wise (neuron) layers, each with Caffe's formula and parameters."""
from __future__ import annotations

import math

import numpy as np

from caffe.onnx.registry import converter


def _unary(op):
    def convert(ctx):
        ctx.node(op, [ctx.bottoms[0]], out=ctx.tops[0])
    return convert


converter("Sigmoid")(_unary("Sigmoid"))
converter("TanH")(_unary("Tanh"))
converter("AbsVal")(_unary("Abs"))


@converter("ReLU")
def relu(ctx):
    slope = float(ctx.param.relu_param.negative_slope)
    if slope == 0:
        ctx.node("Relu", [ctx.bottoms[0]], out=ctx.tops[0])
    else:  # max(x, 0) + slope * min(x, 0)
        ctx.node("LeakyRelu", [ctx.bottoms[0]], out=ctx.tops[0], alpha=slope)


@converter("PReLU")
def prelu(ctx):
    ndim = len(ctx.bottom_shapes[0])
    a = ctx.params[0]
    slope = a.reshape(()) if ctx.param.prelu_param.channel_shared else a.reshape((-1,) + (1,) * (ndim - 2))
    ctx.node("PRelu", [ctx.bottoms[0], ctx.const(slope, "slope")], out=ctx.tops[0])


@converter("ELU")
def elu(ctx):
    ctx.node("Elu", [ctx.bottoms[0]], out=ctx.tops[0], alpha=float(ctx.param.elu_param.alpha))


@converter("BNLL")
def bnll(ctx):
    # Caffe's overflow-safe form: max(x, 0) + log(1 + exp(-|x|))
    x = ctx.bottoms[0]
    e = ctx.node("Exp", [ctx.node("Neg", [ctx.node("Abs", [x], what="abs")], what="neg")], what="exp")
    log = ctx.node("Log", [ctx.scalar_op("Add", e, 1.0, "one")], what="log")
    ctx.node("Add", [ctx.node("Relu", [x], what="relu"), log], out=ctx.tops[0])


def _affine(ctx, x, scale, shift, what=""):
    """scale * x + shift, skipping the identity parts."""
    if scale != 1:
        x = ctx.scalar_op("Mul", x, scale, f"{what}scale")
    if shift != 0:
        x = ctx.scalar_op("Add", x, shift, f"{what}shift")
    return x


def _finish(ctx, x):
    """Write x to the top (an Identity when nothing was computed)."""
    if x == ctx.bottoms[0]:
        ctx.node("Identity", [x], out=ctx.tops[0])
    else:  # the last node computed x: let it write the top instead
        node = ctx.b.nodes[-1]
        assert node.output[0] == x, (node.output, x)
        node.output[0] = ctx.tops[0]
        node.name = ctx.b.node_name(ctx.name)


@converter("Power")
def power(ctx):
    p = ctx.param.power_param
    pw, sc, sh = float(p.power), float(p.scale), float(p.shift)
    x = ctx.bottoms[0]
    if pw * sc == 0:  # Caffe fills the constant (power == 0 ? 1 : shift ^ power), whatever x holds
        with np.errstate(all="ignore"):
            value = 1.0 if pw == 0 else float(np.power(np.float64(sh), pw))
        ctx.node("Expand", [ctx.const(value, "value"), ctx.node("Shape", [x], what="shape")], out=ctx.tops[0])
        return
    y = _affine(ctx, x, sc, sh)
    if pw != 1:
        y = ctx.scalar_op("Pow", y, pw, "power")
    _finish(ctx, y)


@converter("Exp")
def exp(ctx):
    # Caffe: outer_scale * exp(inner_scale * x), inner = ln(base) * scale, outer = base ^ shift
    p = ctx.param.exp_param
    base = float(p.base)
    log_base = 1.0 if base == -1 else math.log(base)
    inner = log_base * float(p.scale)
    shift = float(p.shift)
    with np.errstate(all="ignore"):
        outer = 1.0 if shift == 0 else float(np.exp(shift) if base == -1 else np.power(base, shift))
    y = ctx.bottoms[0]
    if inner != 1:
        y = ctx.scalar_op("Mul", y, inner, "inner_scale")
    y = ctx.node("Exp", [y], what="exp")
    if outer != 1:
        y = ctx.scalar_op("Mul", y, outer, "outer_scale")
    _finish(ctx, y)


@converter("Log")
def log(ctx):
    # Caffe: log(shift + scale * x) / ln(base)
    p = ctx.param.log_param
    base = float(p.base)
    base_scale = 1.0 if base == -1 else 1.0 / math.log(base)
    y = ctx.node("Log", [_affine(ctx, ctx.bottoms[0], float(p.scale), float(p.shift))], what="log")
    if base_scale != 1:
        y = ctx.scalar_op("Mul", y, base_scale, "base_scale")
    _finish(ctx, y)


@converter("Threshold")
def threshold(ctx):
    t = float(ctx.param.threshold_param.threshold)
    above = ctx.node("Greater", [ctx.bottoms[0], ctx.const(t, "threshold")], what="greater")
    ctx.node("Cast", [above], out=ctx.tops[0], to=ctx.b.elem_type)


@converter("Clip")
def clip(ctx):
    p = ctx.param.clip_param
    ctx.node("Clip", [ctx.bottoms[0], ctx.const(float(p.min), "min"), ctx.const(float(p.max), "max")],
             out=ctx.tops[0])


@converter("Swish")
def swish(ctx):
    x = ctx.bottoms[0]
    beta = float(ctx.param.swish_param.beta)
    z = x if beta == 1 else ctx.scalar_op("Mul", x, beta, "beta")
    ctx.node("Mul", [x, ctx.node("Sigmoid", [z], what="sigmoid")], out=ctx.tops[0])


def _check_dropout(ctx):
    if ctx.param.phase == 0:
        return "Dropout in the TRAIN phase drops at random: export a TEST-phase (or deploy) net"
    return None


@converter("Dropout", check=_check_dropout)
def dropout(ctx):
    # At inference Caffe's Dropout passes x through (it scales by 1 / (1 - ratio) at train time); with
    # the fork-only scale_train = false it multiplies by 1 - ratio instead.
    p = ctx.param.dropout_param
    scale_train = bool(p.scale_train) if "scale_train" in p.DESCRIPTOR.fields_by_name else True
    if scale_train:
        ctx.node("Identity", [ctx.bottoms[0]], out=ctx.tops[0])
    else:
        ctx.scalar_op("Mul", ctx.bottoms[0], 1.0 - float(p.dropout_ratio), "keep", out=ctx.tops[0])

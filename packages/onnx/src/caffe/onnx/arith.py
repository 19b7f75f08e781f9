"""Softmax, Eltwise, ArgMax and Reduction."""
from __future__ import annotations

import numpy as np

from caffe.onnx.registry import converter

INT64_MIN = np.iinfo(np.int64).min
PROD, SUM, MAX = 0, 1, 2
R_SUM, R_ASUM, R_SUMSQ, R_MEAN = 1, 2, 3, 4


@converter("Softmax")
def softmax(ctx):
    axis = ctx.param.softmax_param.axis % len(ctx.bottom_shapes[0])
    ctx.node("Softmax", [ctx.bottoms[0]], out=ctx.tops[0], axis=axis)


@converter("Eltwise")
def eltwise(ctx):
    p = ctx.param.eltwise_param
    xs, top = ctx.bottoms, ctx.tops[0]
    if p.operation == MAX:
        ctx.node("Max", xs, out=top)  # equal values tie: which bottom wins does not change the value
    elif p.operation == PROD:
        y = xs[0]
        for i, x in enumerate(xs[1:], 1):  # Caffe's left-to-right product
            y = ctx.node("Mul", [y, x], out=top if i == len(xs) - 1 else None, what=f"mul{i}")
    else:
        coeffs = list(p.coeff) or [1.0] * len(xs)
        terms = [x if c == 1 else ctx.scalar_op("Mul", x, c, f"coeff{i}") for i, (x, c) in enumerate(zip(xs, coeffs))]
        ctx.node("Sum", terms, out=top)


def _topk_desc_last(ctx, v, axis, dim, k):
    """(values, indices as int64) of the k largest along axis, ties ranked larger index first (Caffe's
    std::greater over (value, index) pairs): TopK ranks the lower index first, so it runs on the reversed
    axis and the indices are mirrored back."""
    rev = ctx.node("Slice", [v, ctx.ints([-1], "rev_start"), ctx.ints([INT64_MIN], "rev_end"),
                             ctx.ints([axis], "rev_axis"), ctx.ints([-1], "rev_step")], what="reversed")
    vals, ridx = ctx.node("TopK", [rev, ctx.ints([k], "k")], what="topk", n_out=2, axis=axis, largest=1, sorted=1)
    idx = ctx.node("Sub", [ctx.const(dim - 1, "last", np.int64), ridx], what="index")
    return vals, idx


@converter("ArgMax")
def argmax(ctx):
    p = ctx.param.argmax_param
    shape = ctx.bottom_shapes[0]
    x, top = ctx.bottoms[0], ctx.tops[0]
    k = int(p.top_k)
    if p.HasField("axis"):
        axis = p.axis % len(shape)
        v, dim = x, shape[axis]
    else:  # each item's entries flattened: (N, count(1))
        axis, dim = 1, int(np.prod(shape[1:], dtype=np.int64))
        v = ctx.reshape(x, [0, -1], what="flatten")
    float_t = ctx.b.elem_type
    if k == 1 and not p.out_max_val:
        idx = ctx.node("ArgMax", [v], what="argmax", axis=axis, keepdims=1, select_last_index=1)
        vals = None
    elif k == 1 and p.HasField("axis"):
        vals = ctx.reduce("ReduceMax", v, [axis], keepdims=1, out=top, what="max")
        return
    else:
        vals, idx = _topk_desc_last(ctx, v, axis, dim, k)
    if p.HasField("axis"):
        if p.out_max_val:
            ctx.node("Identity", [vals], out=top)
        else:
            ctx.node("Cast", [idx], out=top, to=float_t)
        return
    fidx = ctx.node("Cast", [idx], what="index_float", to=float_t)
    y = ctx.node("Concat", [fidx, vals], what="concat", axis=1) if p.out_max_val else fidx
    # (N, [2 *] k) -> Caffe's (N, 1 or 2, k, 1, ...)
    ctx.reshape(y, [0] + list(ctx.top_shapes[0][1:]), out=top)


@converter("Reduction")
def reduction(ctx):
    p = ctx.param.reduction_param
    shape = ctx.bottom_shapes[0]
    axes = list(range(p.axis % len(shape), len(shape)))
    op = {R_SUM: "ReduceSum", R_ASUM: "ReduceL1", R_SUMSQ: "ReduceSumSquare", R_MEAN: "ReduceMean"}[p.operation]
    coeff = float(p.coeff)
    if coeff == 1:
        ctx.reduce(op, ctx.bottoms[0], axes, keepdims=0, out=ctx.tops[0])
        return
    r = ctx.reduce(op, ctx.bottoms[0], axes, keepdims=0, what=op.lower())
    ctx.scalar_op("Mul", r, coeff, "coeff", out=ctx.tops[0])

"""Layers that move data without arithmetic: Concat, Slice, Split, Flatten, Reshape, Crop, Tile,
BatchReindex, Parameter, Silence (and Input, which becomes a graph input).

Reshape targets keep the leading axes as 0 (ONNX: copy the input's dimension) rather than their current
sizes, so an export with a dynamic batch stays right at every batch size.
"""
from __future__ import annotations

import numpy as np

from caffe.onnx.registry import converter

INT64_MAX = np.iinfo(np.int64).max


@converter("Input")
def input_layer(ctx):
    pass  # its tops are the graph's inputs (see exporter.py)


@converter("Silence")
def silence(ctx):
    pass  # no tops: nothing to compute


@converter("Split")
def split(ctx):
    for top in ctx.tops:
        ctx.node("Identity", [ctx.bottoms[0]], out=top)


@converter("Parameter")
def parameter(ctx):
    ctx.node("Identity", [ctx.const(ctx.params[0], "blob")], out=ctx.tops[0])


def _axis(param, field, legacy, ndim):
    return getattr(param, legacy) if param.HasField(legacy) else getattr(param, field) % ndim


@converter("Concat")
def concat(ctx):
    p = ctx.param.concat_param
    if len(ctx.bottoms) == 1:
        ctx.node("Identity", ctx.bottoms, out=ctx.tops[0])
        return
    ctx.node("Concat", ctx.bottoms, out=ctx.tops[0], axis=_axis(p, "axis", "concat_dim", len(ctx.top_shapes[0])))


def _check_slice(ctx):
    p = ctx.param.slice_param
    axis = _axis(p, "axis", "slice_dim", len(ctx.bottom_shapes[0]))
    if ctx.dynamic and axis == 0 and len(ctx.tops) > 1 and not len(p.slice_point) and ctx.opset < 18:
        return "an even Slice of the batch axis with a dynamic batch needs opset 18 or later (Split num_outputs)"
    return None


@converter("Slice", check=_check_slice)
def slice_layer(ctx):
    p = ctx.param.slice_param
    x = ctx.bottoms[0]
    axis = _axis(p, "axis", "slice_dim", len(ctx.bottom_shapes[0]))
    if len(ctx.tops) == 1:
        ctx.node("Identity", [x], out=ctx.tops[0])
        return
    if not (ctx.dynamic and axis == 0):
        sizes = [s[axis] for s in ctx.top_shapes]
        ctx.node("Split", [x, ctx.ints(sizes, "split")], out=ctx.tops, axis=axis)
    elif not len(p.slice_point):  # an even split of a dynamic batch
        ctx.node("Split", [x], out=ctx.tops, axis=0, num_outputs=len(ctx.tops))
    else:  # cut points on a dynamic batch: the last piece takes the rest
        points = [0] + list(p.slice_point) + [INT64_MAX]
        for i, top in enumerate(ctx.tops):
            ctx.node("Slice", [x, ctx.ints([points[i]], f"start{i}"), ctx.ints([points[i + 1]], f"end{i}"),
                               ctx.ints([0], f"axes{i}")], out=top, what=f"slice{i}")


@converter("Flatten")
def flatten(ctx):
    p = ctx.param.flatten_param
    shape = ctx.bottom_shapes[0]
    n = len(shape)
    start, end = p.axis % n, p.end_axis % n
    ctx.reshape(ctx.bottoms[0], [0] * start + [-1] + list(shape[end + 1:]), out=ctx.tops[0])


def _reshape_target(ctx):
    """Caffe's reshape_param as an ONNX Reshape target (Caffe's 0 and -1 mean what ONNX's do)."""
    p = ctx.param.reshape_param
    shape = ctx.bottom_shapes[0]
    n = len(shape)
    start = p.axis if p.axis >= 0 else n + p.axis + 1
    end = n if p.num_axes == -1 else start + p.num_axes
    dims = list(p.shape.dim)
    tail = list(shape[end:])
    if end == 0 and tail:  # the batch axis moves when dims are put in front of it
        tail[0] = 0 if not dims else (None if ctx.dynamic else tail[0])
    return [0] * start + dims + tail


def _check_reshape(ctx):
    if None in _reshape_target(ctx):
        return "inserting axes before the batch axis (reshape_param axis 0, num_axes 0) with a dynamic batch"
    return None


@converter("Reshape", check=_check_reshape)
def reshape(ctx):
    ctx.reshape(ctx.bottoms[0], _reshape_target(ctx), out=ctx.tops[0])


def _crop_axes(ctx):
    p = ctx.param.crop_param
    shape, ref = ctx.bottom_shapes
    start = p.axis % len(shape)
    offsets = list(p.offset)
    starts, ends, axes = [], [], []
    for i in range(start, len(shape)):
        off = offsets[0] if len(offsets) == 1 else (offsets[i - start] if offsets else 0)
        if off == 0 and ref[i] == shape[i]:
            continue
        starts.append(off)
        ends.append(off + ref[i])
        axes.append(i)
    return starts, ends, axes


def _check_crop(ctx):
    if ctx.dynamic and 0 in _crop_axes(ctx)[2]:
        return "cropping the batch axis (crop_param.axis 0) with a dynamic batch"
    return None


@converter("Crop", check=_check_crop)
def crop(ctx):
    starts, ends, axes = _crop_axes(ctx)
    if not axes:
        ctx.node("Identity", [ctx.bottoms[0]], out=ctx.tops[0])
        return
    ctx.node("Slice", [ctx.bottoms[0], ctx.ints(starts, "starts"), ctx.ints(ends, "ends"), ctx.ints(axes, "axes")],
             out=ctx.tops[0])


@converter("Tile")
def tile(ctx):
    # Caffe repeats the whole block from `axis` on: ONNX Tile along that axis does the same.
    p = ctx.param.tile_param
    n = len(ctx.bottom_shapes[0])
    repeats = [1] * n
    repeats[p.axis % n] = int(p.tiles)
    ctx.node("Tile", [ctx.bottoms[0], ctx.ints(repeats, "repeats")], out=ctx.tops[0])


@converter("BatchReindex")
def batch_reindex(ctx):
    idx = ctx.node("Cast", [ctx.bottoms[1]], what="index", to=7)  # INT64
    ctx.node("Gather", [ctx.bottoms[0], idx], out=ctx.tops[0], axis=0)

"""Pooling (MAX, AVE, TEST-phase STOCHASTIC, global) with Caffe's exact windows and AVE divisor.

Caffe's windows: pooled = ceil((size + 2 pad - kernel) / stride) + 1 (floor with round_mode FLOOR), one
fewer when the last window would start in the padding. So every window is given explicitly: pad `pad` in
front and `end` = (pooled - 1) * stride + kernel - size - pad behind (0 when negative), and pool without
ceil mode; that yields exactly Caffe's pooled size. AVE divides by the window clipped to size + pad
(the padding in front and behind counts, but not the part beyond size + pad): AveragePool over the
padded input divides by kernel_h * kernel_w, and a constant (1, 1, PH, PW) factor corrects it where Caffe's
divisor differs. Pads at least as large as the kernel (possible only behind) go through an explicit Pad
node, since runtimes refuse such pad attributes.
"""
from __future__ import annotations

import numpy as np

from caffe.onnx.registry import converter

MAX, AVE, STOCHASTIC = 0, 1, 2
FLT_MAX = float(np.finfo(np.float32).max)
FLT_MIN = float(np.finfo(np.float32).tiny)


class _Geometry:
    def __init__(self, ctx):
        p = ctx.param.pooling_param
        has = p.HasField
        self.method = int(p.pool)
        n, c, self.h, self.w = ctx.bottom_shapes[0]
        self.ph_out, self.pw_out = ctx.top_shapes[0][2:]
        self.glob = bool(p.global_pooling)
        if self.glob:
            self.kernel = (self.h, self.w)
        else:
            self.kernel = (p.kernel_size, p.kernel_size) if has("kernel_size") else (p.kernel_h, p.kernel_w)
        self.pad = (p.pad_h, p.pad_w) if has("pad_h") else (p.pad, p.pad)
        self.stride = (p.stride_h, p.stride_w) if has("stride_h") else (p.stride, p.stride)
        # padding behind each axis so that the last window ends inside the padded input
        self.end = tuple((o - 1) * s + k - size - pd for o, s, k, size, pd in
                         zip((self.ph_out, self.pw_out), self.stride, self.kernel, (self.h, self.w), self.pad))
        self.pads = [self.pad[0], self.pad[1], max(self.end[0], 0), max(self.end[1], 0)]

    @property
    def needs_pad_node(self) -> bool:
        return any(p >= k for p, k in zip(self.pads, self.kernel * 2))

    def empty_windows(self) -> bool:
        """A window that starts behind the image (Caffe allows it without padding, in ceil mode)."""
        return any((o - 1) * s - pd >= size for o, s, pd, size in
                   zip((self.ph_out, self.pw_out), self.stride, self.pad, (self.h, self.w)))

    def ave_divisor(self):
        """Caffe's AVE divisor per window: the window clipped to size + pad (computed before the image)."""
        hs = np.arange(self.ph_out) * self.stride[0] - self.pad[0]
        ws = np.arange(self.pw_out) * self.stride[1] - self.pad[1]
        hh = np.minimum(hs + self.kernel[0], self.h + self.pad[0]) - hs
        ww = np.minimum(ws + self.kernel[1], self.w + self.pad[1]) - ws
        return np.outer(hh, ww).astype(np.float64)


def _check(ctx):
    p = ctx.param.pooling_param
    if p.pool == STOCHASTIC and ctx.param.phase == 0:
        return "STOCHASTIC pooling in the TRAIN phase samples at random: export a TEST-phase net"
    if len(ctx.tops) > 1:
        g = _Geometry(ctx)
        if g.glob or any(g.pads) or g.empty_windows():
            return ("the MAX pooling mask top (top[1]) is exported only for unpadded windows that lie "
                    "inside the image")
    return None


def _windows(ctx, g, x, fill, what="pad", force=False):
    """(input, pads attribute) for a pool node: an explicit Pad node when the attribute cannot say it."""
    if not (force or g.needs_pad_node):
        return x, (g.pads if any(g.pads) else None)
    pads = [0, 0, g.pads[0], g.pads[1], 0, 0, g.pads[2], g.pads[3]]
    padded = ctx.node("Pad", [x, ctx.ints(pads, f"{what}_pads"), ctx.const(fill, f"{what}_value")], what=what,
                      mode="constant")
    return padded, None


def _sum_pool(ctx, g, x, what):
    """Window sums (zeros outside the image): AveragePool over the padded input times kernel area."""
    area = float(g.kernel[0] * g.kernel[1])
    if g.glob:
        avg = ctx.node("GlobalAveragePool", [x], what=f"{what}_avg")
    else:
        src, pads = _windows(ctx, g, x, 0.0, f"{what}_pad")
        avg = ctx.node("AveragePool", [src], what=f"{what}_avg", kernel_shape=list(g.kernel),
                       strides=list(g.stride), pads=pads, count_include_pad=1)
    return ctx.scalar_op("Mul", avg, area, f"{what}_area")


@converter("Pooling", check=_check)
def pooling(ctx):
    g = _Geometry(ctx)
    x, top = ctx.bottoms[0], ctx.tops[0]
    if g.method == MAX:
        if g.glob:
            ctx.node("GlobalMaxPool", [x], out=top)
            return
        # Every window holds an image pixel unless it starts behind the image; such windows are Caffe's
        # -FLT_MAX, which an explicit Pad with -FLT_MAX reproduces.
        src, attr = _windows(ctx, g, x, -FLT_MAX, force=g.empty_windows())
        outs = [top] if len(ctx.tops) == 1 else [top, ctx.tmp("indices")]
        res = ctx.node("MaxPool", [src], out=outs, kernel_shape=list(g.kernel), strides=list(g.stride),
                       pads=attr)
        if len(ctx.tops) > 1:  # Caffe's mask: h * W + w within the plane, as floats
            plane = ctx.node("Mod", [res[1], ctx.const(g.h * g.w, "plane", np.int64)], what="plane_index")
            ctx.node("Cast", [plane], out=ctx.tops[1], to=ctx.b.elem_type)
        return
    if g.method == AVE:
        if g.glob:
            ctx.node("GlobalAveragePool", [x], out=top)
            return
        src, attr = _windows(ctx, g, x, 0.0)
        divisor = g.ave_divisor()
        area = float(g.kernel[0] * g.kernel[1])
        exact = np.all(divisor == area)
        avg = ctx.node("AveragePool", [src], out=top if exact else None, what="avg", kernel_shape=list(g.kernel),
                       strides=list(g.stride), pads=attr, count_include_pad=1)
        if not exact:
            with np.errstate(divide="ignore"):  # a divisor <= 0 (a window behind the image): Caffe's 0/0
                factor = area / divisor
            ctx.node("Mul", [avg, ctx.const(factor.reshape(1, 1, g.ph_out, g.pw_out), "divisor")], out=top)
        return
    # STOCHASTIC at TEST: the activation-weighted average sum(x^2) / (FLT_MIN + sum(x)) per window
    sq = ctx.node("Mul", [x, x], what="square")
    num = _sum_pool(ctx, g, sq, "sumsq")
    den = ctx.scalar_op("Add", _sum_pool(ctx, g, x, "sum"), FLT_MIN, "flt_min")
    ctx.node("Div", [num, den], out=top)

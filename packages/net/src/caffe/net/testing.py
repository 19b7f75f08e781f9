"""Helpers for tests of nets: small Python layers (python_param { module: "caffe.net.testing" })
and prototxt snippets.

The Python layers are deliberately simple and exact, so net-level behaviour
(wiring, backward pruning, sharing, weights I/O) can be tested without depending
on which vision layers exist yet.
"""
from __future__ import annotations

import numpy as np

from caffe.blob import Blob
from caffe.layers.python_layer import Layer


class SumSquaresLoss(Layer):
    """top = 0.5 * sum(bottom^2) over all bottoms; give the layer `loss_weight: 1` to make it a loss."""

    def setup(self, bottom, top):
        if len(top) != 1:
            raise ValueError("SumSquaresLoss has exactly one top")

    def reshape(self, bottom, top):
        top[0].reshape([])

    def forward(self, bottom, top):
        top[0].data[...] = sum(0.5 * float(np.vdot(b.data.ravel(), b.data.ravel())) for b in bottom)

    def backward(self, top, propagate_down, bottom):
        scale = top[0].diff.reshape(-1)[0]
        for b, prop in zip(bottom, propagate_down):
            if prop:
                b.diff[...] = b.data * scale


class ChannelScale(Layer):
    """top[n, c, ...] = w[c] * bottom[n, c, ...]; one learnable parameter blob w (init: param_str or 1)."""

    def setup(self, bottom, top):
        init = float(self.param_str) if self.param_str else 1.0
        if not len(self.blobs):
            self.blobs.append(Blob(bottom[0].shape[1], dtype=bottom[0].dtype))
            self.blobs[0].data[...] = init

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)

    def _w(self, ndim):
        return self.blobs[0].data.reshape((1, -1) + (1,) * (ndim - 2))

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data * self._w(bottom[0].data.ndim)

    def backward(self, top, propagate_down, bottom):
        x, dy = bottom[0].data, top[0].diff
        axes = tuple(i for i in range(x.ndim) if i != 1)
        self.blobs[0].diff[...] += (dy * x).sum(axis=axes)  # parameter gradients accumulate, as in Caffe
        if propagate_down[0]:
            bottom[0].diff[...] = dy * self._w(x.ndim)


class SumAll(Layer):
    """top = the sum of all bottoms (same shapes): each bottom's gradient is the top's diff."""

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        top[0].data[...] = sum(b.data for b in bottom)

    def backward(self, top, propagate_down, bottom):
        for b, prop in zip(bottom, propagate_down):
            if prop:
                b.diff[...] = top[0].diff


class CountCorrect(Layer):
    """An Accuracy-like layer: a scalar from (scores, labels) that is not a loss (its gradient is zero)."""

    def reshape(self, bottom, top):
        top[0].reshape([])

    def forward(self, bottom, top):
        pred = bottom[0].data.reshape(bottom[0].data.shape[0], -1).argmax(axis=1)
        top[0].data[...] = float((pred == bottom[1].data.reshape(-1)).sum())

    def backward(self, top, propagate_down, bottom):
        for b, prop in zip(bottom, propagate_down):
            if prop:
                b.diff[...] = 0


def python_layer(name: str, cls: str, bottoms=(), tops=(), extra: str = "", param_str: str = "") -> str:
    """Prototxt for a layer of this module's Python layer `cls`."""
    lines = [f'layer {{ name: "{name}" type: "Python"']
    lines += [f'  bottom: "{b}"' for b in bottoms] + [f'  top: "{t}"' for t in tops]
    ps = f' param_str: "{param_str}"' if param_str else ""
    lines.append(f'  python_param {{ module: "caffe.net.testing" layer: "{cls}"{ps} }}')
    if extra:
        lines.append("  " + extra)
    lines.append("}")
    return "\n".join(lines)


def input_layer(name: str, tops_shapes: dict) -> str:
    shapes = " ".join("shape { " + " ".join(f"dim: {d}" for d in s) + " }" for s in tops_shapes.values())
    tops = " ".join(f'top: "{t}"' for t in tops_shapes)
    return f'layer {{ name: "{name}" type: "Input" {tops} input_param {{ {shapes} }} }}'


def ensure_split_layer() -> None:
    """Nets with a blob consumed twice need the Split layer (caffe-layers); register a reference one if
    that package does not provide it yet, so net tests can run."""
    from caffe.layers.layer import Layer as BaseLayer
    from caffe.layers.registry import layer_type_list, register_layer
    if "Split" in layer_type_list():
        return

    @register_layer("Split")
    class ReferenceSplitLayer(BaseLayer):
        exact_num_bottom_blobs = 1
        min_top_blobs = 1

        def reshape(self, bottom, top):
            for t in top:  # every top shares the bottom's data; each keeps its own diff
                t.reshape_like(bottom[0])
                t.share_data(bottom[0])

        def forward_xp(self, xp, bottom, top):
            pass

        def backward_xp(self, xp, top, propagate_down, bottom):
            if propagate_down[0]:
                dx = bottom[0].mutable_diff_xp(xp)
                dx[...] = top[0].diff_xp(xp)
                for t in top[1:]:
                    dx += t.diff_xp(xp)

"""Concat: join the bottoms along concat_param.axis (or the legacy concat_dim, non-negative only).

CPU: each bottom is copied straight into its rows of the top (and back for the diffs) by a
parallel block copy (caffe.layers.kernels.elementwise.copy_rows): one read and one write.
"""
import numpy as np

from caffe.layers import _cpu
from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer


@register_layer("Concat")
class ConcatLayer(Layer):
    min_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.concat_param
        self.check(not (p.HasField("axis") and p.HasField("concat_dim")),
                   "Either concat_param.axis or concat_param.concat_dim should be specified; not both")

    def reshape(self, bottom, top):
        p = self.layer_param.concat_param
        x0 = bottom[0]
        n = x0.num_axes
        if p.HasField("concat_dim"):
            if p.concat_dim >= n:
                raise self.error(f"concat_param.concat_dim {p.concat_dim} is out of range for "
                                 f"bottom[0] with shape {x0.shape}")
            axis = p.concat_dim
        else:
            try:
                axis = x0.canonical_axis_index(p.axis)
            except IndexError:
                raise self.error(f"concat_param.axis {p.axis} is out of range for bottom[0] "
                                 f"with shape {x0.shape}") from None
        self.axis = axis
        shape = list(x0.shape)
        for i, b in enumerate(bottom[1:], 1):
            same = b.num_axes == n and all(b.shape[j] == shape[j] for j in range(n) if j != axis)
            if not same:
                raise self.error(f"All inputs must have the same shape, except at concat axis {axis}: "
                                 f"bottom[0] has shape {x0.shape}, bottom[{i}] has shape {b.shape}")
            shape[axis] += b.shape[axis]
        top[0].reshape(shape)
        if len(bottom) == 1:
            top[0].share_data(x0)
            top[0].share_diff(x0)

    def _blocks(self, bottom, top):
        """(bottom index, its row length, its offset in a top row) along the concat axis."""
        inner = top[0].count(self.axis + 1)
        offset = 0
        for i, b in enumerate(bottom):
            size = b.shape[self.axis] * inner
            yield i, size, offset
            offset += size

    def forward_cpu(self, bottom, top):
        if len(bottom) == 1:
            return
        if not _cpu.usable(_cpu.elementwise, *bottom, top[0]):
            return self.forward_xp(np, bottom, top)
        y = _cpu.flat(top[0].mutable_cpu_data())
        rows, top_row = top[0].count(0, self.axis), top[0].count(self.axis)
        for i, size, offset in self._blocks(bottom, top):
            _cpu.elementwise.copy_rows(_cpu.flat(bottom[i].cpu_data()), 0, size, y, offset, top_row, rows, size)

    def backward_cpu(self, top, propagate_down, bottom):
        if len(bottom) == 1:
            return
        if not _cpu.usable(_cpu.elementwise, *bottom, top[0]):
            return self.backward_xp(np, top, propagate_down, bottom)
        dy = _cpu.flat(top[0].cpu_diff())
        rows, top_row = top[0].count(0, self.axis), top[0].count(self.axis)
        for i, size, offset in self._blocks(bottom, top):
            if propagate_down[i]:
                _cpu.elementwise.copy_rows(dy, offset, top_row, _cpu.flat(bottom[i].mutable_cpu_diff()), 0, size,
                                           rows, size)

    def forward_xp(self, xp, bottom, top):
        if len(bottom) == 1:
            return
        xp.concatenate([b.data_xp(xp) for b in bottom], axis=self.axis, out=top[0].mutable_data_xp(xp))

    def backward_xp(self, xp, top, propagate_down, bottom):
        if len(bottom) == 1:
            return
        dy = top[0].diff_xp(xp)
        offset = 0
        index = [slice(None)] * dy.ndim
        for i, b in enumerate(bottom):
            size = b.shape[self.axis]
            if propagate_down[i]:
                index[self.axis] = slice(offset, offset + size)
                b.mutable_diff_xp(xp)[...] = dy[tuple(index)]
            offset += size

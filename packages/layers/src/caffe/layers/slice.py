"""Slice: cut the bottom along slice_param.axis (or the legacy slice_dim) into the tops.

slice_point gives the cut positions (one fewer than the tops); without it the axis is split evenly.
CPU: each top is copied straight from its rows of the bottom (and back for the diffs) by a
parallel block copy (caffe.layers.kernels.elementwise.copy_rows): one read and one write.
"""
import numpy as np

from caffe.layers import _cpu
from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer


@register_layer("Slice")
class SliceLayer(Layer):
    exact_num_bottom_blobs = 1
    min_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.slice_param
        self.check(not (p.HasField("axis") and p.HasField("slice_dim")),
                   "Either slice_param.axis or slice_param.slice_dim should be specified; not both")

    def reshape(self, bottom, top):
        p = self.layer_param.slice_param
        x = bottom[0]
        if p.HasField("slice_dim"):
            if p.slice_dim >= x.num_axes:
                raise self.error(f"slice_param.slice_dim {p.slice_dim} is out of range "
                                 f"for bottom[0] with shape {x.shape}")
            axis = p.slice_dim
        else:
            try:
                axis = x.canonical_axis_index(p.axis)
            except IndexError:
                raise self.error(f"slice_param.axis {p.axis} is out of range for bottom[0] "
                                 f"with shape {x.shape}") from None
        self.axis = axis
        length = x.shape[axis]
        points = list(p.slice_point)
        if points:
            if len(points) != len(top) - 1:
                raise self.error(f"slice_param.slice_point has {len(points)} entries for {len(top)} tops "
                                 f"(needs {len(top) - 1})")
            prev, sizes = 0, []
            for pt in points:
                if pt <= prev:
                    raise self.error(f"slice_param.slice_point {points} must be strictly increasing "
                                     f"and positive")
                sizes.append(pt - prev)
                prev = pt
            if prev >= length:
                raise self.error(f"slice_param.slice_point {points} out of range for axis {axis} "
                                 f"of size {length} (bottom[0] shape {x.shape})")
            sizes.append(length - prev)
        else:
            if length % len(top) != 0:
                raise self.error(f"Number of top blobs ({len(top)}) should evenly divide input slice axis {axis} "
                                 f"of size {length} (bottom[0] shape {x.shape})")
            sizes = [length // len(top)] * len(top)
        self.sizes = sizes
        for t, size in zip(top, sizes):
            shape = list(x.shape)
            shape[axis] = size
            t.reshape(shape)
        if len(top) == 1:
            top[0].share_data(x)
            top[0].share_diff(x)

    def _pieces(self, ndim):
        offset = 0
        index = [slice(None)] * ndim
        for size in self.sizes:
            index[self.axis] = slice(offset, offset + size)
            yield tuple(index)
            offset += size

    def _blocks(self, bottom):
        """(top index, its row length, its offset in a bottom row) along the slice axis."""
        inner = bottom[0].count(self.axis + 1)
        offset = 0
        for i, size in enumerate(self.sizes):
            yield i, size * inner, offset
            offset += size * inner

    def forward_cpu(self, bottom, top):
        if len(top) == 1:
            return
        if not _cpu.usable(_cpu.elementwise, bottom[0], *top):
            return self.forward_xp(np, bottom, top)
        x = _cpu.flat(bottom[0].cpu_data())
        rows, row = bottom[0].count(0, self.axis), bottom[0].count(self.axis)
        for i, size, offset in self._blocks(bottom):
            _cpu.elementwise.copy_rows(x, offset, row, _cpu.flat(top[i].mutable_cpu_data()), 0, size, rows, size)

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0] or len(top) == 1:
            return
        if not _cpu.usable(_cpu.elementwise, bottom[0], *top):
            return self.backward_xp(np, top, propagate_down, bottom)
        dx = _cpu.flat(bottom[0].mutable_cpu_diff())
        rows, row = bottom[0].count(0, self.axis), bottom[0].count(self.axis)
        for i, size, offset in self._blocks(bottom):
            _cpu.elementwise.copy_rows(_cpu.flat(top[i].cpu_diff()), 0, size, dx, offset, row, rows, size)

    def forward_xp(self, xp, bottom, top):
        if len(top) == 1:
            return
        x = bottom[0].data_xp(xp)
        for t, idx in zip(top, self._pieces(x.ndim)):
            t.mutable_data_xp(xp)[...] = x[idx]

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0] or len(top) == 1:
            return
        dx = bottom[0].mutable_diff_xp(xp)
        for t, idx in zip(top, self._pieces(dx.ndim)):
            dx[idx] = t.diff_xp(xp)

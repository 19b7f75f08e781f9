"""Split: one bottom to N tops that share its data; backward sums the tops' diffs into the bottom.

The net inserts Split layers where a blob feeds several layers. Only top[0] may be the bottom itself.
CPU: the backward sum is one kernel pass (every top diff read once, the bottom diff written once).
"""
import numpy as np

from caffe.layers import _cpu
from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer


@register_layer("Split")
class SplitLayer(Layer):
    exact_num_bottom_blobs = 1
    min_top_blobs = 1

    def reshape(self, bottom, top):
        for i, t in enumerate(top):
            # top[0] may be in place: its diff is then the bottom's and backward still sums correctly.
            if i > 0 and t is bottom[0]:
                raise self.error(f"Split layer does not allow in-place computation (top[{i}] is the bottom)")
            t.reshape_like(bottom[0])
            t.share_data(bottom[0])

    def forward_xp(self, xp, bottom, top):
        for t in top:
            t.share_data(bottom[0])

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if len(top) < 2 or not _cpu.usable(_cpu.elementwise, bottom[0], *top):
            return self.backward_xp(np, top, propagate_down, bottom)
        # Eltwise SUM (operation 1) with coefficients 1: the same sum, in top order, as below.
        diffs = [_cpu.flat(t.cpu_diff()) for t in top]
        _cpu.elementwise.eltwise_forward(1, diffs, np.ones(len(top)), _cpu.flat(bottom[0].mutable_cpu_diff()),
                                         _cpu.EMPTY_INT)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        total = top[0].diff_xp(xp).copy()
        for t in top[1:]:
            total += t.diff_xp(xp)
        bottom[0].mutable_diff_xp(xp)[...] = total

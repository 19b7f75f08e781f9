"""Filter: keep the items (along axis 0) whose selector is nonzero.

The last bottom is the selector (shape (N,) or (N, 1, ...)); the other bottoms are filtered into the
tops, whose first dimension is the number of selected items (it varies per batch; at setup, before
the selector holds data, it is N). No gradient flows to the selector.
"""
import numpy as np

from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer


@register_layer("Filter")
class FilterLayer(Layer):
    min_bottom_blobs = 2
    min_top_blobs = 1

    def layer_setup(self, bottom, top):
        if len(top) != len(bottom) - 1:
            raise self.error(f"needs one top per filtered bottom: {len(bottom) - 1} data bottom(s), {len(top)} top(s)")
        self.num_bottom = len(bottom)
        self.first_reshape = True

    def allow_force_backward(self, bottom_index):
        return bottom_index != getattr(self, "num_bottom", 0) - 1

    def reshape(self, bottom, top):
        sel = bottom[-1]
        if not (sel.num_axes >= 1 and all(d == 1 for d in sel.shape[1:])):
            raise self.error(f"Selector blob (bottom[{len(bottom) - 1}]) dimensions must be singletons (1), "
                             f"except the first; got shape {sel.shape}")
        n = sel.shape[0]
        for i, b in enumerate(bottom[:-1]):
            if not (b.num_axes >= 1 and b.shape[0] == n):
                raise self.error(f"Each bottom should have the same 0th dimension as the selector blob: "
                                 f"bottom[{i}] has shape {b.shape}, the selector has shape {sel.shape}")
        # The selector is read on the host, as Caffe does.
        self.indices = np.flatnonzero(sel.cpu_data().reshape(n) != 0)
        count = n if self.first_reshape else len(self.indices)
        self.first_reshape = False
        for b, t in zip(bottom[:-1], top):
            t.reshape([count] + list(b.shape[1:]))

    def forward_xp(self, xp, bottom, top):
        idx = xp.asarray(self.indices)
        for b, t in zip(bottom[:-1], top):
            t.mutable_data_xp(xp)[...] = b.data_xp(xp)[idx]

    def backward_xp(self, xp, top, propagate_down, bottom):
        if propagate_down[-1]:
            raise self.error(f"cannot backpropagate to the filter index input (bottom[{len(bottom) - 1}], "
                             f"the selector)")
        idx = xp.asarray(self.indices)
        for i, (b, t) in enumerate(zip(bottom[:-1], top)):
            if propagate_down[i]:
                dx = b.mutable_diff_xp(xp)
                dx[...] = 0
                dx[idx] = t.diff_xp(xp)

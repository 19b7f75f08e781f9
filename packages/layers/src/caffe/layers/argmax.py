"""ArgMax: the indices (and optionally values) of the top_k largest entries. Forward only.

Without argmax_param.axis each item's flattened entries are ranked and the top has shape
(N, 1, top_k, 1, ...) (at least 3 axes), or (N, 2, top_k, ...) with out_max_val: [indices; values].
With axis the ranking is along that axis and the top is the bottom's shape with top_k there, holding
indices, or the values alone with out_max_val. Ties rank the larger index first (Caffe's
std::greater on (value, index) pairs).
"""
from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer


@register_layer("ArgMax")
class ArgMaxLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.argmax_param
        x = bottom[0]
        self.top_k = p.top_k
        self.out_max_val = p.out_max_val
        self.has_axis = p.HasField("axis")
        self.check(self.top_k >= 1, f"argmax_param.top_k must not be less than 1, got {self.top_k}")
        if self.has_axis:
            try:
                self.axis = x.canonical_axis_index(p.axis)
            except IndexError:
                raise self.error(f"argmax_param.axis {p.axis} is out of range for bottom[0] "
                                 f"with shape {x.shape}") from None
            self.check(self.top_k <= x.shape[self.axis],
                       f"argmax_param.top_k {self.top_k} must be less than or equal to the dimension of "
                       f"axis {self.axis} of bottom[0] with shape {x.shape}")
        else:
            self.check(x.num_axes >= 1 and self.top_k <= x.count(1),
                       f"argmax_param.top_k {self.top_k} must be less than or equal to the dimension of "
                       f"the flattened bottom blob per instance (bottom[0] shape {x.shape})")

    def reshape(self, bottom, top):
        x = bottom[0]
        if self.has_axis:
            shape = list(x.shape)
            shape[self.axis] = self.top_k
        else:
            shape = [1] * max(x.num_axes, 3)
            shape[0] = x.shape[0]
            shape[2] = self.top_k
            if self.out_max_val:
                shape[1] = 2
        top[0].reshape(shape)

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        if self.has_axis:
            outer, dim = bottom[0].count(0, self.axis), x.shape[self.axis]
            v = x.reshape(outer, dim, bottom[0].count(self.axis + 1))
        else:
            v = x.reshape(x.shape[0], -1, 1)
            dim = v.shape[1]
        # Descending by value, ties by the larger index: sort the reversed axis stably.
        stable = {"kind": "stable"} if xp.__name__ == "numpy" else {}  # CuPy's argsort is always stable
        order = xp.argsort(-v[:, ::-1, :], axis=1, **stable)[:, :self.top_k, :]
        idx = (dim - 1) - order
        vals = xp.take_along_axis(v, idx, axis=1)
        if self.has_axis:
            out = vals if self.out_max_val else idx
        elif self.out_max_val:
            out = xp.concatenate([idx, vals], axis=1)  # (N, 2 * top_k, 1): indices then values
        else:
            out = idx
        top[0].mutable_data_xp(xp)[...] = out.astype(top[0].dtype).reshape(top[0].shape)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if propagate_down[0]:
            raise self.error("ArgMax has no backward (it is not differentiable)")

"""Reshape: change the shape of bottom axes [axis, axis + num_axes) without copying.

reshape_param.shape: 0 copies the bottom dimension at that position, -1 (at most one) is inferred
from the element count. axis (negative counts from the end, -1 = after the last axis) and num_axes
(-1 = to the end) select the part of the bottom's shape that is replaced. The top SHARES the
bottom's data and diff.
"""
from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer


@register_layer("Reshape")
class ReshapeLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        self.check(top[0] is not bottom[0], "Reshape layer does not allow in-place computation")
        dims = list(self.layer_param.reshape_param.shape.dim)
        self.copy_axes = [i for i, d in enumerate(dims) if d == 0]
        inferred = [i for i, d in enumerate(dims) if d == -1]
        if len(inferred) > 1:
            raise self.error(f"reshape_param.shape {dims} contains multiple -1 dims; "
                             f"at most a single (1) value of -1 may be specified")
        bad = [d for d in dims if d < -1]
        if bad:
            raise self.error(f"reshape_param.shape {dims} has invalid dimension(s) {bad}")
        self.inferred_axis = inferred[0] if inferred else -1
        self.constant_count = 1
        for d in dims:
            if d > 0:
                self.constant_count *= d
        self.dims = dims

    def reshape(self, bottom, top):
        x = bottom[0]
        p = self.layer_param.reshape_param
        n = x.num_axes
        start = p.axis if p.axis >= 0 else n + p.axis + 1
        if not (0 <= start <= n):
            raise self.error(f"reshape_param.axis {p.axis} is out of range for bottom[0] with shape {x.shape}")
        if p.num_axes < -1:
            raise self.error(f"reshape_param.num_axes must be >= -1, got {p.num_axes}")
        end = n if p.num_axes == -1 else start + p.num_axes
        if end > n:
            raise self.error(f"reshape_param.axis {p.axis} + num_axes {p.num_axes} exceed the "
                             f"{n} axes of bottom[0] with shape {x.shape}")
        shape = list(x.shape[:start]) + list(self.dims) + list(x.shape[end:])
        for i in self.copy_axes:
            if start + i >= n:
                raise self.error(f"reshape_param.shape {self.dims} contains a 0 at position {i}, "
                                 f"but bottom[0] with shape {x.shape} has no axis {start + i} to copy")
            shape[start + i] = x.shape[start + i]
        if self.inferred_axis >= 0:
            explicit = self.constant_count * x.count(0, start) * x.count(end, n)
            for i in self.copy_axes:
                explicit *= shape[start + i]
            if explicit == 0 or x.count() % explicit:
                raise self.error(f"cannot infer the -1 in reshape_param.shape {self.dims}: bottom[0] count "
                                 f"{x.count()} (shape {x.shape}) is not divisible by {explicit}")
            shape[start + self.inferred_axis] = x.count() // explicit
        count = 1
        for d in shape:
            count *= d
        if count != x.count():
            raise self.error(f"output count must match input count: reshape_param.shape {self.dims} gives "
                             f"top shape {tuple(shape)} ({count}) for bottom[0] shape {x.shape} ({x.count()})")
        top[0].reshape(shape)
        top[0].share_data(x)
        top[0].share_diff(x)

    def forward_xp(self, xp, bottom, top):
        pass  # the top is a view of the bottom's memory

    def backward_xp(self, xp, top, propagate_down, bottom):
        pass  # the bottom's diff is the top's diff

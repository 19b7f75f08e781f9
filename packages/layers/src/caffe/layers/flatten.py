"""Flatten: collapse axes [axis, end_axis] into one. The top SHARES the bottom's data and diff (no copy)."""
from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer


@register_layer("Flatten")
class FlattenLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def _axis(self, blob, axis, field):
        try:
            return blob.canonical_axis_index(axis)
        except IndexError:
            raise self.error(f"flatten_param.{field} {axis} is out of range for bottom[0] "
                             f"with shape {blob.shape}") from None

    def reshape(self, bottom, top):
        self.check(top[0] is not bottom[0], "Flatten layer does not allow in-place computation")
        x = bottom[0]
        p = self.layer_param.flatten_param
        start = self._axis(x, p.axis, "axis")
        end = self._axis(x, p.end_axis, "end_axis")
        if start > end:
            raise self.error(f"flatten_param.axis ({p.axis} -> {start}) must not come after "
                             f"end_axis ({p.end_axis} -> {end}) for bottom[0] with shape {x.shape}")
        shape = list(x.shape[:start]) + [x.count(start, end + 1)] + list(x.shape[end + 1:])
        top[0].reshape(shape)
        top[0].share_data(x)
        top[0].share_diff(x)

    def forward_xp(self, xp, bottom, top):
        pass  # the top is a view of the bottom's memory

    def backward_xp(self, xp, top, propagate_down, bottom):
        pass  # the bottom's diff is the top's diff

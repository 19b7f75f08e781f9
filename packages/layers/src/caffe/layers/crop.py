"""Crop: cut bottom[0] to bottom[1]'s shape on the axes from crop_param.axis (default 2) on.

offset: none (0), one for every cropped axis, or one per cropped axis. bottom[1] only gives the
shape; it receives no gradient.
"""
from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer


@register_layer("Crop")
class CropLayer(Layer):
    exact_num_bottom_blobs = 2
    exact_num_top_blobs = 1

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1

    def reshape(self, bottom, top):
        p = self.layer_param.crop_param
        x, ref = bottom
        n = x.num_axes
        try:
            start = x.canonical_axis_index(p.axis)
        except IndexError:
            raise self.error(f"crop_param.axis {p.axis} is out of range for bottom[0] with shape {x.shape}") from None
        if ref.num_axes != n:
            raise self.error(f"bottom[1] (shape {ref.shape}) must have as many axes as "
                             f"bottom[0] (shape {x.shape})")
        offsets = list(p.offset)
        if len(offsets) > 1:
            if start + len(offsets) != n:
                raise self.error(f"number of crop_param.offset values ({len(offsets)}) must be equal to the number of "
                                 f"dimensions following axis {start} ({n - start}) for bottom[0] with shape {x.shape}")
        shape, self.slices = list(x.shape), []
        for i in range(n):
            off = 0
            if i >= start:
                off = offsets[0] if len(offsets) == 1 else (offsets[i - start] if offsets else 0)
                if x.shape[i] - off < ref.shape[i]:
                    raise self.error(f"the crop for dimension {i} is out-of-bounds with size {ref.shape[i]} and "
                                     f"offset {off}: bottom[0] shape {x.shape}, bottom[1] shape {ref.shape}")
                shape[i] = ref.shape[i]
            self.slices.append(slice(off, off + shape[i]))
        self.slices = tuple(self.slices)
        top[0].reshape(shape)

    def forward_xp(self, xp, bottom, top):
        top[0].mutable_data_xp(xp)[...] = bottom[0].data_xp(xp)[self.slices]

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dx = bottom[0].mutable_diff_xp(xp)
        dx[...] = 0
        dx[self.slices] = top[0].diff_xp(xp)

"""Silence: consumes bottoms so they are not reported as net outputs; backward zeroes their diffs."""
from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer


@register_layer("Silence")
class SilenceLayer(Layer):
    min_bottom_blobs = 1
    exact_num_top_blobs = 0

    def reshape(self, bottom, top):
        pass

    def forward_xp(self, xp, bottom, top):
        pass

    def backward_xp(self, xp, top, propagate_down, bottom):
        for b, down in zip(bottom, propagate_down):
            if down:
                b.mutable_diff_xp(xp)[...] = 0

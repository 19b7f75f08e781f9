"""TanH: y = tanh(x); dy/dx = 1 - y^2 (from the top data, so in-place use is safe)."""
from caffe.layers.layer import NeuronLayer
from caffe.layers.registry import register_layer


@register_layer("TanH")
class TanHLayer(NeuronLayer):
    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        top[0].mutable_data_xp(xp)[...] = xp.tanh(x)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        y = top[0].data_xp(xp)
        dy = top[0].diff_xp(xp)
        bottom[0].mutable_diff_xp(xp)[...] = dy * (1 - y * y)

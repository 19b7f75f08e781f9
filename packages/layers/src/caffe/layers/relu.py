"""ReLU: top = max(0, x) + negative_slope * min(0, x)."""
from caffe.layers.layer import NeuronLayer
from caffe.layers.registry import register_layer


@register_layer("ReLU")
class ReLULayer(NeuronLayer):
    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        slope = self.layer_param.relu_param.negative_slope
        y = top[0].mutable_data_xp(xp)
        if slope == 0:
            xp.maximum(x, 0, out=y)
        else:
            xp.multiply(x, xp.where(x > 0, 1.0, slope).astype(x.dtype, copy=False), out=y)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x = bottom[0].data_xp(xp)
        dy = top[0].diff_xp(xp)
        slope = self.layer_param.relu_param.negative_slope
        dx = bottom[0].mutable_diff_xp(xp)
        if slope == 0:
            xp.multiply(dy, x > 0, out=dx)
        else:
            xp.multiply(dy, xp.where(x > 0, 1.0, slope).astype(dy.dtype, copy=False), out=dx)

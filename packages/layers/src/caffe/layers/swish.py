"""Swish: y = x * sigmoid(beta * x) (swish_param.beta, default 1).

dy/dx = beta * y + sigmoid(beta * x) * (1 - beta * y), from the top data and the
stored sigmoid output (as Caffe), so in-place use is safe.
"""
from caffe.layers.layer import NeuronLayer
from caffe.layers.registry import register_layer
from caffe.layers.sigmoid import sigmoid_xp


@register_layer("Swish")
class SwishLayer(NeuronLayer):
    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        beta = self.layer_param.swish_param.beta
        self._sigmoid = sigmoid_xp(xp, x * beta)
        top[0].mutable_data_xp(xp)[...] = x * self._sigmoid

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        beta = self.layer_param.swish_param.beta
        y = top[0].data_xp(xp)
        dy = top[0].diff_xp(xp)
        s = self._sigmoid
        bottom[0].mutable_diff_xp(xp)[...] = dy * (beta * y + s * (1 - beta * y))

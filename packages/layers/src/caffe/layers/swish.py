"""Swish: y = x * sigmoid(beta * x) (swish_param.beta, default 1).

dy/dx = beta * y + sigmoid(beta * x) * (1 - beta * y), from the top data and the
sigmoid output kept in the sigmoid_output_ blob (as Caffe), so in-place use is safe.
CPU: one kernel pass each way.
"""
import numpy as np

from caffe.layers import _cpu
from caffe.layers.layer import NeuronLayer
from caffe.layers.registry import register_layer
from caffe.layers.sigmoid import sigmoid_xp


@register_layer("Swish")
class SwishLayer(NeuronLayer):
    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        _cpu.state_blob(self, "sigmoid_output_", bottom[0])

    def forward_cpu(self, bottom, top):
        if not _cpu.neuron_forward(self, _cpu.SWISH, bottom, top, a=self.layer_param.swish_param.beta,
                                   aux=self.sigmoid_output_):
            self.forward_xp(np, bottom, top)

    def backward_cpu(self, top, propagate_down, bottom):
        if propagate_down[0] and not _cpu.neuron_backward(self, _cpu.SWISH, top, bottom, reads_y=True,
                                                          aux=self.sigmoid_output_,
                                                          a=self.layer_param.swish_param.beta):
            self.backward_xp(np, top, propagate_down, bottom)

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        beta = self.layer_param.swish_param.beta
        s = self.sigmoid_output_.mutable_data_xp(xp)
        from caffe.layers.kernels import cuda_elementwise  # a real GPU: one pass
        if cuda_elementwise.swish_forward(xp, x, beta, s, top[0].mutable_data_xp(xp)):
            return
        s[...] = sigmoid_xp(xp, x * beta)
        top[0].mutable_data_xp(xp)[...] = x * s

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        beta = self.layer_param.swish_param.beta
        y = top[0].data_xp(xp)
        dy = top[0].diff_xp(xp)
        s = self.sigmoid_output_.data_xp(xp)
        from caffe.layers.kernels import cuda_elementwise  # a real GPU: one pass
        if cuda_elementwise.swish_backward(xp, y, s, dy, beta, bottom[0].mutable_diff_xp(xp)):
            return
        bottom[0].mutable_diff_xp(xp)[...] = dy * (beta * y + s * (1 - beta * y))

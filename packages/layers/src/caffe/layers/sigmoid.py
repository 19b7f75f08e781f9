"""Sigmoid: y = 1 / (1 + exp(-x)).

Computed as 0.5 * tanh(0.5 * x) + 0.5, as Caffe does: it never overflows.
Backward uses only the top data, so in-place use is safe. CPU: one kernel pass each way.
"""
import numpy as np

from caffe.layers import _cpu
from caffe.layers.layer import NeuronLayer
from caffe.layers.registry import register_layer


def sigmoid_xp(xp, x):
    return 0.5 * xp.tanh(0.5 * x) + 0.5


@register_layer("Sigmoid")
class SigmoidLayer(NeuronLayer):
    def forward_cpu(self, bottom, top):
        if not _cpu.neuron_forward(self, _cpu.SIGMOID, bottom, top):
            self.forward_xp(np, bottom, top)

    def backward_cpu(self, top, propagate_down, bottom):
        if propagate_down[0] and not _cpu.neuron_backward(self, _cpu.SIGMOID, top, bottom, reads_y=True):
            self.backward_xp(np, top, propagate_down, bottom)

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        from caffe.layers.kernels import cuda_elementwise  # a real GPU: one pass
        if cuda_elementwise.unary(xp, "sigmoid_forward", x, top[0].mutable_data_xp(xp)):
            return
        top[0].mutable_data_xp(xp)[...] = sigmoid_xp(xp, x)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        y = top[0].data_xp(xp)
        dy = top[0].diff_xp(xp)
        from caffe.layers.kernels import cuda_elementwise  # a real GPU: one pass
        if cuda_elementwise.unary_backward(xp, "sigmoid_backward", y, dy, bottom[0].mutable_diff_xp(xp)):
            return
        bottom[0].mutable_diff_xp(xp)[...] = dy * y * (1 - y)

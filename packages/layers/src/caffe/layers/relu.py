"""ReLU: top = max(0, x) + negative_slope * min(0, x).

In place is allowed: backward reads the bottom data, which in place is the top (its sign is
the input's for any negative_slope >= 0, as in Caffe). The CPU path is one kernel pass
(caffe.layers.kernels.elementwise); forward_xp / backward_xp are the GPU path and its reference.
"""
import numpy as np

from caffe.layers import _cpu
from caffe.layers.layer import NeuronLayer
from caffe.layers.registry import register_layer


@register_layer("ReLU")
class ReLULayer(NeuronLayer):
    def forward_cpu(self, bottom, top):
        if not _cpu.neuron_forward(self, _cpu.RELU, bottom, top, a=self.layer_param.relu_param.negative_slope):
            self.forward_xp(np, bottom, top)

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if not _cpu.neuron_backward(self, _cpu.RELU, top, bottom, reads_x="bottom",
                                    a=self.layer_param.relu_param.negative_slope):
            self.backward_xp(np, top, propagate_down, bottom)

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        slope = self.layer_param.relu_param.negative_slope
        y = top[0].mutable_data_xp(xp)
        from caffe.layers.kernels import cuda_elementwise  # a real GPU: one pass for a negative slope
        if slope == 0:
            xp.maximum(x, 0, out=y)
        elif not cuda_elementwise.relu(xp, x, x, slope, y):
            xp.multiply(x, xp.where(x > 0, 1.0, slope).astype(x.dtype, copy=False), out=y)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x = bottom[0].data_xp(xp)
        dy = top[0].diff_xp(xp)
        slope = self.layer_param.relu_param.negative_slope
        dx = bottom[0].mutable_diff_xp(xp)
        from caffe.layers.kernels import cuda_elementwise  # a real GPU: one pass
        if cuda_elementwise.relu(xp, x, dy, slope, dx):
            return
        if slope == 0:
            xp.multiply(dy, x > 0, out=dx)
        else:
            xp.multiply(dy, xp.where(x > 0, 1.0, slope).astype(dy.dtype, copy=False), out=dx)

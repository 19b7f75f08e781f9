"""ELU: y = x for x > 0, alpha * (exp(x) - 1) otherwise (elu_param.alpha, default 1).

Backward as Caffe: dy/dx = 1 for x > 0, alpha + y otherwise. In place, the bottom data is kept
in the bottom_memory_ blob (backward needs the input's sign). CPU: one kernel pass each way.
"""
import numpy as np

from caffe.layers import _cpu
from caffe.layers.layer import NeuronLayer
from caffe.layers.registry import register_layer


@register_layer("ELU")
class ELULayer(NeuronLayer):
    def forward_cpu(self, bottom, top):
        if not _cpu.neuron_forward(self, _cpu.ELU, bottom, top, a=self.layer_param.elu_param.alpha, save=True):
            self.forward_xp(np, bottom, top)

    def backward_cpu(self, top, propagate_down, bottom):
        if propagate_down[0] and not _cpu.neuron_backward(self, _cpu.ELU, top, bottom, reads_x="saved",
                                                          reads_y=True, a=self.layer_param.elu_param.alpha):
            self.backward_xp(np, top, propagate_down, bottom)

    def forward_xp(self, xp, bottom, top):
        _cpu.save_bottom(self, xp, bottom, top)
        x = bottom[0].data_xp(xp)
        alpha = self.layer_param.elu_param.alpha
        from caffe.layers.kernels import cuda_elementwise  # a real GPU: one pass
        if cuda_elementwise.elu_forward(xp, x, alpha, top[0].mutable_data_xp(xp)):
            return
        top[0].mutable_data_xp(xp)[...] = xp.maximum(x, 0) + alpha * xp.expm1(xp.minimum(x, 0))

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x = _cpu.saved_bottom(self, xp, bottom, top)
        y = top[0].data_xp(xp)
        dy = top[0].diff_xp(xp)
        alpha = self.layer_param.elu_param.alpha
        from caffe.layers.kernels import cuda_elementwise  # a real GPU: one pass
        if cuda_elementwise.elu_backward(xp, x, y, dy, alpha, bottom[0].mutable_diff_xp(xp)):
            return
        bottom[0].mutable_diff_xp(xp)[...] = dy * xp.where(x > 0, 1, alpha + y)

"""BNLL (binomial normal log likelihood): y = log(1 + exp(x)).

Forward in Caffe's overflow-safe form: x + log(1 + exp(-x)) for x > 0, else
log(1 + exp(x)), i.e. max(x, 0) + log1p(exp(-|x|)). Backward:
dy/dx = e / (e + 1) with e = exp(min(x, 50)) (Caffe's kBNLL_THRESHOLD).
In place, the bottom data is kept in the bottom_memory_ blob. CPU: one kernel pass each way.
"""
import numpy as np

from caffe.layers import _cpu
from caffe.layers.layer import NeuronLayer
from caffe.layers.registry import register_layer

BNLL_THRESHOLD = 50.0


@register_layer("BNLL")
class BNLLLayer(NeuronLayer):
    def forward_cpu(self, bottom, top):
        if not _cpu.neuron_forward(self, _cpu.BNLL, bottom, top, save=True):
            self.forward_xp(np, bottom, top)

    def backward_cpu(self, top, propagate_down, bottom):
        if propagate_down[0] and not _cpu.neuron_backward(self, _cpu.BNLL, top, bottom, reads_x="saved"):
            self.backward_xp(np, top, propagate_down, bottom)

    def forward_xp(self, xp, bottom, top):
        _cpu.save_bottom(self, xp, bottom, top)
        x = bottom[0].data_xp(xp)
        from caffe.layers.kernels import cuda_elementwise  # a real GPU: one pass
        if cuda_elementwise.bnll_forward(xp, x, top[0].mutable_data_xp(xp)):
            return
        top[0].mutable_data_xp(xp)[...] = xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x = _cpu.saved_bottom(self, xp, bottom, top)
        dy = top[0].diff_xp(xp)
        from caffe.layers.kernels import cuda_elementwise  # a real GPU: one pass
        if cuda_elementwise.bnll_backward(xp, x, dy, bottom[0].mutable_diff_xp(xp)):
            return
        e = xp.exp(xp.minimum(x, BNLL_THRESHOLD))
        bottom[0].mutable_diff_xp(xp)[...] = dy * e / (e + 1)

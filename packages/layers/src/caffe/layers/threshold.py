"""Threshold: y = 1 if x > threshold else 0 (threshold_param.threshold, default 0).

Not differentiable: Caffe's Backward is NOT_IMPLEMENTED, so asking for a
gradient to the bottom raises. CPU: one kernel pass.
"""
import numpy as np

from caffe.layers import _cpu
from caffe.layers.layer import NeuronLayer
from caffe.layers.registry import register_layer


@register_layer("Threshold")
class ThresholdLayer(NeuronLayer):
    def forward_cpu(self, bottom, top):
        if not _cpu.neuron_forward(self, _cpu.THRESHOLD, bottom, top, a=self.layer_param.threshold_param.threshold):
            self.forward_xp(np, bottom, top)

    def backward_cpu(self, top, propagate_down, bottom):
        self.backward_xp(np, top, propagate_down, bottom)

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        t = self.layer_param.threshold_param.threshold
        y = top[0].mutable_data_xp(xp)
        y[...] = (x > t).astype(y.dtype)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if any(propagate_down):
            raise self.error("backward is not implemented: the threshold function has no useful gradient "
                             "(set propagate_down: false, or keep this layer out of the backward path)")

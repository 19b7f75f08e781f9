"""AbsVal: y = |x|; dy/dx = sign(x) (0 at x == 0, as Caffe's caffe_cpu_sign). CPU: one kernel pass."""
import numpy as np

from caffe.layers import _cpu
from caffe.layers.layer import NeuronLayer
from caffe.layers.registry import register_layer


@register_layer("AbsVal")
class AbsValLayer(NeuronLayer):
    def layer_setup(self, bottom, top):
        # Backward needs the sign of the input, which |x| destroys.
        if top[0] is bottom[0]:
            raise self.error("does not allow in-place computation (top and bottom are the same blob)")

    def forward_cpu(self, bottom, top):
        if not _cpu.neuron_forward(self, _cpu.ABSVAL, bottom, top):
            self.forward_xp(np, bottom, top)

    def backward_cpu(self, top, propagate_down, bottom):
        if propagate_down[0] and not _cpu.neuron_backward(self, _cpu.ABSVAL, top, bottom, reads_x="bottom"):
            self.backward_xp(np, top, propagate_down, bottom)

    def forward_xp(self, xp, bottom, top):
        top[0].mutable_data_xp(xp)[...] = xp.abs(bottom[0].data_xp(xp))

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x = bottom[0].data_xp(xp)
        dy = top[0].diff_xp(xp)
        bottom[0].mutable_diff_xp(xp)[...] = dy * xp.sign(x)

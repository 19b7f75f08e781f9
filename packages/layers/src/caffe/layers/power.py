"""Power: y = (shift + scale * x) ^ power (power_param: power, scale, shift).

Caffe's special cases: when power * scale == 0 the output is the constant
(power == 0 ? 1 : shift ^ power) and the gradient is 0; when power == 1 the
gradient is the constant scale. Otherwise dy/dx = power * scale * (shift + scale * x)^(power - 1),
computed directly rather than as Caffe's y / (shift + scale * x), which is the same
value except that it does not turn into 0/0 at shift + scale * x == 0.
In place, the bottom data is kept in the bottom_memory_ blob. CPU: one kernel pass each way.
"""
import numpy as np

from caffe.layers import _cpu
from caffe.layers.layer import NeuronLayer
from caffe.layers.registry import register_layer


@register_layer("Power")
class PowerLayer(NeuronLayer):
    def layer_setup(self, bottom, top):
        p = self.layer_param.power_param
        self.power, self.scale, self.shift = float(p.power), float(p.scale), float(p.shift)
        self.diff_scale = self.power * self.scale

    def forward_cpu(self, bottom, top):
        if self.diff_scale == 0 or self.power == 1:  # a constant or affine map: NumPy does it in one pass
            self.forward_xp(np, bottom, top)
        elif not _cpu.neuron_forward(self, _cpu.POWER, bottom, top, self.scale, self.shift, self.power, save=True):
            self.forward_xp(np, bottom, top)

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if self.diff_scale == 0 or self.power == 1:
            self.backward_xp(np, top, propagate_down, bottom)
        elif not _cpu.neuron_backward(self, _cpu.POWER, top, bottom, reads_x="saved", a=self.scale, b=self.shift,
                                      c=self.power, d=self.diff_scale):
            self.backward_xp(np, top, propagate_down, bottom)

    def forward_xp(self, xp, bottom, top):
        if self.diff_scale != 0 and self.power != 1:
            _cpu.save_bottom(self, xp, bottom, top)  # backward needs the input
        x = bottom[0].data_xp(xp)
        y = top[0].mutable_data_xp(xp)
        if self.diff_scale == 0:
            # NumPy's power gives C's pow semantics (NaN / inf) where Python's ** would raise.
            with np.errstate(all="ignore"):
                y[...] = 1.0 if self.power == 0 else np.power(self.shift, self.power)
            return
        base = x * self.scale + self.shift if (self.scale != 1 or self.shift != 0) else x
        y[...] = base if self.power == 1 else base ** self.power

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dx = bottom[0].mutable_diff_xp(xp)
        if self.diff_scale == 0:
            dx[...] = 0
            return
        dy = top[0].diff_xp(xp)
        if self.power == 1:
            dx[...] = dy * self.diff_scale
            return
        x = _cpu.saved_bottom(self, xp, bottom, top)
        base = x * self.scale + self.shift
        dx[...] = dy * (self.diff_scale * base ** (self.power - 1))

"""Power: y = (shift + scale * x) ^ power (power_param: power, scale, shift).

Caffe's special cases: when power * scale == 0 the output is the constant
(power == 0 ? 1 : shift ^ power) and the gradient is 0; when power == 1 the
gradient is the constant scale. Otherwise dy/dx = power * scale * (shift + scale * x)^(power - 1),
computed directly rather than as Caffe's y / (shift + scale * x), which is the same
value except that it does not turn into 0/0 at shift + scale * x == 0.
"""
import numpy as np

from caffe.layers.layer import NeuronLayer
from caffe.layers.registry import register_layer


@register_layer("Power")
class PowerLayer(NeuronLayer):
    def layer_setup(self, bottom, top):
        p = self.layer_param.power_param
        self.power, self.scale, self.shift = float(p.power), float(p.scale), float(p.shift)
        self.diff_scale = self.power * self.scale

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        if bottom[0] is top[0]:
            self._saved_x = x.copy()  # in place: backward needs the input
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
        x = self._saved_x if bottom[0] is top[0] else bottom[0].data_xp(xp)
        base = x * self.scale + self.shift
        dx[...] = dy * (self.diff_scale * base ** (self.power - 1))

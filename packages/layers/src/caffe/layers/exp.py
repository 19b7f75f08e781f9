"""Exp: y = base ^ (shift + scale * x) (exp_param: base, -1 meaning e; scale; shift).

As Caffe: y = outer_scale * exp(inner_scale * x) with inner_scale = ln(base) * scale
and outer_scale = base ^ shift; dy/dx = inner_scale * y (from the top: in place is safe).
CPU: one kernel pass each way.
"""
import math

import numpy as np

from caffe.layers import _cpu
from caffe.layers.layer import NeuronLayer
from caffe.layers.registry import register_layer


@register_layer("Exp")
class ExpLayer(NeuronLayer):
    def layer_setup(self, bottom, top):
        p = self.layer_param.exp_param
        base = float(p.base)
        if base != -1 and not base > 0:
            raise self.error(f"exp_param.base must be strictly positive (or -1 for e), got {base}")
        # base -1 means e: log_base is exactly 1 then.
        log_base = 1.0 if base == -1 else math.log(base)
        if not math.isfinite(log_base):
            raise self.error(f"exp_param.base {base} gives a non-finite log(base) = {log_base}")
        self.inner_scale = log_base * float(p.scale)
        shift = float(p.shift)
        # NumPy rather than math: an overflow gives inf (as C's pow) instead of raising.
        with np.errstate(all="ignore"):
            self.outer_scale = 1.0 if shift == 0 else float(np.exp(shift) if base == -1 else np.power(base, shift))

    def forward_cpu(self, bottom, top):
        if not _cpu.neuron_forward(self, _cpu.EXP, bottom, top, self.inner_scale, self.outer_scale):
            self.forward_xp(np, bottom, top)

    def backward_cpu(self, top, propagate_down, bottom):
        if propagate_down[0] and not _cpu.neuron_backward(self, _cpu.EXP, top, bottom, reads_y=True,
                                                          a=self.inner_scale):
            self.backward_xp(np, top, propagate_down, bottom)

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        y = xp.exp(x if self.inner_scale == 1 else x * self.inner_scale)
        if self.outer_scale != 1:
            y *= self.outer_scale
        top[0].mutable_data_xp(xp)[...] = y

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        y = top[0].data_xp(xp)
        dy = top[0].diff_xp(xp)
        g = dy * y
        if self.inner_scale != 1:
            g *= self.inner_scale
        bottom[0].mutable_diff_xp(xp)[...] = g

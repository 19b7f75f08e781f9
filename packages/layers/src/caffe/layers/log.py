"""Log: y = log_base(shift + scale * x) (log_param: base, -1 meaning e; scale; shift).

dy/dx = scale / (ln(base) * (shift + scale * x)), as Caffe's backward_num_scale / (shift + scale * x).
In place, the bottom data is kept in the bottom_memory_ blob. CPU: one kernel pass each way.
"""
import math

import numpy as np

from caffe.layers import _cpu
from caffe.layers.layer import NeuronLayer
from caffe.layers.registry import register_layer


@register_layer("Log")
class LogLayer(NeuronLayer):
    def layer_setup(self, bottom, top):
        p = self.layer_param.log_param
        base = float(p.base)
        if base != -1 and not base > 0:
            raise self.error(f"log_param.base must be strictly positive (or -1 for e), got {base}")
        log_base = 1.0 if base == -1 else math.log(base)
        # base 1 has log(base) = 0: 1 / log(base) is infinite.
        if not math.isfinite(log_base) or log_base == 0:
            raise self.error(f"log_param.base {base} is invalid: 1 / log(base) is not finite")
        self.base_scale = 1.0 / log_base
        self.input_scale = float(p.scale)
        self.input_shift = float(p.shift)
        self.backward_num_scale = self.input_scale / log_base

    def _inner(self, x):
        if self.input_scale == 1 and self.input_shift == 0:
            return x
        return x * self.input_scale + self.input_shift

    def forward_cpu(self, bottom, top):
        if not _cpu.neuron_forward(self, _cpu.LOG, bottom, top, self.input_scale, self.input_shift,
                                   self.base_scale, save=True):
            self.forward_xp(np, bottom, top)

    def backward_cpu(self, top, propagate_down, bottom):
        if propagate_down[0] and not _cpu.neuron_backward(self, _cpu.LOG, top, bottom, reads_x="saved",
                                                          a=self.input_scale, b=self.input_shift,
                                                          d=self.backward_num_scale):
            self.backward_xp(np, top, propagate_down, bottom)

    def forward_xp(self, xp, bottom, top):
        _cpu.save_bottom(self, xp, bottom, top)  # in place: backward needs the input
        x = bottom[0].data_xp(xp)
        y = xp.log(self._inner(x))
        if self.base_scale != 1:
            y *= self.base_scale
        top[0].mutable_data_xp(xp)[...] = y

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x = _cpu.saved_bottom(self, xp, bottom, top)
        dy = top[0].diff_xp(xp)
        bottom[0].mutable_diff_xp(xp)[...] = dy * (self.backward_num_scale / self._inner(x))

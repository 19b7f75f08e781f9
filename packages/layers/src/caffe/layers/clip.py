"""Clip: y = max(min, min(x, max)) (clip_param: min, max, both required).

The gradient passes where min <= x <= max and is 0 outside, as in Caffe. In place, the
bottom data is kept in the bottom_memory_ blob. CPU: one kernel pass each way.
"""
import numpy as np

from caffe.layers import _cpu
from caffe.layers.layer import NeuronLayer
from caffe.layers.registry import register_layer


@register_layer("Clip")
class ClipLayer(NeuronLayer):
    def layer_setup(self, bottom, top):
        p = self.layer_param.clip_param
        for f in ("min", "max"):
            if not p.HasField(f):
                raise self.error(f"clip_param.{f} is required")
        if p.min > p.max:
            raise self.error(f"clip_param.min ({p.min}) must not exceed clip_param.max ({p.max})")
        self.min, self.max = float(p.min), float(p.max)

    def forward_cpu(self, bottom, top):
        if not _cpu.neuron_forward(self, _cpu.CLIP, bottom, top, self.min, self.max, save=True):
            self.forward_xp(np, bottom, top)

    def backward_cpu(self, top, propagate_down, bottom):
        if propagate_down[0] and not _cpu.neuron_backward(self, _cpu.CLIP, top, bottom, reads_x="saved",
                                                          a=self.min, b=self.max):
            self.backward_xp(np, top, propagate_down, bottom)

    def forward_xp(self, xp, bottom, top):
        _cpu.save_bottom(self, xp, bottom, top)  # in place: backward needs the unclipped input
        x = bottom[0].data_xp(xp)
        top[0].mutable_data_xp(xp)[...] = xp.clip(x, self.min, self.max)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x = _cpu.saved_bottom(self, xp, bottom, top)
        dy = top[0].diff_xp(xp)
        bottom[0].mutable_diff_xp(xp)[...] = dy * ((x >= self.min) & (x <= self.max))

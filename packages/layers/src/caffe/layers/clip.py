"""Clip: y = max(min, min(x, max)) (clip_param: min, max, both required).

The gradient passes where min <= x <= max and is 0 outside, as in Caffe.
"""
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

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        if bottom[0] is top[0]:
            self._saved_x = x.copy()  # in place: backward needs the unclipped input
        top[0].mutable_data_xp(xp)[...] = xp.clip(x, self.min, self.max)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x = self._saved_x if bottom[0] is top[0] else bottom[0].data_xp(xp)
        dy = top[0].diff_xp(xp)
        bottom[0].mutable_diff_xp(xp)[...] = dy * ((x >= self.min) & (x <= self.max))

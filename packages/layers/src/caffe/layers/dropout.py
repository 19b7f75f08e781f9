"""Dropout (dropout_param.dropout_ratio, default 0.5).

TRAIN: each element is kept with probability 1 - ratio (a Bernoulli mask drawn
from caffe.blob.context.rng(), so a seed reproduces it on CPU and GPU alike) and
scaled by 1 / (1 - ratio); backward applies the same mask and scale. TEST: identity.
With the fork-only field scale_train = false (not in BVLC's caffe.proto; honoured
when the schema has it): TRAIN applies the bare mask and TEST multiplies by 1 - ratio.
"""
from caffe.blob import context
from caffe.layers.layer import NeuronLayer
from caffe.layers.registry import register_layer
from caffe.proto import caffe_pb2


@register_layer("Dropout")
class DropoutLayer(NeuronLayer):
    def layer_setup(self, bottom, top):
        ratio = float(self.layer_param.dropout_param.dropout_ratio)
        if not 0.0 <= ratio < 1.0:
            raise self.error(f"dropout_param.dropout_ratio must be in [0, 1), got {ratio}")
        self.ratio = ratio
        self.scale = 1.0 / (1.0 - ratio)
        self.scale_train = self.read_scale_train()
        self._mask = None

    def read_scale_train(self) -> bool:
        p = self.layer_param.dropout_param
        if "scale_train" in p.DESCRIPTOR.fields_by_name:
            return bool(p.scale_train)
        return True

    @property
    def train(self) -> bool:
        return self.phase == caffe_pb2.TRAIN

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        y = top[0].mutable_data_xp(xp)
        if self.train:
            keep = context.rng().random(x.shape) < (1.0 - self.ratio)
            mask = xp.asarray(keep, dtype=x.dtype)
            if self.scale_train:
                mask *= self.scale
            self._mask = mask  # mask with its scale folded in: backward multiplies by it too
            y[...] = x * mask
        elif self.scale_train:
            y[...] = x
        else:
            y[...] = x * (1.0 - self.ratio)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].diff_xp(xp)
        dx = bottom[0].mutable_diff_xp(xp)
        if self.train:
            if self._mask is None or self._mask.shape != dy.shape:
                raise self.error("backward in TRAIN phase needs a forward pass first (no dropout mask)")
            dx[...] = dy * self._mask
        elif self.scale_train:
            dx[...] = dy
        else:
            dx[...] = dy * (1.0 - self.ratio)

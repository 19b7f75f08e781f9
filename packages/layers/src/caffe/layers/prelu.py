"""PReLU: y = max(0, x) + a_c * min(0, x), one learnable slope a_c per channel (axis 1).

prelu_param: filler (default constant 0.25), channel_shared (one slope for all
channels, a 0-axis blob as in Caffe). The slope gradient accumulates into the
parameter diff (summed over batch and spatial positions), as Caffe's does.
"""
from caffe.blob import Blob
from caffe.layers import filler as _filler
from caffe.layers.layer import NeuronLayer, dtype_of
from caffe.layers.registry import register_layer


@register_layer("PReLU")
class PReLULayer(NeuronLayer):
    def layer_setup(self, bottom, top):
        self.check(bottom[0].num_axes >= 2,
                   f"bottom blob must have at least 2 axes (N, C, ...), got shape {bottom[0].shape}")
        p = self.layer_param.prelu_param
        channels = bottom[0].shape[1]
        self.channel_shared = p.channel_shared
        if not self.blobs:
            self.blobs = [Blob([] if self.channel_shared else [channels], dtype=dtype_of(bottom))]
            fp = p.filler if p.HasField("filler") else _filler.filler_param("constant", value=0.25)
            _filler.fill(self.blobs[0], fp)
        expect = 1 if self.channel_shared else channels
        self.check(self.blobs[0].count() == expect,
                   f"negative slope blob has {self.blobs[0].count()} values but "
                   f"{'channel_shared needs 1' if self.channel_shared else f'{channels} channels need {channels}'}")
        if not self._param_propagate_down:
            self.set_param_propagate_down(0, True)

    def reshape(self, bottom, top):
        self.check(bottom[0].num_axes >= 2,
                   f"bottom blob must have at least 2 axes (N, C, ...), got shape {bottom[0].shape}")
        top[0].reshape_like(bottom[0])

    def _slope(self, xp, ndim):
        a = self.blobs[0].data_xp(xp)
        if self.channel_shared:
            return a.reshape(())
        return a.reshape((1, -1) + (1,) * (ndim - 2))  # broadcast over axis 1

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        if bottom[0] is top[0]:
            self._saved_x = x.copy()  # in place: backward needs the input
        a = self._slope(xp, x.ndim)
        top[0].mutable_data_xp(xp)[...] = xp.maximum(x, 0) + a * xp.minimum(x, 0)

    def backward_xp(self, xp, top, propagate_down, bottom):
        x = self._saved_x if bottom[0] is top[0] else bottom[0].data_xp(xp)
        dy = top[0].diff_xp(xp)
        neg = x <= 0
        if self.param_propagate_down(0):
            g = dy * x * neg
            axes = tuple(i for i in range(x.ndim) if self.channel_shared or i != 1)
            pd = self.blobs[0].mutable_diff_xp(xp)
            pd += g.sum(axis=axes).reshape(pd.shape)
        if propagate_down[0]:
            a = self._slope(xp, x.ndim)
            bottom[0].mutable_diff_xp(xp)[...] = dy * xp.where(neg, a, 1)

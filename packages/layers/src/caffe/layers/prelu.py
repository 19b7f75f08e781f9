"""PReLU: y = max(0, x) + a_c * min(0, x), one learnable slope a_c per channel (axis 1).

prelu_param: filler (default constant 0.25), channel_shared (one slope for all
channels, a 0-axis blob as in Caffe). The slope gradient accumulates into the
parameter diff (summed over batch and spatial positions), as Caffe's does. In place, the
bottom data is kept in the bottom_memory_ blob (Caffe's). CPU: one kernel pass each way
(caffe.layers.kernels.channelwise), the slope gradient summed in double.
"""
import numpy as np

from caffe.blob import Blob
from caffe.layers import _cpu
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

    def _dims(self, bottom):
        """(outer, dim, inner) of bottom[0] for the channel-wise kernel: dim = the slopes."""
        x = bottom[0]
        if self.channel_shared:
            return 1, 1, x.count()
        return x.shape[0], x.shape[1], x.count(2)

    def forward_cpu(self, bottom, top):
        if not _cpu.usable(_cpu.channelwise, bottom[0], top[0], self.blobs[0]):
            return self.forward_xp(np, bottom, top)
        dt = bottom[0].dtype
        saved = _cpu.empty(dt)
        if bottom[0] is top[0]:
            saved = _cpu.flat(_cpu.state_blob(self, "bottom_memory_", bottom[0]).mutable_cpu_data())
        _cpu.channelwise.channel_forward(_cpu.CH_PRELU, _cpu.flat(bottom[0].cpu_data()), _cpu.flat(self.blobs[0].cpu_data()),
                                         _cpu.empty(dt), _cpu.flat(top[0].mutable_cpu_data()), saved,
                                         *self._dims(bottom))

    def backward_cpu(self, top, propagate_down, bottom):
        if not _cpu.usable(_cpu.channelwise, bottom[0], top[0], self.blobs[0]):
            return self.backward_xp(np, top, propagate_down, bottom)
        want_slope = self.param_propagate_down(0)
        if not (want_slope or propagate_down[0]):
            return
        dt = bottom[0].dtype
        outer, dim, inner = self._dims(bottom)
        sums = np.zeros(dim) if want_slope else _cpu.EMPTY_DOUBLE
        dx = _cpu.flat(bottom[0].mutable_cpu_diff()) if propagate_down[0] else _cpu.empty(dt)
        x = _cpu.flat(_cpu.saved_bottom(self, np, bottom, top))
        _cpu.channelwise.channel_backward(_cpu.CH_PRELU, _cpu.flat(top[0].cpu_diff()), x, _cpu.flat(self.blobs[0].cpu_data()),
                                          dx, sums, _cpu.EMPTY_DOUBLE, outer, dim, inner)
        if want_slope:
            pd = self.blobs[0].mutable_cpu_diff()
            pd += sums.reshape(pd.shape).astype(dt)

    def _slope(self, xp, ndim):
        a = self.blobs[0].data_xp(xp)
        if self.channel_shared:
            return a.reshape(())
        return a.reshape((1, -1) + (1,) * (ndim - 2))  # broadcast over axis 1

    def _device_dims(self, x):
        """(outer, slopes, inner) of x for the device kernels."""
        if self.channel_shared:
            return 1, 1, x.size
        return x.shape[0], x.shape[1], x.size // max(x.shape[0] * x.shape[1], 1)

    def forward_xp(self, xp, bottom, top):
        _cpu.save_bottom(self, xp, bottom, top)  # in place: backward needs the input
        x = bottom[0].data_xp(xp)
        from caffe.layers.kernels import cuda_channelwise  # a real GPU: one pass
        if cuda_channelwise.prelu_forward(xp, x, self.blobs[0].data_xp(xp).reshape(-1), top[0].mutable_data_xp(xp),
                                          *self._device_dims(x)[1:]):
            return
        a = self._slope(xp, x.ndim)
        top[0].mutable_data_xp(xp)[...] = xp.maximum(x, 0) + a * xp.minimum(x, 0)

    def backward_xp(self, xp, top, propagate_down, bottom):
        x = _cpu.saved_bottom(self, xp, bottom, top)
        dy = top[0].diff_xp(xp)
        from caffe.layers.kernels import cuda_channelwise  # a real GPU: one pass each (slope gradient, bottom diff)
        outer, dim, inner = self._device_dims(x)
        slope_done = not self.param_propagate_down(0)
        if not slope_done:
            g = cuda_channelwise.channel_dot(xp, dy, x, outer, dim, inner, negative_only=True)
            if g is not None:
                pd = self.blobs[0].mutable_diff_xp(xp)
                pd += g.reshape(pd.shape)
                slope_done = True
        diff_done = not propagate_down[0] or cuda_channelwise.prelu_backward(
            xp, x, dy, self.blobs[0].data_xp(xp).reshape(-1), bottom[0].mutable_diff_xp(xp), dim, inner)
        neg = None if slope_done and diff_done else x <= 0
        if not slope_done:
            g = dy * x * neg
            axes = tuple(i for i in range(x.ndim) if self.channel_shared or i != 1)
            pd = self.blobs[0].mutable_diff_xp(xp)
            pd += g.sum(axis=axes).reshape(pd.shape)
        if not diff_done:
            a = self._slope(xp, x.ndim)
            bottom[0].mutable_diff_xp(xp)[...] = dy * xp.where(neg, a, 1)

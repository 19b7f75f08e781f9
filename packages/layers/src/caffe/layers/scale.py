"""Scale: top = bottom[0] * s (+ bias), s broadcast over bottom[0]'s axes [axis, axis + s.num_axes).

s is bottom[1] (two bottoms) or a learned blob of shape bottom[0].shape[axis:axis+num_axes]
(num_axes = -1: to the end; 0: a scalar), filled by scale_param.filler (default constant 1).
bias_term adds a learned bias through an internal Bias layer, as Caffe does: its blob comes after the
scale blob (blobs = [scale, bias] with one bottom, [bias] with two). May run in place (the bottom data
is kept in the temp_ blob, as Caffe, for the scale gradient). Parameter gradients accumulate; bottom
gradients are overwritten. CPU: one kernel pass each way, the bias fused in (y = x * s + b; backward
computes dx and both parameter gradients, summed in double, from one read of dy and x).
"""
import numpy as np

from caffe.blob import Blob
from caffe.layers import _cpu, filler
from caffe.layers.bias import broadcast_dims, param_shape
from caffe.layers.layer import Layer, dtype_of
from caffe.layers.registry import create_layer, register_layer


@register_layer("Scale")
class ScaleLayer(Layer):
    min_bottom_blobs = 1
    max_bottom_blobs = 2
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.scale_param
        self.bias_layer = None
        if len(bottom) == 1 and not self.blobs:
            shape = param_shape(self, bottom[0], p.axis, p.num_axes, "scale_param")
            s = Blob(list(shape), dtype=dtype_of(bottom))
            if p.HasField("filler"):
                filler.fill(s, p.filler)
            else:
                filler.fill(s, filler.filler_param("constant", value=1.0))
            self.blobs = [s]
        if p.bias_term:
            bp = type(self.layer_param)()
            bp.CopyFrom(self.layer_param)
            bp.type = "Bias"
            del bp.blobs[:]
            bp.bias_param.axis = p.axis
            bp.bias_param.num_axes = bottom[1].num_axes if len(bottom) > 1 else p.num_axes
            bp.bias_param.filler.CopyFrom(p.bias_filler)
            self.bias_layer = create_layer(bp)
            preloaded = len(self.blobs) + len(bottom) >= 3  # the bias came with the caffemodel
            if preloaded:
                self.bias_layer.blobs = [self.blobs[-1]]
            self.bias_layer.SetUp([bottom[0]], top)
            if preloaded:
                self.bias_param_id = len(self.blobs) - 1
            else:
                self.bias_param_id = len(self.blobs)
                self.blobs.append(self.bias_layer.blobs[0])
        for i in range(len(self.blobs)):
            self.set_param_propagate_down(i, True)

    def _scale(self, bottom):
        return bottom[1] if len(bottom) > 1 else self.blobs[0]

    def reshape(self, bottom, top):
        what = "bottom[1] (the scale)" if len(bottom) > 1 else "the scale blob"
        self.outer, self.dim, self.inner = broadcast_dims(self, bottom[0], self._scale(bottom),
                                                          self.layer_param.scale_param.axis, what)
        if bottom[0] is not top[0]:
            top[0].reshape_like(bottom[0])
        if self.bias_layer is not None:
            self.bias_layer.reshape([top[0]], top)

    def _bias_blob(self):
        return self.bias_layer.blobs[0] if self.bias_layer is not None else None

    def _bias_fused(self):
        """Whether one pass can add the bias (none, or one with the scale's geometry): a stored bias (the
        LayerParameter's blobs) may span more axes than the scale; the bias layer then adds it."""
        bl = self.bias_layer
        return bl is None or (bl.dim, bl.inner) == (self.dim, self.inner)

    def forward_cpu(self, bottom, top):
        s, b = self._scale(bottom), self._bias_blob()
        if not (self._bias_fused()
                and _cpu.usable(_cpu.channelwise, bottom[0], top[0], s, *([b] if b is not None else []))):
            return self.forward_xp(np, bottom, top)
        dt = bottom[0].dtype
        saved = _cpu.empty(dt)
        if bottom[0] is top[0]:
            saved = _cpu.flat(_cpu.state_blob(self, "temp_", bottom[0]).mutable_cpu_data())
        _cpu.channelwise.channel_forward(_cpu.CH_AFFINE, _cpu.flat(bottom[0].cpu_data()), _cpu.flat(s.cpu_data()),
                                         _cpu.flat(b.cpu_data()) if b is not None else _cpu.empty(dt),
                                         _cpu.flat(top[0].mutable_cpu_data()), saved, self.outer, self.dim,
                                         self.inner)

    def backward_cpu(self, top, propagate_down, bottom):
        s, b = self._scale(bottom), self._bias_blob()
        if not (self._bias_fused()
                and _cpu.usable(_cpu.channelwise, bottom[0], top[0], s, *([b] if b is not None else []))):
            return self.backward_xp(np, top, propagate_down, bottom)
        learned = len(bottom) == 1
        want_bias = b is not None and self.param_propagate_down(self.bias_param_id)
        want_scale = (learned and self.param_propagate_down(0)) or (not learned and propagate_down[1])
        if not (want_bias or want_scale or propagate_down[0]):
            return
        dt = bottom[0].dtype
        ds = np.zeros(self.dim) if want_scale else _cpu.EMPTY_DOUBLE
        db = np.zeros(self.dim) if want_bias else _cpu.EMPTY_DOUBLE
        x = _cpu.flat(self._bottom_data(np, bottom, top)) if want_scale else _cpu.empty(dt)
        dx = _cpu.flat(bottom[0].mutable_cpu_diff()) if propagate_down[0] else _cpu.empty(dt)
        # One pass: dy is read before dx (which may be dy, in place) is written at each position.
        _cpu.channelwise.channel_backward(_cpu.CH_AFFINE, _cpu.flat(top[0].cpu_diff()), x, _cpu.flat(s.cpu_data()),
                                          dx, ds, db, self.outer, self.dim, self.inner)
        if want_bias:
            diff = b.mutable_cpu_diff()
            diff += db.reshape(diff.shape).astype(dt)
        if want_scale:
            diff = s.mutable_cpu_diff()
            if learned:
                diff += ds.reshape(diff.shape).astype(dt)
            else:
                diff[...] = ds.reshape(diff.shape)

    def _bottom_data(self, xp, bottom, top):
        """The bottom data forward saw: in place, the copy in temp_."""
        return _cpu.saved_bottom(self, xp, bottom, top, "temp_")

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        xr = x.reshape(self.outer, self.dim, self.inner)
        if bottom[0] is top[0]:
            # In place, the top overwrites x, which the scale gradient needs: keep a copy (Caffe's temp_).
            _cpu.state_blob(self, "temp_", bottom[0]).mutable_data_xp(xp)[...] = x
        s = self._scale(bottom).data_xp(xp).reshape(1, self.dim, 1)
        from caffe.layers.kernels import cuda_channelwise  # a real GPU: scale and bias in one pass
        b = self._bias_blob()
        if self._bias_fused() and cuda_channelwise.channel_scale(
                xp, x, s.reshape(-1), None if b is None else b.data_xp(xp).reshape(-1), top[0].mutable_data_xp(xp),
                self.dim, self.inner):
            return
        top[0].mutable_data_xp(xp)[...] = (xr * s).reshape(x.shape)
        if self.bias_layer is not None:
            self.bias_layer.forward_xp(xp, [top[0]], top)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if self.bias_layer is not None and self.param_propagate_down(self.bias_param_id):
            self.bias_layer.backward_xp(xp, top, [False], [top[0]])
        learned = len(bottom) == 1
        dy = top[0].diff_xp(xp).reshape(self.outer, self.dim, self.inner)
        if (learned and self.param_propagate_down(0)) or (not learned and propagate_down[1]):
            x = self._bottom_data(xp, bottom, top).reshape(dy.shape)
            from caffe.layers.kernels import cuda_channelwise  # a real GPU: one read of dy and x
            ds = cuda_channelwise.channel_dot(xp, dy, x, self.outer, self.dim, self.inner)
            if ds is None:
                ds = (dy * x).sum(axis=(0, 2))
            diff = self._scale(bottom).mutable_diff_xp(xp)
            if learned:
                diff += ds.reshape(diff.shape)
            else:
                diff[...] = ds.reshape(diff.shape)
        if propagate_down[0]:
            s = self._scale(bottom).data_xp(xp).reshape(1, self.dim, 1)
            from caffe.layers.kernels import cuda_channelwise  # a real GPU: one pass
            if cuda_channelwise.channel_scale(xp, dy, s.reshape(-1), None, bottom[0].mutable_diff_xp(xp), self.dim,
                                              self.inner):
                return
            dx = dy * s
            bottom[0].mutable_diff_xp(xp)[...] = dx.reshape(bottom[0].shape)

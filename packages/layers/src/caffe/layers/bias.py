"""Bias: top = bottom[0] + b, b broadcast over bottom[0]'s axes [axis, axis + b.num_axes).

b is bottom[1] (two bottoms) or a learned blob of shape bottom[0].shape[axis:axis+num_axes]
(num_axes = -1: to the end; 0: a scalar) filled by bias_param.filler (default constant 0).
A scalar b ignores axis. May run in place. The parameter gradient accumulates (Caffe's convention);
bottom[1]'s gradient is overwritten. CPU: one kernel pass each way (caffe.layers.kernels.channelwise;
the bias gradient summed in double).
"""
import numpy as np

from caffe.blob import Blob
from caffe.layers import _cpu, filler
from caffe.layers.layer import Layer, dtype_of
from caffe.layers.registry import register_layer


def broadcast_dims(layer, bottom0, operand, axis_param, what):
    """(outer, dim, inner) for broadcasting `operand` over bottom0 from axis_param (Scale and Bias)."""
    if operand.num_axes == 0:
        axis = 0  # a scalar: every axis choice is equivalent
    else:
        try:
            axis = bottom0.canonical_axis_index(axis_param)
        except IndexError:
            raise layer.error(f"axis {axis_param} is out of range for bottom[0] "
                              f"with shape {bottom0.shape}") from None
    k = operand.num_axes
    if bottom0.num_axes < axis + k or tuple(bottom0.shape[axis:axis + k]) != tuple(operand.shape):
        raise layer.error(f"{what} shape {operand.shape} must match bottom[0] shape {bottom0.shape} "
                          f"at axes {axis}..{axis + k - 1} (axis {axis_param})")
    return bottom0.count(0, axis), operand.count(), bottom0.count(axis + k)


def param_shape(layer, bottom0, axis_param, num_axes, field):
    """bottom0.shape[axis:axis+num_axes] (num_axes -1: to the end), checked, for a learned operand."""
    try:
        axis = bottom0.canonical_axis_index(axis_param)
    except IndexError:
        raise layer.error(f"{field}.axis {axis_param} is out of range for bottom[0] "
                          f"with shape {bottom0.shape}") from None
    if num_axes < -1:
        raise layer.error(f"{field}.num_axes must be -1 or non-negative, got {num_axes}")
    if num_axes != -1 and bottom0.num_axes < axis + num_axes:
        raise layer.error(f"{field}: bottom[0] with shape {bottom0.shape} has too few axes for "
                          f"axis {axis} + num_axes {num_axes}")
    return bottom0.shape[axis:] if num_axes == -1 else bottom0.shape[axis:axis + num_axes]


@register_layer("Bias")
class BiasLayer(Layer):
    min_bottom_blobs = 1
    max_bottom_blobs = 2
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.bias_param
        if len(bottom) == 1 and not self.blobs:
            shape = param_shape(self, bottom[0], p.axis, p.num_axes, "bias_param")
            b = Blob(list(shape), dtype=dtype_of(bottom))
            filler.fill(b, p.filler)
            self.blobs = [b]
        for i in range(len(self.blobs)):
            self.set_param_propagate_down(i, True)

    def _bias(self, bottom):
        return bottom[1] if len(bottom) > 1 else self.blobs[0]

    def reshape(self, bottom, top):
        what = "bottom[1] (the bias)" if len(bottom) > 1 else "the bias blob"
        self.outer, self.dim, self.inner = broadcast_dims(self, bottom[0], self._bias(bottom),
                                                          self.layer_param.bias_param.axis, what)
        if bottom[0] is not top[0]:
            top[0].reshape_like(bottom[0])

    def forward_cpu(self, bottom, top):
        b = self._bias(bottom)
        if not _cpu.usable(_cpu.channelwise, bottom[0], top[0], b):
            return self.forward_xp(np, bottom, top)
        dt = bottom[0].dtype
        _cpu.channelwise.channel_forward(_cpu.CH_AFFINE, _cpu.flat(bottom[0].cpu_data()), _cpu.empty(dt),
                                         _cpu.flat(b.cpu_data()), _cpu.flat(top[0].mutable_cpu_data()),
                                         _cpu.empty(dt), self.outer, self.dim, self.inner)

    def backward_cpu(self, top, propagate_down, bottom):
        target = self._bias(bottom)
        if not _cpu.usable(_cpu.channelwise, bottom[0], top[0], target):
            return self.backward_xp(np, top, propagate_down, bottom)
        learned = len(bottom) == 1
        want_bias = (learned and self.param_propagate_down(0)) or (not learned and propagate_down[1])
        copy = propagate_down[0] and bottom[0] is not top[0]
        if not (want_bias or copy):
            return
        dt = bottom[0].dtype
        sums = np.zeros(self.dim) if want_bias else _cpu.EMPTY_DOUBLE
        dx = _cpu.flat(bottom[0].mutable_cpu_diff()) if copy else _cpu.empty(dt)
        _cpu.channelwise.channel_backward(_cpu.CH_AFFINE, _cpu.flat(top[0].cpu_diff()), _cpu.empty(dt),
                                          _cpu.empty(dt), dx, _cpu.EMPTY_DOUBLE, sums, self.outer, self.dim,
                                          self.inner)
        if want_bias:
            diff = target.mutable_cpu_diff()
            if learned:
                diff += sums.reshape(diff.shape).astype(dt)
            else:
                diff[...] = sums.reshape(diff.shape)

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        b = self._bias(bottom).data_xp(xp).reshape(1, self.dim, 1)
        from caffe.layers.kernels import cuda_channelwise  # a real GPU: one pass
        if cuda_channelwise.channel_scale(xp, x, None, b.reshape(-1), top[0].mutable_data_xp(xp), self.dim,
                                          self.inner):
            return
        y = x.reshape(self.outer, self.dim, self.inner) + b
        top[0].mutable_data_xp(xp)[...] = y.reshape(x.shape)

    def backward_xp(self, xp, top, propagate_down, bottom):
        dy = top[0].diff_xp(xp)
        if propagate_down[0] and bottom[0] is not top[0]:
            bottom[0].mutable_diff_xp(xp)[...] = dy
        learned = len(bottom) == 1
        if (learned and self.param_propagate_down(0)) or (not learned and propagate_down[1]):
            db = dy.reshape(self.outer, self.dim, self.inner).sum(axis=(0, 2))
            target = self._bias(bottom)
            diff = target.mutable_diff_xp(xp)
            if learned:
                diff += db.reshape(diff.shape)
            else:
                diff[...] = db.reshape(diff.shape)

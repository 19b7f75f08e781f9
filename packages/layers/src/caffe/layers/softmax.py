"""Softmax over one axis (softmax_param.axis, default 1, negative counts from the end).

Numerically stable: the max along the axis is subtracted before exp.
Backward: dx = (dy - sum(dy * y, axis)) * y. CPU: one kernel pass each way
(caffe.layers.kernels.softmax; the sums in double).
"""
import numpy as np

from caffe.layers import _cpu
from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer


def softmax_xp(xp, x, axis):
    e = xp.exp(x - x.max(axis=axis, keepdims=True))
    e /= e.sum(axis=axis, keepdims=True)
    return e


def softmax_cpu(x_blob, y_blob, axis) -> bool:
    """y = softmax(x) over axis through the kernel, when usable."""
    if not _cpu.usable(_cpu.softmax, x_blob, y_blob):
        return False
    outer, c, inner = x_blob.count(0, axis), x_blob.shape[axis], x_blob.count(axis + 1)
    _cpu.softmax.softmax_forward(_cpu.flat(x_blob.cpu_data()), _cpu.flat(y_blob.mutable_cpu_data()), outer, c, inner)
    return True


def canonical_axis(layer, blob, axis, field):
    """blob.canonical_axis_index with an error naming the layer and the parameter field."""
    try:
        return blob.canonical_axis_index(axis)
    except IndexError:
        raise layer.error(f"{field} = {axis} is out of range for the bottom blob of shape {blob.shape} "
                          f"({blob.num_axes} axes)") from None


@register_layer("Softmax")
class SoftmaxLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def reshape(self, bottom, top):
        self.axis = canonical_axis(self, bottom[0], self.layer_param.softmax_param.axis, "softmax_param.axis")
        top[0].reshape_like(bottom[0])

    def forward_cpu(self, bottom, top):
        if not softmax_cpu(bottom[0], top[0], self.axis):
            self.forward_xp(np, bottom, top)

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if not _cpu.usable(_cpu.softmax, bottom[0], top[0]):
            return self.backward_xp(np, top, propagate_down, bottom)
        t = top[0]
        _cpu.softmax.softmax_backward(_cpu.flat(t.cpu_data()), _cpu.flat(t.cpu_diff()),
                                      _cpu.flat(bottom[0].mutable_cpu_diff()), t.count(0, self.axis),
                                      t.shape[self.axis], t.count(self.axis + 1))

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        from caffe.layers.kernels import cuda_softmax  # a real GPU: one fused pass
        if cuda_softmax.softmax_forward(xp, x, top[0].mutable_data_xp(xp), self.axis):
            return
        top[0].mutable_data_xp(xp)[...] = softmax_xp(xp, x, self.axis)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        y = top[0].data_xp(xp)
        dy = top[0].diff_xp(xp)
        from caffe.layers.kernels import cuda_softmax  # a real GPU: one fused pass
        if cuda_softmax.softmax_backward(xp, y, dy, bottom[0].mutable_diff_xp(xp), self.axis):
            return
        bottom[0].mutable_diff_xp(xp)[...] = (dy - (dy * y).sum(axis=self.axis, keepdims=True)) * y

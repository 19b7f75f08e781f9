"""Reduction: SUM, ASUM, SUMSQ or MEAN over all axes from reduction_param.axis on, times coeff.

The top keeps the axes before `axis` (a scalar when axis is 0).
"""
from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer


@register_layer("Reduction")
class ReductionLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        from caffe.proto import caffe_pb2
        R = caffe_pb2.ReductionParameter
        self.op = self.layer_param.reduction_param.operation
        self.check(self.op in (R.SUM, R.ASUM, R.SUMSQ, R.MEAN),
                   f"unknown reduction_param.operation {self.op}")
        self.SUM, self.ASUM, self.SUMSQ, self.MEAN = R.SUM, R.ASUM, R.SUMSQ, R.MEAN

    def reshape(self, bottom, top):
        p = self.layer_param.reduction_param
        x = bottom[0]
        try:
            axis = x.canonical_axis_index(p.axis)
        except IndexError:
            raise self.error(f"reduction_param.axis {p.axis} is out of range for bottom[0] "
                             f"with shape {x.shape}") from None
        self.num, self.dim = x.count(0, axis), x.count(axis)
        top[0].reshape(list(x.shape[:axis]))
        self.coeff = p.coeff / self.dim if self.op == self.MEAN and self.dim else p.coeff

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp).reshape(self.num, self.dim)
        if self.op in (self.SUM, self.MEAN):
            r = x.sum(axis=1)
        elif self.op == self.ASUM:
            r = xp.abs(x).sum(axis=1)
        else:
            r = (x * x).sum(axis=1)
        top[0].mutable_data_xp(xp)[...] = (self.coeff * r).reshape(top[0].shape)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        g = top[0].diff_xp(xp).reshape(self.num, 1) * self.coeff
        if self.op in (self.SUM, self.MEAN):
            dx = xp.broadcast_to(g, (self.num, self.dim))
        else:
            x = bottom[0].data_xp(xp).reshape(self.num, self.dim)
            dx = g * (xp.sign(x) if self.op == self.ASUM else 2 * x)
        bottom[0].mutable_diff_xp(xp)[...] = dx.reshape(bottom[0].shape)

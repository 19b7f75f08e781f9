"""HingeLoss (one-vs-all): bottom[0] scores (N, C, ...), bottom[1] one label per item.

t_ij = -x_ij for j == label_i, x_ij otherwise; m = max(0, 1 + t);
L1 (default): loss = sum(m) / N; L2: loss = sum(m^2) / N.
Gradient: L1 sign(m) * s / N, L2 2 m s / N, with s = -1 at the label and 1 elsewhere.
"""
from caffe.layers.layer import LossLayer
from caffe.layers.registry import register_layer
from caffe.layers.softmax_loss import one_hot, read_labels
from caffe.proto import caffe_pb2

_HP = caffe_pb2.HingeLossParameter


@register_layer("HingeLoss")
class HingeLossLayer(LossLayer):
    def layer_setup(self, bottom, top):
        super().layer_setup(bottom, top)
        self.norm = self.layer_param.hinge_loss_param.norm
        if self.norm not in (_HP.L1, _HP.L2):
            raise self.error(f"unknown hinge_loss_param.norm {self.norm}")

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.num = bottom[0].shape[0] if bottom[0].num_axes else 1
        if bottom[1].count() != self.num:
            raise self.error(f"bottom[1] must hold one label per item ({self.num}), got shape {bottom[1].shape}")
        self.dim = bottom[0].count() // self.num if self.num else 0

    def _margin(self, xp, bottom):
        x = bottom[0].data_xp(xp).reshape(self.num, self.dim)
        _, _, safe = read_labels(self, xp, bottom[1], (self.num, 1), self.dim)
        sign = 1 - 2 * one_hot(xp, safe, self.dim, x.dtype)[:, :, 0]  # -1 at the label, +1 elsewhere
        return xp.maximum(0, 1 + x * sign), sign

    def forward_xp(self, xp, bottom, top):
        m, _ = self._margin(xp, bottom)
        loss = m.sum() if self.norm == _HP.L1 else (m * m).sum()
        top[0].mutable_data_xp(xp)[...] = loss / self.num

    def backward_xp(self, xp, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs (bottom[1])")
        if not propagate_down[0]:
            return
        m, sign = self._margin(xp, bottom)
        lw = top[0].diff_xp(xp).reshape(())
        g = xp.sign(m) * sign * (lw / self.num) if self.norm == _HP.L1 else m * sign * (2 * lw / self.num)
        bottom[0].mutable_diff_xp(xp)[...] = g.reshape(bottom[0].shape)

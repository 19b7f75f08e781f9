"""MultinomialLogisticLoss: bottom[0] holds probabilities (N, C, ...), bottom[1] one label per item.

loss = -1/N sum_i log(max(p[i, label_i], 1e-20)); gradient -1/(N p) at the label, 0 elsewhere.
"""
from caffe.layers.layer import LossLayer
from caffe.layers.registry import register_layer
from caffe.layers.softmax_loss import one_hot, read_labels

LOG_THRESHOLD = 1e-20  # Caffe's kLOG_THRESHOLD


@register_layer("MultinomialLogisticLoss")
class MultinomialLogisticLossLayer(LossLayer):
    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.num = bottom[0].shape[0] if bottom[0].num_axes else 1
        if bottom[1].count() != self.num:
            raise self.error(f"bottom[1] must hold one label per item ({self.num}, i.e. shape (N, 1, 1, 1)), "
                             f"got shape {bottom[1].shape}")
        self.dim = bottom[0].count() // self.num if self.num else 0

    def _gather(self, xp, bottom):
        p = bottom[0].data_xp(xp).reshape(self.num, self.dim, 1)
        _, _, safe = read_labels(self, xp, bottom[1], (self.num, 1), self.dim)
        return xp.maximum(xp.take_along_axis(p, safe[:, None, :], axis=1)[:, 0, 0], LOG_THRESHOLD), safe

    def forward_xp(self, xp, bottom, top):
        p, _ = self._gather(xp, bottom)
        top[0].mutable_data_xp(xp)[...] = -xp.log(p).sum() / self.num

    def backward_xp(self, xp, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs (bottom[1])")
        if not propagate_down[0]:
            return
        p, safe = self._gather(xp, bottom)
        scale = -top[0].diff_xp(xp).reshape(()) / self.num
        oh = one_hot(xp, safe, self.dim, p.dtype)[:, :, 0]
        bottom[0].mutable_diff_xp(xp)[...] = (oh * (scale / p)[:, None]).reshape(bottom[0].shape)

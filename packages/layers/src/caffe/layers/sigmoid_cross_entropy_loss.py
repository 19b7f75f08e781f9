"""SigmoidCrossEntropyLoss: cross-entropy between sigmoid(x) and targets t in [0, 1].

loss = -sum over non-ignored i of [x t - max(x, 0) - log(1 + exp(-|x|))] / normalizer,
Caffe's overflow-safe form. Gradient: (sigmoid(x) - t) / normalizer, 0 at ignored
targets. Normalization as Caffe's layer: loss_param.normalization when set, else the
legacy normalize (true VALID, false BATCH_SIZE), else BATCH_SIZE (this layer's own
default, unlike SoftmaxWithLoss). outer = bottom[0].shape[0], inner = count / outer.
Backward reads blobs the forward fills (Caffe's sigmoid_output_, and normalizer_), so a forward in one
mode and a backward in the other agree; on the device the normalizer is never copied to the host.
"""
from caffe.layers import _cpu
from caffe.layers.layer import LossLayer
from caffe.layers.registry import register_layer
from caffe.layers.sigmoid import sigmoid_xp
from caffe.layers.softmax_loss import BATCH_SIZE, ignore_label, loss_normalizer, normalization_mode, saved_normalizer


@register_layer("SigmoidCrossEntropyLoss")
class SigmoidCrossEntropyLossLayer(LossLayer):
    def layer_setup(self, bottom, top):
        super().layer_setup(bottom, top)
        self.ignore_label = ignore_label(self)
        self.normalization = normalization_mode(self.layer_param.loss_param, default=BATCH_SIZE)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if bottom[0].count() != bottom[1].count():
            raise self.error(f"inputs must have the same count: bottom[0] {bottom[0].shape} "
                             f"({bottom[0].count()}) vs bottom[1] {bottom[1].shape} ({bottom[1].count()})")
        self.outer_num = bottom[0].shape[0] if bottom[0].num_axes else 1
        self.inner_num = bottom[0].count() // self.outer_num if self.outer_num else 0

    def _valid(self, xp, t):
        if self.ignore_label is None:
            return None
        return t.astype("int64") != self.ignore_label  # Caffe compares static_cast<int>(target)

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        t = bottom[1].data_xp(xp).reshape(x.shape)
        _cpu.state_blob(self, "sigmoid_output_", bottom[0]).mutable_data_xp(xp)[...] = sigmoid_xp(xp, x)
        elem = x * (t - (x >= 0)) - xp.log1p(xp.exp(-xp.abs(x)))
        valid = self._valid(xp, t)
        loss = -elem.sum() if valid is None else -xp.where(valid, elem, 0).sum()
        top[0].mutable_data_xp(xp)[...] = loss / loss_normalizer(self, xp, valid, x.dtype)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs (bottom[1])")
        if not propagate_down[0]:
            return
        sig = getattr(self, "sigmoid_output_", None)
        if sig is None or sig.shape != bottom[0].shape:
            raise self.error("backward needs a forward pass first (no saved sigmoid output)")
        t = bottom[1].data_xp(xp).reshape(bottom[0].shape)
        dx = sig.data_xp(xp) - t
        valid = self._valid(xp, t)
        if valid is not None:
            dx *= valid
        dx *= top[0].diff_xp(xp).reshape(()) / saved_normalizer(self, xp)
        bottom[0].mutable_diff_xp(xp)[...] = dx

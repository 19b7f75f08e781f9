"""EuclideanLoss: loss = sum((a - b)^2) / (2 N), N = bottom[0].shape[0].

Both bottoms get gradients: d/da = (a - b) / N, d/db = -(a - b) / N (times the top's loss weight).
The difference a - b lives in the diff_ blob (Caffe's), so a backward in the other mode reads it.
"""
from caffe.layers import _cpu
from caffe.layers.layer import LossLayer
from caffe.layers.registry import register_layer


def _num(blob):
    return blob.shape[0] if blob.num_axes else 1


def _inner(blob):  # values per item: a 0-axis blob is one item of one value
    return blob.count(1) if blob.num_axes else 1


@register_layer("EuclideanLoss")
class EuclideanLossLayer(LossLayer):
    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if _inner(bottom[0]) != _inner(bottom[1]) or bottom[0].count() != bottom[1].count():
            raise self.error(f"inputs must have the same dimension: bottom[0] {bottom[0].shape} "
                             f"({bottom[0].count()} values) vs bottom[1] {bottom[1].shape} ({bottom[1].count()})")

    def forward_xp(self, xp, bottom, top):
        a = bottom[0].data_xp(xp)
        b = bottom[1].data_xp(xp).reshape(a.shape)
        diff = _cpu.state_blob(self, "diff_", bottom[0]).mutable_data_xp(xp)
        xp.subtract(a, b, out=diff)
        d = diff.ravel()
        top[0].mutable_data_xp(xp)[...] = xp.dot(d, d) / _num(bottom[0]) / 2

    def backward_xp(self, xp, top, propagate_down, bottom):
        lw = top[0].diff_xp(xp).reshape(())
        saved = getattr(self, "diff_", None)
        if saved is None or saved.shape != bottom[0].shape:
            raise self.error("backward needs a forward pass first (no saved difference)")
        diff = saved.data_xp(xp)
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                alpha = sign * lw / _num(bottom[i])
                bottom[i].mutable_diff_xp(xp)[...] = (alpha * diff).reshape(bottom[i].shape)

    def allow_force_backward(self, bottom_index: int) -> bool:
        return True  # both inputs are differentiable (e.g. regression towards another net's output)

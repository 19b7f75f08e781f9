"""ContrastiveLoss (Hadsell, Chopra & LeCun 2006) on pairs of feature vectors.

bottoms: a (N, C, 1, 1), b (N, C, 1, 1), similarity y (N, 1, 1, 1; nonzero = similar).
loss = 1/(2N) sum_i [ y_i d_i^2 + (1 - y_i) max(margin - d_i, 0)^2 ], d_i = ||a_i - b_i||;
legacy_version uses max(margin - d_i^2, 0) for dissimilar pairs. Backward as Caffe,
including its 1e-4 guard in the non-legacy dissimilar gradient.
Backward reads blobs (Caffe's diff_ and dist_sq_) and the similarity bottom, so a backward in the
other mode agrees with the forward.
"""
from caffe.layers import _cpu
from caffe.layers.layer import LossLayer
from caffe.layers.registry import register_layer


@register_layer("ContrastiveLoss")
class ContrastiveLossLayer(LossLayer):
    exact_num_bottom_blobs = 3

    def layer_setup(self, bottom, top):
        super().layer_setup(bottom, top)
        p = self.layer_param.contrastive_loss_param
        self.margin = float(p.margin)
        self.legacy = bool(p.legacy_version)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        a, b, y = bottom
        for i, blob in enumerate(bottom):
            if blob.num_axes > 4:
                raise self.error(f"bottom[{i}] must have at most 4 axes (N, C, 1, 1), got shape {blob.shape}")
        if a.channels != b.channels:
            raise self.error(f"bottom[0] and bottom[1] must have the same channels: {a.shape} vs {b.shape}")
        for i, blob in enumerate((a, b)):
            if blob.height != 1 or blob.width != 1:
                raise self.error(f"bottom[{i}] must be (N, C, 1, 1), got shape {blob.shape}")
        if y.channels != 1 or y.height != 1 or y.width != 1 or y.num != a.num:
            raise self.error(f"bottom[2] (similarity) must be (N, 1, 1, 1) with N = {a.num}, got shape {y.shape}")

    def forward_xp(self, xp, bottom, top):
        n, c = bottom[0].num, bottom[0].channels
        a = bottom[0].data_xp(xp).reshape(n, c)
        b = bottom[1].data_xp(xp).reshape(n, c)
        similar = self._similar(xp, bottom)
        diff = _cpu.state_blob(self, "diff_", (n, c), a.dtype).mutable_data_xp(xp)
        xp.subtract(a, b, out=diff)
        dist_sq = (diff * diff).sum(axis=1)
        _cpu.state_blob(self, "dist_sq_", (n,), dist_sq.dtype).mutable_data_xp(xp)[...] = dist_sq
        if self.legacy:
            dissimilar = xp.maximum(self.margin - dist_sq, 0)
        else:
            dissimilar = xp.maximum(self.margin - xp.sqrt(dist_sq), 0) ** 2
        loss = xp.where(similar, dist_sq, dissimilar).sum()
        top[0].mutable_data_xp(xp)[...] = loss / n / 2

    @staticmethod
    def _similar(xp, bottom):
        return bottom[2].data_xp(xp).reshape(bottom[0].num).astype("int64") != 0  # Caffe: static_cast<int>

    def backward_xp(self, xp, top, propagate_down, bottom):
        if propagate_down[2]:
            raise self.error("cannot backpropagate to the similarity label input (bottom[2])")
        lw = top[0].diff_xp(xp).reshape(())
        n = bottom[0].num
        if getattr(self, "diff_", None) is None or self.diff_.shape != (n, bottom[0].channels):
            raise self.error("backward needs a forward pass first (no saved differences)")
        diff, dist_sq, similar = self.diff_.data_xp(xp), self.dist_sq_.data_xp(xp), self._similar(xp, bottom)
        if self.legacy:
            mdist = self.margin - dist_sq
            coef_dis = -1.0  # beta = -alpha
        else:
            dist = xp.sqrt(dist_sq)
            mdist = self.margin - dist
            coef_dis = -mdist / (dist + 1e-4)
        # Per pair: similar -> alpha * diff; dissimilar within the margin -> beta * diff; else 0.
        coef = xp.where(similar, 1.0, xp.where(mdist > 0, coef_dis, 0.0))
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                alpha = sign * lw / n
                g = (alpha * coef)[:, None] * diff
                bottom[i].mutable_diff_xp(xp)[...] = g.reshape(bottom[i].shape).astype(bottom[i].dtype, copy=False)

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 2

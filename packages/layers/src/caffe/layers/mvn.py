"""MVN: mean-variance normalization per (item, channel), or per item with across_channels.

Forward is Caffe's: y = (x - mean) / (std + eps) with std = sqrt(mean((x - mean)^2)) (eps is added to
the std, not to the variance), or y = x - mean when normalize_variance is false.

Backward is the exact gradient of that forward. Caffe's own backward drops a factor (std + eps) / std
in the variance term; with the default eps = 1e-9 the two agree to ~1e-9 relative, and the exact form
keeps the gradient right for any eps.

Backward's state lives in blobs (Caffe's names): temp_ holds z = x - mean and variance_ the std per
row, so a forward in one mode and a backward in the other agree (and in place works).
"""
from caffe.layers import _cpu
from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer


@register_layer("MVN")
class MVNLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def reshape(self, bottom, top):
        x = bottom[0]
        if x.num_axes < 1:
            raise self.error(f"bottom[0] must have at least one axis, got shape {x.shape}")
        top[0].reshape_like(x)

    def _rows(self, blob):
        p = self.layer_param.mvn_param
        n = blob.shape[0]
        channels = blob.shape[1] if blob.num_axes > 1 else 1
        return n if p.across_channels else n * channels

    def forward_xp(self, xp, bottom, top):
        p = self.layer_param.mvn_param
        x = bottom[0].data_xp(xp)
        rows = self._rows(bottom[0])
        xr = x.reshape(rows, -1)
        z = xr - xr.mean(axis=1, keepdims=True)
        if p.normalize_variance:
            std = xp.sqrt((z * z).mean(axis=1, keepdims=True))
            _cpu.state_blob(self, "temp_", z.shape, z.dtype).mutable_data_xp(xp)[...] = z
            _cpu.state_blob(self, "variance_", std.shape, std.dtype).mutable_data_xp(xp)[...] = std
            y = z / (std + p.eps)
        else:
            y = z
        top[0].mutable_data_xp(xp)[...] = y.reshape(x.shape)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        p = self.layer_param.mvn_param
        rows = self._rows(bottom[0])
        dy = top[0].diff_xp(xp).reshape(rows, -1)
        if p.normalize_variance:
            state = getattr(self, "temp_", None), getattr(self, "variance_", None)
            if state[0] is None or state[0].shape != dy.shape:
                raise self.error("backward needs a forward pass first (no saved statistics)")
            z, std = (b.data_xp(xp) for b in state)
            dim = z.shape[1]
            d = std + p.eps
            # d std / dz = z / (dim * std); rows with std == 0 have z == 0 and contribute nothing.
            safe = xp.where(std > 0, std, 1)
            coef = xp.where(std > 0, (dy * z).sum(axis=1, keepdims=True) / (dim * safe * d * d), 0)
            dz = dy / d - z * coef
        else:
            dz = dy
        dx = dz - dz.mean(axis=1, keepdims=True)
        bottom[0].mutable_diff_xp(xp)[...] = dx.reshape(bottom[0].shape)

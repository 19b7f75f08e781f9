"""BatchNorm: normalize each channel to zero mean and unit variance (Caffe's batch_norm_layer).

Caffe stores three blobs, and real caffemodels hold them in this form:
  blobs[0]  the running sum of batch means          (shape [C])
  blobs[1]  the running sum of unbiased batch vars  (shape [C])
  blobs[2]  the running normalizer                  (shape [1])
The statistics in use are blobs[0] / blobs[2] and blobs[1] / blobs[2] (0 when the normalizer is 0).
In TRAIN with batch statistics each forward updates them as a moving average:
  blobs[2] = maf * blobs[2] + 1
  blobs[0] = maf * blobs[0] + mean
  blobs[1] = maf * blobs[1] + m / (m - 1) * var    (m = count / C, the samples per channel)
use_global_stats defaults to true in TEST and false in TRAIN. The statistics are not learned: the layer
adds `param { lr_mult: 0 }` for each blob to its own layer_param (as Caffe's LayerSetUp does), and the net
reads the param specs from layer.layer_param after SetUp.

Backward reads the state the forward leaves in blobs (so forward in one mode and backward in the
other agree): mean_ and inv_std_ (per channel; Caffe's mean_ and variance_, which holds the std
after forward), and, with batch statistics in place, x_norm_ (the normalized bottom; out of
place backward recomputes it from the bottom, the same bits). CPU: caffe.layers.kernels
(normalization: batch statistics, one read of x; channelwise: global statistics), statistics
summed in double; the moving averages are updated from the double statistics.
"""
import numpy as np

from caffe.blob import Blob
from caffe.layers import _cpu
from caffe.layers.layer import Layer, dtype_of
from caffe.layers.registry import register_layer


@register_layer("BatchNorm")
class BatchNormLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        from caffe.proto import caffe_pb2
        p = self.layer_param.batch_norm_param
        self.moving_average_fraction = float(p.moving_average_fraction)
        self.use_global_stats = self.phase == caffe_pb2.TEST
        if p.HasField("use_global_stats"):
            self.use_global_stats = p.use_global_stats
        x = bottom[0]
        if x.num_axes < 1:
            raise self.error(f"bottom[0] must have at least one axis, got shape {x.shape}")
        self.channels = 1 if x.num_axes == 1 else x.shape[1]
        self.eps = float(p.eps)
        if self.blobs:
            if len(self.blobs) != 3:
                raise self.error(f"expects 3 blobs (mean, variance, scale factor), got {len(self.blobs)}")
            shapes = [b.shape for b in self.blobs]
            c = self.channels
            if not (self.blobs[0].count() == c and self.blobs[1].count() == c and self.blobs[2].count() == 1):
                raise self.error(f"stored blobs have shapes {shapes}; expected [{c}], [{c}], [1] "
                                 f"for bottom[0] of shape {x.shape}")
        else:
            dt = dtype_of(bottom)
            self.blobs = [Blob(self.channels, dtype=dt), Blob(self.channels, dtype=dt), Blob(1, dtype=dt)]
            for b in self.blobs:
                b.mutable_cpu_data()[...] = 0
        # The statistics are never learned: force lr_mult 0, and refuse a prototxt that asks otherwise.
        for i in range(len(self.blobs)):
            if len(self.layer_param.param) == i:
                self.layer_param.param.add(lr_mult=0.0)
            elif self.layer_param.param[i].lr_mult != 0:
                raise self.error(f"Cannot configure batch normalization statistics as layer parameters: "
                                 f"param[{i}].lr_mult is {self.layer_param.param[i].lr_mult}, must be 0")

    def reshape(self, bottom, top):
        x = bottom[0]
        if x.num_axes >= 2:
            if x.shape[1] != self.channels:
                raise self.error(f"bottom[0] has {x.shape[1]} channels (shape {x.shape}) but the layer was set up "
                                 f"with {self.channels}")
        top[0].reshape_like(x)

    def _shape3(self, blob):
        n = blob.shape[0]
        return n, self.channels, blob.count() // max(n * self.channels, 1)

    # -- the statistics (per channel; tiny: NumPy or CuPy alike) ------------------------------------
    def _global_stats(self, xp, dtype):
        """mean and 1 / sqrt(var + eps) from the stored sums, computed in double, in dtype."""
        factor = float(self.blobs[2].cpu_data().reshape(-1)[0])
        factor = 0.0 if factor == 0 else 1.0 / factor
        mean = self.blobs[0].data_xp(xp).reshape(-1).astype(xp.float64) * factor
        var = self.blobs[1].data_xp(xp).reshape(-1).astype(xp.float64) * factor
        return mean.astype(dtype), (1.0 / xp.sqrt(var + self.eps)).astype(dtype)

    def _batch_stats(self, xp, mean, var, m, dtype):
        """Store this batch's mean and inv_std, and fold mean / var (double) into the moving averages."""
        maf = self.moving_average_fraction
        correction = m / (m - 1.0) if m > 1 else 1.0
        b0, b1, b2 = (b.mutable_data_xp(xp) for b in self.blobs)
        b2[...] = b2 * maf + 1
        b0[...] = maf * b0 + mean.reshape(b0.shape)
        b1[...] = maf * b1 + correction * var.reshape(b1.shape)
        return mean.astype(dtype), (1.0 / xp.sqrt(var + self.eps)).astype(dtype)

    def _state(self, bottom):
        """The blobs backward reads (Caffe's mean_, variance_ (here as 1 / std) and x_norm_)."""
        c, dt = self.channels, bottom[0].dtype
        return (_cpu.state_blob(self, "mean_", (c,), dt), _cpu.state_blob(self, "inv_std_", (c,), dt))

    def _keeps_x_norm(self, bottom, top):
        # Out of place, backward recomputes x_norm from the bottom (one read instead of a write and a
        # read); in place the bottom is gone, so x_norm_ keeps it (batch statistics only).
        return not self.use_global_stats and bottom[0] is top[0]

    def forward_cpu(self, bottom, top):
        if not _cpu.usable(_cpu.normalization, bottom[0], top[0]):
            return self.forward_xp(np, bottom, top)
        n, c, s = self._shape3(bottom[0])
        dt = bottom[0].dtype
        mean_b, inv_b = self._state(bottom)
        x, y = _cpu.flat(bottom[0].cpu_data()), _cpu.flat(top[0].mutable_cpu_data())
        if self.use_global_stats:
            mean, inv = self._global_stats(np, dt)
            mean_b.mutable_cpu_data()[...], inv_b.mutable_cpu_data()[...] = mean, inv
            _cpu.channelwise.channel_forward(_cpu.CH_SHIFT, x, inv, mean, y, _cpu.empty(dt), n, c, s)
            return
        x_norm = _cpu.empty(dt)
        if self._keeps_x_norm(bottom, top):
            x_norm = _cpu.flat(_cpu.state_blob(self, "x_norm_", bottom[0]).mutable_cpu_data())
        mean, var = np.zeros(c), np.zeros(c)
        _cpu.normalization.batch_norm_train_forward(x, y, x_norm, mean, var, n, c, s, self.eps)
        m, i = self._batch_stats(np, mean, var, n * s, dt)
        mean_b.mutable_cpu_data()[...], inv_b.mutable_cpu_data()[...] = m, i

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if not _cpu.usable(_cpu.normalization, bottom[0], top[0]):
            return self.backward_xp(np, top, propagate_down, bottom)
        n, c, s = self._shape3(bottom[0])
        dt = bottom[0].dtype
        inv = self._checked_state(bottom, top)[1].cpu_data()
        dy, dx = _cpu.flat(top[0].cpu_diff()), _cpu.flat(bottom[0].mutable_cpu_diff())
        if self.use_global_stats:
            _cpu.channelwise.channel_backward(_cpu.CH_AFFINE, dy, _cpu.empty(dt), inv, dx, _cpu.EMPTY_DOUBLE,
                                              _cpu.EMPTY_DOUBLE, n, c, s)
            return
        if self._keeps_x_norm(bottom, top):
            x_norm, x = _cpu.flat(self.x_norm_.cpu_data()), _cpu.empty(dt)
        else:
            x_norm, x = _cpu.empty(dt), _cpu.flat(bottom[0].cpu_data())
        _cpu.normalization.batch_norm_train_backward(dy, x_norm, x, self.mean_.cpu_data(), inv, dx, n, c, s)

    def _checked_state(self, bottom, top):
        mean_b = getattr(self, "mean_", None)
        if mean_b is None or (self._keeps_x_norm(bottom, top) and getattr(self, "x_norm_", None) is None):
            raise self.error("backward needs a forward pass first (no saved statistics)")
        return self.mean_, self.inv_std_

    # -- the array-module-generic path (the GPU's, and the reference of the CPU kernels) ------------
    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        shape, dt = x.shape, x.dtype
        n, c, s = self._shape3(bottom[0])
        xr = x.reshape(n, c, s)
        mean_b, inv_b = self._state(bottom)
        from caffe.layers.kernels import cuda_norm  # a real GPU: the statistics and the normalization fused
        if self.use_global_stats:
            mean, inv = self._global_stats(xp, dt)
        else:
            stats = cuda_norm.batch_norm_stats(xp, xr)
            mean64 = stats[0] if stats else xr.mean(axis=(0, 2), dtype=xp.float64)
            var64 = stats[1] if stats else xr.var(axis=(0, 2), dtype=xp.float64)
            mean, inv = self._batch_stats(xp, mean64, var64, n * s, dt)
        mean_b.mutable_data_xp(xp)[...] = mean
        inv_b.mutable_data_xp(xp)[...] = inv
        x_norm = (_cpu.state_blob(self, "x_norm_", bottom[0]).mutable_data_xp(xp).reshape(n, c, s)
                  if self._keeps_x_norm(bottom, top) else None)
        if cuda_norm.channel_affine(xp, xr, mean, inv, top[0].mutable_data_xp(xp).reshape(n, c, s), x_norm):
            return
        y = (xr - mean[None, :, None]) * inv[None, :, None]
        if self._keeps_x_norm(bottom, top):
            _cpu.state_blob(self, "x_norm_", bottom[0]).mutable_data_xp(xp)[...] = y.reshape(shape)
        top[0].mutable_data_xp(xp)[...] = y.reshape(shape)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n, c, s = self._shape3(bottom[0])
        mean_b, inv_b = self._checked_state(bottom, top)
        inv = inv_b.data_xp(xp)[None, :, None]
        dy = top[0].diff_xp(xp).reshape(n, c, s)
        from caffe.layers.kernels import cuda_norm  # a real GPU: one pass (global), two (batch statistics)
        dx_out = bottom[0].mutable_diff_xp(xp).reshape(n, c, s)
        if self.use_global_stats and cuda_norm.channel_affine(xp, dy, None, inv_b.data_xp(xp), dx_out):
            return
        if not self.use_global_stats:
            keep = self._keeps_x_norm(bottom, top)
            src = (self.x_norm_ if keep else bottom[0]).data_xp(xp).reshape(n, c, s)
            if cuda_norm.batch_norm_backward(xp, dy, src, not keep, mean_b.data_xp(xp), inv_b.data_xp(xp), dx_out):
                return
        if self.use_global_stats:
            dx = dy * inv
        else:
            # dE/dX = (dE/dY - mean(dE/dY) - mean(dE/dY . Y) . Y) / sqrt(var + eps), means over all but C
            if self._keeps_x_norm(bottom, top):
                y = self.x_norm_.data_xp(xp).reshape(n, c, s)
            else:
                y = (bottom[0].data_xp(xp).reshape(n, c, s) - mean_b.data_xp(xp)[None, :, None]) * inv
            dt = dy.dtype
            mean_dy = dy.mean(axis=(0, 2), dtype=xp.float64, keepdims=True).astype(dt)
            mean_dyy = (dy * y).mean(axis=(0, 2), dtype=xp.float64, keepdims=True).astype(dt)
            dx = (dy - mean_dy - y * mean_dyy) * inv
        bottom[0].mutable_diff_xp(xp)[...] = dx.reshape(bottom[0].shape)

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
"""
from caffe.blob import Blob
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

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        shape = x.shape
        n, c, s = self._shape3(bottom[0])
        xr = x.reshape(n, c, s)
        if self.use_global_stats:
            factor = float(self.blobs[2].cpu_data().reshape(-1)[0])
            factor = 0.0 if factor == 0 else 1.0 / factor
            mean = self.blobs[0].data_xp(xp).reshape(c).astype(x.dtype) * factor
            var = self.blobs[1].data_xp(xp).reshape(c).astype(x.dtype) * factor
        else:
            mean = xr.mean(axis=(0, 2))
            centered = xr - mean[None, :, None]
            var = (centered * centered).mean(axis=(0, 2))
            maf = self.moving_average_fraction
            m = n * s
            correction = m / (m - 1.0) if m > 1 else 1.0
            b0, b1, b2 = (b.mutable_data_xp(xp) for b in self.blobs)
            b2[...] = b2 * maf + 1
            b0[...] = maf * b0 + mean.reshape(b0.shape)
            b1[...] = maf * b1 + correction * var.reshape(b1.shape)
        std = xp.sqrt(var + self.eps)
        y = (xr - mean[None, :, None]) / std[None, :, None]
        # Keep the normalized output (and the std) for backward: a later in-place layer may clobber top.
        self._x_norm = y
        self._std = std
        top[0].mutable_data_xp(xp)[...] = y.reshape(shape)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n, c, s = self._shape3(bottom[0])
        dy = top[0].diff_xp(xp).reshape(n, c, s)
        std = self._std[None, :, None]
        if self.use_global_stats:
            dx = dy / std
        else:
            # dE/dX = (dE/dY - mean(dE/dY) - mean(dE/dY . Y) . Y) / sqrt(var + eps), means over all but C
            y = self._x_norm
            dx = (dy - dy.mean(axis=(0, 2), keepdims=True)
                  - y * (dy * y).mean(axis=(0, 2), keepdims=True)) / std
        bottom[0].mutable_diff_xp(xp)[...] = dx.reshape(bottom[0].shape)

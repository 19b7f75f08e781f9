"""BatchReindex: top[i] = bottom[0][bottom[1][i]] along axis 0; backward accumulates repeated indices.

Indices are checked (integers in range) on the host in CPU mode, as Caffe does; in GPU mode they stay on
the device (no copy per call) and the check is deferred to the next read of a loss (caffe.blob.deferred).
"""
import numpy as np

from caffe.blob import deferred
from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer


def device_indices(layer, xp, raw, limit, describe):
    """int64 indices of the float array `raw` on the device; a value that is not an integer in [0, limit)
    becomes the layer's error, raised at the next read of a loss (describe(value) -> message); until then it
    reads index 0."""
    raw = raw.reshape(-1)
    bad = (raw < 0) | (raw >= limit) | (raw != xp.floor(raw))
    deferred.check(layer, bad.any(), raw[xp.argmax(bad)],
                   lambda v: layer.error(describe(v) + " (found on the device; raised at the next read of a loss)"))
    return xp.where(bad, 0, raw).astype(xp.int64)


def index_add(xp, target, index, values):
    """target[index] += values with repeated indices accumulated, for NumPy and CuPy."""
    if xp is np:
        np.add.at(target, index, values)
    else:
        import cupyx
        cupyx.scatter_add(target, index, values)


@register_layer("BatchReindex")
class BatchReindexLayer(Layer):
    exact_num_bottom_blobs = 2
    exact_num_top_blobs = 1

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1

    def reshape(self, bottom, top):
        if bottom[1].num_axes != 1:
            raise self.error(f"bottom[1] (the indices) must be 1-D, got shape {bottom[1].shape}")
        if bottom[0].num_axes < 1:
            raise self.error(f"bottom[0] must have at least one axis, got shape {bottom[0].shape}")
        top[0].reshape([bottom[1].shape[0]] + list(bottom[0].shape[1:]))

    def _indices(self, xp, bottom):
        n = bottom[0].shape[0]

        def describe(value):
            return (f"index {value} in bottom[1] is invalid for bottom[0] with batch size {n} "
                    f"(shape {bottom[0].shape}): indices must be integers in [0, {n})")

        if xp is not np:
            return device_indices(self, xp, bottom[1].data_xp(xp), n, describe)
        raw = np.asarray(bottom[1].cpu_data())  # checked on the host, as Caffe does
        bad = raw[(raw < 0) | (raw >= n) | (raw != np.floor(raw))]
        if bad.size:
            raise self.error(describe(bad[0]))
        return raw.astype(np.int64)

    def forward_xp(self, xp, bottom, top):
        idx = self._indices(xp, bottom)
        top[0].mutable_data_xp(xp)[...] = bottom[0].data_xp(xp)[idx]

    def backward_xp(self, xp, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to the index input (bottom[1])")
        if not propagate_down[0]:
            return
        idx = self._indices(xp, bottom)
        dx = bottom[0].mutable_diff_xp(xp)
        dx[...] = 0
        index_add(xp, dx, idx, top[0].diff_xp(xp))

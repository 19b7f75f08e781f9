"""Embed: a lookup table. bottom[0] holds integer indices (as floats) in [0, input_dim); each becomes
the weight row of that index (+ bias). top shape = bottom shape + (num_output,).

Blobs: weight (input_dim, num_output) and, with bias_term (default), bias (num_output,).
No gradient flows to the indices; parameter gradients accumulate (Caffe's convention).
Indices are checked on the host in CPU mode; in GPU mode they stay on the device (no copy per call) and
the check is deferred to the next read of a loss (caffe.blob.deferred).
"""
import numpy as np

from caffe.blob import Blob
from caffe.layers import filler
from caffe.layers.batch_reindex import device_indices, index_add
from caffe.layers.layer import Layer, dtype_of
from caffe.layers.registry import register_layer


@register_layer("Embed")
class EmbedLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def allow_force_backward(self, bottom_index):
        return False

    def layer_setup(self, bottom, top):
        p = self.layer_param.embed_param
        self.N, self.K, self.bias_term = p.num_output, p.input_dim, p.bias_term
        self.check(self.N > 0, "embed_param.num_output must be positive")
        self.check(self.K > 0, "embed_param.input_dim must be positive")
        if self.blobs:
            want = [(self.K, self.N)] + ([(self.N,)] if self.bias_term else [])
            got = [b.shape for b in self.blobs]
            self.check(got == want, f"stored blobs have shapes {got}, expected {want}")
        else:
            dt = dtype_of(bottom)
            w = Blob([self.K, self.N], dtype=dt)
            filler.fill(w, p.weight_filler)
            self.blobs = [w]
            if self.bias_term:
                b = Blob([self.N], dtype=dt)
                filler.fill(b, p.bias_filler)
                self.blobs.append(b)
        for i in range(len(self.blobs)):
            self.set_param_propagate_down(i, True)

    def reshape(self, bottom, top):
        top[0].reshape(list(bottom[0].shape) + [self.N])

    def _indices(self, xp, bottom):
        def describe(value):
            return (f"index {value} in bottom[0] (shape {bottom[0].shape}) is invalid: "
                    f"indices must be integers in [0, embed_param.input_dim = {self.K})")

        if xp is not np:
            return device_indices(self, xp, bottom[0].data_xp(xp), self.K, describe)
        raw = np.asarray(bottom[0].cpu_data()).reshape(-1)  # checked on the host
        bad = raw[(raw < 0) | (raw >= self.K) | (raw != np.floor(raw))]
        if bad.size:
            raise self.error(describe(bad[0]))
        return raw.astype(np.int64)

    def forward_xp(self, xp, bottom, top):
        idx = self._indices(xp, bottom)
        y = self.blobs[0].data_xp(xp)[idx]
        if self.bias_term:
            y = y + self.blobs[1].data_xp(xp)
        top[0].mutable_data_xp(xp)[...] = y.reshape(top[0].shape)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if propagate_down[0]:
            raise self.error("Can't backpropagate to EmbedLayer input (bottom[0] holds indices)")
        dy = top[0].diff_xp(xp).reshape(-1, self.N)
        if self.param_propagate_down(0):
            dw = self.blobs[0].mutable_diff_xp(xp)
            index_add(xp, dw, self._indices(xp, bottom), dy.astype(dw.dtype, copy=False))
        if self.bias_term and self.param_propagate_down(1):
            db = self.blobs[1].mutable_diff_xp(xp)
            db += dy.sum(axis=0).astype(db.dtype, copy=False)

"""Dropout (dropout_param.dropout_ratio, default 0.5).

TRAIN: each element is kept with probability 1 - ratio and scaled by 1 / (1 - ratio); backward
applies the same mask and scale. TEST: identity. With the fork-only field scale_train = false
(not in BVLC's caffe.proto; honoured when the schema has it): TRAIN applies the bare mask and
TEST multiplies by 1 - ratio.

The mask lives in the rand_vec_ blob (uint8, Caffe's name), so a forward in one mode and a
backward in the other use the same mask. It is drawn from one 64-bit seed per forward, taken
from caffe.blob.context.rng() (so set_random_seed reproduces it), by the SplitMix64 counter
generator: element i is kept when 16 bits of SplitMix64 output number i // 4 + 1 are >=
round(ratio * 2^16), so P(keep) = 1 - ratio within 2^-17 (mask_reference below is the same in NumPy). The CPU draws and applies it in
one kernel pass; the GPU path draws the same bits on the device (mask_reference with CuPy: nothing but
the seed crosses to the device) and applies it there.
"""
import numpy as np

from caffe.blob import context
from caffe.layers import _cpu, splitmix
from caffe.layers.layer import NeuronLayer
from caffe.layers.registry import register_layer
from caffe.proto import caffe_pb2

def mask_threshold(ratio: float) -> int:
    """The 16-bit threshold below which an element is dropped: P(keep) = 1 - ratio (within 2^-17)."""
    return int(round(ratio * 2.0 ** 16))


def mask_reference(seed: int, count: int, threshold: int, xp=np):
    """The dropout mask (uint8 0/1) in NumPy (or CuPy: the same bits drawn on the device): what
    kernels.elementwise.dropout_forward draws."""
    z = splitmix.outputs(seed, xp.arange(1, (count + 3) // 4 + 1, dtype=np.uint64))
    bits = (z[:, None] >> (xp.arange(4, dtype=np.uint64) * np.uint64(16))) & np.uint64(0xFFFF)
    return (bits.reshape(-1)[:count] >= np.uint64(threshold)).astype(np.uint8)


@register_layer("Dropout")
class DropoutLayer(NeuronLayer):
    def layer_setup(self, bottom, top):
        ratio = float(self.layer_param.dropout_param.dropout_ratio)
        if not 0.0 <= ratio < 1.0:
            raise self.error(f"dropout_param.dropout_ratio must be in [0, 1), got {ratio}")
        self.ratio = ratio
        self.scale = 1.0 / (1.0 - ratio)
        self.scale_train = self.read_scale_train()
        self.threshold = mask_threshold(ratio)
        self.rand_vec_ = None

    def read_scale_train(self) -> bool:
        p = self.layer_param.dropout_param
        if "scale_train" in p.DESCRIPTOR.fields_by_name:
            return bool(p.scale_train)
        return True

    @property
    def train(self) -> bool:
        return self.phase == caffe_pb2.TRAIN

    @property
    def _mask_scale(self) -> float:
        return self.scale if self.scale_train else 1.0

    def _new_seed(self) -> int:
        return int(context.rng().integers(0, 2 ** 63))

    def _draw_mask(self, like, apply_to=None) -> bool:
        """Fill rand_vec_ for this forward; apply_to = (bottom, top): also y = x * mask * scale in the same
        kernel pass where it can (returns whether it did)."""
        mask = _cpu.state_blob(self, "rand_vec_", like, np.uint8)
        seed = self._new_seed()
        m = _cpu.flat(mask.mutable_cpu_data())
        if _cpu.elementwise is None:
            m[...] = mask_reference(seed, m.size, self.threshold)
            return False
        if apply_to is not None and _cpu.usable(_cpu.elementwise, *apply_to):
            x, y = _cpu.flat(apply_to[0].cpu_data()), _cpu.flat(apply_to[1].mutable_cpu_data())
            _cpu.elementwise.dropout_forward(x, y, m, seed, self.threshold, self._mask_scale, True)
            return True
        _cpu.elementwise.dropout_forward(_cpu.empty(np.float32), _cpu.empty(np.float32), m, seed, self.threshold,
                                         1.0, False)
        return False

    def _check_mask(self, shape):
        if self.rand_vec_ is None or self.rand_vec_.shape != tuple(shape):
            raise self.error("backward in TRAIN phase needs a forward pass first (no dropout mask)")

    def forward_cpu(self, bottom, top):
        if not self.train:
            return self.forward_xp(np, bottom, top)
        if not self._draw_mask(bottom[0], apply_to=(bottom[0], top[0])):
            self._apply(np, bottom, top)

    def backward_cpu(self, top, propagate_down, bottom):
        if not (self.train and propagate_down[0] and _cpu.usable(_cpu.elementwise, top[0], bottom[0])):
            return self.backward_xp(np, top, propagate_down, bottom)
        self._check_mask(top[0].shape)
        _cpu.elementwise.dropout_backward(_cpu.flat(top[0].cpu_diff()), _cpu.flat(self.rand_vec_.cpu_data()),
                                          _cpu.flat(bottom[0].mutable_cpu_diff()), self._mask_scale)

    def _apply(self, xp, bottom, top):
        """y = x * mask * scale with the drawn rand_vec_."""
        mask = self.rand_vec_.data_xp(xp)
        x = bottom[0].data_xp(xp)
        top[0].mutable_data_xp(xp)[...] = x * (mask.astype(x.dtype) * x.dtype.type(self._mask_scale))

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        y = top[0].mutable_data_xp(xp)
        if self.train:
            from caffe.layers.kernels import cuda_elementwise  # a real GPU: the mask drawn and applied in one pass
            m = _cpu.state_blob(self, "rand_vec_", bottom[0], np.uint8).mutable_data_xp(xp)
            if cuda_elementwise.dropout_forward(xp, self._new_seed, self.threshold, m, x, y, self._mask_scale):
                return
            if xp is np:
                self._draw_mask(bottom[0])
            else:  # the same bits, drawn where they are used
                mask = _cpu.state_blob(self, "rand_vec_", bottom[0], np.uint8)
                m = mask.mutable_data_xp(xp)
                m[...] = mask_reference(self._new_seed(), m.size, self.threshold, xp).reshape(m.shape)
            self._apply(xp, bottom, top)
        elif self.scale_train:
            y[...] = x
        else:
            y[...] = x * (1.0 - self.ratio)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].diff_xp(xp)
        dx = bottom[0].mutable_diff_xp(xp)
        if self.train:
            self._check_mask(dy.shape)
            mask = self.rand_vec_.data_xp(xp)
            from caffe.layers.kernels import cuda_elementwise  # a real GPU: one pass
            if cuda_elementwise.dropout_backward(xp, dy, mask, self._mask_scale, dx):
                return
            dx[...] = dy * (mask.astype(dy.dtype) * dy.dtype.type(self._mask_scale))
        elif self.scale_train:
            dx[...] = dy
        else:
            dx[...] = dy * (1.0 - self.ratio)

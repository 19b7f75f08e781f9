"""Layer: Caffe's layer contract.

A layer owns its LayerParameter, its phase, its parameter blobs (`blobs`), which
of them receive gradients (`param_propagate_down`), and a loss weight per top.

Subclasses implement:
  layer_setup(bottom, top)   one-time setup (read the parameter message, make param blobs)
  reshape(bottom, top)       shape the tops (called before every forward)
  forward_xp(xp, bottom, top) / backward_xp(xp, top, propagate_down, bottom)
      one implementation for NumPy and CuPy (xp is the array module), or
  forward_cpu / backward_cpu (and optionally forward_gpu / backward_gpu) directly.
A layer without a GPU path falls back to its CPU one in GPU mode: SyncedMemory
moves the data, as Caffe's default Forward_gpu does.

Parameter blobs take the dtype of bottom[0], so the gradient checker can run a
layer in float64.
"""
from __future__ import annotations

import numpy as np

from caffe.blob import Blob, context
from caffe.blob.deferred import DeviceScalar


class LayerError(ValueError):
    """Bad parameters or bottoms for a layer; the message names the layer and its type."""


class Layer:
    type = "Layer"

    # Blob-count constraints (Caffe's ExactNumBottomBlobs() & co.); -1 = no constraint.
    exact_num_bottom_blobs = -1
    min_bottom_blobs = -1
    max_bottom_blobs = -1
    exact_num_top_blobs = -1
    min_top_blobs = -1
    max_top_blobs = -1
    equal_num_bottom_top_blobs = False
    auto_top_blobs = False

    def __init__(self, layer_param):
        from caffe.proto import caffe_pb2
        param = caffe_pb2.LayerParameter()
        if layer_param is not None:
            param.CopyFrom(layer_param)
        self.layer_param = layer_param = param
        self.phase = layer_param.phase
        self.blobs: list[Blob] = []
        if len(layer_param.blobs):
            for bp in layer_param.blobs:
                b = Blob()
                b.from_proto(bp)
                self.blobs.append(b)
        self._param_propagate_down: list[bool] = []
        self._loss: list[float] = []

    # -- identity and errors ---------------------------------------------------
    @property
    def name(self) -> str:
        return self.layer_param.name

    def error(self, message: str) -> LayerError:
        return LayerError(f"Layer '{self.name}' ({self.type}): {message}")

    def check(self, condition, message: str) -> None:
        if not condition:
            raise self.error(message)

    # -- setup -------------------------------------------------------------------
    def SetUp(self, bottom: list[Blob], top: list[Blob]) -> None:
        self.check_blob_counts(bottom, top)
        self.layer_setup(bottom, top)
        self.reshape(bottom, top)
        self.set_loss_weights(top)

    setup = SetUp

    def layer_setup(self, bottom, top) -> None:
        pass

    def reshape(self, bottom, top) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement reshape")

    def Reshape(self, bottom, top) -> None:
        self.reshape(bottom, top)  # a call, not `Reshape = reshape`: that alias would be the base's, not the layer's

    def check_blob_counts(self, bottom, top) -> None:
        nb, nt = len(bottom), len(top)

        def fail(which, expect, got):
            raise self.error(f"expects {expect} {which} blob(s), got {got}")

        if self.exact_num_bottom_blobs >= 0 and nb != self.exact_num_bottom_blobs:
            fail("bottom", f"exactly {self.exact_num_bottom_blobs}", nb)
        if self.min_bottom_blobs >= 0 and nb < self.min_bottom_blobs:
            fail("bottom", f"at least {self.min_bottom_blobs}", nb)
        if self.max_bottom_blobs >= 0 and nb > self.max_bottom_blobs:
            fail("bottom", f"at most {self.max_bottom_blobs}", nb)
        if self.exact_num_top_blobs >= 0 and nt != self.exact_num_top_blobs:
            fail("top", f"exactly {self.exact_num_top_blobs}", nt)
        if self.min_top_blobs >= 0 and nt < self.min_top_blobs:
            fail("top", f"at least {self.min_top_blobs}", nt)
        if self.max_top_blobs >= 0 and nt > self.max_top_blobs:
            fail("top", f"at most {self.max_top_blobs}", nt)
        if self.equal_num_bottom_top_blobs and nb != nt:
            raise self.error(f"expects as many top blobs as bottom blobs, got {nb} bottom and {nt} top")

    # -- loss weights ------------------------------------------------------------
    def loss(self, top_index: int) -> float:
        return self._loss[top_index] if top_index < len(self._loss) else 0.0

    def set_loss(self, top_index: int, value: float) -> None:
        if len(self._loss) <= top_index:
            self._loss.extend([0.0] * (top_index + 1 - len(self._loss)))
        self._loss[top_index] = float(value)

    def set_loss_weights(self, top) -> None:
        weights = list(self.layer_param.loss_weight)
        if weights:
            if len(weights) != len(top):
                raise self.error(f"loss_weight must be unspecified or given once per top: "
                                 f"{len(weights)} loss_weight(s) for {len(top)} top(s)")
            for i, w in enumerate(weights):
                if w == 0:
                    continue
                self.set_loss(i, w)
                top[i].mutable_cpu_diff()[...] = w

    # -- gradients to parameters ---------------------------------------------------
    def param_propagate_down(self, param_id: int) -> bool:
        return self._param_propagate_down[param_id] if param_id < len(self._param_propagate_down) else False

    def set_param_propagate_down(self, param_id: int, value: bool) -> None:
        if len(self._param_propagate_down) <= param_id:
            self._param_propagate_down.extend([True] * (param_id + 1 - len(self._param_propagate_down)))
        self._param_propagate_down[param_id] = bool(value)

    def allow_force_backward(self, bottom_index: int) -> bool:
        return True

    def AllowForceBackward(self, bottom_index: int) -> bool:
        return self.allow_force_backward(bottom_index)  # the layer's own, as Reshape

    # -- forward/backward dispatch ---------------------------------------------------
    def Forward(self, bottom, top) -> float:
        """Reshape, run forward on the current mode's device, and return the weighted loss: a float in CPU
        mode; in GPU mode a caffe.blob.deferred.DeviceScalar (a float read from the device only when used:
        no copy per call) when the layer has a loss weight, else 0.0."""
        self.reshape(bottom, top)
        if context.mode() == context.GPU:
            self.forward_gpu(bottom, top)
            return self._weighted_loss(top, True) if self._loss else 0.0
        self.forward_cpu(bottom, top)
        return self._weighted_loss(top, False) if self._loss else 0.0  # only loss layers have loss weights

    def _weighted_loss(self, top, gpu: bool) -> float:
        loss = 0.0
        for i, t in enumerate(top):
            if self.loss(i) == 0 or t.count() == 0:
                continue
            if gpu:
                import cupy
                d, g = t.gpu_data().ravel(), t.gpu_diff().ravel()
                loss = loss + DeviceScalar(cupy.vdot(d, g))  # the same float as the CPU's, when read
            else:
                d, g = t.cpu_data().ravel(), t.cpu_diff().ravel()
                loss += float(np.vdot(d, g))
        return loss

    forward = Forward

    def Backward(self, top, propagate_down, bottom) -> None:
        if context.mode() == context.GPU:
            self.backward_gpu(top, propagate_down, bottom)
        else:
            self.backward_cpu(top, propagate_down, bottom)

    backward = Backward

    def forward_cpu(self, bottom, top) -> None:
        self.forward_xp(np, bottom, top)

    def backward_cpu(self, top, propagate_down, bottom) -> None:
        self.backward_xp(np, top, propagate_down, bottom)

    def forward_gpu(self, bottom, top) -> None:
        if type(self).forward_xp is not Layer.forward_xp:
            import cupy
            self.forward_xp(cupy, bottom, top)
        else:
            self.forward_cpu(bottom, top)

    def backward_gpu(self, top, propagate_down, bottom) -> None:
        if type(self).backward_xp is not Layer.backward_xp:
            import cupy
            self.backward_xp(cupy, top, propagate_down, bottom)
        else:
            self.backward_cpu(top, propagate_down, bottom)

    def forward_xp(self, xp, bottom, top) -> None:
        raise NotImplementedError(f"{type(self).__name__} implements no forward")

    def backward_xp(self, xp, top, propagate_down, bottom) -> None:
        raise NotImplementedError(f"{type(self).__name__} implements no backward")

    # -- serialization -------------------------------------------------------------
    def to_proto(self, write_diff: bool = False):
        """The LayerParameter with the current parameter blobs (as Caffe's Layer::ToProto)."""
        param = type(self.layer_param)()
        param.CopyFrom(self.layer_param)
        del param.blobs[:]
        for b in self.blobs:
            b.to_proto(write_diff, proto=param.blobs.add(), double=False)
        return param

    ToProto = to_proto

    def __repr__(self) -> str:
        return f"<{type(self).__name__} '{self.name}' type={self.type}>"


class NeuronLayer(Layer):
    """One bottom, one top of the same shape (may be in place)."""
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def reshape(self, bottom, top):
        top[0].reshape_like(bottom[0])


class LossLayer(Layer):
    """Two bottoms (predictions, labels; some take a third), a scalar top with loss weight 1 by default."""
    exact_num_bottom_blobs = 2
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        if not len(self.layer_param.loss_weight):
            self.layer_param.loss_weight.append(1.0)

    def reshape(self, bottom, top):
        self.check(bottom[0].shape[:1] == bottom[1].shape[:1] if bottom[0].num_axes and bottom[1].num_axes else True,
                   f"the data and label should have the same first dimension: "
                   f"bottom[0] {bottom[0].shape} vs bottom[1] {bottom[1].shape}")
        top[0].reshape([])

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 1


def dtype_of(bottom) -> np.dtype:
    """Parameter blobs follow bottom[0]'s dtype (float32 normally, float64 under the gradient checker)."""
    return bottom[0].dtype if bottom else np.dtype(np.float32)

"""SoftmaxWithLoss: softmax over softmax_param.axis, then the multinomial logistic loss.

loss = -sum over non-ignored positions of log(max(p[label], FLT_MIN)) / normalizer,
with loss_param's ignore_label and normalization (FULL, VALID (default), BATCH_SIZE,
NONE; the legacy `normalize` field, when normalization is unset, means VALID if
true and BATCH_SIZE if false). Labels are bottom[1], outer * inner integer values
in [0, C). An optional second top receives the probabilities.

The shared loss helpers (normalization mode, normalizer, label reading) live here
and are used by the other loss layers and Accuracy. CPU: the softmax and the gradient are
kernel passes (caffe.layers.kernels.softmax); the loss reads one probability per position.
"""
import numpy as np

from caffe.blob import Blob, deferred
from caffe.layers import _cpu
from caffe.layers.layer import LossLayer
from caffe.layers.registry import register_layer
from caffe.layers.softmax import canonical_axis, softmax_xp
from caffe.proto import caffe_pb2

_LP = caffe_pb2.LossParameter
FULL, VALID, BATCH_SIZE, NONE = _LP.FULL, _LP.VALID, _LP.BATCH_SIZE, _LP.NONE
FLT_MIN = float(np.finfo(np.float32).tiny)  # Caffe clamps with FLT_MIN for float and double alike


def normalization_mode(loss_param, default=VALID):
    """Caffe's rule: an explicit normalization wins; else legacy normalize (true VALID, false BATCH_SIZE)."""
    if loss_param.HasField("normalization"):
        return loss_param.normalization
    if loss_param.HasField("normalize"):
        return VALID if loss_param.normalize else BATCH_SIZE
    return default


def get_normalizer(mode, outer_num, inner_num, valid_count=-1) -> float:
    """Caffe's LossLayer::GetNormalizer, never below 1 (a batch of only ignored labels gives loss 0)."""
    if mode == FULL:
        n = outer_num * inner_num
    elif mode == VALID:
        n = outer_num * inner_num if valid_count == -1 else valid_count
    elif mode == BATCH_SIZE:
        n = outer_num
    elif mode == NONE:
        n = 1
    else:
        raise ValueError(f"unknown loss normalization mode {mode}")
    return max(1.0, float(n))


def ignore_label(layer):
    lp = layer.layer_param.loss_param
    return lp.ignore_label if lp.HasField("ignore_label") else None


def read_labels(layer, xp, label_blob, shape, num_classes, ignore=None, check=True):
    """Integer labels (Caffe's static_cast<int>), the mask of non-ignored ones and a gather-safe copy.

    A non-ignored label outside [0, num_classes) is the layer's error naming the first one. On the host it
    is raised here; on the device (no copy per call) the check is deferred (caffe.blob.deferred) and raised
    at the next read of a loss on this thread (the solver's display, a test pass, float(loss)); until then
    such labels gather class 0. check=False: the caller checked these labels already (Backward).
    """
    raw = label_blob.data_xp(xp).reshape(shape)
    labels = raw.astype(np.int64)
    valid = labels != ignore if ignore is not None else xp.ones(labels.shape, dtype=bool)
    bad = valid & ((labels < 0) | (labels >= num_classes))

    def error(value, deferred_note=""):
        return label_error(layer, value, num_classes, ignore, deferred_note)

    if xp is np:
        if check and bool(bad.any()):
            raise error(float(raw[bad].ravel()[0]))
        return labels, valid, xp.where(valid, labels, 0)
    if check:
        flat_bad = bad.ravel()
        deferred.check(layer, flat_bad.any(), raw.ravel()[xp.argmax(flat_bad)],
                       lambda v: error(v, DEVICE_NOTE))
    return labels, valid, xp.where(valid & ~bad, labels, 0)


def label_error(layer, value, num_classes, ignore, note=""):
    return layer.error(f"label value {value:g} is out of range: labels must be integers in "
                       f"[0, {num_classes})" + (f" or the ignore_label {ignore}" if ignore is not None else "") + note)


DEVICE_NOTE = " (found on the device; raised at the next read of a loss)"


def loss_normalizer(layer, xp, valid, dtype, count=None):
    """This forward's normalizer (get_normalizer with the layer's normalization, outer_num, inner_num and
    the count of `valid`, None: all valid), kept in the layer's normalizer_ blob for Backward (so a Backward
    in the other mode reads it). On the host a Python float; on the device a 0-d array (no copy). count: the
    count of valid when only that is at hand (a device scalar)."""
    mode = layer.normalization
    if count is None and valid is not None and mode == VALID:
        count = valid.sum()
    if mode == VALID and count is not None and xp is not np:
        norm = xp.maximum(count, 1).astype(dtype)
    else:
        count = int(count) if mode == VALID and count is not None else -1
        norm = get_normalizer(mode, layer.outer_num, layer.inner_num, count)
    _cpu.state_blob(layer, "normalizer_", (1,), dtype).mutable_data_xp(xp)[...] = norm
    return norm


def saved_normalizer(layer, xp):
    """The normalizer the last Forward used (a Python float on the host, a 0-d array on the device)."""
    blob = getattr(layer, "normalizer_", None)
    if blob is None:
        raise layer.error("backward needs a forward pass first (no saved normalizer)")
    if xp is np:
        return float(blob.cpu_data()[0])
    return blob.data_xp(xp).reshape(())


def one_hot(xp, safe, num_classes, dtype):
    """(outer, inner) class indices -> (outer, C, inner) indicator, for gathers and scatters on CPU and GPU."""
    classes = xp.arange(num_classes).reshape(1, num_classes, 1)
    return (classes == safe[:, None, :]).astype(dtype)


class _MultiTopLoss(LossLayer):
    """Loss layers with an optional second top (loss weight 0 unless the prototxt says otherwise).

    Caffe requires one loss_weight per top when any is given; when none is given
    we default to 1 for the loss and 0 for the extra top rather than failing.
    """
    exact_num_top_blobs = -1
    min_top_blobs = 1
    max_top_blobs = 2

    def layer_setup(self, bottom, top):
        unspecified = not len(self.layer_param.loss_weight)
        super().layer_setup(bottom, top)
        if unspecified:
            while len(self.layer_param.loss_weight) < len(top):
                self.layer_param.loss_weight.append(0.0)


@register_layer("SoftmaxWithLoss")
class SoftmaxWithLossLayer(_MultiTopLoss):
    def layer_setup(self, bottom, top):
        super().layer_setup(bottom, top)
        self.ignore_label = ignore_label(self)
        self.normalization = normalization_mode(self.layer_param.loss_param)
        self.prob = Blob(dtype=bottom[0].dtype)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.axis = canonical_axis(self, bottom[0], self.layer_param.softmax_param.axis, "softmax_param.axis")
        self.outer_num = bottom[0].count(0, self.axis)
        self.inner_num = bottom[0].count(self.axis + 1)
        self.num_classes = bottom[0].shape[self.axis]
        if self.outer_num * self.inner_num != bottom[1].count():
            raise self.error(
                f"number of labels must match number of predictions: bottom[0] {bottom[0].shape} with softmax "
                f"axis {self.axis} needs {self.outer_num * self.inner_num} labels (outer {self.outer_num} x inner "
                f"{self.inner_num}), but bottom[1] {bottom[1].shape} holds {bottom[1].count()}")
        self.prob.reshape_like(bottom[0])
        if len(top) >= 2:
            top[1].reshape_like(bottom[0])

    def forward_cpu(self, bottom, top):
        if not _cpu.usable(_cpu.softmax, bottom[0], self.prob):
            self.prob.mutable_cpu_data()[...] = softmax_xp(np, bottom[0].cpu_data(), self.axis)
            self._loss_from_prob(np, bottom, top)
            return
        labels, valid, count = self._kernel_labels(bottom)
        # the probabilities and the loss in one pass (each piece's loss read while it is in cache)
        x, prob = _cpu.flat(bottom[0].cpu_data()), _cpu.flat(self.prob.mutable_cpu_data())
        total = _cpu.softmax.softmax_loss_forward(x, prob, labels, valid, self.outer_num, self.num_classes,
                                                  self.inner_num)
        dtype = self.prob.dtype
        top[0].mutable_cpu_data()[...] = dtype.type(total) / loss_normalizer(self, np, None, dtype, count=count)
        if len(top) >= 2:
            top[1].mutable_cpu_data()[...] = self.prob.cpu_data()

    def _kernel_labels(self, bottom):
        """The labels as the softmax kernels take them, converted and checked in one kernel pass (read_labels'
        rules: Caffe's static_cast<int>, ignore_label, the first bad label the error): (int64 labels with 0
        where ignored, valid as uint8, the count of valid ones), flat, in buffers kept between calls."""
        raw = _cpu.flat(bottom[1].cpu_data())
        if raw.dtype not in _cpu.FLOATS:
            raw = raw.astype(np.float64)
        bufs = getattr(self, "_label_buffers", None)
        if bufs is None or bufs[0].size != raw.size:
            bufs = self._label_buffers = (np.empty(raw.size, np.int64), np.empty(raw.size, np.uint8))
        ignore = self.ignore_label
        count, first_bad = _cpu.softmax.loss_labels(raw, self.num_classes, ignore is not None,
                                                    ignore if ignore is not None else 0, *bufs)
        if first_bad >= 0:
            raise label_error(self, float(raw[first_bad]), self.num_classes, ignore)
        return bufs[0], bufs[1], count

    def backward_cpu(self, top, propagate_down, bottom):
        if not (_cpu.usable(_cpu.softmax, bottom[0], self.prob) and propagate_down[0] and not propagate_down[1]):
            return self.backward_xp(np, top, propagate_down, bottom)
        labels, valid, _ = self._kernel_labels(bottom)
        norm = saved_normalizer(self, np)
        scale = float(top[0].cpu_diff().reshape(()) / norm)  # in the blob's precision, as the NumPy path
        _cpu.softmax.softmax_loss_backward(_cpu.flat(self.prob.cpu_data()), labels, valid,
                                           _cpu.flat(bottom[0].mutable_cpu_diff()), self.outer_num, self.num_classes,
                                           self.inner_num, scale)

    def forward_xp(self, xp, bottom, top):
        from caffe.layers.kernels import cuda_softmax  # a real GPU: one fused pass
        if not cuda_softmax.softmax_forward(xp, bottom[0].data_xp(xp), self.prob.mutable_data_xp(xp), self.axis):
            self.prob.mutable_data_xp(xp)[...] = softmax_xp(xp, bottom[0].data_xp(xp), self.axis)
        if not self._loss_in_one_kernel(xp, bottom, top):
            self._loss_from_prob(xp, bottom, top)

    def _loss_in_one_kernel(self, xp, bottom, top) -> bool:
        """_loss_from_prob as one kernel (a real GPU): the loss sum, the valid count and the first bad label, then
        read_labels' check (deferred on the device) and the normalizer from the count."""
        from caffe.layers.kernels import cuda_softmax
        raw, prob = bottom[1].data_xp(xp).reshape(-1), self.prob.data_xp(xp)
        out = cuda_softmax.softmax_loss_forward(xp, prob, raw, self.num_classes, self.inner_num, self.ignore_label)
        if out is None:
            return False
        (sums, first_bad), n = out, raw.size
        err = (lambda v, note="": label_error(self, v, self.num_classes, self.ignore_label, note))
        if xp is np:
            if first_bad[0] < n:
                raise err(float(raw[first_bad[0]]))
        else:
            deferred.check(self, first_bad[0] < n, raw[xp.minimum(first_bad[0], n - 1)], lambda v: err(v, DEVICE_NOTE))
        loss = sums[0].astype(prob.dtype)
        top[0].mutable_data_xp(xp)[...] = loss / loss_normalizer(self, xp, None, prob.dtype, count=sums[1])
        if len(top) >= 2:
            top[1].mutable_data_xp(xp)[...] = prob
        return True

    def _loss_from_prob(self, xp, bottom, top):
        """The loss (and the second top) from the probabilities in self.prob."""
        shape3 = (self.outer_num, self.num_classes, self.inner_num)
        prob = self.prob.data_xp(xp)
        _, valid, safe = read_labels(self, xp, bottom[1], (self.outer_num, self.inner_num),
                                     self.num_classes, self.ignore_label)
        p_true = xp.take_along_axis(prob.reshape(shape3), safe[:, None, :], axis=1)[:, 0, :]
        loss = -xp.where(valid, xp.log(xp.maximum(p_true, FLT_MIN)), 0).sum()
        top[0].mutable_data_xp(xp)[...] = loss / loss_normalizer(self, xp, valid, prob.dtype)
        if len(top) >= 2:
            top[1].mutable_data_xp(xp)[...] = prob

    def backward_xp(self, xp, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs (bottom[1])")
        if not propagate_down[0]:
            return
        from caffe.layers.kernels import cuda_softmax  # a real GPU: one fused pass, the scale kept on the device
        if cuda_softmax.softmax_loss_backward(xp, self.prob.data_xp(xp), bottom[1].data_xp(xp),
                                              top[0].diff_xp(xp).reshape(()) / saved_normalizer(self, xp),
                                              bottom[0].mutable_diff_xp(xp), self.num_classes, self.inner_num,
                                              self.ignore_label):
            return
        shape3 = (self.outer_num, self.num_classes, self.inner_num)
        prob = self.prob.data_xp(xp).reshape(shape3)
        _, valid, safe = read_labels(self, xp, bottom[1], (self.outer_num, self.inner_num),
                                     self.num_classes, self.ignore_label, check=xp is np)
        dx = (prob - one_hot(xp, safe, self.num_classes, prob.dtype)) * valid[:, None, :]
        dx *= top[0].diff_xp(xp).reshape(()) / saved_normalizer(self, xp)
        bottom[0].mutable_diff_xp(xp)[...] = dx.reshape(bottom[0].shape)

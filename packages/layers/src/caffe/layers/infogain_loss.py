"""InfogainLoss: softmax over infogain_param.axis, then loss = -sum_l H[label, l] log(max(p_l, 1e-20)) / normalizer.

H (C x C) comes from bottom[2] when given, else from the BlobProto file
infogain_param.source. As Caffe master: bottom[0] are unnormalized scores passed
through an internal softmax; ignore_label and normalization as SoftmaxWithLoss;
optional second top = probabilities. Gradient: p_l * sum_k H[label, k] - H[label, l].
"""
import numpy as np

from caffe.blob import Blob
from caffe.layers.multinomial_logistic_loss import LOG_THRESHOLD
from caffe.layers.registry import register_layer
from caffe.layers.softmax import canonical_axis, softmax_xp
from caffe.layers.softmax_loss import (_MultiTopLoss, ignore_label, loss_normalizer, normalization_mode,
                                       read_labels, saved_normalizer)


def read_infogain_matrix(layer, path):
    """The BlobProto at `path` as a Blob (Caffe's ReadProtoFromBinaryFile + FromProto)."""
    from caffe.proto import caffe_pb2
    from caffe.blob.fileio import FileInputError, read_regular_file
    try:
        raw = read_regular_file(path, "infogain_param.source", fmt="a BlobProto")
    except FileInputError as exc:
        raise layer.error(f"cannot read infogain_param.source {path!r}: {exc.reason}") from None
    proto = caffe_pb2.BlobProto()
    try:
        proto.ParseFromString(raw)
        blob = Blob(dtype=np.float32)
        blob.from_proto(proto)
    except Exception as exc:  # DecodeError or a shape/data mismatch
        raise layer.error(f"infogain_param.source {path!r} is not a valid BlobProto: {exc}") from None
    return blob


@register_layer("InfogainLoss")
class InfogainLossLayer(_MultiTopLoss):
    exact_num_bottom_blobs = -1
    min_bottom_blobs = 2
    max_bottom_blobs = 3

    def layer_setup(self, bottom, top):
        super().layer_setup(bottom, top)
        self.ignore_label = ignore_label(self)
        self.normalization = normalization_mode(self.layer_param.loss_param)
        self.prob = Blob(dtype=bottom[0].dtype)
        self.infogain = None
        if len(bottom) < 3:
            p = self.layer_param.infogain_loss_param
            if not p.HasField("source"):
                raise self.error("the infogain matrix source must be specified (infogain_param.source) "
                                 "when there is no third bottom")
            self.infogain = read_infogain_matrix(self, p.source)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.axis = canonical_axis(self, bottom[0], self.layer_param.infogain_loss_param.axis,
                                   "infogain_loss_param.axis")
        self.outer_num = bottom[0].count(0, self.axis)
        self.inner_num = bottom[0].count(self.axis + 1)
        self.num_labels = bottom[0].shape[self.axis]
        if self.outer_num * self.inner_num != bottom[1].count():
            raise self.error(
                f"number of labels must match number of predictions: bottom[0] {bottom[0].shape} with axis "
                f"{self.axis} needs {self.outer_num * self.inner_num} labels, but bottom[1] {bottom[1].shape} "
                f"holds {bottom[1].count()}")
        h = self._h_blob(bottom)
        if h.count() != self.num_labels ** 2:
            where = "bottom[2]" if len(bottom) >= 3 else f"infogain_param.source {self.layer_param.infogain_loss_param.source!r}"
            raise self.error(f"the infogain matrix ({where}, shape {h.shape}) must be "
                             f"{self.num_labels} x {self.num_labels}")
        self.prob.reshape_like(bottom[0])
        if len(top) >= 2:
            top[1].reshape_like(bottom[0])

    def _h_blob(self, bottom):
        return bottom[2] if len(bottom) >= 3 else self.infogain

    def _h(self, xp, bottom, dtype):
        return self._h_blob(bottom).data_xp(xp).reshape(self.num_labels, self.num_labels).astype(dtype, copy=False)

    def _rows(self, xp, bottom, dtype, check=True):
        """H[label] for every position, as (outer, C, inner), plus the mask of non-ignored positions."""
        _, valid, safe = read_labels(self, xp, bottom[1], (self.outer_num, self.inner_num),
                                     self.num_labels, self.ignore_label, check)
        h_rows = self._h(xp, bottom, dtype)[safe].transpose(0, 2, 1)
        return h_rows, valid

    def forward_xp(self, xp, bottom, top):
        shape3 = (self.outer_num, self.num_labels, self.inner_num)
        prob = self.prob.mutable_data_xp(xp)
        prob[...] = softmax_xp(xp, bottom[0].data_xp(xp), self.axis)
        h_rows, valid = self._rows(xp, bottom, prob.dtype)
        per_pos = (h_rows * xp.log(xp.maximum(prob.reshape(shape3), LOG_THRESHOLD))).sum(axis=1)
        loss = -xp.where(valid, per_pos, 0).sum()
        top[0].mutable_data_xp(xp)[...] = loss / loss_normalizer(self, xp, valid, prob.dtype)
        if len(top) >= 2:
            top[1].mutable_data_xp(xp)[...] = prob

    def backward_xp(self, xp, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs (bottom[1])")
        if len(propagate_down) > 2 and propagate_down[2]:
            raise self.error("cannot backpropagate to the infogain matrix input (bottom[2])")
        if not propagate_down[0]:
            return
        shape3 = (self.outer_num, self.num_labels, self.inner_num)
        prob = self.prob.data_xp(xp).reshape(shape3)
        h_rows, valid = self._rows(xp, bottom, prob.dtype, check=xp is np)
        dx = (prob * h_rows.sum(axis=1, keepdims=True) - h_rows) * valid[:, None, :]
        dx *= top[0].diff_xp(xp).reshape(()) / saved_normalizer(self, xp)
        bottom[0].mutable_diff_xp(xp)[...] = dx.reshape(bottom[0].shape)

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index == 0

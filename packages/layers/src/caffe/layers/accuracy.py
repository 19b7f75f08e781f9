"""Accuracy: the fraction of non-ignored positions whose label is among the top_k scores.

accuracy_param: top_k (default 1), axis (default 1: the class axis), ignore_label.
As Caffe, a label counts as correct when fewer than top_k other classes score >= its
own score (ties count against it). An optional second top gives the per-class accuracy
(0 for classes that never occur). Forward only: no gradient. On the device nothing is copied to the host
(the label check is deferred as SoftmaxWithLoss's: caffe.blob.deferred).
"""
import numpy as np

from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer
from caffe.layers.softmax import canonical_axis
from caffe.layers.softmax_loss import read_labels


@register_layer("Accuracy")
class AccuracyLayer(Layer):
    exact_num_bottom_blobs = 2
    min_top_blobs = 1
    max_top_blobs = 2

    def layer_setup(self, bottom, top):
        p = self.layer_param.accuracy_param
        self.top_k = int(p.top_k)
        self.ignore_label = p.ignore_label if p.HasField("ignore_label") else None
        if self.top_k < 1:
            raise self.error(f"accuracy_param.top_k must be >= 1, got {self.top_k}")

    def reshape(self, bottom, top):
        if bottom[1].count() == 0 or self.top_k > bottom[0].count() // bottom[1].count():
            raise self.error(f"accuracy_param.top_k ({self.top_k}) must be less than or equal to the number of "
                             f"classes ({bottom[0].count() // max(bottom[1].count(), 1)})")
        self.axis = canonical_axis(self, bottom[0], self.layer_param.accuracy_param.axis, "accuracy_param.axis")
        self.outer_num = bottom[0].count(0, self.axis)
        self.inner_num = bottom[0].count(self.axis + 1)
        self.num_labels = bottom[0].shape[self.axis]
        if self.outer_num * self.inner_num != bottom[1].count():
            raise self.error(
                f"number of labels must match number of predictions: bottom[0] {bottom[0].shape} with axis "
                f"{self.axis} needs {self.outer_num * self.inner_num} labels, but bottom[1] {bottom[1].shape} "
                f"holds {bottom[1].count()}")
        top[0].reshape([])
        if len(top) > 1:
            top[1].reshape([self.num_labels])

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp).reshape(self.outer_num, self.num_labels, self.inner_num)
        _, valid, safe = read_labels(self, xp, bottom[1], (self.outer_num, self.inner_num),
                                     self.num_labels, self.ignore_label)
        true_score = xp.take_along_axis(x, safe[:, None, :], axis=1)
        # The true class counts itself once: Caffe starts num_better_predictions at -1.
        num_better = (x >= true_score).sum(axis=1) - 1
        correct = valid & (num_better < self.top_k)
        if xp is np:
            count = int(valid.sum())
            top[0].mutable_data_xp(xp)[...] = 0.0 if count == 0 else float(correct.sum()) / count
        else:  # the same double division, on the device
            count = valid.sum()
            top[0].mutable_data_xp(xp)[...] = xp.where(count == 0, 0.0, correct.sum() / xp.maximum(count, 1))
        if len(top) > 1:
            if xp is np:
                nums = xp.bincount(safe[valid], minlength=self.num_labels)
                hits = xp.bincount(safe[correct], minlength=self.num_labels)
            else:  # counts as weights: a boolean mask's result size would be read back to the host
                flat = safe.ravel()
                nums = xp.bincount(flat, weights=valid.ravel().astype(np.float64), minlength=self.num_labels)
                hits = xp.bincount(flat, weights=correct.ravel().astype(np.float64), minlength=self.num_labels)
            per_class = xp.where(nums == 0, 0.0, hits / xp.maximum(nums, 1))
            top[1].mutable_data_xp(xp)[...] = per_class

    def backward_xp(self, xp, top, propagate_down, bottom):
        if any(propagate_down):
            raise self.error("backward is not implemented: Accuracy is a metric, not a loss "
                             "(set propagate_down: false or remove it from the backward path)")

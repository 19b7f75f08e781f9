"""Numerical gradient checking with Caffe's semantics (test_gradient_check_util.hpp).

Central differences with `stepsize`; a computed gradient g and an estimate e
agree when both are finite and |g - e| <= threshold * max(|g|, |e|, 1). Elements whose input value
lies within `kink_range` of `kink` (e.g. ReLU at 0) are not checked. The
objective is 0.5 * sum(top^2) over all tops (single-output mode, top_id < 0) or
2 * top[top_id][top_data_id] (exhaustive / element-wise modes). Run it on
float64 blobs: the layers follow their bottoms' dtype.
"""
from __future__ import annotations

import numpy as np

from caffe.blob import context


class GradientCheckError(AssertionError):
    pass


class GradientChecker:
    def __init__(self, stepsize: float = 1e-2, threshold: float = 1e-3, seed: int = 1701,
                 kink: float = 0.0, kink_range: float = -1.0):
        self.stepsize = float(stepsize)
        self.threshold = float(threshold)
        self.seed = int(seed)
        self.kink = float(kink)
        self.kink_range = float(kink_range)

    # -- public modes ------------------------------------------------------------
    def check_gradient(self, layer, bottom, top, check_bottom: int = -1) -> None:
        """Single-output mode: objective 0.5 * sum of squares of every top."""
        layer.SetUp(bottom, top)
        self.check_gradient_single(layer, bottom, top, check_bottom, -1, -1)

    def check_gradient_exhaustive(self, layer, bottom, top, check_bottom: int = -1) -> None:
        """Every element of every top, one at a time."""
        layer.SetUp(bottom, top)
        if not top:
            raise GradientCheckError("exhaustive mode needs at least one top blob")
        for i, t in enumerate(top):
            for j in range(t.count()):
                self.check_gradient_single(layer, bottom, top, check_bottom, i, j)

    def check_gradient_eltwise(self, layer, bottom, top) -> None:
        """Element-wise layers: top[i][j] depends only on bottom[*][j]; off-diagonal gradients must be 0."""
        layer.SetUp(bottom, top)
        if layer.blobs:
            raise GradientCheckError("element-wise mode is for layers without parameter blobs")
        for i, t in enumerate(top):
            for j in range(t.count()):
                self.check_gradient_single(layer, bottom, top, -1, i, j, element_wise=True)

    # -- the core ------------------------------------------------------------------
    def check_gradient_single(self, layer, bottom, top, check_bottom, top_id, top_data_id,
                              element_wise: bool = False) -> None:
        if element_wise:
            if layer.blobs:
                raise GradientCheckError("element-wise mode is for layers without parameter blobs")
            if not (0 <= top_id and 0 <= top_data_id):
                raise GradientCheckError("element-wise mode needs a top_id and a top_data_id")
            top_count = top[top_id].count()
            for b in bottom:
                if b.count() != top_count:
                    raise GradientCheckError("element-wise mode needs bottoms with the top's count")
        blobs_to_check = []
        names = []
        propagate_down = [check_bottom == -1] * len(bottom)
        for i, b in enumerate(layer.blobs):
            blobs_to_check.append(b)
            names.append(f"param blob {i}")
        if check_bottom == -1:
            for i, b in enumerate(bottom):
                blobs_to_check.append(b)
                names.append(f"bottom {i}")
        elif check_bottom >= 0:
            if check_bottom >= len(bottom):
                raise GradientCheckError(f"check_bottom {check_bottom} out of range ({len(bottom)} bottoms)")
            blobs_to_check.append(bottom[check_bottom])
            names.append(f"bottom {check_bottom}")
            propagate_down[check_bottom] = True
        if not blobs_to_check:
            raise GradientCheckError("no blobs to check")

        # Analytic gradients.
        for b in layer.blobs:
            b.mutable_cpu_diff()[...] = 0
        context.set_random_seed(self.seed)
        layer.Forward(bottom, top)
        self._objective(top, top_id, top_data_id)
        layer.Backward(top, propagate_down, bottom)
        computed = [np.array(b.cpu_diff(), dtype=np.float64, copy=True).ravel() for b in blobs_to_check]

        failures = []
        for blob_id, blob in enumerate(blobs_to_check):
            grads = computed[blob_id]
            for feat_id in range(blob.count()):
                estimated = 0.0
                if not element_wise or feat_id == top_data_id:
                    data = blob.mutable_cpu_data().reshape(-1)
                    original = float(data[feat_id])
                    data[feat_id] = original + self.stepsize
                    context.set_random_seed(self.seed)
                    layer.Forward(bottom, top)
                    positive = self._objective(top, top_id, top_data_id)
                    data = blob.mutable_cpu_data().reshape(-1)
                    data[feat_id] = original - self.stepsize
                    context.set_random_seed(self.seed)
                    layer.Forward(bottom, top)
                    negative = self._objective(top, top_id, top_data_id)
                    data = blob.mutable_cpu_data().reshape(-1)
                    data[feat_id] = original
                    estimated = (positive - negative) / self.stepsize / 2.0
                g = float(grads[feat_id])
                feature = abs(float(blob.cpu_data().reshape(-1)[feat_id]))
                if self.kink - self.kink_range > feature or feature > self.kink + self.kink_range:
                    scale = max(abs(g), abs(estimated), 1.0)
                    # an infinite gradient scales its own tolerance to infinity (Caffe's EXPECT_NEAR passes
                    # it): a non-finite gradient is a failure of its own
                    finite = np.isfinite(g) and np.isfinite(estimated)
                    if not finite or not abs(g - estimated) <= self.threshold * scale:
                        failures.append(f"{names[blob_id]} element {feat_id} (top {top_id}, "
                                        f"element {top_data_id}): computed {g:.8g}, estimated {estimated:.8g}")
        if failures:
            head = f"{len(failures)} gradient mismatch(es) in layer '{layer.name}' ({layer.type})"
            raise GradientCheckError(head + ":\n  " + "\n  ".join(failures[:20]))

    def _objective(self, top, top_id, top_data_id) -> float:
        loss = 0.0
        if top_id < 0:
            for t in top:
                d = t.cpu_data()
                loss += float(np.vdot(d.ravel(), d.ravel()))
                t.mutable_cpu_diff()[...] = d
            return loss / 2.0
        for t in top:
            t.mutable_cpu_diff()[...] = 0
        loss_weight = 2.0
        loss = float(top[top_id].cpu_data().reshape(-1)[top_data_id]) * loss_weight
        top[top_id].mutable_cpu_diff().reshape(-1)[top_data_id] = loss_weight
        return loss

    # -- whole nets ------------------------------------------------------------------
    def check_gradient_net(self, net) -> None:
        """Caffe's CheckGradientNet: each layer checked exhaustively on the activations the net feeds it.

        `net` needs `layers`, `bottom_vecs`, `top_vecs` and `forward()`.
        """
        for i, layer in enumerate(net.layers):
            net.forward()
            self.check_gradient_exhaustive(layer, net.bottom_vecs[i], net.top_vecs[i])

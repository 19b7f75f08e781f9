"""CPU/GPU parity of the loss layers and Accuracy (skipped without a usable GPU)."""
import numpy as np
import pytest

from caffe.blob import context
from caffe.layers.testing import blobs_from_arrays, empty_tops, make_layer

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not context.gpu_available(), reason="needs a usable CUDA GPU (CuPy)")]

RNG = np.random.default_rng(0)
SCORES = RNG.uniform(-2, 2, (4, 5, 3)).astype(np.float32)
LABELS = RNG.integers(0, 5, (4, 3)).astype(np.float32)
LABELS[0, 0] = 255


def run(type_name, text, bottoms, propagate, n_top=1):
    results = []
    for mode in (context.CPU, context.GPU):
        context.set_mode(mode)
        try:
            layer = make_layer(type_name, text)
            bottom = blobs_from_arrays(bottoms, np.float32)
            top = empty_tops(n_top, np.float32)
            layer.SetUp(bottom, top)
            layer.Forward(bottom, top)
            if any(propagate):
                layer.Backward(top, propagate, bottom)
            results.append(([t.data.copy() for t in top],
                            [b.diff.copy() for b, p in zip(bottom, propagate) if p]))
        finally:
            context.set_mode_cpu()
    (ct, cb), (gt, gb) = results
    for a, b in zip(ct + cb, gt + gb):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["FULL", "VALID", "BATCH_SIZE", "NONE"])
def test_softmax_loss(mode):
    run("SoftmaxWithLoss", f"loss_param {{ ignore_label: 255 normalization: {mode} }}", [SCORES, LABELS],
        [True, False], n_top=2)


def test_infogain_loss():
    h = RNG.uniform(0, 1, (5, 5)).astype(np.float32)
    run("InfogainLoss", "loss_param { ignore_label: 255 }", [SCORES, LABELS, h], [True, False, False], n_top=2)


def test_sigmoid_cross_entropy_loss():
    t = RNG.integers(0, 2, SCORES.shape).astype(np.float32)
    run("SigmoidCrossEntropyLoss", "", [SCORES, t], [True, False])


def test_euclidean_and_contrastive_loss():
    a, b = SCORES.reshape(4, 15), SCORES[::-1].reshape(4, 15) * 0.5
    run("EuclideanLoss", "", [a, b], [True, True])
    y = np.array([1, 0, 0, 1], np.float32)
    run("ContrastiveLoss", "contrastive_loss_param { margin: 8 }", [a, b, y], [True, True, False])
    run("ContrastiveLoss", "contrastive_loss_param { margin: 8 legacy_version: true }", [a, b, y], [True, True, False])


def test_multinomial_and_hinge_loss():
    p = np.abs(SCORES.reshape(4, 15)) + 0.1
    lab = np.array([0, 3, 14, 7], np.float32)
    run("MultinomialLogisticLoss", "", [p, lab], [True, False])
    run("HingeLoss", "", [SCORES.reshape(4, 15), lab], [True, False])
    run("HingeLoss", "hinge_loss_param { norm: L2 }", [SCORES.reshape(4, 15), lab], [True, False])


def test_accuracy():
    run("Accuracy", "accuracy_param { top_k: 2 ignore_label: 255 }", [SCORES, LABELS], [False, False], n_top=2)

"""CPU/GPU parity of the neuron and softmax layers (skipped without a usable GPU)."""
import numpy as np
import pytest

from caffe.blob import context
from caffe.layers.testing import check_cpu_gpu_parity, layer_param
from caffe.proto import caffe_pb2

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not context.gpu_available(), reason="needs a usable CUDA GPU (CuPy)")]

X = np.random.default_rng(0).uniform(-2, 2, (2, 3, 4, 5)).astype(np.float32)

CASES = [
    ("ReLU", ""), ("ReLU", "relu_param { negative_slope: 0.1 }"), ("Sigmoid", ""), ("TanH", ""), ("AbsVal", ""),
    ("BNLL", ""), ("ELU", "elu_param { alpha: 0.5 }"), ("Swish", "swish_param { beta: 1.5 }"),
    ("PReLU", ""), ("PReLU", "prelu_param { channel_shared: true }"),
    ("Power", "power_param { power: 2 scale: 0.5 shift: 1 }"), ("Exp", "exp_param { base: 2 scale: 0.5 }"),
    ("Clip", "clip_param { min: -0.5 max: 1 }"), ("Dropout", "dropout_param { dropout_ratio: 0.3 }"),
    ("Softmax", ""), ("Softmax", "softmax_param { axis: -1 }"),
]


@pytest.mark.parametrize("type_name, text", CASES)
def test_neuron_cpu_gpu_parity(type_name, text):
    check_cpu_gpu_parity(layer_param(type_name, text), [X], rtol=1e-5, atol=1e-6)


def test_log_and_threshold_cpu_gpu_parity():
    check_cpu_gpu_parity(layer_param("Log", "log_param { base: 10 shift: 3 }"), [X], rtol=1e-5, atol=1e-6)
    # Threshold has no backward: compare forward only.
    outs = []
    for mode in (context.CPU, context.GPU):
        context.set_mode(mode)
        try:
            from caffe.layers.testing import make_layer, run_forward
            _, top = run_forward(make_layer("Threshold", "threshold_param { threshold: 0.25 }"), [X],
                                 dtype=np.float32)
            outs.append(top[0].data.copy())
        finally:
            context.set_mode_cpu()
    np.testing.assert_array_equal(outs[0], outs[1])


def test_dropout_test_phase_gpu():
    check_cpu_gpu_parity(layer_param("Dropout", "", phase=caffe_pb2.TEST), [X])

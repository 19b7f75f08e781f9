"""CPU/GPU parity for the Layers II types (skipped without a GPU)."""
import numpy as np
import pytest

from caffe.blob import context
from caffe.layers.testing import blobs_from_arrays, empty_tops, gpu_available, layer_param
from caffe.layers.registry import create_layer

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no GPU (CuPy with a CUDA device) available")]

rng = np.random.default_rng(0)
X = rng.normal(size=(3, 4, 2, 3))
SEL = np.array([1.0, 0.0, 2.0])
CASES = [  # type, prototxt, bottoms, number of tops, propagate_down
    ("BatchNorm", "", [X], 1, None),
    ("BatchNorm", "batch_norm_param { use_global_stats: true }", [X], 1, None),
    ("MVN", "mvn_param { across_channels: true eps: 0.01 }", [X], 1, None),
    ("Scale", "scale_param { bias_term: true filler { type: 'gaussian' } bias_filler { type: 'gaussian' } }",
     [X], 1, None),
    ("Scale", "scale_param { axis: 1 }", [X, rng.normal(size=(4, 2))], 1, None),
    ("Bias", "bias_param { axis: 0 num_axes: -1 filler { type: 'gaussian' } }", [X], 1, None),
    ("Flatten", "", [X], 1, None),
    ("Reshape", "reshape_param { shape { dim: 0 dim: -1 } }", [X], 1, None),
    ("Split", "", [X], 2, None),
    ("Concat", "concat_param { axis: 2 }", [X, X[:, :, :1]], 1, None),
    ("Slice", "slice_param { axis: -1 slice_point: 1 }", [X], 2, None),
    ("Eltwise", "eltwise_param { operation: MAX }", [X, -X, X * 0.5], 1, None),
    ("Eltwise", "eltwise_param { operation: PROD stable_prod_grad: false }", [X, X + 3], 1, None),
    ("Eltwise", "eltwise_param { coeff: 1 coeff: -2 }", [X, X * X], 1, None),
    ("Filter", "", [X, SEL], 1, [True, False]),
    ("BatchReindex", "", [X, np.array([2.0, 0.0, 2.0, 1.0])], 1, [True, False]),
    ("Tile", "tile_param { axis: 1 tiles: 3 }", [X], 1, None),
    ("Crop", "crop_param { axis: 1 offset: 1 offset: 0 offset: 1 }", [X, np.zeros((3, 2, 2, 2))], 1, [True, False]),
    ("Silence", "", [X], 0, None),
    ("ArgMax", "argmax_param { top_k: 2 out_max_val: true }", [X], 1, [False]),
    ("ArgMax", "argmax_param { top_k: 2 axis: 1 }", [X], 1, [False]),
    ("Reduction", "reduction_param { operation: ASUM axis: 1 coeff: 2 }", [X], 1, None),
    ("Embed", "embed_param { num_output: 3 input_dim: 4 weight_filler { type: 'gaussian' } }",
     [np.array([[0.0, 3.0], [3.0, 1.0]])], 1, [False]),
    ("LSTMUnit", "", [rng.normal(size=(1, 3, 2)), rng.normal(size=(1, 3, 8)), np.array([[1.0, 0.0, 1.0]])], 2,
     [True, True, False]),
]


@pytest.mark.parametrize("type_name,text,arrays,n_top,down", CASES, ids=[c[0] + str(i) for i, c in enumerate(CASES)])
def test_cpu_gpu_parity(type_name, text, arrays, n_top, down):
    results = []
    for mode in (context.CPU, context.GPU):
        context.set_mode(mode)
        try:
            context.set_random_seed(1701)
            layer = create_layer(layer_param(type_name, text))
            bottom = blobs_from_arrays(arrays, np.float32)
            top = empty_tops(n_top, np.float32)
            layer.SetUp(bottom, top)
            layer.Forward(bottom, top)
            for i, t in enumerate(top):
                t.diff[...] = np.random.default_rng(i).normal(size=t.shape)
            for p in layer.blobs:
                p.diff[...] = 0
            layer.Backward(top, down or [True] * len(bottom), bottom)
            results.append([t.data.copy() for t in top] + [b.diff.copy() for b in bottom]
                           + [p.diff.copy() for p in layer.blobs] + [p.data.copy() for p in layer.blobs])
        finally:
            context.set_mode_cpu()
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)

"""Test helpers for layers (in the spirit of chainer.testing).

Build a layer from a type and prototxt text, make float64 bottoms, run the
gradient checker, compare CPU and GPU. Hypothesis strategies for shapes live in
`caffe.layers.strategies` (imported only where hypothesis is installed).
"""
from __future__ import annotations

import numpy as np
from google.protobuf import text_format

from caffe.blob import Blob, context
from caffe.layers.gradient_check import GradientChecker
from caffe.layers.registry import create_layer


def layer_param(type_name: str, text: str = "", name: str = "test", phase: int = 0, **kwargs):
    """A LayerParameter of `type_name`, with extra fields given as prototxt text.

    e.g. layer_param("Convolution", "convolution_param { num_output: 3 kernel_size: 2 }")
    """
    from caffe.proto import caffe_pb2
    p = caffe_pb2.LayerParameter()
    text_format.Parse(text, p)
    p.name = name
    p.type = type_name
    p.phase = phase
    for k, v in kwargs.items():
        setattr(p, k, v)
    return p


def make_layer(type_name: str, text: str = "", **kwargs):
    return create_layer(layer_param(type_name, text, **kwargs))


def blobs_from_arrays(arrays, dtype=np.float64) -> list[Blob]:
    out = []
    for a in arrays:
        a = np.asarray(a, dtype=dtype)
        b = Blob(a.shape, dtype=dtype)
        b.data[...] = a
        out.append(b)
    return out


def empty_tops(n: int, dtype=np.float64) -> list[Blob]:
    return [Blob(dtype=dtype) for _ in range(n)]


def run_forward(layer, bottom_arrays, n_top: int = 1, dtype=np.float64):
    bottom = blobs_from_arrays(bottom_arrays, dtype)
    top = empty_tops(n_top, dtype)
    layer.SetUp(bottom, top)
    layer.Forward(bottom, top)
    return bottom, top


def check_layer_gradient(layer, bottom_arrays, n_top: int = 1, mode: str = "exhaustive",
                         check_bottom: int = -1, stepsize: float = 1e-3, threshold: float = 1e-3,
                         kink: float = 0.0, kink_range: float = -1.0, seed: int = 1701):
    """Check a layer's gradients on float64 bottoms; raises GradientCheckError on a mismatch.

    mode: 'single' (0.5*sum(top^2)), 'exhaustive' (every top element) or 'eltwise'.
    """
    bottom = blobs_from_arrays(bottom_arrays, np.float64)
    top = empty_tops(n_top, np.float64)
    checker = GradientChecker(stepsize, threshold, seed, kink, kink_range)
    if mode == "single":
        checker.check_gradient(layer, bottom, top, check_bottom)
    elif mode == "exhaustive":
        checker.check_gradient_exhaustive(layer, bottom, top, check_bottom)
    elif mode == "eltwise":
        checker.check_gradient_eltwise(layer, bottom, top)
    else:
        raise ValueError(f"unknown gradient-check mode {mode!r}")
    return bottom, top


def gpu_available() -> bool:
    return context.gpu_available()


def cpu_gpu_runs(param, bottom_arrays, n_top: int = 1, top_diffs=None, seed: int = 1701, dtype=np.float32,
                 propagate_down=None):
    """The same layer (fresh, same seed) forward and backward in CPU mode, then in GPU mode: two triples
    (tops' data, bottoms' diffs, params' diffs). top_diffs: arrays for the tops' diffs, a function of the
    tops' shapes returning them (called once per mode), or None (ones)."""
    results = []
    for mode in (context.CPU, context.GPU):
        context.set_mode(mode)
        try:
            context.set_random_seed(seed)
            layer = create_layer(param)
            bottom = blobs_from_arrays(bottom_arrays, dtype)
            top = empty_tops(n_top, dtype)
            layer.SetUp(bottom, top)
            layer.Forward(bottom, top)
            diffs = top_diffs([t.shape for t in top]) if callable(top_diffs) else top_diffs
            for i, t in enumerate(top):
                t.diff[...] = diffs[i] if diffs is not None else 1.0
            layer.Backward(top, propagate_down or [True] * len(bottom), bottom)
            results.append(([t.data.copy() for t in top], [b.diff.copy() for b in bottom],
                            [p.diff.copy() for p in layer.blobs]))
        finally:
            context.set_mode_cpu()
    return results


def check_cpu_gpu_parity(param, bottom_arrays, n_top: int = 1, rtol: float = 1e-5, atol: float = 1e-6,
                         top_diffs=None, seed: int = 1701, dtype=np.float32, propagate_down=None):
    """Forward and backward the same layer on CPU and GPU and compare tops, bottom diffs and param diffs."""
    (ct, cb, cp), (gt, gb, gp) = cpu_gpu_runs(param, bottom_arrays, n_top, top_diffs, seed, dtype, propagate_down)
    for a, b in zip(ct + cb + cp, gt + gb + gp):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)

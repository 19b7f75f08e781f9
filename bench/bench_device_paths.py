"""Time the device's lowering and pooling paths (issue 14 item 4) on the current CuPy device.

    python bench/bench_device_paths.py [--repeat 20]

For a few layer geometries (CaffeNet conv1, a ResNet 3x3, a MobileNet depthwise 3x3, pooling 3x3/2 and
global), the median milliseconds of im2col, col2im, MAX/AVE pooling forward and backward, and of the
memory-bound layers' forward + backward (Softmax, SoftmaxWithLoss, BatchNorm, LRN, Dropout, ReLU with a
negative slope, ELU, BNLL, Swish, Sigmoid, Scale with bias, Bias, Eltwise SUM / MAX) at CaffeNet / ResNet-50
batch-16 shapes, with the hand-written CUDA kernels on and off (CAFFE_DEVICE_KERNELS; im2col has none).
Run by scripts/gpu_check.sh. Under the CuPy stand-in (CAFFE_CUPY_STANDIN=1) it runs on NumPy: the figures
are then NOT GPU figures (the output says so); that run only checks this script.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import caffe  # noqa: F401 (installs the stand-in under CAFFE_CUPY_STANDIN=1)
from caffe.blob import Blob, context
from caffe.layers import conv_base, pooling
from caffe.layers.testing import make_layer

CONVS = [  # name, (N, C, H, W), kernel, stride, pad
    ("caffenet_conv1", (16, 3, 227, 227), 11, 4, 0),
    ("resnet_3x3", (16, 64, 56, 56), 3, 1, 1),
    ("mobilenet_dw3x3", (16, 128, 56, 56), 3, 1, 1),
]
POOLS = [("pool_3x3s2", (16, 96, 55, 55), 3, 2, 0), ("global_7x7", (16, 512, 7, 7), 7, 1, 0)]
LAYERS = [  # name, type, prototxt, bottom shape (a second bottom: labels for the loss, a twin for Eltwise)
    ("softmax_1000", "Softmax", "", (16, 1000)),
    ("softmax_loss_1000", "SoftmaxWithLoss", "", (16, 1000)),
    ("softmax_seg_21", "Softmax", "", (4, 21, 128, 128)),
    ("batchnorm_train", "BatchNorm", "batch_norm_param { use_global_stats: false }", (16, 64, 56, 56)),
    ("batchnorm_global", "BatchNorm", "batch_norm_param { use_global_stats: true }", (16, 64, 56, 56)),
    ("lrn_caffenet", "LRN", "lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 }", (16, 96, 55, 55)),
    ("dropout_fc", "Dropout", "", (16, 4096)),
    ("leaky_relu", "ReLU", "relu_param { negative_slope: 0.1 }", (16, 64, 56, 56)),
    ("elu", "ELU", "", (16, 64, 56, 56)),
    ("bnll", "BNLL", "", (16, 64, 56, 56)),
    ("swish", "Swish", "", (16, 64, 56, 56)),
    ("sigmoid", "Sigmoid", "", (16, 64, 56, 56)),
    ("scale_bias", "Scale", "scale_param { bias_term: true }", (16, 64, 56, 56)),
    ("bias", "Bias", "", (16, 64, 56, 56)),
    ("eltwise_sum", "Eltwise", "eltwise_param { operation: SUM coeff: 1 coeff: -1 }", (16, 256, 56, 56)),
    ("eltwise_max", "Eltwise", "eltwise_param { operation: MAX }", (16, 256, 56, 56)),
]


def layer_step(cp, type_name, text, shape, rng):
    """forward_xp + backward_xp of a layer set up on device bottoms (TRAIN)."""
    layer = make_layer(type_name, text)
    bottoms = [Blob(shape, dtype=np.float32)] * (2 if type_name == "Eltwise" else 1)
    bottoms = [Blob(shape, dtype=np.float32) for _ in bottoms]
    for b in bottoms:
        b.mutable_cpu_data()[...] = rng.normal(size=b.shape)
    if type_name == "SoftmaxWithLoss":
        bottoms.append(Blob((shape[0],), dtype=np.float32))
        bottoms[1].mutable_cpu_data()[...] = rng.integers(0, shape[1], size=shape[0])
    tops = [Blob(dtype=np.float32)]
    layer.SetUp(bottoms, tops)
    tops[0].mutable_diff_xp(cp)[...] = 1
    down = [True] + [type_name != "SoftmaxWithLoss"] * (len(bottoms) - 1)

    def step():
        layer.forward_xp(cp, bottoms, tops)
        layer.backward_xp(cp, tops, down, bottoms)
    return step


def timed(cp, fn, repeat):
    fn()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        cp.cuda.Device().synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    if not context.gpu_available():
        print("no usable device (a GPU, or the CuPy stand-in)")
        return 1
    import cupy as cp
    if context.cupy_standin():
        print("CuPy STAND-IN: NumPy on the host, NO GPU RAN: these are not GPU figures")
        global CONVS, POOLS
        CONVS = [(n, (2,) + s[1:2] + tuple(min(v, 32) for v in s[2:]), k, st, p) for n, s, k, st, p in CONVS]
        POOLS = [(n, (2,) + s[1:2] + tuple(min(v, 32) for v in s[2:]), k, st, p) for n, s, k, st, p in POOLS]
        global LAYERS
        LAYERS = [(n, t, x, (2,) + s[1:2] + tuple(min(v, 16) for v in s[2:])) for n, t, x, s in LAYERS]
    rng = np.random.default_rng(0)
    print(f"{'case':<18}{'path':<22}{'kernels on ms':>14}{'off ms':>10}")
    rows = []
    for name, shape, k, s, p in CONVS:
        N, C, H, W = shape
        out = tuple((n + 2 * p - k) // s + 1 for n in (H, W))
        geom = conv_base.ConvGeometry((k, k), (s, s), (p, p), (1, 1), (H, W), out)
        im = cp.asarray(rng.normal(size=shape).astype(np.float32))
        col = cp.empty((C * k * k, N * out[0] * out[1]), np.float32)
        back = cp.empty_like(im)
        rows.append((name, "im2col", lambda: conv_base.im2col(cp, im, col, geom, "batch")))
        rows.append((name, "col2im", lambda: conv_base.col2im(cp, col, back, geom, "batch")))
    for name, shape, k, s, p in POOLS:
        N, C, H, W = shape
        spec = pooling.PoolSpec(pooling.MAX, (k, k), (s, s), (p, p))
        ph, pw = pooling.pooled_size(H, k, s, p), pooling.pooled_size(W, k, s, p)
        x = cp.asarray(rng.normal(size=shape).astype(np.float32))
        y, mask = cp.empty((N, C, ph, pw), np.float32), cp.empty((N, C, ph, pw), np.int32)
        dx = cp.empty_like(x)
        ave = pooling.PoolSpec(pooling.AVE, (k, k), (s, s), (p, p))
        rows.append((name, "max forward", lambda: pooling.max_forward(cp, spec, x, y, mask)))
        rows.append((name, "max backward", lambda: pooling.max_backward(cp, spec, y, mask, dx)))
        rows.append((name, "ave forward", lambda: pooling.ave_forward(cp, ave, x, y)))
        rows.append((name, "ave backward", lambda: pooling.ave_backward(cp, ave, y, dx)))
    for name, type_name, text, shape in LAYERS:
        rows.append((name, f"{type_name} fwd+bwd", layer_step(cp, type_name, text, shape, rng)))
    for name, path, fn in rows:
        figures = []
        for kernels in ("1", "0"):
            os.environ["CAFFE_DEVICE_KERNELS"] = kernels
            figures.append(timed(cp, fn, args.repeat))
        print(f"{name:<18}{path:<22}{figures[0]:>14.3f}{figures[1]:>10.3f}")
    os.environ.pop("CAFFE_DEVICE_KERNELS", None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

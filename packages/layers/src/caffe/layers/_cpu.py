"""Helpers for the layers' CPU paths (forward_cpu / backward_cpu) through the compiled kernels.

A layer's CPU path calls a kernel from caffe.layers.kernels when the blobs are float32 or
float64 (all the same) and the kernels are built; otherwise it runs the layer's
array-module-generic forward_xp / backward_xp with NumPy, which is also the GPU path and the
reference the kernels are tested against.

State that backward needs lives in Blobs owned by the layer (as Caffe keeps it: a mask, a
saved bottom, x_norm), so that a forward in one mode and a backward in the other see the same
values: the blob's cpu/gpu views move the data.
"""
from __future__ import annotations

import importlib
import os

import numpy as np

from caffe.blob import Blob


def cpu_has_avx2(feature="AVX2") -> bool:
    """Whether this CPU (and OS) runs AVX2 (or another feature NumPy names: "FMA3"), as NumPy's own
    dispatch sees it."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:  # pragma: no cover - NumPy < 2
        try:
            from numpy.core._multiarray_umath import __cpu_features__
        except ImportError:
            return False
    return bool(__cpu_features__.get(feature))


# The AVX-512 subsets the *_avx512 builds are compiled for (GCC target avx512f,avx512dq,avx512vl,avx512bw).
AVX512_FEATURES = ("AVX512F", "AVX512DQ", "AVX512VL", "AVX512BW")


def cpu_has_avx512() -> bool:
    """Whether this CPU (and OS: the zmm state saved) runs the *_avx512 builds, as NumPy's dispatch sees it."""
    return all(cpu_has_avx2(f) for f in AVX512_FEATURES)


# CAFFE_KERNELS_AVX2=0 keeps the baseline (SSE2) builds of the kernels whose loops call libm (exp, tanh,
# log, pow, sqrt); by default they come in the AVX2 build where the CPU has it (see elementwise_avx2.pyx).
USE_AVX2 = os.environ.get("CAFFE_KERNELS_AVX2", "1") != "0" and cpu_has_avx2()
# CAFFE_KERNELS_AVX512=0 keeps the AVX2 builds where the CPU has AVX-512 (elementwise and softmax: libmvec's
# 16-wide exp/tanh/log, see elementwise_avx512.pyx); CAFFE_KERNELS_AVX2=0 keeps the baseline ones for both.
USE_AVX512 = USE_AVX2 and os.environ.get("CAFFE_KERNELS_AVX512", "1") != "0" and cpu_has_avx512()


def _load(name, avx2=USE_AVX2, avx512=False):
    """The first of name_avx512 (when avx512), name_avx2 (when avx2), name that is built; None if none is."""
    for candidate in ([f"{name}_avx512"] if avx512 else []) + ([f"{name}_avx2"] if avx2 else []) + [name]:
        try:
            return importlib.import_module(f"caffe.layers.kernels.{candidate}")
        except ImportError:  # not built (a source tree without the build): the NumPy paths serve
            continue
    return None


elementwise = _load("elementwise", avx512=USE_AVX512)
# normalization_avx512: LRN 1.1-1.5x the AVX2 build (16-wide sqrt / division), BatchNorm the same (ab_kernels)
normalization = _load("normalization", avx512=USE_AVX512)
# softmax_avx2 is built with FMA too (AVX-512 CPUs all have FMA)
softmax = _load("softmax", avx2=USE_AVX2 and cpu_has_avx2("FMA3"), avx512=USE_AVX512 and cpu_has_avx2("FMA3"))
# channelwise: no AVX2 build (memory-bound there); the AVX-512 one widens the backward's double sums 8 at a time
channelwise = _load("channelwise", avx2=False, avx512=USE_AVX512)
# skinny_gemm: InnerProduct at batch 1-16 (float32; FMA in the AVX2 and AVX-512 builds)
skinny_gemm = _load("skinny_gemm", avx2=USE_AVX2 and cpu_has_avx2("FMA3"),
                    avx512=USE_AVX512 and cpu_has_avx2("FMA3"))

# rng: the gaussian fill (the same bits in every build; AVX2 / AVX-512 vectorize it: 0.10 / 0.04 ms for LeNet's
# 64x1x28x28 batch against the baseline build's 0.21 and NumPy's ziggurat's 0.5-0.7)
rng = _load("rng", avx512=USE_AVX512)

# The neuron operations of kernels.elementwise (its Neuron enum; a test checks they agree).
(RELU, SIGMOID, TANH, ELU, POWER, EXP, LOG, ABSVAL, BNLL, THRESHOLD, CLIP, SWISH, AFFINE) = range(13)

# The operations of kernels.channelwise (its Op enum).
CH_AFFINE, CH_PRELU, CH_SHIFT = range(3)

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_EMPTY = {dt: np.empty(0, dt) for dt in FLOATS}
EMPTY_INT = np.empty(0, np.int32)
EMPTY_DOUBLE = np.empty(0, np.float64)


def usable(module, *blobs) -> bool:
    """The kernel module is built and every blob has the same float32/float64 dtype."""
    if module is None:
        return False
    dt = blobs[0].dtype
    return dt in FLOATS and all(b.dtype == dt for b in blobs[1:])


def empty(dtype):
    """A zero-length array of dtype: what the kernels take for an unused optional buffer."""
    return _EMPTY[np.dtype(dtype)]


def flat(array):
    return array.reshape(-1)


def state_blob(layer, name, like, dtype=None) -> Blob:
    """The layer's state blob `name` (created on first use), shaped like the Blob or shape `like`."""
    blob = getattr(layer, name, None)
    shape = like.shape if isinstance(like, Blob) else tuple(like)
    dtype = np.dtype(dtype if dtype is not None else like.dtype)
    if blob is None or blob.dtype != dtype:
        blob = Blob(shape, dtype=dtype)
        setattr(layer, name, blob)
    elif blob.shape != shape:
        blob.reshape(shape)
    return blob


class DeferredState:
    """Backward state (MAX pooling's argmax, LRN's scale) that a TEST-phase forward leaves out: nothing
    reads it unless a Backward follows. That Backward recomputes it from the bottom (nothing changes the
    bottom between a forward and its backward) and from then on every forward keeps it (pycaffe's saliency
    and deep-dream loops). A TRAIN-phase layer always keeps it, unless keep=False: a layer whose CPU backward
    recomputes the state in its own pass (LRN's scale) keeps it only once another Backward asked for it."""

    def __init__(self, layer, keep: bool | None = None):
        self.keep = layer.phase == 0 if keep is None else keep  # phase 0: TRAIN
        self.stale = False  # the last forward left it out

    def written(self, kept: bool = True) -> None:
        """A forward wrote the state (kept) or left it out."""
        self.stale = not kept

    def recompute(self) -> bool:
        """For a Backward: True if the state must be recomputed now (once; forwards keep it afterwards)."""
        if not self.stale:
            return False
        self.keep, self.stale = True, False
        return True


def save_bottom(layer, xp, bottom, top):
    """In place, keep the bottom data in the layer's bottom_memory_ blob (Caffe's name, PReLU's)
    before the top overwrites it; returns that blob, or None out of place."""
    if bottom[0] is not top[0]:
        return None
    saved = state_blob(layer, "bottom_memory_", bottom[0])
    saved.mutable_data_xp(xp)[...] = bottom[0].data_xp(xp)
    return saved


def saved_bottom(layer, xp, bottom, top, name="bottom_memory_"):
    """The bottom data as forward saw it: in place, the copy saved in the layer's blob `name` (Caffe's
    bottom_memory_; Scale's temp_), else the bottom blob's data."""
    if bottom[0] is top[0]:
        saved = getattr(layer, name, None)
        if saved is None or saved.shape != bottom[0].shape:
            raise layer.error("backward in place needs a forward pass first (no saved bottom data)")
        return saved.data_xp(xp)
    return bottom[0].data_xp(xp)


def neuron_forward(layer, op, bottom, top, a=0.0, b=0.0, c=0.0, save=False, aux=None) -> bool:
    """Run a neuron kernel y = op(x) when usable; save: keep the bottom in bottom_memory_ when in place
    (written in the same pass); aux: a second output blob (Swish's sigmoid). False: not usable."""
    if not usable(elementwise, bottom[0], top[0]):
        return False
    x = flat(bottom[0].cpu_data())
    dt = x.dtype
    saved = empty(dt)
    if save and bottom[0] is top[0]:
        saved = flat(state_blob(layer, "bottom_memory_", bottom[0]).mutable_cpu_data())
    aux_arr = flat(aux.mutable_cpu_data()) if aux is not None else empty(dt)
    elementwise.neuron_forward(op, x, flat(top[0].mutable_cpu_data()), aux_arr, saved, a, b, c)
    return True


def neuron_backward(layer, op, top, bottom, reads_x=None, reads_y=False, aux=None,
                    a=0.0, b=0.0, c=0.0, d=0.0) -> bool:
    """dx = op'(...) * dy through the kernel when usable. reads_x: "bottom" (the bottom blob's data,
    whatever in place left there, as Caffe's ReLU reads it) or "saved" (bottom_memory_ in place)."""
    if not usable(elementwise, bottom[0], top[0]):
        return False
    dt = bottom[0].dtype
    if reads_x == "saved":
        x = flat(saved_bottom(layer, np, bottom, top))
    elif reads_x == "bottom":
        x = flat(bottom[0].cpu_data())
    else:
        x = empty(dt)
    y = flat(top[0].cpu_data()) if reads_y else empty(dt)
    aux_arr = flat(aux.cpu_data()) if aux is not None else empty(dt)
    dy = flat(top[0].cpu_diff())
    elementwise.neuron_backward(op, x, y, aux_arr, dy, flat(bottom[0].mutable_cpu_diff()), a, b, c, d)
    return True

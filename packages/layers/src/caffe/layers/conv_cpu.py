"""Convolution's CPU plans: a 1x1 GEMM, a direct grouped kernel, a direct dense kernel, a cache-blocked lowering.

conv_base picks one per layer and call (BaseConvolutionLayer.plan); the generic batched
path in conv_base stays the GPU's and the N-d one. Every plan computes the same three
products, named from the convolution's side (Deconvolution swaps the roles):

  forward    out (N, C_col, P) = W * im (N, C_im, *S_im) + b
  backward   from dout (N, C_col, P): weight_diff += dout (x) im, im_diff = W^T * dout,
             bias_diff += sum of dout, and fwd_out = W * im without bias (Deconvolution's
             bottom diff, sharing the lowering of im with its weight gradient).

"1x1" (Caffe's is_1x1: every kernel side 1, stride 1, no pad): im already is the column
buffer, so each image's GEMM reads and writes the blobs directly, no lowering (images of
fewer than ONE_BY_ONE_VIEW_COLS positions are copied side by side into one wider GEMM). Its float32
GEMMs (the forward, with the bias and activation in the GEMM's store, and the backward's weight diff,
accumulated in place, and bottom diff) run kernels.gemm, an AVX-512 packed GEMM, where GEMM512 is set: a CPU
with AVX-512F (_gemm512_default); the exact short-K forward stays.

"direct" (group > 1 with at most DIRECT_MAX_PAIRS channel pairs per group: depthwise,
MobileNet): the kernels of caffe.layers.kernels.depthwise, one (image, group) per OpenMP task.

"dense" (float32, stride 1, dilation 1, kernel_dim past the exact path's, pad < kernel, a CPU with AVX2
and FMA, and dense_rule's measured shapes): the kernels of caffe.layers.kernels.conv_direct_avx2 (their
AVX-512 variants where the CPU has AVX-512F, CAFFE_CONV_DENSE_AVX512=0 for AVX2; dense_rule then takes
wider layers), no lowering: the forward vectorized over 8 (AVX-512: 16) output positions and blocked over
4 output channels, the bottom diff the same kernel on dout with the filters flipped and transposed, the
weight diff a direct reduction vectorized over output channels (with the bias diff in the same pass); each
product the rule does not name (dense_products) runs blocked. Sums are float32 (the weight and bias diffs':
float32 over at most about 1,024 positions, then float64).

"blocked" (the rest, 2-D): the output positions are cut into blocks (several whole
images, or a band of output rows of one image) whose column buffer is about
COL_BLOCK_BYTES, so im2col writes it into the (L3) cache and the GEMMs read it from
there instead of main memory (a whole-batch column buffer, CIFAR10-quick's conv2, is
82 MB; VGG's first layers need 115 MB per image). Each block runs one GEMM per group on
all cores (OpenBLAS; kernels.gemm where GEMM512 is set, GEMM512_LOWERED, for GEMMs of at least
GEMM512_LOWERED_MIN_MACS, except the forward of a valid layer whose kernel is past 1 x 1, LeNet's, which keeps
sgemm's sums: GEMM512_VALID_BACKWARD); the lowering and layout changes between them are OpenMP kernels.
The two pools run one after the other, never nested, so the cores are never
oversubscribed; each hand-over between them costs, which is why blocks are not smaller.

Numerics: a float32 forward whose dot products are at most conv_base.EXACT_FORWARD_MAX_K
long is taken in float64 and rounded once; the direct kernel always sums in float64. Where the CPU
has AVX2 and FMA (EXACT_GEMM) the exact forward is kernels.exact_gemm: float64 tiles widened from
the float32 data as they are loaded, the bias, the rounding and the activation in the tile's store
(a 1x1 layer's blob read in place, any other's float32 column block); elsewhere the column block is
lowered straight into float64, multiplied by a float64 GEMM and stored rounded (rows_to_batch_f32).
Such a layer's weight gradient sums in float64 too (EXACT_WGRAD: kernels.exact_gemm.dots_nt, each block's
term rounded once onto the diff; without AVX2 and FMA a float64 GEMM).
"""
from __future__ import annotations

import os

import numpy as np

from caffe.layers import _cpu

# the compiled lowering (built by the package's hatch hook; None in a source tree without the build): lowering_avx512
# where the CPU has AVX-512 (col2im's row adds in 512-bit vectors, im2col's stride-2 rows by permutes, its other strided
# rows kept scalar; the same bits as the baseline build), which is the baseline elsewhere: no AVX2 build (GCC's 256-bit
# loops measured no faster than SSE2's). Figures: packages/layers/bench/README.md, session 16.
_k = _cpu._load("lowering", avx2=False, avx512=_cpu.USE_AVX512)
# depthwise_avx2 where the CPU has AVX2 (4 doubles a vector instead of SSE2's 2; the same bits: no FMA):
# 0.72-0.76x the time of the baseline build at MobileNet's stride-1 shapes
_dw = _cpu._load("depthwise")
try:
    from caffe.layers.kernels import conv_direct_avx2 as _cd
except ImportError:  # pragma: no cover - a source tree without the build
    _cd = None
try:
    from caffe.layers.kernels import exact_gemm as _eg
except ImportError:  # pragma: no cover - a source tree without the build
    _eg = None
try:
    from caffe.layers.kernels import gemm as _gm
except ImportError:  # pragma: no cover - a source tree without the build
    _gm = None

# The exact short-K forward by kernels.exact_gemm (module doc) where it is vectorized; False, or
# CAFFE_CONV_EXACT_GEMM=0 in the environment: the float64 lowering and GEMM (benchmarks A/B the two).
EXACT_GEMM = os.environ.get("CAFFE_CONV_EXACT_GEMM", "1") != "0" and _eg is not None and _eg.supported()

# The weight gradient of a float32 layer whose forward is exact (kernel_dim <= conv_base.EXACT_FORWARD_MAX_K: LeNet's
# and MobileNet's conv1) sums in float64 too, rounded once: its (C_out, kernel_dim) products are small and their
# sums long (every output position of the batch: 36,864 at LeNet conv1), where float32 sgemm both rounds the
# most and runs slowest. kernels.exact_gemm.dots_nt: LeNet conv1's 0.88-0.95 ms (np.matmul) -> 0.23 ms; the
# LeNet 100-iteration trace then follows Caffe closer (losses within 2.7e-6 instead of 4.8e-6). False, or
# CAFFE_CONV_EXACT_WGRAD=0: the float32 GEMM (benchmarks A/B the two).
EXACT_WGRAD = os.environ.get("CAFFE_CONV_EXACT_WGRAD", "1") != "0"

# A block's column buffer holds about this many bytes, but at least MIN_BLOCK_COLS columns. Measured on
# the 2-core development machine (512 KiB L2 per core, 32 MiB L3): one thread's sgemm gains nothing from
# blocks that fit L2 (the L3 holds a few MB as well) and loses on skinny products (M = 32: 70 GFLOP/s at
# 2,560 columns, less below 512); and each block hands the cores over between the thread pools two or
# three times, which costs far more than the L2 saves (CIFAR10-quick conv2, two threads: 1 MB blocks were
# 2.6x slower than 8 MB ones on a busy machine). So blocks are L3-sized: a batch of small images goes in
# a few blocks, and an image whose column buffer alone is larger (VGG's 224 x 224 layers: 115 MB) in
# bands of output rows instead of through main memory.
COL_BLOCK_BYTES = 8 << 20
MIN_BLOCK_COLS = 1024

# 1x1 layers read images of at least ONE_BY_ONE_VIEW_COLS positions in place, one GEMM per image; smaller
# images are copied side by side into blocks of about ONE_BY_ONE_COLS columns (at most ONE_BY_ONE_BYTES):
# ResNet-50's 7x7 layers ran 25% slower one image at a time.
ONE_BY_ONE_VIEW_COLS = 512
ONE_BY_ONE_COLS = 1024
ONE_BY_ONE_BYTES = 8 << 20

# The direct kernel takes grouped layers whose groups have at most this many (output, input) channel
# pairs (depthwise: 1); above it one GEMM per group is faster (measured: 4 pairs, direct 3x faster
# forward and 2x backward; 16 pairs, forward even, backward 1.6x slower).
DIRECT_MAX_PAIRS = 8

# OpenBLAS core types whose sgemm kernels are AVX-512 ones (its DYNAMIC_ARCH names; Zen 4/5 map to them).
BLAS_AVX512_CORES = frozenset({"skylakex", "cooperlake", "sapphirerapids"})


def blas_corename():
    """The core type NumPy's OpenBLAS runs ("Haswell", "SkylakeX", ...: its openblas_get_corename), or None
    when NumPy's BLAS is not an OpenBLAS this finds (read through ctypes from the loaded library)."""
    import ctypes
    paths = []
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line})
    except OSError:  # pragma: no cover - not Linux
        pass
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:  # pragma: no cover
            continue
        for name in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename64_",
                     "openblas_get_corename"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                return fn().decode()
    return None


def _gemm512_default() -> bool:
    """kernels.gemm for the 1x1 plan's float32 GEMMs (and the blocked plan's large ones): the CPU has AVX-512F,
    whatever kernels NumPy's OpenBLAS runs. Measured (packages/layers/bench/ab_gemm512.py, ResNet-50's nine 1x1
    shapes at batch 1 and 8, interleaved; tables in bench/README.md):
    - Zen 5, OpenBLAS on its Haswell AVX2 kernels (that VM's OPENBLAS_CORETYPE=Haswell), one thread: forward
      1.6-2.1x OpenBLAS's speed (its AVX2 kernels run at the AVX2 peak, ~100 GF/s; this one at 150-205),
      backward 1.5-2.0x; against its SkylakeX AVX-512 kernels there the forward 0.94-1.24x (behind on the 7 x 7
      and 14 x 14 planes), the backward about even;
    - an Intel Xeon (AMX, 2 MB L2 a core) whose OpenBLAS picks its SkylakeX kernels itself, two threads:
      forward 0.85-1.83x (geometric mean 1.26; behind only at 14 x 14, batch 8), backward 0.97-1.60x (1.18).
    So OpenBLAS's AVX-512 kernels no longer keep np.matmul; CAFFE_CONV_GEMM512=0 (or CAFFE_KERNELS_AVX512=0)
    does."""
    if _gm is None or not _gm.supported() or not _cpu.cpu_has_avx2("AVX512F"):  # (NumPy's view of the CPU too)
        return False
    return os.environ.get("CAFFE_KERNELS_AVX512", "1") != "0" and os.environ.get("CAFFE_CONV_GEMM512", "1") != "0"


# The 1x1 plan's float32 GEMMs (not the exact short-K forward) by kernels.gemm (AVX-512 packed GEMM, bias
# and activation in its store): _gemm512_default(); CAFFE_CONV_GEMM512=0 or CAFFE_KERNELS_AVX512=0 in the
# environment turn it off (benchmarks and tests set it False / True; True needs gemm512_supported()).
GEMM512 = _gemm512_default()


def _blas512_default() -> bool:
    """NumPy's BLAS is an OpenBLAS running its AVX-512 sgemm kernels (dense_rule's measured BLAS512 rules)."""
    core = blas_corename()
    return core is not None and core.lower() in BLAS_AVX512_CORES


BLAS512 = _blas512_default()

# The blocked plan's float32 GEMMs by kernels.gemm too (where GEMM512 is set), except a "valid" layer's
# (no pad, kernel past 1 x 1: LeNet's) forward: it keeps sgemm's numerics, which the LeNet trace follows, as
# dense_rule keeps them on this plan (kernels.gemm's sums in LeNet conv2's forward moved ip1's bias 22% from
# Caffe's by iteration 100, against a 5% bound). Its backward GEMMs (weight and bottom diffs) do run
# kernels.gemm (GEMM512_VALID_BACKWARD): measured session 14 with the 100-iteration trace, both moved no weight
# by 0.0001 of Caffe's (sgemm: ip1's bias 0.0005) and the losses stayed within 4.9e-6 (the same); the bottom
# diff's alone brought them to 2.6e-6 (kernels.gemm sums each dot product in one chain, k in order, as Caffe's
# per-image GEMMs of K = 50 may have), the weight diff's alone 0.8e-2 (ip1's bias 2%): that trace is chaotic,
# so the pair is what the fidelity tests hold. Backward, A/B in one process: LeNet conv2 (b64) 1.31x faster,
# CaffeNet conv1 (b8) 1.50x.
GEMM512_LOWERED = True
GEMM512_VALID_BACKWARD = True
# ... for GEMMs of at least this many multiply-adds (a group's, a block's): below it OpenBLAS's were as fast or
# faster (bench/ab_gemm512_lowered.py, two threads, speed-up OpenBLAS time / kernels.gemm time: GoogLeNet's
# 7 x 7 inception_5 layers at batch 1, 5-23 M, 0.81-0.96x; ResNet-50's stride-2 1x1 layers at batch 1, 25.7 M,
# 0.99-1.17x; its res5 3x3, 115 M, 1.45x)
GEMM512_LOWERED_MIN_MACS = 24_000_000


def gemm512_supported() -> bool:
    return _gm is not None and _gm.supported()


_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_NO_ACT = (0, 0.0, 0.0)  # kernels.lowering.ACT_NONE


def tunables():
    """The block-size settings and the exact forward's path (a cache key: tests and benchmarks change them)."""
    return (COL_BLOCK_BYTES, MIN_BLOCK_COLS, ONE_BY_ONE_VIEW_COLS, ONE_BY_ONE_COLS, ONE_BY_ONE_BYTES, EXACT_GEMM,
            GEMM512, GEMM512_LOWERED, GEMM512_LOWERED_MIN_MACS)


def available() -> bool:
    return _k is not None and _dw is not None


def _split(total: int, parts: int):
    """total items in `parts` near-equal consecutive ranges."""
    parts = max(1, min(parts, total))
    return [(total * i // parts, total * (i + 1) // parts) for i in range(parts)]


def plan_blocks(num: int, OH: int, OW: int, rows: int, itemsize: int, lowered: bool):
    """The blocks (n0, n1, oh0, oh1) of a pass over num images of OH x OW outputs whose column
    buffer has `rows` rows of `itemsize` bytes. Unlowered (1x1) blocks need no buffer when they
    hold one image, so whole images go alone unless they are too small for a good GEMM."""
    P = OH * OW
    if num * P == 0:
        return []
    if not lowered:  # whole images; small ones are copied side by side for a wider GEMM
        per = 1 if P >= ONE_BY_ONE_VIEW_COLS else min(num, -(-ONE_BY_ONE_COLS // P),
                                                      max(1, ONE_BY_ONE_BYTES // (rows * P * itemsize)))
        return [(n0, n1, 0, OH) for n0, n1 in _split(num, -(-num // per))]
    per_image = rows * P * itemsize
    if per_image <= COL_BLOCK_BYTES or P <= MIN_BLOCK_COLS:
        per = max(1, min(num, COL_BLOCK_BYTES // max(1, per_image)))
        return [(n0, n1, 0, OH) for n0, n1 in _split(num, -(-num // per))]
    band = max(-(-MIN_BLOCK_COLS // OW), COL_BLOCK_BYTES // (rows * OW * itemsize))
    bands = _split(OH, -(-OH // band))
    return [(n, n + 1, oh0, oh1) for n in range(num) for oh0, oh1 in bands]


class Blocks:
    """One layer's blocked (or 1x1) geometry for arrays of one shape and dtype."""

    def __init__(self, layer, num, dtype, exact):
        g = layer.geom
        self.one_by_one = layer.is_1x1
        if self.one_by_one:  # any number of spatial axes: the positions are one row of P
            self.OH, self.OW = 1, g.col_count
        else:
            self.OH, self.OW = g.col_shape
        self.P = self.OH * self.OW
        self.rows = layer.kernel_dim * layer.group  # column-buffer rows (= C_im for 1x1)
        self.exact = exact
        # the exact forward by kernels.exact_gemm: float32 column blocks (the kernel widens them itself)
        self.kernel = exact and EXACT_GEMM and np.dtype(dtype) == np.float32
        self.cdtype = np.dtype(np.float64) if exact and not self.kernel else np.dtype(dtype)
        self.blocks = plan_blocks(num, self.OH, self.OW, self.rows, self.cdtype.itemsize,
                                  not self.one_by_one)
        # float32 GEMMs by kernels.gemm (GEMM512): a 1x1 layer's; a lowered one's past GEMM512_LOWERED_MIN_MACS
        # unless it is valid with a kernel past 1 x 1 (module doc)
        macs = layer.conv_out_channels // layer.group * layer.kernel_dim * num * self.P // max(1, len(self.blocks))
        # (the backward's weight and bottom diffs: a valid layer's too, GEMM512_VALID_BACKWARD)
        eligible = GEMM512 and not exact and self.cdtype == np.float32
        lowered = GEMM512_LOWERED and macs >= GEMM512_LOWERED_MIN_MACS
        valid = not any(g.pad) and any(k != 1 for k in g.kernel)
        self.gemm512 = eligible and (self.one_by_one or (lowered and not valid))
        self.gemm512_backward = eligible and (self.one_by_one or (lowered and (not valid or GEMM512_VALID_BACKWARD)))


def _lowered(layer, b: Blocks, im, n0, n1, oh0, oh1, dtype, name="col"):
    """The column block (rows, nb * Pb) of images n0..n1-1, output rows oh0..oh1-1, in dtype."""
    nb, Pb = n1 - n0, (oh1 - oh0) * b.OW
    if b.one_by_one:
        if nb == 1 and im.dtype == dtype:
            return im[n0].reshape(b.rows, b.P)
        col = layer.buffer(np, name, (b.rows, nb * Pb), dtype)
        to_rows = _k.batch_to_rows if im.dtype == dtype else _k.batch_to_rows_f64
        to_rows(im[n0:n1].reshape(-1), col.reshape(-1), nb, b.rows, b.P, 0, Pb)
        return col
    g = layer.geom
    col = layer.buffer(np, name, (b.rows, nb * Pb), dtype)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = g.kernel, g.stride, g.pad, g.dilation
    H, W = g.im_shape
    lower = _k.im2col_2d if im.dtype == dtype else _k.im2col_2d_f64
    lower(im[n0:n1].reshape(-1), col.reshape(-1), nb, im.shape[1], H, W, kh, kw, ph, pw, sh, sw,
          dh, dw, b.OH, b.OW, nb * Pb, Pb, oh0, oh1)
    return col


def _gemm_out(layer, b: Blocks, w3, col, out, bias, n0, n1, oh0, oh1, act=None):
    """out's block (images n0..n1-1, positions of rows oh0..oh1-1) = act(W_g @ col_g per group (+ bias)).
    The bias and the activation go in the pass that stores the block, while it is in cache."""
    g, kd = layer.group, layer.kernel_dim
    Co = out.shape[1]
    og = Co // g
    nb, p0, Pb = n1 - n0, oh0 * b.OW, (oh1 - oh0) * b.OW
    code, lo, hi = act if act is not None else _NO_ACT
    if b.gemm512 and nb == 1:  # kernels.gemm writes the blob, the bias and activation in its store
        dst = out[n0][:, p0:p0 + Pb]
        for gi in range(g):
            _gm.gemm(w3[gi], col[gi * kd:(gi + 1) * kd], dst[gi * og:(gi + 1) * og],
                     None if bias is None else bias[gi * og:(gi + 1) * og], 0, code, lo, hi)
        return
    if nb == 1 and col.dtype == out.dtype:  # straight into the blob (NumPy's matmul takes its row stride)
        dst = out[n0][:, p0:p0 + Pb]
        for gi in range(g):
            np.matmul(w3[gi], col[gi * kd:(gi + 1) * kd], out=dst[gi * og:(gi + 1) * og])
        if bias is not None or act is not None:
            _k.bias_act(out[n0].reshape(-1), bias, 1, Co, b.P, p0, Pb, code, lo, hi)
        return
    res = layer.buffer(np, "gemm", (Co, nb * Pb), col.dtype)
    mm = _gemm512_mm if b.gemm512 else np.matmul  # small images side by side: one wider GEMM
    for gi in range(g):
        mm(w3[gi], col[gi * kd:(gi + 1) * kd], out=res[gi * og:(gi + 1) * og])
    store = _k.rows_to_batch if res.dtype == out.dtype else _k.rows_to_batch_f32  # one rounding
    store(res.reshape(-1), out[n0:n1].reshape(-1), bias, nb, Co, b.P, p0, Pb, code, lo, hi)


def _epilogue(out, act) -> None:
    """out (N, C, P) = act(out) in one pass (the plans whose kernels add the bias themselves)."""
    if act is not None:
        N, C, P = out.shape
        _k.bias_act(out.reshape(-1), None, N, C, P, 0, P, *act)


def _exact_out(layer, b: Blocks, weight, col, out, bias, n0, n1, oh0, oh1, act=None):
    """_gemm_out's block by kernels.exact_gemm: col is the float32 block (rows, nb * Pb); the float64
    sums, the bias, the rounding and the activation in one pass."""
    nb, p0, Pb = n1 - n0, oh0 * b.OW, (oh1 - oh0) * b.OW
    Co = out.shape[1]
    code, lo, hi = act if act is not None else _NO_ACT
    _eg.gemm(weight.reshape(-1), col.reshape(-1), out[n0:n1].reshape(-1), bias, layer.group, Co // layer.group,
             layer.kernel_dim, nb, Pb, nb * Pb, Pb, b.P, Co * b.P, p0, code, lo, hi)


def _exact_forward(layer, b: Blocks, im, out, weight, bias, act=None, keep=None):
    """blocked_forward's exact forward by kernels.exact_gemm: a 1x1 layer's blob in place, every image in
    one call; the others block by block from float32 column blocks (with `keep`, the one block is lowered
    into that buffer and returned: blocked_forward's keep)."""
    if b.one_by_one:
        N, Co = out.shape[0], out.shape[1]
        code, lo, hi = act if act is not None else _NO_ACT
        _eg.gemm(weight.reshape(-1), im.reshape(-1), out.reshape(-1), bias, layer.group, Co // layer.group,
                 layer.kernel_dim, N, b.P, b.P, b.rows * b.P, b.P, Co * b.P, 0, code, lo, hi)
        return None
    col = None
    for n0, n1, oh0, oh1 in b.blocks:
        col = _lowered(layer, b, im, n0, n1, oh0, oh1, np.float32, keep or "col")
        _exact_out(layer, b, weight, col, out, bias, n0, n1, oh0, oh1, act)
    return col if keep is not None else None


def blocked_forward(layer, im, out, weight, bias, keep=None, act=None):
    """out (N, C_col, P) = act(conv(im) + bias), block by block (im: (N, C_im, *S_im), both contiguous).
    With `keep` (a buffer name) and the batch in one lowered block, the block stays in the layer's
    buffer of that name and is returned, for the backward's weight gradient (the batched path's rule)."""
    b = layer.cpu_blocks(im.shape[0], out.dtype, exact=_exact(layer, out.dtype))
    if b.kernel:  # its float32 block can be kept as any float32 one
        keep = keep if len(b.blocks) == 1 and not b.one_by_one else None
        return _exact_forward(layer, b, im, out, weight, bias, act, keep)
    g, kd = layer.group, layer.kernel_dim
    w3 = weight.reshape(g, -1, kd).astype(b.cdtype, copy=False)
    bias = None if bias is None else bias.astype(b.cdtype, copy=False)
    keep = keep if len(b.blocks) == 1 and not b.exact and not b.one_by_one else None
    col = None
    for n0, n1, oh0, oh1 in b.blocks:
        col = _lowered(layer, b, im, n0, n1, oh0, oh1, b.cdtype, keep or "col")
        _gemm_out(layer, b, w3, col, out, bias, n0, n1, oh0, oh1, act)
    return col if keep is not None else None


def blocked_backward(layer, dout, weight, im=None, weight_diff=None, im_diff=None, bias_diff=None,
                     fwd_out=None, kept=None):
    """The backward products (module doc), block by block; dout is (N, C_col, P). `kept`: the forward's
    column block of im (blocked_forward's keep), used instead of lowering im again."""
    N, Co, P = dout.shape
    g, kd = layer.group, layer.kernel_dim
    og = Co // g
    b = layer.cpu_blocks(N, dout.dtype, exact=False)
    exact_fwd = fwd_out is not None and _exact(layer, fwd_out.dtype)
    bf = layer.cpu_blocks(N, dout.dtype, exact=True) if exact_fwd else b
    w3 = weight.reshape(g, og, kd)
    w3f = w3.astype(bf.cdtype, copy=False)
    wd3 = weight_diff.reshape(g, og, kd) if weight_diff is not None else None
    bsum = np.zeros(Co, np.float64) if bias_diff is not None else None
    want_rows = weight_diff is not None or im_diff is not None or bias_diff is not None
    exact_wgrad = weight_diff is not None and EXACT_WGRAD and _exact(layer, dout.dtype)  # (float32 only)
    for n0, n1, oh0, oh1 in b.blocks:
        nb, p0, Pb = n1 - n0, oh0 * b.OW, (oh1 - oh0) * b.OW
        rows = None
        if want_rows:
            if nb == 1:
                rows = dout[n0][:, p0:p0 + Pb]
            else:
                rows = layer.buffer(np, "rows", (Co, nb * Pb), dout.dtype)
                _k.batch_to_rows(dout[n0:n1].reshape(-1), rows.reshape(-1), nb, Co, P, p0, Pb)
        if bsum is not None:
            bsum += np.matmul(rows, layer.ones(np, nb * Pb, rows.dtype),
                              out=layer.buffer(np, "bgrad", (Co,), rows.dtype))
        col = None
        if weight_diff is not None or (fwd_out is not None and (not exact_fwd or bf.kernel)):
            one = len(b.blocks) == 1 and kept is not None and kept.dtype == dout.dtype
            col = kept if one else _lowered(layer, b, im, n0, n1, oh0, oh1, dout.dtype)
        if weight_diff is not None and exact_wgrad:
            if nb == 1:  # rows is dout[n0]'s band of positions p0 .. p0 + Pb - 1, read in place
                _exact_wgrad(layer, dout.reshape(-1), n0 * Co * P + p0, P, col, Pb, weight_diff)
            else:
                _exact_wgrad(layer, rows.reshape(-1), 0, nb * Pb, col, nb * Pb, weight_diff)
        elif weight_diff is not None and b.gemm512_backward and weight_diff.dtype == np.float32:
            for gi in range(g):  # accumulated in place (beta 1): dout's rows times the transposed column block
                _wgrad512(layer, rows[gi * og:(gi + 1) * og], col[gi * kd:(gi + 1) * kd], wd3[gi])
        elif weight_diff is not None:
            tmp = layer.buffer(np, "wgrad", (og, kd), weight_diff.dtype)
            for gi in range(g):
                np.matmul(rows[gi * og:(gi + 1) * og], col[gi * kd:(gi + 1) * kd].T, out=tmp)
                wd3[gi] += tmp
        if fwd_out is not None and bf.kernel:  # the exact forward from the float32 block lowered above
            _exact_out(layer, b, weight, col, fwd_out, None, n0, n1, oh0, oh1)
        elif fwd_out is not None:
            colf = _lowered(layer, bf, im, n0, n1, oh0, oh1, bf.cdtype, "col64") if exact_fwd else col
            _gemm_out(layer, bf, w3f, colf, fwd_out, None, n0, n1, oh0, oh1)
        if im_diff is not None:
            _data_block(layer, b, w3, rows, im_diff, n0, n1, oh0, oh1)
    if bsum is not None:
        bias_diff += bsum.astype(bias_diff.dtype, copy=False)


# A weight diff with few output channels a group (og <= WGRAD512_SWAP_MAX_OG: two of kernels.gemm's column
# panels) over many positions (K >= WGRAD512_SWAP_MIN_K) is computed transposed, col @ rows^T: kernels.gemm then
# reads the column block in place (its A, row-major) against two packed panels of dout's rows, instead of packing
# the whole transposed column block as its B for a few row panels. Each sum is the same chain of FMAs either way
# (k in order per K block, the block's sum added to the old diff), so the bits are the same (a test checks).
# Measured (two threads, medians of 40; packages/layers/bench/README.md, "Session 19"; transposed / plain): LeNet conv2 b64 (og 50, K 4096) 0.76x,
# b16 0.78x, CaffeNet conv1 b8 (96, 3025) 0.82x, 32 x 288 x 12544 0.70x; og 128 (CaffeNet conv2) 1.31x and
# K = 64 (og 64) 3.9x slower (the two transposes of the diff then cost more than the GEMM).
WGRAD512_SWAP_MAX_OG = 96
WGRAD512_SWAP_MIN_K = 512


def _wgrad512(layer, rows, col, wd):
    """wd (og, kd) += rows (og, K) @ col (kd, K)^T by kernels.gemm, transposed where that reads less."""
    og, K = rows.shape
    if og > WGRAD512_SWAP_MAX_OG or K < WGRAD512_SWAP_MIN_K:
        _gm.gemm(rows, col.T, wd, None, 1)
        return
    tmp = layer.buffer(np, "wgradT", (wd.shape[1], og), np.float32)
    tmp[...] = wd.T
    _gm.gemm(col, rows.T, tmp, None, 1)
    wd[...] = tmp.T


def _exact_wgrad(layer, a, a_off, lda, col, K, weight_diff):
    """weight_diff (G og, kd) += dout's rows (og x K per group: flat a from a_off, lda apart) @ col_g^T, each
    sum of K products in float64, rounded once (kernels.exact_gemm.dots_nt; without AVX2 and FMA a float64
    GEMM, the same up to its summation order)."""
    g, kd = layer.group, layer.kernel_dim
    og = weight_diff.shape[0] // g
    wd = weight_diff.reshape(-1)
    for gi in range(g):
        off = a_off + gi * og * lda
        if EXACT_GEMM:
            _eg.dots_nt(a, off, lda, col.reshape(-1), gi * kd * K, K, wd, gi * og * kd, kd, og, kd, K)
        else:
            rows = np.lib.stride_tricks.as_strided(a[off:], (og, K), (lda * a.itemsize, a.itemsize))
            acc = rows.astype(np.float64) @ col[gi * kd:(gi + 1) * kd].astype(np.float64).T
            wd[gi * og * kd:(gi + 1) * og * kd] += acc.astype(np.float32).reshape(-1)


def _data_block(layer, b: Blocks, w3, rows, im_diff, n0, n1, oh0, oh1):
    """im_diff's images n0..n1-1: W_g^T @ rows_g per group, col2im'ed (overwritten, or added to for a
    band after an image's first)."""
    g, kd = layer.group, layer.kernel_dim
    og = w3.shape[1]
    nb, Pb = n1 - n0, (oh1 - oh0) * b.OW
    mm = _gemm512_mm if b.gemm512_backward and rows.dtype == np.float32 else np.matmul
    if b.one_by_one and nb == 1:  # straight into the blob
        dst = im_diff[n0].reshape(b.rows, b.P)
        for gi in range(g):
            mm(w3[gi].T, rows[gi * og:(gi + 1) * og], out=dst[gi * kd:(gi + 1) * kd])
        return
    dcol = layer.buffer(np, "dcol", (b.rows, nb * Pb), rows.dtype)
    for gi in range(g):
        mm(w3[gi].T, rows[gi * og:(gi + 1) * og], out=dcol[gi * kd:(gi + 1) * kd])
    if b.one_by_one:
        _k.rows_to_batch(dcol.reshape(-1), im_diff[n0:n1].reshape(-1), None, nb, b.rows, b.P, 0, Pb)
        return
    geo = layer.geom
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = geo.kernel, geo.stride, geo.pad, geo.dilation
    H, W = geo.im_shape
    _k.col2im_2d(dcol.reshape(-1), im_diff[n0:n1].reshape(-1), nb, im_diff.shape[1], H, W, kh, kw, ph, pw,
                 sh, sw, dh, dw, b.OH, b.OW, nb * Pb, Pb, oh0, oh1, oh0 > 0)


def _gemm512_mm(a, b, out):
    """np.matmul(a, b, out=out) by kernels.gemm (float32, out's rows contiguous)."""
    _gm.gemm(a, b, out)


def _exact(layer, dtype) -> bool:
    return layer.exact_forward(dtype)


def _add_bias_diff(layer, dout, bias_diff) -> None:
    """bias_diff += the sum of dout (N, C_col, P) over images and positions (the direct and dense plans,
    which have no row blocks to sum block by block as blocked_backward does)."""
    if bias_diff is not None:
        bias_diff += np.matmul(dout, layer.ones(np, dout.shape[2], dout.dtype)).sum(axis=0)


# -- the direct plan -------------------------------------------------------------------------------

def _direct_args(layer, N):
    g = layer.geom
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = g.kernel, g.stride, g.pad, g.dilation
    (H, W), (OH, OW) = g.im_shape, g.col_shape
    return (N, layer.conv_in_channels, H, W, layer.conv_out_channels, layer.group, kh, kw, sh, sw, ph, pw,
            dh, dw, OH, OW)


def direct_forward(layer, im, out, weight, bias, act=None):
    _dw.forward(im.reshape(-1), weight.reshape(-1), bias, out.reshape(-1), *_direct_args(layer, im.shape[0]))
    _epilogue(out, act)


def direct_backward(layer, dout, weight, im=None, weight_diff=None, im_diff=None, bias_diff=None,
                    fwd_out=None):
    N = dout.shape[0]
    args = _direct_args(layer, N)
    _add_bias_diff(layer, dout, bias_diff)
    if weight_diff is not None:
        _dw.backward_weight(im.reshape(-1), dout.reshape(-1), weight_diff.reshape(-1), *args)
    if im_diff is not None:
        _direct_data(layer, dout, weight, im_diff, args)
    if fwd_out is not None:
        _dw.forward(im.reshape(-1), weight.reshape(-1), None, fwd_out.reshape(-1), *args)


def _direct_data(layer, dout, weight, im_diff, args):
    """im_diff = W^T * dout. At stride 1 that is a convolution of dout with the flipped filters (pad
    dilation * (kernel - 1) - pad): the forward kernel's gather, faster than backward_data's scatter."""
    N, C, H, W, Co, g, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW = args
    qh, qw = dh * (kh - 1) - ph, dw * (kw - 1) - pw
    if (sh, sw) != (1, 1) or qh < 0 or qw < 0:
        _dw.backward_data(dout.reshape(-1), weight.reshape(-1), im_diff.reshape(-1), *args)
        return
    cg, og = C // g, Co // g
    flipped = np.ascontiguousarray(
        weight.reshape(g, og, cg, kh, kw)[:, :, :, ::-1, ::-1].transpose(0, 2, 1, 3, 4)).reshape(-1)
    _dw.forward(dout.reshape(-1), flipped, None, im_diff.reshape(-1), N, Co, OH, OW, C, g, kh, kw, 1, 1, qh, qw,
                dh, dw, H, W)


def direct_fits(layer) -> bool:
    """Depthwise and small-group layers (see DIRECT_MAX_PAIRS), 2-D, kernel at most 64 wide."""
    cg = layer.conv_in_channels // layer.group
    og = layer.conv_out_channels // layer.group
    return (layer.group > 1 and cg * og <= DIRECT_MAX_PAIRS and layer.num_spatial_axes == 2
            and layer.kernel_shape[1] <= 64)


def fits(dtype) -> bool:
    return available() and np.dtype(dtype) in _FLOATS



# -- the dense plan ----------------------------------------------------------------------------------

# "auto": dense_fits' measured rule; "on": every layer the kernels can take; "off": never (benchmarks A/B
# with it; CAFFE_CONV_DENSE=0 in the environment turns the plan off too).
DENSE = "off" if os.environ.get("CAFFE_CONV_DENSE", "1") == "0" else "auto"
_DENSE_SUPPORTED = _cd is not None and _cd.supported()


def dense_fits(layer, dtype) -> bool:
    """Whether the layer takes the dense plan: some product is dense (dense_products)."""
    return bool(dense_products(layer, dtype))


def _dense_possible(layer, dtype) -> bool:
    """float32, 2-D, stride 1, dilation 1, not 1x1, kernel_dim above the exact path's, pad < kernel, on a
    CPU with AVX2 and FMA."""
    if not _DENSE_SUPPORTED or np.dtype(dtype) != np.float32:
        return False
    if layer.num_spatial_axes != 2 or layer.is_1x1 or layer.exact_forward(dtype):
        return False
    g = layer.geom
    if tuple(g.stride) != (1, 1) or tuple(g.dilation) != (1, 1):
        return False
    return all(p <= k - 1 for p, k in zip(g.pad, g.kernel))


def dense_products(layer, dtype=np.float32):
    """Which of "fwd", "wgt", "data" the dense kernels compute for this layer (the rest go blocked)."""
    if DENSE == "off" or not _dense_possible(layer, dtype):
        return ()
    if DENSE == "on":
        return ("fwd", "wgt", "data")
    return dense_rule(layer)


# The measured rule (bench: packages/layers/bench/ab_conv_dense.py, one thread's CPU time, table in
# bench/README.md). The dense forward runs at 60-90 GFLOP/s a thread where rows fill the 8 lanes, less where
# they do not (13, 14 or 7 wide); OpenBLAS's GEMM on the lowered buffer beats it once the GEMM's M side (the
# output channels per group) is wide: 70-84 GFLOP/s past 64 channels (CaffeNet, ResNet-50 past res2,
# GoogLeNet's 3x3s), 30-60 below, where the lowering costs as much as the GEMM. So: forward when
# og <= DENSE_MAX_OG and kernel_dim <= DENSE_MAX_KD; bottom diff (a forward with og and cg swapped) on the
# mirrored condition with "same" padding (else the flipped kernel's padding is mostly zeros: LeNet conv2's
# pad 0 is 1.45x slower); weight diff where the forward is dense with "same" padding (backward_weight_oc,
# vectorized over output channels, fills its lanes on rows of any width: 0.6-0.8x the blocked plan's time
# on CIFAR10-quick conv3 and GoogLeNet 4a 5x5, whose 8-14 wide rows the older x-vectorized kernel lost on).
# Not on unpadded ("valid") layers, forward included: LeNet conv2 (pad 0) would gain (0.67x), but its
# sums, rounded differently from Caffe's sgemm, move the LeNet 100-iteration trace to the edge of its
# fidelity bounds (test_solver_lenet: ip1's bias 4.9% from Caffe's at iteration 100 with the dense forward,
# 2.1% blocked, the bound 5%; with the dense weight diff too, ip1's weights 7.5%), and the issue keeps
# Caffe's numerics there.
DENSE_MAX_OG = 64
DENSE_MAX_KD = 1024
# With the kernels' AVX-512 variant (kernels.conv_direct_avx2.AVX512: 16 lanes, rows of any width fill them)
# the dense products beat OpenBLAS's GEMM (its Haswell AVX2 kernels, which the development VM's environment
# selects with OPENBLAS_CORETYPE=Haswell; not re-measured against its SkylakeX ones) on wider layers too, where the
# output plane has DENSE512_MIN_PLANE positions or more (CPU time, ab_conv_dense.py --modes off,avx512):
# CaffeNet conv2-5 0.35-0.60x, ResNet-50's 3x3 128x28x28 0.46-0.65x and 256x14x14 0.64x (b8; 0.94x at b1),
# GoogLeNet 3a / 4a 3x3 0.49 / 0.64x. Not on 7x7 planes (49 positions in 4 vectors of 16): ResNet-50 512x7x7
# 0.99x (b8) to 1.59x (b1), GoogLeNet 5b 3x3 0.93x; those keep the AVX2 rule above.
DENSE512_MAX_OG = 384
DENSE512_MAX_KD = 2304
DENSE512_MIN_PLANE = 100
# Where NumPy's OpenBLAS runs its own AVX-512 kernels (BLAS512: SkylakeX, on an Intel Xeon VM with AMX and 2 MB
# of L2 a core, where the blocked plan's large GEMMs run kernels.gemm, GEMM512), measured the same way
# (ab_conv_dense.py --modes off,avx512, wall clock, medians of 11): the dense forward still wins or ties on the
# layers the rules above name (CaffeNet conv2-5 0.71-1.03x, ResNet-50's 3x3s 0.80-0.92x at b8, GoogLeNet 3a / 4a
# 0.75 / 0.81x), but the weight diff loses past 64 output channels a group (at 128: CaffeNet conv2 / conv5 0.98 /
# 1.14x, ResNet-50 128x28x28 1.01x (b8) and 1.22x (b1); past it CaffeNet conv3 / conv4 1.41 / 1.31x, ResNet-50
# 256x14x14 1.16x; 0.47-0.90x at 64 and below) and the bottom diff past 192 input channels (CaffeNet conv3 1.13x,
# ResNet-50 256x14x14 1.17x at b1); those go blocked there. (An unpadded layer's weight diff, dense there, gained
# 1-2% of LeNet's b64 step, LeNet conv2 alone 2.34 -> 1.46 ms, but lost 10% of its b1 step: not kept.)
DENSE512_BLAS512_WGT_MAX_OG = 64
DENSE512_BLAS512_DATA_MAX_CG = 192
# There too, at batch 1 a layer with DENSE512_BLAS512_B1_MIN_OG output channels a group or more over a plane of
# DENSE512_BLAS512_B1_MIN_PLANE positions or more goes blocked (kernels.gemm's M x K x P GEMM; ab_conv_dense.py,
# medians of 11, session 19, dense / blocked): forward ResNet-50 3x3 64x56x56 1.42x, 128x28x28 1.07x, GoogLeNet 3a
# 3x3 1.05x; weight diff 1.26 / 1.17 / 1.20x; bottom diff 64x56x56 1.41x. At batch 2 the forward ties or wins
# (1.13, 0.91, 0.93x), from 4 it wins; below 64 channels (GoogLeNet 3a 5x5, 32: 0.64x) or on 14 x 14 planes
# (ResNet-50 256x14x14 1.05x, GoogLeNet 4a 3x3 0.91x) dense stays.
DENSE512_BLAS512_B1_MIN_OG = 64
DENSE512_BLAS512_B1_MIN_PLANE = 784


def dense_rule(layer):
    g = layer.geom
    G = layer.group
    og, cg = layer.conv_out_channels // G, layer.conv_in_channels // G
    (kh, kw), (ph, pw) = g.kernel, g.pad
    same = 2 * ph == kh - 1 and 2 * pw == kw - 1
    out = []
    if ph == 0 and pw == 0:
        return ()
    max_og, max_kd = DENSE_MAX_OG, DENSE_MAX_KD
    wide = _cd.AVX512 and g.col_count >= DENSE512_MIN_PLANE
    if wide:
        max_og, max_kd = DENSE512_MAX_OG, DENSE512_MAX_KD
    blas512 = wide and BLAS512  # (the BLAS512 rules: measured on the AVX-512 kernels' wide planes)
    if (blas512 and getattr(layer, "num", 0) == 1 and og >= DENSE512_BLAS512_B1_MIN_OG
            and g.col_count >= DENSE512_BLAS512_B1_MIN_PLANE):
        return ()
    blocked_wgt = blas512 and og > DENSE512_BLAS512_WGT_MAX_OG
    blocked_data = blas512 and cg > DENSE512_BLAS512_DATA_MAX_CG
    if og <= max_og and cg * kh * kw <= max_kd:
        out += ["fwd", "wgt"] if same and not blocked_wgt else ["fwd"]
    if cg <= max_og and og * kh * kw <= 2 * max_kd and same and not blocked_data:
        out.append("data")
    return tuple(out)


def _dense_args(layer, N):
    g = layer.geom
    (kh, kw), (ph, pw) = g.kernel, g.pad
    (H, W), (OH, OW) = g.im_shape, g.col_shape
    return N, layer.conv_in_channels, H, W, layer.conv_out_channels, layer.group, kh, kw, ph, pw, OH, OW


def _packed(layer, weight, flip):
    """The filters in the kernel's layout (repacked on every call: a few microseconds to a millisecond,
    and never stale when the weights change)."""
    g = layer.geom
    G = layer.group
    og, cg = layer.conv_out_channels // G, layer.conv_in_channels // G
    (kh, kw) = g.kernel
    n = _cd.packed_size(G, og, cg, kh, kw, flip)
    # 64-byte aligned: the AVX-512 tiles load whole filter vectors (NumPy's large arrays start 16 bytes into
    # a line, and split loads cost ~5% of the forward)
    raw = layer.buffer(np, "dense_flip" if flip else "dense_w", (n + 16,), np.float32)
    start = (-(raw.ctypes.data // 4)) % 16
    packed = raw[start:start + n]
    _cd.pack_weights(weight.reshape(-1), packed, G, og, cg, kh, kw, flip)
    return packed


def dense_forward(layer, im, out, weight, bias, act=None):
    if "fwd" not in dense_products(layer, out.dtype):
        blocked_forward(layer, im, out, weight, bias, act=act)
        return
    _cd.forward(im.reshape(-1), _packed(layer, weight, False), bias, out.reshape(-1),
                *_dense_args(layer, im.shape[0]))
    _epilogue(out, act)


def dense_backward(layer, dout, weight, im=None, weight_diff=None, im_diff=None, bias_diff=None,
                   fwd_out=None):
    """The backward products (module doc): the dense kernels for those dense_products names, the blocked
    plan for the others."""
    products = dense_products(layer, dout.dtype)
    args = _dense_args(layer, dout.shape[0])
    rest = {}
    if weight_diff is not None and "wgt" in products:
        # the bias diff's sums in the same pass over dout
        _cd.backward_weight_oc(im.reshape(-1), dout.reshape(-1), weight_diff.reshape(-1), *args,
                               bias_diff=bias_diff)
    else:
        _add_bias_diff(layer, dout, bias_diff)
        if weight_diff is not None:
            rest["weight_diff"] = weight_diff
    if im_diff is not None:
        if "data" in products:  # stride 1: dout convolved with the flipped, transposed filters
            N, C, H, W, Co, G, kh, kw, ph, pw, OH, OW = args
            _cd.forward(dout.reshape(-1), _packed(layer, weight, True), None, im_diff.reshape(-1),
                        N, Co, OH, OW, C, G, kh, kw, kh - 1 - ph, kw - 1 - pw, H, W)
        else:
            rest["im_diff"] = im_diff
    if fwd_out is not None:
        if "fwd" in products:
            _cd.forward(im.reshape(-1), _packed(layer, weight, False), None, fwd_out.reshape(-1), *args)
        else:
            rest["fwd_out"] = fwd_out
    if rest:
        blocked_backward(layer, dout, weight, im, **rest)

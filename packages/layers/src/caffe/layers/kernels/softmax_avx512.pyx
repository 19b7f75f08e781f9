# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math -funroll-loops
# distutils: libraries = m
"""kernels.softmax compiled for AVX-512 and FMA (16 floats per instruction).

The same source (included below); caffe.layers._cpu imports this module instead of softmax_avx2 when the
CPU has AVX-512 (F, DQ, VL, BW). 512-bit vectors are asked for explicitly (prefer-vector-width=512). FMA only
where the source asks for it, no contraction elsewhere. The float32 exp applies 2^n by VSCALEFPS where softmax_avx2
builds its bits (the same rounding: the float32 results are softmax_avx2's bit for bit); the float64 exp is
libmvec's AVX-512 one (within its ulps). Elsewhere than x86-64 GCC it is the baseline
module again. Its pieces are half as large (CAFFE_SOFTMAX_PIECE below): the per-piece sums of SoftmaxWithLoss's
loss then add up in another grouping (the same to ~1e-16 relative).
"""
cdef extern from *:
    """
    #if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    #pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,fma,prefer-vector-width=512")
    #pragma GCC optimize("fp-contract=off")
    #endif
    /* Pieces of 65536 elements (256 KB of float32), not 131072: the CPUs with AVX-512 (Intel since Skylake-SP,
       AMD Zen 4 / 5) have 1-2 MB of L2 a core, where a piece's x, its exp block and the next piece's x being
       prefetched (forward), or its y and dy (backward), then fit together. On Zen 5 (8x256x56x56 and
       8x64x112x112 float32, A/B interleaved): forward 0.90-1.0x the time, backward 0.76-0.89x. */
    #define CAFFE_SOFTMAX_PIECE 65536
    """

include "softmax.pyx"

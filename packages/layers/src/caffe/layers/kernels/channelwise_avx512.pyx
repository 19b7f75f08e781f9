# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math
"""kernels.channelwise compiled for AVX-512 (16 floats, 8 doubles per instruction).

The same source (included below); caffe.layers._cpu imports this module instead of channelwise when the CPU
has AVX-512 (F, DQ, VL, BW). The baseline (SSE2) build widens float to double two at a time for the
backward's per-channel sums and splits each loop into 128-bit halves; here the 8 running double sums of a
quantity are one zmm register. 512-bit vectors are asked for explicitly (prefer-vector-width=512, as in
elementwise_avx512.pyx). No FMA contraction: every product and sum rounds as in the baseline build, and the
sums keep their fixed order, so the results are the same bits. Elsewhere than x86-64 GCC it is the
baseline module again.
"""
cdef extern from *:
    """
    #if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    #pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,prefer-vector-width=512")
    #pragma GCC optimize("fp-contract=off")
    #endif
    """

include "channelwise.pyx"

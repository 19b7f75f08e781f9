# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math -ffp-contract=off
"""kernels.rng compiled for AVX-512 (8 doubles and 8 64-bit products per instruction).

The same source (included below); caffe.layers._cpu imports this module instead of rng when the CPU has
AVX-512 (F, DQ, VL, BW). No FMA contraction and no libm: every step is the same IEEE operation as in the
baseline build, so the values are the same bits (a test checks it). Elsewhere than x86-64 GCC it is the
baseline module again.
"""
cdef extern from *:
    """
    #if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    #pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,prefer-vector-width=512")
    #pragma GCC optimize("fp-contract=off")
    #endif
    """

include "rng.pyx"

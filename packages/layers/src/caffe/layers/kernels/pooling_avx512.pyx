# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math
"""kernels.pooling compiled for AVX-512 (16 floats per instruction).

The same source (included below); caffe.layers._cpu imports this module instead of pooling_avx2 when the
CPU has AVX-512 (F, DQ, VL, BW). 512-bit vectors are asked for explicitly (prefer-vector-width=512). No FMA:
the results are the baseline module's, bit for bit. Elsewhere than x86-64 GCC it is the baseline module
again.
"""
cdef extern from *:
    """
    #if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    #pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,prefer-vector-width=512")
    #pragma GCC optimize("fp-contract=off")
    #endif
    """

include "pooling.pyx"

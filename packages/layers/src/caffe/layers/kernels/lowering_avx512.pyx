# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""kernels.lowering compiled for AVX-512 (16 floats per instruction).

The same source (included below); conv_base and conv_cpu load this module instead of lowering when the CPU has
AVX-512 (F, DQ, VL, BW): its float32 col2im row adds go by 512-, 256- and 128-bit vectors, im2col's stride-2 rows by
permutes and its other strided rows by scalar C loops (the row copies are the baseline's). Copies and single adds
only, so the baseline module's results, bit for bit. Elsewhere than x86-64 GCC it is the baseline
module again.
"""
cdef extern from *:
    """
    #if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    #pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,prefer-vector-width=512")
    #pragma GCC optimize("fp-contract=off")
    #endif
    """

include "lowering.pyx"

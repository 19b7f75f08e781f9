# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math
# distutils: libraries = m
"""kernels.normalization compiled for AVX-512 (16 floats per instruction, libmvec's AVX-512 pow).

The same source (included below); caffe.layers._cpu imports this module instead of normalization_avx2 when
the CPU has AVX-512 (F, DQ, VL, BW). 512-bit vectors are asked for explicitly (prefer-vector-width=512), no
FMA contraction: the arithmetic rounds as in the AVX2 and baseline modules (BatchNorm's block sums are GCC
vector-extension code, the same lanes in the same order under every build; LRN's sqrt and division are IEEE),
so the results are normalization_avx2's bit for bit, except LRN with beta other than 0.75, whose pow is
libmvec's AVX-512 one (within its ulps). Elsewhere than x86-64 GCC it is the baseline module again.
"""
cdef extern from *:
    """
    #if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    #pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,prefer-vector-width=512")
    #pragma GCC optimize("fp-contract=off")
    #endif
    """

include "normalization.pyx"

# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math
# distutils: libraries = m
"""kernels.elementwise compiled for AVX-512 (16 floats per instruction, libmvec's AVX-512 exp/tanh/log/pow; own exp/log for float32 Sigmoid, Swish, BNLL, Exp, ELU, Log, TanH).

The same source (included below); caffe.layers._cpu imports this module instead of elementwise_avx2 when the
CPU has AVX-512 (F, DQ, VL, BW). 512-bit vectors are asked for explicitly (prefer-vector-width=512): GCC's
tuning for some targets keeps 256-bit vectors under AVX-512, which would call libmvec's 8-wide AVX2
functions again. No FMA contraction: the arithmetic rounds as in the baseline module (only libm results
differ, within their ulps). Elsewhere than x86-64 GCC it is the baseline module again.
"""
cdef extern from *:
    """
    #if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    #pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,prefer-vector-width=512")
    #pragma GCC optimize("fp-contract=off")
    #endif
    """

include "elementwise.pyx"

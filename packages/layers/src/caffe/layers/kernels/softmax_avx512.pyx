# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math -funroll-loops
# distutils: libraries = m
"""kernels.softmax compiled for AVX-512 and FMA (16 floats per instruction).

The same source (included below); caffe.layers._cpu imports this module instead of softmax_avx2 when the
CPU has AVX-512 (F, DQ, VL, BW). 512-bit vectors are asked for explicitly (prefer-vector-width=512). FMA only
where the source asks for it (softmax's float32 exp, fmaf), no contraction elsewhere: the float32 results are
softmax_avx2's bit for bit, the float64 exp is libmvec's AVX-512 one (within its ulps). Elsewhere than x86-64
GCC it is the baseline module again.
"""
cdef extern from *:
    """
    #if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    #pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,fma,prefer-vector-width=512")
    #pragma GCC optimize("fp-contract=off")
    #endif
    """

include "softmax.pyx"

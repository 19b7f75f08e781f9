# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math -funroll-loops
# distutils: libraries = m
"""kernels.softmax compiled for AVX2 and FMA (8 floats per instruction).

The same source (included below); caffe.layers._cpu imports this module instead of softmax when the
CPU has AVX2 and FMA. FMA only where the source asks for it (softmax's float32 exp, fmaf), no
contraction elsewhere: the other arithmetic rounds as in the baseline module (the exp differs from
libm's within its ulps). Elsewhere than x86-64 GCC it is the baseline module again.
"""
cdef extern from *:
    """
    #if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    #pragma GCC target("avx2,fma")
    #pragma GCC optimize("fp-contract=off")
    #endif
    """

include "softmax.pyx"

# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math
# distutils: libraries = m
"""kernels.elementwise compiled for AVX2 (8 floats per instruction, libmvec's AVX2 exp/tanh/log/pow).

The same source (included below); caffe.layers._cpu imports this module instead of elementwise when the
CPU has AVX2. No FMA: the arithmetic rounds as in the baseline module (only libm results differ,
within their ulps). Elsewhere than x86-64 GCC it is the baseline module again.
"""
cdef extern from *:
    """
    #if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    #pragma GCC target("avx2")
    #endif
    """

include "elementwise.pyx"

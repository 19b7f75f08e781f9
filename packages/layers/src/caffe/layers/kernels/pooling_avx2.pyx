# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math
"""kernels.pooling compiled for AVX2 (8 floats per instruction).

The same source (included below); caffe.layers._cpu imports this module instead of pooling when the
CPU has AVX2. No FMA: the results are the baseline module's, bit for bit. Elsewhere than x86-64 GCC it is the baseline module again.
"""
cdef extern from *:
    """
    #if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    #pragma GCC target("avx2")
    #endif
    """

include "pooling.pyx"

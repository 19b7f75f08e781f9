# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math
"""kernels.skinny_gemm compiled for AVX2 and FMA (8 floats a vector, one FMA a multiply-add).

The same source (included below); caffe.layers._cpu imports this module instead of skinny_gemm when the
CPU has AVX2 and FMA. Elsewhere than x86-64 GCC it is the baseline module again.
"""
cdef extern from *:
    """
    #if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    #pragma GCC target("avx2,fma")
    #endif
    """

include "skinny_gemm.pyx"

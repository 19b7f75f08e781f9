# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math
"""kernels.skinny_gemm compiled for AVX-512 (16 floats a vector, FMA).

The same source (included below); caffe.layers._cpu imports this module instead of skinny_gemm_avx2 when
the CPU has AVX-512 (F, DQ, VL, BW). Elsewhere than x86-64 GCC it is the baseline module again.
"""
cdef extern from *:
    """
    #if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    #pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,fma,prefer-vector-width=512")
    #endif
    """

include "skinny_gemm.pyx"

# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math -ffp-contract=off
"""kernels.rng compiled for AVX2 (4 doubles per instruction; the 64-bit products from 32-bit ones).

The same source (included below); caffe.layers._cpu imports this module instead of rng when the CPU has
AVX2 but not AVX-512. No FMA (fp-contract off) and no libm: the same IEEE operations as the baseline build,
so the same bits (a test checks it). Elsewhere than x86-64 GCC it is the baseline module again.
"""
cdef extern from *:
    """
    #if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    #pragma GCC target("avx2")
    #pragma GCC optimize("fp-contract=off")
    #endif
    """

include "rng.pyx"

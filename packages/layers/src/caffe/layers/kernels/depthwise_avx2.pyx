# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""kernels.depthwise compiled for AVX2 (4 doubles per instruction instead of SSE2's 2).

The same source (included below); caffe.layers.conv_cpu imports this module instead of depthwise when the
CPU has AVX2. No FMA and no contraction: every product and sum rounds as in the baseline module, so the
results are the same bits. Elsewhere than x86-64 GCC it is the baseline module again.
"""
cdef extern from *:
    """
    #if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    #pragma GCC target("avx2")
    #pragma GCC optimize("fp-contract=off")
    #endif
    """

include "depthwise.pyx"

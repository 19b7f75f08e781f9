# Shared by the kernel modules (Cython `include`): SplitMix64 (Steele, Lea & Flood 2014), the counter-based
# generator of Dropout's mask (elementwise) and the gaussian fill (rng). caffe_splitmix64(seed + k *
# CAFFE_SPLITMIX_GAMMA) is output number k of the stream started at seed; caffe.layers.splitmix is the same in
# NumPy.
from libc.stdint cimport uint64_t

cdef extern from *:
    """
    #include <stdint.h>
    #define CAFFE_SPLITMIX_GAMMA 0x9e3779b97f4a7c15ULL
    static inline uint64_t caffe_splitmix64(uint64_t z) {
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
    """
    uint64_t caffe_splitmix64(uint64_t z) nogil
    uint64_t CAFFE_SPLITMIX_GAMMA

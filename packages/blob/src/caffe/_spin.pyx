# cython: language_level=3
"""How long the CPU's spin-wait hint takes (x86 PAUSE): caffe/__init__.py sizes libgomp's spin-wait by it.

GOMP_SPINCOUNT counts PAUSEs, whose length differs several-fold between CPUs (~26 ns on Zen 5, ~10 ns on the Xeon
VM of session 19), and what the kernels need is a time: a thread that finished its share should keep spinning
while the next parallel region is a few tens of microseconds away, then sleep. This module loads no OpenMP
runtime (it must run before libgomp reads its environment).
"""

cdef extern from *:
    """
    #include <time.h>
    #if defined(__x86_64__) || defined(__i386__)
    #include <immintrin.h>
    static double spin_pause_ns(int n) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int i = 0; i < n; i++) _mm_pause();
        clock_gettime(CLOCK_MONOTONIC, &b);
        return ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / (n > 0 ? n : 1);
    }
    #else
    static double spin_pause_ns(int n) { (void)n; return 0.0; }  /* libgomp's spin hint differs: not measured */
    #endif
    """
    double spin_pause_ns(int n) nogil


def pause_ns(int n=2000, int repeats=5) -> float:
    """One PAUSE's time in ns: the shortest of `repeats` timings of n in a row (a VM's pauses in between only
    lengthen a timing); 0.0 on CPUs other than x86."""
    cdef double best = -1.0, t
    cdef int r
    for r in range(max(1, repeats)):
        with nogil:
            t = spin_pause_ns(n)
        if best < 0 or t < best:
            best = t
    return best

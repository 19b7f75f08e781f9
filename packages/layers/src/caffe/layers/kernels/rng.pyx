# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math -ffp-contract=off
"""Random fills: gaussian values from a 64-bit seed (the gaussian and msra fillers, DummyData's refill).

Value number i depends only on (seed, i), so the fill runs on any number of threads with the same result,
and caffe.layers.filler.gaussian_reference computes the same bits in NumPy. Pair j (values 2j, 2j + 1):

  a, b    SplitMix64 outputs number 2j + 1 and 2j + 2 of the stream started at seed (Dropout's generator)
  u1, u2  1 - (a >> 12) / 2^52 in (0, 1], (b >> 12) / 2^52 in [0, 1)
  r       sqrt(-2 ln u1)
  k, t    u2 = k / 4 + t, k the nearest quarter (0..4), |t| <= 1/8 (exact)
  c, s    cos and sin of x = 2 pi t, |x| <= pi / 4, by their Taylor polynomials (past x^16 / x^15: < 5e-17)
  values  mean + std * r cos(2 pi u2), mean + std * r sin(2 pi u2): (c, s) turned by k quarters

(Box-Muller.) ln u1 = e ln 2 + ln m with u1 = m 2^e, m in [sqrt(1/2), sqrt(2)): ln m = 2 atanh(f / (2 + f)),
f = m - 1, by its series to s^17 (< 1e-14). Every step is one IEEE operation in a fixed order, without FMA
(fp-contract off) and without libm, so the values are the same bits in every build, on every machine, and
in the NumPy reference. The float64 values are rounded once for a float32 blob: the same values whatever
the blob's dtype. |value - mean| <= 8.49 std (u1 >= 2^-52).

NumPy's Generator.normal (its ziggurat) took 9-13 ns a value on the 2-core development machine (DummyData's
refill of LeNet's 64x1x28x28 batch: 0.5-0.7 ms of an 8-10 ms training step); this build takes 0.04 ms there
(bench/README.md, session 15; bench/ab_gaussian_fill.py).
"""
from cython.parallel cimport prange

include "_threads.pxi"
include "_splitmix.pxi"

ctypedef fused real:
    float
    double

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    static inline double caffe_rng_as_double(uint64_t b) {
        double d;
        memcpy(&d, &b, 8);
        return d;
    }
    /* Box-Muller on one pair of words (module doc): z0 = r cos(2 pi u2), z1 = r sin(2 pi u2). Written so that
       every step vectorizes with AVX2 too (no 64-bit integer <-> double conversion: the bits are put under the
       exponent of 1 or 2^52 instead; the quarter by compares, not by rounding) */
    static inline void caffe_rng_box_muller(uint64_t a, uint64_t b, double* z0, double* z1) {
        const double twopi = 6.283185307179586, ln2 = 0.6931471805599453, sqrt_half = 0.7071067811865476;
        double u1 = 2.0 - caffe_rng_as_double((a >> 12) | 0x3ff0000000000000ULL);
        double u2 = caffe_rng_as_double((b >> 12) | 0x3ff0000000000000ULL) - 1.0;
        /* u1 = m 2^e, m in [1/2, 1) (u1 >= 2^-52 is normal), then m in [sqrt(1/2), sqrt(2)) */
        uint64_t bits;
        memcpy(&bits, &u1, 8);
        double e = caffe_rng_as_double(((bits >> 52) & 0x7ff) | 0x4330000000000000ULL) - 4503599627371518.0;
        double m = caffe_rng_as_double((bits & 0x000fffffffffffffULL) | 0x3fe0000000000000ULL);
        if (m < sqrt_half) {
            m = m * 2.0;
            e = e - 1.0;
        }
        double f = m - 1.0, s = f / (2.0 + f), s2 = s * s;
        double p = 1.0 / 17.0;
        p = p * s2 + 1.0 / 15.0;
        p = p * s2 + 1.0 / 13.0;
        p = p * s2 + 1.0 / 11.0;
        p = p * s2 + 1.0 / 9.0;
        p = p * s2 + 1.0 / 7.0;
        p = p * s2 + 1.0 / 5.0;
        p = p * s2 + 1.0 / 3.0;
        double lnu = e * ln2 + (2.0 * s + 2.0 * s * (s2 * p));
        double r = __builtin_sqrt(-2.0 * lnu);
        /* the nearest quarter k (0..4; 4 is a whole turn) */
        double kq = (u2 >= 0.125 ? 1.0 : 0.0) + (u2 >= 0.375 ? 1.0 : 0.0) + (u2 >= 0.625 ? 1.0 : 0.0)
                    + (u2 >= 0.875 ? 1.0 : 0.0);
        double x = (u2 - kq * 0.25) * twopi, x2 = x * x;
        double sp = -1.0 / 1307674368000.0;      /* -1/15! */
        sp = sp * x2 + 1.0 / 6227020800.0;       /* 1/13! */
        sp = sp * x2 - 1.0 / 39916800.0;         /* 1/11! */
        sp = sp * x2 + 1.0 / 362880.0;           /* 1/9! */
        sp = sp * x2 - 1.0 / 5040.0;
        sp = sp * x2 + 1.0 / 120.0;
        sp = sp * x2 - 1.0 / 6.0;
        double sn = x + x * (x2 * sp);
        double cp = 1.0 / 20922789888000.0;      /* 1/16! */
        cp = cp * x2 - 1.0 / 87178291200.0;      /* 1/14! */
        cp = cp * x2 + 1.0 / 479001600.0;        /* 1/12! */
        cp = cp * x2 - 1.0 / 3628800.0;          /* 1/10! */
        cp = cp * x2 + 1.0 / 40320.0;
        cp = cp * x2 - 1.0 / 720.0;
        cp = cp * x2 + 1.0 / 24.0;
        cp = cp * x2 - 0.5;
        double cs = 1.0 + x2 * cp;
        double c = kq == 1.0 ? -sn : kq == 2.0 ? -cs : kq == 3.0 ? sn : cs;
        double sv = kq == 1.0 ? cs : kq == 2.0 ? -sn : kq == 3.0 ? -cs : sn;
        *z0 = r * c;
        *z1 = r * sv;
    }
    /* values lo .. hi - 1 of the fill (lo even): out[i - lo] = mean + std * z_i, pair j from SplitMix64 outputs
       2j + 1 and 2j + 2 (_splitmix.pxi). The words of up to
       CAFFE_RNG_BLOCK pairs first, then their transforms: two loops that each vectorize (the AVX2 build has no
       64-bit vector product, so its words come from scalar code while the transforms take 4 pairs at once). */
    #define CAFFE_RNG_BLOCK 256
    #define CAFFE_RNG_PIECE(NAME, T)                                                                    \\
    static inline void NAME(T* out, Py_ssize_t lo, Py_ssize_t hi, uint64_t seed, double mean, double std) { \\
        uint64_t wa[CAFFE_RNG_BLOCK], wb[CAFFE_RNG_BLOCK];                                              \\
        double z0[CAFFE_RNG_BLOCK], z1[CAFFE_RNG_BLOCK];                                                \\
        Py_ssize_t i0, j, pairs;                                                                        \\
        for (i0 = lo; i0 < hi; i0 += 2 * CAFFE_RNG_BLOCK) {                                             \\
            pairs = (hi - i0 + 1) / 2;                                                                  \\
            if (pairs > CAFFE_RNG_BLOCK)                                                                \\
                pairs = CAFFE_RNG_BLOCK;                                                                \\
            uint64_t w = seed + (uint64_t)(i0 + 1) * CAFFE_SPLITMIX_GAMMA;                                   \\
            for (j = 0; j < pairs; j++) {                                                               \\
                wa[j] = caffe_splitmix64(w + (uint64_t)(2 * j) * CAFFE_SPLITMIX_GAMMA);                         \\
                wb[j] = caffe_splitmix64(w + (uint64_t)(2 * j + 1) * CAFFE_SPLITMIX_GAMMA);                     \\
            }                                                                                           \\
            for (j = 0; j < pairs; j++)                                                                 \\
                caffe_rng_box_muller(wa[j], wb[j], z0 + j, z1 + j);                                     \\
            T* o = out + (i0 - lo);                                                                     \\
            Py_ssize_t whole = hi - i0 >= 2 * pairs ? pairs : pairs - 1;                                \\
            for (j = 0; j < whole; j++) {                                                               \\
                o[2 * j] = (T)(mean + std * z0[j]);                                                     \\
                o[2 * j + 1] = (T)(mean + std * z1[j]);                                                 \\
            }                                                                                           \\
            if (whole < pairs)  /* the fill's last value, alone */                                      \\
                o[2 * whole] = (T)(mean + std * z0[whole]);                                             \\
        }                                                                                               \\
    }
    CAFFE_RNG_PIECE(caffe_rng_gaussian_f, float)
    CAFFE_RNG_PIECE(caffe_rng_gaussian_d, double)
    """
    void caffe_rng_gaussian_f(float* out, Py_ssize_t lo, Py_ssize_t hi, uint64_t seed, double mean,
                              double std) nogil
    void caffe_rng_gaussian_d(double* out, Py_ssize_t lo, Py_ssize_t hi, uint64_t seed, double mean,
                              double std) nogil
    void caffe_rng_box_muller(uint64_t a, uint64_t b, double* z0, double* z1) nogil

cdef enum:
    PIECE = 8192  # values a thread takes at a time (even)


def gaussian_fill(real[::1] out, uint64_t seed, double mean, double std):
    """out[i] = mean + std * (gaussian value number i of `seed`), rounded once to out's dtype (module doc)."""
    cdef Py_ssize_t n = out.shape[0], pieces = (n + PIECE - 1) // PIECE, p, lo, hi
    if n == 0:
        return
    cdef real* o = &out[0]
    cdef int nt = _threads(n * 8)  # (a value costs about what eight elements of a copy do)
    with nogil:
        for p in prange(pieces, schedule="static", num_threads=nt):
            lo = p * PIECE
            hi = lo + PIECE if lo + PIECE < n else n
            if real is float:
                caffe_rng_gaussian_f(o + lo, lo, hi, seed, mean, std)
            else:
                caffe_rng_gaussian_d(o + lo, lo, hi, seed, mean, std)


def box_muller(const uint64_t[::1] a, const uint64_t[::1] b, double[::1] out):
    """out[2j], out[2j + 1] = the pair made from the words a[j], b[j] (the tests feed it chosen words)."""
    cdef Py_ssize_t j, n = a.shape[0]
    if b.shape[0] != n or out.shape[0] != 2 * n:
        raise ValueError(f"box_muller: {n} and {b.shape[0]} words for {out.shape[0]} values")
    for j in range(n):
        caffe_rng_box_muller(a[j], b[j], &out[2 * j], &out[2 * j + 1])

# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math
# distutils: libraries = m
"""Element-wise kernels: the neuron layers, Eltwise, Dropout, Split's sum, Concat/Slice copies.

Every kernel makes one pass over memory: the arrays are cut into CHUNK-element pieces, spread
over the OpenMP threads (one thread below PARALLEL_MIN_WORK elements); inside a piece each
output element is computed in the same order of operations as the layer's NumPy code (the
forward_xp / backward_xp reference), so results agree to the last bit except where a libm
function is involved (libmvec's SIMD exp/tanh/log/pow, within 4 ulp). The pieces do not
depend on the thread count, so neither do the results.

In place (top is the bottom, or a bottom diff is the top diff) is safe: an output element is
written only after every input element at that position has been read; where a piece reads
an input that an earlier output of the same piece may overwrite, it reads a local copy.
"""
from cython.parallel cimport prange
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

include "_threads.pxi"
include "_stream.pxi"

ctypedef fused real:
    float
    double

include "_vmath.pxi"

cdef enum:
    CHUNK = 4096  # elements per piece (16 KB of float32: a few inputs and outputs stay in L1)
    CHUNK_QUADS = 1024  # CHUNK / 4: Dropout's SplitMix64 outputs per piece
    # The two-bottom Eltwise passes (MAX forward and backward, SUM / stable PROD backward) write their outputs past
    # the caches from this many bytes an output, as kernels.normalization / softmax do: 25.7 MB ResNet / MobileNet
    # blobs do not fit beside their inputs in a 32 MB L3 (smaller outputs stay in cache for the next layer)
    STREAM_MIN_BYTES = 12 << 20

# Neuron operations (forward: x -> y; backward: dy -> dx), parameters a, b, c as noted.
cpdef enum Neuron:
    RELU = 0       # y = x > 0 ? x : a * x                                  (a: negative_slope)
    SIGMOID = 1    # y = 0.5 tanh(0.5 x) + 0.5
    TANH = 2       # y = tanh x
    ELU = 3        # y = max(x, 0) + a * expm1(min(x, 0))                     (a: alpha)
    POWER = 4      # y = (a x + b) ^ c                                         (a scale, b shift, c power)
    EXP = 5        # y = exp(a x) * b                                          (a inner, b outer scale)
    LOG = 6        # y = log(a x + b) * c; dx = dy * (d / (a x + b))  (a scale, b shift, c base scale, d)
    ABSVAL = 7     # y = |x|
    BNLL = 8       # y = max(x, 0) + log1p(exp(-|x|))
    THRESHOLD = 9  # y = x > a                                                 (a: threshold)
    CLIP = 10      # y = min(max(x, a), b)
    SWISH = 11     # s = sigmoid(a x) (aux), y = x s                           (a: beta)
    AFFINE = 12    # y = a x + b; dx = dy * a


cdef Py_ssize_t _stream_min_bytes = STREAM_MIN_BYTES


def _set_stream_min_bytes(Py_ssize_t nbytes):
    """For the tests and benchmarks: the size of an output from which the kernels that can stream do (0: always,
    the streaming paths on small shapes; a huge value: never); returns the previous size."""
    global _stream_min_bytes
    old = _stream_min_bytes
    _stream_min_bytes = nbytes
    return old


cdef enum Eltwise:
    PROD = 0
    SUM = 1
    MAX = 2


def _need(Py_ssize_t have, Py_ssize_t need, str what):
    if have < need:
        raise ValueError(f"elementwise kernel: {what} holds {have} elements, needs {need}")


cdef inline real* _ptr(real[::1] a, Py_ssize_t n) noexcept:
    """The data pointer of an optional buffer: NULL when it is empty (not wanted)."""
    return &a[0] if a.shape[0] >= n and n > 0 and a.shape[0] > 0 else NULL


# -- neurons -----------------------------------------------------------------------------------

cdef inline real _sigmoid(real v) noexcept nogil:
    return <real>0.5 * _tanh(<real>0.5 * v) + <real>0.5


# BNLL's log1p(u) for u = exp(-|x|) in [0, 1] (or NaN), float32. In the AVX-512 build: 2 atanh(s), s = u / (2 + u)
# in [0, 1/3], by its Taylor series 2s (1 + s^2/3 + ... + s^12/13) (the first term left out, s^14/15, is below
# 2^-26 of the sum): one division and a few multiply-adds where libmvec's 16-wide log1pf cost more than its expf
# and the rest of the loop together. With the rounding of s (~1 ulp, passed on at most once) the result is within
# 2 ulp of log1p, and BNLL within 3 ulp of softplus as with libm's log1pf (a test checks both against float64).
# Other builds: libm's log1pf (their bits stay as they were).
cdef extern from *:
    """
    #if defined(__AVX512F__)
    static inline float caffe_log1p_unit(float u) {
        float s = u / (2.0f + u);
        float z = s * s;
        float p = z * (1.0f / 13) + (1.0f / 11);
        p = p * z + (1.0f / 9);
        p = p * z + (1.0f / 7);
        p = p * z + (1.0f / 5);
        p = p * z + (1.0f / 3);
        s = s + s;
        return s + s * (z * p);
    }
    #else
    static inline float caffe_log1p_unit(float u) { return log1pf(u); }
    #endif
    """
    float caffe_log1p_unit(float) nogil


include "_vexp.pxi"


# The AVX-512 build's float32 Sigmoid, Swish and BNLL loops (libmvec's 16-wide expf / tanhf were most of their time;
# these take 1.25-1.6x less CPU time, in cache): exp(x) = 2^n exp(r), x = n ln2 + r (n by rounding with 1.5 * 2^23,
# ln2 in two parts, Cephes' expf polynomial in r), 2^n applied by VSCALEFPS, which overflows to inf and underflows
# through the denormals to 0 as expf does (arguments clamped to [-104, 89] first, past which expf is 0 / inf, so
# that the reduction stays exact; NaN kept). sigmoid(v) = 1 / (1 + exp(-v)) with IEEE division (a reciprocal
# estimate and a Newton step measured no faster): within 2.3 ulp of the float64 sigmoid over [-110, 110], where the
# 0.5 tanh(v / 2) + 0.5 form of the other builds rounds the tail below ~3e-8 to 0. BNLL forward: within 2.4 ulp
# of softplus (the test allows 4), backward 2.1 ulp. Other builds: the scalar loops (libmvec), bits as they were.
cdef extern from *:
    """
    #if defined(__AVX512F__) && defined(__x86_64__) && defined(__GNUC__)
    #include <immintrin.h>
    #define CAFFE_ELT_VEXP 1
    static inline __m512 caffe_v_exp(__m512 x) {
        __m512 xc = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));  /* NaN kept */
        __m512 fx, p = caffe_exp512_poly(xc, &fx);
        return _mm512_scalef_ps(p, fx);
    }
    static inline __m512 caffe_v_sigmoid(__m512 v) {
        const __m512 one = _mm512_set1_ps(1.0f);
        return _mm512_div_ps(one, _mm512_add_ps(one, caffe_v_exp(_mm512_sub_ps(_mm512_setzero_ps(), v))));
    }
    /* The loops below: whole vectors with plain loads and stores, the tail (n % 16) with masked ones. (Masked stores
       in every iteration, all lanes on, took twice the time on blobs in main memory, Zen 5.) */
    #define CAFFE_V_LOOP(n, i, k, full, ...)                                                                   \
        {                                                                                                    \
            ptrdiff_t i;                                                                                     \
            const __mmask16 k = (__mmask16)((1u << ((n) % 16)) - 1);                                         \
            for (i = 0; i + 16 <= (n); i += 16) { const int full = 1; __VA_ARGS__ }                          \
            if (i < (n)) { const int full = 0; __VA_ARGS__ }                                                 \
        }
    static inline __m512 caffe_v_load(const float* p, __mmask16 k, int full) {
        return full ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(k, p);
    }
    static inline void caffe_v_store(float* p, __m512 v, __mmask16 k, int full) {
        if (full) _mm512_storeu_ps(p, v);
        else _mm512_mask_storeu_ps(p, k, v);
    }
    /* y = sigmoid(x) (swish 1: aux = sigmoid(a x), y = x aux, aux NULL: y only; swish 2: y = sigmoid(a x)) */
    static inline void caffe_sigmoid_f(const float* x, float* y, float* aux, ptrdiff_t n, float a, int swish) {
        if (swish == 2) {
            CAFFE_V_LOOP(n, i, k, full, {
                caffe_v_store(y + i, caffe_v_sigmoid(_mm512_mul_ps(caffe_v_load(x + i, k, full), _mm512_set1_ps(a))),
                              k, full);
            })
        } else if (swish && aux) {
            CAFFE_V_LOOP(n, i, k, full, {
                __m512 v = caffe_v_load(x + i, k, full);
                __m512 s = caffe_v_sigmoid(_mm512_mul_ps(v, _mm512_set1_ps(a)));
                caffe_v_store(aux + i, s, k, full);
                caffe_v_store(y + i, _mm512_mul_ps(v, s), k, full);
            })
        } else if (swish) {
            CAFFE_V_LOOP(n, i, k, full, {
                __m512 v = caffe_v_load(x + i, k, full);
                caffe_v_store(y + i, _mm512_mul_ps(v, caffe_v_sigmoid(_mm512_mul_ps(v, _mm512_set1_ps(a)))), k, full);
            })
        } else {
            CAFFE_V_LOOP(n, i, k, full, {
                caffe_v_store(y + i, caffe_v_sigmoid(caffe_v_load(x + i, k, full)), k, full);
            })
        }
    }
    /* Swish backward with the sigmoid recomputed from x (caffe_v_sigmoid of a x: the forward's bits), in one pass
       (a sigmoid pass over a piece and then the gradient's pass left the exp's work and the memory reads in turn,
       not overlapped: 1.9x the kept-state backward's time). The gradient as the scalar loop computes it, C's
       promotion included (Cython writes 1 - g as 1.0 - g): g = a y in float, dy (g + s (1 - g)) in double, rounded
       to float once. */
    static inline void caffe_swish_bwd_f(const float* x, const float* y, const float* dy, float* dx, ptrdiff_t n,
                                         float a) {
        const __m512 va = _mm512_set1_ps(a);
        const __m512d one = _mm512_set1_pd(1.0);
        const __m256 va8 = _mm256_set1_ps(a);
        CAFFE_V_LOOP(n, i, k, full, {
            __m512 s = caffe_v_sigmoid(_mm512_mul_ps(caffe_v_load(x + i, k, full), va));
            __m512d g0, g1, d0, d1;
            __m512d s0 = _mm512_cvtps_pd(_mm512_castps512_ps256(s)), s1 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(s, 1));
            if (full) {  /* the halves of y and dy loaded and widened directly: extracting them took 1.7x the time */
                g0 = _mm512_cvtps_pd(_mm256_mul_ps(va8, _mm256_loadu_ps(y + i)));
                g1 = _mm512_cvtps_pd(_mm256_mul_ps(va8, _mm256_loadu_ps(y + i + 8)));
                d0 = _mm512_cvtps_pd(_mm256_loadu_ps(dy + i));
                d1 = _mm512_cvtps_pd(_mm256_loadu_ps(dy + i + 8));
            } else {
                __m512 g = _mm512_mul_ps(va, caffe_v_load(y + i, k, full));
                __m512 d = caffe_v_load(dy + i, k, full);
                g0 = _mm512_cvtps_pd(_mm512_castps512_ps256(g));
                g1 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(g, 1));
                d0 = _mm512_cvtps_pd(_mm512_castps512_ps256(d));
                d1 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(d, 1));
            }
            d0 = _mm512_mul_pd(d0, _mm512_add_pd(g0, _mm512_mul_pd(s0, _mm512_sub_pd(one, g0))));
            d1 = _mm512_mul_pd(d1, _mm512_add_pd(g1, _mm512_mul_pd(s1, _mm512_sub_pd(one, g1))));
            if (full) {
                _mm256_storeu_ps(dx + i, _mm512_cvtpd_ps(d0));
                _mm256_storeu_ps(dx + i + 8, _mm512_cvtpd_ps(d1));
            } else {
                caffe_v_store(dx + i, _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(d0)),
                                                         _mm512_cvtpd_ps(d1), 1), k, full);
            }
        })
    }
    /* BNLL: y = max(x, 0) + log1p(exp(-|x|)) (log1p by caffe_log1p_unit's series, 16 lanes) */
    static inline void caffe_bnll_fwd_f(const float* x, float* y, ptrdiff_t n) {
        CAFFE_V_LOOP(n, i, k, full, {
            __m512 v = caffe_v_load(x + i, k, full);
            __m512 u = caffe_v_exp(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(v)));
            __m512 sv = _mm512_div_ps(u, _mm512_add_ps(_mm512_set1_ps(2.0f), u));
            __m512 z = _mm512_mul_ps(sv, sv);
            __m512 p = _mm512_fmadd_ps(z, _mm512_set1_ps(1.0f / 13), _mm512_set1_ps(1.0f / 11));
            p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.0f / 9));
            p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.0f / 7));
            p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.0f / 5));
            p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.0f / 3));
            sv = _mm512_add_ps(sv, sv);
            sv = _mm512_fmadd_ps(sv, _mm512_mul_ps(z, p), sv);
            /* (v > 0 ? v : 0) + log1p: the max as a select, so that a NaN x gives NaN through the log1p term */
            caffe_v_store(y + i, _mm512_add_ps(
                _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ), v), sv), k, full);
        })
    }
    /* BNLL backward: dx = dy * e / (e + 1), e = exp(x < 50 ? x : 50) */
    static inline void caffe_bnll_bwd_f(const float* x, const float* dy, float* dx, ptrdiff_t n) {
        CAFFE_V_LOOP(n, i, k, full, {
            __m512 v = caffe_v_load(x + i, k, full);
            __m512 e = caffe_v_exp(_mm512_mask_mov_ps(_mm512_set1_ps(50.0f),
                                                      _mm512_cmp_ps_mask(v, _mm512_set1_ps(50.0f), _CMP_LT_OQ), v));
            caffe_v_store(dx + i, _mm512_div_ps(_mm512_mul_ps(caffe_v_load(dy + i, k, full), e),
                                                _mm512_add_ps(e, _mm512_set1_ps(1.0f))), k, full);
        })
    }
    /* Exp: y = exp(x a) b, the product x a rounded first as the scalar loop rounds it (caffe_v_exp: NaN kept, 0 / inf
       past its range as expf) */
    static inline void caffe_exp_fwd_f(const float* x, float* y, ptrdiff_t n, float a, float b) {
        const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
        CAFFE_V_LOOP(n, i, k, full, {
            caffe_v_store(y + i, _mm512_mul_ps(caffe_v_exp(_mm512_mul_ps(caffe_v_load(x + i, k, full), va)), vb), k, full);
        })
    }
    /* expm1(t) for t <= 0 (or NaN), from the same reduction: t = n ln2 + r, exp(r) - 1 = r p(r) with p = 1 + r/2 + ...
       (caffe_exp512_reduce's p, the polynomial before its last step), expm1(t) = 2^n (r p) + (2^n - 1) in one FMA
       (2^n - 1 exact for n >= -24; below, the result is -1 within an ulp anyway). n = 0 near 0: r = t exactly, r p
       keeps expm1's relative accuracy where exp(t) - 1 would cancel. Clamped at -88 (2^n stays normal; expm1 is -1
       there). */
    static inline __m512 caffe_v_expm1_neg(__m512 t) {
        const __m512 one = _mm512_set1_ps(1.0f);
        __m512 fx, r, p, s;
        t = _mm512_max_ps(_mm512_set1_ps(-88.0f), t);  /* NaN kept */
        p = caffe_exp512_reduce(t, &fx, &r);
        s = _mm512_scalef_ps(one, fx);
        return _mm512_fmadd_ps(s, _mm512_mul_ps(r, p), _mm512_sub_ps(s, one));
    }
    /* ELU: y = (x > 0 ? x : 0) + a expm1(x < 0 ? x : 0), the selects as the scalar loop's (a NaN x gives 0 there too) */
    static inline void caffe_elu_fwd_f(const float* x, float* y, ptrdiff_t n, float a) {
        const __m512 va = _mm512_set1_ps(a), zero = _mm512_setzero_ps();
        CAFFE_V_LOOP(n, i, k, full, {
            __m512 v = caffe_v_load(x + i, k, full);
            __m512 em = caffe_v_expm1_neg(_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ), v));
            caffe_v_store(y + i, _mm512_add_ps(_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, zero, _CMP_GT_OQ), v),
                                               _mm512_mul_ps(va, em)), k, full);
        })
    }
    /* TanH, 16 lanes (libmvec's 16-wide tanhf took 1.3-1.5x the time): tanh|x| = e / (e + 2), e = expm1(2|x|), the
       sign of x put back (copysign). expm1 by caffe_v_exp's reduction: 2|x| = n ln2 + r, |r| <= ln2/2, exp(r) - 1 =
       r + r^2 P(r) (Cephes' expf polynomial, r^2 P added to r last: near 0, e keeps expm1's relative accuracy), e =
       2^n (exp(r) - 1) + (2^n - 1) in one FMA. |x| clamped at 10 (tanh rounds to 1 from 9.01) with the absolute
       value by one VRANGEPS; ln2 in one part (its error, n ulp of exp at most, is divided by e + 2 where n is
       large); IEEE division (VDIVPS). Within 2.42 ulp of the float64 tanh over every 7th float32 (libmvec's tanhf
       1.03): e + 2, just above 2 near 0, rounds to an ulp of q there. Measured and dropped: expm1(-2|x|) below 1/16
       (1.6 ulp there; 2 operations more a vector, 15% more time), a compensated denominator (2.0 ulp; 5 more, 30%),
       VRCP14PS and a Newton step for the division (same ulps, 10-15% more time), Estrin's scheme for P: the loop
       is bound by its ~19 vector operations, not by a dependency chain. inf gives +-1; NaN, +-0 and |x| < 2^-12
       x itself (below). */
    static inline __m512 caffe_v_tanh(__m512 v) {
        /* The reduction of 2|x| done on |x| (n from |x| 2/ln2, h = |x| - n ln2/2 = r/2, P's coefficients times 2^(j+1),
           2^(n+1) by VSCALEFPS): the same values scaled by powers of two, so the same roundings, one addition less */
        __m512 a = _mm512_range_ps(_mm512_set1_ps(10.0f), v, 0x0A);  /* min(|x|, 10), sign cleared */
        __m512 fx, h, p, s2, e, q;
        fx = _mm512_sub_ps(_mm512_fmadd_ps(a, _mm512_set1_ps(2 * 1.44269504088896341f), _mm512_set1_ps(12582912.0f)),
                           _mm512_set1_ps(12582912.0f));
        h = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.5f * 0.693147182464599609375f), a);
        p = _mm512_fmadd_ps(_mm512_set1_ps(64 * 1.9875691500e-4f), h, _mm512_set1_ps(32 * 1.3981999507e-3f));
        p = _mm512_fmadd_ps(p, h, _mm512_set1_ps(16 * 8.3334519073e-3f));
        p = _mm512_fmadd_ps(p, h, _mm512_set1_ps(8 * 4.1665795894e-2f));
        p = _mm512_fmadd_ps(p, h, _mm512_set1_ps(4 * 1.6666665459e-1f));
        p = _mm512_fmadd_ps(p, h, _mm512_set1_ps(2 * 5.0000001201e-1f));
        p = _mm512_fmadd_ps(_mm512_mul_ps(h, h), p, h);                          /* (exp(r) - 1) / 2 */
        s2 = _mm512_scalef_ps(_mm512_set1_ps(2.0f), fx);                          /* 2^(n+1) */
        e = _mm512_fmadd_ps(s2, p, _mm512_fmadd_ps(s2, _mm512_set1_ps(0.5f), _mm512_set1_ps(-1.0f)));
        q = _mm512_div_ps(e, _mm512_add_ps(e, _mm512_set1_ps(2.0f)));
        /* copysign(q, x) in one VPTERNLOGD (bitwise: sign mask ? x : q); x itself where |x| < 2^-12 (tanh x rounds
           to x there, as libm gives it), +-0, denormals and NaN: VGETEXPPS gives -inf / NaN for those, the compare
           false (VRANGEPS gave 10 for a NaN) */
        __mmask16 k = _mm512_cmp_ps_mask(_mm512_getexp_ps(v), _mm512_set1_ps(-12.0f), _CMP_GE_OQ);
        return _mm512_castsi512_ps(_mm512_mask_ternarylogic_epi32(_mm512_castps_si512(v), k, _mm512_castps_si512(q),
                                                                  _mm512_set1_epi32((int)0x80000000u), 0xE4));
    }
    static inline void caffe_tanh_fwd_f(const float* x, float* y, ptrdiff_t n) {
        CAFFE_V_LOOP(n, i, k, full, {
            caffe_v_store(y + i, caffe_v_tanh(caffe_v_load(x + i, k, full)), k, full);
        })
    }
    /* log(v), 16 lanes: Cephes' logf (v = 2^e m, m in [sqrt(1/2), sqrt(2)) by VGETMANTPS / VGETEXPPS, which take
       denormals as they are; log(1 + f) = f - f^2/2 + f^3 P(f), ln2 in two parts), the special cases set after:
       0 -> -inf, < 0 -> NaN, inf -> inf, NaN kept. */
    static inline __m512 caffe_v_log(__m512 v) {
        const __m512 one = _mm512_set1_ps(1.0f);
        __m512 m = _mm512_getmant_ps(v, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_zero);  /* [1, 2) */
        __m512 e = _mm512_getexp_ps(v);
        __mmask16 hi = _mm512_cmp_ps_mask(m, _mm512_set1_ps(1.41421356237f), _CMP_GE_OQ);
        __m512 f, z, p, r;
        m = _mm512_mask_mul_ps(m, hi, m, _mm512_set1_ps(0.5f));                /* [sqrt(1/2), sqrt(2)) */
        e = _mm512_mask_add_ps(e, hi, e, one);
        f = _mm512_sub_ps(m, one);
        z = _mm512_mul_ps(f, f);
        {   /* P(f) by Estrin's scheme (pairs, then f^2, f^4): a shorter chain of dependent FMAs than Horner's */
            __m512 z4 = _mm512_mul_ps(z, z);
            __m512 a01 = _mm512_fmadd_ps(_mm512_set1_ps(7.0376836292e-2f), f, _mm512_set1_ps(-1.1514610310e-1f));
            __m512 a23 = _mm512_fmadd_ps(_mm512_set1_ps(1.1676998740e-1f), f, _mm512_set1_ps(-1.2420140846e-1f));
            __m512 a45 = _mm512_fmadd_ps(_mm512_set1_ps(1.4249322787e-1f), f, _mm512_set1_ps(-1.6668057665e-1f));
            __m512 a67 = _mm512_fmadd_ps(_mm512_set1_ps(2.0000714765e-1f), f, _mm512_set1_ps(-2.4999993993e-1f));
            p = _mm512_fmadd_ps(_mm512_fmadd_ps(a01, z, a23), z4, _mm512_fmadd_ps(a45, z, a67));
            p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(3.3333331174e-1f));
        }
        p = _mm512_mul_ps(_mm512_mul_ps(p, f), z);
        p = _mm512_fmadd_ps(e, _mm512_set1_ps(-2.12194440e-4f), p);
        p = _mm512_fmadd_ps(z, _mm512_set1_ps(-0.5f), p);
        r = _mm512_add_ps(f, p);
        r = _mm512_fmadd_ps(e, _mm512_set1_ps(0.693359375f), r);
        /* NaN, +-0, +-inf, negative (VFPCLASSPS 0xDF: all but positive normal and denormal numbers): rare, so set
           apart by one test (four selects in every vector cost 20% of the loop) */
        if (__builtin_expect(_mm512_fpclass_ps_mask(v, 0xDF) != 0, 0)) {
            r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ),
                                   _mm512_set1_ps(__builtin_nanf("")));
            r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_EQ_OQ),
                                   _mm512_set1_ps(-__builtin_inff()));
            r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(v, _mm512_set1_ps(__builtin_inff()), _CMP_EQ_OQ), v);
            r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v);
        }
        return r;
    }
    /* Log: y = log(x a + b) c, the product and sum rounded as the scalar loop rounds them (no contraction) */
    static inline void caffe_log_fwd_f(const float* x, float* y, ptrdiff_t n, float a, float b, float c) {
        const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b), vc = _mm512_set1_ps(c);
        CAFFE_V_LOOP(n, i, k, full, {
            __m512 v = _mm512_add_ps(_mm512_mul_ps(caffe_v_load(x + i, k, full), va), vb);
            caffe_v_store(y + i, _mm512_mul_ps(caffe_v_log(v), vc), k, full);
        })
    }
    #else
    #define CAFFE_ELT_VEXP 0
    static inline void caffe_sigmoid_f(const float* x, float* y, float* aux, ptrdiff_t n, float a, int swish) {}
    static inline void caffe_swish_bwd_f(const float* x, const float* y, const float* dy, float* dx, ptrdiff_t n,
                                         float a) {}
    static inline void caffe_bnll_fwd_f(const float* x, float* y, ptrdiff_t n) {}
    static inline void caffe_bnll_bwd_f(const float* x, const float* dy, float* dx, ptrdiff_t n) {}
    static inline void caffe_exp_fwd_f(const float* x, float* y, ptrdiff_t n, float a, float b) {}
    static inline void caffe_elu_fwd_f(const float* x, float* y, ptrdiff_t n, float a) {}
    static inline void caffe_log_fwd_f(const float* x, float* y, ptrdiff_t n, float a, float b, float c) {}
    static inline void caffe_tanh_fwd_f(const float* x, float* y, ptrdiff_t n) {}
    #endif
    """
    bint CAFFE_ELT_VEXP
    void caffe_sigmoid_f(const float* x, float* y, float* aux, Py_ssize_t n, float a, int swish) nogil
    void caffe_swish_bwd_f(const float* x, const float* y, const float* dy, float* dx, Py_ssize_t n, float a) nogil
    void caffe_bnll_fwd_f(const float* x, float* y, Py_ssize_t n) nogil
    void caffe_bnll_bwd_f(const float* x, const float* dy, float* dx, Py_ssize_t n) nogil
    void caffe_exp_fwd_f(const float* x, float* y, Py_ssize_t n, float a, float b) nogil
    void caffe_elu_fwd_f(const float* x, float* y, Py_ssize_t n, float a) nogil
    void caffe_log_fwd_f(const float* x, float* y, Py_ssize_t n, float a, float b, float c) nogil
    void caffe_tanh_fwd_f(const float* x, float* y, Py_ssize_t n) nogil


cdef inline real _log1p_unit(real u) noexcept nogil:
    if real is float:
        return caffe_log1p_unit(u)
    return _log1p(u)


# Swish out of place keeps no sigmoid output: its backward recomputes sigmoid(a x) from the bottom (reading x
# instead of the state: the forward writes one output, not two). Both passes take the sigmoid from this one loop
# into a local piece, so that libmvec's vector and scalar calls (a loop's vector body and its tail) fall on the
# same elements in both, and the recomputed values are the forward's bits; the gradient's loop is the kept-state
# loop's own source, so the compiler rounds it the same way (the AVX-512 build contracts it into FMAs there
# too): the bottom diff is the same bits either way. (The in-place forward keeps the state and its fused loop.)
cdef inline void _swish_sigmoid(const real* x, real* s, Py_ssize_t n, real a) noexcept nogil:
    cdef Py_ssize_t i
    if real is float and CAFFE_ELT_VEXP:  # (every lane the same operations: no vector/tail split to match)
        caffe_sigmoid_f(x, s, NULL, n, a, 2)
        return
    for i in range(n):
        s[i] = _sigmoid(x[i] * a)


cdef void _swish_fwd_top(const real* x, real* y, Py_ssize_t n, real a) noexcept nogil:
    cdef real s[CHUNK]
    cdef Py_ssize_t i
    _swish_sigmoid(x, s, n, a)
    for i in range(n):
        y[i] = x[i] * s[i]


cdef void _swish_bwd_recompute(const real* x, const real* y, const real* dy, real* dx, Py_ssize_t n,
                               real a) noexcept nogil:
    cdef real s[CHUNK]
    cdef Py_ssize_t i
    cdef real g
    if real is float and CAFFE_ELT_VEXP:
        caffe_swish_bwd_f(x, y, dy, dx, n, a)
        return
    _swish_sigmoid(x, s, n, a)
    for i in range(n):
        g = a * y[i]
        dx[i] = dy[i] * (g + s[i] * (1 - g))


# Whether a Swish layer out of place should leave the sigmoid output out (float32): only where the sigmoid is cheap
# against the traffic saved, the AVX-512 build's own exp (1 unit of 3 forward, 0.5 ns an element on one Zen 5 core;
# ab_swish.py). libmvec's tanh (the other builds, and float64) took longer to recompute than the write it saved
# (AVX2: 0.9 ns an element, backward 2.9x slower for a forward 1.1x faster): there the layer keeps the state.
SWISH_RECOMPUTES_FLOAT32 = bool(CAFFE_ELT_VEXP)


cdef void _neuron_fwd(int op, const real* x, real* y, real* aux, Py_ssize_t n,
                      real a, real b, real c) noexcept nogil:
    cdef Py_ssize_t i
    cdef real v, s, t
    if op == RELU:
        if a == 0:
            for i in range(n):
                v = x[i]
                y[i] = 0 if v <= 0 else v  # NaN stays NaN, as Caffe's max(x, 0)
        else:
            for i in range(n):
                v = x[i]
                y[i] = v if v > 0 else a * v
    elif op == SIGMOID:
        if real is float and CAFFE_ELT_VEXP:
            caffe_sigmoid_f(x, y, NULL, n, 1, 0)
            return
        for i in range(n):
            y[i] = _sigmoid(x[i])
    elif op == TANH:
        if real is float and CAFFE_ELT_VEXP:
            caffe_tanh_fwd_f(x, y, n)
            return
        for i in range(n):
            y[i] = _tanh(x[i])
    elif op == ELU:
        if real is float and CAFFE_ELT_VEXP:
            caffe_elu_fwd_f(x, y, n, a)
            return
        for i in range(n):
            v = x[i]
            y[i] = (v if v > 0 else 0) + a * _expm1(v if v < 0 else 0)
    elif op == POWER:
        if a == 1 and b == 0:  # the base is x itself (so a -0.0 keeps its sign, as in NumPy's path)
            for i in range(n):
                y[i] = x[i] * x[i] if c == 2 else _pow(x[i], c)
        elif c == 2:
            for i in range(n):
                v = x[i] * a + b
                y[i] = v * v
        else:
            for i in range(n):
                y[i] = _pow(x[i] * a + b, c)
    elif op == EXP:
        if real is float and CAFFE_ELT_VEXP:
            caffe_exp_fwd_f(x, y, n, a, b)
            return
        for i in range(n):
            y[i] = _exp(x[i] * a) * b
    elif op == LOG:
        if real is float and CAFFE_ELT_VEXP:
            caffe_log_fwd_f(x, y, n, a, b, c)
            return
        for i in range(n):
            y[i] = _log(x[i] * a + b) * c
    elif op == ABSVAL:
        for i in range(n):
            y[i] = fabsf(x[i]) if real is float else fabs(x[i])
    elif op == BNLL:
        if real is float and CAFFE_ELT_VEXP:
            caffe_bnll_fwd_f(x, y, n)
            return
        for i in range(n):
            v = x[i]
            t = fabsf(v) if real is float else fabs(v)
            y[i] = (v if v > 0 else 0) + _log1p_unit(_exp(-t))
    elif op == THRESHOLD:
        for i in range(n):
            y[i] = 1 if x[i] > a else 0
    elif op == CLIP:
        for i in range(n):
            v = x[i]
            v = a if v < a else v
            y[i] = b if v > b else v
    elif op == SWISH:
        if real is float and CAFFE_ELT_VEXP:
            caffe_sigmoid_f(x, y, aux, n, a, 1)
            return
        if aux == NULL:
            _swish_fwd_top(x, y, n, a)
            return
        for i in range(n):
            v = x[i]
            s = _sigmoid(v * a)
            aux[i] = s
            y[i] = v * s
    elif op == AFFINE:
        for i in range(n):
            y[i] = x[i] * a + b


cdef void _neuron_bwd(int op, const real* x, const real* y, const real* aux, const real* dy, real* dx,
                      Py_ssize_t n, real a, real b, real c, real d) noexcept nogil:
    cdef Py_ssize_t i
    cdef real v, e, g
    if op == RELU:
        for i in range(n):
            dx[i] = dy[i] * (1 if x[i] > 0 else a)
    elif op == SIGMOID:
        for i in range(n):
            v = y[i]
            dx[i] = dy[i] * v * (1 - v)
    elif op == TANH:
        for i in range(n):
            v = y[i]
            dx[i] = dy[i] * (1 - v * v)
    elif op == ELU:
        for i in range(n):
            v = y[i]  # loaded unconditionally: a load inside the select would keep the loop scalar
            dx[i] = dy[i] * (1 if x[i] > 0 else a + v)
    elif op == POWER:
        if c == 2:
            for i in range(n):
                dx[i] = dy[i] * (d * (x[i] * a + b))
        else:
            for i in range(n):
                dx[i] = dy[i] * (d * _pow(x[i] * a + b, c - 1))
    elif op == EXP:
        for i in range(n):
            dx[i] = dy[i] * y[i] * a
    elif op == LOG:
        for i in range(n):
            dx[i] = dy[i] * (d / (x[i] * a + b))
    elif op == ABSVAL:
        for i in range(n):
            v = x[i]
            dx[i] = dy[i] * (1 if v > 0 else (-1 if v < 0 else 0))
    elif op == BNLL:
        if real is float and CAFFE_ELT_VEXP:
            caffe_bnll_bwd_f(x, dy, dx, n)
            return
        for i in range(n):
            v = x[i]
            e = _exp(v if v < 50 else 50)
            dx[i] = dy[i] * e / (e + 1)
    elif op == CLIP:
        for i in range(n):
            v = x[i]
            dx[i] = dy[i] * (1 if (v >= a and v <= b) else 0)
    elif op == SWISH:
        if aux == NULL:  # out of place: the sigmoid from x, as the forward computed it
            _swish_bwd_recompute(x, y, dy, dx, n, a)
            return
        for i in range(n):
            g = a * y[i]
            dx[i] = dy[i] * (g + aux[i] * (1 - g))
    elif op == AFFINE:
        for i in range(n):
            dx[i] = dy[i] * a


# The neuron loops over a piece: its last n % TAIL elements through the same loop, padded (_vmath.pxi's TAIL).
cdef void _neuron_fwd_piece(int op, const real* x, real* y, real* aux, Py_ssize_t n, real a, real b,
                            real c) noexcept nogil:
    cdef Py_ssize_t body = n - n % TAIL, r = n % TAIL, i
    cdef real tx[TAIL]
    cdef real ty[TAIL]
    cdef real ta[TAIL]
    if body:
        _neuron_fwd(op, x, y, aux, body, a, b, c)
    if r:
        _pad_tail(x + body, tx, r)
        _neuron_fwd(op, tx, ty, ta if aux != NULL else NULL, TAIL, a, b, c)
        for i in range(r):
            y[body + i] = ty[i]
        if aux != NULL:
            for i in range(r):
                aux[body + i] = ta[i]


cdef void _neuron_bwd_piece(int op, const real* x, const real* y, const real* aux, const real* dy, real* dx,
                            Py_ssize_t n, real a, real b, real c, real d) noexcept nogil:
    cdef Py_ssize_t body = n - n % TAIL, r = n % TAIL, i
    cdef real tx[TAIL]
    cdef real ty[TAIL]
    cdef real ta[TAIL]
    cdef real tdy[TAIL]
    cdef real tdx[TAIL]
    if body:
        _neuron_bwd(op, x, y, aux, dy, dx, body, a, b, c, d)
    if r:
        if x != NULL:
            _pad_tail(x + body, tx, r)
        if y != NULL:
            _pad_tail(y + body, ty, r)
        if aux != NULL:
            _pad_tail(aux + body, ta, r)
        _pad_tail(dy + body, tdy, r)
        _neuron_bwd(op, tx if x != NULL else NULL, ty if y != NULL else NULL, ta if aux != NULL else NULL, tdy, tdx,
                    TAIL, a, b, c, d)
        for i in range(r):
            dx[body + i] = tdx[i]


def neuron_forward(int op, const real[::1] x, real[::1] y, real[::1] aux, real[::1] save,
                   double a=0, double b=0, double c=0):
    """y = op(x). aux: a second output (Swish's sigmoid; empty: not kept, backward recomputes it from x);
    save: a copy of x is written there first (an in-place layer keeps its input for backward). Unused buffers
    are passed empty."""
    cdef Py_ssize_t n = x.shape[0], ch, lo, m
    if n == 0:
        return
    _need(y.shape[0], n, "top")
    if op == SWISH and aux.shape[0]:
        _need(aux.shape[0], n, "aux")
    cdef const real* xp = &x[0]
    cdef real* yp = &y[0]
    cdef real* ap = _ptr(aux, n)
    cdef real* sp = _ptr(save, n)
    cdef Py_ssize_t nch = (n + CHUNK - 1) // CHUNK
    with nogil:
        for ch in prange(nch, schedule="dynamic", chunksize=4, num_threads=_threads(n)):
            lo = ch * CHUNK
            m = n - lo if n - lo < CHUNK else CHUNK
            if sp != NULL:
                memcpy(sp + lo, xp + lo, m * sizeof(real))
                _neuron_fwd_piece(op, sp + lo, yp + lo, ap + lo if ap != NULL else NULL, m, a, b, c)
            else:
                _neuron_fwd_piece(op, xp + lo, yp + lo, ap + lo if ap != NULL else NULL, m, a, b, c)


def neuron_backward(int op, const real[::1] x, const real[::1] y, const real[::1] aux,
                    const real[::1] dy, real[::1] dx, double a=0, double b=0, double c=0, double d=0):
    """dx = dy * op'(x, y). x / y / aux are passed empty where the operation does not read them (Swish reads
    y and either aux, its sigmoid kept by the forward, or x, to recompute it)."""
    cdef Py_ssize_t n = dy.shape[0], ch, lo, m
    if n == 0:
        return
    _need(dx.shape[0], n, "bottom diff")
    cdef const real* xp = &x[0] if x.shape[0] else NULL
    cdef const real* yp = &y[0] if y.shape[0] else NULL
    cdef const real* ap = &aux[0] if aux.shape[0] else NULL
    if xp != NULL:
        _need(x.shape[0], n, "bottom data")
    if yp != NULL:
        _need(y.shape[0], n, "top data")
    if ap != NULL:
        _need(aux.shape[0], n, "aux")
    if (op in (RELU, ELU, POWER, LOG, ABSVAL, BNLL, CLIP) and xp == NULL) or \
            (op in (SIGMOID, TANH, ELU, EXP, SWISH) and yp == NULL) or (op == SWISH and ap == NULL and xp == NULL):
        raise ValueError(f"elementwise kernel: neuron {op} backward is missing an input")
    cdef const real* dyp = &dy[0]
    cdef real* dxp = &dx[0]
    cdef Py_ssize_t nch = (n + CHUNK - 1) // CHUNK
    with nogil:
        for ch in prange(nch, schedule="dynamic", chunksize=4, num_threads=_threads(n)):
            lo = ch * CHUNK
            m = n - lo if n - lo < CHUNK else CHUNK
            _neuron_bwd_piece(op, xp + lo if xp != NULL else NULL, yp + lo if yp != NULL else NULL,
                              ap + lo if ap != NULL else NULL, dyp + lo, dxp + lo, m, a, b, c, d)


# -- Eltwise (and Split's backward sum) ------------------------------------------------------------

# Eltwise MAX backward with two bottoms in the AVX-512 build: g0 = (mask == 0) ? dy : +0, g1 = (mask == 1) ? dy : +0,
# as the bits of dy ANDed with an all-ones / all-zeros word (the same bits as the selects, NaN and -0 kept where
# chosen). Written as selects, GCC's AVX-512 code loaded dy twice with masked loads: 0.80-0.86x the AVX2 build's
# speed on Zen 5, as ANDs 0.95x. The other builds keep the selects (the ANDs measured 0.96x there).
# Large blobs (STREAM_MIN_BYTES an output) in the AVX2 / AVX-512 builds: the two-bottom passes write both their
# outputs past the caches by non-temporal stores (CAFFE_STREAM2: MAX backward's diffs here, MAX forward's top and
# mask (float32), SUM / stable PROD backward's diffs below; the same arithmetic and selects, so the same bits). A
# plain store first reads each line it writes from memory (write-allocate): MAX backward read dy, the mask and both
# diffs' lines and wrote the diffs back, 6 blob-sized transfers where 4 do. One pass (a pass an output over each
# piece cost 1.2x: memory idled during the second) and 256-bit stores in the AVX-512 build too (a 512-bit MAX
# backward step took 1.35-1.6x as long on Zen 5). Interleaved against the plain stores at 8x256x56x56 float32:
# MAX backward 1.3-1.4x faster, MAX forward 1.25-1.3x, SUM backward 1.15-1.25x, PROD backward 1.25-1.4x (one and
# two threads; bench/README.md, session 13).
cdef extern from *:
    """
    #include <stdint.h>
    #include <stddef.h>
    #if defined(__SSE2__)
    #include <immintrin.h>
    #endif
    #if defined(__AVX512F__)
    #define CAFFE_MAX2_BWD_AND 1
    #else
    #define CAFFE_MAX2_BWD_AND 0
    #endif
    typedef uint32_t __attribute__((may_alias)) caffe_u32_alias;
    typedef uint64_t __attribute__((may_alias)) caffe_u64_alias;
    static inline void caffe_max2_bwd_f(float* g0, float* g1, const float* dy, const int* mask, ptrdiff_t n) {
        const caffe_u32_alias* d = (const caffe_u32_alias*)dy;
        caffe_u32_alias* a = (caffe_u32_alias*)g0;
        caffe_u32_alias* b = (caffe_u32_alias*)g1;
        for (ptrdiff_t j = 0; j < n; j++) {
            uint32_t v = d[j];
            int o = mask[j];
            a[j] = v & (0u - (uint32_t)(o == 0));
            b[j] = v & (0u - (uint32_t)(o == 1));
        }
    }
    static inline void caffe_max2_bwd_d(double* g0, double* g1, const double* dy, const int* mask, ptrdiff_t n) {
        const caffe_u64_alias* d = (const caffe_u64_alias*)dy;
        caffe_u64_alias* a = (caffe_u64_alias*)g0;
        caffe_u64_alias* b = (caffe_u64_alias*)g1;
        for (ptrdiff_t j = 0; j < n; j++) {
            uint64_t v = d[j];
            int o = mask[j];
            a[j] = v & (0u - (uint64_t)(o == 0));
            b[j] = v & (0u - (uint64_t)(o == 1));
        }
    }
    /* Two outputs of n elements of one size (a line holds LINE of either), by non-temporal stores where the AVX2 /
       AVX-512 builds can (CAFFE_STREAM2), in one pass: each output from its own first 64-byte line (plain stores
       before it and after the last whole line common to both), so the two need not share an alignment (step k
       stores line k of each; the inputs are read by unaligned loads). ELEM(i, j): element j of output i by a plain
       store; LINE_STEP(i, j): elements j .. j + LINE - 1 of output i (64-byte aligned) by streaming stores, each
       vector's inputs loaded before it is stored. In place, output LATE may be an input: its lines start no later
       than the other's (the other's start moves a line on where needed) and each step stores it last, so every
       input element is read (for both outputs) before it is overwritten. The outputs are not the same array and
       are aligned to their element size (the callers check). */
    #define CAFFE_STREAM2(ESIZE, O0, O1, N, LATE, ELEM, LINE_STEP)                                                \
        do {                                                                                                      \
            const ptrdiff_t line_ = 64 / (ESIZE);                                                                 \
            const uintptr_t o_[2] = {(uintptr_t)(O0), (uintptr_t)(O1)};                                           \
            int late_ = (LATE), other_ = 1 - late_, i_, t_;                                                       \
            ptrdiff_t h_[2], j_, k_, K_;                                                                          \
            for (i_ = 0; i_ < 2; i_++) {                                                                          \
                h_[i_] = (ptrdiff_t)(((64 - (o_[i_] & 63)) & 63) / (ESIZE));                                      \
                if (h_[i_] > (N)) h_[i_] = (N);                                                                   \
            }                                                                                                     \
            if (h_[other_] < h_[late_]) h_[other_] = h_[other_] + line_ < (N) ? h_[other_] + line_ : (N);         \
            K_ = ((N) - (h_[0] > h_[1] ? h_[0] : h_[1])) / line_;                                                 \
            for (t_ = 0; t_ < 2; t_++) {  /* heads: the other output first */                                     \
                i_ = t_ ? late_ : other_;                                                                         \
                for (j_ = 0; j_ < h_[i_]; j_++) ELEM(i_, j_);                                                     \
            }                                                                                                     \
            for (k_ = 0; k_ < K_; k_++) {                                                                         \
                LINE_STEP(other_, h_[other_] + k_ * line_);                                                       \
                LINE_STEP(late_, h_[late_] + k_ * line_);                                                         \
            }                                                                                                     \
            for (t_ = 0; t_ < 2; t_++) {  /* tails: the other output first */                                     \
                i_ = t_ ? late_ : other_;                                                                         \
                for (j_ = h_[i_] + K_ * line_; j_ < (N); j_++) ELEM(i_, j_);                                      \
            }                                                                                                     \
        } while (0)
    #if defined(__AVX2__)
    #define CAFFE_STREAM2_BUILD 1
    /* MAX backward: diff i = (mask == i) ? dy : +0 (dy's bits ANDed with the int32 compare's all-ones / zeros, sign-
       extended to 64 bits for double) */
    #define CAFFE_MAX2_BWD_ELEM(U, i, j) (((U*)g[i])[j] = d[j] & ((U)0 - (U)(mask[j] == (i))))
    #define CAFFE_MAX2_BWD_ELEM_F(i, j) CAFFE_MAX2_BWD_ELEM(caffe_u32_alias, i, j)
    #define CAFFE_MAX2_BWD_ELEM_D(i, j) CAFFE_MAX2_BWD_ELEM(caffe_u64_alias, i, j)
    #define CAFFE_MAX2_BWD_LINE_F(i, j)                                                                           \
        for (ptrdiff_t v_ = (j); v_ < (j) + 16; v_ += 8)                                                          \
            _mm256_stream_si256((__m256i*)(g[i] + v_), _mm256_and_si256(                                          \
                _mm256_cmpeq_epi32(_mm256_loadu_si256((const __m256i*)(mask + v_)), _mm256_set1_epi32(i)),       \
                _mm256_loadu_si256((const __m256i*)(dy + v_))))
    #define CAFFE_MAX2_BWD_LINE_D(i, j)                                                                           \
        for (ptrdiff_t v_ = (j); v_ < (j) + 8; v_ += 4)                                                           \
            _mm256_stream_si256((__m256i*)(g[i] + v_), _mm256_and_si256(_mm256_cvtepi32_epi64(                   \
                _mm_cmpeq_epi32(_mm_loadu_si128((const __m128i*)(mask + v_)), _mm_set1_epi32(i))),               \
                _mm256_loadu_si256((const __m256i*)(dy + v_))))
    static inline void caffe_max2_bwd_stream_f(float* g0, float* g1, const float* dy, const int* mask, ptrdiff_t n) {
        float* g[2] = {g0, g1};
        const caffe_u32_alias* d = (const caffe_u32_alias*)dy;
        CAFFE_STREAM2(4, g0, g1, n, g0 == dy ? 0 : 1, CAFFE_MAX2_BWD_ELEM_F, CAFFE_MAX2_BWD_LINE_F);
    }
    static inline void caffe_max2_bwd_stream_d(double* g0, double* g1, const double* dy, const int* mask,
                                               ptrdiff_t n) {
        double* g[2] = {g0, g1};
        const caffe_u64_alias* d = (const caffe_u64_alias*)dy;
        CAFFE_STREAM2(8, g0, g1, n, g0 == dy ? 0 : 1, CAFFE_MAX2_BWD_ELEM_D, CAFFE_MAX2_BWD_LINE_D);
    }
    /* MAX forward (float): y = x0 > x1 ? x0 : x1, mask = x0 > x1 ? 0 : 1 (output 0 y, 1 the mask); y may be a bottom */
    #define CAFFE_MAX2_FWD_ELEM(i, j)                                                                             \
        do {                                                                                                      \
            float a_ = x0[j], b_ = x1[j];                                                                         \
            if (i) mask[j] = a_ > b_ ? 0 : 1; else y[j] = a_ > b_ ? a_ : b_;                                      \
        } while (0)
    #define CAFFE_MAX2_FWD_LINE(i, j)                                                                             \
        for (ptrdiff_t v_ = (j); v_ < (j) + 16; v_ += 8) {                                                        \
            __m256 a_ = _mm256_loadu_ps(x0 + v_), b_ = _mm256_loadu_ps(x1 + v_);                                  \
            __m256 k_ = _mm256_cmp_ps(a_, b_, _CMP_GT_OQ);                                                        \
            if (i) _mm256_stream_si256((__m256i*)(mask + v_),                                                     \
                                       _mm256_andnot_si256(_mm256_castps_si256(k_), _mm256_set1_epi32(1)));      \
            else _mm256_stream_ps(y + v_, _mm256_blendv_ps(b_, a_, k_));                                          \
        }
    static inline void caffe_max2_fwd_stream_f(float* y, int* mask, const float* x0, const float* x1, ptrdiff_t n) {
        CAFFE_STREAM2(4, y, mask, n, 0, CAFFE_MAX2_FWD_ELEM, CAFFE_MAX2_FWD_LINE);
    }
    #else
    #define CAFFE_STREAM2_BUILD 0
    static inline void caffe_max2_bwd_stream_f(float* g0, float* g1, const float* dy, const int* mask, ptrdiff_t n) {}
    static inline void caffe_max2_bwd_stream_d(double* g0, double* g1, const double* dy, const int* mask,
                                               ptrdiff_t n) {}
    static inline void caffe_max2_fwd_stream_f(float* y, int* mask, const float* x0, const float* x1, ptrdiff_t n) {}
    #endif
    """
    bint CAFFE_MAX2_BWD_AND
    bint CAFFE_STREAM2_BUILD
    void caffe_max2_bwd_f(float* g0, float* g1, const float* dy, const int* mask, Py_ssize_t n) nogil
    void caffe_max2_bwd_d(double* g0, double* g1, const double* dy, const int* mask, Py_ssize_t n) nogil
    void caffe_max2_bwd_stream_f(float* g0, float* g1, const float* dy, const int* mask, Py_ssize_t n) nogil
    void caffe_max2_bwd_stream_d(double* g0, double* g1, const double* dy, const int* mask, Py_ssize_t n) nogil
    void caffe_max2_fwd_stream_f(float* y, int* mask, const float* x0, const float* x1, Py_ssize_t n) nogil


cdef void _eltwise_fwd(int op, real** xs, const double* coeff, int k, real* y, int* mask, Py_ssize_t lo,
                       Py_ssize_t n, bint stream) noexcept nogil:
    # Accumulate in a local piece: y may be one of the bottoms (in place).
    cdef real acc[CHUNK]
    cdef int msk[CHUNK]
    cdef Py_ssize_t j
    cdef int i
    cdef real ci, v
    cdef const real* x0 = xs[0] + lo
    cdef const real* x1 = xs[1] + lo
    cdef const real* xi
    cdef real c0, c1
    cdef real* yo = y + lo
    cdef int* mo
    cdef real w
    if k == 2:  # one direct pass: each output element is written after its inputs are read
        if op == SUM:
            c0 = <real>coeff[0]
            c1 = <real>coeff[1]
            for j in range(n):
                yo[j] = c0 * x0[j] + c1 * x1[j]
        elif op == MAX:  # as below: bottom[1] wins a tie (and a NaN in bottom[0])
            mo = mask + lo
            if real is float:
                if CAFFE_STREAM2_BUILD and stream and <size_t>yo % 4 == 0 and <size_t>mo % 4 == 0:
                    caffe_max2_fwd_stream_f(yo, mo, x0, x1, n)
                    caffe_store_fence()
                    return
            for j in range(n):
                v = x0[j]
                w = x1[j]
                yo[j] = v if v > w else w
                mo[j] = 0 if v > w else 1
        else:
            for j in range(n):
                yo[j] = x0[j] * x1[j]
        return
    if op == SUM:
        ci = <real>coeff[0]
        for j in range(n):
            acc[j] = ci * x0[j]
        for i in range(1, k):
            ci = <real>coeff[i]
            xi = xs[i] + lo
            for j in range(n):
                acc[j] = acc[j] + ci * xi[j]
    elif op == PROD:
        for j in range(n):
            acc[j] = x0[j] * x1[j]
        for i in range(2, k):
            xi = xs[i] + lo
            for j in range(n):
                acc[j] = acc[j] * xi[j]
    else:  # MAX: bottom[1] wins a tie with bottom[0]; a later bottom must be strictly larger
        for j in range(n):
            v = x0[j]
            acc[j] = v if v > x1[j] else x1[j]
            msk[j] = 0 if v > x1[j] else 1
        for i in range(2, k):
            xi = xs[i] + lo
            for j in range(n):
                v = xi[j]
                msk[j] = i if v > acc[j] else msk[j]
                acc[j] = v if v > acc[j] else acc[j]
        memcpy(mask + lo, msk, n * sizeof(int))
    memcpy(y + lo, acc, n * sizeof(real))


# Eltwise SUM and PROD (stable_prod_grad) backward with two bottoms and both diffs wanted, in one pass over dy (and
# the bottoms) in the AVX2 / AVX-512 builds: g0 = c0 dy, g1 = c1 dy (SUM); g0 = x1 dy, g1 = x0 dy (PROD: the
# product of the other bottom and the top diff, as the general path's copy-then-multiply rounds it): the same
# bits. The general path copied each piece of dy to a local buffer and then wrote one diff per pass (1.5x the
# time of SUM's forward, which moves as many bytes). GCC's vector types: a vector of dy is loaded before the
# diffs at its positions are stored, so a diff that is the top diff (in place) is safe, and the compiler needs
# no alias checks (with exact aliasing they had sent a plain loop to its scalar version).
cdef extern from *:
    """
    #include <stddef.h>
    #if defined(__AVX2__) && defined(__GNUC__)
    #define CAFFE_ELT2_BWD_VECTOR 1
    typedef float caffe_elt_v16f __attribute__((vector_size(64)));
    typedef double caffe_elt_v8d __attribute__((vector_size(64)));
    #define CAFFE_ELT2_BWD(NAME, T, V, L)                                                              \
    static inline void NAME(T* g0, T* g1, const T* x0, const T* x1, const T* dy, T c0, T c1,         \
                            int prod, ptrdiff_t n) {                                                 \
        ptrdiff_t j = 0;                                                                             \
        V d, a, b;                                                                                   \
        if (prod) {                                                                                  \
            for (; j + L <= n; j += L) {                                                             \
                __builtin_memcpy(&d, dy + j, sizeof d);                                              \
                __builtin_memcpy(&a, x1 + j, sizeof a);                                              \
                __builtin_memcpy(&b, x0 + j, sizeof b);                                              \
                a = a * d;                                                                           \
                b = b * d;                                                                           \
                __builtin_memcpy(g0 + j, &a, sizeof a);                                              \
                __builtin_memcpy(g1 + j, &b, sizeof b);                                              \
            }                                                                                        \
            for (; j < n; j++) {                                                                     \
                T v = dy[j], p = x1[j] * v, q = x0[j] * v;                                           \
                g0[j] = p;                                                                           \
                g1[j] = q;                                                                           \
            }                                                                                        \
        } else {                                                                                     \
            for (; j + L <= n; j += L) {                                                             \
                __builtin_memcpy(&d, dy + j, sizeof d);                                              \
                a = c0 * d;                                                                          \
                b = c1 * d;                                                                          \
                __builtin_memcpy(g0 + j, &a, sizeof a);                                              \
                __builtin_memcpy(g1 + j, &b, sizeof b);                                              \
            }                                                                                        \
            for (; j < n; j++) {                                                                     \
                T v = dy[j];                                                                         \
                g0[j] = c0 * v;                                                                      \
                g1[j] = c1 * v;                                                                      \
            }                                                                                        \
        }                                                                                            \
    }
    CAFFE_ELT2_BWD(caffe_elt2_bwd_f, float, caffe_elt_v16f, 16)
    CAFFE_ELT2_BWD(caffe_elt2_bwd_d, double, caffe_elt_v8d, 8)
    /* the same products, both diffs by non-temporal stores (CAFFE_STREAM2 above) */
    #define CAFFE_ELT2_BWD_ELEM(i, j) (g[i][j] = (prod ? xo[i][j] : c[i]) * dy[j])
    #define CAFFE_ELT2_BWD_LINE_F(i, j)                                                                           \
        for (ptrdiff_t v_ = (j); v_ < (j) + 16; v_ += 8)                                                          \
            _mm256_stream_ps(g[i] + v_, _mm256_mul_ps(prod ? _mm256_loadu_ps(xo[i] + v_) : _mm256_set1_ps(c[i]),  \
                                                      _mm256_loadu_ps(dy + v_)))
    #define CAFFE_ELT2_BWD_LINE_D(i, j)                                                                           \
        for (ptrdiff_t v_ = (j); v_ < (j) + 8; v_ += 4)                                                           \
            _mm256_stream_pd(g[i] + v_, _mm256_mul_pd(prod ? _mm256_loadu_pd(xo[i] + v_) : _mm256_set1_pd(c[i]),  \
                                                      _mm256_loadu_pd(dy + v_)))
    static inline void caffe_elt2_bwd_stream_f(float* g0, float* g1, const float* x0, const float* x1,
                                               const float* dy, float c0, float c1, int prod, ptrdiff_t n) {
        float* g[2] = {g0, g1};
        const float* xo[2] = {x1, x0};  /* (the other bottom) */
        const float c[2] = {c0, c1};
        CAFFE_STREAM2(4, g0, g1, n, g0 == dy ? 0 : 1, CAFFE_ELT2_BWD_ELEM, CAFFE_ELT2_BWD_LINE_F);
    }
    static inline void caffe_elt2_bwd_stream_d(double* g0, double* g1, const double* x0, const double* x1,
                                               const double* dy, double c0, double c1, int prod, ptrdiff_t n) {
        double* g[2] = {g0, g1};
        const double* xo[2] = {x1, x0};
        const double c[2] = {c0, c1};
        CAFFE_STREAM2(8, g0, g1, n, g0 == dy ? 0 : 1, CAFFE_ELT2_BWD_ELEM, CAFFE_ELT2_BWD_LINE_D);
    }
    #else
    #define CAFFE_ELT2_BWD_VECTOR 0
    static inline void caffe_elt2_bwd_stream_f(float* g0, float* g1, const float* x0, const float* x1,
                                               const float* dy, float c0, float c1, int prod, ptrdiff_t n) {}
    static inline void caffe_elt2_bwd_stream_d(double* g0, double* g1, const double* x0, const double* x1,
                                               const double* dy, double c0, double c1, int prod, ptrdiff_t n) {}
    static inline void caffe_elt2_bwd_f(float* g0, float* g1, const float* x0, const float* x1, const float* dy,
                                        float c0, float c1, int prod, ptrdiff_t n) {}
    static inline void caffe_elt2_bwd_d(double* g0, double* g1, const double* x0, const double* x1,
                                        const double* dy, double c0, double c1, int prod, ptrdiff_t n) {}
    #endif
    """
    bint CAFFE_ELT2_BWD_VECTOR
    void caffe_elt2_bwd_f(float* g0, float* g1, const float* x0, const float* x1, const float* dy, float c0,
                          float c1, int prod, Py_ssize_t n) nogil
    void caffe_elt2_bwd_d(double* g0, double* g1, const double* x0, const double* x1, const double* dy, double c0,
                          double c1, int prod, Py_ssize_t n) nogil
    void caffe_elt2_bwd_stream_f(float* g0, float* g1, const float* x0, const float* x1, const float* dy, float c0,
                                 float c1, int prod, Py_ssize_t n) nogil
    void caffe_elt2_bwd_stream_d(double* g0, double* g1, const double* x0, const double* x1, const double* dy,
                                 double c0, double c1, int prod, Py_ssize_t n) nogil


cdef void _eltwise_bwd(int op, real** xs, real** dxs, const double* coeff, int k, bint stable,
                       const real* y, const real* dy, const int* mask, Py_ssize_t lo,
                       Py_ssize_t n, bint stream) noexcept nogil:
    # A local copy of the top diff: a bottom diff may be the top diff (in place).
    cdef real d[CHUNK]
    cdef Py_ssize_t j
    cdef int i, o
    cdef bint first
    cdef real ci
    cdef real* g
    cdef real* g1
    cdef const real* xo
    cdef const real* dl
    cdef const int* ml
    cdef real v
    if op == MAX and k == 2 and dxs[0] != NULL and dxs[1] != NULL:
        if (CAFFE_STREAM2_BUILD and stream and dxs[0] != dxs[1]
                and (<size_t>dxs[0] | <size_t>dxs[1]) % sizeof(real) == 0):
            if real is float:
                caffe_max2_bwd_stream_f(dxs[0] + lo, dxs[1] + lo, dy + lo, mask + lo, n)
            else:
                caffe_max2_bwd_stream_d(dxs[0] + lo, dxs[1] + lo, dy + lo, mask + lo, n)
            caffe_store_fence()
            return
        # one direct pass: element j of both diffs is written after dy[j] and mask[j] are read
        if CAFFE_MAX2_BWD_AND:
            if real is float:
                caffe_max2_bwd_f(dxs[0] + lo, dxs[1] + lo, dy + lo, mask + lo, n)
            else:
                caffe_max2_bwd_d(dxs[0] + lo, dxs[1] + lo, dy + lo, mask + lo, n)
            return
        g = dxs[0] + lo
        g1 = dxs[1] + lo
        dl = dy + lo
        ml = mask + lo
        for j in range(n):
            v = dl[j]
            o = ml[j]
            g[j] = v if o == 0 else 0
            g1[j] = v if o == 1 else 0
        return
    if (CAFFE_ELT2_BWD_VECTOR and k == 2 and dxs[0] != NULL and dxs[1] != NULL
            and (op == SUM or (op == PROD and stable))):
        if stream and dxs[0] != dxs[1] and (<size_t>dxs[0] | <size_t>dxs[1]) % sizeof(real) == 0:
            if real is float:
                caffe_elt2_bwd_stream_f(dxs[0] + lo, dxs[1] + lo, xs[0] + lo if op == PROD else NULL,
                                        xs[1] + lo if op == PROD else NULL, dy + lo,
                                        <float>coeff[0] if op == SUM else 0, <float>coeff[1] if op == SUM else 0,
                                        op == PROD, n)
            else:
                caffe_elt2_bwd_stream_d(dxs[0] + lo, dxs[1] + lo, xs[0] + lo if op == PROD else NULL,
                                        xs[1] + lo if op == PROD else NULL, dy + lo, coeff[0] if op == SUM else 0,
                                        coeff[1] if op == SUM else 0, op == PROD, n)
            caffe_store_fence()
            return
        if real is float:
            caffe_elt2_bwd_f(dxs[0] + lo, dxs[1] + lo, xs[0] + lo if op == PROD else NULL,
                             xs[1] + lo if op == PROD else NULL, dy + lo, <float>coeff[0] if op == SUM else 0,
                             <float>coeff[1] if op == SUM else 0, op == PROD, n)
        else:
            caffe_elt2_bwd_d(dxs[0] + lo, dxs[1] + lo, xs[0] + lo if op == PROD else NULL,
                             xs[1] + lo if op == PROD else NULL, dy + lo, coeff[0] if op == SUM else 0,
                             coeff[1] if op == SUM else 0, op == PROD, n)
        return
    memcpy(d, dy + lo, n * sizeof(real))
    for i in range(k):
        if dxs[i] == NULL:
            continue
        g = dxs[i] + lo
        if op == SUM:
            ci = <real>coeff[i]
            for j in range(n):
                g[j] = ci * d[j]
        elif op == MAX:
            for j in range(n):
                g[j] = d[j] if mask[lo + j] == i else 0
        elif stable:  # the product of the other bottoms, in bottom order, times the top diff
            first = True
            for o in range(k):
                if o == i:
                    continue
                xo = xs[o] + lo
                if first:
                    memcpy(g, xo, n * sizeof(real))
                    first = False
                else:
                    for j in range(n):
                        g[j] = g[j] * xo[j]
            for j in range(n):
                g[j] = g[j] * d[j]
        else:
            xo = xs[i] + lo
            for j in range(n):
                g[j] = y[lo + j] / xo[j] * d[j]


def eltwise_forward(int op, list bottoms, const double[::1] coeff, real[::1] y, int[::1] mask):
    """y = PROD / SUM (coeff per bottom) / MAX (argmax into mask) of the bottoms (k >= 2)."""
    cdef int k = len(bottoms), i
    cdef Py_ssize_t n = y.shape[0], ch, lo, m
    if k < 2:
        raise ValueError("elementwise kernel: Eltwise needs at least two bottoms")
    if n == 0:
        return
    if op == SUM:
        _need(coeff.shape[0], k, "coeff")
    if op == MAX:
        _need(mask.shape[0], n, "mask")
    cdef const real[::1] view
    cdef bint stream = n * <Py_ssize_t>sizeof(real) >= _stream_min_bytes
    cdef real** xs = <real**> malloc(k * sizeof(real*))
    try:
        for i in range(k):
            view = bottoms[i]
            _need(view.shape[0], n, f"bottom[{i}]")
            xs[i] = <real*> &view[0]  # read only
        with nogil:
            for ch in prange((n + CHUNK - 1) // CHUNK, schedule="dynamic", chunksize=4, num_threads=_threads(n * k)):
                lo = ch * CHUNK
                m = n - lo if n - lo < CHUNK else CHUNK
                _eltwise_fwd(op, xs, &coeff[0] if op == SUM else NULL, k, &y[0],
                             &mask[0] if op == MAX else NULL, lo, m, stream)
    finally:
        free(xs)


def eltwise_backward(int op, list bottoms, list bottom_diffs, const double[::1] coeff, const real[::1] y,
                     const real[::1] dy, const int[::1] mask, bint stable_prod_grad):
    """The bottom diffs (None: not wanted) of Eltwise; PROD reads the bottoms (and y unless stable)."""
    cdef int k = len(bottoms), i
    cdef Py_ssize_t n = dy.shape[0], ch, lo, m
    if n == 0:
        return
    if len(bottom_diffs) != k:
        raise ValueError("elementwise kernel: one bottom diff (or None) per bottom")
    if op == SUM:
        _need(coeff.shape[0], k, "coeff")
    if op == MAX:
        _need(mask.shape[0], n, "mask")
    if op == PROD and not stable_prod_grad:
        _need(y.shape[0], n, "top data")
    cdef const real[::1] cview
    cdef real[::1] view
    cdef bint stream = n * <Py_ssize_t>sizeof(real) >= _stream_min_bytes
    cdef real** xs = <real**> malloc(k * sizeof(real*))
    cdef real** dxs = <real**> malloc(k * sizeof(real*))
    try:
        for i in range(k):
            xs[i] = NULL
            if op == PROD:
                cview = bottoms[i]
                _need(cview.shape[0], n, f"bottom[{i}]")
                xs[i] = <real*> &cview[0]  # read only
            dxs[i] = NULL
            if bottom_diffs[i] is not None:
                view = bottom_diffs[i]
                _need(view.shape[0], n, f"bottom[{i}] diff")
                dxs[i] = &view[0]
        with nogil:
            for ch in prange((n + CHUNK - 1) // CHUNK, schedule="dynamic", chunksize=4, num_threads=_threads(n * k)):
                lo = ch * CHUNK
                m = n - lo if n - lo < CHUNK else CHUNK
                _eltwise_bwd(op, xs, dxs, &coeff[0] if op == SUM else NULL, k, stable_prod_grad,
                             &y[0] if y.shape[0] else NULL, &dy[0], &mask[0] if op == MAX else NULL, lo, m,
                             stream)
    finally:
        free(xs)
        free(dxs)


# -- Dropout -------------------------------------------------------------------------------------
# The mask comes from SplitMix64 (Steele, Lea & Flood 2014): output number j + 1 of the stream
# started at `seed` gives elements 4j .. 4j + 3, 16 bits each (lowest first); an element is kept
# when its 16 bits are >= threshold (= round(ratio * 2^16): P(keep) = 1 - ratio within 2^-17). It
# depends only on (seed, index): the same on any thread count, and reproducible in NumPy
# (caffe.layers.dropout.mask_reference).

include "_splitmix.pxi"


cdef extern from *:
    """
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    #define CAFFE_DROPOUT_LE 1
    #else
    #define CAFFE_DROPOUT_LE 0
    #endif
    """
    bint CAFFE_DROPOUT_LE


cdef void _dropout_piece(const real* x, real* y, uint8_t* mask, Py_ssize_t lo, Py_ssize_t n,
                         uint64_t seed, uint32_t threshold, real scale, bint apply) noexcept nogil:
    # lo is a multiple of 4 (CHUNK is), so a SplitMix64 output never straddles two pieces. The piece's
    # SplitMix64 outputs go to a buffer first; on a little-endian machine their 16-bit fields, lowest
    # first, are then the buffer read as uint16, so the comparisons run 16 to a vector (extracting and
    # comparing each field of a 64-bit lane had cost more than the generator).
    cdef uint64_t bits[CHUNK_QUADS]
    cdef const uint16_t* h = <const uint16_t*> bits
    cdef Py_ssize_t p, q, n4 = n // 4
    cdef uint64_t r, t = threshold
    cdef uint16_t t16
    cdef uint64_t first = <uint64_t>(lo // 4 + 1)
    cdef uint8_t* mk = mask + lo
    if CAFFE_DROPOUT_LE and n <= 4 * CHUNK_QUADS:
        for p in range((n + 3) // 4):
            bits[p] = caffe_splitmix64(seed + (first + <uint64_t>p) * CAFFE_SPLITMIX_GAMMA)
        if threshold > 65535:  # (ratio within 2^-17 of 1: nothing is kept)
            for p in range(n):
                mk[p] = 0
        else:
            t16 = <uint16_t>threshold
            for p in range(n):
                mk[p] = h[p] >= t16
    else:
        for p in range(n4):  # whole groups of four: no branch, so the compiler can vectorize it
            r = caffe_splitmix64(seed + (first + <uint64_t>p) * CAFFE_SPLITMIX_GAMMA)
            mk[4 * p] = (r & 0xFFFF) >= t
            mk[4 * p + 1] = ((r >> 16) & 0xFFFF) >= t
            mk[4 * p + 2] = ((r >> 32) & 0xFFFF) >= t
            mk[4 * p + 3] = (r >> 48) >= t
        if n4 * 4 < n:
            r = caffe_splitmix64(seed + (first + <uint64_t>n4) * CAFFE_SPLITMIX_GAMMA)
            for q in range(n - n4 * 4):
                mk[4 * n4 + q] = ((r >> (16 * q)) & 0xFFFF) >= t
    if apply:
        for p in range(n):
            y[lo + p] = x[lo + p] * (scale if mk[p] else 0)


def dropout_forward(const real[::1] x, real[::1] y, uint8_t[::1] mask, uint64_t seed, uint32_t threshold,
                    double scale, bint apply=True):
    """mask = SplitMix64 16-bit draws >= threshold; y = x * (mask ? scale : 0) (apply=False: the mask only)."""
    cdef Py_ssize_t n = mask.shape[0], ch, lo, m
    if n == 0:
        return
    if threshold > 65536:
        raise ValueError(f"elementwise kernel: the dropout threshold {threshold} exceeds 2^16")
    cdef const real* xp = NULL
    cdef real* yp = NULL
    if apply:
        _need(x.shape[0], n, "bottom")
        _need(y.shape[0], n, "top")
        xp = &x[0]
        yp = &y[0]
    with nogil:
        for ch in prange((n + CHUNK - 1) // CHUNK, schedule="dynamic", chunksize=4, num_threads=_threads(n)):
            lo = ch * CHUNK
            m = n - lo if n - lo < CHUNK else CHUNK
            _dropout_piece(xp, yp, &mask[0], lo, m, seed, threshold, <real>scale, apply)


def dropout_backward(const real[::1] dy, const uint8_t[::1] mask, real[::1] dx, double scale):
    """dx = dy * (mask ? scale : 0)."""
    cdef Py_ssize_t n = dy.shape[0], i, ch, lo, m
    cdef real s = <real>scale
    if n == 0:
        return
    _need(mask.shape[0], n, "mask")
    _need(dx.shape[0], n, "bottom diff")
    cdef const real* dyp = &dy[0]
    cdef const uint8_t* mp = &mask[0]
    cdef real* dxp = &dx[0]
    with nogil:
        for ch in prange((n + CHUNK - 1) // CHUNK, schedule="dynamic", chunksize=4, num_threads=_threads(n)):
            lo = ch * CHUNK
            m = n - lo if n - lo < CHUNK else CHUNK
            for i in range(lo, lo + m):
                dxp[i] = dyp[i] * (s if mp[i] else 0)


# -- block copies (Concat, Slice) -----------------------------------------------------------------

def copy_rows(const real[::1] src, Py_ssize_t src_offset, Py_ssize_t src_stride, real[::1] dst,
              Py_ssize_t dst_offset, Py_ssize_t dst_stride, Py_ssize_t rows, Py_ssize_t row_len):
    """dst[dst_offset + r * dst_stride + (0..row_len)] = src[src_offset + r * src_stride + (0..row_len)]."""
    cdef Py_ssize_t r, piece, t, lo, m
    if rows <= 0 or row_len <= 0:
        return
    _need(src.shape[0], src_offset + (rows - 1) * src_stride + row_len, "source")
    _need(dst.shape[0], dst_offset + (rows - 1) * dst_stride + row_len, "destination")
    # Long rows are cut in pieces so that one row (Concat on axis 0) still uses every thread.
    piece = 65536 if row_len > 65536 else row_len
    cdef Py_ssize_t per_row = (row_len + piece - 1) // piece
    cdef const real* s = &src[0]
    cdef real* d = &dst[0]
    with nogil:
        for t in prange(rows * per_row, schedule="dynamic", chunksize=1 if piece > 4096 else 16,
                        num_threads=_threads(rows * row_len)):
            r = t // per_row
            lo = (t % per_row) * piece
            m = row_len - lo if row_len - lo < piece else piece
            memcpy(d + dst_offset + r * dst_stride + lo, s + src_offset + r * src_stride + lo, m * sizeof(real))

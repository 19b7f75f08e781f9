# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math
# distutils: libraries = m
"""Softmax over the channel axis of an (outer, C, inner) array, forward and backward, and
SoftmaxWithLoss's gradient; OpenMP-parallel over work items (o, piece of inner).

For each position: the max over c is subtracted before exp (never overflows), the sum over c
is taken in double (over blocks of SUM_BLOCK channels summed in x's precision), y = e / sum.
Backward: dx = (dy - sum_c dy * y) * y with the sum taken the same way.
A piece holds at most PIECE / C positions' C values (in cache, L2 or L3, between the kernel's passes), so
main memory is read and written once.
"""
from cython.parallel cimport prange
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport free, malloc
from libc.float cimport FLT_MIN

include "_threads.pxi"

ctypedef fused real:
    float
    double

include "_vmath.pxi"

# exp of softmax's arguments (x - max <= 0) in float32, where the build has FMA (softmax_avx2): libmvec's
# expf cost more than the rest of the forward together. Cephes' expf with FMA: x = n ln2 + r (n by
# rounding with 1.5 * 2^23, whose bits also give n), a degree-6 polynomial in r, times 2^n built in the
# exponent bits; within 1 ulp of the correctly rounded exp (a test checks it against float64). Below
# ln(FLT_MIN) the result is 0 (a denormal in libm, < 1.2e-38); NaN stays NaN. Other builds use libm's.
cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    #include <math.h>
    #if defined(__FMA__)
    #define CAFFE_SOFTMAX_FAST_EXP 1
    static inline float caffe_softmax_expf(float x) {
        const float big = 12582912.0f;  /* 1.5 * 2^23 */
        float xc = x < -88.0f ? -88.0f : x;  /* (NaN passes) */
        float t = fmaf(xc, 1.44269504088896341f, big);
        uint32_t tb, sb;
        float fx, r, p, scale;
        memcpy(&tb, &t, 4);
        fx = t - big;
        r = fmaf(fx, -0.693359375f, xc);
        r = fmaf(fx, 2.12194440e-4f, r);
        p = fmaf(1.9875691500e-4f, r, 1.3981999507e-3f);
        p = fmaf(p, r, 8.3334519073e-3f);
        p = fmaf(p, r, 4.1665795894e-2f);
        p = fmaf(p, r, 1.6666665459e-1f);
        p = fmaf(p, r, 5.0000001201e-1f);
        p = fmaf(p, r * r, r) + 1.0f;
        sb = (tb - 0x4B400000u + 127u) << 23;
        memcpy(&scale, &sb, 4);
        return x < -87.33654f ? 0.0f : p * scale;
    }
    #else
    #define CAFFE_SOFTMAX_FAST_EXP 0
    static inline float caffe_softmax_expf(float x) { return expf(x); }
    #endif
    """
    bint CAFFE_SOFTMAX_FAST_EXP
    float caffe_softmax_expf(float) nogil


cdef inline real _sexp(real v) noexcept nogil:
    """exp(v) for v <= 0 (or NaN): the FMA kernel above in float32 where built, libm otherwise."""
    if real is float:
        if CAFFE_SOFTMAX_FAST_EXP:
            return caffe_softmax_expf(v)
    return _exp(v)


def exp_nonpositive(const real[::1] x, real[::1] y):
    """y = the exp the softmax kernels use (for x <= 0), for the tests."""
    cdef Py_ssize_t i
    if y.shape[0] < x.shape[0]:
        raise ValueError("softmax kernel: y is shorter than x")
    for i in range(x.shape[0]):
        y[i] = _sexp(x[i])

cdef enum:
    # elements (positions x channels) per work item. 131072 (512 KB of float32 x; its y beside it in L2 and
    # L3), not 32768 (128 KB): with 256 channels the shorter pieces read each channel row in runs of 512
    # bytes, and two threads then ran slower than one (13.0 against 9.0 ms at 8x256x56x56); these took
    # 0.60-0.80x the time forward and 0.76x backward (session 8, bench in bench/README.md). 524288 measured
    # the same within noise.
    PIECE = 131072
    # Channels summed in x's precision before the partial sums go into the double totals (over
    # positions: the sums of exp and of dy * y). Converting every float32 term to double cost a
    # sixth of the forward; a float32 partial of 16 terms is within ~1e-6 of exact (relative to the
    # sum of the terms' magnitudes).
    SUM_BLOCK = 16


def _need(Py_ssize_t have, Py_ssize_t need, str what):
    if have < need:
        raise ValueError(f"softmax kernel: {what} holds {have} elements, needs {need}")


cdef Py_ssize_t _piece(Py_ssize_t C, Py_ssize_t inner) noexcept nogil:
    # At least 64 positions: each channel row of a piece is then whole cache lines.
    cdef Py_ssize_t p = PIECE // C if C < PIECE else 1
    if p < 64:
        p = 64
    return p if p < inner else inner


cdef inline double _piece_loss(const real* y, Py_ssize_t inner, Py_ssize_t P, const int64_t* label,
                               const uint8_t* valid) noexcept nogil:
    """-sum over the piece's valid positions j of log(max(y[label[j] * inner + j], FLT_MIN)) (Caffe's
    std::max: NaN stays NaN), read while the piece's probabilities are still in cache."""
    cdef Py_ssize_t j
    cdef double total = 0
    cdef real p
    for j in range(P):
        if valid[j]:
            p = y[label[j] * inner + j]
            p = <real>FLT_MIN if p < FLT_MIN else p
            total -= _log(p)
    return total


cdef void _fwd_row(const real* x, real* y, Py_ssize_t C) noexcept nogil:
    # inner == 1: one contiguous row of C
    cdef Py_ssize_t c, C4 = C - C % 4
    cdef real m = x[0], e
    cdef double s0 = 0, s1 = 0, s2 = 0, s3 = 0
    cdef real s
    for c in range(1, C):
        m = x[c] if x[c] > m else m
    for c in range(C):
        y[c] = _sexp(x[c] - m)
    for c in range(0, C4, 4):
        s0 += y[c]
        s1 += y[c + 1]
        s2 += y[c + 2]
        s3 += y[c + 3]
    for c in range(C4, C):
        s0 += y[c]
    s = <real>((s0 + s1) + (s2 + s3))
    for c in range(C):
        y[c] = y[c] / s


cdef void _fwd_piece(const real* x, real* y, Py_ssize_t C, Py_ssize_t inner, Py_ssize_t P) noexcept nogil:
    # x / y point at channel 0 of P positions; channel stride inner
    cdef real* m = <real*> malloc(2 * P * sizeof(real))
    cdef double* s = <double*> malloc(P * sizeof(double))
    cdef Py_ssize_t c, c0, c1, j
    cdef const real* xc
    cdef real* yc
    cdef real* f
    cdef real v
    if m == NULL or s == NULL:
        free(m)
        free(s)
        return
    f = m + P
    for j in range(P):
        m[j] = x[j]
        s[j] = 0
    for c in range(1, C):
        xc = x + c * inner
        for j in range(P):
            v = xc[j]
            m[j] = v if v > m[j] else m[j]
    for c0 in range(0, C, 16):  # SUM_BLOCK
        c1 = c0 + SUM_BLOCK if c0 + SUM_BLOCK < C else C
        for j in range(P):
            f[j] = 0
        for c in range(c0, c1):
            xc = x + c * inner
            yc = y + c * inner
            for j in range(P):
                v = _sexp(xc[j] - m[j])
                yc[j] = v
                f[j] += v
        for j in range(P):
            s[j] += f[j]
    for j in range(P):
        m[j] = <real>s[j]
    for c in range(C):
        yc = y + c * inner
        for j in range(P):
            yc[j] = yc[j] / m[j]
    free(m)
    free(s)


cdef void _forward(const real* xp, real* yp, Py_ssize_t outer, Py_ssize_t C, Py_ssize_t inner,
                   const int64_t* label, const uint8_t* valid, double* part) noexcept nogil:
    # label / valid (outer, inner) and part (one slot per work item) NULL: the softmax alone
    cdef Py_ssize_t n = outer * C * inner, t, o, lo, m, P, pieces
    P = _piece(C, inner)
    pieces = (inner + P - 1) // P
    if inner == 1:
        for o in prange(outer, schedule="dynamic", chunksize=_grab(C), num_threads=_threads(n)):
            _fwd_row(xp + o * C, yp + o * C, C)
            if label != NULL:
                part[o] = _piece_loss(yp + o * C, 1, 1, label + o, valid + o)
    else:
        for t in prange(outer * pieces, schedule="dynamic", chunksize=_grab(C * P), num_threads=_threads(n)):
            o = t // pieces
            lo = (t % pieces) * P
            m = inner - lo if inner - lo < P else P
            _fwd_piece(xp + o * C * inner + lo, yp + o * C * inner + lo, C, inner, m)
            if label != NULL:
                part[t] = _piece_loss(yp + o * C * inner + lo, inner, m, label + o * inner + lo,
                                      valid + o * inner + lo)


def softmax_forward(const real[::1] x, real[::1] y, Py_ssize_t outer, Py_ssize_t C, Py_ssize_t inner):
    """y = softmax of x over C, for (outer, C, inner)."""
    cdef Py_ssize_t n = outer * C * inner
    if n == 0:
        return
    _need(x.shape[0], n, "bottom")
    _need(y.shape[0], n, "top")
    with nogil:
        _forward(&x[0], &y[0], outer, C, inner, NULL, NULL, NULL)


def softmax_loss_forward(const real[::1] x, real[::1] prob, const int64_t[::1] label, const uint8_t[::1] valid,
                         Py_ssize_t outer, Py_ssize_t C, Py_ssize_t inner):
    """prob = softmax of x over C, and (returned, double) the sum over the valid positions of
    -log(max(prob[label], FLT_MIN)): Caffe's SoftmaxWithLoss before the normalizer. label / valid are
    (outer, inner), a label only read where valid; each work item's sum is taken while its piece is
    in cache, and the items' sums are added in order (the same result on any number of threads)."""
    cdef Py_ssize_t n = outer * C * inner, q, items
    cdef double total = 0
    cdef double* part
    if n == 0:
        return 0.0
    _need(x.shape[0], n, "bottom")
    _need(prob.shape[0], n, "prob")
    _need(label.shape[0], outer * inner, "label")
    _need(valid.shape[0], outer * inner, "valid")
    for q in range(outer * inner):
        if valid[q] and (label[q] < 0 or label[q] >= C):
            raise ValueError(f"softmax kernel: label {label[q]} out of range [0, {C})")
    items = outer if inner == 1 else outer * ((inner + _piece(C, inner) - 1) // _piece(C, inner))
    part = <double*> malloc(items * sizeof(double))
    if part == NULL:
        raise MemoryError()
    try:
        with nogil:
            _forward(&x[0], &prob[0], outer, C, inner, &label[0], &valid[0], part)
        for q in range(items):
            total += part[q]
    finally:
        free(part)
    return total


cdef void _bwd_piece(const real* y, const real* dy, real* dx, Py_ssize_t C, Py_ssize_t inner,
                     Py_ssize_t P) noexcept nogil:
    cdef double* s = <double*> malloc(P * sizeof(double) + P * sizeof(real))
    cdef real* sr
    cdef real* f
    cdef Py_ssize_t c, c0, c1, j, o
    if s == NULL:
        return
    f = <real*>(s + P)
    for j in range(P):
        s[j] = 0
    for c0 in range(0, C, 16):  # SUM_BLOCK
        c1 = c0 + SUM_BLOCK if c0 + SUM_BLOCK < C else C
        for j in range(P):
            f[j] = 0
        for c in range(c0, c1):
            o = c * inner
            for j in range(P):
                f[j] += dy[o + j] * y[o + j]
        for j in range(P):
            s[j] += f[j]
    sr = <real*> s  # reuse the buffer: the sums in x's precision
    for j in range(P):
        sr[j] = <real>s[j]
    for c in range(C):
        o = c * inner
        for j in range(P):
            dx[o + j] = (dy[o + j] - sr[j]) * y[o + j]
    free(s)


def softmax_backward(const real[::1] y, const real[::1] dy, real[::1] dx, Py_ssize_t outer, Py_ssize_t C,
                     Py_ssize_t inner):
    """dx = (dy - sum_c dy * y) * y (dx may be dy: in place)."""
    cdef Py_ssize_t n = outer * C * inner, t, o, lo, P, pieces
    if n == 0:
        return
    for buf, what in ((y, "top"), (dy, "top diff"), (dx, "bottom diff")):
        _need(len(buf), n, what)
    P = _piece(C, inner)
    pieces = (inner + P - 1) // P
    with nogil:
        for t in prange(outer * pieces, schedule="dynamic", chunksize=_grab(C * P), num_threads=_threads(n)):
            o = t // pieces
            lo = (t % pieces) * P
            _bwd_piece(&y[0] + o * C * inner + lo, &dy[0] + o * C * inner + lo, &dx[0] + o * C * inner + lo,
                       C, inner, inner - lo if inner - lo < P else P)


def softmax_loss_backward(const real[::1] prob, const int64_t[::1] label, const uint8_t[::1] valid,
                          real[::1] dx, Py_ssize_t outer, Py_ssize_t C, Py_ssize_t inner, double scale):
    """dx = (prob - onehot(label)) * valid * scale over (outer, C, inner); label / valid are (outer, inner)
    (a label is only read where valid)."""
    cdef Py_ssize_t n = outer * C * inner, t, c, j, o, q
    cdef real s = <real>scale, v, h
    cdef int64_t lab
    if n == 0:
        return
    _need(prob.shape[0], n, "prob")
    _need(dx.shape[0], n, "bottom diff")
    _need(label.shape[0], outer * inner, "label")
    _need(valid.shape[0], outer * inner, "valid")
    with nogil:
        for t in prange(outer * C, schedule="dynamic", chunksize=_grab(inner), num_threads=_threads(n)):
            o = t // C
            c = t % C
            q = t * inner
            for j in range(inner):
                v = <real>valid[o * inner + j]
                lab = label[o * inner + j]
                h = 1 if (v != 0 and lab == c) else 0
                dx[q + j] = (prob[q + j] - h) * v * s

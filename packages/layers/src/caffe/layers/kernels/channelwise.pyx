# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math
"""Channel-wise kernels on an (outer, dim, inner) array: Scale, Bias, PReLU, BatchNorm's global-stats pass.

A per-channel operand p[c] (c in [0, dim)) is broadcast over outer and inner. The work is cut
into items (o, c, piece of inner of at most CHUNK elements), spread over the OpenMP threads;
per-channel sums (the parameter gradients) are summed in double per item, then over the
items of a channel in a fixed order, so results do not depend on the thread count. Each
kernel makes one pass over memory; an output element is written after every input at its
position is read, so in place (top is bottom, bottom diff is top diff) is safe.
"""
from cython.parallel cimport prange
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

include "_threads.pxi"

ctypedef fused real:
    float
    double

cdef enum:
    CHUNK = 16384

cdef enum Op:
    AFFINE = 0  # y = x * s[c] + b[c] (either may be absent); backward sums dy * x and dy
    PRELU = 1   # y = x > 0 ? x : s[c] * x;  backward sums dy * x over x <= 0
    SHIFT = 2   # y = (x - b[c]) * s[c] (BatchNorm with global statistics)


def _need(Py_ssize_t have, Py_ssize_t need, str what):
    if have < need:
        raise ValueError(f"channelwise kernel: {what} holds {have} elements, needs {need}")


cdef inline const real* _opt(const real[::1] a, Py_ssize_t need, str what) except? NULL:
    """The data pointer of an optional operand (NULL when passed empty), checked for length."""
    if a.shape[0] == 0:
        return NULL
    _need(a.shape[0], need, what)
    return &a[0]


cdef void _fwd_item(int op, const real* x, real* y, real* save, Py_ssize_t n, const real* s,
                    const real* b, Py_ssize_t c) noexcept nogil:
    cdef Py_ssize_t i
    cdef real sv = s[c] if s != NULL else 1
    cdef real bv = b[c] if b != NULL else 0
    cdef real v
    if save != NULL:
        memcpy(save, x, n * sizeof(real))
    if op == AFFINE:
        if s != NULL and b != NULL:
            for i in range(n):
                y[i] = x[i] * sv + bv
        elif s != NULL:
            for i in range(n):
                y[i] = x[i] * sv
        else:
            for i in range(n):
                y[i] = x[i] + bv
    elif op == PRELU:
        for i in range(n):
            v = x[i]
            y[i] = v if v > 0 else sv * v
    else:
        for i in range(n):
            y[i] = (x[i] - bv) * sv


def channel_forward(int op, const real[::1] x, const real[::1] s, const real[::1] b, real[::1] y,
                    real[::1] save, Py_ssize_t outer, Py_ssize_t dim, Py_ssize_t inner):
    """y = op(x, s[c], b[c]) over (outer, dim, inner); s / b / save may be passed empty (absent).
    save receives a copy of x first (an in-place layer keeps its bottom for backward)."""
    cdef Py_ssize_t n = outer * dim * inner, t, p, c, lo, m
    if n == 0:
        return
    _need(x.shape[0], n, "bottom")
    _need(y.shape[0], n, "top")
    cdef const real* sp = _opt(s, dim, "scale")
    cdef const real* bp = _opt(b, dim, "bias")
    cdef real* svp = NULL
    if save.shape[0]:
        _need(save.shape[0], n, "save")
        svp = &save[0]
    if (op == PRELU and sp == NULL) or (op == SHIFT and (sp == NULL or bp == NULL)):
        raise ValueError("channelwise kernel: missing per-channel operand")
    cdef Py_ssize_t pieces = (inner + CHUNK - 1) // CHUNK
    cdef const real* xp = &x[0]
    cdef real* yp = &y[0]
    with nogil:
        for t in prange(outer * dim * pieces, schedule="dynamic", chunksize=_grab(inner),
                       num_threads=_threads(n)):
            p = t // pieces  # plane o * dim + c
            c = p % dim
            lo = p * inner + (t % pieces) * CHUNK
            m = (t % pieces) * CHUNK
            m = inner - m if inner - m < CHUNK else CHUNK
            _fwd_item(op, xp + lo, yp + lo, svp + lo if svp != NULL else NULL, m, sp, bp, c)


cdef enum:
    LANES = 8  # running sums per quantity: independent chains the compiler keeps in SIMD registers


# Scale's / Bias's / BatchNorm's backward sums over n8 (a multiple of LANES) elements, written with GCC's vector
# types: lane j of a (8 doubles) sums dy[i + j] * x[i + j] (double products) and lane j of b sums dy[i + j], i
# in order, exactly as the LANES-array loops of the baseline source did (so the same bits); dx = dy * s on the
# way (skipped when dx is NULL; a is left alone when x is NULL). As plain C loops over the lane arrays GCC
# vectorized the dy-only sums but left the float-to-double products scalar (~2.4 cycles an element: slower
# than memory on 2 threads). A vector of dy is loaded before its dx is stored: in place (dx == dy) is safe.
# Only in the AVX-512 build (CAFFE_CW_VECTOR_SUMS): in the SSE2 baseline GCC splits the 8-wide vectors and
# the conversions badly (its Bias backward took 2.8x the loops' time), so the baseline keeps the loops below.
cdef extern from *:
    """
    #include <stddef.h>
    #if defined(__AVX512F__) && defined(__GNUC__)
    #define CAFFE_CW_VECTOR_SUMS 1
    typedef double caffe_cw_v8d __attribute__((vector_size(64)));
    typedef float caffe_cw_v8f __attribute__((vector_size(32)));
    static inline void caffe_cw_sums_f(const float* dy, const float* x, float* dx, ptrdiff_t n8, float sv,
                                       double* al, double* bl) {
        caffe_cw_v8d a, b;
        caffe_cw_v8f d, v;
        __builtin_memcpy(&a, al, sizeof a);
        __builtin_memcpy(&b, bl, sizeof b);
        for (ptrdiff_t i = 0; i < n8; i += 8) {
            __builtin_memcpy(&d, dy + i, sizeof d);
            caffe_cw_v8d dd = __builtin_convertvector(d, caffe_cw_v8d);
            if (x) {
                __builtin_memcpy(&v, x + i, sizeof v);
                a += dd * __builtin_convertvector(v, caffe_cw_v8d);
            }
            b += dd;
            if (dx) {
                d = d * sv;
                __builtin_memcpy(dx + i, &d, sizeof d);
            }
        }
        __builtin_memcpy(al, &a, sizeof a);
        __builtin_memcpy(bl, &b, sizeof b);
    }
    static inline void caffe_cw_sums_d(const double* dy, const double* x, double* dx, ptrdiff_t n8, double sv,
                                       double* al, double* bl) {
        caffe_cw_v8d a, b, d, v;
        __builtin_memcpy(&a, al, sizeof a);
        __builtin_memcpy(&b, bl, sizeof b);
        for (ptrdiff_t i = 0; i < n8; i += 8) {
            __builtin_memcpy(&d, dy + i, sizeof d);
            if (x) {
                __builtin_memcpy(&v, x + i, sizeof v);
                a += d * v;
            }
            b += d;
            if (dx) {
                d = d * sv;
                __builtin_memcpy(dx + i, &d, sizeof d);
            }
        }
        __builtin_memcpy(al, &a, sizeof a);
        __builtin_memcpy(bl, &b, sizeof b);
    }
    /* PReLU backward in one pass: a (8 double lanes) sums the float (double) product dy * min(x, +0), lane j
       taking i + j in order as the baseline loops do; dx = dy * (x <= 0 ? s : 1). The selects are bit masks
       (a NaN x: +0 for the sum, 1 for dx, as the loops' selects). */
    typedef int caffe_cw_v8i __attribute__((vector_size(32)));
    typedef long long caffe_cw_v8l __attribute__((vector_size(64)));
    static inline void caffe_cw_prelu_f(const float* dy, const float* x, float* dx, ptrdiff_t n8, float sv,
                                        double* al) {
        caffe_cw_v8d a;
        caffe_cw_v8f d, v, z = {0}, one = z + 1.0f, s = z + sv;
        __builtin_memcpy(&a, al, sizeof a);
        for (ptrdiff_t i = 0; i < n8; i += 8) {
            __builtin_memcpy(&d, dy + i, sizeof d);
            __builtin_memcpy(&v, x + i, sizeof v);
            caffe_cw_v8i neg = v < z, le = v <= z;
            caffe_cw_v8f mn = (caffe_cw_v8f)((caffe_cw_v8i)v & neg);
            a += __builtin_convertvector(d * mn, caffe_cw_v8d);
            caffe_cw_v8f f = (caffe_cw_v8f)(((caffe_cw_v8i)s & le) | ((caffe_cw_v8i)one & ~le));
            d = d * f;
            __builtin_memcpy(dx + i, &d, sizeof d);
        }
        __builtin_memcpy(al, &a, sizeof a);
    }
    static inline void caffe_cw_prelu_d(const double* dy, const double* x, double* dx, ptrdiff_t n8, double sv,
                                        double* al) {
        caffe_cw_v8d a, d, v, z = {0}, one = z + 1.0, s = z + sv;
        __builtin_memcpy(&a, al, sizeof a);
        for (ptrdiff_t i = 0; i < n8; i += 8) {
            __builtin_memcpy(&d, dy + i, sizeof d);
            __builtin_memcpy(&v, x + i, sizeof v);
            caffe_cw_v8l neg = v < z, le = v <= z;
            caffe_cw_v8d mn = (caffe_cw_v8d)((caffe_cw_v8l)v & neg);
            a += d * mn;
            caffe_cw_v8d f = (caffe_cw_v8d)(((caffe_cw_v8l)s & le) | ((caffe_cw_v8l)one & ~le));
            d = d * f;
            __builtin_memcpy(dx + i, &d, sizeof d);
        }
        __builtin_memcpy(al, &a, sizeof a);
    }
    #else
    #define CAFFE_CW_VECTOR_SUMS 0
    static inline void caffe_cw_prelu_f(const float* dy, const float* x, float* dx, ptrdiff_t n8, float sv,
                                        double* al) {}
    static inline void caffe_cw_prelu_d(const double* dy, const double* x, double* dx, ptrdiff_t n8, double sv,
                                        double* al) {}
    static inline void caffe_cw_sums_f(const float* dy, const float* x, float* dx, ptrdiff_t n8, float sv,
                                       double* al, double* bl) {}
    static inline void caffe_cw_sums_d(const double* dy, const double* x, double* dx, ptrdiff_t n8, double sv,
                                       double* al, double* bl) {}
    #endif
    """
    bint CAFFE_CW_VECTOR_SUMS
    void caffe_cw_prelu_f(const float* dy, const float* x, float* dx, Py_ssize_t n8, float sv, double* al) nogil
    void caffe_cw_prelu_d(const double* dy, const double* x, double* dx, Py_ssize_t n8, double sv, double* al) nogil
    void caffe_cw_sums_f(const float* dy, const float* x, float* dx, Py_ssize_t n8, float sv, double* al,
                         double* bl) nogil
    void caffe_cw_sums_d(const double* dy, const double* x, double* dx, Py_ssize_t n8, double sv, double* al,
                         double* bl) nogil


cdef void _bwd_item(int op, const real* dy, const real* x, real* dx, Py_ssize_t n, const real* s,
                    Py_ssize_t c, double* sum_dyx, double* sum_dy) noexcept nogil:
    # One pass; LANES running sums per quantity (a fixed order: results do not depend on the
    # threads). No branch on the data inside the loops (selects and min), so that they vectorize.
    # dx may be dy (in place): dy[i] is read before dx[i] is written.
    cdef Py_ssize_t i, j, n8 = n - n % LANES
    cdef double al[LANES]
    cdef double bl[LANES]
    cdef double a = 0, b = 0
    cdef real d, v, z = 0
    cdef real sv = s[c] if s != NULL else 1
    cdef bint sums = sum_dyx != NULL or sum_dy != NULL
    for j in range(LANES):
        al[j] = 0
        bl[j] = 0
    if op == PRELU and CAFFE_CW_VECTOR_SUMS and sum_dyx != NULL and dx != NULL:
        if real is float:
            caffe_cw_prelu_f(dy, x, dx, n8, sv, al)
        else:
            caffe_cw_prelu_d(dy, x, dx, n8, sv, al)
        for i in range(n8, n):
            v = x[i]
            d = dy[i]
            al[0] += d * (v if v < z else z)
            dx[i] = d * (sv if v <= 0 else 1)
    elif op == PRELU:  # sum over x <= 0 of dy * x = sum of dy * min(x, 0); then dx, from cache
        if sum_dyx != NULL:  # (a select of dx in the same loop keeps the compiler from vectorizing it)
            for i in range(0, n8, 8):  # LANES
                for j in range(LANES):
                    v = x[i + j]
                    al[j] += dy[i + j] * (v if v < z else z)
            for i in range(n8, n):
                v = x[i]
                al[0] += dy[i] * (v if v < z else z)
        if dx != NULL:
            for i in range(n):
                v = x[i]
                dx[i] = dy[i] * (sv if v <= 0 else 1)
    elif sums and CAFFE_CW_VECTOR_SUMS:
        if real is float:
            caffe_cw_sums_f(dy, x, dx, n8, sv, al, bl)
        else:
            caffe_cw_sums_d(dy, x, dx, n8, sv, al, bl)
    elif x != NULL and dx != NULL:
        for i in range(0, n8, 8):  # LANES
            for j in range(LANES):
                d = dy[i + j]
                al[j] += <double>d * x[i + j]
                bl[j] += d
                dx[i + j] = d * sv
    elif x != NULL:
        for i in range(0, n8, 8):  # LANES
            for j in range(LANES):
                d = dy[i + j]
                al[j] += <double>d * x[i + j]
                bl[j] += d
    elif sums and dx != NULL:
        for i in range(0, n8, 8):  # LANES
            for j in range(LANES):
                d = dy[i + j]
                bl[j] += d
                dx[i + j] = d * sv
    elif sums:
        for i in range(0, n8, 8):  # LANES
            for j in range(LANES):
                bl[j] += dy[i + j]
    elif dx != NULL:
        for i in range(n8):
            dx[i] = dy[i] * sv
    if op != PRELU:
        for i in range(n8, n):
            d = dy[i]
            if x != NULL:
                al[0] += <double>d * x[i]
            bl[0] += d
            if dx != NULL:
                dx[i] = d * sv
    for j in range(LANES):
        a += al[j]
        b += bl[j]
    if sum_dyx != NULL:
        sum_dyx[0] = a
    if sum_dy != NULL:
        sum_dy[0] = b


def channel_backward(int op, const real[::1] dy, const real[::1] x, const real[::1] s, real[::1] dx,
                     double[::1] sum_dyx, double[::1] sum_dy, Py_ssize_t outer, Py_ssize_t dim,
                     Py_ssize_t inner):
    """One pass over dy (and x) of (outer, dim, inner):
      AFFINE: dx = dy * s[c] (dy where s is empty); sum_dyx[c] = sum dy * x; sum_dy[c] = sum dy
      PRELU:  dx = dy * (x > 0 ? 1 : s[c]);        sum_dyx[c] = sum over x <= 0 of dy * x
    Empty dx / sum_dyx / sum_dy: not computed (AFFINE's sum_dyx needs x). Sums are in double."""
    cdef Py_ssize_t n = outer * dim * inner, t, p, c, lo, m, items, k
    cdef double acc
    if dim == 0 or outer * dim == 0:
        return
    cdef const real* sp = _opt(s, dim, "scale")
    cdef const real* xp = _opt(x, n, "bottom data") if n else NULL
    cdef real* dxp = NULL
    cdef double* s1 = &sum_dyx[0] if sum_dyx.shape[0] else NULL
    cdef double* s2 = &sum_dy[0] if sum_dy.shape[0] else NULL
    if s1 != NULL:
        _need(sum_dyx.shape[0], dim, "sum_dyx")
    if s2 != NULL:
        _need(sum_dy.shape[0], dim, "sum_dy")
    if dx.shape[0]:
        _need(dx.shape[0], n, "bottom diff")
        dxp = &dx[0]
    if op == PRELU and (sp == NULL or xp == NULL):
        raise ValueError("channelwise kernel: PReLU backward needs the slopes and the bottom data")
    if s1 != NULL and xp == NULL:
        raise ValueError("channelwise kernel: the scale gradient needs the bottom data")
    if n == 0:
        for c in range(dim):
            if s1 != NULL:
                s1[c] = 0
            if s2 != NULL:
                s2[c] = 0
        return
    _need(dy.shape[0], n, "top diff")
    cdef const real* dyp = &dy[0]
    cdef Py_ssize_t pieces = (inner + CHUNK - 1) // CHUNK
    items = outer * dim * pieces
    cdef double* part1 = <double*> malloc(items * sizeof(double)) if s1 != NULL else NULL
    cdef double* part2 = <double*> malloc(items * sizeof(double)) if s2 != NULL else NULL
    try:
        with nogil:
            for t in prange(items, schedule="dynamic", chunksize=_grab(inner), num_threads=_threads(n)):
                p = t // pieces
                c = p % dim
                lo = p * inner + (t % pieces) * CHUNK
                m = (t % pieces) * CHUNK
                m = inner - m if inner - m < CHUNK else CHUNK
                _bwd_item(op, dyp + lo, xp + lo if xp != NULL else NULL, dxp + lo if dxp != NULL else NULL,
                          m, sp, c, part1 + t if part1 != NULL else NULL, part2 + t if part2 != NULL else NULL)
        # item t = (o * dim + c) * pieces + piece: a channel's items, summed over o then piece
        for c in range(dim):
            if part1 != NULL:
                acc = 0
                for k in range(outer):
                    for t in range((k * dim + c) * pieces, (k * dim + c + 1) * pieces):
                        acc += part1[t]
                s1[c] = acc
            if part2 != NULL:
                acc = 0
                for k in range(outer):
                    for t in range((k * dim + c) * pieces, (k * dim + c + 1) * pieces):
                        acc += part2[t]
                s2[c] = acc
    finally:
        free(part1)
        free(part2)

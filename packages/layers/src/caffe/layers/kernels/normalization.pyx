# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math
# distutils: libraries = m
"""BatchNorm (batch statistics) and LRN (across channels) on the CPU, OpenMP-parallel.

BatchNorm works on (N, C, S) arrays, one channel per work item (the channel's N planes of S):
  forward   one pass for the statistics: sums of (x - K) and (x - K)^2 (blocks of 128 in x's
            precision, their totals in double: see BLOCK), K the channel's first value (a sample,
            so |mean - K| is of the order of the spread and the shifted sums lose nothing to
            cancellation); then one pass y = (x - mean) * inv_std
  backward  one pass for sum dy and sum dy * x_norm (as the forward's sums), then dx = (dy - mean dy -
            x_norm * mean(dy * x_norm)) * inv_std; x_norm is read from a saved copy or
            recomputed from x as the forward did (the same bits)
A channel of a ResNet/MobileNet batch (N * S * 4 bytes, ~100-400 KB) stays in the core's L2
cache between the two passes, so each kernel reads and writes main memory once. x_norm (kept in
place only) goes out by non-temporal stores from 4 MB up (float32): see caffe_bn_norm_stream_f.

LRN's work items are pieces of up to 4096 positions of one image (cut shorter for the threads at
small batches): the window's rows stay in cache while each channel row is read as one long run.

LRN ACROSS_CHANNELS works on (N, C, S): per image and piece of S, the window sum of x^2 over
channels [c - r, c + r] slides along c in double (add the channel entering, subtract the one
leaving), as Caffe's CrossChannelForward_cpu does in Dtype. The backward slides dy * y / scale
the same way.
"""
from cython.parallel cimport prange
from libc.stdlib cimport free, malloc

include "_threads.pxi"

ctypedef fused real:
    float
    double

include "_vmath.pxi"

cdef enum:
    # LRN: at most this many spatial positions per work item. The window slides along the channels, so
    # only its 2r + 1 rows of a piece (and the double sums) need to stay in cache, not all C rows: long
    # pieces make every row a long contiguous run the hardware prefetcher follows (512 positions, 2 KB
    # per row, left the first read of each row waiting on memory).
    PIECE = 4096
    MIN_PIECE = 256  # positions: pieces are cut no shorter when split for the threads


cdef Py_ssize_t _lrn_piece(Py_ssize_t N, Py_ssize_t S, int threads) noexcept nogil:
    """Positions per LRN work item: up to PIECE, and short enough that there are at least four
    items per thread where the images allow (batch 1), a multiple of 16 (whole cache lines)."""
    cdef Py_ssize_t want = (4 * threads + N - 1) // N, p
    p = (S + want - 1) // want
    if p > PIECE:
        p = PIECE
    if p < MIN_PIECE:
        p = MIN_PIECE
    p = (p + 15) // 16 * 16
    return p if p < S else S


def _need(Py_ssize_t have, Py_ssize_t need, str what):
    if have < need:
        raise ValueError(f"normalization kernel: {what} holds {have} elements, needs {need}")


# -- BatchNorm ---------------------------------------------------------------------------------

cdef enum:
    LANES = 8  # running sums per quantity: independent chains the compiler keeps in SIMD registers
    BLOCK = 128  # elements summed in x's precision before the partial sums go into the double totals


# The sums run in x's precision over blocks of BLOCK elements (LANES chains of BLOCK / LANES terms each)
# and the blocks' sums are added in double: converting every element to double cost as much as the
# memory read it overlaps (float32: 2 conversions and twice the vector operations per 8 elements),
# while a float32 partial of 16 terms is within ~1e-6 of its exact value (relative to the sum of the
# terms' magnitudes), far below what the float32 results resolve, and the totals keep double's range.

# The block sums in C with GCC's vector extension (8 lanes, lowered to AVX2 or SSE2 alike, so both
# builds add in the same order): the compiler does not vectorize a float reduction by itself (it
# would reorder the sums), and eight named scalar accumulators stayed scalar.
cdef extern from *:
    """
    #include <string.h>
    typedef float caffe_bn_v8f __attribute__((vector_size(32)));
    typedef double caffe_bn_v8d __attribute__((vector_size(64)));
    #define CAFFE_BN_BLOCK_FUNCS(SUF, T, V)                                                          \
    /* s[j] += sum of d, q[j] += sum of d * d, d = p[i] - k, over i = j mod 8 (n a multiple of 8) */ \
    static inline void caffe_bn_sums_##SUF(const T* p, Py_ssize_t n, T k, double* s, double* q) {   \
        V vs = {0}, vq = {0}, v;                                                                   \
        Py_ssize_t i;                                                                              \
        int j;                                                                                     \
        for (i = 0; i < n; i += 8) {                                                               \
            memcpy(&v, p + i, sizeof(V));                                                          \
            v = v - k;                                                                             \
            vs += v;                                                                               \
            vq += v * v;                                                                           \
        }                                                                                          \
        for (j = 0; j < 8; j++) {                                                                  \
            s[j] += vs[j];                                                                         \
            q[j] += vq[j];                                                                         \
        }                                                                                          \
    }                                                                                              \
    /* a[j] += sum of d[i], b[j] += sum of d[i] * ((p[i] - mean) * inv), over i = j mod 8 */          \
    static inline void caffe_bn_dots_##SUF(const T* d, const T* p, Py_ssize_t n, T mean, T inv,     \
                                           double* a, double* b) {                                 \
        V va = {0}, vb = {0}, vd, v;                                                               \
        Py_ssize_t i;                                                                              \
        int j;                                                                                     \
        for (i = 0; i < n; i += 8) {                                                               \
            memcpy(&vd, d + i, sizeof(V));                                                         \
            memcpy(&v, p + i, sizeof(V));                                                          \
            v = (v - mean) * inv;                                                                  \
            va += vd;                                                                              \
            vb += vd * v;                                                                          \
        }                                                                                          \
        for (j = 0; j < 8; j++) {                                                                  \
            a[j] += va[j];                                                                         \
            b[j] += vb[j];                                                                         \
        }                                                                                          \
    }
    CAFFE_BN_BLOCK_FUNCS(f, float, caffe_bn_v8f)
    CAFFE_BN_BLOCK_FUNCS(d, double, caffe_bn_v8d)
    """
    void caffe_bn_sums_f(const float* p, Py_ssize_t n, float k, double* s, double* q) nogil
    void caffe_bn_sums_d(const double* p, Py_ssize_t n, double k, double* s, double* q) nogil
    void caffe_bn_dots_f(const float* d, const float* p, Py_ssize_t n, float mean, float inv, double* a,
                         double* b) nogil
    void caffe_bn_dots_d(const double* d, const double* p, Py_ssize_t n, double mean, double inv, double* a,
                         double* b) nogil


cdef inline void _block_sums(const real* p, Py_ssize_t n, real k, double* s, double* q) noexcept nogil:
    if real is float:
        caffe_bn_sums_f(p, n, k, s, q)
    else:
        caffe_bn_sums_d(p, n, k, s, q)


cdef inline void _block_dots(const real* d, const real* p, Py_ssize_t n, real mean, real inv, double* a,
                             double* b) noexcept nogil:
    if real is float:
        caffe_bn_dots_f(d, p, n, mean, inv, a, b)
    else:
        caffe_bn_dots_d(d, p, n, mean, inv, a, b)


cdef void _bn_stats(const real* x, Py_ssize_t N, Py_ssize_t C, Py_ssize_t S, double* mean,
                    double* var) noexcept nogil:
    cdef Py_ssize_t n, i, i0, i1, j, S8 = S - S % LANES
    cdef const real* p
    cdef double sd[LANES]
    cdef double qd[LANES]
    cdef real k = x[0], d
    cdef double dd, s = 0, q = 0, m = <double>N * S
    for j in range(LANES):
        sd[j] = 0
        qd[j] = 0
    for n in range(N):
        p = x + n * C * S
        i0 = 0
        while i0 < S8:
            i1 = i0 + BLOCK if i0 + BLOCK < S8 else S8
            _block_sums(p + i0, i1 - i0, k, sd, qd)
            i0 = i1
        for i in range(S8, S):
            dd = <double>p[i] - k
            sd[0] += dd
            qd[0] += dd * dd
    for j in range(LANES):
        s += sd[j]
        q += qd[j]
    mean[0] = k + s / m
    var[0] = q / m - (s / m) * (s / m)
    if var[0] < 0:
        var[0] = 0


# x_norm (kept for backward only in place) is written with non-temporal stores where the blob is large:
# nothing reads it until backward, so it needs no cache lines now, and a plain store first reads each line
# from memory (write-allocate): one read of x, the in-place top written over it, and x_norm streamed out
# cost 3 units of memory traffic instead of 4. The values are the same IEEE operations ((x - mean) * inv
# in x's precision), so the same bits.
cdef extern from *:
    """
    #include <stdint.h>
    #if defined(__SSE2__)
    #include <emmintrin.h>
    #if defined(__AVX__)
    #include <immintrin.h>
    #endif
    #define CAFFE_BN_STREAM 1
    /* q[i] = r[i] = (p[i] - mean) * inv, r by streaming stores (r's aligned middle part) */
    static inline void caffe_bn_norm_stream_f(const float* p, float* q, float* r, Py_ssize_t n, float mean,
                                              float inv) {
        Py_ssize_t i = 0;
        float v;
        for (; i < n && (((uintptr_t)(r + i)) & 31) != 0; i++) {
            v = (p[i] - mean) * inv;
            q[i] = v;
            r[i] = v;
        }
    #if defined(__AVX__)
        {
            __m256 vm = _mm256_set1_ps(mean), vi = _mm256_set1_ps(inv), w;
            for (; i + 8 <= n; i += 8) {
                w = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(p + i), vm), vi);
                _mm256_storeu_ps(q + i, w);
                _mm256_stream_ps(r + i, w);
            }
        }
    #else
        {
            __m128 vm = _mm_set1_ps(mean), vi = _mm_set1_ps(inv), w;
            for (; i + 4 <= n; i += 4) {
                w = _mm_mul_ps(_mm_sub_ps(_mm_loadu_ps(p + i), vm), vi);
                _mm_storeu_ps(q + i, w);
                _mm_stream_ps(r + i, w);
            }
        }
    #endif
        for (; i < n; i++) {
            v = (p[i] - mean) * inv;
            q[i] = v;
            r[i] = v;
        }
    }
    static inline void caffe_bn_sfence(void) { _mm_sfence(); }
    #else
    #define CAFFE_BN_STREAM 0
    static inline void caffe_bn_norm_stream_f(const float* p, float* q, float* r, Py_ssize_t n, float mean,
                                              float inv) {}
    static inline void caffe_bn_sfence(void) {}
    #endif
    """
    bint CAFFE_BN_STREAM
    void caffe_bn_norm_stream_f(const float* p, float* q, float* r, Py_ssize_t n, float mean, float inv) nogil
    void caffe_bn_sfence() nogil

cdef enum:
    STREAM_MIN_BYTES = 4 << 20  # x_norm at least this big: streamed (smaller ones may well stay in cache)


cdef void _bn_normalize(const real* x, real* y, real* xn, Py_ssize_t N, Py_ssize_t C, Py_ssize_t S,
                        real mean, real inv, bint stream) noexcept nogil:
    cdef Py_ssize_t n, i
    cdef const real* p
    cdef real* q
    cdef real* r
    cdef real v
    if real is float:
        if CAFFE_BN_STREAM and stream and xn != NULL:
            for n in range(N):
                caffe_bn_norm_stream_f(x + n * C * S, y + n * C * S, xn + n * C * S, S, mean, inv)
            caffe_bn_sfence()  # the streamed lines are visible to every thread before the kernel returns
            return
    for n in range(N):
        p = x + n * C * S
        q = y + n * C * S
        if xn != NULL:
            r = xn + n * C * S
            for i in range(S):
                v = (p[i] - mean) * inv
                q[i] = v
                r[i] = v
        else:
            for i in range(S):
                q[i] = (p[i] - mean) * inv


def batch_norm_train_forward(const real[::1] x, real[::1] y, real[::1] x_norm, double[::1] mean,
                             double[::1] var, Py_ssize_t N, Py_ssize_t C, Py_ssize_t S, double eps):
    """Per channel: mean and (biased) variance of x over N and S (into mean / var, double), then
    y = (x - mean) * (1 / sqrt(var + eps)) in x's precision; x_norm (unless empty) gets a copy of y."""
    cdef Py_ssize_t n = N * C * S, c
    cdef real* xnp = NULL
    _need(mean.shape[0], C, "mean")
    _need(var.shape[0], C, "variance")
    if n == 0:
        return
    _need(x.shape[0], n, "bottom")
    _need(y.shape[0], n, "top")
    if x_norm.shape[0]:
        _need(x_norm.shape[0], n, "x_norm")
        xnp = &x_norm[0]
    cdef const real* xp = &x[0]
    cdef real* yp = &y[0]
    cdef double* mp = &mean[0]
    cdef bint stream = n * sizeof(real) >= STREAM_MIN_BYTES
    cdef double* vp = &var[0]
    with nogil:
        for c in prange(C, schedule="dynamic", chunksize=_grab(N * S), num_threads=_threads(n)):
            _bn_stats(xp + c * S, N, C, S, mp + c, vp + c)
            _bn_normalize(xp + c * S, yp + c * S, xnp + c * S if xnp != NULL else NULL, N, C, S,
                          <real>mp[c], <real>(1.0 / sqrt(vp[c] + eps)), stream)


cdef void _bn_backward(const real* dy, const real* xn, const real* x, real* dx, Py_ssize_t N, Py_ssize_t C,
                       Py_ssize_t S, real mean, real inv) noexcept nogil:
    cdef Py_ssize_t n, i, i0, i1, j, S8 = S - S % LANES
    cdef const real* d
    cdef const real* p
    cdef real* g
    cdef double ad[LANES]
    cdef double bd[LANES]
    cdef double a = 0, b = 0, m = <double>N * S
    cdef real v, md, mdy
    for j in range(LANES):
        ad[j] = 0
        bd[j] = 0
    for n in range(N):  # the sums of dy and dy * x_norm: blocks in x's precision, totals in double
        d = dy + n * C * S
        p = (xn if xn != NULL else x) + n * C * S
        i0 = 0
        while i0 < S8:
            i1 = i0 + BLOCK if i0 + BLOCK < S8 else S8
            if xn != NULL:  # (x_norm - 0) * 1: x_norm's own bits
                _block_dots(d + i0, p + i0, i1 - i0, 0, 1, ad, bd)
            else:
                _block_dots(d + i0, p + i0, i1 - i0, mean, inv, ad, bd)
            i0 = i1
        for i in range(S8, S):
            v = p[i] if xn != NULL else (p[i] - mean) * inv
            ad[0] += d[i]
            bd[0] += <double>d[i] * v
    for j in range(LANES):
        a += ad[j]
        b += bd[j]
    md = <real>(a / m)
    mdy = <real>(b / m)
    for n in range(N):
        d = dy + n * C * S
        p = (xn if xn != NULL else x) + n * C * S
        g = dx + n * C * S
        if xn != NULL:
            for i in range(S):
                g[i] = (d[i] - md - p[i] * mdy) * inv
        else:
            for i in range(S):
                g[i] = (d[i] - md - (p[i] - mean) * inv * mdy) * inv


def batch_norm_train_backward(const real[::1] dy, const real[::1] x_norm, const real[::1] x,
                              const real[::1] mean, const real[::1] inv_std, real[::1] dx,
                              Py_ssize_t N, Py_ssize_t C, Py_ssize_t S):
    """dx = (dy - mean(dy) - x_norm * mean(dy * x_norm)) * inv_std, means per channel over N and S.
    x_norm is read from x_norm, or (x_norm empty) recomputed as (x - mean) * inv_std."""
    cdef Py_ssize_t n = N * C * S, c
    if n == 0:
        return
    _need(dy.shape[0], n, "top diff")
    _need(dx.shape[0], n, "bottom diff")
    _need(mean.shape[0], C, "mean")
    _need(inv_std.shape[0], C, "inv_std")
    cdef const real* xnp = NULL
    cdef const real* xp = NULL
    if x_norm.shape[0]:
        _need(x_norm.shape[0], n, "x_norm")
        xnp = &x_norm[0]
    else:
        _need(x.shape[0], n, "bottom data")
        xp = &x[0]
    cdef const real* dyp = &dy[0]
    cdef real* dxp = &dx[0]
    with nogil:
        for c in prange(C, schedule="dynamic", chunksize=_grab(N * S), num_threads=_threads(n)):
            _bn_backward(dyp + c * S, xnp + c * S if xnp != NULL else NULL, xp + c * S if xp != NULL else NULL,
                         dxp + c * S, N, C, S, mean[c], inv_std[c])


# -- LRN across channels -------------------------------------------------------------------------

cdef inline real _pow_neg(real s, real beta) noexcept nogil:
    """s ^ -beta; beta = 0.75 (AlexNet's) as 1 / (sqrt(s) * sqrt(sqrt(s))), as the NumPy path."""
    cdef real t
    if beta == <real>0.75:
        t = _sqrt(s)
        return 1 / (_sqrt(t) * t)
    return _pow(s, -beta)


cdef void _lrn_fwd_piece(const real* x, real* y, real* scale, Py_ssize_t C, Py_ssize_t S, Py_ssize_t P,
                         int r, real a, real k, real beta) noexcept nogil:
    # x, y, scale point at channel 0, position lo of one image; P positions; channel stride S.
    # One pass over the positions per channel: add the square of the channel entering the window, compute,
    # subtract the one leaving (the same operations in the same order per position as three passes, so
    # the same bits; fused, the adds hide under the square roots and the division, which bound the loop).
    # Where no channel enters or leaves, a row of zeros does (acc + 0.0 and acc - 0.0 are acc: the sums
    # are never -0.0).
    cdef double* acc = <double*> malloc(P * sizeof(double) + P * sizeof(real))
    cdef Py_ssize_t c, j
    cdef const real* xe
    cdef const real* xl
    cdef const real* xc
    cdef real* zero
    cdef real* sc
    cdef real* yc
    cdef real s
    cdef double t
    if acc == NULL:
        return
    zero = <real*>(acc + P)
    for j in range(P):
        acc[j] = 0
        zero[j] = 0
    for c in range(r if r < C else C):
        xe = x + c * S
        for j in range(P):
            acc[j] += <double>xe[j] * xe[j]
    for c in range(C):
        xe = x + (c + r) * S if c + r < C else zero
        xl = x + (c - r) * S if c - r >= 0 else zero
        xc = x + c * S
        yc = y + c * S
        if scale != NULL:
            sc = scale + c * S
            for j in range(P):
                t = acc[j] + <double>xe[j] * xe[j]
                s = k + a * <real>t
                sc[j] = s
                yc[j] = xc[j] * _pow_neg(s, beta)
                acc[j] = t - <double>xl[j] * xl[j]
        else:  # no backward reads it (a TEST-phase forward): the same values, the scale's write saved
            for j in range(P):
                t = acc[j] + <double>xe[j] * xe[j]
                s = k + a * <real>t
                yc[j] = xc[j] * _pow_neg(s, beta)
                acc[j] = t - <double>xl[j] * xl[j]
    free(acc)


def lrn_across_forward(const real[::1] x, real[::1] y, real[::1] scale, Py_ssize_t N, Py_ssize_t C,
                       Py_ssize_t S, int size, double alpha, double k, double beta):
    """scale = k + alpha / size * (window sum of x^2 over channels [c - r, c + r]); y = x * scale^-beta.
    scale None: y alone (the same bits), for a forward no backward reads."""
    cdef Py_ssize_t n = N * C * S, t, img, lo, m
    cdef int r = (size - 1) // 2
    if n == 0:
        return
    _need(x.shape[0], n, "bottom")
    _need(y.shape[0], n, "top")
    if scale is not None:
        _need(scale.shape[0], n, "scale")
    cdef int nt = _threads(n * size)
    cdef Py_ssize_t P = _lrn_piece(N, S, nt)
    cdef Py_ssize_t pieces = (S + P - 1) // P
    cdef const real* xp = &x[0]
    cdef real* yp = &y[0]
    cdef real* sp = &scale[0] if scale is not None else NULL
    with nogil:
        for t in prange(N * pieces, schedule="dynamic", chunksize=_grab(C * P), num_threads=nt):
            img = t // pieces
            lo = (t % pieces) * P
            m = S - lo if S - lo < P else P
            _lrn_fwd_piece(xp + img * C * S + lo, yp + img * C * S + lo,
                           sp + img * C * S + lo if sp != NULL else NULL, C, S, m, r,
                           <real>(alpha / size), <real>k, <real>beta)


cdef inline real _ratio(const real* dy, const real* y, const real* scale, Py_ssize_t i) noexcept nogil:
    return dy[i] * y[i] / scale[i]


cdef void _lrn_bwd_piece(const real* x, const real* y, const real* scale, const real* dy, real* dx,
                         Py_ssize_t C, Py_ssize_t S, Py_ssize_t P, int r, real cache, real beta) noexcept nogil:
    # The window's rows of dy * y / scale are kept in a ring of 2r + 1 rows (L1/L2): each is computed once,
    # when its channel enters the window, and subtracted from that same row when it leaves (the same
    # values as computing it twice, without the second division). One pass over the positions per
    # channel, as the forward: enter, compute, leave, in the order three passes took (the same bits);
    # a row of zeros leaves where no channel does.
    cdef Py_ssize_t ring = 2 * r + 1
    cdef double* acc = <double*> malloc(P * sizeof(double) + (ring + 1) * P * sizeof(real))
    cdef real* rows
    cdef real* q
    cdef real* ql
    cdef real* zero
    cdef Py_ssize_t c, j, o, oe
    cdef double t
    cdef real v
    if acc == NULL:
        return
    rows = <real*>(acc + P)
    zero = rows + ring * P
    for j in range(P):
        acc[j] = 0
        zero[j] = 0
    for c in range(r if r < C else C):
        o = c * S
        q = rows + (c % ring) * P
        for j in range(P):
            q[j] = _ratio(dy, y, scale, o + j)
            acc[j] += q[j]
    for c in range(C):
        o = c * S
        ql = rows + ((c - r) % ring) * P if c - r >= 0 else zero
        if c + r < C:
            oe = (c + r) * S
            q = rows + ((c + r) % ring) * P
            for j in range(P):  # (apart: one loop over ten arrays was not vectorized)
                q[j] = _ratio(dy, y, scale, oe + j)
            for j in range(P):
                t = acc[j] + q[j]
                dx[o + j] = dy[o + j] * _pow_neg(scale[o + j], beta) - <real>t * x[o + j] * cache
                acc[j] = t - ql[j]
        else:
            for j in range(P):
                t = acc[j]
                dx[o + j] = dy[o + j] * _pow_neg(scale[o + j], beta) - <real>t * x[o + j] * cache
                acc[j] = t - ql[j]
    free(acc)


def lrn_across_backward(const real[::1] x, const real[::1] y, const real[::1] scale, const real[::1] dy,
                        real[::1] dx, Py_ssize_t N, Py_ssize_t C, Py_ssize_t S, int size, double alpha,
                        double beta):
    """dx = dy * scale^-beta - 2 alpha beta / size * x * (window sum over channels of dy * y / scale)."""
    cdef Py_ssize_t n = N * C * S, t, img, lo, m, off
    cdef int r = (size - 1) // 2
    if n == 0:
        return
    for buf, what in ((x, "bottom"), (y, "top"), (scale, "scale"), (dy, "top diff"), (dx, "bottom diff")):
        _need(len(buf), n, what)
    cdef int nt = _threads(n * size)
    cdef Py_ssize_t P = _lrn_piece(N, S, nt)
    cdef Py_ssize_t pieces = (S + P - 1) // P
    cdef real cache = <real>(2.0 * alpha * beta / size)
    with nogil:
        for t in prange(N * pieces, schedule="dynamic", chunksize=_grab(C * P), num_threads=nt):
            img = t // pieces
            lo = (t % pieces) * P
            m = S - lo if S - lo < P else P
            off = img * C * S + lo
            _lrn_bwd_piece(&x[0] + off, &y[0] + off, &scale[0] + off, &dy[0] + off, &dx[0] + off, C, S, m, r,
                           cache, <real>beta)

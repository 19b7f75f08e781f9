# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math
"""2-D MAX / AVE pooling on the CPU, OpenMP-parallel over (image, channel) planes.

The loops are Caffe's PoolingLayer::Forward_cpu / Backward_cpu (pooling_layer.cpp),
plane by plane:
  MAX: window [hstart, hend) clipped to the image; running max starts at -FLT_MAX and
       only a strictly greater value replaces it, so the first maximum in row-major
       order wins; the argmax is stored as h * W + w (-1 for an empty window). Computed
       separably (row maxima, then the maximum of those over the window's rows), which
       picks the same first maximum: see _max_plane_sep; 3x3 / stride 2 with the argmax in
       float32 (AVX2 / AVX-512 builds), the same scans in one pass: caffe_pool_max_k3s2.
  AVE: the divisor is the window clipped to the padded extent (H + pad), computed
       before clipping to the image; the sum runs over the image part only.
Backward writes every bottom-diff plane (zero first, then scatter/accumulate), so
planes are independent and the parallel loop needs no atomics.
x / top are (planes, H, W) / (planes, PH, PW), contiguous and flattened.
"""
from cython.parallel cimport parallel, prange
from libc.stdlib cimport free, malloc
include "_threads.pxi"
from libc.float cimport FLT_MAX

ctypedef fused real:
    float
    double


cdef inline void _pw_range(Py_ssize_t j, Py_ssize_t W, Py_ssize_t sw, Py_ssize_t pad_w, Py_ssize_t PW,
                           Py_ssize_t* lo, Py_ssize_t* hi) noexcept nogil:
    """The windows pw whose column pw * sw - pad_w + j lies inside the image form [lo, hi)."""
    cdef Py_ssize_t w0 = j - pad_w, a, b
    if w0 >= 0:
        a = 0
    else:
        a = (-w0 + sw - 1) // sw
    if W - w0 <= 0:
        b = 0
    else:
        b = (W - w0 + sw - 1) // sw
    if b > PW:
        b = PW
    if a > b:
        a = b
    lo[0] = a
    hi[0] = b


# The AVE kernels' [lo, hi) per kernel column j, computed once per plane (each takes one or two integer
# divisions, which, done for every row of every window row, had cost as much as the additions); kernels
# wider than PW_RANGES compute them as they go.
cdef enum:
    PW_RANGES = 16


cdef inline void _pw_ranges(Py_ssize_t kw, Py_ssize_t W, Py_ssize_t sw, Py_ssize_t pad_w, Py_ssize_t PW,
                            Py_ssize_t* lo, Py_ssize_t* hi) noexcept nogil:
    cdef Py_ssize_t j
    if kw <= PW_RANGES:
        for j in range(kw):
            _pw_range(j, W, sw, pad_w, PW, &lo[j], &hi[j])


cdef inline void _pw_take(Py_ssize_t j, Py_ssize_t kw, Py_ssize_t W, Py_ssize_t sw, Py_ssize_t pad_w,
                          Py_ssize_t PW, const Py_ssize_t* los, const Py_ssize_t* his, Py_ssize_t* lo,
                          Py_ssize_t* hi) noexcept nogil:
    if kw <= PW_RANGES:
        lo[0] = los[j]
        hi[0] = his[j]
    else:
        _pw_range(j, W, sw, pad_w, PW, lo, hi)


# MAX pooling in two passes over a plane, horizontal then vertical (separable): first, for every
# image row h and window column pw, the row's maximum over the window's columns and its tap j
# (column pw * sw - pad_w + j; hm, hc: H x PW, thread-local scratch); then, for every output row, the maximum over the
# window's rows of those. A strict greater-than scan from -FLT_MAX in each pass picks the first
# row that holds the window's maximum and, within that row, its first column: the first maximum
# in row-major order, Caffe's argmax, bit for bit (NaN and -FLT_MAX are never taken, as there).
# Both passes run over whole rows, so they vectorize (the second over contiguous memory) and a
# row shared by overlapping windows (3x3/2) is scanned once.

# A window clipped by the image border, scanned without branches (the tap's index by a mask, the
# maximum by a select the compiler makes a MAXSS: `v > m ? v : m`, NaN never taken): on real data
# each `if v > m` was a coin toss, and these windows come at every row's ends.
cdef extern from *:
    """
    #include <float.h>
    /* one tap: strictly greater takes it (index by a mask, maximum by a select) */
    #define CAFFE_POOL_EDGE_TAP(W_)                                                                   \
        v = xr[W_];                                                                                  \
        gt = -(int)(v > m);                                                                          \
        c = c ^ ((c ^ (int)((W_) - w0)) & gt);                                                       \
        m = v > m ? v : m;
    #define CAFFE_POOL_EDGE(SUF, T)                                                                   \
    static inline void caffe_pool_edge_##SUF(const T* xr, Py_ssize_t ws, Py_ssize_t we, Py_ssize_t w0, \
                                             T* hm, int* hc) {                                       \
        T m = -FLT_MAX, v;                                                                           \
        int c = -1, gt;                                                                              \
        Py_ssize_t w;                                                                                \
        if (we - ws == 2) { /* the usual border window of a 3-wide kernel, in straight lines */      \
            CAFFE_POOL_EDGE_TAP(ws)                                                                  \
            CAFFE_POOL_EDGE_TAP(ws + 1)                                                              \
        } else {                                                                                     \
            for (w = ws; w < we; w++) {                                                              \
                CAFFE_POOL_EDGE_TAP(w)                                                               \
            }                                                                                        \
        }                                                                                            \
        *hm = m;                                                                                     \
        *hc = c;                                                                                     \
    }
    CAFFE_POOL_EDGE(f, float)
    CAFFE_POOL_EDGE(d, double)
    """
    void caffe_pool_edge_f(const float* xr, Py_ssize_t ws, Py_ssize_t we, Py_ssize_t w0, float* hm, int* hc) nogil
    void caffe_pool_edge_d(const double* xr, Py_ssize_t ws, Py_ssize_t we, Py_ssize_t w0, double* hm,
                           int* hc) nogil


cdef inline void _max_hrow_edge(const real* xr, real* hm, int* hc, Py_ssize_t W, Py_ssize_t pw,
                                Py_ssize_t kw, Py_ssize_t sw, Py_ssize_t pad_w) noexcept nogil:
    """Window column pw clipped to the image (a window at the border)."""
    cdef Py_ssize_t w0 = pw * sw - pad_w
    cdef Py_ssize_t ws = w0, we = w0 + kw
    if we > W:
        we = W
    if ws < 0:
        ws = 0
    if real is float:
        caffe_pool_edge_f(xr, ws, we, w0, hm + pw, hc + pw)
    else:
        caffe_pool_edge_d(xr, ws, we, w0, hm + pw, hc + pw)


cdef inline void _max_hrow(const real* src, real* hm, int* hc, Py_ssize_t lo, Py_ssize_t hi,
                           Py_ssize_t kw, Py_ssize_t sw) noexcept nogil:
    """Windows lo..hi, all inside the row: window pw reads src[sw * pw + j], j < kw (any kernel)."""
    cdef Py_ssize_t pw
    cdef real m, v
    cdef int c, j
    for pw in range(lo, hi):
        m = -FLT_MAX
        c = -1
        for j in range(<int>kw):
            v = src[sw * pw + j]
            c = j if v > m else c
            m = v if v > m else m
        hm[pw] = m
        hc[pw] = c


# The common widths spelled out (the compiler does not always inline a generic version with literal
# arguments): the taps unrolled, constant strides, selects without branches, so the pw loop
# vectorizes. Same scan as _max_hrow: from -FLT_MAX, strictly greater, taps in order.
# AVX2 blocks of eight outputs for float32 (pooling_avx2's build): the same scans as the loops below
# (strictly greater, -FLT_MAX start, taps in order), so the same bits; a row's last, partial block is
# done as the block ending at its last output (overlapping the one before: the same values written
# twice) instead of one output at a time: rows are short (13-56 outputs in the nets) and that scalar
# remainder cost more than the vector part.
cdef extern from *:
    """
    #if defined(__AVX2__)
    #include <immintrin.h>
    #include <float.h>
    #define CAFFE_POOL_AVX2 1
    /* one tap of eight windows: where v is strictly greater, it becomes the maximum and `at` its index */
    static inline void caffe_pool_take8(__m256 v, __m256i at, __m256* m, __m256i* idx) {
        __m256 g = _mm256_cmp_ps(v, *m, _CMP_GT_OQ);
        *m = _mm256_blendv_ps(*m, v, g);
        *idx = _mm256_blendv_epi8(*idx, at, _mm256_castps_si256(g));
    }
    /* windows 0..7 of a 3-wide, stride-2 row: taps src[2i], src[2i + 1], src[2i + 2] (reads src[0..16]) */
    static inline void caffe_pool_k3s2_taps8(const float* src, __m256* t0, __m256* t1, __m256* t2) {
        __m256 a = _mm256_loadu_ps(src), b = _mm256_loadu_ps(src + 8);
        *t0 = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
        *t1 = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
        *t0 = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(*t0), _MM_SHUFFLE(3, 1, 2, 0)));
        *t1 = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(*t1), _MM_SHUFFLE(3, 1, 2, 0)));
        *t2 = _mm256_permutevar8x32_ps(*t0, _mm256_setr_epi32(1, 2, 3, 4, 5, 6, 7, 7));
        *t2 = _mm256_blend_ps(*t2, _mm256_broadcast_ss(src + 16), 0x80);
    }
    static inline void caffe_pool_h_k3s2_f8(const float* src, float* hm, int* hc) {
        __m256 t0, t1, t2, m = _mm256_set1_ps(-FLT_MAX);
        __m256i c = _mm256_set1_epi32(-1);
        caffe_pool_k3s2_taps8(src, &t0, &t1, &t2);
        caffe_pool_take8(t0, _mm256_setzero_si256(), &m, &c);
        caffe_pool_take8(t1, _mm256_set1_epi32(1), &m, &c);
        caffe_pool_take8(t2, _mm256_set1_epi32(2), &m, &c);
        _mm256_storeu_ps(hm, m);
        _mm256_storeu_si256((__m256i*)hc, c);
    }
    /* outputs pw..pw + 7 of a 3-row window: rows h0, h1, h2 of the row maxima / taps, argmax
       r + s * pw - p0 + tap (r the row's offset; -1 where the first row took nothing) */
    static inline void caffe_pool_v3_f8(const float* h0, const float* h1, const float* h2, const int* c0,
                                        const int* c1, const int* c2, float* yr, int* mr, int pw, int r0,
                                        int r1, int r2, int s, int p0) {
        __m256i w = _mm256_add_epi32(_mm256_set1_epi32(s * pw - p0),
                                     _mm256_mullo_epi32(_mm256_set1_epi32(s), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
        __m256i t = _mm256_loadu_si256((const __m256i*)(c0 + pw));
        __m256i idx = _mm256_add_epi32(_mm256_add_epi32(w, _mm256_set1_epi32(r0)), t);
        __m256 m = _mm256_loadu_ps(h0 + pw);
        idx = _mm256_blendv_epi8(_mm256_set1_epi32(-1), idx,
                                 _mm256_cmpgt_epi32(t, _mm256_set1_epi32(-1)));
        caffe_pool_take8(_mm256_loadu_ps(h1 + pw),
                         _mm256_add_epi32(_mm256_add_epi32(w, _mm256_set1_epi32(r1)),
                                          _mm256_loadu_si256((const __m256i*)(c1 + pw))), &m, &idx);
        caffe_pool_take8(_mm256_loadu_ps(h2 + pw),
                         _mm256_add_epi32(_mm256_add_epi32(w, _mm256_set1_epi32(r2)),
                                          _mm256_loadu_si256((const __m256i*)(c2 + pw))), &m, &idx);
        _mm256_storeu_ps(yr + pw, m);
        _mm256_storeu_si256((__m256i*)(mr + pw), idx);
    }
    /* the four taps of eight 2x2 / stride 2 windows, lanes in the order 0 1 4 5 2 3 6 7 */
    static inline void caffe_pool_2x2_taps8(const float* r0, const float* r1, __m256* t0, __m256* t1,
                                            __m256* t2, __m256* t3) {
        __m256 a = _mm256_loadu_ps(r0), b = _mm256_loadu_ps(r0 + 8);
        __m256 c = _mm256_loadu_ps(r1), d = _mm256_loadu_ps(r1 + 8);
        *t0 = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
        *t1 = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
        *t2 = _mm256_shuffle_ps(c, d, _MM_SHUFFLE(2, 0, 2, 0));
        *t3 = _mm256_shuffle_ps(c, d, _MM_SHUFFLE(3, 1, 3, 1));
    }
    /* outputs 0..7 of a 2x2 / stride 2 output row: rows r0, r1 (reads r0[0..15], r1[0..15]); taps in
       row-major order, argmax top + {0, 1, W, W + 1}, top = top0 + 2i */
    static inline void caffe_pool_2x2_f8(const float* r0, const float* r1, float* y, int* mask, int top0,
                                         int W) {
        __m256 t0, t1, t2, t3;
        caffe_pool_2x2_taps8(r0, r1, &t0, &t1, &t2, &t3);
        __m256 m = _mm256_set1_ps(-FLT_MAX);
        __m256i top = _mm256_add_epi32(_mm256_set1_epi32(top0), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
        __m256i idx = _mm256_set1_epi32(-1);
        t0 = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(t0), _MM_SHUFFLE(3, 1, 2, 0)));
        t1 = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(t1), _MM_SHUFFLE(3, 1, 2, 0)));
        t2 = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(t2), _MM_SHUFFLE(3, 1, 2, 0)));
        t3 = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(t3), _MM_SHUFFLE(3, 1, 2, 0)));
        caffe_pool_take8(t0, top, &m, &idx);
        caffe_pool_take8(t1, _mm256_add_epi32(top, _mm256_set1_epi32(1)), &m, &idx);
        caffe_pool_take8(t2, _mm256_add_epi32(top, _mm256_set1_epi32(W)), &m, &idx);
        caffe_pool_take8(t3, _mm256_add_epi32(top, _mm256_set1_epi32(W + 1)), &m, &idx);
        _mm256_storeu_ps(y, m);
        _mm256_storeu_si256((__m256i*)mask, idx);
    }
    /* the values alone (no argmax: a TEST-phase forward, max_pool_forward without a mask): the same
       strict-greater scans, m = v > m ? v : m being MAXPS(v, m) (NaN never taken, a tie keeps m) */
    static inline void caffe_poolv_h_k3s2_f8(const float* src, float* hm) {
        __m256 t0, t1, t2;
        caffe_pool_k3s2_taps8(src, &t0, &t1, &t2);
        __m256 m = _mm256_max_ps(t0, _mm256_set1_ps(-FLT_MAX));
        m = _mm256_max_ps(t1, m);
        _mm256_storeu_ps(hm, _mm256_max_ps(t2, m));
    }
    static inline void caffe_poolv_2x2_f8(const float* r0, const float* r1, float* y) {
        __m256 t0, t1, t2, t3;
        caffe_pool_2x2_taps8(r0, r1, &t0, &t1, &t2, &t3);
        __m256 m = _mm256_max_ps(t0, _mm256_set1_ps(-FLT_MAX));
        m = _mm256_max_ps(t1, m);
        m = _mm256_max_ps(t2, m);
        m = _mm256_max_ps(t3, m);
        /* the lanes came out in the shuffles' order (0 1 4 5 2 3 6 7): one permute puts them back */
        _mm256_storeu_ps(y, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(m), _MM_SHUFFLE(3, 1, 2, 0))));
    }
    /* caffe_poolv_vrows_f16 (below) eight wide, for the AVX2 build (PW >= 8) */
    static inline void caffe_poolv_vrows_f8(const float* h0, Py_ssize_t rows, Py_ssize_t PW, float* yr) {
        Py_ssize_t pw = 0, r;
        for (;;) {
            if (pw + 8 > PW)
                pw = PW - 8;
            __m256 m = _mm256_loadu_ps(h0 + pw);
            for (r = 1; r < rows; r++)
                m = _mm256_max_ps(_mm256_loadu_ps(h0 + r * PW + pw), m);
            _mm256_storeu_ps(yr + pw, m);
            if (pw + 8 >= PW)
                break;
            pw += 8;
        }
    }
    /* MAX 2x2 / stride 2 backward on whole windows, one output row (PW >= 8, blocks of eight, the last ending at the
       row's end): dx rows r0, r1 = dy at each window's argmax, 0 at its other three pixels (Caffe's dx = 0, then
       dx[argmax] += dy: one add to +0, so -0 becomes +0 here too), with no scatter and no zeroing pass. Returns 0,
       having written part of the rows, where an argmax is not one of its window's four pixels (a mask top edited
       before the backward): the caller then redoes the plane by the scatter. */
    static inline int caffe_pool_back_2x2_row8(const float* dy, const int* mask, float* r0, float* r1,
                                               Py_ssize_t PW, int top0, int W) {
        const __m256i lane2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
        const __m256i o1 = _mm256_set1_epi32(1), oW = _mm256_set1_epi32(W), oW1 = _mm256_set1_epi32(W + 1);
        Py_ssize_t pw = 0;
        for (;;) {
            if (pw + 8 > PW)
                pw = PW - 8;
            __m256i rel = _mm256_sub_epi32(_mm256_loadu_si256((const __m256i*)(mask + pw)),
                                           _mm256_add_epi32(_mm256_set1_epi32(top0 + 2 * (int)pw), lane2));
            __m256 d = _mm256_add_ps(_mm256_setzero_ps(), _mm256_loadu_ps(dy + pw));
            __m256 e00 = _mm256_castsi256_ps(_mm256_cmpeq_epi32(rel, _mm256_setzero_si256()));
            __m256 e01 = _mm256_castsi256_ps(_mm256_cmpeq_epi32(rel, o1));
            __m256 e10 = _mm256_castsi256_ps(_mm256_cmpeq_epi32(rel, oW));
            __m256 e11 = _mm256_castsi256_ps(_mm256_cmpeq_epi32(rel, oW1));
            if (_mm256_movemask_ps(_mm256_or_ps(_mm256_or_ps(e00, e01), _mm256_or_ps(e10, e11))) != 0xFF)
                return 0;
            __m256 a = _mm256_and_ps(d, e00), b = _mm256_and_ps(d, e01);  /* row r0: even, odd columns */
            __m256 lo = _mm256_unpacklo_ps(a, b), hi = _mm256_unpackhi_ps(a, b);
            _mm256_storeu_ps(r0 + 2 * pw, _mm256_permute2f128_ps(lo, hi, 0x20));
            _mm256_storeu_ps(r0 + 2 * pw + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
            a = _mm256_and_ps(d, e10);
            b = _mm256_and_ps(d, e11);
            lo = _mm256_unpacklo_ps(a, b);
            hi = _mm256_unpackhi_ps(a, b);
            _mm256_storeu_ps(r1 + 2 * pw, _mm256_permute2f128_ps(lo, hi, 0x20));
            _mm256_storeu_ps(r1 + 2 * pw + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
            if (pw + 8 >= PW)
                return 1;
            pw += 8;
        }
    }
    #else
    #define CAFFE_POOL_AVX2 0
    static inline int caffe_pool_back_2x2_row8(const float* dy, const int* mask, float* r0, float* r1,
                                               Py_ssize_t PW, int top0, int W) { return 0; }
    static inline void caffe_poolv_vrows_f8(const float* h0, Py_ssize_t rows, Py_ssize_t PW, float* yr) {}
    static inline void caffe_pool_2x2_f8(const float* r0, const float* r1, float* y, int* mask, int top0,
                                         int W) {}
    static inline void caffe_pool_h_k3s2_f8(const float* src, float* hm, int* hc) {}
    static inline void caffe_poolv_h_k3s2_f8(const float* src, float* hm) {}
    static inline void caffe_poolv_2x2_f8(const float* r0, const float* r1, float* y) {}
    static inline void caffe_pool_v3_f8(const float* h0, const float* h1, const float* h2, const int* c0,
                                        const int* c1, const int* c2, float* yr, int* mr, int pw, int r0,
                                        int r1, int r2, int s, int p0) {}
    #endif
    """
    bint CAFFE_POOL_AVX2
    int caffe_pool_back_2x2_row8(const float* dy, const int* mask, float* r0, float* r1, Py_ssize_t PW, int top0,
                                 int W) nogil
    void caffe_pool_h_k3s2_f8(const float* src, float* hm, int* hc) nogil
    void caffe_poolv_h_k3s2_f8(const float* src, float* hm) nogil
    void caffe_poolv_2x2_f8(const float* r0, const float* r1, float* y) nogil
    void caffe_poolv_vrows_f8(const float* h0, Py_ssize_t rows, Py_ssize_t PW, float* yr) nogil
    void caffe_pool_2x2_f8(const float* r0, const float* r1, float* y, int* mask, int top0, int W) nogil
    void caffe_pool_v3_f8(const float* h0, const float* h1, const float* h2, const int* c0, const int* c1,
                          const int* c2, float* yr, int* mr, int pw, int r0, int r1, int r2, int s, int p0) nogil


# AVX-512 blocks of sixteen outputs for float32 (pooling_avx512's build): the AVX2 blocks above sixteen lanes
# wide, the same scans (strictly greater, -FLT_MAX start, taps in order), so the same bits. The stride-2 taps
# come out of two loads by one two-source permute each (AVX2 needed a shuffle and a cross-lane permute per tap,
# then put the lanes back in order), and a compare writes a mask register that selects the maximum and the
# index (AVX2: a compare and two blends). Rows with 8..15 outputs keep the 8-wide blocks.
cdef extern from *:
    """
    #if defined(__AVX512F__)
    #include <immintrin.h>
    #include <float.h>
    #define CAFFE_POOL_AVX512 1
    static inline void caffe_pool_take16(__m512 v, __m512i at, __m512* m, __m512i* idx) {
        __mmask16 g = _mm512_cmp_ps_mask(v, *m, _CMP_GT_OQ);
        *m = _mm512_mask_mov_ps(*m, g, v);
        *idx = _mm512_mask_mov_epi32(*idx, g, at);
    }
    /* src[2i] and src[2i + 1], i < 16, from src[0..31] */
    static inline void caffe_pool_s2_taps16(const float* src, __m512* t0, __m512* t1) {
        __m512 a = _mm512_loadu_ps(src), b = _mm512_loadu_ps(src + 16);
        *t0 = _mm512_permutex2var_ps(a, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), b);
        *t1 = _mm512_permutex2var_ps(a, _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31), b);
    }
    /* windows 0..15 of a 3-wide, stride-2 row: taps src[2i], src[2i + 1], src[2i + 2] (reads src[0..32]) */
    static inline void caffe_pool_k3s2_taps16(const float* src, __m512* t0, __m512* t1, __m512* t2) {
        caffe_pool_s2_taps16(src, t0, t1);
        /* t0 moved down one lane, src[32] into the top one */
        *t2 = _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(_mm512_set1_ps(src[32])),
                                                      _mm512_castps_si512(*t0), 1));
    }
    static inline void caffe_pool_h_k3s2_f16(const float* src, float* hm, int* hc) {
        __m512 t0, t1, t2, m = _mm512_set1_ps(-FLT_MAX);
        __m512i c = _mm512_set1_epi32(-1);
        caffe_pool_k3s2_taps16(src, &t0, &t1, &t2);
        caffe_pool_take16(t0, _mm512_setzero_si512(), &m, &c);
        caffe_pool_take16(t1, _mm512_set1_epi32(1), &m, &c);
        caffe_pool_take16(t2, _mm512_set1_epi32(2), &m, &c);
        _mm512_storeu_ps(hm, m);
        _mm512_storeu_si512((void*)hc, c);
    }
    static inline void caffe_poolv_h_k3s2_f16(const float* src, float* hm) {
        __m512 t0, t1, t2;
        caffe_pool_k3s2_taps16(src, &t0, &t1, &t2);
        __m512 m = _mm512_max_ps(t0, _mm512_set1_ps(-FLT_MAX));
        m = _mm512_max_ps(t1, m);
        _mm512_storeu_ps(hm, _mm512_max_ps(t2, m));
    }
    static inline void caffe_pool_v3_f16(const float* h0, const float* h1, const float* h2, const int* c0,
                                         const int* c1, const int* c2, float* yr, int* mr, int pw, int r0,
                                         int r1, int r2, int s, int p0) {
        __m512i w = _mm512_add_epi32(_mm512_set1_epi32(s * pw - p0),
                                     _mm512_mullo_epi32(_mm512_set1_epi32(s),
                                                        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)));
        __m512i t = _mm512_loadu_si512((const void*)(c0 + pw));
        __m512i idx = _mm512_mask_mov_epi32(_mm512_set1_epi32(-1),
                                            _mm512_cmpgt_epi32_mask(t, _mm512_set1_epi32(-1)),
                                            _mm512_add_epi32(_mm512_add_epi32(w, _mm512_set1_epi32(r0)), t));
        __m512 m = _mm512_loadu_ps(h0 + pw);
        caffe_pool_take16(_mm512_loadu_ps(h1 + pw),
                          _mm512_add_epi32(_mm512_add_epi32(w, _mm512_set1_epi32(r1)),
                                           _mm512_loadu_si512((const void*)(c1 + pw))), &m, &idx);
        caffe_pool_take16(_mm512_loadu_ps(h2 + pw),
                          _mm512_add_epi32(_mm512_add_epi32(w, _mm512_set1_epi32(r2)),
                                           _mm512_loadu_si512((const void*)(c2 + pw))), &m, &idx);
        _mm512_storeu_ps(yr + pw, m);
        _mm512_storeu_si512((void*)(mr + pw), idx);
    }
    /* outputs 0..15 of a 2x2 / stride 2 output row (reads r0[0..31], r1[0..31]), argmax top + {0, 1, W, W + 1} */
    static inline void caffe_pool_2x2_f16(const float* r0, const float* r1, float* y, int* mask, int top0,
                                          int W) {
        __m512 t0, t1, t2, t3, m = _mm512_set1_ps(-FLT_MAX);
        __m512i top = _mm512_add_epi32(_mm512_set1_epi32(top0),
                                       _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30));
        __m512i idx = _mm512_set1_epi32(-1);
        caffe_pool_s2_taps16(r0, &t0, &t1);
        caffe_pool_s2_taps16(r1, &t2, &t3);
        caffe_pool_take16(t0, top, &m, &idx);
        caffe_pool_take16(t1, _mm512_add_epi32(top, _mm512_set1_epi32(1)), &m, &idx);
        caffe_pool_take16(t2, _mm512_add_epi32(top, _mm512_set1_epi32(W)), &m, &idx);
        caffe_pool_take16(t3, _mm512_add_epi32(top, _mm512_set1_epi32(W + 1)), &m, &idx);
        _mm512_storeu_ps(y, m);
        _mm512_storeu_si512((void*)mask, idx);
    }
    static inline void caffe_poolv_2x2_f16(const float* r0, const float* r1, float* y) {
        __m512 t0, t1, t2, t3;
        caffe_pool_s2_taps16(r0, &t0, &t1);
        caffe_pool_s2_taps16(r1, &t2, &t3);
        __m512 m = _mm512_max_ps(t0, _mm512_set1_ps(-FLT_MAX));
        m = _mm512_max_ps(t1, m);
        m = _mm512_max_ps(t2, m);
        _mm512_storeu_ps(y, _mm512_max_ps(t3, m));
    }
    /* the values alone, one output row: the maximum over `rows` rows of row maxima (stride PW) of v > m ? v : m
       (MAXPS), rows in order; blocks of sixteen, the last one ending at the row's end (PW >= 16). Spelled out:
       the compiler's 16-wide loop spent longer in its remainder than in the blocks at the nets' widths */
    static inline void caffe_poolv_vrows_f16(const float* h0, Py_ssize_t rows, Py_ssize_t PW, float* yr) {
        Py_ssize_t pw = 0, r;
        for (;;) {
            if (pw + 16 > PW)
                pw = PW - 16;
            __m512 m = _mm512_loadu_ps(h0 + pw);
            for (r = 1; r < rows; r++)
                m = _mm512_max_ps(_mm512_loadu_ps(h0 + r * PW + pw), m);
            _mm512_storeu_ps(yr + pw, m);
            if (pw + 16 >= PW)
                break;
            pw += 16;
        }
    }
    #else
    #define CAFFE_POOL_AVX512 0
    static inline void caffe_poolv_vrows_f16(const float* h0, Py_ssize_t rows, Py_ssize_t PW, float* yr) {}
    static inline void caffe_pool_h_k3s2_f16(const float* src, float* hm, int* hc) {}
    static inline void caffe_poolv_h_k3s2_f16(const float* src, float* hm) {}
    static inline void caffe_pool_v3_f16(const float* h0, const float* h1, const float* h2, const int* c0,
                                         const int* c1, const int* c2, float* yr, int* mr, int pw, int r0,
                                         int r1, int r2, int s, int p0) {}
    static inline void caffe_pool_2x2_f16(const float* r0, const float* r1, float* y, int* mask, int top0,
                                          int W) {}
    static inline void caffe_poolv_2x2_f16(const float* r0, const float* r1, float* y) {}
    #endif
    """
    bint CAFFE_POOL_AVX512
    void caffe_pool_h_k3s2_f16(const float* src, float* hm, int* hc) nogil
    void caffe_poolv_h_k3s2_f16(const float* src, float* hm) nogil
    void caffe_pool_v3_f16(const float* h0, const float* h1, const float* h2, const int* c0, const int* c1,
                           const int* c2, float* yr, int* mr, int pw, int r0, int r1, int r2, int s, int p0) nogil
    void caffe_pool_2x2_f16(const float* r0, const float* r1, float* y, int* mask, int top0, int W) nogil
    void caffe_poolv_2x2_f16(const float* r0, const float* r1, float* y) nogil
    void caffe_poolv_vrows_f16(const float* h0, Py_ssize_t rows, Py_ssize_t PW, float* yr) nogil


# MAX 3x3 / stride 2 with the argmax (a TRAIN-phase forward) on float32 planes (ResNet, GoogLeNet, CaffeNet pools),
# AVX-512 / AVX2 builds: one pass per plane. For a block of 16 / 8 window columns, walk down the plane's rows: each
# image row's maxima over the block's windows (taps j = 0, 1, 2 in order, strictly greater, from -FLT_MAX:
# _max_plane_sep's horizontal pass) are taken once, in registers, and the output row is the first maximum over its
# three rows, the last of which is carried on as the next output row's first (3x3/2 windows share it). The separable
# scan's order, so Caffe's first maximum in row-major order, bit for bit. What made _max_plane_sep with the argmax
# ~1.6x the values alone's compute (and over 2x their time at full size): the row maxima and their taps went
# through scratch (H x PW floats and ints written, then read three times), the vertical pass rebuilt each index from
# the tap (a multiply and four adds per block) and every row's border windows were scalar calls. Here the index is
# the absolute one, kept beside the maximum, and the border windows are lanes of the same blocks: columns outside
# the image are loaded as NaN, which a strict greater-than never takes (Caffe's clipped window); an output that took
# nothing is -FLT_MAX, and its index is set to -1 at the end. Blocks inside the row load plainly: masked loads that
# miss the cache were slow here (Zen 5: the full-size forward took 1.5x longer with them). The values alone (TEST)
# keep _max_plane_sep, already at memory speed. (A gathered backward, each dx pixel summing the dy of the windows
# whose argmax it is, was tried and dropped: faster in cache, not at full size, where main's scatter after a memset
# overlaps with memory better. Session 12 tried again, bit-exact each: (1) the top and argmax, and the bottom diff, made
# per plane in a thread-local scratch and written out by non-temporal stores (no read of the output lines first); (2) a
# vectorized gather backward (16 pixels a vector, each window row's argmaxes permuted into the lanes of windows A / B,
# masked adds in Caffe's order, an argmax outside its window counted and scattered instead); (3) the scatter with the
# pixel being added to kept in a register while consecutive windows hit it. One thread, 8x256x56x56 and 8x64x112x112:
# (1) 1.0-1.14x main's time forward and backward (one and two threads), (2) 1.1-1.8x at full size (in cache 0.5-1.8x
# from run to run), (3) 0.8x in cache, 1.9-2.1x at full size (its loop-carried chain stalls on each top diff read from
# memory). Patches and figures: the session 12 report.)
cdef extern from *:
    """
    #include <math.h>
    #include <float.h>
    #if defined(__AVX512F__)
    #include <immintrin.h>
    #define CAFFE_POOL_K3S2 16
    /* the lanes l < 16 with 0 <= c + l < n */
    static inline __mmask16 caffe_pool_lanes16(Py_ssize_t c, Py_ssize_t n) {
        Py_ssize_t lo = c < 0 ? -c : 0, hi = n - c;
        if (hi > 16)
            hi = 16;
        if (hi <= lo)
            return 0;
        return (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
    }
    /* one image row under 16 windows: xr points at their first column (c0 = 2 pw0 - pad_w, which may be outside the
       row: the la / lb / lc lanes are the columns inside it, the others NaN); m = the row maximum (taps in order,
       strictly greater, from -FLT_MAX), c = its column (b0 + tap) + rw */
    static inline void caffe_pool_k3s2_hrow16(const float* xr, int plain, __mmask16 la, __mmask16 lb, __mmask16 lc,
                                              __m512i b0, __m512i b1, __m512i b2, __m512i rw, __m512* m, __m512i* c) {
        const __m512 nan = _mm512_set1_ps(NAN);
        __m512 a, b, e;
        if (plain) {  /* all inside the row: plain loads (masked ones that miss the cache are slow here) */
            a = _mm512_loadu_ps(xr);
            b = _mm512_loadu_ps(xr + 16);
            e = _mm512_set1_ps(xr[32]);
        } else {
            a = _mm512_mask_loadu_ps(nan, la, xr);
            b = _mm512_mask_loadu_ps(nan, lb, xr + 16);
            e = _mm512_mask_loadu_ps(nan, lc, xr + 32);
        }
        __m512 t0 = _mm512_permutex2var_ps(a, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), b);
        __m512 t1 = _mm512_permutex2var_ps(a, _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31), b);
        /* t0 moved down one lane, column c0 + 32 into the top one */
        __m512 t2 = _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(e), _mm512_castps_si512(t0), 1));
        __m512 mm = _mm512_max_ps(t0, _mm512_set1_ps(-FLT_MAX));  /* t0 > -FLT_MAX ? t0 : -FLT_MAX */
        __m512i cc = b0;
        __mmask16 k = _mm512_cmp_ps_mask(t1, mm, _CMP_GT_OQ);
        mm = _mm512_mask_mov_ps(mm, k, t1);
        cc = _mm512_mask_mov_epi32(cc, k, b1);
        k = _mm512_cmp_ps_mask(t2, mm, _CMP_GT_OQ);
        *m = _mm512_mask_mov_ps(mm, k, t2);
        *c = _mm512_add_epi32(_mm512_mask_mov_epi32(cc, k, b2), rw);
    }
    static inline void caffe_pool_max_k3s2(const float* x, float* y, int* mask, Py_ssize_t H, Py_ssize_t W,
                                           Py_ssize_t PH, Py_ssize_t PW, Py_ssize_t pad_h, Py_ssize_t pad_w,
                                           const char* nxt, Py_ssize_t nxt_bytes) {
        const __m512 neg = _mm512_set1_ps(-FLT_MAX);
        const __m512i none = _mm512_set1_epi32(-1);
        const __m512i lane2 = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        Py_ssize_t pw0 = 0, ph, r, per = PH > 0 ? ((nxt_bytes + 63) / 64 + PH - 1) / PH : 0, l;
        for (;;) {
            /* the last block ends at the row's last window (overlapping the one before: the same values twice) */
            if (PW >= 16 && pw0 + 16 > PW)
                pw0 = PW - 16;
            Py_ssize_t c0 = 2 * pw0 - pad_w;
            __mmask16 la = caffe_pool_lanes16(c0, W), lb = caffe_pool_lanes16(c0 + 16, W);
            __mmask16 lc = caffe_pool_lanes16(c0 + 32, W) & 1;
            __mmask16 st = caffe_pool_lanes16(pw0, PW);
            int plain = la == 0xFFFF && lb == 0xFFFF && lc == 1;
            __m512i b0 = _mm512_add_epi32(_mm512_set1_epi32((int)c0), lane2);
            __m512i b1 = _mm512_add_epi32(b0, _mm512_set1_epi32(1)), b2 = _mm512_add_epi32(b0, _mm512_set1_epi32(2));
            __m512 mc = neg, m1, m2, v;
            __m512i cc = none, c1, c2, i;
            __mmask16 k;
            r = -pad_h;  /* window row 0's first image row */
            if (r >= 0 && r < H)
                caffe_pool_k3s2_hrow16(x + r * W + c0, plain, la, lb, lc, b0, b1, b2, _mm512_set1_epi32((int)(r * W)), &mc, &cc);
            for (ph = 0; ph < PH; ph++) {
                m1 = neg; c1 = none; m2 = neg; c2 = none;  /* rows outside the image: nothing to take */
                r = 2 * ph - pad_h + 1;
                if (r >= 0 && r < H)
                    caffe_pool_k3s2_hrow16(x + r * W + c0, plain, la, lb, lc, b0, b1, b2, _mm512_set1_epi32((int)(r * W)), &m1, &c1);
                r++;
                if (r >= 0 && r < H)
                    caffe_pool_k3s2_hrow16(x + r * W + c0, plain, la, lb, lc, b0, b1, b2, _mm512_set1_epi32((int)(r * W)), &m2, &c2);
                k = _mm512_cmp_ps_mask(m1, mc, _CMP_GT_OQ);
                v = _mm512_mask_mov_ps(mc, k, m1);
                i = _mm512_mask_mov_epi32(cc, k, c1);
                k = _mm512_cmp_ps_mask(m2, v, _CMP_GT_OQ);
                v = _mm512_mask_mov_ps(v, k, m2);
                i = _mm512_mask_mov_epi32(i, k, c2);
                i = _mm512_mask_mov_epi32(i, _mm512_cmp_ps_mask(v, neg, _CMP_EQ_OQ), none);  /* took nothing */
                if (st == 0xFFFF) {
                    _mm512_storeu_ps(y + ph * PW + pw0, v);
                    _mm512_storeu_si512((void*)(mask + ph * PW + pw0), i);
                } else {
                    _mm512_mask_storeu_ps(y + ph * PW + pw0, st, v);
                    _mm512_mask_storeu_epi32(mask + ph * PW + pw0, st, i);
                }
                mc = m2;
                cc = c2;
                if (nxt != NULL && pw0 == 0)  /* the next plane into L2, spread over the first block's rows */
                    for (l = ph * per; l < (ph + 1) * per && 64 * l < nxt_bytes; l++)
                        __builtin_prefetch(nxt + 64 * l, 0, 2);
            }
            if (pw0 + 16 >= PW)
                break;
            pw0 += 16;
        }
    }
    #elif defined(__AVX2__)
    #include <immintrin.h>
    #define CAFFE_POOL_K3S2 8
    /* all ones in the lanes l < 8 with 0 <= c + l < n */
    static inline __m256i caffe_pool_lanes8(Py_ssize_t c, Py_ssize_t n) {
        Py_ssize_t lo = c < 0 ? -c : 0, hi = n - c;
        if (hi > 8)
            hi = 8;
        if (lo > 8)
            lo = 8;
        if (hi < lo)
            hi = lo;
        __m256i l = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        return _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)lo), l),
                                   _mm256_cmpgt_epi32(_mm256_set1_epi32((int)hi), l));
    }
    /* caffe_pool_k3s2_hrow16 eight wide: xr[0..16] the columns of 8 windows; edge: only the lanes la / lb (and
       xr[16] if lc) inside the row, the others NaN */
    static inline void caffe_pool_k3s2_hrow8(const float* xr, int edge, __m256i la, __m256i lb, int lc, __m256i b0,
                                             __m256i b1, __m256i b2, __m256i rw, __m256* m, __m256i* c) {
        const __m256 nan = _mm256_set1_ps(NAN);
        __m256 a, b, e, t0, t1, t2, mm, g;
        __m256i cc;
        if (!edge) {
            a = _mm256_loadu_ps(xr);
            b = _mm256_loadu_ps(xr + 8);
            e = _mm256_broadcast_ss(xr + 16);
        } else {
            a = _mm256_blendv_ps(nan, _mm256_maskload_ps(xr, la), _mm256_castsi256_ps(la));
            b = _mm256_blendv_ps(nan, _mm256_maskload_ps(xr + 8, lb), _mm256_castsi256_ps(lb));
            e = _mm256_set1_ps(lc ? xr[16] : NAN);
        }
        t0 = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
        t1 = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
        t0 = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(t0), _MM_SHUFFLE(3, 1, 2, 0)));
        t1 = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(t1), _MM_SHUFFLE(3, 1, 2, 0)));
        t2 = _mm256_permutevar8x32_ps(t0, _mm256_setr_epi32(1, 2, 3, 4, 5, 6, 7, 7));
        t2 = _mm256_blend_ps(t2, e, 0x80);
        mm = _mm256_max_ps(t0, _mm256_set1_ps(-FLT_MAX));  /* t0 > -FLT_MAX ? t0 : -FLT_MAX */
        g = _mm256_cmp_ps(t1, mm, _CMP_GT_OQ);
        mm = _mm256_blendv_ps(mm, t1, g);
        cc = _mm256_blendv_epi8(b0, b1, _mm256_castps_si256(g));
        g = _mm256_cmp_ps(t2, mm, _CMP_GT_OQ);
        *m = _mm256_blendv_ps(mm, t2, g);
        *c = _mm256_add_epi32(_mm256_blendv_epi8(cc, b2, _mm256_castps_si256(g)), rw);
    }
    static inline void caffe_pool_max_k3s2(const float* x, float* y, int* mask, Py_ssize_t H, Py_ssize_t W,
                                           Py_ssize_t PH, Py_ssize_t PW, Py_ssize_t pad_h, Py_ssize_t pad_w,
                                           const char* nxt, Py_ssize_t nxt_bytes) {
        const __m256 neg = _mm256_set1_ps(-FLT_MAX);
        const __m256i none = _mm256_set1_epi32(-1), lane2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
        Py_ssize_t pw0 = 0, ph, r, per = PH > 0 ? ((nxt_bytes + 63) / 64 + PH - 1) / PH : 0, l;
        for (;;) {
            if (PW >= 8 && pw0 + 8 > PW)
                pw0 = PW - 8;
            Py_ssize_t c0 = 2 * pw0 - pad_w;
            int edge = !(c0 >= 0 && c0 + 17 <= W), lc = c0 + 16 >= 0 && c0 + 16 < W;
            __m256i la = caffe_pool_lanes8(c0, W), lb = caffe_pool_lanes8(c0 + 8, W), st = caffe_pool_lanes8(pw0, PW);
            int full = PW - pw0 >= 8;
            __m256i b0 = _mm256_add_epi32(_mm256_set1_epi32((int)c0), lane2);
            __m256i b1 = _mm256_add_epi32(b0, _mm256_set1_epi32(1)), b2 = _mm256_add_epi32(b0, _mm256_set1_epi32(2));
            __m256 mc = neg, m1, m2, v, g;
            __m256i cc = none, c1, c2, i;
            r = -pad_h;
            if (r >= 0 && r < H)
                caffe_pool_k3s2_hrow8(x + r * W + c0, edge, la, lb, lc, b0, b1, b2, _mm256_set1_epi32((int)(r * W)), &mc, &cc);
            for (ph = 0; ph < PH; ph++) {
                m1 = neg; c1 = none; m2 = neg; c2 = none;
                r = 2 * ph - pad_h + 1;
                if (r >= 0 && r < H)
                    caffe_pool_k3s2_hrow8(x + r * W + c0, edge, la, lb, lc, b0, b1, b2, _mm256_set1_epi32((int)(r * W)), &m1, &c1);
                r++;
                if (r >= 0 && r < H)
                    caffe_pool_k3s2_hrow8(x + r * W + c0, edge, la, lb, lc, b0, b1, b2, _mm256_set1_epi32((int)(r * W)), &m2, &c2);
                g = _mm256_cmp_ps(m1, mc, _CMP_GT_OQ);
                v = _mm256_blendv_ps(mc, m1, g);
                i = _mm256_blendv_epi8(cc, c1, _mm256_castps_si256(g));
                g = _mm256_cmp_ps(m2, v, _CMP_GT_OQ);
                v = _mm256_blendv_ps(v, m2, g);
                i = _mm256_blendv_epi8(i, c2, _mm256_castps_si256(g));
                i = _mm256_or_si256(i, _mm256_castps_si256(_mm256_cmp_ps(v, neg, _CMP_EQ_OQ)));  /* took nothing: -1 */
                if (full) {
                    _mm256_storeu_ps(y + ph * PW + pw0, v);
                    _mm256_storeu_si256((__m256i*)(mask + ph * PW + pw0), i);
                } else {
                    _mm256_maskstore_ps(y + ph * PW + pw0, st, v);
                    _mm256_maskstore_epi32(mask + ph * PW + pw0, st, i);
                }
                mc = m2;
                cc = c2;
                if (nxt != NULL && pw0 == 0)
                    for (l = ph * per; l < (ph + 1) * per && 64 * l < nxt_bytes; l++)
                        __builtin_prefetch(nxt + 64 * l, 0, 2);
            }
            if (pw0 + 8 >= PW)
                break;
            pw0 += 8;
        }
    }
    #else
    #define CAFFE_POOL_K3S2 0
    static inline void caffe_pool_max_k3s2(const float* x, float* y, int* mask, Py_ssize_t H, Py_ssize_t W,
                                           Py_ssize_t PH, Py_ssize_t PW, Py_ssize_t pad_h, Py_ssize_t pad_w,
                                           const char* nxt, Py_ssize_t nxt_bytes) {}
    #endif
    """
    int CAFFE_POOL_K3S2
    void caffe_pool_max_k3s2(const float* x, float* y, int* mask, Py_ssize_t H, Py_ssize_t W, Py_ssize_t PH,
                             Py_ssize_t PW, Py_ssize_t pad_h, Py_ssize_t pad_w, const char* nxt,
                             Py_ssize_t nxt_bytes) nogil


cdef inline void _max_hrow_k3s2(const real* src, real* hm, int* hc, Py_ssize_t lo,
                                Py_ssize_t hi) noexcept nogil:
    cdef Py_ssize_t pw
    cdef real m, v
    cdef int c
    if real is float:
        if CAFFE_POOL_AVX512 and hi - lo >= 16:
            pw = lo
            while pw + 16 <= hi:
                caffe_pool_h_k3s2_f16(src + 2 * pw, hm + pw, hc + pw)
                pw += 16
            if pw < hi:
                caffe_pool_h_k3s2_f16(src + 2 * (hi - 16), hm + hi - 16, hc + hi - 16)
            return
        if CAFFE_POOL_AVX2 and hi - lo >= 8:
            pw = lo
            while pw + 8 <= hi:
                caffe_pool_h_k3s2_f8(src + 2 * pw, hm + pw, hc + pw)
                pw += 8
            if pw < hi:
                caffe_pool_h_k3s2_f8(src + 2 * (hi - 8), hm + hi - 8, hc + hi - 8)
            return
    for pw in range(lo, hi):
        v = src[2 * pw]
        c = 0 if v > -FLT_MAX else -1
        m = v if v > -FLT_MAX else -FLT_MAX
        v = src[2 * pw + 1]
        c = 1 if v > m else c
        m = v if v > m else m
        v = src[2 * pw + 2]
        c = 2 if v > m else c
        m = v if v > m else m
        hm[pw] = m
        hc[pw] = c


cdef inline void _max_hrow_k3s1(const real* src, real* hm, int* hc, Py_ssize_t lo,
                                Py_ssize_t hi) noexcept nogil:
    cdef Py_ssize_t pw
    cdef real m, v
    cdef int c
    for pw in range(lo, hi):
        v = src[pw]
        c = 0 if v > -FLT_MAX else -1
        m = v if v > -FLT_MAX else -FLT_MAX
        v = src[pw + 1]
        c = 1 if v > m else c
        m = v if v > m else m
        v = src[pw + 2]
        c = 2 if v > m else c
        m = v if v > m else m
        hm[pw] = m
        hc[pw] = c


cdef inline void _max_hrow_any(const real* src, real* hm, int* hc, Py_ssize_t lo, Py_ssize_t hi,
                               Py_ssize_t kw, Py_ssize_t sw) noexcept nogil:
    if kw == 3 and sw == 2:
        _max_hrow_k3s2(src, hm, hc, lo, hi)
    elif kw == 3 and sw == 1:
        _max_hrow_k3s1(src, hm, hc, lo, hi)
    else:
        _max_hrow(src, hm, hc, lo, hi, kw, sw)


# The values alone (max_pool_forward without a mask): the scans above without the argmax bookkeeping, so the
# same values bit for bit (the first maximum in row-major order: the sign of a zero tie included).

cdef inline void _maxv_hrow(const real* src, real* hm, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t kw,
                            Py_ssize_t sw) noexcept nogil:
    """Windows lo..hi of a row, all inside it: window pw reads src[sw * pw + j], j < kw."""
    cdef Py_ssize_t pw, j
    cdef real m, v
    if kw == 3 and sw == 2:
        if real is float:
            if CAFFE_POOL_AVX512 and hi - lo >= 16:
                pw = lo
                while pw + 16 <= hi:
                    caffe_poolv_h_k3s2_f16(src + 2 * pw, hm + pw)
                    pw += 16
                if pw < hi:
                    caffe_poolv_h_k3s2_f16(src + 2 * (hi - 16), hm + hi - 16)
                return
            if CAFFE_POOL_AVX2 and hi - lo >= 8:
                pw = lo
                while pw + 8 <= hi:
                    caffe_poolv_h_k3s2_f8(src + 2 * pw, hm + pw)
                    pw += 8
                if pw < hi:
                    caffe_poolv_h_k3s2_f8(src + 2 * (hi - 8), hm + hi - 8)
                return
        for pw in range(lo, hi):
            m = -FLT_MAX
            v = src[2 * pw]
            m = v if v > m else m
            v = src[2 * pw + 1]
            m = v if v > m else m
            v = src[2 * pw + 2]
            hm[pw] = v if v > m else m
        return
    if kw == 3 and sw == 1:
        for pw in range(lo, hi):
            m = -FLT_MAX
            v = src[pw]
            m = v if v > m else m
            v = src[pw + 1]
            m = v if v > m else m
            v = src[pw + 2]
            hm[pw] = v if v > m else m
        return
    for pw in range(lo, hi):
        m = -FLT_MAX
        for j in range(kw):
            v = src[sw * pw + j]
            m = v if v > m else m
        hm[pw] = m


cdef inline void _maxv_hrow_edge(const real* xr, real* hm, Py_ssize_t W, Py_ssize_t pw, Py_ssize_t kw,
                                 Py_ssize_t sw, Py_ssize_t pad_w) noexcept nogil:
    cdef Py_ssize_t w, ws = pw * sw - pad_w, we
    cdef real m = -FLT_MAX, v
    we = ws + kw
    if we > W:
        we = W
    if ws < 0:
        ws = 0
    for w in range(ws, we):
        v = xr[w]
        m = v if v > m else m
    hm[pw] = m


cdef inline void _maxv_vrows(const real* hm, real* yr, Py_ssize_t hs, Py_ssize_t he,
                             Py_ssize_t PW) noexcept nogil:
    """_max_vrows for the values alone."""
    cdef Py_ssize_t h, pw
    cdef const real* h0
    cdef real m, v
    if he <= hs:
        for pw in range(PW):
            yr[pw] = -FLT_MAX
        return
    h0 = hm + hs * PW
    if real is float:
        if CAFFE_POOL_AVX512 and PW >= 16:
            caffe_poolv_vrows_f16(h0, he - hs, PW, yr)
            return
        if CAFFE_POOL_AVX2 and PW >= 8:
            caffe_poolv_vrows_f8(h0, he - hs, PW, yr)
            return
    for pw in range(PW):
        yr[pw] = h0[pw]
    for h in range(hs + 1, he):  # contiguous rows, no branch: vectorizes (MAXPS)
        h0 = hm + h * PW
        for pw in range(PW):
            v = h0[pw]
            m = yr[pw]
            yr[pw] = v if v > m else m


cdef inline void _hrow_edge(const real* xr, real* hr, int* cr, Py_ssize_t W, Py_ssize_t pw, Py_ssize_t kw,
                            Py_ssize_t sw, Py_ssize_t pad_w) noexcept nogil:
    if cr != NULL:
        _max_hrow_edge(xr, hr, cr, W, pw, kw, sw, pad_w)
    else:
        _maxv_hrow_edge(xr, hr, W, pw, kw, sw, pad_w)


# The next plane's lines are asked for (into L2) while the vertical pass works on this plane's row maxima, which
# are in cache: without it the memory bus idles through that pass (the horizontal one reads the plane at full
# speed, then nothing is read until the next plane starts). Only a hint: the results do not depend on it.
cdef extern from *:
    """
    #if defined(__GNUC__)
    #define caffe_pool_prefetch(p) __builtin_prefetch((p), 0, 2)
    #else
    #define caffe_pool_prefetch(p) ((void)(p))
    #endif
    """
    void caffe_pool_prefetch(const char* p) nogil

cdef enum:
    PREFETCH_CHUNK = 4  # MAX pooling planes per grab (at least): the plane after this one is the same thread's
    # planes at least this big (bytes) are prefetched: smaller ones come many to a grab, one contiguous run the
    # hardware prefetcher follows (27x27: 0.9-0.96x with the hints, 55x55 1.0, 56x56 1.17, 112x112 1.15-1.27)
    PREFETCH_MIN_BYTES = 8192


cdef inline void _prefetch_part(const char* nxt, Py_ssize_t nbytes, Py_ssize_t part, Py_ssize_t parts) noexcept nogil:
    """Part `part` of `parts` of the 64-byte lines of nxt[0..nbytes)."""
    cdef Py_ssize_t lines = (nbytes + 63) // 64, per = (lines + parts - 1) // parts, l, end
    end = (part + 1) * per
    if end > lines:
        end = lines
    for l in range(part * per, end):
        caffe_pool_prefetch(nxt + 64 * l)


cdef inline void _max_plane_sep(const real* x, real* y, int* mask, real* hm, int* hc,
                                Py_ssize_t H, Py_ssize_t W, Py_ssize_t PH, Py_ssize_t PW,
                                Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw,
                                Py_ssize_t pad_h, Py_ssize_t pad_w, const real* nxt) noexcept nogil:
    cdef Py_ssize_t h, ph, pw, lo, hi, hs, he
    cdef const real* xr
    cdef real* hr
    cdef int* cr
    # windows entirely inside a row: pw * sw - pad_w >= 0 and pw * sw - pad_w + kw <= W
    lo = (pad_w + sw - 1) // sw
    hi = (W - kw + pad_w) // sw + 1 if W - kw + pad_w >= 0 else 0
    if hi > PW:
        hi = PW
    if lo > hi:
        lo = hi
    if sw * PW == W and lo < hi:
        # Rows of windows tile the image rows (W even at 3x3/2, any W at 3x3/1 pad 1): window k of the
        # plane's H x PW starts at sw * k - pad_w, so all rows are one long loop (rows are short:
        # per-row loop overhead cost more than the work). Windows past a row's edge come out wrong
        # there (their reads stay inside the plane) and are redone, clipped, below.
        if hc != NULL:
            _max_hrow_any(x - pad_w, hm, hc, lo, (H - 1) * PW + hi, kw, sw)
        else:
            _maxv_hrow(x - pad_w, hm, lo, (H - 1) * PW + hi, kw, sw)
        for h in range(H):
            xr = x + h * W
            hr = hm + h * PW
            cr = hc + h * PW if hc != NULL else NULL
            for pw in range(lo):
                _hrow_edge(xr, hr, cr, W, pw, kw, sw, pad_w)
            for pw in range(hi, PW):
                _hrow_edge(xr, hr, cr, W, pw, kw, sw, pad_w)
    else:
        for h in range(H):
            xr = x + h * W
            hr = hm + h * PW
            cr = hc + h * PW if hc != NULL else NULL
            for pw in range(lo):
                _hrow_edge(xr, hr, cr, W, pw, kw, sw, pad_w)
            if cr != NULL:
                _max_hrow_any(xr - pad_w, hr, cr, lo, hi, kw, sw)
            else:
                _maxv_hrow(xr - pad_w, hr, lo, hi, kw, sw)
            for pw in range(hi, PW):
                _hrow_edge(xr, hr, cr, W, pw, kw, sw, pad_w)
    for ph in range(PH):
        if nxt != NULL:
            _prefetch_part(<const char*>nxt, H * W * sizeof(real), ph, PH)
        hs = ph * sh - pad_h
        he = hs + kh
        if he > H:
            he = H
        if hs < 0:
            hs = 0
        if mask != NULL:
            _max_vrows(hm, hc, y + ph * PW, mask + ph * PW, hs, he, W, PW, sw, pad_w)
        else:
            _maxv_vrows(hm, y + ph * PW, hs, he, PW)


cdef inline void _max_vrows(const real* hm, const int* hc, real* yr, int* mr, Py_ssize_t hs,
                            Py_ssize_t he, Py_ssize_t W, Py_ssize_t PW, Py_ssize_t sw,
                            Py_ssize_t pad_w) noexcept nogil:
    """One output row: the first maximum over image rows hs..he of the row maxima (hm, hc). A row
    maximum is -FLT_MAX exactly when its tap is -1, so the first row is taken as it is. Index
    arithmetic in int (32-bit lanes, as the float32 values'): row + window column + tap."""
    cdef Py_ssize_t h
    cdef int pw, n = <int>PW, s = <int>sw, p0 = <int>pad_w
    cdef const real* h0 = hm + hs * PW
    cdef const int* c0 = hc + hs * PW
    cdef const real* h1
    cdef const int* c1
    cdef const real* h2
    cdef const int* c2
    cdef int r0 = <int>(hs * W), r1 = r0 + <int>W, r2 = r1 + <int>W, idx
    cdef real m, v
    if he - hs == 3:  # the common case in one pass, the running max in registers
        h1 = h0 + PW
        c1 = c0 + PW
        h2 = h1 + PW
        c2 = c1 + PW
        if real is float:
            if CAFFE_POOL_AVX512 and n >= 16:
                pw = 0
                while pw + 16 <= n:
                    caffe_pool_v3_f16(h0, h1, h2, c0, c1, c2, yr, mr, pw, r0, r1, r2, s, p0)
                    pw += 16
                if pw < n:
                    caffe_pool_v3_f16(h0, h1, h2, c0, c1, c2, yr, mr, n - 16, r0, r1, r2, s, p0)
                return
            if CAFFE_POOL_AVX2 and n >= 8:
                pw = 0
                while pw + 8 <= n:
                    caffe_pool_v3_f8(h0, h1, h2, c0, c1, c2, yr, mr, pw, r0, r1, r2, s, p0)
                    pw += 8
                if pw < n:
                    caffe_pool_v3_f8(h0, h1, h2, c0, c1, c2, yr, mr, n - 8, r0, r1, r2, s, p0)
                return
        for pw in range(n):
            m = h0[pw]
            idx = r0 + s * pw - p0 + c0[pw] if c0[pw] >= 0 else -1
            v = h1[pw]
            idx = r1 + s * pw - p0 + c1[pw] if v > m else idx
            m = v if v > m else m
            v = h2[pw]
            idx = r2 + s * pw - p0 + c2[pw] if v > m else idx
            m = v if v > m else m
            yr[pw] = m
            mr[pw] = idx
        return
    if he <= hs:
        for pw in range(PW):
            yr[pw] = -FLT_MAX
            mr[pw] = -1
        return
    for pw in range(n):
        yr[pw] = h0[pw]
        mr[pw] = r0 + s * pw - p0 + c0[pw] if c0[pw] >= 0 else -1
    for h in range(hs + 1, he):
        h1 = hm + h * PW
        c1 = hc + h * PW
        r1 = <int>(h * W)
        for pw in range(n):  # (contiguous, no branch: vectorizes)
            v = h1[pw]
            m = yr[pw]
            mr[pw] = r1 + s * pw - p0 + c1[pw] if v > m else mr[pw]
            yr[pw] = v if v > m else m


cdef inline Py_ssize_t _ave_extent(Py_ssize_t p, Py_ssize_t k, Py_ssize_t s, Py_ssize_t pad,
                                   Py_ssize_t n) noexcept nogil:
    """Window p's extent along one axis as AVE's divisor counts it (Caffe): clipped to the padded input
    (n + pad), not to the input, so border windows divide by more than the pixels they sum."""
    cdef Py_ssize_t start = p * s - pad
    return min(start + k, n + pad) - start


# AVE runs a whole output row at a time: for each image row h of the window and each kernel
# column j, every window pw of the row is updated. Each window still sums its pixels in
# Caffe's row-major order (h, then w = ws + j ascending), so the results are Caffe's to the
# bit, but the windows' independent additions pipeline instead of one window's serial chain.
cdef inline void _ave_plane(const real* x, real* y, Py_ssize_t H, Py_ssize_t W,
                            Py_ssize_t PH, Py_ssize_t PW, Py_ssize_t kh, Py_ssize_t kw,
                            Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t pad_h,
                            Py_ssize_t pad_w) noexcept nogil:
    cdef Py_ssize_t ph, pw, h, j, hs, he, hsize, lo, hi
    cdef Py_ssize_t los[PW_RANGES]
    cdef Py_ssize_t his[PW_RANGES]
    cdef real* yr
    cdef const real* row
    _pw_ranges(kw, W, sw, pad_w, PW, los, his)
    for ph in range(PH):
        yr = y + ph * PW
        for pw in range(PW):
            yr[pw] = 0
        hsize = _ave_extent(ph, kh, sh, pad_h, H)
        hs = ph * sh - pad_h
        he = min(hs + kh, H)
        hs = max(hs, 0)
        for h in range(hs, he):
            row = x + h * W
            for j in range(kw):
                _pw_take(j, kw, W, sw, pad_w, PW, los, his, &lo, &hi)
                for pw in range(lo, hi):
                    yr[pw] = yr[pw] + row[pw * sw - pad_w + j]
        for pw in range(PW):
            yr[pw] = yr[pw] / (hsize * _ave_extent(pw, kw, sw, pad_w, W))


cdef inline void _max_back_plane_2x2(const real* dy, const int* mask, real* dx, Py_ssize_t W, Py_ssize_t PH,
                                     Py_ssize_t PW) noexcept nogil:
    """_max_back_plane for 2x2 / stride 2 windows that tile the plane, float32 rows of at least 8 outputs
    (max_pool_backward's whole_2x2 says when): by caffe_pool_back_2x2_row8, the same bits; a plane whose mask has an
    argmax outside its window by the scatter."""
    cdef Py_ssize_t ph
    if real is float:  # (always: the double specialization is never called)
        for ph in range(PH):
            if not caffe_pool_back_2x2_row8(dy + ph * PW, mask + ph * PW, dx + 2 * ph * W, dx + (2 * ph + 1) * W,
                                            PW, <int>(2 * ph * W), <int>W):
                break
        else:
            return
    _max_back_plane(dy, mask, dx, 4 * PH * PW, PH * PW)


cdef inline void _max_back_plane(const real* dy, const int* mask, real* dx, Py_ssize_t HW,
                                 Py_ssize_t PHW) noexcept nogil:
    cdef Py_ssize_t k
    cdef int idx
    for k in range(HW):
        dx[k] = 0
    for k in range(PHW):
        idx = mask[k]
        if idx >= 0 and idx < HW:  # (an argmax past the plane, from an edited mask top, is dropped, not written)
            dx[idx] = dx[idx] + dy[k]


# Each window's share dy / pool size is divided once into q (PW of scratch), not once per pixel it
# reaches: the same quotient (so the same results), but a 3x3 window's nine divisions, which bounded
# the kernel's time (CIFAR10-quick pool2: 1.8 M of them), become one.
cdef inline void _ave_back_plane(const real* dy, real* dx, Py_ssize_t H, Py_ssize_t W,
                                 Py_ssize_t PH, Py_ssize_t PW, Py_ssize_t kh, Py_ssize_t kw,
                                 Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t pad_h,
                                 Py_ssize_t pad_w, real* q) noexcept nogil:
    cdef Py_ssize_t ph, pw, h, j, hs, he, hsize, lo, hi, k
    cdef Py_ssize_t los[PW_RANGES]
    cdef Py_ssize_t his[PW_RANGES]
    cdef const real* dr
    cdef real* row
    _pw_ranges(kw, W, sw, pad_w, PW, los, his)
    for k in range(H * W):
        dx[k] = 0
    for ph in range(PH):
        dr = dy + ph * PW
        hsize = _ave_extent(ph, kh, sh, pad_h, H)
        hs = ph * sh - pad_h
        he = min(hs + kh, H)
        hs = max(hs, 0)
        for pw in range(PW):
            q[pw] = dr[pw] / (hsize * _ave_extent(pw, kw, sw, pad_w, W))
        for h in range(hs, he):
            row = dx + h * W
            # j descending: a pixel then receives its windows' shares in ascending pw, Caffe's order
            for j in range(kw - 1, -1, -1):
                _pw_take(j, kw, W, sw, pad_w, PW, los, his, &lo, &hi)
                for pw in range(lo, hi):
                    row[pw * sw - pad_w + j] += q[pw]


# Global AVE pooling of float32 planes, AVX-512 / AVX2 builds: sixteen / eight planes at once, one per lane, each
# still summed in Caffe's order (row-major, from 0) and divided by (float)(H * W), so the bits of _ave_plane_global.
# Blocks of 16 (8) consecutive values of each of the 16 (8) planes are loaded and transposed in registers (lane i then
# holds plane i's values), so the planes' serial chains of additions become one chain of vector additions. The
# scalar _ave_global_8 did one addition per value, bounded by the adds and loads, not by memory: at 8x2048x7x7 (3.2 MB,
# in L3 in a net) it took 2x the time of a read of the blob.
cdef extern from *:
    """
    #if defined(__AVX512F__)
    #define CAFFE_POOL_AVE_GLOBAL16 1
    /* r[i] (row i) becomes column i: r[j] lane i = old r[i] lane j */
    static inline void caffe_pool_transpose16(__m512* r) {
        __m512 t[16];
        int i;
        for (i = 0; i < 16; i += 2) {
            t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
            t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
        }
        for (i = 0; i < 16; i += 4) {
            r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
            r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
            r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
            r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
        }
        for (i = 0; i < 4; i++) {
            t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
            t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
            t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
            t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
        }
        for (i = 0; i < 8; i++) {
            r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
            r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
        }
    }
    /* y[i] = (0 + x[i HW] + x[i HW + 1] + ... ) / HW, i < 16, the sums in that order */
    static inline void caffe_pool_ave_global16(const float* x, float* y, Py_ssize_t HW) {
        __m512 acc = _mm512_setzero_ps(), r[16];
        Py_ssize_t c, n, i, j;
        for (c = 0; c < HW; c += 16) {
            n = HW - c < 16 ? HW - c : 16;
            __mmask16 l = n == 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
            for (i = 0; i < 16; i++)
                r[i] = n == 16 ? _mm512_loadu_ps(x + i * HW + c) : _mm512_maskz_loadu_ps(l, x + i * HW + c);
            caffe_pool_transpose16(r);
            for (j = 0; j < n; j++)
                acc = _mm512_add_ps(acc, r[j]);
        }
        _mm512_storeu_ps(y, _mm512_div_ps(acc, _mm512_set1_ps((float)HW)));
    }
    #else
    #define CAFFE_POOL_AVE_GLOBAL16 0
    static inline void caffe_pool_ave_global16(const float* x, float* y, Py_ssize_t HW) {}
    #endif
    #if defined(__AVX2__)
    #define CAFFE_POOL_AVE_GLOBAL8 1
    /* caffe_pool_transpose16 for eight rows of eight */
    static inline void caffe_pool_transpose8(__m256* r) {
        __m256 t[8];
        int i;
        for (i = 0; i < 8; i += 2) {
            t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
            t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
        }
        for (i = 0; i < 8; i += 4) {
            r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
            r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
            r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
            r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
        }
        for (i = 0; i < 4; i++) {
            t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
            t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
        }
        for (i = 0; i < 8; i++)
            r[i] = t[i];
    }
    /* caffe_pool_ave_global16 eight planes wide (the AVX2 build) */
    static inline void caffe_pool_ave_global8(const float* x, float* y, Py_ssize_t HW) {
        __m256 acc = _mm256_setzero_ps(), r[8];
        Py_ssize_t c, n, i, j;
        for (c = 0; c < HW; c += 8) {
            n = HW - c < 8 ? HW - c : 8;
            if (n == 8) {
                for (i = 0; i < 8; i++)
                    r[i] = _mm256_loadu_ps(x + i * HW + c);
            } else {
                __m256i l = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
                for (i = 0; i < 8; i++)
                    r[i] = _mm256_maskload_ps(x + i * HW + c, l);
            }
            caffe_pool_transpose8(r);
            for (j = 0; j < n; j++)
                acc = _mm256_add_ps(acc, r[j]);
        }
        _mm256_storeu_ps(y, _mm256_div_ps(acc, _mm256_set1_ps((float)HW)));
    }
    #else
    #define CAFFE_POOL_AVE_GLOBAL8 0
    static inline void caffe_pool_ave_global8(const float* x, float* y, Py_ssize_t HW) {}
    #endif
    """
    bint CAFFE_POOL_AVE_GLOBAL16
    bint CAFFE_POOL_AVE_GLOBAL8
    void caffe_pool_ave_global16(const float* x, float* y, Py_ssize_t HW) nogil
    void caffe_pool_ave_global8(const float* x, float* y, Py_ssize_t HW) nogil


cdef inline void _ave_plane_global(const real* x, real* y, Py_ssize_t HW) noexcept nogil:
    """A window covering the whole (unpadded) plane: the sum in Caffe's row-major order / H * W."""
    cdef Py_ssize_t k
    cdef real acc = 0
    for k in range(HW):
        acc = acc + x[k]
    y[0] = acc / HW


cdef inline void _ave_global_8(const real* x, real* y, Py_ssize_t HW) noexcept nogil:
    """Eight planes at once: each still summed in Caffe's row-major order (so the same results as
    _ave_plane_global), but the eight serial chains of additions overlap instead of waiting on each
    other (a 7x7 plane is 49 dependent additions: latency, not memory, bounded global pooling)."""
    cdef Py_ssize_t k
    cdef real a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0
    for k in range(HW):
        a0 = a0 + x[k]
        a1 = a1 + x[HW + k]
        a2 = a2 + x[2 * HW + k]
        a3 = a3 + x[3 * HW + k]
        a4 = a4 + x[4 * HW + k]
        a5 = a5 + x[5 * HW + k]
        a6 = a6 + x[6 * HW + k]
        a7 = a7 + x[7 * HW + k]
    y[0] = a0 / HW
    y[1] = a1 / HW
    y[2] = a2 / HW
    y[3] = a3 / HW
    y[4] = a4 / HW
    y[5] = a5 / HW
    y[6] = a6 / HW
    y[7] = a7 / HW


cdef inline void _ave_back_plane_global(const real* dy, real* dx, Py_ssize_t HW) noexcept nogil:
    cdef Py_ssize_t k
    cdef real g = dy[0] / HW
    for k in range(HW):
        dx[k] = g


def _check(Py_ssize_t have, Py_ssize_t need, str what):
    if have < need:
        raise ValueError(f"pooling kernel: {what} buffer holds {have} elements, needs {need}")


cdef inline void _max_plane_2x2(const real* x, real* y, int* mask, Py_ssize_t W,
                                Py_ssize_t PH, Py_ssize_t PW) noexcept nogil:
    """The common 2x2 / stride 2 / no pad case on whole windows: the same strict-greater scan from
    -FLT_MAX in row-major order as _max_plane (so the same values and argmaxes), without its window
    bookkeeping."""
    cdef Py_ssize_t ph, pw, top
    cdef const real* r0
    cdef const real* r1
    cdef real m, v
    cdef int idx
    for ph in range(PH):
        r0 = x + 2 * ph * W
        r1 = r0 + W
        if real is float:
            if CAFFE_POOL_AVX512 and PW >= 16:  # blocks of sixteen; the last one ends at the row's last output
                pw = 0
                while pw + 16 <= PW:
                    caffe_pool_2x2_f16(r0 + 2 * pw, r1 + 2 * pw, y + ph * PW + pw, mask + ph * PW + pw,
                                       <int>(2 * ph * W + 2 * pw), <int>W)
                    pw += 16
                if pw < PW:
                    pw = PW - 16
                    caffe_pool_2x2_f16(r0 + 2 * pw, r1 + 2 * pw, y + ph * PW + pw, mask + ph * PW + pw,
                                       <int>(2 * ph * W + 2 * pw), <int>W)
                continue
            if CAFFE_POOL_AVX2 and PW >= 8:  # blocks of eight; the last one ends at the row's last output
                pw = 0
                while pw + 8 <= PW:
                    caffe_pool_2x2_f8(r0 + 2 * pw, r1 + 2 * pw, y + ph * PW + pw, mask + ph * PW + pw,
                                      <int>(2 * ph * W + 2 * pw), <int>W)
                    pw += 8
                if pw < PW:
                    pw = PW - 8
                    caffe_pool_2x2_f8(r0 + 2 * pw, r1 + 2 * pw, y + ph * PW + pw, mask + ph * PW + pw,
                                      <int>(2 * ph * W + 2 * pw), <int>W)
                continue
        for pw in range(PW):
            m = -FLT_MAX
            idx = -1
            top = 2 * ph * W + 2 * pw
            v = r0[2 * pw]
            if v > m:
                m = v
                idx = <int>top
            v = r0[2 * pw + 1]
            if v > m:
                m = v
                idx = <int>(top + 1)
            v = r1[2 * pw]
            if v > m:
                m = v
                idx = <int>(top + W)
            v = r1[2 * pw + 1]
            if v > m:
                m = v
                idx = <int>(top + W + 1)
            y[ph * PW + pw] = m
            mask[ph * PW + pw] = idx


cdef inline void _maxv_plane_2x2(const real* x, real* y, Py_ssize_t W, Py_ssize_t PH,
                                 Py_ssize_t PW) noexcept nogil:
    cdef Py_ssize_t ph, pw
    cdef const real* r0
    cdef const real* r1
    cdef real m, v
    for ph in range(PH):
        r0 = x + 2 * ph * W
        r1 = r0 + W
        if real is float:
            if CAFFE_POOL_AVX512 and PW >= 16:
                pw = 0
                while pw + 16 <= PW:
                    caffe_poolv_2x2_f16(r0 + 2 * pw, r1 + 2 * pw, y + ph * PW + pw)
                    pw += 16
                if pw < PW:
                    pw = PW - 16
                    caffe_poolv_2x2_f16(r0 + 2 * pw, r1 + 2 * pw, y + ph * PW + pw)
                continue
            if CAFFE_POOL_AVX2 and PW >= 8:
                pw = 0
                while pw + 8 <= PW:
                    caffe_poolv_2x2_f8(r0 + 2 * pw, r1 + 2 * pw, y + ph * PW + pw)
                    pw += 8
                if pw < PW:
                    pw = PW - 8
                    caffe_poolv_2x2_f8(r0 + 2 * pw, r1 + 2 * pw, y + ph * PW + pw)
                continue
        for pw in range(PW):
            m = -FLT_MAX
            v = r0[2 * pw]
            m = v if v > m else m
            v = r0[2 * pw + 1]
            m = v if v > m else m
            v = r1[2 * pw]
            m = v if v > m else m
            v = r1[2 * pw + 1]
            y[ph * PW + pw] = v if v > m else m


def max_pool_forward(const real[::1] x, real[::1] y, int[::1] mask, Py_ssize_t planes,
                     Py_ssize_t H, Py_ssize_t W, Py_ssize_t PH, Py_ssize_t PW,
                     Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw,
                     Py_ssize_t pad_h, Py_ssize_t pad_w):
    """y = max over each window; mask = argmax (h * W + w within the plane, -1 if empty). mask None:
    the values alone (the same bits), the argmax's write and bookkeeping saved, for a forward no
    backward reads (a TEST-phase net's)."""
    cdef Py_ssize_t p
    if planes * PH * PW == 0:
        return
    _check(x.shape[0], planes * H * W, "bottom")
    _check(y.shape[0], planes * PH * PW, "top")
    if mask is not None:
        _check(mask.shape[0], planes * PH * PW, "mask")
    cdef const real* xp = &x[0] if H * W > 0 else NULL
    cdef real* yp = &y[0]
    cdef int* mp = &mask[0] if mask is not None else NULL
    cdef int nt = _threads(planes * (H * W + PH * PW))
    cdef Py_ssize_t g = _grab(H * W + PH * PW)
    cdef bint whole_2x2 = (kh == 2 and kw == 2 and sh == 2 and sw == 2 and pad_h == 0 and pad_w == 0
                           and 2 * PH == H and 2 * PW == W)
    cdef real* hm
    cdef int* hc
    cdef const real* nxt
    if whole_2x2:
        with nogil:
            for p in prange(planes, schedule="dynamic", chunksize=g, num_threads=nt):
                if mp != NULL:
                    _max_plane_2x2(xp + p * H * W, yp + p * PH * PW, mp + p * PH * PW, W, PH, PW)
                else:
                    _maxv_plane_2x2(xp + p * H * W, yp + p * PH * PW, W, PH, PW)
        return
    cdef bint prefetch = H * W * sizeof(real) >= PREFETCH_MIN_BYTES
    if prefetch and g < PREFETCH_CHUNK:
        g = PREFETCH_CHUNK
    if real is float:
        if CAFFE_POOL_K3S2 and mp != NULL and kh == 3 and kw == 3 and sh == 2 and sw == 2:
            with nogil:
                for p in prange(planes, schedule="dynamic", chunksize=g, num_threads=nt):
                    nxt = xp + (p + 1) * H * W if prefetch and (p + 1) % g != 0 and p + 1 < planes else NULL
                    caffe_pool_max_k3s2(xp + p * H * W, yp + p * PH * PW, mp + p * PH * PW, H, W, PH, PW, pad_h,
                                        pad_w, <const char*>nxt, H * W * sizeof(float))
            return
    with nogil, parallel(num_threads=nt):
        # per thread: the plane's row maxima and their columns
        hm = <real*>malloc(H * PW * sizeof(real) + H * PW * sizeof(int) + 64)
        if hm == NULL:
            with gil:
                raise MemoryError()
        else:
            hc = <int*>(hm + H * PW)
            # dynamic chunks are consecutive planes from a multiple of g: plane p + 1 is this thread's next
            # unless p ends its chunk
            for p in prange(planes, schedule="dynamic", chunksize=g):
                nxt = xp + (p + 1) * H * W if prefetch and (p + 1) % g != 0 and p + 1 < planes else NULL
                if mp != NULL:
                    _max_plane_sep(xp + p * H * W, yp + p * PH * PW, mp + p * PH * PW, hm, hc, H, W, PH, PW,
                                   kh, kw, sh, sw, pad_h, pad_w, nxt)
                else:  # the values alone (hc, mask NULL)
                    _max_plane_sep(xp + p * H * W, yp + p * PH * PW, NULL, hm, NULL, H, W, PH, PW,
                                   kh, kw, sh, sw, pad_h, pad_w, nxt)
            free(hm)


def ave_pool_forward(const real[::1] x, real[::1] y, Py_ssize_t planes,
                     Py_ssize_t H, Py_ssize_t W, Py_ssize_t PH, Py_ssize_t PW,
                     Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw,
                     Py_ssize_t pad_h, Py_ssize_t pad_w):
    """y = window sum / Caffe's pool size."""
    cdef Py_ssize_t p
    if planes * PH * PW == 0:
        return
    _check(x.shape[0], planes * H * W, "bottom")
    _check(y.shape[0], planes * PH * PW, "top")
    cdef const real* xp = &x[0] if H * W > 0 else NULL
    cdef real* yp = &y[0]
    cdef int nt = _threads(planes * (H * W + PH * PW))
    cdef Py_ssize_t g = _grab(H * W + PH * PW)
    cdef bint whole = PH == 1 and PW == 1 and kh == H and kw == W and pad_h == 0 and pad_w == 0
    with nogil:
        if whole:  # global pooling: blocks of eight planes, then the rest one by one
            if real is float and CAFFE_POOL_AVE_GLOBAL16:
                for p in prange(planes // 16, schedule="dynamic", chunksize=(g + 15) // 16, num_threads=nt):
                    caffe_pool_ave_global16(<const float*>xp + 16 * p * H * W, <float*>yp + 16 * p, H * W)
                for p in range(planes - planes % 16, planes):
                    _ave_plane_global(xp + p * H * W, yp + p, H * W)
            elif real is float and CAFFE_POOL_AVE_GLOBAL8:
                for p in prange(planes // 8, schedule="dynamic", chunksize=(g + 7) // 8, num_threads=nt):
                    caffe_pool_ave_global8(<const float*>xp + 8 * p * H * W, <float*>yp + 8 * p, H * W)
                for p in range(planes - planes % 8, planes):
                    _ave_plane_global(xp + p * H * W, yp + p, H * W)
            else:
                for p in prange(planes // 8, schedule="dynamic", chunksize=(g + 7) // 8, num_threads=nt):
                    _ave_global_8(xp + 8 * p * H * W, yp + 8 * p, H * W)
                for p in range(planes - planes % 8, planes):
                    _ave_plane_global(xp + p * H * W, yp + p, H * W)
        else:
            for p in prange(planes, schedule="dynamic", chunksize=g, num_threads=nt):
                _ave_plane(xp + p * H * W, yp + p * PH * PW, H, W, PH, PW, kh, kw, sh, sw,
                           pad_h, pad_w)


def max_pool_backward(const real[::1] dy, const int[::1] mask, real[::1] dx,
                      Py_ssize_t planes, Py_ssize_t HW, Py_ssize_t PHW, Py_ssize_t W=0, Py_ssize_t PW=0):
    """dx = 0, then dx[mask] += dy, plane by plane. W and PW given (> 0): the windows are 2x2 / stride 2 and tile
    the plane (HW = 4 PHW, W = 2 PW: max_pool_forward's whole_2x2), which the kernel then writes row by row."""
    cdef Py_ssize_t p
    # (only where the rows have a vector path: float32 rows of 8 and more in the AVX2 / AVX-512 builds)
    cdef bint whole_2x2 = (W > 0 and PW >= 8 and W == 2 * PW and HW == 4 * PHW and PHW % PW == 0 and real is float
                           and CAFFE_POOL_AVX2)
    if planes * HW == 0:
        return
    _check(dx.shape[0], planes * HW, "bottom diff")
    if PHW == 0:
        dx[:planes * HW] = 0
        return
    _check(dy.shape[0], planes * PHW, "top diff")
    _check(mask.shape[0], planes * PHW, "mask")
    cdef const real* dyp = &dy[0]
    cdef const int* mp = &mask[0]
    cdef real* dxp = &dx[0]
    cdef int nt = _threads(planes * (HW + PHW))
    cdef Py_ssize_t g = _grab(HW + PHW)
    with nogil:
        if whole_2x2:
            for p in prange(planes, schedule="dynamic", chunksize=g, num_threads=nt):
                _max_back_plane_2x2(dyp + p * PHW, mp + p * PHW, dxp + p * HW, W, PHW // PW, PW)
        else:
            for p in prange(planes, schedule="dynamic", chunksize=g, num_threads=nt):
                _max_back_plane(dyp + p * PHW, mp + p * PHW, dxp + p * HW, HW, PHW)


def ave_pool_backward(const real[::1] dy, real[::1] dx, Py_ssize_t planes,
                      Py_ssize_t H, Py_ssize_t W, Py_ssize_t PH, Py_ssize_t PW,
                      Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw,
                      Py_ssize_t pad_h, Py_ssize_t pad_w):
    """dx = 0, then every window spreads dy / pool size over its image part."""
    cdef Py_ssize_t p
    cdef real* q
    if planes * H * W == 0:
        return
    _check(dx.shape[0], planes * H * W, "bottom diff")
    if PH * PW == 0:
        dx[:planes * H * W] = 0
        return
    _check(dy.shape[0], planes * PH * PW, "top diff")
    cdef const real* dyp = &dy[0]
    cdef real* dxp = &dx[0]
    cdef int nt = _threads(planes * (H * W + PH * PW))
    cdef Py_ssize_t g = _grab(H * W + PH * PW)
    cdef bint whole = PH == 1 and PW == 1 and kh == H and kw == W and pad_h == 0 and pad_w == 0
    with nogil:
        if whole:
            for p in prange(planes, schedule="dynamic", chunksize=g, num_threads=nt):
                _ave_back_plane_global(dyp + p, dxp + p * H * W, H * W)
        else:
            with parallel(num_threads=nt):
                q = <real*>malloc(PW * sizeof(real))
                if q == NULL:
                    with gil:
                        raise MemoryError()
                else:
                    for p in prange(planes, schedule="dynamic", chunksize=g):
                        _ave_back_plane(dyp + p * PH * PW, dxp + p * H * W, H, W, PH, PW, kh, kw, sh, sw,
                                        pad_h, pad_w, q)
                    free(q)

# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math -funroll-loops
# distutils: libraries = m
"""Softmax over the channel axis of an (outer, C, inner) array, forward and backward, and
SoftmaxWithLoss's gradient; OpenMP-parallel over work items (o, piece of inner).

For each position: the max over c is subtracted before exp (never overflows), the sum over c
is taken in double (over blocks of SUM_BLOCK channels summed in x's precision), y = e / sum.
Backward: dx = (dy - sum_c dy * y) * y with the sum taken the same way.
A piece holds at most PIECE / C positions' C values (in cache, L2 or L3, between the kernel's passes), so
main memory is read and written once. The forward hands out pieces one at a time; each thread prefetches
the next piece it will take through the current one's passes. The float32 vector loops pass over a piece in
sub-pieces of at least SUB_MIN positions (few channels: shorter passes), and the backward's pieces are that long.
"""
from cython.parallel cimport parallel, prange
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport free, malloc
from libc.float cimport FLT_MIN

include "_threads.pxi"

ctypedef fused real:
    float
    double

include "_vmath.pxi"
include "_stream.pxi"

# The forward's prefetch of the next piece's x, spread over all three passes of the current piece: a cursor over
# the next piece's lines, row by row, one line asked for per vector of the passes (the whole piece is asked for
# about two thirds through). Where only the exp pass prefetched, row by row, the next max pass still waited on
# memory (a fifth to a third of the forward's samples at 8x256x56x56 were its loads). On one thread (Zen 5) the
# hardware prefetchers do most of it: no software prefetch at all measured within 0-5 % of this.
cdef extern from *:
    """
    #include <stddef.h>
    #include <stdint.h>
    typedef struct {
        const char* p;  /* the next line to ask for; NULL: none left */
        const char* row;  /* the start of the row p is in, and one past its end */
        const char* end;
        ptrdiff_t stride, rows;  /* bytes between rows; rows left after this one */
        int l2;  /* into L2 only (the generic loops, float64: a piece of 512 KB) */
    } caffe_softmax_pf;
    static inline void caffe_softmax_pf_init(caffe_softmax_pf* q, const void* base, ptrdiff_t stride, ptrdiff_t rows,
                                             ptrdiff_t bytes) {
        q->row = (const char*)base;
        q->p = base != NULL && rows > 0 && bytes > 0 ? (const char*)((uintptr_t)base & ~(uintptr_t)63) : NULL;
        q->end = q->row + bytes;
        q->stride = stride;
        q->rows = rows - 1;
        q->l2 = 0;
    }
    static inline void caffe_softmax_pf_one(caffe_softmax_pf* q) {
        if (q->p == NULL) return;
    #if defined(__GNUC__)
        if (q->l2)
            __builtin_prefetch(q->p, 0, 2);
        else
            __builtin_prefetch(q->p, 0, 3);  /* (into L1 and L2: into L2 only measured 2-15 % slower, Zen 5) */
    #endif
        q->p += 64;
        if (q->p >= q->end) {
            if (q->rows == 0) {
                q->p = NULL;
                return;
            }
            q->rows--;
            q->row += q->stride;
            q->end += q->stride;
            q->p = (const char*)((uintptr_t)q->row & ~(uintptr_t)63);
        }
    }
    static inline void caffe_softmax_pf_l2(caffe_softmax_pf* q) { q->l2 = 1; }
    static inline void caffe_softmax_pf_n(caffe_softmax_pf* q, ptrdiff_t n) {
        for (; n > 0; n--) caffe_softmax_pf_one(q);
    }
    /* n bytes from a cache line's start (the forward's scratch: m, f, its C x P block, s): malloc's blocks of this
       size (mmapped) start 16 bytes into a line, as NumPy's, and then every 64-byte load and store of the max and
       exp passes split across two lines. Aligned (the scratch's rows then line-aligned where P is a multiple of 16):
       the exp pass's stores whole lines, the division's e loads split instead (y's stores stay aligned). Session
       13, Zen 5, A/B interleaved against main: 1.03-1.04x at 8x256x56x56 and 1.05-1.09x at 8x64x112x112 with the
       8-row max pass, where that alone measured 1.01-1.04x / 0.99-1.01x; the scratch as far into a line as x
       measured as malloc's. C11's aligned_alloc (size a multiple of the alignment), below. */
    #include <stdlib.h>
    /* The forward's scratch block is the thread's own, kept from call to call (grown when a call needs more,
       never freed: (C P + 3 P) floats and P doubles, P at most PIECE, a few MB at most a pool thread).
       Allocated per call it was, at 256 KB and more, a fresh mmap whenever glibc's mmap threshold stays at 128 KB (a process that has not
       freed a large block yet, or bench_memory's fixed threshold): page faults on every call. Session 14, Zen
       5, 8x256x56x56 forward with the threshold fixed, one process each way: 1.85-2.29 ms per call against
       1.49-1.71 with glibc's own threshold. (Its contents are written before they are read: a block filled
       with 0xFF bytes before every piece changed no output, session 14.) */
    static __thread void* caffe_softmax_tls_block = NULL;
    static __thread size_t caffe_softmax_tls_bytes = 0;
    static inline void* caffe_softmax_scratch(size_t n) {
        n = (n + 63) & ~(size_t)63;
        if (n > caffe_softmax_tls_bytes) {
            free(caffe_softmax_tls_block);
            caffe_softmax_tls_block = aligned_alloc(64, n);
            caffe_softmax_tls_bytes = caffe_softmax_tls_block != NULL ? n : 0;
        }
        return caffe_softmax_tls_block;
    }
    /* the next work item from a counter shared by the threads */
    static inline ptrdiff_t caffe_softmax_grab(ptrdiff_t* counter) {
        ptrdiff_t t;
        #pragma omp atomic capture
        t = (*counter)++;
        return t;
    }
    """
    ctypedef struct caffe_softmax_pf:
        pass
    void caffe_softmax_pf_init(caffe_softmax_pf* q, const void* base, Py_ssize_t stride, Py_ssize_t rows,
                               Py_ssize_t nbytes) nogil
    void caffe_softmax_pf_n(caffe_softmax_pf* q, Py_ssize_t n) nogil
    void caffe_softmax_pf_l2(caffe_softmax_pf* q) nogil
    Py_ssize_t caffe_softmax_grab(Py_ssize_t* counter) nogil
    void* caffe_softmax_scratch(size_t n) nogil


# y = e / d over n values (one row of a piece), with non-temporal stores where `stream` and the build has
# SSE2 / AVX (x86-64 always has SSE2); the division is IEEE's either way, so the same bits. A piece that
# streamed ends with a store fence, so that its rows are visible to the other threads after the region.
cdef extern from *:
    """
    #include <stddef.h>
    #include <stdint.h>
    #include <string.h>
    #if defined(__SSE2__)
    #include <immintrin.h>
    #endif
    static inline void caffe_softmax_div_f(float* y, const float* e, const float* d, ptrdiff_t n, int stream,
                                           caffe_softmax_pf* q) {
        ptrdiff_t j = 0;
    #if defined(__AVX512F__)
        /* (16 lanes where the build has them: half the division and store instructions of the loop below) */
        if (stream) {
            for (; j < n && ((uintptr_t)(y + j) & 63); j++) y[j] = e[j] / d[j];
            for (; j + 16 <= n; j += 16) {
                _mm512_stream_ps(y + j, _mm512_div_ps(_mm512_loadu_ps(e + j), _mm512_loadu_ps(d + j)));
                caffe_softmax_pf_one(q);
            }
        }
    #elif defined(__AVX__)
        if (stream) {
            for (; j < n && ((uintptr_t)(y + j) & 31); j++) y[j] = e[j] / d[j];
            for (; j + 8 <= n; j += 8) {
                _mm256_stream_ps(y + j, _mm256_div_ps(_mm256_loadu_ps(e + j), _mm256_loadu_ps(d + j)));
                if (j & 8) caffe_softmax_pf_one(q);  /* (a line a 16 floats) */
            }
        }
    #elif defined(__SSE2__)
        if (stream) {
            for (; j < n && ((uintptr_t)(y + j) & 15); j++) y[j] = e[j] / d[j];
            for (; j + 4 <= n; j += 4)
                _mm_stream_ps(y + j, _mm_div_ps(_mm_loadu_ps(e + j), _mm_loadu_ps(d + j)));
        }
    #endif
        for (; j < n; j++) y[j] = e[j] / d[j];
    }
    static inline void caffe_softmax_div_d(double* y, const double* e, const double* d, ptrdiff_t n, int stream,
                                           caffe_softmax_pf* q) {
        ptrdiff_t j = 0;
    #if defined(__AVX__)
        if (stream) {
            for (; j < n && ((uintptr_t)(y + j) & 31); j++) y[j] = e[j] / d[j];
            for (; j + 4 <= n; j += 4)
                _mm256_stream_pd(y + j, _mm256_div_pd(_mm256_loadu_pd(e + j), _mm256_loadu_pd(d + j)));
        }
    #elif defined(__SSE2__)
        if (stream) {
            for (; j < n && ((uintptr_t)(y + j) & 15); j++) y[j] = e[j] / d[j];
            for (; j + 2 <= n; j += 2)
                _mm_stream_pd(y + j, _mm_div_pd(_mm_loadu_pd(e + j), _mm_loadu_pd(d + j)));
        }
    #endif
        for (; j < n; j++) y[j] = e[j] / d[j];
    }
    """
    void caffe_softmax_div_f(float* y, const float* e, const float* d, Py_ssize_t n, int stream,
                             caffe_softmax_pf* q) nogil
    void caffe_softmax_div_d(double* y, const double* e, const double* d, Py_ssize_t n, int stream,
                             caffe_softmax_pf* q) nogil




include "_vexp.pxi"


# The float32 max and exp passes with intrinsics where the build has AVX2 + FMA (8 lanes) or AVX-512 (16): see
# caffe_softmax_maxexp_f below; both builds compute the same exp (the same bits, a test checks it). (Walking one vector
# of positions down all C channels at a time instead, all three passes in registers and L1, measured 1.3-3x slower:
# C rows a multiple of 4 KB apart fall in one L1 set and each in its own page, so every load missed L1 and the L1 TLB.)
cdef extern from *:
    """
    #include <stddef.h>
    #include <stdint.h>
    #include <math.h>
    #include <float.h>
    #if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__FMA__)
    #include <immintrin.h>
    #define CAFFE_SOFTMAX_LANES 16
    typedef __m512 caffe_sv;
    typedef __mmask16 caffe_sk;
    static inline caffe_sk caffe_sk_first(int n) { return n >= 16 ? (caffe_sk)0xFFFF : (caffe_sk)((1u << n) - 1); }
    static inline caffe_sv caffe_sv_load(const float* p, caffe_sk k, int full) {
        return full ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(k, p);
    }
    static inline void caffe_sv_store(float* p, caffe_sv v, caffe_sk k, int full) {
        if (full) _mm512_storeu_ps(p, v);
        else _mm512_mask_storeu_ps(p, k, v);
    }
    static inline caffe_sv caffe_sv_max(caffe_sv a, caffe_sv b) { return _mm512_max_ps(a, b); }  /* a > b ? a : b */
    /* exp(x) for x <= 0 (or NaN), 16 lanes: Cephes' expf with FMA, x = n ln2 + r (n by rounding with 1.5 * 2^23, ln2
       in two parts), 1 + r + r^2 P(r) evaluated as (P(r) r + 1) r + 1, 2^n applied by VSCALEFPS: 13 vector operations
       where the scalar FMA form this replaced (the bits of 2^n built, a clamp, r^2) vectorized to 19, the exp being
       most of the forward's work. Within 1 ulp of exp (0.87 over 5M points of [-100, 0]; a test checks 3 against
       float64); 0 below ln(FLT_MIN) (no denormals downstream: slow on some CPUs), exp(0) = 1, NaN stays NaN. */
    static inline caffe_sv caffe_sv_exp(caffe_sv x) {
        __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33654f), _CMP_NLT_UQ);  /* !(x < ln FLT_MIN) */
        __m512 fx, p = caffe_exp512_poly(x, &fx);
        return _mm512_maskz_scalef_ps(keep, p, fx);
    }
    #elif defined(__AVX2__) && defined(__FMA__)
    #include <immintrin.h>
    #define CAFFE_SOFTMAX_LANES 8
    typedef __m256 caffe_sv;
    typedef __m256i caffe_sk;
    static inline caffe_sk caffe_sk_first(int n) {
        return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    }
    static inline caffe_sv caffe_sv_load(const float* p, caffe_sk k, int full) {
        return full ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, k);
    }
    static inline void caffe_sv_store(float* p, caffe_sv v, caffe_sk k, int full) {
        if (full) _mm256_storeu_ps(p, v);
        else _mm256_maskstore_ps(p, k, v);
    }
    static inline caffe_sv caffe_sv_max(caffe_sv a, caffe_sv b) { return _mm256_max_ps(a, b); }
    /* the AVX-512 exp above, 8 lanes: the same reduction and polynomial, 2^n as exponent bits times p (n >= -126
       where the result is kept: one rounding of p 2^n, as VSCALEFPS's), 0 below ln(FLT_MIN): the same bits */
    static inline caffe_sv caffe_sv_exp(caffe_sv x) {
        const __m256 big = _mm256_set1_ps(12582912.0f);
        __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33654f), _CMP_NLT_UQ);
        __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), big);
        __m256 fx = _mm256_sub_ps(t, big);
        __m256 r = _mm256_fmadd_ps(fx, _mm256_set1_ps(-0.693359375f), x);
        __m256 p;
        __m256i sb;
        r = _mm256_fmadd_ps(fx, _mm256_set1_ps(2.12194440e-4f), r);
        p = _mm256_fmadd_ps(_mm256_set1_ps(1.9875691500e-4f), r, _mm256_set1_ps(1.3981999507e-3f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
        sb = _mm256_add_epi32(_mm256_castps_si256(t), _mm256_set1_epi32((int)(127u - 0x4B400000u)));
        sb = _mm256_slli_epi32(sb, 23);
        return _mm256_and_ps(keep, _mm256_mul_ps(p, _mm256_castsi256_ps(sb)));
    }
    #else
    #define CAFFE_SOFTMAX_LANES 0
    #endif

    #if CAFFE_SOFTMAX_LANES
    #define CAFFE_SW CAFFE_SOFTMAX_LANES
    static inline caffe_sv caffe_sv_add(caffe_sv a, caffe_sv b) {
    #if CAFFE_SW == 16
        return _mm512_add_ps(a, b);
    #else
        return _mm256_add_ps(a, b);
    #endif
    }
    static inline caffe_sv caffe_sv_sub(caffe_sv a, caffe_sv b) {
    #if CAFFE_SW == 16
        return _mm512_sub_ps(a, b);
    #else
        return _mm256_sub_ps(a, b);
    #endif
    }
    /* The max and exp passes of _fwd_piece over P positions (x at channel 0, rows `inner` apart; e rows es apart; m:
       P floats, s: P doubles; f: P floats of scratch) with the vector exp above, by whole vectors of positions and
       the tail by masked loads and stores (masked stores with every lane on took twice the time on blobs in main
       memory, Zen 5). Rows in groups (CAFFE_MAXG / CAFFE_EXPG below): a vector of positions walks down a group's
       rows with the running max (max pass) or the block's partial sum (exp pass) in a register, loading and storing m and f once a group,
       not once a row (walking down a whole block of 16 rows instead, rows a multiple of 4 KB apart fall in one L1
       set: 1.2-1.8x slower). The same order of operations per position as _fwd_piece: the max in channel order
       (x > m ? x : m, so NaN as the scalar loop), exp(x - max), the sums by blocks of 16 channels in float32 in
       channel order, then double. q: the prefetch of the next piece (rows 0 .. 2 C of the three passes here). */
    /* Rows a group: the max pass 8 (m loaded and stored once per 8 rows; its loop is a load and a max a row), the
       exp pass 4 (an exp a row: the group's partial sum in a register, the rest spent on the exp). Session 13 (Zen 5,
       A/B interleaved against main's 4 and 4, old / new time): max 8 1.01-1.05x at 8x256x56x56, 0.93-1.08x at
       8x64x112x112 (noisier, no clear change); max 16 1.01-1.04x; max 8 with exp 8 0.97-1.07x, not better than exp 4. */
    #define CAFFE_MAXG 8
    #define CAFFE_EXPG 4
    static inline caffe_sv caffe_softmax_maxrows(const float* x, ptrdiff_t inner, int g, caffe_sv v, caffe_sk k,
                                                 int full) {
        int r;
        for (r = 0; r < g; r++) v = caffe_sv_max(caffe_sv_load(x + r * inner, k, full), v);
        return v;
    }
    static inline void caffe_softmax_exprows(const float* x, ptrdiff_t inner, float* e, ptrdiff_t es, int g,
                                             const float* m, float* f, int first, caffe_sk k, int full) {
        const caffe_sv mv = caffe_sv_load(m, k, full);
        caffe_sv acc = first ? mv : caffe_sv_load(f, k, full);  /* (first: replaced by the first row's exp) */
        int r;
        for (r = 0; r < g; r++) {
            caffe_sv v = caffe_sv_exp(caffe_sv_sub(caffe_sv_load(x + r * inner, k, full), mv));
            caffe_sv_store(e + r * es, v, k, full);
            acc = (first && r == 0) ? v : caffe_sv_add(acc, v);
        }
        caffe_sv_store(f, acc, k, full);
    }
    static inline void caffe_softmax_maxexp_f(const float* x, ptrdiff_t inner, ptrdiff_t C, ptrdiff_t P, float* e,
                                              ptrdiff_t es, float* m, double* s, float* f, caffe_softmax_pf* q) {
        ptrdiff_t c, c0, c1, j;
        int g;
        const ptrdiff_t PV = P - P % CAFFE_SW;
        const caffe_sk kt = caffe_sk_first((int)(P % CAFFE_SW));
        for (j = 0; j < P; j++) m[j] = x[j];
        for (c = 1; c < C; c += g) {
            const float* xc = x + c * inner;
            g = C - c < CAFFE_MAXG ? (int)(C - c) : CAFFE_MAXG;
            if (g == CAFFE_MAXG)  /* (the constant count: the group's loop unrolled) */
                for (j = 0; j < PV; j += CAFFE_SW) {
                    caffe_sv_store(m + j, caffe_softmax_maxrows(xc + j, inner, CAFFE_MAXG, caffe_sv_load(m + j, kt, 1),
                                                                kt, 1), kt, 1);
                    caffe_softmax_pf_one(q);
                }
            else
                for (j = 0; j < PV; j += CAFFE_SW) {
                    caffe_sv_store(m + j, caffe_softmax_maxrows(xc + j, inner, g, caffe_sv_load(m + j, kt, 1), kt, 1),
                                   kt, 1);
                    caffe_softmax_pf_one(q);
                }
            if (PV < P)
                caffe_sv_store(m + PV, caffe_softmax_maxrows(xc + PV, inner, g, caffe_sv_load(m + PV, kt, 0), kt, 0),
                               kt, 0);
        }
        for (c0 = 0; c0 < C; c0 += 16) {  /* SUM_BLOCK */
            c1 = c0 + 16 < C ? c0 + 16 : C;
            for (c = c0; c < c1; c += g) {
                const float* xc = x + c * inner;
                float* ec = e + c * es;
                g = c1 - c < CAFFE_EXPG ? (int)(c1 - c) : CAFFE_EXPG;
                if (g == CAFFE_EXPG)
                    for (j = 0; j < PV; j += CAFFE_SW) {
                        caffe_softmax_exprows(xc + j, inner, ec + j, es, CAFFE_EXPG, m + j, f + j, c == c0, kt, 1);
                        caffe_softmax_pf_one(q);
                    }
                else
                    for (j = 0; j < PV; j += CAFFE_SW) {
                        caffe_softmax_exprows(xc + j, inner, ec + j, es, g, m + j, f + j, c == c0, kt, 1);
                        caffe_softmax_pf_one(q);
                    }
                if (PV < P)
                    caffe_softmax_exprows(xc + PV, inner, ec + PV, es, g, m + PV, f + PV, c == c0, kt, 0);
            }
            /* (two plain loops, which GCC vectorizes; one with the choice inside stayed scalar) */
            if (c0 == 0)
                for (j = 0; j < P; j++) s[j] = (double)f[j];
            else
                for (j = 0; j < P; j++) s[j] += (double)f[j];
        }
    }
    /* _piece_loss (below) in the vector builds: the piece's probabilities at the labels gathered into t (P floats),
       then their logs by libmvec's logf (within 4 ulp of libm's logf: not its bits; a scalar logf a position was a
       seventh of SoftmaxWithLoss's forward at 8x64x112x112) by blocks of 16, the tail padded, then added in
       double in 8 interleaved partial sums (vectorized; _piece_loss adds in position order: the sums differ by
       roundings of double, ~1e-16 relative, besides the logs' ulps). A position not valid adds log(1) = 0. */
    /* logf of 16 floats by libmvec's AVX2 logf (twice 8 lanes) in both vector builds, called by name: left to
       GCC's vectorizer, the builds took the SSE, AVX2 or AVX-512 variant, or libm's logf in an epilogue, by the
       loop's shape (not the same bits) */
    #if defined(__GLIBC__) && defined(__x86_64__) && defined(__AVX2__)
    __m256 _ZGVdN8v_logf(__m256);
    static inline void caffe_softmax_logf16(float* t) {
        _mm256_storeu_ps(t, _ZGVdN8v_logf(_mm256_loadu_ps(t)));
        _mm256_storeu_ps(t + 8, _ZGVdN8v_logf(_mm256_loadu_ps(t + 8)));
    }
    #else
    static inline void caffe_softmax_logf16(float* t) {
        int k;
        for (k = 0; k < 16; k++) t[k] = logf(t[k]);
    }
    #endif
    /* the gather (per sub-piece: caffe_softmax_piece_gather_f fills t's part of the piece) and then the logs and
       the sum over the whole piece (caffe_softmax_piece_logsum_f): the logs are per lane, the sum in position order
       over the piece, so sub-pieces give the piece's loss bit for bit */
    static inline void caffe_softmax_piece_gather_f(const float* e, ptrdiff_t es, const float* d, ptrdiff_t P,
                                                    const int64_t* label, const uint8_t* valid, float* t,
                                                    ptrdiff_t C, int vec) {
        ptrdiff_t j = 0, i;
        /* By vectors: the label rows' values gathered (masked by valid: a label only used where valid; the offsets
           in int32, so only where they fit), divided where valid, clamped, as the scalar loop below does each one
           (a load, an IEEE division, a compare: the same bits). The scalar loop, with its branch on valid and its
           loads one after another, was a tenth of SoftmaxWithLoss's forward at 8x64x112x112. */
        if (vec && C * es < 2147483647) {
    #if CAFFE_SW == 16
            const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
            const __m512 one = _mm512_set1_ps(1.0f), lo = _mm512_set1_ps(FLT_MIN);
            for (; j + 16 <= P; j += 16) {
                const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(valid + j)));
                const __mmask16 k = _mm512_test_epi32_mask(v, v);
                const __m256i l0 = _mm512_cvtepi64_epi32(_mm512_loadu_si512((const void*)(label + j)));
                const __m256i l1 = _mm512_cvtepi64_epi32(_mm512_loadu_si512((const void*)(label + j + 8)));
                const __m512i lab = _mm512_inserti64x4(_mm512_castsi256_si512(l0), l1, 1);
                const __m512i idx = _mm512_add_epi32(_mm512_mullo_epi32(lab, _mm512_set1_epi32((int)es)),
                                                     _mm512_add_epi32(lane, _mm512_set1_epi32((int)j)));
                __m512 p = _mm512_mask_i32gather_ps(one, k, idx, e, 4);
                p = _mm512_mask_div_ps(one, k, p, _mm512_loadu_ps(d + j));
                p = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(p, lo, _CMP_LT_OQ), p, lo);
                _mm512_storeu_ps(t + j, p);
            }
    #else
            const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            const __m256i low = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);  /* the int64s' low halves first */
            const __m256 one = _mm256_set1_ps(1.0f), lo = _mm256_set1_ps(FLT_MIN);
            for (; j + 8 <= P; j += 8) {
                const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(valid + j)));
                const __m256 k = _mm256_castsi256_ps(_mm256_cmpgt_epi32(v, _mm256_setzero_si256()));
                const __m256i l0 = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i*)(label + j)), low);
                const __m256i l1 = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i*)(label + j + 4)),
                                                               low);
                const __m256i lab = _mm256_permute2x128_si256(l0, l1, 0x20);
                const __m256i idx = _mm256_add_epi32(_mm256_mullo_epi32(lab, _mm256_set1_epi32((int)es)),
                                                     _mm256_add_epi32(lane, _mm256_set1_epi32((int)j)));
                __m256 p = _mm256_mask_i32gather_ps(one, e, idx, k, 4);
                p = _mm256_blendv_ps(one, _mm256_div_ps(p, _mm256_loadu_ps(d + j)), k);
                p = _mm256_blendv_ps(p, lo, _mm256_cmp_ps(p, lo, _CMP_LT_OQ));
                _mm256_storeu_ps(t + j, p);
            }
    #endif
        }
        for (i = j; i < P; i++) t[i] = valid[i] ? e[label[i] * es + i] : 1.0f;  /* (a label only read where valid) */
        for (i = j; i < P; i++) {
            float p = valid[i] ? t[i] / d[i] : 1.0f;
            t[i] = p < FLT_MIN ? FLT_MIN : p;  /* (Caffe's std::max: NaN stays NaN) */
        }
    }
    static inline double caffe_softmax_piece_logsum_f(float* t, ptrdiff_t P) {
        ptrdiff_t j, k;
        double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, total = 0;
        const ptrdiff_t PV = P - P % 16;
        for (j = 0; j < PV; j += 16) caffe_softmax_logf16(t + j);
        if (PV < P) {  /* the tail padded with 1 (log 0) */
            float r[16];
            for (k = 0; k < 16; k++) r[k] = PV + k < P ? t[PV + k] : 1.0f;
            caffe_softmax_logf16(r);
            for (k = 0; PV + k < P; k++) t[PV + k] = r[k];
        }
        for (j = 0; j + 8 <= P; j += 8)
            for (k = 0; k < 8; k++) acc[k] += (double)t[j + k];
        for (; j < P; j++) total += (double)t[j];
        return -((((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))) + total);
    }
    /* y = the exp above of x (n values; y may be x) */
    static inline void caffe_softmax_exp_block(const float* x, float* y, ptrdiff_t n) {
        ptrdiff_t j;
        const caffe_sk k = caffe_sk_first((int)(n % CAFFE_SW));
        for (j = 0; j + CAFFE_SW <= n; j += CAFFE_SW)  /* (plain loads and stores: see caffe_softmax_maxexp_f) */
            caffe_sv_store(y + j, caffe_sv_exp(caffe_sv_load(x + j, k, 1)), k, 1);
        if (j < n)
            caffe_sv_store(y + j, caffe_sv_exp(caffe_sv_load(x + j, k, 0)), k, 0);
    }
    #else
    static inline void caffe_softmax_exp_block(const float* x, float* y, ptrdiff_t n) {}
    static inline void caffe_softmax_piece_gather_f(const float* e, ptrdiff_t es, const float* d, ptrdiff_t P,
                                                    const int64_t* label, const uint8_t* valid, float* t,
                                                    ptrdiff_t C, int vec) {}
    static inline double caffe_softmax_piece_logsum_f(float* t, ptrdiff_t P) { return 0; }
    static inline void caffe_softmax_maxexp_f(const float* x, ptrdiff_t inner, ptrdiff_t C, ptrdiff_t P, float* e,
                                              ptrdiff_t es, float* m, double* s, float* f, caffe_softmax_pf* q) {}
    #endif
    """
    const int LANES "CAFFE_SOFTMAX_LANES"
    void caffe_softmax_exp_block(const float* x, float* y, Py_ssize_t n) nogil
    void caffe_softmax_piece_gather_f(const float* e, Py_ssize_t es, const float* d, Py_ssize_t P,
                                      const int64_t* label, const uint8_t* valid, float* t, Py_ssize_t C,
                                      int vec) nogil
    double caffe_softmax_piece_logsum_f(float* t, Py_ssize_t P) nogil
    void caffe_softmax_maxexp_f(const float* x, Py_ssize_t inner, Py_ssize_t C, Py_ssize_t P, float* e, Py_ssize_t es,
                                float* m, double* s, float* f, caffe_softmax_pf* q) nogil


cdef inline real _sexp(real v) noexcept nogil:
    """exp(v) for v <= 0 (or NaN) where no vector exp is built (float64; float32 in the baseline build): libm's."""
    return _exp(v)


cdef void _sexp_block(real* v, Py_ssize_t n) noexcept nogil:
    """v = _sexp(v) in place, the last n % TAIL through the same vector loop, padded (_vmath.pxi's TAIL). A loop of
    its own: fused into the max-subtraction and the sum (one pass), GCC left 137-190 positions' exps to libm in a
    softmax of identical positions."""
    cdef Py_ssize_t body = n - n % TAIL, r = n % TAIL, i
    cdef real t[TAIL]
    for i in range(body):
        v[i] = _sexp(v[i])
    if r:
        _pad_tail(v + body, t, r)
        for i in range(TAIL):
            t[i] = _sexp(t[i])
        for i in range(r):
            v[body + i] = t[i]


def exp_nonpositive(const real[::1] x, real[::1] y):
    """y = the exp the softmax kernels use (for x <= 0), for the tests."""
    cdef Py_ssize_t i
    if y.shape[0] < x.shape[0]:
        raise ValueError("softmax kernel: y is shorter than x")
    if real is float:
        if LANES and x.shape[0] > 0:
            caffe_softmax_exp_block(&x[0], &y[0], x.shape[0])
            return
    for i in range(x.shape[0]):
        y[i] = _sexp(x[i])

# Elements (positions x channels) per work item. 131072 (512 KB of float32 x; its y beside it in L2 and L3), not
# 32768 (128 KB): with 256 channels the shorter pieces read each channel row in runs of 512 bytes, and two threads
# then ran slower than one (13.0 against 9.0 ms at 8x256x56x56); these took 0.60-0.80x the time forward and 0.76x
# backward (session 8, Zen 3: 512 KB of L2 a core; bench in bench/README.md). 524288 measured the same within
# noise. A build may define CAFFE_SOFTMAX_PIECE before this (softmax_avx512: 65536, for 1 MB of L2).
cdef extern from *:
    """
    #ifndef CAFFE_SOFTMAX_PIECE
    #define CAFFE_SOFTMAX_PIECE 131072
    #endif
    """
    const Py_ssize_t PIECE "CAFFE_SOFTMAX_PIECE"

cdef enum:
    # Backward: pieces per work item; a thread takes RUN consecutive pieces and prefetches each next piece's y and
    # dy during its second pass
    RUN = 4
    # Outputs of at least this many bytes are stored past the caches (non-temporal stores from the scratch
    # block): they do not fit beside the input in the 32 MB L3 anyway, and a normal store first reads each
    # line of y from main memory (a third stream)
    STREAM_MIN_BYTES = 12 << 20
    # Forward outputs of at least this many bytes go through the scratch block (with normal stores below
    # STREAM_MIN_BYTES): 8x256x32x32 float32 (8 MB, in L3) took 1.6 ms instead of 2.5; at 2-3 MB the scratch
    # cost more than it saved (0.52 against 0.45 ms at 8x21x64x64)
    SCRATCH_MIN_BYTES = 4 << 20
    # Channels summed in x's precision before the partial sums go into the double totals (over
    # positions: the sums of exp and of dy * y). Converting every float32 term to double cost a
    # sixth of the forward; a float32 partial of 16 terms is within ~1e-6 of exact (relative to the
    # sum of the terms' magnitudes).
    SUM_BLOCK = 16
    # The forward's vector loops (float32, scratch path) go over a piece in sub-pieces of about SUB_PIECE elements,
    # at least SUB_MIN positions, and the backward's pieces are that long: at 8x64x112x112 (C = 64: 1024 positions a
    # piece in softmax_avx512, 2048 in softmax_avx2) passes of 512 positions took 0.87-0.93x the time forward,
    # 0.8-0.9x backward (Zen 5, interleaved A/B; bench/README.md). C = 256 (resnet) stays at its 256 positions.
    # The forward's pieces (the loss's partial sums, so the loss's bits) stay as they were.
    SUB_PIECE = 32768
    SUB_MIN = 512


cdef Py_ssize_t _stream_min_bytes = STREAM_MIN_BYTES
cdef Py_ssize_t _scratch_min_bytes = SCRATCH_MIN_BYTES
cdef Py_ssize_t _sub_piece_elements = SUB_PIECE
cdef Py_ssize_t _sub_min = SUB_MIN
cdef int _vector_gather = 1


def _set_sub_piece(Py_ssize_t elements, Py_ssize_t min_positions):
    """For the tests: the sub-piece size (SUB_PIECE elements, at least SUB_MIN positions; small values cut the
    small shapes' pieces into several); returns the previous pair."""
    global _sub_piece_elements, _sub_min
    old = (_sub_piece_elements, _sub_min)
    _sub_piece_elements, _sub_min = elements, min_positions
    return old


def _set_vector_gather(bint on):
    """For the tests: SoftmaxWithLoss's label probabilities by vectors (gathers) or by the scalar loop; returns
    the previous setting."""
    global _vector_gather
    old = bool(_vector_gather)
    _vector_gather = on
    return old


def _set_stream_min_bytes(Py_ssize_t nbytes, scratch_nbytes=None):
    """For the tests and benchmarks: the output size from which the kernels stream (0: always; the streaming
    paths on small shapes) and (forward) use the scratch block (default: the same size, or SCRATCH_MIN_BYTES
    when streaming from STREAM_MIN_BYTES); returns the previous (stream, scratch) sizes."""
    global _stream_min_bytes, _scratch_min_bytes
    old = (_stream_min_bytes, _scratch_min_bytes)
    _stream_min_bytes = nbytes
    if scratch_nbytes is None:
        scratch_nbytes = SCRATCH_MIN_BYTES if nbytes == STREAM_MIN_BYTES else nbytes
    _scratch_min_bytes = scratch_nbytes
    return old


cdef inline bint _streams(Py_ssize_t n, Py_ssize_t itemsize, Py_ssize_t min_bytes) noexcept nogil:
    return n * itemsize >= min_bytes


def _need(Py_ssize_t have, Py_ssize_t need, str what):
    if have < need:
        raise ValueError(f"softmax kernel: {what} holds {have} elements, needs {need}")


cdef Py_ssize_t _piece(Py_ssize_t C, Py_ssize_t inner) noexcept nogil:
    # At least 64 positions: each channel row of a piece is then whole cache lines.
    cdef Py_ssize_t p = PIECE // C if C < PIECE else 1
    if p < 64:
        p = 64
    return p if p < inner else inner


cdef inline Py_ssize_t _sub_piece(Py_ssize_t C, Py_ssize_t P) noexcept nogil:
    # Positions per pass of the forward's vector loops over a piece of P positions: P split evenly into parts of
    # about SUB_PIECE // C positions, not under SUB_MIN positions, a multiple of 16 (whole vectors of both builds)
    cdef Py_ssize_t sp = _sub_piece_elements // C, k
    if sp < _sub_min:
        sp = _sub_min
    if sp < 1:
        sp = 1
    if sp >= P:
        return P
    k = P // sp
    sp = (P + k - 1) // k
    sp = (sp + 15) // 16 * 16
    return sp if sp < P else P


cdef inline double _piece_loss(const real* e, Py_ssize_t es, const real* d, Py_ssize_t P, const int64_t* label,
                               const uint8_t* valid) noexcept nogil:
    """-sum over the piece's valid positions j of log(max(p, FLT_MIN)) (Caffe's std::max: NaN stays NaN),
    p = e[label[j] * es + j] / d[j]: the probability as the division pass stores it (the same rounding),
    read while the piece is in cache."""
    cdef Py_ssize_t j
    cdef double total = 0
    cdef real p
    for j in range(P):
        if valid[j]:
            p = e[label[j] * es + j] / d[j]
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
    if real is float and LANES:  # the vector builds' exp, as in the pieces
        for c in range(C):
            y[c] = x[c] - m
        caffe_softmax_exp_block(y, y, C)
    else:
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


cdef inline double _row_loss(const real* y, int64_t label, uint8_t valid) noexcept nogil:
    cdef real p
    if not valid:
        return 0
    p = y[label]
    p = <real>FLT_MIN if p < FLT_MIN else p
    return -_log(p)


cdef double _fwd_piece(const real* x, real* y, Py_ssize_t C, Py_ssize_t inner, Py_ssize_t P, real* e,
                       Py_ssize_t es, real* m, real* f, double* s, caffe_softmax_pf* q, bint stream,
                       const int64_t* label, const uint8_t* valid, real* lp) noexcept nogil:
    """Softmax of P positions (x / y point at channel 0; channel stride inner). exp(x - max) goes to e (row
    stride es: a scratch block of C x P in cache, or y itself with es = inner), then y = e / sum (streamed
    past the caches where `stream`). q: the next piece's x, prefetched row by row through the three passes
    (caffe_softmax_pf), so that its max pass reads from cache. m, f: P of x's type, s: P doubles.
    Where label is not NULL: the vector builds (float32) leave the label probabilities in lp (P floats) for
    caffe_softmax_piece_logsum_f and return 0; the generic loops return the piece's loss. Else 0."""
    cdef Py_ssize_t c, c0, c1, j
    cdef const real* xc
    cdef real* ec
    cdef real v
    cdef double loss = 0
    if real is float:
        if LANES:
            caffe_softmax_maxexp_f(x, inner, C, P, e, es, m, s, f, q)
            for j in range(P):
                m[j] = <real>s[j]  # the divisor, in x's precision
            return _fwd_piece_end(y, C, inner, P, e, es, m, f, q, stream, label, valid, lp)
    for j in range(P):
        m[j] = x[j]
        s[j] = 0
    # (the generic loops: the next piece's x asked for row by row during the exp pass, into L2, as before the
    # cursor: spread over the three passes and into L1 as well, float64 took 2-8 % longer)
    caffe_softmax_pf_l2(q)
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
            ec = e + c * es
            caffe_softmax_pf_n(q, P * sizeof(real) // 64 + 1)
            for j in range(P):
                ec[j] = xc[j] - m[j]
            _sexp_block(ec, P)
            for j in range(P):
                f[j] += ec[j]
        for j in range(P):
            s[j] += f[j]
    for j in range(P):
        m[j] = <real>s[j]  # the divisor, in x's precision
    return _fwd_piece_end(y, C, inner, P, e, es, m, f, q, stream, label, valid, lp)


cdef inline double _fwd_piece_end(real* y, Py_ssize_t C, Py_ssize_t inner, Py_ssize_t P, real* e, Py_ssize_t es,
                                  const real* d, real* f, caffe_softmax_pf* q, bint stream, const int64_t* label,
                                  const uint8_t* valid, real* lp) noexcept nogil:
    """_fwd_piece's last pass, y = e / d (first, where label is not NULL: the label probabilities into lp in the
    vector builds, the piece's loss returned in the generic loops)."""
    cdef Py_ssize_t c
    cdef double loss = 0
    if label != NULL:
        if real is float and LANES:
            caffe_softmax_piece_gather_f(e, es, d, P, label, valid, lp, C, _vector_gather)
        else:
            loss = _piece_loss(e, es, d, P, label, valid)
    for c in range(C):
        if real is float:
            if not (stream and LANES):  # (else the division's vector loop asks for the lines)
                caffe_softmax_pf_n(q, P * sizeof(real) // 128 + 1)
            caffe_softmax_div_f(y + c * inner, e + c * es, d, P, stream, q)
        else:
            caffe_softmax_div_d(y + c * inner, e + c * es, d, P, stream, q)
    if stream:
        caffe_store_fence()
    return loss


cdef int _forward(const real* xp, real* yp, Py_ssize_t outer, Py_ssize_t C, Py_ssize_t inner,
                  const int64_t* label, const uint8_t* valid, double* part) noexcept nogil:
    """label / valid (outer, inner) and part (one slot per piece) NULL: the softmax alone. Returns -1 when
    a thread's scratch could not be allocated (nothing is then computed by it), else 0."""
    cdef Py_ssize_t n = outer * C * inner, t, o, lo, cnt, P, pieces, total, es, q, sp, sb, sc, nb
    cdef const real* nx
    cdef real* lpb
    cdef bint sub
    cdef Py_ssize_t next_piece = 0
    cdef Py_ssize_t* counter = &next_piece
    cdef int nt = _threads(n)
    cdef bint stream = _streams(n, sizeof(real), _stream_min_bytes)
    cdef bint scratch
    cdef real* buf
    cdef real* e
    cdef real* ybase
    cdef caffe_softmax_pf* pf
    cdef double part_loss
    cdef int failed = 0
    cdef int* failed_p = &failed
    if inner == 1:
        for o in prange(outer, schedule="dynamic", chunksize=_grab(C), num_threads=nt):
            _fwd_row(xp + o * C, yp + o * C, C)
            if label != NULL:
                part[o] = _row_loss(yp + o * C, label[o], valid[o])
        return 0
    P = _piece(C, inner)
    pieces = (inner + P - 1) // P
    total = outer * pieces
    # Past SCRATCH_MIN_BYTES: the exp into a per-thread scratch block of C x P (in cache), then y = e / sum in
    # one pass (stored past the caches where `stream`), each piece prefetching the x of the next piece its thread
    # will take; unless a piece is far larger than PIECE (P is at least 64 positions). Smaller: the exp into y
    # itself, divided in place, no prefetch (all in cache; no scratch to allocate and fault in).
    scratch = _streams(n, sizeof(real), _scratch_min_bytes) and C * P <= 2 * PIECE
    stream = stream and scratch
    sub = scratch and real is float and LANES
    with parallel(num_threads=nt):
        # m, f (P each), the scratch block (C x P), s (P doubles), the label probabilities (P): the thread's
        # kept block (caffe_softmax_scratch), on a cache line
        buf = <real*> caffe_softmax_scratch(((C * P if scratch else 0) + 3 * P) * sizeof(real) + P * sizeof(double))
        pf = <caffe_softmax_pf*> malloc(sizeof(caffe_softmax_pf))
        if buf != NULL and pf != NULL:
            # Pieces handed out one at a time from a shared counter (dynamic scheduling: on a busy machine a
            # descheduled thread holds back two pieces, not half the work), each thread taking its next piece
            # before it starts the current one, so that it knows what to prefetch (the prefetch then runs through
            # all of a thread's pieces, not only within runs of consecutive ones: RUN = 4 left the first piece of
            # every run, a quarter of them, to wait on main memory). Each piece's output and loss are fixed:
            # the same bits on any number of threads.
            t = caffe_softmax_grab(counter)
            while t < total:
                q = caffe_softmax_grab(counter)
                o = t // pieces
                lo = (t % pieces) * P
                cnt = inner - lo if inner - lo < P else P
                # each piece in passes over sp positions at a time (its sub-pieces, in order: the same outputs
                # and loss); each prefetching the next sub-piece, of this piece or of the thread's next one
                sp = _sub_piece(C, cnt) if sub else cnt
                lpb = <real*>(<double*>(buf + 2 * P + (C * P if scratch else 0)) + P)
                sb = 0
                while sb < cnt:
                    sc = cnt - sb if cnt - sb < sp else sp
                    if sb + sp < cnt:
                        nx = xp + o * C * inner + lo + sb + sp
                        nb = cnt - sb - sp if cnt - sb - sp < sp else sp
                    else:
                        nx = xp + (q // pieces) * C * inner + (q % pieces) * P if scratch and q < total else NULL
                        nb = inner - (q % pieces) * P if inner - (q % pieces) * P < P else P
                        nb = _sub_piece(C, nb) if sub and _sub_piece(C, nb) < nb else nb
                    caffe_softmax_pf_init(pf, nx, inner * sizeof(real), C, nb * sizeof(real))
                    ybase = yp + o * C * inner + lo + sb
                    e = buf + 2 * P if scratch else ybase
                    es = sc if scratch else inner
                    part_loss = _fwd_piece(xp + o * C * inner + lo + sb, ybase, C, inner, sc, e, es, buf, buf + P,
                                           <double*>(buf + 2 * P + (C * P if scratch else 0)), pf,
                                           stream, label + o * inner + lo + sb if label != NULL else NULL,
                                           valid + o * inner + lo + sb if label != NULL else NULL, lpb + sb)
                    sb = sb + sp
                if label != NULL:
                    if real is float and LANES:
                        part[t] = caffe_softmax_piece_logsum_f(lpb, cnt)
                    else:
                        part[t] = part_loss  # (the generic loops: no sub-pieces)
                t = q
        else:
            failed_p[0] = 1
        free(pf)  # (buf stays the thread's)
    return -1 if failed else 0


def softmax_forward(const real[::1] x, real[::1] y, Py_ssize_t outer, Py_ssize_t C, Py_ssize_t inner):
    """y = softmax of x over C, for (outer, C, inner)."""
    cdef Py_ssize_t n = outer * C * inner
    if n == 0:
        return
    _need(x.shape[0], n, "bottom")
    _need(y.shape[0], n, "top")
    cdef int rc
    with nogil:
        rc = _forward(&x[0], &y[0], outer, C, inner, NULL, NULL, NULL)
    if rc:
        raise MemoryError("softmax kernel: no memory for a thread's scratch block")


# whether a valid label lies outside [0, C): branch-free, so that GCC vectorizes it (the loop with the test and the
# raise inside, with the GIL, took ~0.1 ms at 100K labels, outside the parallel region); the raise's loop runs
# only where there is one
cdef extern from *:
    """
    #include <stdint.h>
    static inline int caffe_softmax_labels_bad(const int64_t* label, const uint8_t* valid, ptrdiff_t n, int64_t C) {
        ptrdiff_t j;
        uint64_t bad = 0;
        for (j = 0; j < n; j++)  /* (a negative label is past C as unsigned) */
            bad |= (uint64_t)(valid[j] != 0) & (uint64_t)((uint64_t)label[j] >= (uint64_t)C);
        return bad != 0;
    }
    """
    int caffe_softmax_labels_bad(const int64_t* label, const uint8_t* valid, Py_ssize_t n, int64_t C) nogil


def softmax_loss_forward(const real[::1] x, real[::1] prob, const int64_t[::1] label, const uint8_t[::1] valid,
                         Py_ssize_t outer, Py_ssize_t C, Py_ssize_t inner):
    """prob = softmax of x over C, and (returned, double) the sum over the valid positions of
    -log(max(prob[label], FLT_MIN)): Caffe's SoftmaxWithLoss before the normalizer. label / valid are
    (outer, inner), a label only read where valid; each work item's sum is taken while its piece is
    in cache, and the items' sums are added in order (the same result on any number of threads)."""
    cdef Py_ssize_t n = outer * C * inner, q, items
    cdef int rc, bad
    cdef double total = 0
    cdef double* part
    if n == 0:
        return 0.0
    _need(x.shape[0], n, "bottom")
    _need(prob.shape[0], n, "prob")
    _need(label.shape[0], outer * inner, "label")
    _need(valid.shape[0], outer * inner, "valid")
    with nogil:
        bad = caffe_softmax_labels_bad(&label[0], &valid[0], outer * inner, C)
    if bad:
        for q in range(outer * inner):
            if valid[q] and (label[q] < 0 or label[q] >= C):
                raise ValueError(f"softmax kernel: label {label[q]} out of range [0, {C})")
    items = outer if inner == 1 else outer * ((inner + _piece(C, inner) - 1) // _piece(C, inner))
    part = <double*> malloc(items * sizeof(double))
    if part == NULL:
        raise MemoryError()
    try:
        with nogil:
            rc = _forward(&x[0], &prob[0], outer, C, inner, &label[0], &valid[0], part)
        if rc:
            raise MemoryError("softmax kernel: no memory for a thread's scratch block")
        for q in range(items):
            total += part[q]
    finally:
        free(part)
    return total


cdef void _bwd_piece(const real* y, const real* dy, real* dx, Py_ssize_t C, Py_ssize_t inner, Py_ssize_t P,
                     double* s, real* f, real* row, const real* ny, const real* ndy, bint stream) noexcept nogil:
    """dx = (dy - sum_c dy * y) * y over P positions (pointers at channel 0, channel stride inner). ny / ndy:
    the next piece's y and dy, prefetched row by row during the second pass. stream: each dx row is computed
    into `row` (P, in L1) and stored past the caches. s: P doubles, f: P of x's type."""
    _bwd_sums(y, dy, C, inner, P, s, f)
    _bwd_piece_end(y, dy, dx, C, inner, P, s, f, row, ny, ndy, stream)


cdef inline void _bwd_sums(const real* y, const real* dy, Py_ssize_t C, Py_ssize_t inner, Py_ssize_t P, double* s,
                           real* f) noexcept nogil:
    cdef Py_ssize_t c, c0, c1, j, o
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


cdef inline void _bwd_piece_end(const real* y, const real* dy, real* dx, Py_ssize_t C, Py_ssize_t inner, Py_ssize_t P,
                                double* s, real* f, real* row, const real* ny, const real* ndy,
                                bint stream) noexcept nogil:
    cdef Py_ssize_t c, j, o
    cdef real* sr
    cdef real* out
    sr = f  # the sums in x's precision
    for j in range(P):
        sr[j] = <real>s[j]
    if not stream and ny == NULL:  # (in cache; also inner == 1, one position a piece: no per-row branches)
        for c in range(C):
            o = c * inner
            for j in range(P):
                dx[o + j] = (dy[o + j] - sr[j]) * y[o + j]
        return
    for c in range(C):
        o = c * inner
        if ny != NULL:
            caffe_prefetch_t1(ny + o, P * sizeof(real))
            caffe_prefetch_t1(ndy + o, P * sizeof(real))
        out = row if stream else dx + o
        for j in range(P):
            out[j] = (dy[o + j] - sr[j]) * y[o + j]
        if stream:
            caffe_stream_copy(dx + o, row, P * sizeof(real))
    if stream:
        caffe_store_fence()


cdef void _bwd_row(const real* y, const real* dy, real* dx, Py_ssize_t C) noexcept nogil:
    # inner == 1: _bwd_piece with P = 1 (the same sums, the same bits) as straight loops over the row
    cdef Py_ssize_t c, c0, c1
    cdef double s = 0
    cdef real f, sr
    for c0 in range(0, C, 16):  # SUM_BLOCK
        c1 = c0 + SUM_BLOCK if c0 + SUM_BLOCK < C else C
        f = 0
        for c in range(c0, c1):
            f += dy[c] * y[c]
        s += f
    sr = <real>s
    for c in range(C):
        dx[c] = (dy[c] - sr) * y[c]




def softmax_backward(const real[::1] y, const real[::1] dy, real[::1] dx, Py_ssize_t outer, Py_ssize_t C,
                     Py_ssize_t inner):
    """dx = (dy - sum_c dy * y) * y (dx may be dy: in place)."""
    cdef Py_ssize_t n = outer * C * inner, t, k, o, lo, P, pieces, run, runs, q, cnt
    cdef int failed = 0
    cdef int* failed_p = &failed
    cdef bint stream
    cdef double* buf
    cdef const real* ny
    cdef const real* ndy
    cdef const real* yp
    cdef const real* dyp
    cdef real* dxp
    if n == 0:
        return
    for b, what in ((y, "top"), (dy, "top diff"), (dx, "bottom diff")):
        _need(len(b), n, what)
    yp, dyp, dxp = &y[0], &dy[0], &dx[0]
    if inner == 1:
        with nogil:
            for o in prange(outer, schedule="dynamic", chunksize=_grab(C), num_threads=_threads(n)):
                _bwd_row(yp + o * C, dyp + o * C, dxp + o * C, C)
        return
    # pieces of the forward's sub-piece length (at 8x64x112x112: 512 positions, not 1024 / 2048; each position's
    # dx does not depend on the cut)
    P = _sub_piece(C, _piece(C, inner))
    pieces = (inner + P - 1) // P
    stream = _streams(n, sizeof(real), _stream_min_bytes)
    run = RUN if stream else 1
    runs = (outer * pieces + run - 1) // run
    with nogil, parallel(num_threads=_threads(n)):
        # s (P doubles), f (P), a dx row (P) when streaming
        buf = <double*> malloc(P * sizeof(double) + 2 * P * sizeof(real))
        if buf != NULL:
            for k in prange(runs, schedule="dynamic", chunksize=_grab(C * P * run)):
                for t in range(k * run, (k + 1) * run if (k + 1) * run < outer * pieces else outer * pieces):
                    o = t // pieces
                    lo = (t % pieces) * P
                    cnt = inner - lo if inner - lo < P else P
                    q = t + 1
                    ny = NULL
                    ndy = NULL
                    if q < (k + 1) * run and q < outer * pieces:
                        ny = yp + (q // pieces) * C * inner + (q % pieces) * P
                        ndy = dyp + (q // pieces) * C * inner + (q % pieces) * P
                    _bwd_piece(yp + o * C * inner + lo, dyp + o * C * inner + lo, dxp + o * C * inner + lo, C, inner,
                               cnt, buf, <real*>(buf + P), <real*>(buf + P) + P, ny, ndy, stream)
            free(buf)
        else:
            failed_p[0] = 1
    if failed:
        raise MemoryError("softmax kernel: no memory for a thread's scratch block")


# loss_labels' loop without branches or a conversion to int64 of every value, so that GCC vectorizes it (with the
# first bad label tracked inside it stayed scalar: 0.09-0.14 ms for 100K labels, 5-9% of SoftmaxWithLoss's forward
# at 8x64x112x112); the first bad label is looked for afterwards, only where there is one. In terms of the value v
# (in double: exact for float32 and float64 labels): trunc(v) is in [0, C) iff -1 < v < C, and trunc(v) == k iff
# v lies in (lo, hi) below (k > 0: [k, k + 1), k < 0: (k - 1, k], 0: (-1, 1)); NaN is in no interval.
cdef extern from *:
    """
    #include <math.h>
    #include <stdint.h>
    #define CAFFE_LOSS_LABELS(T, NAME) \\
    static inline ptrdiff_t NAME(const T* raw, ptrdiff_t n, int64_t C, int has_ignore, int64_t ignore, \\
                                 int64_t* label, uint8_t* valid, ptrdiff_t* bad) { \\
        ptrdiff_t i, count = 0, nbad = 0; \\
        const double k = (double)ignore, c = (double)C; \\
        const double lo = !has_ignore ? 1.0 : k > 0 ? nextafter(k, -INFINITY) : k - 1.0; \\
        const double hi = !has_ignore ? -1.0 : k < 0 ? nextafter(k, INFINITY) : k + 1.0; \\
        for (i = 0; i < n; i++) { \\
            const double v = (double)raw[i]; \\
            const int ok = !(v > lo && v < hi); \\
            const int in = v > -1.0 && v < c; \\
            label[i] = ok & in ? (int64_t)(int32_t)(in ? v : 0.0) : 0;  /* (C < 2^31) */ \\
            valid[i] = (uint8_t)ok; \\
            count += ok; \\
            nbad += ok & !in; \\
        } \\
        *bad = nbad; \\
        return count; \\
    }
    CAFFE_LOSS_LABELS(float, caffe_loss_labels_f)
    CAFFE_LOSS_LABELS(double, caffe_loss_labels_d)
    """
    Py_ssize_t caffe_loss_labels_f(const float* raw, Py_ssize_t n, int64_t C, int has_ignore, int64_t ignore,
                                   int64_t* label, uint8_t* valid, Py_ssize_t* bad) nogil
    Py_ssize_t caffe_loss_labels_d(const double* raw, Py_ssize_t n, int64_t C, int has_ignore, int64_t ignore,
                                   int64_t* label, uint8_t* valid, Py_ssize_t* bad) nogil


def loss_labels(const real[::1] raw, Py_ssize_t C, bint has_ignore, int64_t ignore, int64_t[::1] label,
                uint8_t[::1] valid):
    """SoftmaxWithLoss's labels from the label blob's values, in one pass: label = static_cast<int>(raw) (C's
    truncation, as NumPy's astype), valid = label != ignore (all when not has_ignore), label 0 where not valid.
    Returns (the count of valid labels, the flat index of the first valid label outside [0, C), or -1);
    labels past the first bad one are still converted (a bad one to 0, valid). NaN and values past int64
    count as bad (never equal to ignore, an int32)."""
    cdef Py_ssize_t n = raw.shape[0], i, first = -1, count = 0, bad = 0
    cdef real v
    _need(label.shape[0], n, "label")
    _need(valid.shape[0], n, "valid")
    if n == 0:
        return 0, -1
    if C > 2147483647 or ignore > 2147483647 or ignore < -2147483647:
        raise ValueError(f"softmax kernel: {C} classes or ignore_label {ignore} past int32")
    with nogil:
        if real is float:
            count = caffe_loss_labels_f(&raw[0], n, C, has_ignore, ignore, &label[0], &valid[0], &bad)
        else:
            count = caffe_loss_labels_d(&raw[0], n, C, has_ignore, ignore, &label[0], &valid[0], &bad)
        if bad:
            for i in range(n):
                v = raw[i]
                if valid[i] and not (v > -1 and v < C):
                    first = i
                    break
    return count, first


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

# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math
# distutils: libraries = m
"""BatchNorm (batch statistics) and LRN (across channels) on the CPU, OpenMP-parallel.

BatchNorm works on (N, C, S) arrays, one channel per step (the channel's N planes of S), a thread taking up to
8 consecutive channels:
  forward   one pass for the statistics: sums of (x - K) and (x - K)^2 (blocks of 128 in x's
            precision, their totals in double: see BLOCK), K the channel's first value (a sample,
            so |mean - K| is of the order of the spread and the shifted sums lose nothing to
            cancellation); then one pass y = (x - mean) * inv_std
  backward  one pass for sum dy and sum dy * x_norm (as the forward's sums), then dx = (dy - mean dy -
            x_norm * mean(dy * x_norm)) * inv_std; x_norm is read from a saved copy or
            recomputed from x as the forward did (the same bits)
A channel of a ResNet/MobileNet batch (N * S * 4 bytes, ~100-400 KB) stays in the core's L2
cache between the two passes, so each kernel reads main memory once; the second pass prefetches the
next channel (where two fit L2), so that its read overlaps the current channel's write. Large outputs
(y, dx from 12 MB, x_norm from 4 MB) go out by non-temporal stores: see STREAM_MIN_BYTES.

LRN ACROSS_CHANNELS works on (N, C, S): per image and piece of S, the window sum of x^2 over
channels [c - r, c + r] slides along c in double (add the channel entering, subtract the one
leaving), as Caffe's CrossChannelForward_cpu does in Dtype. The backward slides dy * y / scale
the same way, reading the scale or recomputing it (the forward's sum, r channels ahead: the same bits). Work items are equal pieces of up to 4096 positions of one image (cut shorter for the
threads at small batches): the window's rows stay in cache while each channel row is read as one long
run; from blobs of a few MB (past L3's share) each channel step prefetches the rows the next step reads
from memory, and large outputs (y, scale, dx) stream past the caches.
"""
from cython.parallel cimport prange
from libc.stdlib cimport free, malloc

include "_threads.pxi"

ctypedef fused real:
    float
    double

include "_vmath.pxi"
include "_stream.pxi"

cdef enum:
    # LRN: at most this many spatial positions per work item. The window slides along the channels, so
    # only its 2r + 1 rows of a piece (and the double sums) need to stay in cache, not all C rows: long
    # pieces make every row a long contiguous run the hardware prefetcher follows (512 positions, 2 KB
    # per row, left the first read of each row waiting on memory).
    PIECE = 4096
    MIN_PIECE = 256  # positions: pieces are cut no shorter when split for the threads


cdef Py_ssize_t _lrn_piece(Py_ssize_t N, Py_ssize_t S, int threads) noexcept nogil:
    """Positions per LRN work item: S cut into equal pieces of up to PIECE, and enough of them that there are
    at least four items per thread where the images allow (batch 1); a multiple of 16 (whole cache lines),
    MIN_PIECE at least."""
    cdef Py_ssize_t want = (4 * threads + N - 1) // N, p
    if want < (S + PIECE - 1) // PIECE:
        want = (S + PIECE - 1) // PIECE
    p = (S + want - 1) // want
    if p < MIN_PIECE:
        p = MIN_PIECE
    p = (p + 15) // 16 * 16
    return p if p < S else S


def _lrn_piece_for_tests(Py_ssize_t N, Py_ssize_t S, int threads):
    """_lrn_piece, for the tests."""
    return _lrn_piece(N, S, threads)


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
    /* caffe_bn_sums over each block of b elements of p[0, n) in turn (n a multiple of 8, the last block     \
       shorter), four blocks at a time: each block sums into its own vectors as above and the four go into     \
       s and q in block order, so the same bits; the four chains of dependent additions run side by side (one  \
       block's chain was the statistics pass's limit: 3-4 cycles a vector of 8) */                             \
    static inline void caffe_bn_sums_run_##SUF(const T* p, Py_ssize_t n, Py_ssize_t b, T k, double* s,          \
                                               double* q) {                                                 \
        Py_ssize_t i0 = 0, i;                                                                              \
        int j;                                                                                             \
        for (; i0 + 4 * b <= n; i0 += 4 * b) {                                                             \
            V s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, q0 = {0}, q1 = {0}, q2 = {0}, q3 = {0}, v0, v1, v2, v3;  \
            const T* p0 = p + i0;                                                                          \
            for (i = 0; i < b; i += 8) {                                                                   \
                memcpy(&v0, p0 + i, sizeof(V));                                                            \
                memcpy(&v1, p0 + b + i, sizeof(V));                                                        \
                memcpy(&v2, p0 + 2 * b + i, sizeof(V));                                                    \
                memcpy(&v3, p0 + 3 * b + i, sizeof(V));                                                    \
                v0 = v0 - k;                                                                               \
                v1 = v1 - k;                                                                               \
                v2 = v2 - k;                                                                               \
                v3 = v3 - k;                                                                               \
                s0 += v0;                                                                                  \
                s1 += v1;                                                                                  \
                s2 += v2;                                                                                  \
                s3 += v3;                                                                                  \
                q0 += v0 * v0;                                                                             \
                q1 += v1 * v1;                                                                             \
                q2 += v2 * v2;                                                                             \
                q3 += v3 * v3;                                                                             \
            }                                                                                              \
            for (j = 0; j < 8; j++) {                                                                      \
                s[j] += s0[j];                                                                             \
                q[j] += q0[j];                                                                             \
            }                                                                                              \
            for (j = 0; j < 8; j++) {                                                                      \
                s[j] += s1[j];                                                                             \
                q[j] += q1[j];                                                                             \
            }                                                                                              \
            for (j = 0; j < 8; j++) {                                                                      \
                s[j] += s2[j];                                                                             \
                q[j] += q2[j];                                                                             \
            }                                                                                              \
            for (j = 0; j < 8; j++) {                                                                      \
                s[j] += s3[j];                                                                             \
                q[j] += q3[j];                                                                             \
            }                                                                                              \
        }                                                                                                  \
        for (; i0 < n; i0 += b)                                                                            \
            caffe_bn_sums_##SUF(p + i0, i0 + b < n ? b : n - i0, k, s, q);                                 \
    }                                                                                                      \
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
    void caffe_bn_sums_run_f(const float* p, Py_ssize_t n, Py_ssize_t b, float k, double* s, double* q) nogil
    void caffe_bn_sums_run_d(const double* p, Py_ssize_t n, Py_ssize_t b, double k, double* s, double* q) nogil
    void caffe_bn_dots_f(const float* d, const float* p, Py_ssize_t n, float mean, float inv, double* a,
                         double* b) nogil
    void caffe_bn_dots_d(const double* d, const double* p, Py_ssize_t n, double mean, double inv, double* a,
                         double* b) nogil


cdef inline void _block_dots(const real* d, const real* p, Py_ssize_t n, real mean, real inv, double* a,
                             double* b) noexcept nogil:
    if real is float:
        caffe_bn_dots_f(d, p, n, mean, inv, a, b)
    else:
        caffe_bn_dots_d(d, p, n, mean, inv, a, b)


cdef void _bn_stats(const real* x, Py_ssize_t N, Py_ssize_t C, Py_ssize_t S, double* mean,
                    double* var) noexcept nogil:
    cdef Py_ssize_t n, i, j, S8 = S - S % LANES
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
        if real is float:  # the blocks of BLOCK in turn (four at a time: the same sums)
            caffe_bn_sums_run_f(p, S8, BLOCK, k, sd, qd)
        else:
            caffe_bn_sums_run_d(p, S8, BLOCK, k, sd, qd)
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


# Outputs past the caches. A plain store first reads each line it writes from main memory (write-allocate),
# so an output written by plain stores costs twice its size in memory traffic; non-temporal stores write it
# once. Where an output is large (it does not fit beside its input in L3 anyway, and nothing reads it before
# the next layer), BatchNorm's SIMD loops store it so directly (caffe_bn_norm / caffe_bn_grad below), and
# LRN's loops (square roots, a division and double sums, vectorized by the compiler) compute a block of it
# into a small scratch buffer (L1) that one streaming copy sends out: the same loops, so the same bits.
# x_norm (kept for backward only in place) streams from a smaller size: nothing reads it until backward.
# A work item that streamed ends with a store fence (the lines are visible to every thread when it is done).
cdef extern from *:
    """
    #include <stddef.h>
    #include <stdint.h>
    #include <string.h>
    #if defined(__SSE2__)
    #include <immintrin.h>
    #endif
    /* elements of a block that starts at dst + j0: up to want, ending on a 64-byte line of dst where it can */
    static inline ptrdiff_t caffe_norm_block(const void* dst, ptrdiff_t j0, ptrdiff_t want, ptrdiff_t n,
                                             ptrdiff_t e) {
        ptrdiff_t j1 = j0 + want, mis;
        if (j1 >= n) return n - j0;
        mis = (ptrdiff_t)(((uintptr_t)((const char*)dst + j1 * e) & 63) / (uintptr_t)e);
        return want - mis > 0 ? want - mis : want;
    }
    """
    Py_ssize_t caffe_norm_block(const void* dst, Py_ssize_t j0, Py_ssize_t want, Py_ssize_t n,
                                Py_ssize_t itemsize) nogil

cdef enum:
    # Outputs of at least this many bytes are streamed (as kernels.softmax's): 25.7 MB ResNet / MobileNet
    # blobs do not fit beside their input in a 32 MB L3
    STREAM_MIN_BYTES = 12 << 20
    XNORM_STREAM_MIN_BYTES = 4 << 20  # x_norm from this size (smaller ones may well stay in cache)
    # LRN: positions per block of a channel step (a scratch block where the outputs stream; the next step's
    # rows prefetched a block at a time). Single-thread A/B at 8x256x56x56 and 8x64x112x112: forward 256 as
    # good as 128 and 1.3x faster than 1024; backward (four rows to prefetch) 64 1.12x faster than 128 and
    # 1.15x faster than 32. The backward that recomputes the scale (three rows to prefetch, more arithmetic a
    # position): 128, 1.1-1.2x faster than 64 (single thread, thread CPU time, at 8x256x56x56, 8x64x112x112 and
    # in cache; two threads' medians the same way), 256 slower than 128 at the full shapes.
    FWD_BLOCK = 256
    BWD_BLOCK = 64
    BWD_BLOCK_RECOMPUTE = 128
    # Blobs of at least this many bytes prefetch (LRN: by blocks); smaller ones are in cache, where the
    # prefetches find nothing to fetch (LRN's blocks cost 5-20% at 2x32x28x28 and 32x16x14x14)
    PREFETCH_MIN_BYTES = 1 << 20
    # LRN goes by blocks from larger blobs: up to ~2.5 MB (backward: four such arrays) or ~4 MB (forward: two)
    # they are read from L3, where one block a row (no prefetches, no block loop) was 5-25% faster (one thread,
    # thread CPU time, 1x256x32x32, 1x64x64x64, 8x96x27x27, 8x256x13x13, 8x64x28x28, 8x64x35x35; forward too at
    # 8x64x2000), while from 3.2 MB (backward) and 6.4 MB (forward, 8x64x56x56) the blocks' prefetches were
    # 1.1-1.4x faster
    LRN_FWD_PREFETCH_MIN_BYTES = 9 << 19
    LRN_BWD_PREFETCH_MIN_BYTES = 3 << 20

cdef Py_ssize_t _stream_min_bytes = STREAM_MIN_BYTES
cdef Py_ssize_t _xnorm_stream_min_bytes = XNORM_STREAM_MIN_BYTES
cdef Py_ssize_t _prefetch_min_bytes = PREFETCH_MIN_BYTES
cdef Py_ssize_t _lrn_fwd_prefetch_min_bytes = LRN_FWD_PREFETCH_MIN_BYTES
cdef Py_ssize_t _lrn_bwd_prefetch_min_bytes = LRN_BWD_PREFETCH_MIN_BYTES


def _set_stream_min_bytes(Py_ssize_t nbytes, xnorm_nbytes=None):
    """For the tests and benchmarks: the output size from which the kernels stream (0: always, the streaming
    paths on small shapes) and x_norm's (default: the same as nbytes, or XNORM_STREAM_MIN_BYTES when nbytes is
    STREAM_MIN_BYTES); returns the previous (outputs, x_norm) sizes."""
    global _stream_min_bytes, _xnorm_stream_min_bytes
    old = (_stream_min_bytes, _xnorm_stream_min_bytes)
    _stream_min_bytes = nbytes
    if xnorm_nbytes is None:
        xnorm_nbytes = XNORM_STREAM_MIN_BYTES if nbytes == STREAM_MIN_BYTES else nbytes
    _xnorm_stream_min_bytes = xnorm_nbytes
    return old


def _set_prefetch_min_bytes(Py_ssize_t nbytes):
    """For the tests: the blob size from which the kernels prefetch (LRN: by blocks; PREFETCH_MIN_BYTES restores
    LRN's own sizes too); returns the previous one."""
    global _prefetch_min_bytes, _lrn_fwd_prefetch_min_bytes, _lrn_bwd_prefetch_min_bytes
    old = _prefetch_min_bytes
    _prefetch_min_bytes = nbytes
    default = nbytes == PREFETCH_MIN_BYTES
    _lrn_fwd_prefetch_min_bytes = LRN_FWD_PREFETCH_MIN_BYTES if default else nbytes
    _lrn_bwd_prefetch_min_bytes = LRN_BWD_PREFETCH_MIN_BYTES if default else nbytes
    return old


def _lrn_prefetch_min_bytes_for_tests():
    """(forward, backward): the blob sizes from which LRN goes by blocks, for the tests."""
    return _lrn_fwd_prefetch_min_bytes, _lrn_bwd_prefetch_min_bytes


# BatchNorm's elementwise passes as SIMD loops with a choice of store per output (plain or non-temporal): the
# arithmetic is the scalar code's IEEE operations in the same order (no FMA), so the same bits in every build and
# in the scalar head and tail. (GCC cannot be asked for non-temporal stores in a loop it vectorizes itself.)
cdef extern from *:
    """
    #if defined(__AVX512F__)
    #define CAFFE_BN_VB 64
    #define CAFFE_BN_OP(name) _mm512_##name
    typedef __m512 caffe_bn_vps;
    typedef __m512d caffe_bn_vpd;
    #elif defined(__AVX__)
    #define CAFFE_BN_VB 32
    #define CAFFE_BN_OP(name) _mm256_##name
    typedef __m256 caffe_bn_vps;
    typedef __m256d caffe_bn_vpd;
    #elif defined(__SSE2__)
    #define CAFFE_BN_VB 16
    #define CAFFE_BN_OP(name) _mm_##name
    typedef __m128 caffe_bn_vps;
    typedef __m128d caffe_bn_vpd;
    #endif
    #if defined(CAFFE_BN_VB)
    #define CAFFE_BN_PREFETCH(p) __builtin_prefetch((const void*)(p), 0, 3)
    #define CAFFE_BN_ALIGNED(p) ((((uintptr_t)(p)) & (CAFFE_BN_VB - 1)) == 0)
    /* q = (p - mean) * inv, and r the same unless NULL; sq / sr: q / r by non-temporal stores (both only
       where their addresses agree modulo the vector size: else r by plain stores). */
    #define CAFFE_BN_APPLY(SUF, T, V, LOAD, STORE, STREAM, SET1, SUB, MUL)                                 \
    static void caffe_bn_norm_##SUF(const T* p, T* q, T* r, ptrdiff_t n, T mean, T inv, int sq, int sr,    \
                                    const T* pf) {                                                       \
        const ptrdiff_t w = CAFFE_BN_VB / (ptrdiff_t)sizeof(T);                                           \
        ptrdiff_t i = 0;                                                                                 \
        T v;                                                                                             \
        T* a;                                                                                            \
        if (r == NULL) sr = 0;                                                                           \
        if (sq && sr && !CAFFE_BN_ALIGNED((uintptr_t)q - (uintptr_t)r)) sr = 0;                          \
        a = sq ? q : (sr ? r : NULL);                                                                    \
        if (a != NULL)                                                                                   \
            for (; i < n && !CAFFE_BN_ALIGNED(a + i); i++) {                                             \
                v = (p[i] - mean) * inv;                                                                 \
                q[i] = v;                                                                                \
                if (r != NULL) r[i] = v;                                                                 \
            }                                                                                            \
        {                                                                                                \
            V vm = SET1(mean), vi = SET1(inv), x;                                                        \
            if (r == NULL && sq && pf != NULL)                                                           \
                for (; i + w <= n; i += w) {                                                             \
                    CAFFE_BN_PREFETCH(pf + i);                                                           \
                    STREAM(q + i, MUL(SUB(LOAD(p + i), vm), vi));                                        \
                }                                                                                        \
            else if (r == NULL && sq)                                                                    \
                for (; i + w <= n; i += w) STREAM(q + i, MUL(SUB(LOAD(p + i), vm), vi));                 \
            else if (r == NULL)                                                                          \
                for (; i + w <= n; i += w) STORE(q + i, MUL(SUB(LOAD(p + i), vm), vi));                  \
            else                                                                                         \
                for (; i + w <= n; i += w) {                                                             \
                    if (pf != NULL) CAFFE_BN_PREFETCH(pf + i);                                           \
                    x = MUL(SUB(LOAD(p + i), vm), vi);                                                   \
                    if (sq) STREAM(q + i, x); else STORE(q + i, x);                                      \
                    if (sr) STREAM(r + i, x); else STORE(r + i, x);                                      \
                }                                                                                        \
        }                                                                                                \
        for (; i < n; i++) {                                                                             \
            v = (p[i] - mean) * inv;                                                                     \
            q[i] = v;                                                                                    \
            if (r != NULL) r[i] = v;                                                                     \
        }                                                                                                \
    }                                                                                                    \
    /* g = (d - md - v * mdy) * inv, v = p (x_norm) or, from_x, (p - mean) * inv; sg: g by non-temporal   \
       stores */                                                                                         \
    static void caffe_bn_grad_##SUF(const T* d, const T* p, T* g, ptrdiff_t n, T md, T mdy, T mean, T inv,  \
                                    int from_x, int sg, const T* pfd, const T* pfp) {                    \
        const ptrdiff_t w = CAFFE_BN_VB / (ptrdiff_t)sizeof(T);                                           \
        ptrdiff_t i = 0;                                                                                 \
        if (sg)                                                                                          \
            for (; i < n && !CAFFE_BN_ALIGNED(g + i); i++)                                               \
                g[i] = (d[i] - md - (from_x ? (p[i] - mean) * inv : p[i]) * mdy) * inv;                 \
        {                                                                                                \
            V vmd = SET1(md), vmdy = SET1(mdy), vm = SET1(mean), vi = SET1(inv), v, x;                   \
            for (; i + w <= n; i += w) {                                                                 \
                if (pfd != NULL) {                                                                       \
                    CAFFE_BN_PREFETCH(pfd + i);                                                          \
                    CAFFE_BN_PREFETCH(pfp + i);                                                          \
                }                                                                                        \
                v = LOAD(p + i);                                                                         \
                if (from_x) v = MUL(SUB(v, vm), vi);                                                     \
                x = MUL(SUB(SUB(LOAD(d + i), vmd), MUL(v, vmdy)), vi);                                   \
                if (sg) STREAM(g + i, x); else STORE(g + i, x);                                          \
            }                                                                                            \
        }                                                                                                \
        for (; i < n; i++)                                                                               \
            g[i] = (d[i] - md - (from_x ? (p[i] - mean) * inv : p[i]) * mdy) * inv;                     \
    }
    #define CAFFE_BN_F(SUF, T)                                                                            \
        CAFFE_BN_APPLY(SUF, T, caffe_bn_v##SUF, CAFFE_BN_OP(loadu_##SUF), CAFFE_BN_OP(storeu_##SUF),        \
                       CAFFE_BN_OP(stream_##SUF), CAFFE_BN_OP(set1_##SUF), CAFFE_BN_OP(sub_##SUF),          \
                       CAFFE_BN_OP(mul_##SUF))
    CAFFE_BN_F(ps, float)
    CAFFE_BN_F(pd, double)
    #define caffe_bn_norm_f caffe_bn_norm_ps
    #define caffe_bn_norm_d caffe_bn_norm_pd
    #define caffe_bn_grad_f caffe_bn_grad_ps
    #define caffe_bn_grad_d caffe_bn_grad_pd
    #else
    /* no SIMD build: plain loops, no streaming */
    #define CAFFE_BN_PLAIN(SUF, T)                                                                        \
    static void caffe_bn_norm_##SUF(const T* p, T* q, T* r, ptrdiff_t n, T mean, T inv, int sq, int sr,    \
                                    const T* pf) {                                                       \
        ptrdiff_t i;                                                                                     \
        T v;                                                                                             \
        for (i = 0; i < n; i++) {                                                                        \
            v = (p[i] - mean) * inv;                                                                     \
            q[i] = v;                                                                                    \
            if (r != NULL) r[i] = v;                                                                     \
        }                                                                                                \
    }                                                                                                    \
    static void caffe_bn_grad_##SUF(const T* d, const T* p, T* g, ptrdiff_t n, T md, T mdy, T mean, T inv,  \
                                    int from_x, int sg, const T* pfd, const T* pfp) {                    \
        ptrdiff_t i;                                                                                     \
        for (i = 0; i < n; i++)                                                                          \
            g[i] = (d[i] - md - (from_x ? (p[i] - mean) * inv : p[i]) * mdy) * inv;                     \
    }
    CAFFE_BN_PLAIN(f, float)
    CAFFE_BN_PLAIN(d, double)
    #endif
    """
    void caffe_bn_norm_f(const float* p, float* q, float* r, Py_ssize_t n, float mean, float inv, int sq,
                         int sr, const float* pf) nogil
    void caffe_bn_norm_d(const double* p, double* q, double* r, Py_ssize_t n, double mean, double inv, int sq,
                         int sr, const double* pf) nogil
    void caffe_bn_grad_f(const float* d, const float* p, float* g, Py_ssize_t n, float md, float mdy, float mean,
                         float inv, int from_x, int sg, const float* pfd, const float* pfp) nogil
    void caffe_bn_grad_d(const double* d, const double* p, double* g, Py_ssize_t n, double md, double mdy,
                         double mean, double inv, int from_x, int sg, const double* pfd, const double* pfp) nogil


cdef void _bn_normalize(const real* x, real* y, real* xn, Py_ssize_t N, Py_ssize_t C, Py_ssize_t S,
                        real mean, real inv, bint stream_y, bint stream_xn, const real* nxt) noexcept nogil:
    # y (and x_norm unless NULL) = (x - mean) * inv, one chunk of S per image. In place (y is x) y stays in
    # cache: its lines were just read. nxt: the next channel's x (or NULL), prefetched chunk by chunk.
    cdef Py_ssize_t n
    for n in range(N):
        if real is float:
            caffe_bn_norm_f(x + n * C * S, y + n * C * S, xn + n * C * S if xn != NULL else NULL, S, mean, inv,
                            stream_y, stream_xn, nxt + n * C * S if nxt != NULL else NULL)
        else:
            caffe_bn_norm_d(x + n * C * S, y + n * C * S, xn + n * C * S if xn != NULL else NULL, S, mean, inv,
                            stream_y, stream_xn, nxt + n * C * S if nxt != NULL else NULL)
    if stream_y or stream_xn:
        caffe_store_fence()  # the streamed lines are visible to every thread before the kernel returns


cdef enum:
    GROUP_MAX = 8  # channels per BatchNorm work item at most
    PREFETCH_MAX_BYTES = 448 << 10  # a channel's inputs up to this size: the next one is prefetched into L2


cdef Py_ssize_t _bn_group(Py_ssize_t C, Py_ssize_t channel_bytes, int threads) noexcept nogil:
    """Channels per work item: a thread works through consecutive channels, prefetching the next one while it
    writes the current one (where two channels' inputs fit L2), at least 4 items per thread."""
    cdef Py_ssize_t k = C // (4 * threads)
    if channel_bytes > PREFETCH_MAX_BYTES:
        return 1
    if k > GROUP_MAX:
        k = GROUP_MAX
    return k if k > 1 else 1


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
    cdef double* vp = &var[0]
    cdef bint stream_y = yp != xp and n * <Py_ssize_t>sizeof(real) >= _stream_min_bytes
    cdef bint stream_xn = xnp != NULL and n * <Py_ssize_t>sizeof(real) >= _xnorm_stream_min_bytes
    cdef int nt = _threads(n)
    cdef Py_ssize_t K = _bn_group(C, N * S * sizeof(real), nt), g, c0, c1
    cdef bint prefetch = n * <Py_ssize_t>sizeof(real) >= _prefetch_min_bytes
    with nogil:
        for g in prange((C + K - 1) // K, schedule="dynamic", chunksize=_grab(K * N * S), num_threads=nt):
            c0 = g * K
            c1 = c0 + K if c0 + K < C else C
            for c in range(c0, c1):
                _bn_stats(xp + c * S, N, C, S, mp + c, vp + c)
                _bn_normalize(xp + c * S, yp + c * S, xnp + c * S if xnp != NULL else NULL, N, C, S,
                              <real>mp[c], <real>(1.0 / sqrt(vp[c] + eps)), stream_y, stream_xn,
                              xp + (c + 1) * S if c + 1 < c1 and prefetch else NULL)


cdef void _bn_backward(const real* dy, const real* xn, const real* x, real* dx, Py_ssize_t N, Py_ssize_t C,
                       Py_ssize_t S, real mean, real inv, bint stream, bint nxt) noexcept nogil:
    # stream: dx by non-temporal stores; nxt: prefetch the next channel's dy and x (x_norm)
    cdef Py_ssize_t n, i, i0, i1, j, S8 = S - S % LANES
    cdef const real* d
    cdef const real* p
    cdef double ad[LANES]
    cdef double bd[LANES]
    cdef double a = 0, b = 0, tot = <double>N * S
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
    md = <real>(a / tot)
    mdy = <real>(b / tot)
    p = xn if xn != NULL else x
    for n in range(N):  # the channel's dy and x (or x_norm) are in L2 now; the next one's are fetched meanwhile
        if real is float:
            caffe_bn_grad_f(dy + n * C * S, p + n * C * S, dx + n * C * S, S, md, mdy, mean, inv, xn == NULL, stream,
                            dy + S + n * C * S if nxt else NULL, p + S + n * C * S if nxt else NULL)
        else:
            caffe_bn_grad_d(dy + n * C * S, p + n * C * S, dx + n * C * S, S, md, mdy, mean, inv, xn == NULL, stream,
                            dy + S + n * C * S if nxt else NULL, p + S + n * C * S if nxt else NULL)
    if stream:
        caffe_store_fence()


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
    cdef const real* mp = &mean[0]
    cdef const real* ip = &inv_std[0]
    # dx streams where large, unless it is dy (in place: its lines are in cache, just read)
    cdef bint stream = <const real*>dxp != dyp and n * <Py_ssize_t>sizeof(real) >= _stream_min_bytes
    cdef int nt = _threads(n)
    cdef Py_ssize_t K = _bn_group(C, 2 * N * S * sizeof(real), nt), g, c0, c1
    cdef bint prefetch = n * <Py_ssize_t>sizeof(real) >= _prefetch_min_bytes
    with nogil:
        for g in prange((C + K - 1) // K, schedule="dynamic", chunksize=_grab(K * N * S), num_threads=nt):
            c0 = g * K
            c1 = c0 + K if c0 + K < C else C
            for c in range(c0, c1):
                _bn_backward(dyp + c * S, xnp + c * S if xnp != NULL else NULL, xp + c * S if xp != NULL else NULL,
                             dxp + c * S, N, C, S, mp[c], ip[c], stream, c + 1 < c1 and prefetch)


# -- LRN across channels -------------------------------------------------------------------------

cdef inline real _pow_neg(real s, real beta) noexcept nogil:
    """s ^ -beta; beta = 0.75 (AlexNet's) as 1 / (sqrt(s) * sqrt(sqrt(s))), as the NumPy path."""
    cdef real t
    if beta == <real>0.75:
        t = _sqrt(s)
        return 1 / (_sqrt(t) * t)
    return _pow(s, -beta)


cdef inline void _lrn_fwd_span(double* acc, const real* xe, const real* xl, const real* xc, real* sc, real* yc,
                               Py_ssize_t m, real a, real k, real beta) noexcept nogil:
    # One channel step over m positions: add the square of the channel entering the window, compute, subtract
    # the one leaving (the same operations in the same order per position as three passes, so the same bits;
    # fused, the adds hide under the square roots and the division).
    cdef Py_ssize_t j
    cdef real s
    cdef double t
    if sc != NULL:
        for j in range(m):
            t = acc[j] + <double>xe[j] * xe[j]
            s = k + a * <real>t
            sc[j] = s
            yc[j] = xc[j] * _pow_neg(s, beta)
            acc[j] = t - <double>xl[j] * xl[j]
    else:  # no backward reads it (a TEST-phase forward): the same values, the scale's write saved
        for j in range(m):
            t = acc[j] + <double>xe[j] * xe[j]
            s = k + a * <real>t
            yc[j] = xc[j] * _pow_neg(s, beta)
            acc[j] = t - <double>xl[j] * xl[j]


cdef void _lrn_fwd_piece(const real* x, real* y, real* scale, Py_ssize_t C, Py_ssize_t S, Py_ssize_t P,
                         int r, real a, real k, real beta, bint stream, bint blocked) noexcept nogil:
    # x, y, scale point at channel 0, position lo of one image; P positions; channel stride S.
    # Where no channel enters or leaves the window, a row of zeros does (acc + 0.0 and acc - 0.0 are acc: the
    # sums are never -0.0). Each channel step goes by blocks of FWD_BLOCK positions, prefetching the same block
    # of the row that enters the window next (the only row read from memory: the others were read by the
    # steps before), where `blocked` (else one block: a blob in cache); stream: y and scale are computed into
    # scratch blocks (L1) and go out by non-temporal stores.
    cdef Py_ssize_t blk = FWD_BLOCK if stream else 0
    cdef double* acc = <double*> malloc(P * sizeof(double) + (P + 2 * blk) * sizeof(real))
    cdef Py_ssize_t c, j, j0, m
    cdef const real* xe
    cdef const real* xl
    cdef const real* xc
    cdef const real* xn
    cdef real* zero
    cdef real* yb
    cdef real* sb
    cdef real* sc
    cdef real* yc
    if acc == NULL:
        return
    zero = <real*>(acc + P)
    yb = zero + P
    sb = yb + blk
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
        sc = scale + c * S if scale != NULL else NULL
        xn = x + (c + r + 1) * S if c + r + 1 < C else NULL
        j0 = 0
        while j0 < P:
            if stream:
                m = caffe_norm_block(yc, j0, FWD_BLOCK, P, sizeof(real))
            elif blocked:
                m = P - j0 if P - j0 < FWD_BLOCK else FWD_BLOCK
            else:
                m = P
            if xn != NULL and blocked:
                caffe_prefetch_t0(xn + j0, m * sizeof(real))
            if stream:
                _lrn_fwd_span(acc + j0, xe + j0, xl + j0, xc + j0, sb if sc != NULL else NULL, yb, m, a, k, beta)
                caffe_stream_copy(yc + j0, yb, m * sizeof(real))
                if sc != NULL:
                    caffe_stream_copy(sc + j0, sb, m * sizeof(real))
            else:
                _lrn_fwd_span(acc + j0, xe + j0, xl + j0, xc + j0, sc + j0 if sc != NULL else NULL, yc + j0, m, a,
                              k, beta)
            j0 += m
    if stream:
        caffe_store_fence()
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
    cdef bint stream = n * <Py_ssize_t>sizeof(real) >= _stream_min_bytes
    cdef bint blocked = stream or n * <Py_ssize_t>sizeof(real) >= _lrn_fwd_prefetch_min_bytes
    with nogil:
        for t in prange(N * pieces, schedule="dynamic", chunksize=_grab(C * P), num_threads=nt):
            img = t // pieces
            lo = (t % pieces) * P
            m = S - lo if S - lo < P else P
            _lrn_fwd_piece(xp + img * C * S + lo, yp + img * C * S + lo,
                           sp + img * C * S + lo if sp != NULL else NULL, C, S, m, r,
                           <real>(alpha / size), <real>k, <real>beta, stream, blocked)


cdef inline void _lrn_ratio_span(real* q, const real* dy, const real* y, const real* scale,
                                 Py_ssize_t m) noexcept nogil:
    cdef Py_ssize_t j
    for j in range(m):
        q[j] = dy[j] * y[j] / scale[j]


# LRN's backward channel step as C loops whose pointers are declared restrict: every row of a step is a
# different array or ring slot (the ratio ring's entering and leaving rows are one only at local_size 1, both
# read), so GCC vectorizes them without run-time overlap checks (Cython's inline loops were versioned on them):
# 1.0-1.05x as fast in cache (one thread, one block a row, AVX-512 and AVX2). The operations are the Cython loops' in the same order (double sums of the
# float terms, the scale and ratio in the data's precision, 1 / (sqrt(s) * sqrt(sqrt(s))): beta 0.75 only; a
# float division rounded once equals Cython's double one rounded to float), so the same bits. In place (the
# bottom diff is the top diff) the gradient loop reads and writes one pointer.
cdef extern from *:
    """
    #include <math.h>
    #include <stddef.h>
    #define CAFFE_LRN_STEP_FUNCS(SUF, T, SQRT)                                                          \
    /* the forward's step for the channel entering the window: scale row sc, ratio row q */          \
    static inline void caffe_lrn_enter_##SUF(double* __restrict acc, const T* __restrict xe,           \
            const T* __restrict xl, const T* __restrict dy, const T* __restrict y, T* __restrict sc,    \
            T* __restrict q, ptrdiff_t m, T a, T k) {                                                   \
        for (ptrdiff_t j = 0; j < m; j++) {                                                             \
            double t = acc[j] + (double)xe[j] * xe[j];                                                  \
            T s = k + a * (T)t;                                                                         \
            sc[j] = s;                                                                                  \
            q[j] = dy[j] * y[j] / s;                                                                    \
            acc[j] = t - (double)xl[j] * xl[j];                                                         \
        }                                                                                               \
    }                                                                                                   \
    /* dx of one channel (beta 0.75): the ratio row qe enters the window sum, ql leaves it */           \
    static inline void caffe_lrn_grad_##SUF(double* __restrict acc, const T* __restrict qe,            \
            const T* ql, const T* __restrict dy, const T* __restrict sc, const T* __restrict x,          \
            T* __restrict g, ptrdiff_t m, T cache) {                                                    \
        for (ptrdiff_t j = 0; j < m; j++) {                                                             \
            double t = acc[j] + qe[j];                                                                  \
            T r = SQRT(sc[j]);                                                                          \
            g[j] = dy[j] * ((T)1 / (SQRT(r) * r)) - (T)t * x[j] * cache;                                \
            acc[j] = t - ql[j];                                                                         \
        }                                                                                               \
    }                                                                                                   \
    static inline void caffe_lrn_grad_inplace_##SUF(double* __restrict acc, const T* __restrict qe,    \
            const T* ql, const T* __restrict sc, const T* __restrict x, T* __restrict g, ptrdiff_t m,    \
            T cache) {                                                                                  \
        for (ptrdiff_t j = 0; j < m; j++) {                                                             \
            double t = acc[j] + qe[j];                                                                  \
            T r = SQRT(sc[j]);                                                                          \
            g[j] = g[j] * ((T)1 / (SQRT(r) * r)) - (T)t * x[j] * cache;                                 \
            acc[j] = t - ql[j];                                                                         \
        }                                                                                               \
    }
    CAFFE_LRN_STEP_FUNCS(f, float, sqrtf)
    CAFFE_LRN_STEP_FUNCS(d, double, sqrt)
    """
    void caffe_lrn_enter_f(double* acc, const float* xe, const float* xl, const float* dy, const float* y, float* sc,
                           float* q, Py_ssize_t m, float a, float k) nogil
    void caffe_lrn_enter_d(double* acc, const double* xe, const double* xl, const double* dy, const double* y,
                           double* sc, double* q, Py_ssize_t m, double a, double k) nogil
    void caffe_lrn_grad_f(double* acc, const float* qe, const float* ql, const float* dy, const float* sc,
                          const float* x, float* g, Py_ssize_t m, float cache) nogil
    void caffe_lrn_grad_d(double* acc, const double* qe, const double* ql, const double* dy, const double* sc,
                          const double* x, double* g, Py_ssize_t m, double cache) nogil
    void caffe_lrn_grad_inplace_f(double* acc, const float* qe, const float* ql, const float* sc, const float* x,
                                  float* g, Py_ssize_t m, float cache) nogil
    void caffe_lrn_grad_inplace_d(double* acc, const double* qe, const double* ql, const double* sc,
                                  const double* x, double* g, Py_ssize_t m, double cache) nogil


cdef inline void _lrn_enter_span(double* acc, const real* xe, const real* xl, const real* dy, const real* y,
                                 real* sc, real* q, Py_ssize_t m, real a, real k) noexcept nogil:
    # The forward's channel step for the channel entering the backward's window (the same operations in the same
    # order: the same scale bits as the forward kept), and that channel's dy * y / scale.
    if real is float:
        caffe_lrn_enter_f(acc, xe, xl, dy, y, sc, q, m, a, k)
    else:
        caffe_lrn_enter_d(acc, xe, xl, dy, y, sc, q, m, a, k)


cdef inline void _lrn_bwd_span(double* acc, const real* qe, const real* ql, const real* dy, const real* scale,
                               const real* x, real* g, Py_ssize_t m, real cache, real beta) noexcept nogil:
    # One channel step over m positions: the entering row of dy * y / scale in (qe), dx, the leaving row out.
    # (Apart from _lrn_ratio_span: one loop over ten arrays was not vectorized.) Another beta: pow, here.
    cdef Py_ssize_t j
    cdef double t
    if beta == <real>0.75:
        if <const real*>g == dy:
            if real is float:
                caffe_lrn_grad_inplace_f(acc, qe, ql, scale, x, g, m, cache)
            else:
                caffe_lrn_grad_inplace_d(acc, qe, ql, scale, x, g, m, cache)
        elif real is float:
            caffe_lrn_grad_f(acc, qe, ql, dy, scale, x, g, m, cache)
        else:
            caffe_lrn_grad_d(acc, qe, ql, dy, scale, x, g, m, cache)
        return
    for j in range(m):
        t = acc[j] + qe[j]
        g[j] = dy[j] * _pow_neg(scale[j], beta) - <real>t * x[j] * cache
        acc[j] = t - ql[j]


cdef void _lrn_bwd_piece(const real* x, const real* y, const real* scale, const real* dy, real* dx,
                         Py_ssize_t C, Py_ssize_t S, Py_ssize_t P, int r, real a, real k, real cache, real beta,
                         bint stream, bint blocked) noexcept nogil:
    # The window's rows of dy * y / scale are kept in a ring of 2r + 1 rows (L1/L2): each is computed once,
    # when its channel enters the window, and subtracted from that same row when it leaves (the same
    # values as computing it twice, without the second division). One pass over the positions per
    # channel, as the forward: enter, compute, leave, in the order three passes took (the same bits);
    # a row of zeros enters or leaves where no channel does (acc + 0.0 is acc: the sums are never -0.0).
    # scale NULL: the scale is recomputed from x instead of read (a fifth array less from memory): the forward's
    # own window sum of x^2 runs r channels ahead (the channel whose ratio enters), and its scale rows wait in a
    # ring of r + 1 rows until their channel's dx; x's rows are read from memory once, as the sum's entering row
    # (2r channels before their dx).
    # Each step goes by blocks of positions, prefetching the same block of the rows the next step reads
    # first (dy, y and scale or x of the channel entering next, x of the next channel where it was not read
    # already), where `blocked`; stream: dx goes out by non-temporal stores from a scratch block.
    cdef Py_ssize_t ring = 2 * r + 1
    cdef bint recompute = scale == NULL
    cdef Py_ssize_t sring = r + 1 if recompute else 0
    cdef Py_ssize_t blk = BWD_BLOCK_RECOMPUTE if recompute else BWD_BLOCK
    cdef double* acc = <double*> malloc((2 if recompute else 1) * P * sizeof(double)
                                        + ((ring + sring + 1) * P + blk) * sizeof(real))
    cdef double* accs
    cdef real* rows
    cdef real* srows
    cdef real* q
    cdef real* ql
    cdef real* zero
    cdef real* gb
    cdef const real* xe
    cdef const real* xl
    cdef const real* sc
    cdef Py_ssize_t c, e, j, j0, m, o, oe, on
    if acc == NULL:
        return
    accs = acc + P if recompute else NULL
    rows = <real*>(acc + (2 if recompute else 1) * P)
    srows = rows + ring * P
    zero = srows + sring * P
    gb = zero + P
    for j in range(P):
        acc[j] = 0
        zero[j] = 0
    if recompute:
        for j in range(P):
            accs[j] = 0
        for c in range(r if r < C else C):
            xe = x + c * S
            for j in range(P):
                accs[j] += <double>xe[j] * xe[j]
    for c in range(r if r < C else C):
        o = c * S
        q = rows + (c % ring) * P
        if recompute:
            _lrn_enter_span(accs, x + (c + r) * S if c + r < C else zero, x + (c - r) * S if c - r >= 0 else zero,
                            dy + o, y + o, srows + (c % sring) * P, q, P, a, k)
        else:
            for j in range(P):
                q[j] = dy[o + j] * y[o + j] / scale[o + j]
        for j in range(P):
            acc[j] += q[j]
    for c in range(C):
        o = c * S
        ql = rows + ((c - r) % ring) * P if c - r >= 0 else zero
        q = rows + ((c + r) % ring) * P if c + r < C else zero
        oe = (c + r) * S
        on = (c + r + 1) * S if c + r + 1 < C else -1
        xe = xl = zero
        if recompute:
            e = c + r
            xe = x + (e + r) * S if e + r < C else zero
            xl = x + (e - r) * S if e - r >= 0 else zero
            sc = srows + (c % sring) * P
        else:
            sc = scale + o
        j0 = 0
        while j0 < P:
            if stream:
                m = caffe_norm_block(dx + o, j0, blk, P, sizeof(real))
            elif blocked:
                m = P - j0 if P - j0 < blk else blk
            else:
                m = P
            if on >= 0 and blocked:
                caffe_prefetch_t0(dy + on + j0, m * sizeof(real))
                caffe_prefetch_t0(y + on + j0, m * sizeof(real))
                if recompute:
                    if c + 2 * r + 1 < C:
                        caffe_prefetch_t0(x + (c + 2 * r + 1) * S + j0, m * sizeof(real))
                else:
                    caffe_prefetch_t0(scale + on + j0, m * sizeof(real))
            if c + 1 < C and blocked and not recompute:
                caffe_prefetch_t0(x + o + S + j0, m * sizeof(real))
            if c + r < C:
                if recompute:
                    _lrn_enter_span(accs + j0, xe + j0, xl + j0, dy + oe + j0, y + oe + j0,
                                    srows + ((c + r) % sring) * P + j0, q + j0, m, a, k)
                else:
                    _lrn_ratio_span(q + j0, dy + oe + j0, y + oe + j0, scale + oe + j0, m)
            _lrn_bwd_span(acc + j0, q + j0, ql + j0, dy + o + j0, sc + j0, x + o + j0,
                          gb if stream else dx + o + j0, m, cache, beta)
            if stream:
                caffe_stream_copy(dx + o + j0, gb, m * sizeof(real))
            j0 += m
    if stream:
        caffe_store_fence()
    free(acc)


def lrn_across_backward(const real[::1] x, const real[::1] y, const real[::1] scale, const real[::1] dy,
                        real[::1] dx, Py_ssize_t N, Py_ssize_t C, Py_ssize_t S, int size, double alpha,
                        double beta, k=None):
    """dx = dy * scale^-beta - 2 alpha beta / size * x * (window sum over channels of dy * y / scale).
    scale None: recomputed from x (and k, then required) as lrn_across_forward computes it (the same bits, so the
    same dx as from the scale that forward kept), not read."""
    cdef Py_ssize_t n = N * C * S, t, img, lo, m, off
    cdef int r = (size - 1) // 2
    if n == 0:
        return
    for buf, what in ((x, "bottom"), (y, "top"), (dy, "top diff"), (dx, "bottom diff")):
        _need(len(buf), n, what)
    if scale is not None:
        _need(len(scale), n, "scale")
    elif k is None:
        raise ValueError("normalization kernel: LRN backward without the scale needs k to recompute it")
    cdef double shift = k if k is not None else 0.0
    cdef int nt = _threads(n * size)
    cdef Py_ssize_t P = _lrn_piece(N, S, nt)
    cdef Py_ssize_t pieces = (S + P - 1) // P
    cdef real cache = <real>(2.0 * alpha * beta / size)
    cdef const real* sp = &scale[0] if scale is not None else NULL
    cdef bint stream = n * <Py_ssize_t>sizeof(real) >= _stream_min_bytes and &dx[0] != &dy[0]
    cdef bint blocked = stream or n * <Py_ssize_t>sizeof(real) >= _lrn_bwd_prefetch_min_bytes
    with nogil:
        for t in prange(N * pieces, schedule="dynamic", chunksize=_grab(C * P), num_threads=nt):
            img = t // pieces
            lo = (t % pieces) * P
            m = S - lo if S - lo < P else P
            off = img * C * S + lo
            _lrn_bwd_piece(&x[0] + off, &y[0] + off, sp + off if sp != NULL else NULL, &dy[0] + off,
                           &dx[0] + off, C, S, m, r, <real>(alpha / size), <real>shift, cache, <real>beta, stream,
                           blocked)

# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math
"""GEMMs with a short batch side (InnerProduct at batch 1-16), float32: one pass over the weights.

With M rows of data (the batch) and a weight matrix of N x K, every product InnerProduct needs is bound
by reading (and, for the weight diff, writing) the weights once; OpenBLAS packs the weight panel first
(a second write and read of it) and its micro-kernels are shaped for a long M. Three primitives, each
streaming the large operand B (or C) row by row while the short one stays in L1/L2:

  dots        out[m, n] = sum_k a[m, k] B[n, k] (+ bias[n])    forward (W as N x K); bottom diff of
                                                                 a transposed layer (W as K x N)
  combine     out[m, k] = sum_n a[m, n] B[n, k]                bottom diff (W as N x K); forward of a
                                                                 transposed layer (+ bias[k])
  rank_update C[n, k] += sum_m a[m, n] b[m, k]                 weight diff (C as N x K, or K x N with
                                                                 a and b swapped)

Sums: dots sums each (m, n) over k in vector lanes (lane j takes k = j mod W), then the lanes, then the
tail, so it rounds differently from a BLAS (within float32 summation error, which the properties bound);
combine sums over n in order, one FMA a step; rank_update sums over m in order from zero with one FMA a
step and adds the sum to C last, as a BLAS micro-kernel does for K = M <= its K-block (the same bits as
OpenBLAS's sgemm with beta = 1 there: the property checks it against NumPy's matmul + add).

The vector code is GCC's vector extensions, W = 16 lanes in the AVX-512 build (skinny_gemm_avx512), 8 in
the AVX2 build, 4 (SSE2) in the baseline one; FMA where the build has it (AVX2, AVX-512), else a multiply
and an add. Each (m, n) or (m, k) output is computed by one thread in a fixed order, so the results do not
depend on the thread count.
"""
from cython.parallel cimport parallel
from openmp cimport omp_get_thread_num, omp_get_num_threads
include "_threads.pxi"

cdef extern from *:
    """
    #include <stddef.h>
    #include <math.h>
    #if defined(__GNUC__)
      #if defined(__AVX512F__)
        #define SG_W 16
      #elif defined(__AVX__)
        #define SG_W 8
      #else
        #define SG_W 4
      #endif
      typedef float sg_vf __attribute__((vector_size(SG_W * 4), aligned(4), may_alias));
      #define SG_VEC 1
    #else
      #define SG_W 1
      #define SG_VEC 0
    #endif
    #if defined(__FMA__) || defined(__AVX512F__)
      #define SG_FMA(a, b, c) __builtin_fmaf((a), (b), (c))
      #if defined(__GNUC__)
        /* vector a * b + c is one FMA here (GCC contracts within an expression under fp-contract=fast,
           its default outside ISO C mode; the pragma makes it independent of -std) */
        #pragma GCC optimize("fp-contract=fast")
      #endif
    #else
      #define SG_FMA(a, b, c) ((a) * (b) + (c))
    #endif
    #if SG_W == 16
      #define SG_MB 8            /* rows of the short operand a vector kernel holds in registers */
    #else
      #define SG_MB 4
    #endif
    #define SG_NB 16             /* rows of B per pass of combine */
    /* x kept in a register: GCC otherwise folds the load of a's vector into each of the SG_R FMAs that use it
       (a memory operand each: SG_R loads of it instead of one, from L2 where a is large), which held dots at
       M = 8 to ~half its speed (AVX-512 build: 27 loads per 24 FMAs; CaffeNet fc7 at batch 8 3.6 -> 2.1 ms) */
    #if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && SG_VEC
      #define SG_KEEP(x) __asm__("" : "+v"(x))
    #else
      #define SG_KEEP(x) ((void)0)
    #endif

    static int sg_lanes(void) { return SG_W; }

    #if SG_VEC
    static inline float sg_hsum(sg_vf v) {
        float s = 0.0f;
        for (int j = 0; j < SG_W; j++) s += v[j];
        return s;
    }
    #endif

    /* Register blocking. An FMA's latency is ~4 cycles and two issue a cycle, so a kernel keeps 8 or more
       independent sums in flight, and shares each load among several FMAs: dots holds SG_R rows of B
       against SG_MB rows of a (unrolled U vectors along k when a has fewer rows); combine SG_MB rows of
       out by SG_CU vectors; rank_update 4 rows of C by 2 vectors. AVX-512 has 32 vector registers, the
       others 16: smaller blocks there. */
    #if SG_W == 16
      #define SG_R 3
    #else
      #define SG_R 2
    #endif
    #define SG_DU(MB) (SG_R * (MB) >= 8 ? 1 : (8 + SG_R * (MB) - 1) / (SG_R * (MB)))
    #define SG_CU(MB) ((MB) * 2 >= 8 ? 2 : 8 / (MB))

    /* dots of SG_R rows of B (b[r], rows of K) with a block of MB (a compile-time constant) rows of a */
    static inline __attribute__((always_inline)) void sg_dots_mb(
            const float* a, const float* const* b, float s[SG_R][SG_MB], ptrdiff_t K, const int MB, ptrdiff_t pf) {
        ptrdiff_t k = 0;
    #if SG_VEC
        const int U = SG_DU(MB);
        sg_vf acc[SG_R][SG_MB][4];
        for (int r = 0; r < SG_R; r++)
            for (int i = 0; i < MB; i++)
                for (int u = 0; u < U; u++) acc[r][i][u] = (sg_vf){0};
        for (; k + U * SG_W <= K; k += U * SG_W)
            for (int u = 0; u < U; u++) {
                sg_vf w[SG_R];
                if (pf)
                    for (int r = 0; r < SG_R; r++) __builtin_prefetch(b[r] + k + u * SG_W + pf, 0, 3);
                for (int r = 0; r < SG_R; r++) w[r] = *(const sg_vf*)(b[r] + k + u * SG_W);
                for (int i = 0; i < MB; i++) {
                    sg_vf x = *(const sg_vf*)(a + i * K + k + u * SG_W);
                    SG_KEEP(x);
                    for (int r = 0; r < SG_R; r++) acc[r][i][u] = x * w[r] + acc[r][i][u];
                }
            }
        for (; k + SG_W <= K; k += SG_W)
            for (int i = 0; i < MB; i++) {
                sg_vf x = *(const sg_vf*)(a + i * K + k);
                SG_KEEP(x);
                for (int r = 0; r < SG_R; r++) acc[r][i][0] = x * *(const sg_vf*)(b[r] + k) + acc[r][i][0];
            }
        for (int r = 0; r < SG_R; r++)
            for (int i = 0; i < MB; i++) {
                for (int u = 1; u < U; u++) acc[r][i][0] += acc[r][i][u];
                s[r][i] = sg_hsum(acc[r][i][0]);
            }
    #else
        for (int r = 0; r < SG_R; r++)
            for (int i = 0; i < MB; i++) s[r][i] = 0.0f;
    #endif
        for (; k < K; k++)
            for (int i = 0; i < MB; i++)
                for (int r = 0; r < SG_R; r++) s[r][i] = SG_FMA(a[i * K + k], b[r][k], s[r][i]);
    }

    /* out[m, n] for rows n0..n1 of B: SG_R rows of B at a time against every block of rows of a, so B is
       read from memory once (the rows stay in L2 while the blocks of a pass); a short last group repeats
       its last row (computed, not stored) */
    static void sg_dots(const float* a, const float* B, float* out, const float* bias,
                        ptrdiff_t M, ptrdiff_t N, ptrdiff_t K, ptrdiff_t n0, ptrdiff_t n1, ptrdiff_t pf) {
        float s[SG_R][SG_MB];
        const float* b[SG_R];
        for (ptrdiff_t n = n0; n < n1; n += SG_R) {
            const int rows = n1 - n < SG_R ? (int)(n1 - n) : SG_R;
            for (int r = 0; r < SG_R; r++) b[r] = B + (n + (r < rows ? r : rows - 1)) * K;
            for (ptrdiff_t m0 = 0; m0 < M; m0 += SG_MB) {
                const float* am = a + m0 * K;
                const int mb = M - m0 < SG_MB ? (int)(M - m0) : SG_MB;
                switch (mb) {
                    case 1: sg_dots_mb(am, b, s, K, 1, pf); break;
                    case 2: sg_dots_mb(am, b, s, K, 2, pf); break;
                    case 3: sg_dots_mb(am, b, s, K, 3, pf); break;
    #if SG_MB > 4
                    case 4: sg_dots_mb(am, b, s, K, 4, pf); break;
                    case 5: sg_dots_mb(am, b, s, K, 5, pf); break;
                    case 6: sg_dots_mb(am, b, s, K, 6, pf); break;
                    case 7: sg_dots_mb(am, b, s, K, 7, pf); break;
    #endif
                    default: sg_dots_mb(am, b, s, K, SG_MB, pf); break;
                }
                for (int i = 0; i < mb; i++)
                    for (int r = 0; r < rows; r++)
                        out[(m0 + i) * N + n + r] = bias ? s[r][i] + bias[n + r] : s[r][i];
            }
        }
    }

    /* combine for a block of MB rows of a (lda = N) into out (ldo = K), columns k0..k1: by passes over
       SG_NB rows of B, each adding to out's columns (in L1/L2) */
    static inline __attribute__((always_inline)) void sg_combine_mb(
            const float* a, const float* B, float* out, ptrdiff_t N, ptrdiff_t K,
            ptrdiff_t k0, ptrdiff_t k1, const int MB, ptrdiff_t pf) {
        ptrdiff_t n0, n, k;
        for (n0 = 0; n0 < N; n0 += SG_NB) {
            ptrdiff_t ne = n0 + SG_NB < N ? n0 + SG_NB : N;
            const int first = n0 == 0;
            k = k0;
    #if SG_VEC
            const int U = SG_CU(MB);
            for (; k + U * SG_W <= k1; k += U * SG_W) {
                sg_vf acc[SG_MB][8];
                for (int i = 0; i < MB; i++)
                    for (int u = 0; u < U; u++)
                        acc[i][u] = first ? (sg_vf){0} : *(const sg_vf*)(out + i * K + k + u * SG_W);
                for (n = n0; n < ne; n++) {
                    sg_vf w[8];
                    if (pf)
                        for (int u = 0; u < U; u++) __builtin_prefetch(B + n * K + k + u * SG_W + pf, 0, 3);
                    for (int u = 0; u < U; u++) w[u] = *(const sg_vf*)(B + n * K + k + u * SG_W);
                    for (int i = 0; i < MB; i++) {
                        const float c = a[i * N + n];
                        for (int u = 0; u < U; u++) acc[i][u] = c * w[u] + acc[i][u];
                    }
                }
                for (int i = 0; i < MB; i++)
                    for (int u = 0; u < U; u++) *(sg_vf*)(out + i * K + k + u * SG_W) = acc[i][u];
            }
            for (; k + SG_W <= k1; k += SG_W) {
                sg_vf acc[SG_MB];
                for (int i = 0; i < MB; i++) acc[i] = first ? (sg_vf){0} : *(const sg_vf*)(out + i * K + k);
                for (n = n0; n < ne; n++) {
                    sg_vf w = *(const sg_vf*)(B + n * K + k);
                    for (int i = 0; i < MB; i++) acc[i] = a[i * N + n] * w + acc[i];
                }
                for (int i = 0; i < MB; i++) *(sg_vf*)(out + i * K + k) = acc[i];
            }
    #endif
            for (; k < k1; k++)
                for (int i = 0; i < MB; i++) {
                    float s = first ? 0.0f : out[i * K + k];
                    for (n = n0; n < ne; n++) s = SG_FMA(a[i * N + n], B[n * K + k], s);
                    out[i * K + k] = s;
                }
        }
    }

    static void sg_combine(const float* a, const float* B, float* out, const float* bias,
                           ptrdiff_t M, ptrdiff_t N, ptrdiff_t K, ptrdiff_t k0, ptrdiff_t k1, ptrdiff_t pf) {
        for (ptrdiff_t m0 = 0; m0 < M; m0 += SG_MB) {
            const float* am = a + m0 * N;
            float* om = out + m0 * K;
            const int mb = M - m0 < SG_MB ? (int)(M - m0) : SG_MB;
            switch (mb) {
                case 1: sg_combine_mb(am, B, om, N, K, k0, k1, 1, pf); break;
                case 2: sg_combine_mb(am, B, om, N, K, k0, k1, 2, pf); break;
                case 3: sg_combine_mb(am, B, om, N, K, k0, k1, 3, pf); break;
    #if SG_MB > 4
                case 4: sg_combine_mb(am, B, om, N, K, k0, k1, 4, pf); break;
                case 5: sg_combine_mb(am, B, om, N, K, k0, k1, 5, pf); break;
                case 6: sg_combine_mb(am, B, om, N, K, k0, k1, 6, pf); break;
                case 7: sg_combine_mb(am, B, om, N, K, k0, k1, 7, pf); break;
    #endif
                default: sg_combine_mb(am, B, om, N, K, k0, k1, SG_MB, pf); break;
            }
            if (bias)
                for (int i = 0; i < mb; i++)
                    for (ptrdiff_t k = k0; k < k1; k++) om[i * K + k] += bias[k];
        }
    }

    /* rank_update over rows n0..n1 of C (ldc = K): C[n, k] += sum_m a[m, n] b[m, k] (lda = N, ldb = K).
       Each output's sum runs over m in order from zero, then adds to C. */
    static void sg_rank_update(const float* a, const float* b, float* C, ptrdiff_t M, ptrdiff_t N,
                               ptrdiff_t K, ptrdiff_t n0, ptrdiff_t n1, ptrdiff_t pf) {
        ptrdiff_t n = n0, k, m;
    #if SG_VEC
        for (; n + 4 <= n1; n += 4) {
            for (k = 0; k + 2 * SG_W <= K; k += 2 * SG_W) {
                sg_vf acc[4][2];
                if (pf)
                    for (int r = 0; r < 4; r++) {
                        __builtin_prefetch(C + (n + r) * K + k + pf, 1, 3);
                        __builtin_prefetch(C + (n + r) * K + k + pf + SG_W, 1, 3);
                    }
                for (int r = 0; r < 4; r++) acc[r][0] = acc[r][1] = (sg_vf){0};
                for (m = 0; m < M; m++) {
                    const sg_vf x0 = *(const sg_vf*)(b + m * K + k), x1 = *(const sg_vf*)(b + m * K + k + SG_W);
                    for (int r = 0; r < 4; r++) {
                        const float c = a[m * N + n + r];
                        acc[r][0] = c * x0 + acc[r][0];
                        acc[r][1] = c * x1 + acc[r][1];
                    }
                }
                for (int r = 0; r < 4; r++) {
                    float* cr = C + (n + r) * K + k;
                    *(sg_vf*)(cr) = *(const sg_vf*)(cr) + acc[r][0];
                    *(sg_vf*)(cr + SG_W) = *(const sg_vf*)(cr + SG_W) + acc[r][1];
                }
            }
            for (; k < K; k++)
                for (int r = 0; r < 4; r++) {
                    float s = 0.0f;
                    for (m = 0; m < M; m++) s = SG_FMA(a[m * N + n + r], b[m * K + k], s);
                    C[(n + r) * K + k] += s;
                }
        }
    #endif
        for (; n < n1; n++)
            for (k = 0; k < K; k++) {
                float s = 0.0f;
                for (m = 0; m < M; m++) s = SG_FMA(a[m * N + n], b[m * K + k], s);
                C[n * K + k] += s;
            }
    }
    """
    int sg_lanes() nogil
    void sg_dots(const float* a, const float* B, float* out, const float* bias, Py_ssize_t M, Py_ssize_t N,
                 Py_ssize_t K, Py_ssize_t n0, Py_ssize_t n1, Py_ssize_t pf) noexcept nogil
    void sg_combine(const float* a, const float* B, float* out, const float* bias, Py_ssize_t M,
                    Py_ssize_t N, Py_ssize_t K, Py_ssize_t k0, Py_ssize_t k1, Py_ssize_t pf) noexcept nogil
    void sg_rank_update(const float* a, const float* b, float* C, Py_ssize_t M, Py_ssize_t N, Py_ssize_t K,
                        Py_ssize_t n0, Py_ssize_t n1, Py_ssize_t pf) noexcept nogil


LANES = sg_lanes()
cdef Py_ssize_t _LANES = LANES

# Software prefetch of the streamed operand (B, or C for rank_update), PREFETCH_FLOATS ahead in its row, where
# it is at least PREFETCH_MIN_FLOATS (then it comes from memory: an InnerProduct's weights, read once a pass)
# and the short side has 2 rows or more. With M rows the FMAs per weight line grow with M, and the hardware
# prefetchers alone left the memory idle while they ran: CaffeNet fc6 at batch 8 (4096 x 9216, evicted between
# calls) dots 6.9 -> 5.3 ms, combine 7.4 -> 6.3, rank_update 7.4 -> 6.1 (session 19; 128-256 floats ahead
# alike, 1024 and more, or into L2 / L3 only, less). A weight matrix that stays in cache (a few MB), or M = 1
# (bound by the memory stream alone), ran as fast or up to 1.25x slower with it: those run without.
PREFETCH_FLOATS = 256
PREFETCH_MIN_FLOATS = 4 << 20


cdef inline Py_ssize_t _prefetch(Py_ssize_t M, Py_ssize_t big) except -1:  # (reads the module settings)
    return PREFETCH_FLOATS if M >= 2 and big >= PREFETCH_MIN_FLOATS else 0


def _need(Py_ssize_t have, Py_ssize_t need, str what):
    if have < need:
        raise ValueError(f"skinny_gemm: {what} has {have} elements, needs {need}")


cdef inline Py_ssize_t _bound(Py_ssize_t total, Py_ssize_t align, int end) noexcept nogil:
    """Where this thread's share of range(total) starts (end 0) or ends (end 1), cut at multiples of align."""
    cdef Py_ssize_t nt = omp_get_num_threads(), t = omp_get_thread_num() + end
    cdef Py_ssize_t units = (total + align - 1) // align
    return min(total, (units * t // nt) * align)


cdef const float* _optional(const float[::1] bias, Py_ssize_t need) except? NULL:
    if bias is None:
        return NULL
    _need(bias.shape[0], need, "bias")
    return &bias[0] if need else NULL


def dots(const float[::1] a, const float[::1] B, float[::1] out, const float[::1] bias, Py_ssize_t M, Py_ssize_t N,
         Py_ssize_t K):
    """out (M, N) = a (M, K) @ B (N, K)^T (+ bias (N,) when given)."""
    _need(a.shape[0], M * K, "a"); _need(B.shape[0], N * K, "B"); _need(out.shape[0], M * N, "out")
    cdef const float* bp = _optional(bias, N)
    if M * N == 0:
        return
    cdef const float* ap = &a[0] if K else NULL
    cdef const float* Bp = &B[0] if K else NULL
    cdef float* op = &out[0]
    cdef Py_ssize_t lo = 0, hi = 0, pf = _prefetch(M, N * K)
    with nogil, parallel(num_threads=_threads(N * K)):
        lo = _bound(N, 4, 0)
        hi = _bound(N, 4, 1)
        if lo < hi:
            sg_dots(ap, Bp, op, bp, M, N, K, lo, hi, pf)


def combine(const float[::1] a, const float[::1] B, float[::1] out, const float[::1] bias, Py_ssize_t M, Py_ssize_t N,
            Py_ssize_t K):
    """out (M, K) = a (M, N) @ B (N, K) (+ bias (K,) when given)."""
    _need(a.shape[0], M * N, "a"); _need(B.shape[0], N * K, "B"); _need(out.shape[0], M * K, "out")
    cdef const float* bp = _optional(bias, K)
    if M * K == 0:
        return
    cdef float* op = &out[0]
    cdef Py_ssize_t i
    if N == 0:
        for i in range(M * K):
            op[i] = bp[i % K] if bp != NULL else 0
        return
    cdef const float* ap = &a[0]
    cdef const float* Bp = &B[0]
    cdef Py_ssize_t lo = 0, hi = 0, pf = _prefetch(M, N * K)
    with nogil, parallel(num_threads=_threads(N * K)):
        lo = _bound(K, 4 * _LANES, 0)
        hi = _bound(K, 4 * _LANES, 1)
        if lo < hi:
            sg_combine(ap, Bp, op, bp, M, N, K, lo, hi, pf)


def rank_update(const float[::1] a, const float[::1] b, float[::1] C, Py_ssize_t M, Py_ssize_t N,
                Py_ssize_t K):
    """C (N, K) += a (M, N)^T @ b (M, K)."""
    _need(a.shape[0], M * N, "a"); _need(b.shape[0], M * K, "b"); _need(C.shape[0], N * K, "C")
    if N * K == 0 or M == 0:
        return
    cdef const float* ap = &a[0]
    cdef const float* bp = &b[0]
    cdef float* cp = &C[0]
    cdef Py_ssize_t lo = 0, hi = 0, pf = _prefetch(M, N * K)
    with nogil, parallel(num_threads=_threads(N * K)):
        lo = _bound(N, 1, 0)
        hi = _bound(N, 1, 1)
        if lo < hi:
            sg_rank_update(ap, bp, cp, M, N, K, lo, hi, pf)

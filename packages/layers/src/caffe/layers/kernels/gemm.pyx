# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math
"""Packed single-precision GEMM with AVX-512F (conv_cpu's "1x1" plan: Y[co, P] = W[co, ci] @ X[ci, P]).

  C[m, n] = act( beta C[m, n] + sum_{k < K} A[m, k] B[k, n] + bias[m] )      m < M, n < N, beta 0 or 1

A, B: float32 with any element strides (A[m, k] at a[m rsa + k csa], B[k, n] at b[k rsb + n csb]: plain and
transposed layouts alike); C row-major with row stride ldc (columns contiguous); bias (M) or None; act the
codes of kernels.lowering's Act, after the bias, as its bias_act computes them: 0 none; 1 ReLU with negative
slope a: y > 0 ? y : (a == 0 ? 0 : y a); 2 clip to [a, b]. The activation and bias apply once, to the
finished sum (beta C + A B + bias).

How (BLIS's loops, rows and columns swapped because C is row-major here): A is packed once per call into
panels of GM_MR rows ([K block][row panel][k][MR], zero rows past M; all of it: the 1x1 layers' W is at most
a few MB and sits in the 32 MB L3); each OpenMP task (a range of at most GM_NC columns times a range of row
panels) packs its columns of B, one K block (GM_KC rows) at a time, into panels of GM_NR columns ([panel][k]
[NR], zero columns past N; GM_KC x GM_NC floats, 590 KB: the 1 MB L2), then for each row panel of A (MR x KC:
18 KB, stays in the 48 KB L1) runs the micro-kernel over the B panels. The micro-kernel holds an MR x NR tile
of C in MR x NR/16 = 24 zmm accumulators; per k it loads NR/16 vectors of B and broadcasts MR values of A,
feeding MR NR/16 independent FMAs (Zen 5: two 512-bit FMA pipes of latency 4 need at least 8 in flight).
Edges: the packed panels are zero-padded, so the inner loop is always full; the store masks the columns past
N and skips the rows past M. Each K block after the first adds into C (beta 1); the last one adds the bias and
applies the activation in the store.

Numerics: each C[m, n] is a float32 sum: per K block of GM_KC, the block's products in the order k = k0,
k0 + 1, ... (one FMA each, from +0), that partial sum added to C (to beta C for the first block), then the bias
(one float32 add each), so |C - exact| <= (K + 2) u (sum_k |A[m, k] B[k, n]| + beta |C| + |bias|),
u = 2^-24: the bound of a recursive float32 sum of K + 2 terms (a blocked sum's is smaller). NumPy's sgemm
(OpenBLAS) meets the same bound in its own order, so the two differ by at most twice it. The order does not
depend on the thread count or the task split (same bits).

A (row-major, or column-major: W^T) is read in place instead of packed when N spans at most
GM_DIRECT_MAX_PANELS panels of B (a 7 x 7 layer at batch 1: N = 49): each A panel then meets at most two B panels, and packing all of W cost as much as
reading it that often (0.69 ms instead of 0.75 for 2048->512 at 7 x 7, one thread).

On a CPU without AVX-512F (supported() False) or a compiler other than x86-64 GCC/Clang the module builds but
gemm raises; conv_cpu never calls it there. The thread count follows _threads.pxi (OpenBLAS's pool and this
one's OpenMP pool run one after the other, never nested).
"""
include "_threads.pxi"

cdef extern from *:
    """
    #include <string.h>
    #include <stddef.h>
    #include <stdlib.h>
    #if defined(__x86_64__) && defined(__GNUC__)
    #define GM_X86 1
    #include <immintrin.h>
    #define GM_TARGET __attribute__((target("avx512f,fma")))
    #else
    #define GM_X86 0
    #define GM_TARGET
    #endif

    #ifndef GM_MR
    #define GM_MR 8
    #endif
    #ifndef GM_NV
    #define GM_NV 3
    #endif
    #define GM_NR (16 * GM_NV)
    #ifndef GM_DIRECT_MAX_PANELS
    #define GM_DIRECT_MAX_PANELS 2
    #endif
    #ifndef GM_KC
    #define GM_KC 384
    #endif
    /* A read in place (DIRECT) is prefetched GM_PF_DIRECT floats ahead in each of its MR rows, a line every 16 k:
       there A is the weights of a layer with few output positions (a 7 x 7 layer at batch 1), read once, from
       memory, and the FMAs alone did not keep it coming (ResNet-50 res5's 3 x 3 at batch 1, 512 x 4608 x 49, with
       the caches evicted: 1.93 -> 1.55 ms; in cache 1.18 -> 1.05; 128 ahead alike, 256 less). Prefetching the
       packed A's rows the same way changed nothing. */
    #ifndef GM_PF_DIRECT
    #define GM_PF_DIRECT 64
    #endif
    /* (read from a variable: with the constant in the loop GCC laid the kernel out so that it ran 1.12-1.2x
       slower in cache, measured) */
    static volatile int gm_pf_direct = GM_PF_DIRECT;
    static int gm_set_pf_direct(int floats) { int old = gm_pf_direct; gm_pf_direct = floats; return old; }
    #ifndef GM_NC
    #define GM_NC (GM_NR * (384 / GM_NR))
    #endif

    static int gm_supported(void) {
    #if GM_X86
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
    #else
        return 0;
    #endif
    }

    typedef struct {
        ptrdiff_t M, N, K;
        const float* a; ptrdiff_t rsa, csa;
        const float* b; ptrdiff_t rsb, csb;
        float* c; ptrdiff_t ldc;
        const float* bias;
        int beta, act;
        float lo, hi;
    } gm_args;

    #if GM_X86
    /* dst[j * ds + i] = src[i * rs + j], i, j < 8: the AVX 8 x 8 transpose (the packing of row-major A and
       of transposed B; scalar loops measured ~4x slower, and packing all of W is a large part of a 7 x 7
       layer's GEMM at batch 1) */
    GM_TARGET static inline void gm_t8x8(const float* src, ptrdiff_t rs, float* dst, ptrdiff_t ds) {
        __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + rs),
               r2 = _mm256_loadu_ps(src + 2 * rs), r3 = _mm256_loadu_ps(src + 3 * rs),
               r4 = _mm256_loadu_ps(src + 4 * rs), r5 = _mm256_loadu_ps(src + 5 * rs),
               r6 = _mm256_loadu_ps(src + 6 * rs), r7 = _mm256_loadu_ps(src + 7 * rs);
        __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1),
               t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3),
               t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
               t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
        __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
               u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
               u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
               u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
        _mm256_storeu_ps(dst + 0 * ds, _mm256_permute2f128_ps(u0, u4, 0x20));
        _mm256_storeu_ps(dst + 1 * ds, _mm256_permute2f128_ps(u1, u5, 0x20));
        _mm256_storeu_ps(dst + 2 * ds, _mm256_permute2f128_ps(u2, u6, 0x20));
        _mm256_storeu_ps(dst + 3 * ds, _mm256_permute2f128_ps(u3, u7, 0x20));
        _mm256_storeu_ps(dst + 4 * ds, _mm256_permute2f128_ps(u0, u4, 0x31));
        _mm256_storeu_ps(dst + 5 * ds, _mm256_permute2f128_ps(u1, u5, 0x31));
        _mm256_storeu_ps(dst + 6 * ds, _mm256_permute2f128_ps(u2, u6, 0x31));
        _mm256_storeu_ps(dst + 7 * ds, _mm256_permute2f128_ps(u3, u7, 0x31));
    }

    /* rows [r0, r0 + MR) x k [k0, k0 + kc) of A into one panel [k][MR] (zero rows past M): row-major A by
       8 x 8 transposes, column-major A (W^T, the bottom diff's) by runs of MR, any other layout by scalars */
    GM_TARGET static void gm_pack_a(const gm_args* g, ptrdiff_t r0, ptrdiff_t k0, ptrdiff_t kc, float* p) {
        ptrdiff_t i, k, i8, mr = g->M - r0 < GM_MR ? g->M - r0 : GM_MR;
        if (mr == GM_MR && GM_MR % 8 == 0 && (g->csa == 1 || g->rsa == 1)) {
            if (g->rsa == 1) {
                for (k = 0; k < kc; k++)
                    memcpy(p + k * GM_MR, g->a + r0 + (k0 + k) * g->csa, GM_MR * sizeof(float));
                return;
            }
            for (i8 = 0; i8 < GM_MR; i8 += 8) {
                const float* src = g->a + (r0 + i8) * g->rsa + k0;
                for (k = 0; k + 8 <= kc; k += 8)
                    gm_t8x8(src + k, g->rsa, p + k * GM_MR + i8, GM_MR);
                for (; k < kc; k++)
                    for (i = 0; i < 8; i++) p[k * GM_MR + i8 + i] = src[i * g->rsa + k];
            }
            return;
        }
        if (mr < GM_MR)
            memset(p, 0, (size_t)(kc * GM_MR) * sizeof(float));
        for (i = 0; i < mr; i++) {
            const float* src = g->a + (r0 + i) * g->rsa + k0 * g->csa;
            for (k = 0; k < kc; k++) p[k * GM_MR + i] = src[k * g->csa];
        }
    }

    /* k [k0, k0 + kc) x columns [n0, n1) of B into panels [panel][k][NR] (zero columns past n1): row-major
       B by masked vector copies, transposed B (X^T, the weight diff's) by 8 x 8 transposes */
    GM_TARGET static void gm_pack_b(const gm_args* g, ptrdiff_t k0, ptrdiff_t kc, ptrdiff_t n0, ptrdiff_t n1,
                                    float* p) {
        ptrdiff_t j0, k, v, j, j8;
        for (j0 = n0; j0 < n1; j0 += GM_NR, p += kc * GM_NR) {
            ptrdiff_t nr = n1 - j0 < GM_NR ? n1 - j0 : GM_NR;
            if (g->csb == 1) {
                for (k = 0; k < kc; k++) {
                    const float* src = g->b + (k0 + k) * g->rsb + j0;
                    for (v = 0; v < GM_NV; v++) {
                        ptrdiff_t left = nr - 16 * v;
                        __mmask16 m = left >= 16 ? (__mmask16)0xFFFF
                                                 : (left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1));
                        _mm512_store_ps(p + k * GM_NR + 16 * v, _mm512_maskz_loadu_ps(m, src + 16 * v));
                    }
                }
                continue;
            }
            if (nr < GM_NR)
                memset(p, 0, (size_t)(kc * GM_NR) * sizeof(float));
            j8 = 0;
            if (g->rsb == 1) {
                for (; j8 + 8 <= nr; j8 += 8) {
                    const float* src = g->b + k0 + (j0 + j8) * g->csb;
                    for (k = 0; k + 8 <= kc; k += 8)
                        gm_t8x8(src + k, g->csb, p + k * GM_NR + j8, GM_NR);
                    for (; k < kc; k++)
                        for (j = 0; j < 8; j++) p[k * GM_NR + j8 + j] = src[j * g->csb + k];
                }
            }
            for (j = j8; j < nr; j++) {
                const float* src = g->b + k0 * g->rsb + (j0 + j) * g->csb;
                for (k = 0; k < kc; k++) p[k * GM_NR + j] = src[k * g->rsb];
            }
        }
    }

    /* The micro-kernels: the MR x NR tile C[r0.., j0..] (mr rows, nr columns valid) from kc steps of an A
       panel and a packed B panel, in KV of the NR / 16 vectors (KV = ceil(nr / 16): a narrow last panel
       skips its zero columns); add: C's old values are added (beta 1, or a K block after the first); last:
       + bias, then the activation. DIRECT 0 reads MR consecutive values of A per k, lda apart (a packed panel
       [k][MR]: lda = MR; a full panel of column-major A in place: lda = its column stride); DIRECT 1 reads
       row-major A in place, rows lda apart (rows past mr repeat row mr - 1: computed, never stored). */
    #define GM_UNROLL _Pragma("GCC unroll 32")
    #define GM_KERNEL(NAME, KV, DIRECT)                                                                     \
    GM_TARGET static void NAME(ptrdiff_t kc, const float* restrict pa, ptrdiff_t lda,                       \
                               const float* restrict pb, float* c, ptrdiff_t ldc, ptrdiff_t mr,             \
                               ptrdiff_t nr, int add, int last, const float* bias, int act, float lo,       \
                               float hi) {                                                                  \
        __m512 acc[GM_MR][KV];                                                                              \
        const ptrdiff_t pf = DIRECT ? gm_pf_direct : 0;                                                     \
        const float* ar[GM_MR];                                                                             \
        __mmask16 mask[KV];                                                                                 \
        ptrdiff_t i, v, k;                                                                                  \
        GM_UNROLL for (i = 0; i < GM_MR; i++) {                                                             \
            ar[i] = pa + (i < mr ? i : mr - 1) * lda;                                                       \
            GM_UNROLL for (v = 0; v < KV; v++) acc[i][v] = _mm512_setzero_ps();                             \
        }                                                                                                   \
        for (k = 0; k < kc; k++) {                                                                          \
            __m512 bv[KV];                                                                                  \
            if (DIRECT && pf && (k & 15) == 0)                                                              \
                GM_UNROLL for (i = 0; i < GM_MR; i++) __builtin_prefetch(ar[i] + k + pf, 0, 3);             \
            GM_UNROLL for (v = 0; v < KV; v++) bv[v] = _mm512_load_ps(pb + 16 * v);                         \
            GM_UNROLL for (i = 0; i < GM_MR; i++) {                                                         \
                __m512 av = _mm512_set1_ps(DIRECT ? ar[i][k] : pa[i]);                                      \
                GM_UNROLL for (v = 0; v < KV; v++) acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);       \
            }                                                                                               \
            if (!DIRECT) pa += lda;                                                                         \
            pb += GM_NR;                                                                                    \
        }                                                                                                   \
        GM_UNROLL for (v = 0; v < KV; v++) {                                                                \
            ptrdiff_t left = nr - 16 * v;                                                                   \
            mask[v] = left >= 16 ? (__mmask16)0xFFFF                                                        \
                                 : (left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1));              \
        }                                                                                                   \
        const __m512 zero = _mm512_setzero_ps(), vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);        \
        GM_UNROLL for (i = 0; i < GM_MR; i++) {                                                             \
            if (i >= mr) break;                                                                             \
            float* row = c + i * ldc;                                                                       \
            GM_UNROLL for (v = 0; v < KV; v++) {                                                            \
                __m512 y = acc[i][v];                                                                       \
                if (add) y = _mm512_add_ps(_mm512_maskz_loadu_ps(mask[v], row + 16 * v), y);                \
                if (last) {                                                                                 \
                    if (bias) y = _mm512_add_ps(y, _mm512_set1_ps(bias[i]));                                \
                    if (act == 1) { /* y > 0 ? y : (lo == 0 ? 0 : y lo); NaN stays NaN */                   \
                        if (lo == 0.0f)                                                                     \
                            y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(y, zero, _CMP_LE_OQ), y, zero);     \
                        else                                                                                \
                            y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(y, zero, _CMP_GT_OQ),               \
                                                     _mm512_mul_ps(y, vlo), y);                             \
                    } else if (act == 2) { /* y < lo ? lo : (y > hi ? hi : y); NaN stays NaN */             \
                        y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(y, vlo, _CMP_LT_OQ), y, vlo);           \
                        y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(y, vhi, _CMP_GT_OQ), y, vhi);           \
                    }                                                                                       \
                }                                                                                           \
                _mm512_mask_storeu_ps(row + 16 * v, mask[v], y);                                            \
            }                                                                                               \
        }                                                                                                   \
    }

    GM_KERNEL(gm_kernel1, 1, 0)
    GM_KERNEL(gm_kernel1d, 1, 1)
    #if GM_NV >= 2
    GM_KERNEL(gm_kernel2, 2, 0)
    GM_KERNEL(gm_kernel2d, 2, 1)
    #endif
    #if GM_NV >= 3
    GM_KERNEL(gm_kernel3, 3, 0)
    GM_KERNEL(gm_kernel3d, 3, 1)
    #endif
    #if GM_NV >= 4
    GM_KERNEL(gm_kernel4, 4, 0)
    GM_KERNEL(gm_kernel4d, 4, 1)
    #endif

    GM_TARGET static void gm_kernel(ptrdiff_t kc, const float* pa, ptrdiff_t lda, int direct, const float* pb,
                                    float* c, ptrdiff_t ldc, ptrdiff_t mr, ptrdiff_t nr, int add, int last,
                                    const float* bias, int act, float lo, float hi) {
        switch ((nr + 15) / 16 * 2 + (direct != 0)) {
    #if GM_NV >= 4
        case 8: gm_kernel4(kc, pa, lda, pb, c, ldc, mr, nr, add, last, bias, act, lo, hi); break;
        case 9: gm_kernel4d(kc, pa, lda, pb, c, ldc, mr, nr, add, last, bias, act, lo, hi); break;
    #endif
    #if GM_NV >= 3
        case 6: gm_kernel3(kc, pa, lda, pb, c, ldc, mr, nr, add, last, bias, act, lo, hi); break;
        case 7: gm_kernel3d(kc, pa, lda, pb, c, ldc, mr, nr, add, last, bias, act, lo, hi); break;
    #endif
    #if GM_NV >= 2
        case 4: gm_kernel2(kc, pa, lda, pb, c, ldc, mr, nr, add, last, bias, act, lo, hi); break;
        case 5: gm_kernel2d(kc, pa, lda, pb, c, ldc, mr, nr, add, last, bias, act, lo, hi); break;
    #endif
        case 3: gm_kernel1d(kc, pa, lda, pb, c, ldc, mr, nr, add, last, bias, act, lo, hi); break;
        default: gm_kernel1(kc, pa, lda, pb, c, ldc, mr, nr, add, last, bias, act, lo, hi); break;
        }
    }

    /* One task: columns [n0, n1) (at most GM_NC) x row panels [q0, q1), every K block. */
    GM_TARGET static void gm_task(const gm_args* g, const float* pa, float* pb, ptrdiff_t n0, ptrdiff_t n1,
                                  ptrdiff_t q0, ptrdiff_t q1, ptrdiff_t Mp, int direct) {
        ptrdiff_t k0, q, j0;
        float tail[GM_MR * GM_KC] __attribute__((aligned(64)));
        for (k0 = 0; k0 < g->K; k0 += GM_KC) {
            ptrdiff_t kc = g->K - k0 < GM_KC ? g->K - k0 : GM_KC;
            int add = g->beta || k0 > 0, last = k0 + kc >= g->K;
            gm_pack_b(g, k0, kc, n0, n1, pb);
            for (q = q0; q < q1; q++) {
                ptrdiff_t r0 = q * GM_MR, mr = g->M - r0 < GM_MR ? g->M - r0 : GM_MR;
                const float* bias = g->bias ? g->bias + r0 : NULL;
                const float* bp = pb;
                const float* panel;
                ptrdiff_t lda;
                int row_major = 0;
                if (direct == 1) {  /* row-major A in place */
                    panel = g->a + r0 * g->rsa + k0; lda = g->rsa; row_major = 1;
                } else if (direct == 2 && mr == GM_MR) {  /* a full panel of column-major A in place */
                    panel = g->a + r0 + k0 * g->csa; lda = g->csa;
                } else if (direct == 2) {  /* the last rows (reading MR past them could leave the array) */
                    gm_pack_a(g, r0, k0, kc, tail);
                    panel = tail; lda = GM_MR;
                } else {
                    panel = pa + k0 * Mp + q * GM_MR * kc; lda = GM_MR;
                }
                for (j0 = n0; j0 < n1; j0 += GM_NR, bp += kc * GM_NR)
                    gm_kernel(kc, panel, lda, row_major, bp, g->c + r0 * g->ldc + j0, g->ldc, mr,
                              n1 - j0 < GM_NR ? n1 - j0 : GM_NR, add, last, bias, g->act, g->lo, g->hi);
            }
        }
    }
    #endif

    /* 0 done; -1 no AVX-512 build / CPU; -2 out of memory; -3 K < 1 */
    static int gm_gemm(const gm_args* g, int nt) {
    #if GM_X86
        ptrdiff_t M = g->M, N = g->N, K = g->K;
        ptrdiff_t nq = (M + GM_MR - 1) / GM_MR, Mp = nq * GM_MR, nkb = (K + GM_KC - 1) / GM_KC;
        /* column blocks of whole NR panels, as equal as the panels allow, a multiple of the thread count (a
           9-block N = 3136 on two threads left one thread a block idle: 10% of the time) */
        ptrdiff_t npn = (N + GM_NR - 1) / GM_NR, ncb = (npn + GM_NC / GM_NR - 1) / (GM_NC / GM_NR), parts, items;
        float* pa;
        int fail = 0, direct;
        if (!gm_supported()) return -1;
        if (M <= 0 || N <= 0) return 0;
        if (K <= 0) return -3;  /* (gemm refuses K = 0) */
        /* A read in place, not packed, when each of its panels meets few B panels (packing all of W costs
           as much as reading it a few times: most of a 7 x 7 layer's time at batch 1 beside the FMAs):
           1 row-major A (W), 2 column-major A (W^T, the bottom diff's) */
        direct = npn > GM_DIRECT_MAX_PANELS ? 0 : (g->csa == 1 ? 1 : (g->rsa == 1 ? 2 : 0));
        pa = direct ? NULL : (float*)aligned_alloc(64, ((size_t)(Mp * K) * sizeof(float) + 63) & ~(size_t)63);
        if (!direct && !pa) return -2;
        /* split the rows too when there are too few column blocks to keep every thread busy */
        if (nt > 1 && ncb % nt && ncb + nt - ncb % nt <= npn) ncb += nt - ncb % nt;
        parts = ncb >= 2 * nt ? 1 : (2 * nt + ncb - 1) / ncb;
        if (parts > nq) parts = nq;
        items = ncb * parts;
        if (nt > items) nt = (int)items;
        #pragma omp parallel num_threads(nt)
        {
            ptrdiff_t t, n0, q0, q1;
            float* pb = (float*)aligned_alloc(64, (size_t)(GM_KC * GM_NC) * sizeof(float));
            #pragma omp for schedule(static)
            for (t = 0; t < (direct ? 0 : nkb * nq); t++) {
                ptrdiff_t kb = t / nq, q = t % nq, k0 = kb * GM_KC;
                ptrdiff_t kc = K - k0 < GM_KC ? K - k0 : GM_KC;
                gm_pack_a(g, q * GM_MR, k0, kc, pa + k0 * Mp + q * GM_MR * kc);
            }
            /* every thread meets the worksharing loop (a thread without its buffer takes no tasks) */
            #pragma omp for schedule(dynamic, 1)
            for (t = 0; t < items; t++) {
                ptrdiff_t cb = t / parts, part = t % parts;
                ptrdiff_t n1 = npn * (cb + 1) / ncb * GM_NR;
                if (!pb) {
                    #pragma omp atomic write
                    fail = 1;
                    continue;
                }
                n0 = npn * cb / ncb * GM_NR;
                q0 = nq * part / parts; q1 = nq * (part + 1) / parts;
                gm_task(g, pa, pb, n0, n1 < N ? n1 : N, q0, q1, Mp, direct);
            }
            free(pb);
        }
        free(pa);
        return fail ? -2 : 0;
    #else
        (void)g; (void)nt;
        return -1;
    #endif
    }
    """
    ctypedef struct gm_args:
        Py_ssize_t M, N, K
        const float* a
        Py_ssize_t rsa, csa
        const float* b
        Py_ssize_t rsb, csb
        float* c
        Py_ssize_t ldc
        const float* bias
        int beta, act
        float lo, hi
    int gm_supported() nogil
    int gm_set_pf_direct(int floats) nogil
    int gm_gemm(const gm_args* g, int nt) nogil
    int GM_MR, GM_NR, GM_KC, GM_NC


def supported() -> bool:
    """Whether the kernel runs here: an x86-64 GCC/Clang build and a CPU (and OS) with AVX-512F and FMA."""
    return bool(gm_supported())


def set_direct_prefetch(int floats) -> int:
    """How far ahead (floats; 0: none) A read in place is prefetched (GM_PF_DIRECT; for tests and benchmarks);
    returns the previous distance."""
    if floats < 0:
        raise ValueError("set_direct_prefetch: a distance in floats, 0 or more")
    return gm_set_pf_direct(floats)


# The micro-kernel's tile and the cache blocks (benchmarks print them).
TILE = (GM_MR, GM_NR)
BLOCKS = (GM_KC, GM_NC)


def gemm(const float[:, :] a, const float[:, :] b, float[:, :] c, const float[::1] bias=None, int beta=0,
         int act=0, double lo=0, double hi=0, int threads=0):
    """c = act(beta c + a @ b + bias[:, None]) in place (module doc). a (M, K) and b (K, N) any strided float32
    views (a transposed array's view too; strides in whole floats); c (M, N) with contiguous rows, not overlapping
    a or b; threads 0:
    _threads.pxi's count."""
    cdef gm_args g
    cdef int nt, rc
    cdef Py_ssize_t f = sizeof(float)  # (signed: a reversed view's strides are negative)
    if beta not in (0, 1):
        raise ValueError("gemm: beta must be 0 or 1")
    if act not in (0, 1, 2):
        raise ValueError("gemm: unknown activation")
    g.M, g.K = a.shape[0], a.shape[1]
    g.N = b.shape[1]
    if b.shape[0] != g.K or c.shape[0] != g.M or c.shape[1] != g.N:
        raise ValueError("gemm: shapes do not match")
    if bias is not None and bias.shape[0] < g.M:
        raise ValueError("gemm: bias too short")
    if g.M == 0 or g.N == 0:
        return
    if g.N > 1 and c.strides[1] != f:
        raise ValueError("gemm: c's rows must be contiguous")
    if g.K == 0:
        raise ValueError("gemm: K must be positive")
    # the kernel steps in whole floats (stride // 4): a view stepping 5 bytes (a float field of a packed
    # record array) would be read, or written, at the wrong elements; a length-1 axis's stride is never used
    if ((g.M > 1 and (a.strides[0] % f or c.strides[0] % f)) or (g.K > 1 and (a.strides[1] % f or b.strides[0] % f))
            or (g.N > 1 and b.strides[1] % f)):
        raise ValueError("gemm: strides must be whole floats")
    if not gm_supported():
        raise RuntimeError("gemm: this CPU has no AVX-512F (supported() is False)")
    g.a = &a[0, 0]
    g.rsa, g.csa = a.strides[0] // f, a.strides[1] // f
    g.b = &b[0, 0]
    g.rsb, g.csb = b.strides[0] // f, b.strides[1] // f
    g.c = &c[0, 0]
    g.ldc = c.strides[0] // f
    g.bias = &bias[0] if bias is not None else NULL
    g.beta, g.act, g.lo, g.hi = beta, act, <float>lo, <float>hi
    nt = threads if threads > 0 else _threads(g.M * g.N * g.K // 64)
    with nogil:
        rc = gm_gemm(&g, nt)
    if rc == -2:
        raise MemoryError("gemm: packing buffers")
    if rc != 0:
        raise RuntimeError(f"gemm: failed ({rc})")

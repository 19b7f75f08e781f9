# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math
"""The exact short-K forward product of a float32 convolution, from float32 data, in float64 (AVX2 + FMA).

For each image i < nb, group g < G, output channel m < og and column j < ncols:

  out[i, g og + m, j] = act( float32( sum_{k < kd} w[g og + m, k] col[i, g kd + k, j]  +  bias[g og + m] ) )

with the sum and the bias added in float64 and rounded once to float32. Why: Caffe's float32 forward of a
layer with short dot products (conv_base.EXACT_FORWARD_MAX_K: LeNet conv1, K = 25) is followed closely by
the LeNet fidelity trace only when those sums carry no float32 rounding of their own. A product of two
float32 values is exact in float64, so every step of the sum here rounds only at the 2^-53 level and the
result is the correctly rounded float32 of the exact value except within a few float64 ulps of a float32
rounding tie. The plain NumPy reference (what the float64-GEMM path computed before this kernel, and still
does where supported() is False):

  acc = w64 @ col.astype(np.float64)            # per group: w64 = w.astype(float64), (og, kd) @ (kd, ncols)
  acc += bias.astype(np.float64)[:, None]       # when a bias is given
  out = act(acc.astype(np.float32))

act (after the rounding, in float32, as the separate layers compute it: kernels.lowering's ACT_* codes):
0 none; 1 ReLU with negative slope a: y > 0 ? y : (a == 0 ? 0 : y * a); 2 clip to [a, b]: y < a ? a :
(y > b ? b : y).

Layouts (element offsets; every stride in elements, non-negative):
  col[i, r, j] at col[r * col_ld + i * col_img + j]   r = g kd + k  (a lowered block (rows, nb Pb): col_ld =
                                                       nb Pb, col_img = Pb; a 1x1 layer's blob (N, C, P)
                                                       read in place: col_ld = P, col_img = C P)
  out[i, o, j] at out[out_off + i * out_img + o * out_ld + j]   (conv_cpu's out[n, o, p0 + p]: out_ld = P,
                                                       out_img = Co P, out_off = p0)
  w (G og, kd) row-major float32; bias (G og) float32 or None.

How: the filters are widened to float64 once per call, packed in blocks of 4 output channels ([g][block][k][4],
zero rows past og). Each OpenMP task (image, group, range of NC columns) runs a 4 x 12 register tile (12
accumulators of 4 doubles) for every channel block over the range's 12-column tiles: per k, 3 loads of 4
float32 columns widened to float64 as they are loaded, 4 broadcasts, 12 FMAs. The column block is read in
place (copying it into a float64 panel first measured up to 30% slower); a range's last partial tile goes
through a zero-padded float64 panel. Where the CPU has AVX-512F (AVX512), a 4 x 24 tile (12 accumulators of 8
doubles) takes each task's first columns, 24 at a time, with the same sums. Each tile is stored rounded (plus the bias and the activation)
straight into out. The sum's order is k = 0, 1, ... from +0, then + bias: the products are exact, so FMA
and a separate multiply and add give the same bits, and the scalar path (a CPU without AVX2/FMA, or
simd=False) sums in the same order with the same results.

dots_nt (below) is the same family's other product: the weight gradient of such a layer, dW += dout (C_out x K)
@ col (kd x K)^T, whose K (every output position of the batch) is long while C_out x kd is small: its sums in
float64 as 8 partial sums (k mod 8, each in increasing k from +0) added in order, rounded once (conv_cpu's
EXACT_WGRAD). The products are exact, so the AVX-512 4 x 4 tile, the AVX2 2 x 2 tile and the scalar loop
agree bit for bit.
"""
from cython.parallel cimport parallel, prange
from libc.stdlib cimport malloc, free
include "_threads.pxi"

cdef extern from *:
    """
    #include <string.h>
    #include <stddef.h>
    #if defined(__x86_64__) && defined(__GNUC__)
    #define EG_X86 1
    #include <immintrin.h>
    #define EG_TARGET __attribute__((target("avx2,fma")))
    #else
    #define EG_X86 0
    #define EG_TARGET
    #endif

    #define EG_MR 4
    #define EG_NR 12

    static int eg_supported(void) {
    #if EG_X86
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    #else
        return 0;
    #endif
    }

    typedef struct {
        const float* w; const float* bias; const float* col; float* out;
        ptrdiff_t G, og, kd, nb, ncols, col_ld, col_img, out_ld, out_img, out_off;
        ptrdiff_t nmb, nc, nchunks;   /* channel blocks per group; columns per task; tasks per (image, group) */
        int act, simd; float a, b;
        double* wp;                   /* packed filters [G][nmb][kd][4] */
        double* bp;                   /* packed bias [G][nmb][4] (zeros without one) */
    } eg_args;

    static void eg_pack_weights(eg_args* e) {
        ptrdiff_t g, m, k, og = e->og, kd = e->kd;
        memset(e->wp, 0, (size_t)(e->G * e->nmb * EG_MR * kd) * sizeof(double));
        memset(e->bp, 0, (size_t)(e->G * e->nmb * EG_MR) * sizeof(double));
        for (g = 0; g < e->G; g++)
            for (m = 0; m < og; m++) {
                double* blk = e->wp + (g * e->nmb + m / EG_MR) * kd * EG_MR + m % EG_MR;
                const float* row = e->w + (g * og + m) * kd;
                for (k = 0; k < kd; k++)
                    blk[k * EG_MR] = (double)row[k];
                if (e->bias)
                    e->bp[(g * e->nmb + m / EG_MR) * EG_MR + m % EG_MR] = (double)e->bias[g * og + m];
            }
    }

    static inline float eg_act1(float y, int act, float a, float b) {
        if (act == 1) {  /* the ReLU layer's kernel: NaN stays NaN */
            if (a == 0) return y <= 0 ? 0.0f : y;
            return y > 0 ? y : y * a;
        }
        if (act == 2) {
            if (y < a) return a;
            if (y > b) return b;
        }
        return y;
    }

    /* the scalar path: panel widening and tile as the vector code does them, same order of sums */
    static void eg_panel_scalar(const float* col, ptrdiff_t ld, ptrdiff_t kd, ptrdiff_t n, double* panel) {
        ptrdiff_t t, k, j, nt = (n + EG_NR - 1) / EG_NR;
        for (t = 0; t < nt; t++)
            for (k = 0; k < kd; k++) {
                double* dst = panel + (t * kd + k) * EG_NR;
                for (j = 0; j < EG_NR; j++)
                    dst[j] = t * EG_NR + j < n ? (double)col[k * ld + t * EG_NR + j] : 0.0;
            }
    }

    static void eg_tile_scalar(const double* wb, const double* pt, ptrdiff_t kd, const double* bias,
                               int has_bias, float* out, ptrdiff_t ld, int mr, int nr, int act, float a,
                               float b) {
        int r, j;
        ptrdiff_t k;
        for (r = 0; r < mr; r++)
            for (j = 0; j < nr; j++) {
                double s = 0.0;
                for (k = 0; k < kd; k++)
                    s += wb[k * EG_MR + r] * pt[k * EG_NR + j];
                if (has_bias)
                    s += bias[r];
                out[r * ld + j] = eg_act1((float)s, act, a, b);
            }
    }

    #if EG_X86
    static inline __attribute__((always_inline)) EG_TARGET __m128 eg_act4(__m128 y, int act, __m128 va,
                                                                           __m128 vb, int a_zero) {
        if (act == 1) {
            if (a_zero)  /* y <= 0 -> 0; NaN stays NaN */
                return _mm_blendv_ps(y, _mm_setzero_ps(), _mm_cmp_ps(y, _mm_setzero_ps(), _CMP_LE_OQ));
            return _mm_blendv_ps(_mm_mul_ps(y, va), y, _mm_cmp_ps(y, _mm_setzero_ps(), _CMP_GT_OQ));
        }
        if (act == 2) {  /* y > b -> b, then y < a -> a (a wins, as the scalar order has it); NaN stays */
            __m128 r = _mm_blendv_ps(y, vb, _mm_cmp_ps(y, vb, _CMP_GT_OQ));
            return _mm_blendv_ps(r, va, _mm_cmp_ps(y, va, _CMP_LT_OQ));
        }
        return y;
    }

    /* rows r < mr, columns j < nr of the 4 x 12 tile: + bias, rounded, act, stored */
    static inline __attribute__((always_inline)) EG_TARGET void eg_store_row(
            __m256d c0, __m256d c1, __m256d c2, double bias, int has_bias, float* out, int nr, int act,
            __m128 va, __m128 vb, int a_zero) {
        __m128 y0, y1, y2;
        if (has_bias) {
            __m256d vb64 = _mm256_set1_pd(bias);
            c0 = _mm256_add_pd(c0, vb64); c1 = _mm256_add_pd(c1, vb64); c2 = _mm256_add_pd(c2, vb64);
        }
        y0 = eg_act4(_mm256_cvtpd_ps(c0), act, va, vb, a_zero);
        y1 = eg_act4(_mm256_cvtpd_ps(c1), act, va, vb, a_zero);
        y2 = eg_act4(_mm256_cvtpd_ps(c2), act, va, vb, a_zero);
        if (nr == EG_NR) {
            _mm_storeu_ps(out, y0); _mm_storeu_ps(out + 4, y1); _mm_storeu_ps(out + 8, y2);
        } else {
            float tmp[EG_NR];
            _mm_storeu_ps(tmp, y0); _mm_storeu_ps(tmp + 4, y1); _mm_storeu_ps(tmp + 8, y2);
            memcpy(out, tmp, (size_t)nr * sizeof(float));
        }
    }

    /* The 4 x 12 tile's state, its step (row k of the filters' 4 channels times 12 widened columns x0..x2)
       and its store (rows ld floats apart, nr columns), shared by the two tile functions below, which
       differ only in where the columns come from. */
    #define EG_TILE_STATE \
        __m256d c00 = _mm256_setzero_pd(), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00; \
        __m256d c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00; \
        __m128 va = _mm_set1_ps(a), vb = _mm_set1_ps(b); \
        int a_zero = a == 0;
    /* (the step for a vector type: W, BCAST (a double at a pointer into all lanes), FMA; the AVX-512 tile's too) */
    #define EG_FMA_4X3_T(W, BCAST, FMA, wb, x0, x1, x2) { \
        W w = BCAST(wb); \
        c00 = FMA(w, x0, c00); c01 = FMA(w, x1, c01); c02 = FMA(w, x2, c02); \
        w = BCAST((wb) + 1); \
        c10 = FMA(w, x0, c10); c11 = FMA(w, x1, c11); c12 = FMA(w, x2, c12); \
        w = BCAST((wb) + 2); \
        c20 = FMA(w, x0, c20); c21 = FMA(w, x1, c21); c22 = FMA(w, x2, c22); \
        w = BCAST((wb) + 3); \
        c30 = FMA(w, x0, c30); c31 = FMA(w, x1, c31); c32 = FMA(w, x2, c32); }
    #define EG_FMA_4X3(wb, x0, x1, x2) EG_FMA_4X3_T(__m256d, _mm256_broadcast_sd, _mm256_fmadd_pd, wb, x0, x1, x2)
    #define EG_STORE_4(ld, nr) \
        eg_store_row(c00, c01, c02, bias[0], has_bias, out, nr, act, va, vb, a_zero); \
        if (mr > 1) eg_store_row(c10, c11, c12, bias[1], has_bias, out + (ld), nr, act, va, vb, a_zero); \
        if (mr > 2) eg_store_row(c20, c21, c22, bias[2], has_bias, out + 2 * (ld), nr, act, va, vb, a_zero); \
        if (mr > 3) eg_store_row(c30, c31, c32, bias[3], has_bias, out + 3 * (ld), nr, act, va, vb, a_zero);

    static EG_TARGET void eg_tile_avx2(const double* wb, const double* pt, ptrdiff_t kd, const double* bias,
                                       int has_bias, float* out, ptrdiff_t ld, int mr, int nr, int act,
                                       float a, float b) {
        EG_TILE_STATE
        ptrdiff_t k;
        for (k = 0; k < kd; k++, wb += EG_MR, pt += EG_NR) {
            __m256d x0 = _mm256_loadu_pd(pt), x1 = _mm256_loadu_pd(pt + 4), x2 = _mm256_loadu_pd(pt + 8);
            EG_FMA_4X3(wb, x0, x1, x2)
        }
        EG_STORE_4(ld, nr)
    }

    /* the same tile reading the float32 columns in place (row stride ld), widened as they are loaded */
    static EG_TARGET void eg_tile_avx2_f32(const double* wb, const float* col, ptrdiff_t ld, ptrdiff_t kd,
                                           const double* bias, int has_bias, float* out, ptrdiff_t old, int mr,
                                           int act, float a, float b) {
        EG_TILE_STATE
        ptrdiff_t k;
        for (k = 0; k < kd; k++, wb += EG_MR, col += ld) {
            __m256d x0 = _mm256_cvtps_pd(_mm_loadu_ps(col)), x1 = _mm256_cvtps_pd(_mm_loadu_ps(col + 4));
            __m256d x2 = _mm256_cvtps_pd(_mm_loadu_ps(col + 8));
            EG_FMA_4X3(wb, x0, x1, x2)
        }
        EG_STORE_4(old, EG_NR)
    }

    /* The AVX-512 tile: 4 channels x 24 columns (12 accumulators of 8 doubles), the same sums per output as
       the 4 x 12 tile (k = 0, 1, ... from +0, then + bias, one rounding, the act): the same bits, twice the
       columns per FMA and per step's loads, broadcasts and loop overhead. Where the CPU has AVX-512F. */
    #define EG_TARGET512 __attribute__((target("avx512f,avx2,fma")))
    #define EG_NR512 24
    static int eg_avx512_supported(void) {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    /* 8 rounded sums: eg_act4 on each half (the activation's rules in one place; once a tile row, not a step) */
    static inline __attribute__((always_inline)) EG_TARGET512 void eg_store8(float* out, __m512d c, int act,
                                                                            __m128 va, __m128 vb, int a_zero) {
        __m256 y = _mm512_cvtpd_ps(c);
        _mm_storeu_ps(out, eg_act4(_mm256_castps256_ps128(y), act, va, vb, a_zero));
        _mm_storeu_ps(out + 4, eg_act4(_mm256_extractf128_ps(y, 1), act, va, vb, a_zero));
    }
    static inline __attribute__((always_inline)) EG_TARGET512 void eg_store_row512(
            __m512d c0, __m512d c1, __m512d c2, double bias, int has_bias, float* out, int act, __m128 va,
            __m128 vb, int a_zero) {
        if (has_bias) {
            __m512d vb64 = _mm512_set1_pd(bias);
            c0 = _mm512_add_pd(c0, vb64); c1 = _mm512_add_pd(c1, vb64); c2 = _mm512_add_pd(c2, vb64);
        }
        eg_store8(out, c0, act, va, vb, a_zero);
        eg_store8(out + 8, c1, act, va, vb, a_zero);
        eg_store8(out + 16, c2, act, va, vb, a_zero);
    }
    #define EG_BCAST512(p) _mm512_set1_pd(*(p))
    static EG_TARGET512 void eg_tile_512_f32(const double* wb, const float* col, ptrdiff_t ld, ptrdiff_t kd,
                                             const double* bias, int has_bias, float* out, ptrdiff_t old, int mr,
                                             int act, float a, float b) {
        __m512d c00 = _mm512_setzero_pd(), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00;
        __m512d c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00;
        __m128 va = _mm_set1_ps(a), vb = _mm_set1_ps(b);
        int a_zero = a == 0;
        ptrdiff_t k;
        for (k = 0; k < kd; k++, wb += EG_MR, col += ld) {
            __m512d x0 = _mm512_cvtps_pd(_mm256_loadu_ps(col)), x1 = _mm512_cvtps_pd(_mm256_loadu_ps(col + 8));
            __m512d x2 = _mm512_cvtps_pd(_mm256_loadu_ps(col + 16));
            EG_FMA_4X3_T(__m512d, EG_BCAST512, _mm512_fmadd_pd, wb, x0, x1, x2)
        }
        eg_store_row512(c00, c01, c02, bias[0], has_bias, out, act, va, vb, a_zero);
        if (mr > 1) eg_store_row512(c10, c11, c12, bias[1], has_bias, out + old, act, va, vb, a_zero);
        if (mr > 2) eg_store_row512(c20, c21, c22, bias[2], has_bias, out + 2 * old, act, va, vb, a_zero);
        if (mr > 3) eg_store_row512(c30, c31, c32, bias[3], has_bias, out + 3 * old, act, va, vb, a_zero);
    }
    #else
    static int eg_avx512_supported(void) { return 0; }
    #endif

    /* task t: image i, group g, columns [c * nc, min((c + 1) * nc, ncols)) */
    static void eg_task(const eg_args* e, ptrdiff_t t, double* panel) {
        ptrdiff_t c = t % e->nchunks, g = (t / e->nchunks) % e->G, i = t / (e->nchunks * e->G);
        ptrdiff_t j0 = c * e->nc, n = e->ncols - j0 < e->nc ? e->ncols - j0 : e->nc;
        ptrdiff_t kd = e->kd, nt = (n + EG_NR - 1) / EG_NR, mb, tt;
        const float* col = e->col + g * kd * e->col_ld + i * e->col_img + j0;
        float* out = e->out + e->out_off + i * e->out_img + g * e->og * e->out_ld + j0;
        int has_bias = e->bias != NULL;
    #if EG_X86
        if (e->simd) {
            ptrdiff_t full = n / EG_NR;
            /* simd 2: the first columns by the AVX-512 tile (24 = two 12-column tiles each), the rest as below */
            ptrdiff_t wide = e->simd == 2 ? n / EG_NR512 : 0;
            if (full < nt)  /* the partial last tile through the panel */
                eg_panel_scalar(col + full * EG_NR, e->col_ld, kd, n - full * EG_NR, panel);
            for (mb = 0; mb < e->nmb; mb++) {
                const double* wb = e->wp + (g * e->nmb + mb) * kd * EG_MR;
                const double* bb = e->bp + (g * e->nmb + mb) * EG_MR;
                int mr = e->og - mb * EG_MR < EG_MR ? (int)(e->og - mb * EG_MR) : EG_MR;
                float* ob = out + mb * EG_MR * e->out_ld;
                for (tt = 0; tt < wide; tt++)
                    eg_tile_512_f32(wb, col + tt * EG_NR512, e->col_ld, kd, bb, has_bias, ob + tt * EG_NR512,
                                    e->out_ld, mr, e->act, e->a, e->b);
                for (tt = wide * (EG_NR512 / EG_NR); tt < full; tt++)
                    eg_tile_avx2_f32(wb, col + tt * EG_NR, e->col_ld, kd, bb, has_bias, ob + tt * EG_NR, e->out_ld,
                                     mr, e->act, e->a, e->b);
                if (full < nt)
                    eg_tile_avx2(wb, panel, kd, bb, has_bias, ob + full * EG_NR, e->out_ld, mr,
                                 (int)(n - full * EG_NR), e->act, e->a, e->b);
            }
            return;
        }
    #endif
        eg_panel_scalar(col, e->col_ld, kd, n, panel);
        for (mb = 0; mb < e->nmb; mb++) {
            const double* wb = e->wp + (g * e->nmb + mb) * kd * EG_MR;
            const double* bb = e->bp + (g * e->nmb + mb) * EG_MR;
            int mr = e->og - mb * EG_MR < EG_MR ? (int)(e->og - mb * EG_MR) : EG_MR;
            for (tt = 0; tt < nt; tt++) {
                int nr = n - tt * EG_NR < EG_NR ? (int)(n - tt * EG_NR) : EG_NR;
                eg_tile_scalar(wb, panel + tt * kd * EG_NR, kd, bb, has_bias,
                               out + mb * EG_MR * e->out_ld + tt * EG_NR, e->out_ld, mr, nr, e->act, e->a, e->b);
            }
        }
    }

    /* ---- dots_nt: the weight gradient of an exact (short-K) layer: long dot products of float32 rows ----
       s(m, n) = sum_k a[m][k] b[n][k] in float64 as 8 partial sums p_j over the k = j (mod 8) in increasing k
       (each from +0), then s = p0 + p1 + ... + p7 in that order; out[m][n] += float32(s). The products are exact
       in float64, so FMA or not gives the same bits, and so do the AVX-512 tile (a zmm of the 8 partial sums
       per output), the AVX2 tile (two ymm) and the scalar loop. */
    /* the partial sums p of terms 0 .. k - 1 (k a multiple of 8), finished: the last K - k terms, then
       p0 + p1 + ... + p7 */
    static inline double eg_dot8_finish(double p[8], const float* a, const float* b, ptrdiff_t k, ptrdiff_t K) {
        double s;
        int j;
        for (j = 0; k + j < K; j++)
            p[j] += (double)a[k + j] * (double)b[k + j];
        s = p[0];
        for (j = 1; j < 8; j++)
            s += p[j];
        return s;
    }
    static double eg_dot8_scalar(const float* a, const float* b, ptrdiff_t K) {
        double p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        ptrdiff_t k;
        int j;
        for (k = 0; k + 8 <= K; k += 8)
            for (j = 0; j < 8; j++)
                p[j] += (double)a[k + j] * (double)b[k + j];
        return eg_dot8_finish(p, a, b, k, K);
    }
    #if EG_X86
    /* 4 x 4 outputs (rows a[i], b[j]; an edge tile repeats its last row and drops those outputs) */
    static EG_TARGET512 void eg_dots_tile512(const float* const* a, const float* const* b, ptrdiff_t K, double s[4][4]) {
        __m512d acc[4][4], av[4], bv[4];
        ptrdiff_t k;
        int i, j;
        for (i = 0; i < 4; i++)
            for (j = 0; j < 4; j++)
                acc[i][j] = _mm512_setzero_pd();
        for (k = 0; k + 8 <= K; k += 8) {
            for (i = 0; i < 4; i++)
                av[i] = _mm512_cvtps_pd(_mm256_loadu_ps(a[i] + k));
            for (j = 0; j < 4; j++)
                bv[j] = _mm512_cvtps_pd(_mm256_loadu_ps(b[j] + k));
            for (i = 0; i < 4; i++)
                for (j = 0; j < 4; j++)
                    acc[i][j] = _mm512_fmadd_pd(av[i], bv[j], acc[i][j]);
        }
        double p[8];
        for (i = 0; i < 4; i++)
            for (j = 0; j < 4; j++) {
                _mm512_storeu_pd(p, acc[i][j]);
                s[i][j] = eg_dot8_finish(p, a[i], b[j], k, K);
            }
    }
    /* 2 x 2 outputs, each partial-sum vector in two ymm (lanes 0-3, 4-7) */
    static EG_TARGET void eg_dots_tile256(const float* const* a, const float* const* b, ptrdiff_t K, double s[2][2]) {
        __m256d lo[2][2], hi[2][2], al[2], ah[2], bl[2], bh[2];
        ptrdiff_t k;
        int i, j;
        for (i = 0; i < 2; i++)
            for (j = 0; j < 2; j++)
                lo[i][j] = hi[i][j] = _mm256_setzero_pd();
        for (k = 0; k + 8 <= K; k += 8) {
            for (i = 0; i < 2; i++) {
                al[i] = _mm256_cvtps_pd(_mm_loadu_ps(a[i] + k));
                ah[i] = _mm256_cvtps_pd(_mm_loadu_ps(a[i] + k + 4));
                bl[i] = _mm256_cvtps_pd(_mm_loadu_ps(b[i] + k));
                bh[i] = _mm256_cvtps_pd(_mm_loadu_ps(b[i] + k + 4));
            }
            for (i = 0; i < 2; i++)
                for (j = 0; j < 2; j++) {
                    lo[i][j] = _mm256_fmadd_pd(al[i], bl[j], lo[i][j]);
                    hi[i][j] = _mm256_fmadd_pd(ah[i], bh[j], hi[i][j]);
                }
        }
        double p[8];
        for (i = 0; i < 2; i++)
            for (j = 0; j < 2; j++) {
                _mm256_storeu_pd(p, lo[i][j]);
                _mm256_storeu_pd(p + 4, hi[i][j]);
                s[i][j] = eg_dot8_finish(p, a[i], b[j], k, K);
            }
    }
    #endif
    /* tile number t of the (M / r) x (N / r) tiles of side r (4: AVX-512, 2: AVX2, 1: scalar) */
    static void eg_dots_task(const float* a, ptrdiff_t lda, const float* b, ptrdiff_t ldb, float* out, ptrdiff_t ldo,
                             ptrdiff_t M, ptrdiff_t N, ptrdiff_t K, int simd, ptrdiff_t t) {
        int r = simd == 2 ? 4 : simd == 1 ? 2 : 1, i, j;
        ptrdiff_t ntn = (N + r - 1) / r, m0 = (t / ntn) * r, n0 = (t % ntn) * r;
        const float* ar[4];
        const float* br[4];
        double s[4][4];
        for (i = 0; i < r; i++) {
            ar[i] = a + (m0 + i < M ? m0 + i : M - 1) * lda;
            br[i] = b + (n0 + i < N ? n0 + i : N - 1) * ldb;
        }
    #if EG_X86
        if (simd == 2) {
            eg_dots_tile512(ar, br, K, s);
        } else if (simd == 1) {
            double s2[2][2];
            eg_dots_tile256(ar, br, K, s2);
            for (i = 0; i < 2; i++)
                for (j = 0; j < 2; j++)
                    s[i][j] = s2[i][j];
        } else
    #endif
            s[0][0] = eg_dot8_scalar(ar[0], br[0], K);
        for (i = 0; i < r && m0 + i < M; i++)
            for (j = 0; j < r && n0 + j < N; j++)
                out[(m0 + i) * ldo + n0 + j] += (float)s[i][j];
    }
    """
    ctypedef struct eg_args:
        const float* w
        const float* bias
        const float* col
        float* out
        Py_ssize_t G, og, kd, nb, ncols, col_ld, col_img, out_ld, out_img, out_off
        Py_ssize_t nmb, nc, nchunks
        int act, simd
        float a, b
        double* wp
        double* bp
    int eg_supported() nogil
    int eg_avx512_supported() nogil
    void eg_pack_weights(eg_args* e) nogil
    void eg_task(const eg_args* e, Py_ssize_t t, double* panel) nogil
    void eg_dots_task(const float* a, Py_ssize_t lda, const float* b, Py_ssize_t ldb, float* out, Py_ssize_t ldo,
                      Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, int simd, Py_ssize_t t) nogil
    int EG_MR, EG_NR


# Columns per task (a multiple of 12): its float32 column range (kd x NC floats, 48 KB at kd = 32) stays in
# L2 while every channel block runs over it. Measured on one thread at the shapes of bench/ab_exact_gemm.py:
# 96 to 1,536 columns within the noise of each other (96 up to 20% slower on a few); the scalar path's
# float64 panel holds kd x NC doubles.
NC = 384

cpdef enum Act:  # the same codes as kernels.lowering's
    ACT_NONE = 0
    ACT_RELU = 1
    ACT_CLIP = 2


# The AVX-512 tile where the CPU has AVX-512F (the same bits as the AVX2 tile); False: the AVX2 tile (tests, A/B).
# Session 14, Zen 5, two threads, interleaved: LeNet conv1's forward at batch 64 (20 channels, kd 25, 64 x 576
# columns) 0.49 -> 0.29 ms; 32 channels, kd 27, 8 x 3025 columns 0.43 -> 0.24 ms.
AVX512 = True


def supported() -> bool:
    """Whether the kernel runs vectorized here: x86-64 built with GCC/Clang, and the CPU has AVX2 and FMA."""
    return bool(eg_supported())


def set_columns(Py_ssize_t nc):
    """Columns per task (rounded up to a multiple of 12; for benchmarks and tests)."""
    global NC
    if nc < 1:
        raise ValueError("exact_gemm: columns per task must be positive")
    NC = (nc + EG_NR - 1) // EG_NR * EG_NR


def gemm(const float[::1] w, const float[::1] col, float[::1] out, const float[::1] bias,
         Py_ssize_t G, Py_ssize_t og, Py_ssize_t kd, Py_ssize_t nb, Py_ssize_t ncols,
         Py_ssize_t col_ld, Py_ssize_t col_img, Py_ssize_t out_ld, Py_ssize_t out_img, Py_ssize_t out_off=0,
         int act=ACT_NONE, double a=0, double b=0, bint simd=True):
    """out[out_off + i out_img + (g og + m) out_ld + j] = act(float32(sum_k w[g og + m, k] col[(g kd + k)
    col_ld + i col_img + j] + bias[g og + m])), the sum and bias in float64 (module doc). simd=False: the
    scalar path (the same bits)."""
    cdef eg_args e
    cdef Py_ssize_t t, ntask, top
    cdef double* panel
    if min(G, og, kd) < 1 or min(nb, ncols, col_ld, col_img, out_ld, out_img, out_off) < 0:
        raise ValueError("exact_gemm: sizes must be positive and strides non-negative")
    if act != ACT_NONE and act != ACT_RELU and act != ACT_CLIP:
        raise ValueError(f"exact_gemm: unknown activation code {act}")
    if w.shape[0] < G * og * kd:
        raise ValueError("exact_gemm: weight buffer too small")
    if bias is not None and bias.shape[0] < G * og:
        raise ValueError("exact_gemm: bias buffer too small")
    if nb == 0 or ncols == 0:
        return
    if col.shape[0] < (G * kd - 1) * col_ld + (nb - 1) * col_img + ncols:
        raise ValueError("exact_gemm: column buffer too small")
    top = out_off + (nb - 1) * out_img + (G * og - 1) * out_ld + ncols
    if out.shape[0] < top:
        raise ValueError("exact_gemm: output buffer too small")
    e.w, e.col, e.out = &w[0], &col[0], &out[0]
    e.bias = &bias[0] if bias is not None else NULL
    e.G, e.og, e.kd, e.nb, e.ncols = G, og, kd, nb, ncols
    e.col_ld, e.col_img, e.out_ld, e.out_img, e.out_off = col_ld, col_img, out_ld, out_img, out_off
    e.nmb = (og + EG_MR - 1) // EG_MR
    e.nc = NC
    e.nchunks = (ncols + e.nc - 1) // e.nc
    e.act, e.a, e.b = act, <float>a, <float>b
    e.simd = (2 if AVX512 and eg_avx512_supported() else 1) if simd and eg_supported() else 0
    e.wp = <double*>malloc((G * e.nmb * EG_MR * (kd + 1)) * sizeof(double))
    if e.wp == NULL:
        raise MemoryError()
    e.bp = e.wp + G * e.nmb * EG_MR * kd
    ntask = nb * G * e.nchunks
    cdef int nt = _threads(nb * G * og * ncols * kd // 8)
    if nt > ntask:
        nt = <int>ntask
    cdef Py_ssize_t panel_n = kd * ((e.nc + EG_NR - 1) // EG_NR) * EG_NR
    try:
        with nogil:
            eg_pack_weights(&e)
            with parallel(num_threads=nt):
                panel = <double*>malloc(panel_n * sizeof(double))
                if panel == NULL:
                    with gil:
                        raise MemoryError()
                else:
                    for t in prange(ntask, schedule="dynamic"):
                        eg_task(&e, t, panel)
                    free(panel)
    finally:
        free(e.wp)


def _fits(str name, Py_ssize_t size, Py_ssize_t off, Py_ssize_t ld, Py_ssize_t rows, Py_ssize_t cols):
    if off < 0 or ld < cols or (rows > 0 and cols > 0 and off + (rows - 1) * ld + cols > size):
        raise ValueError(f"exact_gemm.dots_nt: {name} ({size} elements) does not hold {rows} rows of {cols} from "
                         f"offset {off}, {ld} apart")


def dots_nt(const float[::1] a, Py_ssize_t a_off, Py_ssize_t lda, const float[::1] b, Py_ssize_t b_off,
            Py_ssize_t ldb, float[::1] out, Py_ssize_t out_off, Py_ssize_t ldo, Py_ssize_t M, Py_ssize_t N,
            Py_ssize_t K, bint simd=True):
    """out[out_off + m ldo + n] += float32(sum_k a[a_off + m lda + k] b[b_off + n ldb + k]) for m < M, n < N:
    the weight gradient of an exact (short-K) layer, dW += dout (M x K) @ col (N x K)^T, its long sums in
    float64 (the C block's doc: 8 partial sums, k mod 8, then in order). simd=False: the scalar loop (the
    same bits)."""
    cdef Py_ssize_t t, ntask, r
    cdef int mode
    if min(M, N, K) < 0:
        raise ValueError("exact_gemm.dots_nt: sizes must not be negative")
    _fits("a", a.shape[0], a_off, lda, M, K)
    _fits("b", b.shape[0], b_off, ldb, N, K)
    _fits("out", out.shape[0], out_off, ldo, M, N)
    if M == 0 or N == 0:
        return
    mode = (2 if AVX512 and eg_avx512_supported() else 1) if simd and eg_supported() else 0
    r = 4 if mode == 2 else 2 if mode == 1 else 1
    ntask = ((M + r - 1) // r) * ((N + r - 1) // r)
    cdef const float* ap = &a[a_off] if K else <const float*>NULL
    cdef const float* bp = &b[b_off] if K else <const float*>NULL
    cdef float* op = &out[out_off]
    cdef int nt = _threads(M * N * K // 16)
    if nt > ntask:
        nt = <int>ntask
    with nogil:
        for t in prange(ntask, schedule="dynamic", num_threads=nt):
            eg_dots_task(ap, lda, bp, ldb, op, ldo, M, N, K, mode, t)

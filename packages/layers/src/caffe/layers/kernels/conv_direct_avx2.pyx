# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math
"""Direct dense 2-D convolution, stride 1, dilation 1, float32, with AVX2 and FMA, and AVX-512 variants
(conv_cpu's "dense" plan).

Shapes (g = group, cg = C / g input and og = Co / g output channels per group):

  x (N, C, H, W)   w (Co, cg, kh, kw)   y (N, Co, OH, OW),  OH = H + 2 ph - kh + 1,  OW = W + 2 pw - kw + 1

  forward          y[n, o, oy, ox] = b[o] + sum_{c, i, j} w[o, c, i, j] xpad[n, c, oy + i, ox + j]
  backward_weight_oc  dw[o, c, i, j] += sum_{n, oy, ox} dy[n, o, oy, ox] xpad[n, c, oy + i, ox + j]

The bottom diff at stride 1 is a forward of dy with the filters flipped and transposed
(pack_weights(flip=True)) and padding kh - 1 - ph, kw - 1 - pw.

forward: each task (image, group, run of output-channel blocks) copies its image's channels into
a zero-padded plane (cg, H + 2 ph, Wp), Wp = 8 * ceil(OW / 8) + kw - 1, so every load is in bounds
with no tests. The filters are packed [group][block of 4 output channels][c][i][j][4]. A tile is 3
vectors of 8 consecutive output x positions (the vectors of the flattened (row, x-vector) list, so
rows of 8 or 13 outputs still fill it) times a block of 4 output channels: 12 accumulators; per
(c, i, j) 3 input loads and 4 broadcasts feed 12 FMAs. The last vector of a row is stored masked
when OW is not a multiple of 8.

backward_weight_oc: see the comment above it (vectorized over 8 output channels; the bias diff in the
same pass).

AVX-512 (AVX512 below, chosen at run time where the CPU has AVX-512F): the forward copies each input
channel into kw planes shifted by the tap column, so that an output plane and its inputs are 1-D runs and
a 16-lane vector holds 16 consecutive positions across row ends (rows of 8 or 13 fill it as well as rows of
32); the tiles are 1-6 vectors times the same blocks of 4 output channels (pack_weights unchanged).
backward_weight_oc takes vectors of 16 output channels. Each output's FMAs and each weight diff's sums run
in the AVX2 kernels' order, so the two variants give the same bits.

The AVX-512 forward has a second tile, the default where a layer has >= 32 output channels a group and a
kernel_dim >= 256 (OC_FORWARD, OC_MIN_OUT, OC_MIN_KD): vectors over 16 output channels of one position
(cd5o_*), 1-3 of them times 1-8 positions, the inputs broadcast from the same shifted planes and the filters
loaded whole from their own layout ([group][block of 1-3 vectors][c][i][j][16 V], 64-byte aligned by conv_cpu);
the sums go through a scratch and are transposed into the output planes. The same FMAs in the same order per
output: the same bits again. pack_weights / packed_size give the layout the settings choose for that shape.

On a CPU without AVX2 and FMA (supported() is False) or a compiler other than x86-64 GCC/Clang
the kernels are plain C loops with the same results up to rounding; conv_cpu chooses this plan
only where supported() is True. (The module keeps its AVX2 name: both variants are one family, one API.)
"""
import os
import threading

import numpy as np

from cython.parallel cimport parallel, prange, threadid
from libc.stdlib cimport malloc, calloc, free
include "_threads.pxi"

cdef extern from *:
    """
    #include <string.h>
    #include <stddef.h>
    #if defined(__x86_64__) && defined(__GNUC__)
    #define CD_X86 1
    #include <immintrin.h>
    #define CD_TARGET __attribute__((target("avx2,fma")))
    #define CD5_TARGET __attribute__((target("avx512f,avx2,fma")))
    #else
    #define CD_X86 0
    #define CD_TARGET
    #endif

    typedef struct {
        ptrdiff_t N, C, H, W, Co, G, cg, og, kh, kw, ph, pw, OH, OW;
        ptrdiff_t Hp, Wp, OWv, nb;   /* padded plane Hp x Wp; vectors per output row; 4-channel blocks per group */
    } cd_geom;

    static int cd_supported(void) {
    #if CD_X86
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    #else
        return 0;
    #endif
    }

    static int cd_avx512_supported(void) {
    #if CD_X86
        return cd_supported() && __builtin_cpu_supports("avx512f");
    #else
        return 0;
    #endif
    }

    static void cd_init(cd_geom* d, ptrdiff_t N, ptrdiff_t C, ptrdiff_t H, ptrdiff_t W, ptrdiff_t Co,
                        ptrdiff_t G, ptrdiff_t kh, ptrdiff_t kw, ptrdiff_t ph, ptrdiff_t pw) {
        d->N = N; d->C = C; d->H = H; d->W = W; d->Co = Co; d->G = G;
        d->cg = C / G; d->og = Co / G; d->kh = kh; d->kw = kw; d->ph = ph; d->pw = pw;
        d->OH = H + 2 * ph - kh + 1; d->OW = W + 2 * pw - kw + 1;
        d->OWv = (d->OW + 7) / 8;
        d->Hp = H + 2 * ph;
        d->Wp = 8 * d->OWv + kw - 1;
        d->nb = (d->og + 3) / 4;
    }

    /* nc channels of image x (nc, H, W) into zeroed planes `plane` floats apart, of rows `row` wide, at
       (ph, pw): the forward's (Hp x Wp planes, rows padded to whole vectors) and backward_weight_oc's
       (rows W + 2 pw wide) */
    static void cd_pad_planes(const cd_geom* d, const float* x, float* pad, ptrdiff_t nc, ptrdiff_t plane,
                              ptrdiff_t row) {
        ptrdiff_t c, h;
        memset(pad, 0, (size_t)(nc * plane) * sizeof(float));
        for (c = 0; c < nc; c++)
            for (h = 0; h < d->H; h++)
                memcpy(pad + c * plane + (h + d->ph) * row + d->pw, x + (c * d->H + h) * d->W,
                       (size_t)d->W * sizeof(float));
    }

    static void cd_pad(const cd_geom* d, const float* x, float* pad, ptrdiff_t nc) {
        cd_pad_planes(d, x, pad, nc, d->Hp * d->Wp, d->Wp);
    }

    /* w (Co, cg, kh, kw) -> packed [G][nb][cg][kh][kw][4]; flip: the filters of the adjoint (a convolution
       from the Co side to the C side: og and cg swap roles, taps reversed). Padding channels are zero.
       One block (g, b) of 4 output channels, written in order (a scatter over the whole buffer in w's
       order, after a memset, took 0.5-1.8 ms of CaffeNet's 1-3.5 MB layers on every call). */
    static void cd_pack_block(const float* w, float* p, ptrdiff_t og, ptrdiff_t cg, ptrdiff_t kh, ptrdiff_t kw,
                              int flip, ptrdiff_t g, ptrdiff_t b) {
        ptrdiff_t outc = flip ? cg : og, inc = flip ? og : cg, nb = (outc + 3) / 4, K = kh * kw;
        ptrdiff_t valid = outc - b * 4 < 4 ? outc - b * 4 : 4, cc, t, l;
        float* q = p + (g * nb + b) * inc * K * 4;
        const float* src;
        for (cc = 0; cc < inc; cc++, q += K * 4) {
            for (l = 0; l < valid; l++) {
                if (flip) {  /* output channel b 4 + l of the adjoint is input channel c, its input channel o */
                    src = w + ((g * og + cc) * cg + b * 4 + l) * K + K - 1;  /* taps reversed */
                    for (t = 0; t < K; t++)
                        q[t * 4 + l] = src[-t];
                } else {
                    src = w + ((g * og + b * 4 + l) * cg + cc) * K;
                    for (t = 0; t < K; t++)
                        q[t * 4 + l] = src[t];
                }
            }
            for (; l < 4; l++)
                for (t = 0; t < K; t++)
                    q[t * 4 + l] = 0.0f;
        }
    }

    #if CD_X86
    static inline __attribute__((always_inline)) CD_TARGET __m256i cd_mask(ptrdiff_t valid) {
        return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)valid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    }

    /* R output channels x X vectors of one tile; pad: the task's padded planes; wb: the block's packed
       filters; xo/yo: each vector's offset in a padded plane / an output plane; m: each vector's valid lanes */
    static inline __attribute__((always_inline)) CD_TARGET void cd_fwd_tile(
            const int R, const int X, const cd_geom* d, const float* pad, const float* wb, const float* bias,
            float* y, const ptrdiff_t* xo, const ptrdiff_t* yo, const ptrdiff_t* m, ptrdiff_t c0, ptrdiff_t c1,
            int first) {
        __m256 acc[4][3], v[3];
        ptrdiff_t c, i, j, plane = d->Hp * d->Wp, P = d->OH * d->OW, kw = d->kw, Wp = d->Wp;
        int r, t;
        if (first) {
            _Pragma("GCC unroll 8") for (r = 0; r < R; r++) {
                __m256 b0 = bias ? _mm256_set1_ps(bias[r]) : _mm256_setzero_ps();
                _Pragma("GCC unroll 8") for (t = 0; t < X; t++) acc[r][t] = b0;
            }
        } else {  /* a later run of channels adds to the partial sums stored by the earlier ones */
            _Pragma("GCC unroll 8") for (r = 0; r < R; r++)
                _Pragma("GCC unroll 8") for (t = 0; t < X; t++)
                    acc[r][t] = m[t] == 8 ? _mm256_loadu_ps(y + r * P + yo[t])
                                          : _mm256_maskload_ps(y + r * P + yo[t], cd_mask(m[t]));
        }
        for (c = c0; c < c1; c++) {
            const float* pc = pad + c * plane;
            for (i = 0; i < d->kh; i++) {
                const float* row = pc + i * Wp;
                const float* wr = wb + (c * d->kh + i) * kw * 4;
                for (j = 0; j < kw; j++) {
                    _Pragma("GCC unroll 8") for (t = 0; t < X; t++) v[t] = _mm256_loadu_ps(row + xo[t] + j);
                    _Pragma("GCC unroll 8") for (r = 0; r < R; r++) {
                        __m256 wv = _mm256_broadcast_ss(wr + j * 4 + r);
                        _Pragma("GCC unroll 8") for (t = 0; t < X; t++) acc[r][t] = _mm256_fmadd_ps(wv, v[t], acc[r][t]);
                    }
                }
            }
        }
        _Pragma("GCC unroll 8") for (r = 0; r < R; r++)
            _Pragma("GCC unroll 8") for (t = 0; t < X; t++) {
                if (m[t] == 8) _mm256_storeu_ps(y + r * P + yo[t], acc[r][t]);
                else _mm256_maskstore_ps(y + r * P + yo[t], cd_mask(m[t]), acc[r][t]);
            }
    }

    #define CD_FWD_CASE(R, X) case (R) * 4 + (X): \\
        cd_fwd_tile(R, X, d, pad, wb, bias, y, xo, yo, m, c0, c1, first); break;

    static CD_TARGET void cd_fwd_dispatch(int R, int X, const cd_geom* d, const float* pad, const float* wb,
                                          const float* bias, float* y, const ptrdiff_t* xo, const ptrdiff_t* yo,
                                          const ptrdiff_t* m, ptrdiff_t c0, ptrdiff_t c1, int first) {
        switch (R * 4 + X) {
            CD_FWD_CASE(1, 1) CD_FWD_CASE(1, 2) CD_FWD_CASE(1, 3)
            CD_FWD_CASE(2, 1) CD_FWD_CASE(2, 2) CD_FWD_CASE(2, 3)
            CD_FWD_CASE(3, 1) CD_FWD_CASE(3, 2) CD_FWD_CASE(3, 3)
            CD_FWD_CASE(4, 1) CD_FWD_CASE(4, 2) CD_FWD_CASE(4, 3)
        }
    }
    #else
    /* (the portable build: plain loops, the same run structure as the AVX2 tiles) */
    static void cd_fwd_dispatch(int R, int X, const cd_geom* d, const float* pad, const float* wb,
                                const float* bias, float* y, const ptrdiff_t* xo, const ptrdiff_t* yo,
                                const ptrdiff_t* m, ptrdiff_t c0, ptrdiff_t c1, int first) {
        ptrdiff_t c, i, j, l, plane = d->Hp * d->Wp, P = d->OH * d->OW;
        int r, t;
        _Pragma("GCC unroll 8") for (r = 0; r < R; r++)
            _Pragma("GCC unroll 8") for (t = 0; t < X; t++)
                for (l = 0; l < m[t]; l++) {
                    float s = first ? (bias ? bias[r] : 0.0f) : y[r * P + yo[t] + l];
                    for (c = c0; c < c1; c++)
                        for (i = 0; i < d->kh; i++)
                            for (j = 0; j < d->kw; j++)
                                s += wb[((c * d->kh + i) * d->kw + j) * 4 + r] * pad[c * plane + i * d->Wp + xo[t] + j + l];
                    y[r * P + yo[t] + l] = s;
                }
    }
    #endif

    /* Input channels per run of the forward: a tile's rows of them and their filters about L1-sized. */
    static ptrdiff_t cd_run_bytes = 24 << 10;
    static ptrdiff_t cd_fwd_crun(const cd_geom* d) {
        ptrdiff_t rows = (3 + d->OWv - 1) / d->OWv + d->kh;  /* rows a tile's 3 vectors read, per channel */
        ptrdiff_t per = rows * d->Wp * 4 + d->kh * d->kw * 16, cb = cd_run_bytes / per;
        if (cb < 8) cb = 8;
        return cb > d->cg ? d->cg : cb;
    }

    /* forward of image n, group g, channel blocks b0..b1-1 (pad: scratch for cg padded planes) */
    static void cd_fwd_task(const cd_geom* d, const float* x, const float* wp, const float* bias, float* y,
                            float* pad, ptrdiff_t n, ptrdiff_t g, ptrdiff_t b0, ptrdiff_t b1) {
        ptrdiff_t b, i, t, c0, cb = cd_fwd_crun(d), nvec = d->OH * d->OWv, xo[3], yo[3], m[3];
        cd_pad(d, x + (n * d->C + g * d->cg) * d->H * d->W, pad, d->cg);
        for (c0 = 0; c0 < d->cg; c0 += cb) {
            ptrdiff_t c1 = c0 + cb < d->cg ? c0 + cb : d->cg;
            for (b = b0; b < b1; b++) {
                ptrdiff_t o0 = b * 4;
                int R = (int)(d->og - o0 < 4 ? d->og - o0 : 4);
                const float* wb = wp + (g * d->nb + b) * d->cg * d->kh * d->kw * 4;
                const float* bb = bias ? bias + g * d->og + o0 : NULL;
                float* yb = y + (n * d->Co + g * d->og + o0) * d->OH * d->OW;
                for (i = 0; i < nvec; i += 3) {
                    int X = (int)(nvec - i < 3 ? nvec - i : 3);
                    for (t = 0; t < X; t++) {
                        ptrdiff_t oy = (i + t) / d->OWv, xv = (i + t) % d->OWv;
                        xo[t] = oy * d->Wp + xv * 8;
                        yo[t] = oy * d->OW + xv * 8;
                        m[t] = d->OW - xv * 8 < 8 ? d->OW - xv * 8 : 8;
                    }
                    cd_fwd_dispatch(R, X, d, pad, wb, bb, yb, xo, yo, m, c0, c1, c0 == 0);
                }
            }
        }
    }


    /* -- the forward with AVX-512 (16 lanes): rows of any width fill the vectors --
       Each input channel is copied into kw planes "shifted by tap j": xc[c][j][r OW + x] = xpad[c][r][x + j]
       (r < Hp, x < OW; PL = Hp OW floats a plane). Then output position q = oy OW + ox of a channel takes
       tap (i, j) from xc[c][j][q + i OW]: the output plane and its inputs are 1-D runs, so a vector holds 16
       consecutive positions across row ends (CIFAR10-quick's 8-wide rows fill it as well as its 32-wide),
       and only the plane's last vector is masked. The FMAs of each output run in the AVX2 kernel's order
       (the bias, then c, i, j), so both give the same bits. */
    static ptrdiff_t cd5_plane(const cd_geom* d) { return d->Hp * d->OW; }
    /* Vectors of 16 positions per tile (at most 6: R X accumulators + X inputs + a broadcast <= 32 zmm). */
    static ptrdiff_t cd5_xmax = 6;
    /* Input channels per run: their shifted planes about cd5_run_bytes (each tile then runs all its input
       channels at once wherever they fit, as at every shape measured: runs sized for L1, as AVX2's, were up to
       1.2x slower: CaffeNet conv3, CIFAR10-quick conv3; the budget only bounds the scratch on large images) */
    static ptrdiff_t cd5_run_bytes = 4 << 20;
    static ptrdiff_t cd5_fwd_crun(const cd_geom* d) {
        ptrdiff_t cb = cd5_run_bytes / (d->kw * cd5_plane(d) * 4);
        if (cb < 4) cb = 4;
        return cb > d->cg ? d->cg : cb;
    }
    /* floats of a task's scratch: the shifted planes of a run of channels and a vector of slack (the last
       vector's loads) */
    static ptrdiff_t cd5_scratch(const cd_geom* d) { return cd5_fwd_crun(d) * d->kw * cd5_plane(d) + 16; }

    #if CD_X86
    /* xc = the shifted planes of channels c0..c1-1 of x (the task's image and group): masked loads straight
       from the image rows (the lanes outside the image: zeros, their addresses never read), the masks worked
       out once per tap and run of 16 columns. The stores go up through xc in order, so a short row's
       (OW < 16) full-vector store may spill into the rows after it: they are written next (the last plane's
       spill: the slack). A memcpy call per row cost a third of the forward's time at CIFAR10-quick conv3's
       bottom diff (rows of 8). */
    static CD5_TARGET void cd5_shift_planes(const cd_geom* d, const float* x, float* xc, ptrdiff_t c0,
                                            ptrdiff_t c1) {
        ptrdiff_t c, j, r, x0, PL = cd5_plane(d), OW = d->OW, H = d->H, W = d->W, ph = d->ph;
        const __m512 zero = _mm512_setzero_ps();
        for (c = c0; c < c1; c++)
            for (j = 0; j < d->kw; j++) {
                float* plane = xc + ((c - c0) * d->kw + j) * PL;
                const float* src = x + c * H * W + j - d->pw;  /* output column x reads src[h W + x] */
                for (x0 = 0; x0 < OW; x0 += 16) {
                    ptrdiff_t n = OW - x0 < 16 ? OW - x0 : 16;
                    ptrdiff_t lo = d->pw - j - x0, hi = W + d->pw - j - x0;  /* lanes lo..hi-1 in the image */
                    __mmask16 in = 0, keep = (__mmask16)((1u << n) - 1);
                    float* dst = plane + x0;
                    if (lo < 0) lo = 0;
                    if (hi > n) hi = n;
                    if (hi > lo) in = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
                    if (n < 16 && OW > 16) {  /* a long row's last run: the next rows' columns are already written */
                        for (r = 0; r < ph; r++) _mm512_mask_storeu_ps(dst + r * OW, keep, zero);
                        for (; r < ph + H; r++)
                            _mm512_mask_storeu_ps(dst + r * OW, keep,
                                                  _mm512_maskz_loadu_ps(in, src + (r - ph) * W + x0));
                        for (; r < d->Hp; r++) _mm512_mask_storeu_ps(dst + r * OW, keep, zero);
                    } else {
                        for (r = 0; r < ph; r++) _mm512_storeu_ps(dst + r * OW, zero);
                        for (; r < ph + H; r++)
                            _mm512_storeu_ps(dst + r * OW, _mm512_maskz_loadu_ps(in, src + (r - ph) * W + x0));
                        for (; r < d->Hp; r++) _mm512_storeu_ps(dst + r * OW, zero);
                    }
                }
            }
        memset(xc + (c1 - c0) * d->kw * PL, 0, 16 * sizeof(float));
    }
    #endif

    #if CD_X86
    /* R output channels x X vectors of 16 positions from q0 (the last vector's valid lanes: `last`), input
       channels c0..c1-1 (xc: their shifted planes) */
    static inline __attribute__((always_inline)) CD5_TARGET void cd5_fwd_tile(
            const int R, const int X, const cd_geom* d, const float* xc, const float* wb, const float* bias,
            float* y, ptrdiff_t q0, __mmask16 last, ptrdiff_t c0, ptrdiff_t c1, int first) {
        __m512 acc[4][6], v[6];
        ptrdiff_t c, i, j, PL = cd5_plane(d), P = d->OH * d->OW, kh = d->kh, kw = d->kw, OW = d->OW;
        int r, t;
        if (first) {
            _Pragma("GCC unroll 8") for (r = 0; r < R; r++) {
                __m512 b0 = bias ? _mm512_set1_ps(bias[r]) : _mm512_setzero_ps();
                _Pragma("GCC unroll 8") for (t = 0; t < X; t++) acc[r][t] = b0;
            }
        } else {  /* a later run of channels adds to the partial sums stored by the earlier ones */
            _Pragma("GCC unroll 8") for (r = 0; r < R; r++)
                _Pragma("GCC unroll 8") for (t = 0; t < X; t++)
                    acc[r][t] = _mm512_maskz_loadu_ps(t == X - 1 ? last : (__mmask16)0xFFFF, y + r * P + q0 + 16 * t);
        }
        for (c = c0; c < c1; c++) {
            const float* pc = xc + (c - c0) * kw * PL + q0;
            const float* wc = wb + c * kh * kw * 4;
            for (i = 0; i < kh; i++)
                for (j = 0; j < kw; j++) {
                    const float* src = pc + j * PL + i * OW;
                    const float* wr = wc + (i * kw + j) * 4;
                    _Pragma("GCC unroll 8") for (t = 0; t < X; t++) v[t] = _mm512_loadu_ps(src + 16 * t);
                    _Pragma("GCC unroll 8") for (r = 0; r < R; r++) {
                        __m512 wv = _mm512_set1_ps(wr[r]);
                        _Pragma("GCC unroll 8") for (t = 0; t < X; t++)
                            acc[r][t] = _mm512_fmadd_ps(wv, v[t], acc[r][t]);
                    }
                }
        }
        _Pragma("GCC unroll 8") for (r = 0; r < R; r++)
            _Pragma("GCC unroll 8") for (t = 0; t < X; t++)
                _mm512_mask_storeu_ps(y + r * P + q0 + 16 * t, t == X - 1 ? last : (__mmask16)0xFFFF, acc[r][t]);
    }

    #define CD5_FWD_CASE(R, X) case (R) * 8 + (X): \\
        cd5_fwd_tile(R, X, d, xc, wb, bias, y, q0, last, c0, c1, first); break;

    static CD5_TARGET void cd5_fwd_dispatch(int R, int X, const cd_geom* d, const float* xc, const float* wb,
                                            const float* bias, float* y, ptrdiff_t q0, __mmask16 last,
                                            ptrdiff_t c0, ptrdiff_t c1, int first) {
        switch (R * 8 + X) {
            CD5_FWD_CASE(1, 1) CD5_FWD_CASE(1, 2) CD5_FWD_CASE(1, 3)
            CD5_FWD_CASE(1, 4) CD5_FWD_CASE(1, 5) CD5_FWD_CASE(1, 6)
            CD5_FWD_CASE(2, 1) CD5_FWD_CASE(2, 2) CD5_FWD_CASE(2, 3)
            CD5_FWD_CASE(2, 4) CD5_FWD_CASE(2, 5) CD5_FWD_CASE(2, 6)
            CD5_FWD_CASE(3, 1) CD5_FWD_CASE(3, 2) CD5_FWD_CASE(3, 3)
            CD5_FWD_CASE(3, 4) CD5_FWD_CASE(3, 5) CD5_FWD_CASE(3, 6)
            CD5_FWD_CASE(4, 1) CD5_FWD_CASE(4, 2) CD5_FWD_CASE(4, 3)
            CD5_FWD_CASE(4, 4) CD5_FWD_CASE(4, 5) CD5_FWD_CASE(4, 6)
        }
    }

    /* the forward of image n, group g, channel blocks b0..b1-1 (xc: cd5_scratch floats). Per run of input
       channels, their shifted planes are built, then each tile of positions runs every block. */
    static void cd5_fwd_task(const cd_geom* d, const float* x, const float* wp, const float* bias, float* y,
                             float* xc, ptrdiff_t n, ptrdiff_t g, ptrdiff_t b0, ptrdiff_t b1) {
        ptrdiff_t b, q, c0, P = d->OH * d->OW, nv = (P + 15) / 16, cb = cd5_fwd_crun(d);
        for (c0 = 0; c0 < d->cg; c0 += cb) {
            ptrdiff_t c1 = c0 + cb < d->cg ? c0 + cb : d->cg;
            cd5_shift_planes(d, x + (n * d->C + g * d->cg) * d->H * d->W, xc, c0, c1);
            for (q = 0; q < nv; q += cd5_xmax) {
                int X = (int)(nv - q < cd5_xmax ? nv - q : cd5_xmax);
                ptrdiff_t rest = P - (q + X - 1) * 16;  /* valid lanes of the last vector */
                __mmask16 last = (__mmask16)(rest >= 16 ? 0xFFFF : (1u << rest) - 1);
                for (b = b0; b < b1; b++) {
                    ptrdiff_t o0 = b * 4;
                    int R = (int)(d->og - o0 < 4 ? d->og - o0 : 4);
                    const float* wb = wp + (g * d->nb + b) * d->cg * d->kh * d->kw * 4;
                    const float* bb = bias ? bias + g * d->og + o0 : NULL;
                    float* yb = y + (n * d->Co + g * d->og + o0) * P;
                    cd5_fwd_dispatch(R, X, d, xc, wb, bb, yb, q * 16, last, c0, c1, c0 == 0);
                }
            }
        }
    }
    #else
    /* no AVX-512 build: the portable forward (cd_avx512_supported() is 0, the wrapper never asks for this) */
    static void cd5_fwd_task(const cd_geom* d, const float* x, const float* wp, const float* bias, float* y,
                             float* xc, ptrdiff_t n, ptrdiff_t g, ptrdiff_t b0, ptrdiff_t b1) {
        cd_fwd_task(d, x, wp, bias, y, xc, n, g, b0, b1);
    }
    #endif

    /* -- the AVX-512 forward with vectors over output channels ("oc forward", cd5o_*) --
       The same shifted planes as cd5 (xc[c][j][q + i OW]), but a vector holds 16 output channels of one
       position: a tile is V vectors (16 V output channels, V <= 3) x PT positions (<= 8): per tap V aligned
       filter loads and PT scalar broadcasts of consecutive inputs feed V PT FMAs (24 accumulators). The
       cd5 tile's position vectors were unaligned loads (OW and the planes are any width) that split cache
       lines: it ran at ~120-125 GFLOP/s a core where these tiles run at ~140-150 (FMA peak ~225). The sums go
       through a scratch [position][16 V] (aligned) between chunks of input channels and are transposed into
       y's planes at the end; each output is still the bias, then the FMAs over c, i, j in order: the cd5
       and AVX2 tiles' bits. Filters packed [group][block][c][i][j][16 V] (blocks of 1-3 vectors: cd5o_block;
       past the last output channel zero filters). */
    #define CD5O_BLOCK 48
    #define CD5O_PT 8
    /* positions a chunk (the sums' scratch: 16 more rows of 48 floats, 99 KB) */
    static ptrdiff_t cd5o_chunk = 512;
    /* filter bytes of a chunk of input channels (reused by every tile of a position chunk: about L1) */
    static ptrdiff_t cd5o_wbytes = 24 << 10;

    static ptrdiff_t cd5o_group_floats(ptrdiff_t outc, ptrdiff_t inc, ptrdiff_t K) {
        return 16 * ((outc + 15) / 16) * inc * K;
    }

    /* block b of outc outputs: ceil(outc / 48) blocks share the ceil(outc / 16) vectors evenly (64 outputs: two
       blocks of 2 vectors, not 3 + 1: a 1-vector tile is bound by its broadcasts); its first output o0 and
       vectors V */
    static ptrdiff_t cd5o_nblocks(ptrdiff_t outc) { return ((outc + 15) / 16 + 2) / 3; }
    static void cd5o_block(ptrdiff_t outc, ptrdiff_t b, ptrdiff_t* o0, int* V) {
        ptrdiff_t nvec = (outc + 15) / 16, nblk = cd5o_nblocks(outc), base = nvec / nblk, extra = nvec % nblk;
        *V = (int)(base + (b < extra));
        *o0 = 16 * (b * base + (b < extra ? b : extra));
    }

    static void cd5o_pack_tiles(const float* w, float* q, ptrdiff_t rowlen, ptrdiff_t valid, ptrdiff_t width);

    /* block b of group g of the oc layout; flip as cd_pack_block */
    static void cd5o_pack_block(const float* w, float* p, ptrdiff_t og, ptrdiff_t cg, ptrdiff_t kh, ptrdiff_t kw,
                                int flip, ptrdiff_t g, ptrdiff_t b) {
        ptrdiff_t outc = flip ? cg : og, inc = flip ? og : cg, K = kh * kw, o0, valid, width, cc, t, l;
        int V;
        cd5o_block(outc, b, &o0, &V);
        width = 16 * V;
        valid = outc - o0 < width ? outc - o0 : width;
        float* q = p + g * cd5o_group_floats(outc, inc, K) + o0 * inc * K;
        if (flip) {  /* each input channel's filters are a run of outc K floats in w */
            for (cc = 0; cc < inc; cc++)
                for (t = 0; t < K; t++)
                    for (l = 0; l < valid; l++)
                        q[(cc * K + t) * width + l] = w[((g * og + cc) * cg + o0 + l) * K + K - 1 - t];  /* reversed */
            for (cc = 0; cc < inc * K; cc++)
                for (l = valid; l < width; l++) q[cc * width + l] = 0.0f;
        } else {  /* each output's filters are a run of inc K floats in w (zero rows past valid) */
            cd5o_pack_tiles(w + (g * og + o0) * cg * K, q, inc * K, valid, width);
        }
    }

    #if CD_X86
    /* V x PT accumulators over input channels c0..c1-1 of the run (xs: channel c0's first plane at the
       tile's first position; wr: channel c0's filters; s: the tile's scratch rows, `width` floats each) */
    static inline __attribute__((always_inline)) CD5_TARGET void cd5o_tile(
            const int V, const int PT, const float* xs, const float* wr, float* s, ptrdiff_t nc, ptrdiff_t kh,
            ptrdiff_t kw, ptrdiff_t PL, ptrdiff_t OW, ptrdiff_t width, int first, const float* pb) {
        __m512 acc[3][CD5O_PT], wv[3];
        ptrdiff_t c, i, j;
        int v, p;
        if (first) {
            _Pragma("GCC unroll 4") for (v = 0; v < V; v++) {
                __m512 b0 = _mm512_loadu_ps(pb + 16 * v);
                _Pragma("GCC unroll 8") for (p = 0; p < PT; p++) acc[v][p] = b0;
            }
        } else {
            _Pragma("GCC unroll 8") for (p = 0; p < PT; p++)
                _Pragma("GCC unroll 4") for (v = 0; v < V; v++) acc[v][p] = _mm512_load_ps(s + p * width + 16 * v);
        }
        for (c = 0; c < nc; c++)
            for (i = 0; i < kh; i++)
                for (j = 0; j < kw; j++) {
                    const float* x = xs + (c * kw + j) * PL + i * OW;
                    const float* w = wr + ((c * kh + i) * kw + j) * width;
                    _Pragma("GCC unroll 4") for (v = 0; v < V; v++) wv[v] = _mm512_loadu_ps(w + 16 * v);
                    _Pragma("GCC unroll 8") for (p = 0; p < PT; p++) {
                        __m512 xb = _mm512_set1_ps(x[p]);
                        _Pragma("GCC unroll 4") for (v = 0; v < V; v++) acc[v][p] = _mm512_fmadd_ps(wv[v], xb, acc[v][p]);
                    }
                }
        _Pragma("GCC unroll 8") for (p = 0; p < PT; p++)
            _Pragma("GCC unroll 4") for (v = 0; v < V; v++) _mm512_store_ps(s + p * width + 16 * v, acc[v][p]);
    }

    /* 16 x 16 transpose in registers: four butterfly stages (rows d = 8, 4, 2, 1 apart swap their lane blocks
       of d); cd5o_tr_idx[2 s] / [2 s + 1]: the permutes giving the pair's first / second row at stage s */
    static const int cd5o_tr_idx[8][16] __attribute__((aligned(64))) = {
        {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
        {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31},
        {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
        {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31},
        {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
        {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31},
        {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30},
        {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}};
    static inline __attribute__((always_inline)) CD5_TARGET void cd5o_tr16(__m512* r) {
        int s, i, d;
        _Pragma("GCC unroll 4") for (s = 0, d = 8; s < 4; s++, d >>= 1) {
            __m512i ia = _mm512_load_si512((const void*)cd5o_tr_idx[2 * s]);
            __m512i ib = _mm512_load_si512((const void*)cd5o_tr_idx[2 * s + 1]);
            _Pragma("GCC unroll 16") for (i = 0; i < 16; i++) {
                if (i & d) continue;
                __m512 a = r[i], b = r[i + d];
                r[i] = _mm512_permutex2var_ps(a, ia, b);
                r[i + d] = _mm512_permutex2var_ps(a, ib, b);
            }
        }
    }

    /* the sums [position][width] of qn positions -> yb's planes (P floats apart), the block's valid channels;
       rows past qn are read (the scratch has 16 spare rows) but not stored */
    static CD5_TARGET void cd5o_store(const float* sums, ptrdiff_t qn, ptrdiff_t width, ptrdiff_t valid, float* yb,
                                      ptrdiff_t P) {
        __m512 r[16];
        ptrdiff_t o0, q0;
        int k;
        for (o0 = 0; o0 < valid; o0 += 16) {
            int no = (int)(valid - o0 < 16 ? valid - o0 : 16);
            for (q0 = 0; q0 < qn; q0 += 16) {
                ptrdiff_t nq = qn - q0 < 16 ? qn - q0 : 16;
                __mmask16 m = (__mmask16)((1u << nq) - 1);
                _Pragma("GCC unroll 16") for (k = 0; k < 16; k++) r[k] = _mm512_load_ps(sums + (q0 + k) * width + o0);
                cd5o_tr16(r);
                for (k = 0; k < no; k++) _mm512_mask_storeu_ps(yb + (o0 + k) * P + q0, m, r[k]);
            }
        }
    }

    /* cd5o_pack_block not flipped: q (rowlen rows of width floats) = the transposed rows of w (valid rows of
       rowlen = inc K floats; zeros past them), by 16 x 16 tiles transposed in registers (CaffeNet conv3's 3.5 MB
       0.24 -> 0.14 ms; element by element the stores went 192 bytes apart) */
    static CD5_TARGET void cd5o_pack_tiles(const float* w, float* q, ptrdiff_t rowlen, ptrdiff_t valid,
                                           ptrdiff_t width) {
        __m512 r[16];
        ptrdiff_t l0, j0;
        int k;
        for (l0 = 0; l0 < width; l0 += 16)
            for (j0 = 0; j0 < rowlen; j0 += 16) {
                ptrdiff_t nj = rowlen - j0 < 16 ? rowlen - j0 : 16;
                __mmask16 m = (__mmask16)((1u << nj) - 1);
                _Pragma("GCC unroll 16") for (k = 0; k < 16; k++)
                    r[k] = l0 + k < valid ? _mm512_maskz_loadu_ps(m, w + (l0 + k) * rowlen + j0) : _mm512_setzero_ps();
                cd5o_tr16(r);
                for (k = 0; k < nj; k++) _mm512_storeu_ps(q + (j0 + k) * width + l0, r[k]);
            }
    }

    #define CD5O_CASE(V, PT) case (V) * 16 + (PT): \\
        cd5o_tile(V, PT, xs, wr, s, nc, kh, kw, PL, OW, width, first, pb); break;

    static CD5_TARGET void cd5o_dispatch(int V, int PT, const float* xs, const float* wr, float* s, ptrdiff_t nc,
                                         ptrdiff_t kh, ptrdiff_t kw, ptrdiff_t PL, ptrdiff_t OW, ptrdiff_t width,
                                         int first, const float* pb) {
        switch (V * 16 + PT) {
            CD5O_CASE(1, 1) CD5O_CASE(1, 2) CD5O_CASE(1, 3) CD5O_CASE(1, 4)
            CD5O_CASE(1, 5) CD5O_CASE(1, 6) CD5O_CASE(1, 7) CD5O_CASE(1, 8)
            CD5O_CASE(2, 1) CD5O_CASE(2, 2) CD5O_CASE(2, 3) CD5O_CASE(2, 4)
            CD5O_CASE(2, 5) CD5O_CASE(2, 6) CD5O_CASE(2, 7) CD5O_CASE(2, 8)
            CD5O_CASE(3, 1) CD5O_CASE(3, 2) CD5O_CASE(3, 3) CD5O_CASE(3, 4)
            CD5O_CASE(3, 5) CD5O_CASE(3, 6) CD5O_CASE(3, 7) CD5O_CASE(3, 8)
        }
    }

    /* floats of a task's scratch: its shifted planes (none where the tasks read shared ones), then the sums
       (aligned: plus a line) */
    static ptrdiff_t cd5o_scratch(const cd_geom* d, int shared) {
        return (shared ? 0 : cd5_scratch(d)) + 16 + (cd5o_chunk + 16) * CD5O_BLOCK;
    }

    /* the oc forward of image n, group g, blocks b0..b1-1 (cd5o_block), positions q0..q1-1 (xc: cd5o_scratch
       floats; shared: the image's shifted planes of all channels, built once, or NULL). Per run of input
       channels (cd5_fwd_crun) their shifted planes are built (unless shared); per chunk of positions and
       block, the sums start from the bias (the first run) or y (a later one), take the run's channels a filter
       chunk at a time over every tile of the chunk, and go back into y. */
    static void cd5o_fwd_task(const cd_geom* d, const float* x, const float* wp, const float* bias, float* y,
                              float* xc, const float* shared, ptrdiff_t n, ptrdiff_t g, ptrdiff_t b0, ptrdiff_t b1,
                              ptrdiff_t q0, ptrdiff_t q1) {
        ptrdiff_t P = d->OH * d->OW, PL = cd5_plane(d), K = d->kh * d->kw, cb = shared ? d->cg : cd5_fwd_crun(d);
        ptrdiff_t b, c0, cc, qc, t, o, q;
        float* sums = xc + (shared ? 0 : cd5_scratch(d));
        float pb[CD5O_BLOCK];
        const float* wg = wp + g * cd5o_group_floats(d->og, d->cg, K);
        const float* planes = shared ? shared : xc;
        sums += (16 - ((size_t)sums / sizeof(float)) % 16) % 16;  /* 64-byte aligned */
        for (c0 = 0; c0 < d->cg; c0 += cb) {
            ptrdiff_t c1 = c0 + cb < d->cg ? c0 + cb : d->cg;
            if (!shared) cd5_shift_planes(d, x + (n * d->C + g * d->cg) * d->H * d->W, xc, c0, c1);
            for (qc = q0; qc < q1; qc += cd5o_chunk) {
                ptrdiff_t qn = q1 - qc < cd5o_chunk ? q1 - qc : cd5o_chunk;
                for (b = b0; b < b1; b++) {
                    ptrdiff_t ob, valid, width, ccn;
                    int V;
                    cd5o_block(d->og, b, &ob, &V);
                    width = 16 * V;
                    valid = d->og - ob < width ? d->og - ob : width;
                    ccn = cd5o_wbytes / (K * width * 4);
                    const float* wb = wg + ob * d->cg * K;
                    float* yb = y + (n * d->Co + g * d->og + ob) * P;
                    if (ccn < 1) ccn = 1;
                    if (c0 == 0) {
                        for (o = 0; o < width; o++) pb[o] = bias && o < valid ? bias[g * d->og + ob + o] : 0.0f;
                    } else {  /* a later run: the sums so far from y */
                        for (q = 0; q < qn; q++)
                            for (o = 0; o < width; o++) sums[q * width + o] = o < valid ? yb[o * P + qc + q] : 0.0f;
                    }
                    for (cc = c0; cc < c1; cc += ccn) {
                        ptrdiff_t nc = c1 - cc < ccn ? c1 - cc : ccn;
                        const float* xs = planes + (cc - c0) * d->kw * PL + qc;
                        const float* wr = wb + cc * K * width;
                        for (t = 0; t < qn; t += CD5O_PT) {
                            int PT = (int)(qn - t < CD5O_PT ? qn - t : CD5O_PT);
                            cd5o_dispatch(V, PT, xs + t, wr, sums + t * width, nc, d->kh, d->kw, PL, d->OW, width,
                                          cc == 0, pb);
                        }
                    }
                    cd5o_store(sums, qn, width, valid, yb + qc, P);
                }
            }
        }
    }
    /* the shifted planes of all channels of image n, group g (the tasks that share an image read them) */
    static void cd5o_build_planes(const cd_geom* d, const float* x, float* planes, ptrdiff_t n, ptrdiff_t g) {
        cd5_shift_planes(d, x + (n * d->C + g * d->cg) * d->H * d->W, planes, 0, d->cg);
    }
    #else
    static ptrdiff_t cd5o_scratch(const cd_geom* d, int shared) { (void)shared; return cd5_scratch(d); }
    static void cd5o_fwd_task(const cd_geom* d, const float* x, const float* wp, const float* bias, float* y,
                              float* xc, const float* shared, ptrdiff_t n, ptrdiff_t g, ptrdiff_t b0, ptrdiff_t b1,
                              ptrdiff_t q0, ptrdiff_t q1) {
        (void)d; (void)x; (void)wp; (void)bias; (void)y; (void)xc; (void)shared; (void)n; (void)g; (void)b0;
        (void)b1; (void)q0; (void)q1;  /* no AVX-512 build: never called (cd_avx512_supported() is 0) */
    }
    static void cd5o_build_planes(const cd_geom* d, const float* x, float* planes, ptrdiff_t n, ptrdiff_t g) {
        (void)d; (void)x; (void)planes; (void)n; (void)g;
    }
    static void cd5o_pack_tiles(const float* w, float* q, ptrdiff_t rowlen, ptrdiff_t valid, ptrdiff_t width) {
        ptrdiff_t l, j;
        for (l = 0; l < width; l++)
            for (j = 0; j < rowlen; j++) q[j * width + l] = l < valid ? w[l * rowlen + j] : 0.0f;
    }
    #endif


    /* -- weight gradient vectorized over output channels ("oc": any row width fills the lanes) -- */
    /* dy of each (image, group) transposed to [position][ogL] (L: the lanes, 8 with AVX2 or 16 with AVX-512;
       ogL: og rounded up to L, zeros past og), the images as planes of rows Wx = W + 2 pw, Hx Wx floats apart.
       A tile: R vectors of L output channels x T columns of dw's flattened (c, i, j) (k = (c kh + i) kw + j:
       a tile may span channels); per output position T image values are broadcast and R dy vectors loaded for
       R T FMAs (R T + T + 1 <= 16 ymm, or 32 zmm). Each lane sums its (o, k) over the positions in the same
       order for either L, so both give the same bits (backward_weight_oc keeps the image groups the same too). */
    #define CD_WO_ACC 96    /* floats of a tile's accumulators with L = 8: R T 8 <= 96 */
    #define CD5_WO_ACC 384  /* with L = 16: R T 16 <= 384 */
    typedef struct { ptrdiff_t g, o0, R, T, k0, off[14]; } cd_wotile;

    static int cd_wo_tmax(int R, int L) {
        if (L == 16) return R >= 4 ? 6 : R == 3 ? 7 : R == 2 ? 10 : 14;
        return R >= 3 ? 3 : R == 2 ? 5 : 7;
    }
    static ptrdiff_t cd_wo_acc(int L) { return L == 16 ? CD5_WO_ACC : CD_WO_ACC; }
    static ptrdiff_t cd_ogl(const cd_geom* d, int L) { return L * ((d->og + L - 1) / L); }

    /* the tiles of every group (tl NULL: count only); off: each column's offset in the group's planes */
    static ptrdiff_t cd_wo_tiles(const cd_geom* d, cd_wotile* tl, int L) {
        ptrdiff_t g, v, k, u, n = 0, nv = (d->og + L - 1) / L, K = d->kh * d->kw, ncol = d->cg * K;
        ptrdiff_t Wx = d->W + 2 * d->pw, PX = d->Hp * Wx;
        for (g = 0; g < d->G; g++)
            for (v = 0; v < nv; v += 4) {
                int R = (int)(nv - v < 4 ? nv - v : 4), T = cd_wo_tmax(R, L);
                for (k = 0; k < ncol; k += T, n++) {
                    if (!tl) continue;
                    tl[n].g = g; tl[n].o0 = v * L; tl[n].R = R; tl[n].k0 = k;
                    tl[n].T = ncol - k < T ? ncol - k : T;
                    for (u = 0; u < tl[n].T; u++) {
                        ptrdiff_t c = (k + u) / K, tap = (k + u) % K;
                        tl[n].off[u] = c * PX + (tap / d->kw) * Wx + tap % d->kw;
                    }
                }
            }
        return n;
    }

    #if CD_X86
    /* the 8 x 8 block at s (rows ss floats apart) transposed to d (rows ds apart) */
    static inline __attribute__((always_inline)) CD_TARGET void cd_tr8(const float* s, ptrdiff_t ss, float* d,
                                                                        ptrdiff_t ds) {
        __m256 r[8], t[8], u[8];
        int k;
        _Pragma("GCC unroll 8") for (k = 0; k < 8; k++) r[k] = _mm256_loadu_ps(s + k * ss);
        _Pragma("GCC unroll 4") for (k = 0; k < 8; k += 2) {
            t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
            t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
        }
        _Pragma("GCC unroll 2") for (k = 0; k < 8; k += 4) {
            u[k] = _mm256_shuffle_ps(t[k], t[k + 2], 0x44);
            u[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], 0xEE);
            u[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0x44);
            u[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0xEE);
        }
        _Pragma("GCC unroll 4") for (k = 0; k < 4; k++) {
            _mm256_storeu_ps(d + k * ds, _mm256_permute2f128_ps(u[k], u[k + 4], 0x20));
            _mm256_storeu_ps(d + (k + 4) * ds, _mm256_permute2f128_ps(u[k], u[k + 4], 0x31));
        }
    }
    #endif

    /* one image's dy (Co, P) -> [G][P][og8] (og8: ogL, rows of L floats; 8 x 8 blocks transposed in registers,
       the edges one by one) */
    static CD_TARGET void cd_dy_trans(const cd_geom* d, const float* dy, float* dst, int L) {
        ptrdiff_t g, o, p, o8 = 0, p8 = 0, P = d->OH * d->OW, og8 = cd_ogl(d, L);
        for (g = 0; g < d->G; g++) {
            const float* sg = dy + g * d->og * P;
            float* dg = dst + g * P * og8;
    #if CD_X86
            o8 = d->og / 8 * 8;
            p8 = P / 8 * 8;
            for (o = 0; o < o8; o += 8)
                for (p = 0; p < p8; p += 8) cd_tr8(sg + o * P + p, P, dg + p * og8 + o, og8);
    #endif
            for (p = 0; p < P; p++)
                for (o = p < p8 ? o8 : 0; o < og8; o++) dg[p * og8 + o] = o < d->og ? sg[o * P + p] : 0.0f;
        }
    }

    #if CD_X86
    /* accm (R T vectors) += over output rows y0..y1-1: dy vectors (dyb: the tile's first channel at position 0)
       times the image broadcast at each column's offset (xi: the group's first plane) */
    static inline __attribute__((always_inline)) CD_TARGET void cd_wo_tile(
            const int R, const int T, const float* xi, const ptrdiff_t* off, const float* dyb, float* accm,
            ptrdiff_t y0, ptrdiff_t y1, ptrdiff_t OW, ptrdiff_t Wx, ptrdiff_t og8) {
        __m256 acc[4][7], b[7];
        const float* xt[7];
        ptrdiff_t y, x;
        int r, t;
        _Pragma("GCC unroll 8") for (r = 0; r < R; r++)
            _Pragma("GCC unroll 8") for (t = 0; t < T; t++) acc[r][t] = _mm256_loadu_ps(accm + (r * T + t) * 8);
        _Pragma("GCC unroll 8") for (t = 0; t < T; t++) xt[t] = xi + off[t];
        for (y = y0; y < y1; y++) {
            const float* dp = dyb + y * OW * og8;
            ptrdiff_t xr = y * Wx;
            for (x = 0; x < OW; x++, dp += og8) {
                _Pragma("GCC unroll 8") for (t = 0; t < T; t++) b[t] = _mm256_broadcast_ss(xt[t] + xr + x);
                _Pragma("GCC unroll 8") for (r = 0; r < R; r++) {
                    __m256 dv = _mm256_loadu_ps(dp + r * 8);
                    __asm__("" : "+x"(dv));  /* one load feeding T FMAs, not T loads folded into them */
                    _Pragma("GCC unroll 8") for (t = 0; t < T; t++) acc[r][t] = _mm256_fmadd_ps(dv, b[t], acc[r][t]);
                }
            }
        }
        _Pragma("GCC unroll 8") for (r = 0; r < R; r++)
            _Pragma("GCC unroll 8") for (t = 0; t < T; t++) _mm256_storeu_ps(accm + (r * T + t) * 8, acc[r][t]);
    }

    #define CD_WO_CASE(R, T) case (R) * 8 + (T): \\
        cd_wo_tile(R, T, xi, off, dyb, accm, y0, y1, OW, Wx, og8); break;

    static CD_TARGET void cd_wo_dispatch(int R, int T, const float* xi, const ptrdiff_t* off, const float* dyb,
                                         float* accm, ptrdiff_t y0, ptrdiff_t y1, ptrdiff_t OW, ptrdiff_t Wx,
                                         ptrdiff_t og8) {
        switch (R * 8 + T) {
            CD_WO_CASE(1, 1) CD_WO_CASE(1, 2) CD_WO_CASE(1, 3) CD_WO_CASE(1, 4) CD_WO_CASE(1, 5) CD_WO_CASE(1, 6)
            CD_WO_CASE(1, 7)
            CD_WO_CASE(2, 1) CD_WO_CASE(2, 2) CD_WO_CASE(2, 3) CD_WO_CASE(2, 4) CD_WO_CASE(2, 5)
            CD_WO_CASE(3, 1) CD_WO_CASE(3, 2) CD_WO_CASE(3, 3)
            CD_WO_CASE(4, 1) CD_WO_CASE(4, 2) CD_WO_CASE(4, 3)
        }
    }
    #else
    static void cd_wo_dispatch(int R, int T, const float* xi, const ptrdiff_t* off, const float* dyb,
                               float* accm, ptrdiff_t y0, ptrdiff_t y1, ptrdiff_t OW, ptrdiff_t Wx, ptrdiff_t og8) {
        ptrdiff_t y, x;
        int r, t, l;
        for (y = y0; y < y1; y++)
            for (x = 0; x < OW; x++)
                for (r = 0; r < R; r++)
                    for (t = 0; t < T; t++)
                        for (l = 0; l < 8; l++)
                            accm[(r * T + t) * 8 + l] += dyb[(y * OW + x) * og8 + r * 8 + l] * xi[off[t] + y * Wx + x];
    }
    #endif

    #if CD_X86
    /* cd_wo_tile with 16 lanes (AVX-512): R vectors of 16 output channels x T columns, R T <= 24 */
    static inline __attribute__((always_inline)) CD5_TARGET void cd5_wo_tile(
            const int R, const int T, const float* xi, const ptrdiff_t* off, const float* dyb, float* accm,
            ptrdiff_t y0, ptrdiff_t y1, ptrdiff_t OW, ptrdiff_t Wx, ptrdiff_t og16) {
        __m512 acc[4][14], b[14];
        const float* xt[14];
        ptrdiff_t y, x;
        int r, t;
        _Pragma("GCC unroll 16") for (r = 0; r < R; r++)
            _Pragma("GCC unroll 16") for (t = 0; t < T; t++) acc[r][t] = _mm512_loadu_ps(accm + (r * T + t) * 16);
        _Pragma("GCC unroll 16") for (t = 0; t < T; t++) xt[t] = xi + off[t];
        for (y = y0; y < y1; y++) {
            const float* dp = dyb + y * OW * og16;
            ptrdiff_t xr = y * Wx;
            for (x = 0; x < OW; x++, dp += og16) {
                _Pragma("GCC unroll 16") for (t = 0; t < T; t++) b[t] = _mm512_set1_ps(xt[t][xr + x]);
                _Pragma("GCC unroll 16") for (r = 0; r < R; r++) {
                    __m512 dv = _mm512_loadu_ps(dp + r * 16);
                    __asm__("" : "+v"(dv));  /* one load feeding T FMAs, not T loads folded into them */
                    _Pragma("GCC unroll 16") for (t = 0; t < T; t++) acc[r][t] = _mm512_fmadd_ps(dv, b[t], acc[r][t]);
                }
            }
        }
        _Pragma("GCC unroll 16") for (r = 0; r < R; r++)
            _Pragma("GCC unroll 16") for (t = 0; t < T; t++) _mm512_storeu_ps(accm + (r * T + t) * 16, acc[r][t]);
    }

    #define CD5_WO_CASE(R, T) case (R) * 16 + (T): \\
        cd5_wo_tile(R, T, xi, off, dyb, accm, y0, y1, OW, Wx, og16); break;

    static CD5_TARGET void cd5_wo_dispatch(int R, int T, const float* xi, const ptrdiff_t* off, const float* dyb,
                                           float* accm, ptrdiff_t y0, ptrdiff_t y1, ptrdiff_t OW, ptrdiff_t Wx,
                                           ptrdiff_t og16) {
        switch (R * 16 + T) {
            CD5_WO_CASE(1, 1) CD5_WO_CASE(1, 2) CD5_WO_CASE(1, 3) CD5_WO_CASE(1, 4) CD5_WO_CASE(1, 5)
            CD5_WO_CASE(1, 6) CD5_WO_CASE(1, 7) CD5_WO_CASE(1, 8) CD5_WO_CASE(1, 9) CD5_WO_CASE(1, 10)
            CD5_WO_CASE(1, 11) CD5_WO_CASE(1, 12) CD5_WO_CASE(1, 13) CD5_WO_CASE(1, 14)
            CD5_WO_CASE(2, 1) CD5_WO_CASE(2, 2) CD5_WO_CASE(2, 3) CD5_WO_CASE(2, 4) CD5_WO_CASE(2, 5)
            CD5_WO_CASE(2, 6) CD5_WO_CASE(2, 7) CD5_WO_CASE(2, 8) CD5_WO_CASE(2, 9) CD5_WO_CASE(2, 10)
            CD5_WO_CASE(3, 1) CD5_WO_CASE(3, 2) CD5_WO_CASE(3, 3) CD5_WO_CASE(3, 4) CD5_WO_CASE(3, 5)
            CD5_WO_CASE(3, 6) CD5_WO_CASE(3, 7)
            CD5_WO_CASE(4, 1) CD5_WO_CASE(4, 2) CD5_WO_CASE(4, 3) CD5_WO_CASE(4, 4) CD5_WO_CASE(4, 5)
            CD5_WO_CASE(4, 6)
        }
    }
    #endif

    /* bsum (Co, float64) += the sums over positions of one image's transposed dy (float32 over its positions);
       sacc: G ogL floats of scratch */
    static CD_TARGET void cd_dy_sum(const cd_geom* d, const float* dyt, float* sacc, double* bsum, int L) {
        ptrdiff_t g, o = 0, p, k, P = d->OH * d->OW, og8 = cd_ogl(d, L);
        memset(sacc, 0, (size_t)(d->G * og8) * sizeof(float));
        for (g = 0; g < d->G; g++) {
            const float* dg = dyt + g * P * og8;
            float* sg = sacc + g * og8;
    #if CD_X86
            /* runs of 32 channels summed in registers (a chain of adds through sacc in memory per position
               cost a fifth of CIFAR10-quick conv1's weight diff); each lane adds its positions in order */
            for (o = 0; o + 32 <= og8; o += 32) {
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                for (p = 0; p < P; p++) {
                    const float* r = dg + p * og8 + o;
                    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(r));
                    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(r + 8));
                    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(r + 16));
                    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(r + 24));
                }
                _mm256_storeu_ps(sg + o, a0);
                _mm256_storeu_ps(sg + o + 8, a1);
                _mm256_storeu_ps(sg + o + 16, a2);
                _mm256_storeu_ps(sg + o + 24, a3);
            }
    #endif
            for (p = 0; p < P; p++)
                for (k = o; k < og8; k++) sg[k] += dg[p * og8 + k];
        }
        for (g = 0; g < d->G; g++)
            for (o = 0; o < d->og; o++) bsum[g * d->og + o] += sacc[g * og8 + o];
    }

    /* a task: images n0..n1-1 (of x, dy), tiles t0..t1-1. Each image is padded (xw: C planes) and its dy
       transposed (dyt: G P ogL floats) here, so both stay in this core's caches, then the tiles run a band
       of output rows (about cd_wo_band_bytes of dyt) at a time so that the band stays in L1 across them.
       part (the tiles' float32 sums, tile t at (t - t0) cd_wo_acc(L), then G ogL floats of scratch; over at most
       about 1,024 positions: one image or as many whole ones) is then added to accd's float64 sums (this image
       group's, indexed by tile). bsum: the group's bias sums, or NULL. */
    static ptrdiff_t cd_wo_band_bytes = 16 << 10;
    static void cd_wo_task(const cd_geom* d, const float* x, const float* dy, const cd_wotile* tl,
                           ptrdiff_t n0, ptrdiff_t n1, ptrdiff_t t0, ptrdiff_t t1, float* xw, float* dyt,
                           float* part, double* accd, double* bsum, int L) {
        ptrdiff_t Wx = d->W + 2 * d->pw, PX = d->Hp * Wx, P = d->OH * d->OW, og8 = cd_ogl(d, L), A = cd_wo_acc(L);
        ptrdiff_t fl = P >= 1024 ? 1 : 1024 / P, band = cd_wo_band_bytes / (d->OW * og8 * 4);
        ptrdiff_t m0, m1, n, y0, t, l;
        if (band * d->OW < 64) band = (64 + d->OW - 1) / d->OW;  /* a tile's loads and stores: over >= 64 positions */
        for (m0 = n0; m0 < n1; m0 = m1) {
            m1 = m0 + fl < n1 ? m0 + fl : n1;
            memset(part, 0, (size_t)((t1 - t0) * A) * sizeof(float));
            for (n = m0; n < m1; n++) {
                cd_pad_planes(d, x + n * d->C * d->H * d->W, xw, d->C, PX, Wx);
                cd_dy_trans(d, dy + n * d->Co * P, dyt, L);
                if (bsum) cd_dy_sum(d, dyt, part + A * (t1 - t0), bsum, L);  /* scratch: past the tiles */
                for (y0 = 0; y0 < d->OH; y0 += band) {
                    ptrdiff_t y1 = y0 + band < d->OH ? y0 + band : d->OH;
                    for (t = t0; t < t1; t++) {
                        const cd_wotile* w = tl + t;
                        const float* xi = xw + w->g * d->cg * PX;
                        const float* dyb = dyt + w->g * P * og8 + w->o0;
                        float* accm = part + (t - t0) * A;
    #if CD_X86
                        if (L == 16) {
                            cd5_wo_dispatch((int)w->R, (int)w->T, xi, w->off, dyb, accm, y0, y1, d->OW, Wx, og8);
                            continue;
                        }
    #endif
                        cd_wo_dispatch((int)w->R, (int)w->T, xi, w->off, dyb, accm, y0, y1, d->OW, Wx, og8);
                    }
                }
            }
            for (l = 0; l < (t1 - t0) * A; l++) accd[t0 * A + l] += part[l];
        }
    }

    /* dw += the tiles' float64 sums (rounded once) */
    static void cd_wo_store(const cd_geom* d, const cd_wotile* tl, ptrdiff_t ntl, const double* accd, float* dw,
                            int L) {
        ptrdiff_t t, r, u, l, ncol = d->cg * d->kh * d->kw, A = cd_wo_acc(L);
        for (t = 0; t < ntl; t++)
            for (r = 0; r < tl[t].R; r++)
                for (u = 0; u < tl[t].T; u++)
                    for (l = 0; l < L; l++) {
                        ptrdiff_t o = tl[t].o0 + r * L + l;
                        if (o >= d->og) break;
                        float* p = dw + (tl[t].g * d->og + o) * ncol + tl[t].k0 + u;
                        *p = (float)((double)*p + accd[t * A + (r * tl[t].T + u) * L + l]);
                    }
    }
    """
    ctypedef struct cd_geom:
        Py_ssize_t N, C, H, W, Co, G, cg, og, kh, kw, ph, pw, OH, OW, Hp, Wp, OWv, nb
    int cd_supported() nogil
    int cd_avx512_supported() nogil
    Py_ssize_t cd_run_bytes
    Py_ssize_t cd5_run_bytes
    Py_ssize_t cd5_xmax
    Py_ssize_t cd5_scratch(const cd_geom* d) nogil
    void cd5_fwd_task(const cd_geom* d, const float* x, const float* wp, const float* bias, float* y,
                      float* xc, Py_ssize_t n, Py_ssize_t g, Py_ssize_t b0, Py_ssize_t b1) nogil
    Py_ssize_t cd5o_chunk
    Py_ssize_t cd5o_wbytes
    Py_ssize_t cd5o_group_floats(Py_ssize_t outc, Py_ssize_t inc, Py_ssize_t K) nogil
    Py_ssize_t cd5o_nblocks(Py_ssize_t outc) nogil
    Py_ssize_t cd5o_scratch(const cd_geom* d, int shared) nogil
    void cd5o_pack_block(const float* w, float* p, Py_ssize_t og, Py_ssize_t cg, Py_ssize_t kh, Py_ssize_t kw,
                         int flip, Py_ssize_t g, Py_ssize_t b) nogil
    void cd5o_fwd_task(const cd_geom* d, const float* x, const float* wp, const float* bias, float* y,
                       float* xc, const float* shared, Py_ssize_t n, Py_ssize_t g, Py_ssize_t b0, Py_ssize_t b1,
                       Py_ssize_t q0, Py_ssize_t q1) nogil
    void cd5o_build_planes(const cd_geom* d, const float* x, float* planes, Py_ssize_t n, Py_ssize_t g) nogil
    Py_ssize_t cd5_fwd_crun(const cd_geom* d) nogil
    void cd_init(cd_geom* d, Py_ssize_t N, Py_ssize_t C, Py_ssize_t H, Py_ssize_t W, Py_ssize_t Co,
                 Py_ssize_t G, Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t ph, Py_ssize_t pw) nogil
    void cd_pad(const cd_geom* d, const float* x, float* pad, Py_ssize_t nc) nogil
    void cd_pack_block(const float* w, float* p, Py_ssize_t og, Py_ssize_t cg, Py_ssize_t kh, Py_ssize_t kw,
                       int flip, Py_ssize_t g, Py_ssize_t b) nogil
    void cd_fwd_task(const cd_geom* d, const float* x, const float* wp, const float* bias, float* y,
                     float* pad, Py_ssize_t n, Py_ssize_t g, Py_ssize_t b0, Py_ssize_t b1) nogil
    ctypedef struct cd_wotile:
        Py_ssize_t g, o0, R, T, k0
    Py_ssize_t cd_wo_band_bytes
    Py_ssize_t cd_wo_tiles(const cd_geom* d, cd_wotile* tl, int L) nogil
    Py_ssize_t cd_wo_acc(int L) nogil
    void cd_dy_trans(const cd_geom* d, const float* dy, float* dst, int L) nogil
    void cd_pad_planes(const cd_geom* d, const float* x, float* pad, Py_ssize_t nc, Py_ssize_t plane,
                       Py_ssize_t row) nogil
    void cd_wo_task(const cd_geom* d, const float* x, const float* dy, const cd_wotile* tl, Py_ssize_t n0,
                    Py_ssize_t n1, Py_ssize_t t0, Py_ssize_t t1, float* xw, float* dyt, float* part, double* accd,
                    double* bsum, int L) nogil
    void cd_wo_store(const cd_geom* d, const cd_wotile* tl, Py_ssize_t ntl, const double* accd, float* dw,
                     int L) nogil


def set_run_bytes(Py_ssize_t nbytes):
    """The AVX2 forward's channel-run budget (bytes of a tile's input rows and filters; for benchmarks and
    tests); returns the previous one."""
    global cd_run_bytes
    prev, cd_run_bytes = cd_run_bytes, nbytes
    return prev


def set_avx512_run_bytes(Py_ssize_t nbytes):
    """The AVX-512 forward's channel-run budget (bytes of a run's shifted planes; at least 4 channels a run);
    returns the previous one."""
    global cd5_run_bytes
    prev, cd5_run_bytes = cd5_run_bytes, nbytes
    return prev


def set_avx512_tile(Py_ssize_t vectors):
    """The AVX-512 forward's vectors of 16 positions per tile, 1-6 (for benchmarks and tests)."""
    global cd5_xmax
    if not 1 <= vectors <= 6:
        raise ValueError("conv_direct: 1 to 6 vectors a tile")
    cd5_xmax = vectors


def supported() -> bool:
    """Whether the kernels run vectorized here: x86-64 built with GCC/Clang, and the CPU has AVX2 and FMA."""
    return bool(cd_supported())


def avx512_supported() -> bool:
    """Whether the AVX-512 variants can run here: supported(), and the CPU (and OS) has AVX-512F."""
    return bool(cd_avx512_supported())


# Which variant forward and backward_weight_oc run: True, the AVX-512 ones (16 lanes) where the CPU has
# AVX-512F, 0.5-0.66x the AVX2 time on Zen 5 at CIFAR10-quick's shapes (bench/ab_conv_dense.py --modes
# avx2,avx512; bench/README.md, session 10); False, or CAFFE_CONV_DENSE_AVX512=0 (this module alone) or
# CAFFE_KERNELS_AVX512=0 (every AVX-512 build, as caffe.layers._cpu reads it) in the environment: the AVX2
# ones (benchmarks A/B the two). Both give the same bits: each output's FMAs and each weight diff's sums run
# in the same order. conv_cpu.dense_rule reads it too (AVX-512 takes wider layers dense).
AVX512 = (avx512_supported() and os.environ.get("CAFFE_CONV_DENSE_AVX512", "1") != "0"
          and os.environ.get("CAFFE_KERNELS_AVX512", "1") != "0")


cdef bint _avx512() except -1:
    if AVX512 and not cd_avx512_supported():
        raise RuntimeError("conv_direct: AVX512 is set but this CPU has no AVX-512F")
    return bool(AVX512)


# The AVX-512 forward's tiles: True, vectors over output channels (cd5o_*: aligned filter loads and scalar
# broadcasts of the inputs, 1.2x the position-vector tiles' speed on the Intel Xeon VM's CaffeNet and ResNet-50
# layers; bench/README.md, session 20); False (or CAFFE_CONV_DENSE_OC=0), the position-vector tiles (cd5_*). The
# same bits either way. pack_weights / packed_size follow these settings: set them before packing (conv_cpu
# packs on every call).
OC_FORWARD = os.environ.get("CAFFE_CONV_DENSE_OC", "1") != "0"
# ...on layers (of the forward call: a bottom diff's are the flipped ones) with OC_MIN_OUT output channels a group
# or more and a kernel_dim (inc kh kw) of OC_MIN_KD or more. Below, the position-vector tiles won (8 x 28 x 28
# planes, oc / position time): 16 outputs (one vector, its tile bound by the broadcasts) 1.1-1.6x; kernel_dim
# 27-200 1.07-1.54x (the sums' transposes and scratch traffic against few FMAs an output); from 288 0.80-0.96x.
OC_MIN_OUT = 32
OC_MIN_KD = 256


cdef bint _oc(Py_ssize_t outc, Py_ssize_t inc, Py_ssize_t K) except -1:
    return _avx512() and bool(OC_FORWARD) and outc >= OC_MIN_OUT and inc * K >= OC_MIN_KD


# The oc forward's scratch (the threads' shifted planes and sums, the shared planes): one buffer per Python
# thread, kept between calls (a malloc per call and thread came from glibc's thread arenas, which return freed
# memory to the OS: page faults on every call, 0.1-0.3 ms of a batch-1 layer of ~1 ms).
_scratch_local = threading.local()


cdef float* _scratch(Py_ssize_t n) except NULL:
    buf = getattr(_scratch_local, "buf", None)
    if buf is None or buf.shape[0] < n:
        buf = _scratch_local.buf = np.empty(max(n, 1), np.float32)
    cdef float[::1] view = buf
    return &view[0]


def set_oc_tiling(Py_ssize_t chunk, Py_ssize_t wbytes):
    """The oc forward's positions a chunk (a multiple of 8, >= 8) and filter bytes a chunk of input channels
    (for benchmarks and tests); returns the previous pair."""
    global cd5o_chunk, cd5o_wbytes
    if chunk < 8 or chunk % 8 or wbytes < 1:
        raise ValueError("conv_direct: chunk a multiple of 8, filter bytes positive")
    prev = (cd5o_chunk, cd5o_wbytes)
    cd5o_chunk, cd5o_wbytes = chunk, wbytes
    return prev


cdef cd_geom _geometry(Py_ssize_t N, Py_ssize_t C, Py_ssize_t H, Py_ssize_t W, Py_ssize_t Co, Py_ssize_t G,
                       Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t ph, Py_ssize_t pw, Py_ssize_t OH,
                       Py_ssize_t OW) except *:
    cdef cd_geom d
    if min(N, C, H, W, Co, G, kh, kw, OH, OW) < 1 or min(ph, pw) < 0:
        raise ValueError("conv_direct: sizes must be positive (pads non-negative)")
    if C % G or Co % G:
        raise ValueError("conv_direct: group must divide the input and output channels")
    cd_init(&d, N, C, H, W, Co, G, kh, kw, ph, pw)
    if d.OH != OH or d.OW != OW:
        raise ValueError("conv_direct: output size does not match the geometry (stride 1, dilation 1)")
    return d


def packed_size(Py_ssize_t G, Py_ssize_t og, Py_ssize_t cg, Py_ssize_t kh, Py_ssize_t kw, bint flip=False):
    """Length of pack_weights' output for Co = G og output and C = G cg input channels."""
    cdef Py_ssize_t outc = cg if flip else og, inc = og if flip else cg
    if _oc(outc, inc, kh * kw):
        return G * cd5o_group_floats(outc, inc, kh * kw)
    return G * ((outc + 3) // 4) * 4 * inc * kh * kw


def pack_weights(const float[::1] w, float[::1] packed, Py_ssize_t G, Py_ssize_t og, Py_ssize_t cg,
                 Py_ssize_t kh, Py_ssize_t kw, bint flip=False):
    """packed = w (G og, cg, kh, kw) in forward's layout; flip: the filters of the adjoint (bottom diff)."""
    if w.shape[0] < G * og * cg * kh * kw:
        raise ValueError("conv_direct: weight buffer too small")
    if packed.shape[0] < packed_size(G, og, cg, kh, kw, flip):
        raise ValueError("conv_direct: packed buffer too small")
    cdef Py_ssize_t outc = cg if flip else og
    cdef bint oc = _oc(outc, og if flip else cg, kh * kw)
    cdef Py_ssize_t nb = cd5o_nblocks(outc) if oc else (outc + 3) // 4, t
    cdef const float* ws = &w[0]
    cdef float* ps = &packed[0]
    cdef int nt = _threads(packed_size(G, og, cg, kh, kw, flip))
    with nogil:
        for t in prange(G * nb, schedule="static", num_threads=nt):
            if oc:
                cd5o_pack_block(ws, ps, og, cg, kh, kw, flip, t // nb, t % nb)
            else:
                cd_pack_block(ws, ps, og, cg, kh, kw, flip, t // nb, t % nb)


def forward(const float[::1] x, const float[::1] packed, const float[::1] bias, float[::1] y,
            Py_ssize_t N, Py_ssize_t C, Py_ssize_t H, Py_ssize_t W, Py_ssize_t Co, Py_ssize_t G,
            Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t ph, Py_ssize_t pw, Py_ssize_t OH, Py_ssize_t OW):
    """y (N, Co, OH, OW) = the convolution of x (N, C, H, W) with the packed filters (+ bias unless None)."""
    cdef cd_geom d = _geometry(N, C, H, W, Co, G, kh, kw, ph, pw, OH, OW)
    if x.shape[0] < N * C * H * W or y.shape[0] < N * Co * OH * OW:
        raise ValueError("conv_direct: image or output buffer too small")
    if packed.shape[0] < packed_size(G, Co // G, C // G, kh, kw, False):
        raise ValueError("conv_direct: packed filter buffer too small")
    if bias is not None and bias.shape[0] < Co:
        raise ValueError("conv_direct: bias buffer too small")
    cdef const float* xs = &x[0]
    cdef const float* ws = &packed[0]
    cdef const float* bs = &bias[0] if bias is not None else NULL
    cdef float* ys = &y[0]
    cdef int nt = _threads(N * Co * OH * OW * d.cg * kh * kw)
    cdef bint v512 = _avx512(), oc = _oc(d.og, d.cg, kh * kw)
    # tasks: (image, group, run of channel blocks[, run of positions]); split the blocks when there are few
    # images, and (the oc forward) then the positions, in whole tiles of 8
    cdef Py_ssize_t nb = cd5o_nblocks(d.og) if oc else d.nb, P = OH * OW
    cdef Py_ssize_t runs = 1, qruns = 1, qper = P, t, n, g, r, rq, per, padn
    while N * G * runs < 4 * nt and runs < nb:
        runs += 1
    per = (nb + runs - 1) // runs
    runs = (nb + per - 1) // per
    if oc:
        while N * G * runs * qruns < 4 * nt and qruns * 64 < P:
            qruns += 1
        qper = 8 * ((P + 8 * qruns - 1) // (8 * qruns))
        qruns = (P + qper - 1) // qper
    cdef float* pad
    # tasks that share an image (few images, their blocks or positions split) read its shifted planes built once
    # (each task built them again: 12 times ResNet-50 res4's 0.7 MB at batch 1)
    cdef Py_ssize_t per_plane = cd5_scratch(&d)
    cdef bint share = oc and runs * qruns > 1 and cd5_fwd_crun(&d) == d.cg
    padn = cd5o_scratch(&d, share) if oc else (per_plane if v512 else d.cg * d.Hp * d.Wp)
    cdef float* planes = NULL
    cdef float* pads = NULL
    if oc:  # the kept scratch: nt pads, then the shared planes
        pads = _scratch(nt * padn + (N * G * per_plane if share else 0))
        if share:
            planes = pads + nt * padn
            with nogil:
                for t in prange(N * G, schedule="static", num_threads=nt):
                    cd5o_build_planes(&d, xs, planes + t * per_plane, t // G, t % G)
    with nogil, parallel(num_threads=nt):
        pad = pads + threadid() * padn if oc else <float*>malloc(padn * sizeof(float))
        if pad == NULL:
            with gil:
                raise MemoryError()
        else:
            for t in prange(N * G * runs * qruns, schedule="dynamic"):
                rq = t % qruns
                n = t // (G * runs * qruns)
                g = (t // (runs * qruns)) % G
                r = (t // qruns) % runs
                if oc:
                    cd5o_fwd_task(&d, xs, ws, bs, ys, pad, planes + (n * G + g) * per_plane if share else NULL,
                                  n, g, r * per, min(r * per + per, nb), rq * qper, min(rq * qper + qper, P))
                elif v512:
                    cd5_fwd_task(&d, xs, ws, bs, ys, pad, n, g, r * per, min(r * per + per, d.nb))
                else:
                    cd_fwd_task(&d, xs, ws, bs, ys, pad, n, g, r * per, min(r * per + per, d.nb))
            if not oc:
                free(pad)


# backward_weight_oc's tasks: (group of images, run of tiles) pairs, about WO_TASKS_PER_THREAD a thread.
# The images go in min(N, WO_IMAGE_GROUPS) groups whatever the thread count (each group's sums are added
# in order, so results do not depend on the threads); runs of tiles are split when groups are too few
# (each run pads and transposes its group's images again, but that is little work).
WO_TASKS_PER_THREAD = 4
WO_IMAGE_GROUPS = 8
WO_GROUP_BYTES = 4 << 20  # at most this many bytes of the groups' float64 sums (fewer groups on wide layers)


def set_wo_band_bytes(Py_ssize_t nbytes):
    """backward_weight_oc's band of output rows: about this many bytes of transposed dy (for benchmarks)."""
    global cd_wo_band_bytes
    cd_wo_band_bytes = nbytes


def backward_weight_oc(const float[::1] x, const float[::1] dy, float[::1] dw,
                       Py_ssize_t N, Py_ssize_t C, Py_ssize_t H, Py_ssize_t W, Py_ssize_t Co, Py_ssize_t G,
                       Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t ph, Py_ssize_t pw, Py_ssize_t OH, Py_ssize_t OW,
                       float[::1] bias_diff=None):
    """The weight diff, vectorized over output channels (rows of any width fill the lanes; an earlier kernel
    vectorized over output x lost lanes on rows narrower than the vectors): dw (Co, cg, kh, kw) += the correlation of dy (N, Co, OH, OW) with x (N, C, H, W), and
    bias_diff (Co) += the sums of dy unless None. Sums are float32 over at most about 1,024 positions,
    then float64 (rounded once into dw, bias_diff); the same for any thread count and schedule."""
    cdef cd_geom d = _geometry(N, C, H, W, Co, G, kh, kw, ph, pw, OH, OW)
    if x.shape[0] < N * C * H * W or dy.shape[0] < N * Co * OH * OW:
        raise ValueError("conv_direct: image or diff buffer too small")
    if dw.shape[0] < Co * d.cg * kh * kw:
        raise ValueError("conv_direct: weight diff buffer too small")
    if bias_diff is not None and bias_diff.shape[0] < Co:
        raise ValueError("conv_direct: bias diff buffer too small")
    cdef int L = 16 if _avx512() else 8  # the lanes: output channels a vector
    cdef Py_ssize_t PX = d.Hp * (W + 2 * pw), P = OH * OW, ogl = L * ((d.og + L - 1) // L), A = cd_wo_acc(L)
    cdef Py_ssize_t ntl = cd_wo_tiles(&d, NULL, L), i, j, l, ig, tg
    cdef int nt = _threads(N * Co * OH * OW * d.cg * kh * kw)
    cdef Py_ssize_t want = WO_TASKS_PER_THREAD * nt
    # the image groups by the AVX2 tiles' bytes whatever L (the same groups: the same bits for either)
    cdef Py_ssize_t nig = max(1, min(N, WO_IMAGE_GROUPS, WO_GROUP_BYTES // (cd_wo_tiles(&d, NULL, 8) * 96 * 8)))
    cdef Py_ssize_t ntg = max(1, min(ntl, (want + nig - 1) // nig)), ntask = nig * ntg
    cdef Py_ssize_t run = (ntl + ntg - 1) // ntg + 1  # the most tiles a task runs
    cdef Py_ssize_t scratch = C * PX + G * P * ogl + run * A + G * ogl
    cdef cd_wotile* tl = <cd_wotile*>malloc(ntl * sizeof(cd_wotile))
    cdef double* accd = <double*>calloc(nig * ntl * A, sizeof(double))
    cdef double* bsd = <double*>calloc(nig * Co, sizeof(double))
    cdef const float* xs = &x[0]
    cdef const float* dys = &dy[0]
    cdef bint bias = bias_diff is not None
    cdef float* buf
    cdef double s
    try:
        if tl == NULL or accd == NULL or bsd == NULL:
            raise MemoryError()
        cd_wo_tiles(&d, tl, L)
        with nogil, parallel(num_threads=nt):
            buf = <float*>malloc(scratch * sizeof(float))
            if buf == NULL:
                with gil:
                    raise MemoryError()
            else:
                for i in prange(ntask, schedule="dynamic"):
                    ig = i // ntg
                    tg = i % ntg
                    cd_wo_task(&d, xs, dys, tl, N * ig // nig, N * (ig + 1) // nig, ntl * tg // ntg,
                               ntl * (tg + 1) // ntg, buf, buf + C * PX, buf + C * PX + G * P * ogl,
                               accd + ig * ntl * A, bsd + ig * Co if bias and tg == 0 else NULL, L)
                free(buf)
        for ig in range(1, nig):  # the image groups' sums, in order (the same for any schedule)
            for l in range(ntl * A):
                accd[l] += accd[ig * ntl * A + l]
        cd_wo_store(&d, tl, ntl, accd, &dw[0], L)
        if bias:
            for j in range(Co):
                s = 0.0
                for ig in range(nig):
                    s += bsd[ig * Co + j]
                bias_diff[j] = <float>(<double>bias_diff[j] + s)
    finally:
        free(tl)
        free(accd)
        free(bsd)

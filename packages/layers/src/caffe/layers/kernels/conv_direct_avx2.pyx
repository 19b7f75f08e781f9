# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math
"""Direct dense 2-D convolution, stride 1, dilation 1, float32, with AVX2 and FMA (conv_cpu's "dense" plan).

Shapes (g = group, cg = C / g input and og = Co / g output channels per group):

  x (N, C, H, W)   w (Co, cg, kh, kw)   y (N, Co, OH, OW),  OH = H + 2 ph - kh + 1,  OW = W + 2 pw - kw + 1

  forward          y[n, o, oy, ox] = b[o] + sum_{c, i, j} w[o, c, i, j] xpad[n, c, oy + i, ox + j]
  backward_weight  dw[o, c, i, j] += sum_{n, oy, ox} dy[n, o, oy, ox] xpad[n, c, oy + i, ox + j]

The bottom diff at stride 1 is a forward of dy with the filters flipped and transposed
(pack_weights(flip=True)) and padding kh - 1 - ph, kw - 1 - pw.

forward: each task (image, group, run of output-channel blocks) copies its image's channels into
a zero-padded plane (cg, H + 2 ph, Wp), Wp = 8 * ceil(OW / 8) + kw - 1, so every load is in bounds
with no tests. The filters are packed [group][block of 4 output channels][c][i][j][4]. A tile is 3
vectors of 8 consecutive output x positions (the vectors of the flattened (row, x-vector) list, so
rows of 8 or 13 outputs still fill it) times a block of 4 output channels: 12 accumulators; per
(c, i, j) 3 input loads and 4 broadcasts feed 12 FMAs. The last vector of a row is stored masked
when OW is not a multiple of 8.

backward_weight: the batch is copied in chunks of about CHUNK_BYTES into flat planes: image rows
W + 2 pw wide, and dy rows as wide (zero past OW), so the sum over positions is one run and tap
(i, j) reads the image at the constant offset i (W + 2 pw) + j. A task (group, block of R output
channels, input channel c) keeps R x T accumulator vectors (a run of T of the kh kw taps) in
registers over up to 8 images, each step loading R vectors of dy and T shifted image vectors for
R * T FMAs. Sums are float32 over those images, then float64 (added to dw, rounded once).

On a CPU without AVX2 and FMA (supported() is False) or a compiler other than x86-64 GCC/Clang
the kernels are plain C loops with the same results up to rounding; conv_cpu chooses this plan
only where supported() is True.
"""
from cython.parallel cimport parallel, prange
from libc.stdlib cimport malloc, free
include "_threads.pxi"

cdef extern from *:
    """
    #include <string.h>
    #include <stddef.h>
    #if defined(__x86_64__) && defined(__GNUC__)
    #define CD_X86 1
    #include <immintrin.h>
    #define CD_TARGET __attribute__((target("avx2,fma")))
    #else
    #define CD_X86 0
    #define CD_TARGET
    #endif

    typedef struct {
        ptrdiff_t N, C, H, W, Co, G, cg, og, kh, kw, ph, pw, OH, OW;
        ptrdiff_t Hp, Wp, OWv, nb;   /* padded plane Hp x Wp; vectors per output row; 4-channel blocks per group */
        ptrdiff_t PS, QS, nq;        /* backward_weight's flat planes: image and dy plane strides, vectors */
    } cd_geom;

    static int cd_supported(void) {
    #if CD_X86
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
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
        d->nq = (d->OH * (W + 2 * pw) + 7) / 8;
        d->QS = 8 * d->nq;
        d->PS = d->Hp * (W + 2 * pw) + kw + 8;
    }

    /* nc channels of image x (nc, H, W) into zeroed planes `plane` floats apart, of rows `row` wide, at
       (ph, pw): the forward's (Hp x Wp planes, rows padded to whole vectors) and the weight gradient's
       flat planes (rows W + 2 pw wide, a zeroed tail: cd_pad_flat) */
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
       from the Co side to the C side: og and cg swap roles, taps reversed). Padding channels are zero. */
    static void cd_pack(const float* w, float* p, ptrdiff_t G, ptrdiff_t og, ptrdiff_t cg, ptrdiff_t kh,
                        ptrdiff_t kw, int flip) {
        ptrdiff_t g, o, c, i, j, K = kh * kw;
        ptrdiff_t outc = flip ? cg : og, inc = flip ? og : cg, nb = (outc + 3) / 4;
        memset(p, 0, (size_t)(G * nb * 4 * inc * K) * sizeof(float));
        for (g = 0; g < G; g++)
            for (o = 0; o < og; o++)
                for (c = 0; c < cg; c++)
                    for (i = 0; i < kh; i++)
                        for (j = 0; j < kw; j++) {
                            float v = w[(((g * og + o) * cg + c) * kh + i) * kw + j];
                            ptrdiff_t oo = flip ? c : o, cc = flip ? o : c;
                            ptrdiff_t ii = flip ? kh - 1 - i : i, jj = flip ? kw - 1 - j : j;
                            p[((((g * nb + oo / 4) * inc + cc) * kh + ii) * kw + jj) * 4 + oo % 4] = v;
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
    static void cd_fwd_dispatch(int R, int X, const cd_geom* d, const float* pad, const float* wb,
                                const float* bias, float* y, const ptrdiff_t* xo, const ptrdiff_t* yo,
                                const ptrdiff_t* m) {
        ptrdiff_t c, i, j, l, plane = d->Hp * d->Wp, P = d->OH * d->OW;
        int r, t;
        _Pragma("GCC unroll 8") for (r = 0; r < R; r++)
            _Pragma("GCC unroll 8") for (t = 0; t < X; t++)
                for (l = 0; l < m[t]; l++) {
                    float s = bias ? bias[r] : 0.0f;
                    for (c = 0; c < d->cg; c++)
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

    /* -- weight gradient: on flat planes -- */
    /* The images as planes of rows Wf = W + 2 pw wide (zeroed tail: PS floats apart), dy as rows of the same
       width (columns >= OW zero: QS floats apart), so the sum over positions is one run of nq vectors q
       and tap (i, j) reads the image run at the constant offset i Wf + j. */
    static void cd_pad_flat(const cd_geom* d, const float* x, float* pad, ptrdiff_t nc) {
        cd_pad_planes(d, x, pad, nc, d->PS, d->W + 2 * d->pw);
    }

    static void cd_dy_flat(const cd_geom* d, const float* dy, float* dst, ptrdiff_t nc) {
        ptrdiff_t c, h, Wf = d->W + 2 * d->pw;
        memset(dst, 0, (size_t)(nc * d->QS) * sizeof(float));
        for (c = 0; c < nc; c++)
            for (h = 0; h < d->OH; h++)
                memcpy(dst + c * d->QS + h * Wf, dy + (c * d->OH + h) * d->OW, (size_t)d->OW * sizeof(float));
    }

    #if CD_X86
    /* acc (R * T vectors in accm) += R dy planes x the image plane at T tap offsets, over nimg images */
    static inline __attribute__((always_inline)) CD_TARGET void cd_wgt_tile(
            const int R, const int T, const cd_geom* d, const float* xs, const float* dyb, const ptrdiff_t* off,
            float* accm, ptrdiff_t nimg, ptrdiff_t xstep, ptrdiff_t dystep) {
        __m256 acc[4][6], dv[4];
        ptrdiff_t q, n, nq = d->nq, QS = d->QS;
        int r, t;
        _Pragma("GCC unroll 8") for (r = 0; r < R; r++)
            _Pragma("GCC unroll 8") for (t = 0; t < T; t++) acc[r][t] = _mm256_loadu_ps(accm + (r * T + t) * 8);
        for (n = 0; n < nimg; n++, xs += xstep, dyb += dystep)
            for (q = 0; q < nq * 8; q += 8) {
                _Pragma("GCC unroll 8") for (r = 0; r < R; r++) {
                    dv[r] = _mm256_loadu_ps(dyb + r * QS + q);
                    __asm__("" : "+x"(dv[r]));
                }
                _Pragma("GCC unroll 8") for (t = 0; t < T; t++) {
                    __m256 v = _mm256_loadu_ps(xs + q + off[t]);
                    __asm__("" : "+x"(v));  /* one load feeding R FMAs, not R loads folded into them */
                    _Pragma("GCC unroll 8") for (r = 0; r < R; r++)
                        acc[r][t] = _mm256_fmadd_ps(dv[r], v, acc[r][t]);
                }
            }
        _Pragma("GCC unroll 8") for (r = 0; r < R; r++)
            _Pragma("GCC unroll 8") for (t = 0; t < T; t++) _mm256_storeu_ps(accm + (r * T + t) * 8, acc[r][t]);
    }

    #define CD_WGT_CASE(R, T) case (R) * 8 + (T): \
        cd_wgt_tile(R, T, d, xs, dyb, off, accm, nimg, xstep, dystep); break;

    static CD_TARGET void cd_wgt_dispatch(int R, int T, const cd_geom* d, const float* xs, const float* dyb,
                                          const ptrdiff_t* off, float* accm, ptrdiff_t nimg, ptrdiff_t xstep,
                                          ptrdiff_t dystep) {
        switch (R * 8 + T) {
            CD_WGT_CASE(1, 1) CD_WGT_CASE(1, 2) CD_WGT_CASE(1, 3) CD_WGT_CASE(1, 4) CD_WGT_CASE(1, 5) CD_WGT_CASE(1, 6)
            CD_WGT_CASE(2, 1) CD_WGT_CASE(2, 2) CD_WGT_CASE(2, 3) CD_WGT_CASE(2, 4) CD_WGT_CASE(2, 5) CD_WGT_CASE(2, 6)
            CD_WGT_CASE(3, 1) CD_WGT_CASE(3, 2) CD_WGT_CASE(3, 3) CD_WGT_CASE(3, 4)
        }
    }
    #else
    static void cd_wgt_dispatch(int R, int T, const cd_geom* d, const float* xs, const float* dyb,
                                const ptrdiff_t* off, float* accm, ptrdiff_t nimg, ptrdiff_t xstep, ptrdiff_t dystep) {
        ptrdiff_t q, n;
        int r, t;
        for (n = 0; n < nimg; n++)
            for (r = 0; r < R; r++)
                for (t = 0; t < T; t++)
                    for (q = 0; q < d->nq * 8; q++)
                        accm[(r * T + t) * 8] += dyb[n * dystep + r * d->QS + q] * xs[n * xstep + q + off[t]];
    }
    #endif

    /* The taps per run (T, of the kh kw flattened taps) and channels per block (R) of the tiles: R T <= 12. */
    static void cd_wgt_shape(ptrdiff_t kh, ptrdiff_t kw, int* R, int* T) {
        ptrdiff_t K = kh * kw, runs = (K + 5) / 6;
        *T = (int)((K + runs - 1) / runs);
        *R = *T <= 4 ? 3 : 2;
    }

    /* task (g, channel block b of R, input channel c) over images n0..n1-1 (xpad, dypad: their flat planes,
       all channels); accm: scratch for kh kw R vectors of floats, then as many of doubles. The float
       accumulators sum over at most WGT_IMAGES images at a time, their lanes are then added in float64. */
    #define CD_WGT_IMAGES 8
    static void cd_wgt_task(const cd_geom* d, const float* xpad, const float* dypad, float* dw, float* accm,
                            ptrdiff_t n0, ptrdiff_t n1, ptrdiff_t g, ptrdiff_t b, ptrdiff_t c) {
        int R, T, t;
        ptrdiff_t k0, l, m0, K = d->kh * d->kw, Wf = d->W + 2 * d->pw, off[6];
        cd_wgt_shape(d->kh, d->kw, &R, &T);
        ptrdiff_t o0 = b * R;
        if (d->og - o0 < R) R = (int)(d->og - o0);
        double* accd = (double*)(accm + K * 4 * 8);  /* after room for the widest block (R <= 3 < 4) */
        memset(accd, 0, (size_t)(K * R * 8) * sizeof(double));
        for (m0 = n0; m0 < n1; m0 += CD_WGT_IMAGES) {
            ptrdiff_t m1 = m0 + CD_WGT_IMAGES < n1 ? m0 + CD_WGT_IMAGES : n1;
            const float* xs = xpad + ((m0 - n0) * d->C + g * d->cg + c) * d->PS;
            const float* dyb = dypad + ((m0 - n0) * d->Co + g * d->og + o0) * d->QS;
            ptrdiff_t i = 0, j = 0;
            memset(accm, 0, (size_t)(K * R * 8) * sizeof(float));
            for (k0 = 0; k0 < K; k0 += T) {  /* each run of taps keeps its accumulators in registers */
                int Tn = (int)(K - k0 < T ? K - k0 : T);
                for (t = 0; t < Tn; t++) {
                    off[t] = i * Wf + j;
                    if (++j == d->kw) { j = 0; i++; }
                }
                cd_wgt_dispatch(R, Tn, d, xs, dyb, off, accm + k0 * R * 8, m1 - m0, d->C * d->PS, d->Co * d->QS);
            }
            for (l = 0; l < K * R * 8; l++) accd[l] += accm[l];
        }
        for (k0 = 0; k0 < K; k0 += T) {
            int Tn = (int)(K - k0 < T ? K - k0 : T), r, q;
            const double* a = accd + k0 * R * 8;
            for (r = 0; r < R; r++)
                for (t = 0; t < Tn; t++) {
                    double sum = 0.0;
                    for (q = 0; q < 8; q++) sum += a[(r * Tn + t) * 8 + q];
                    float* o = dw + ((g * d->og + o0 + r) * d->cg + c) * K + k0 + t;
                    *o = (float)((double)*o + sum);
                }
        }
    }
    """
    ctypedef struct cd_geom:
        Py_ssize_t N, C, H, W, Co, G, cg, og, kh, kw, ph, pw, OH, OW, Hp, Wp, OWv, nb, PS, QS, nq
    int cd_supported() nogil
    Py_ssize_t cd_run_bytes
    void cd_init(cd_geom* d, Py_ssize_t N, Py_ssize_t C, Py_ssize_t H, Py_ssize_t W, Py_ssize_t Co,
                 Py_ssize_t G, Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t ph, Py_ssize_t pw) nogil
    void cd_pad(const cd_geom* d, const float* x, float* pad, Py_ssize_t nc) nogil
    void cd_pack(const float* w, float* p, Py_ssize_t G, Py_ssize_t og, Py_ssize_t cg, Py_ssize_t kh,
                 Py_ssize_t kw, int flip) nogil
    void cd_fwd_task(const cd_geom* d, const float* x, const float* wp, const float* bias, float* y,
                     float* pad, Py_ssize_t n, Py_ssize_t g, Py_ssize_t b0, Py_ssize_t b1) nogil
    void cd_pad_flat(const cd_geom* d, const float* x, float* pad, Py_ssize_t nc) nogil
    void cd_dy_flat(const cd_geom* d, const float* dy, float* dst, Py_ssize_t nc) nogil
    void cd_wgt_shape(Py_ssize_t kh, Py_ssize_t kw, int* R, int* T) nogil
    void cd_wgt_task(const cd_geom* d, const float* xpad, const float* dypad, float* dw, float* accm,
                     Py_ssize_t n0, Py_ssize_t n1, Py_ssize_t g, Py_ssize_t b, Py_ssize_t c) nogil


# The weight gradient pads this many bytes of images at a time (at least one image): L2/L3-sized.
CHUNK_BYTES = 4 << 20


def set_run_bytes(Py_ssize_t nbytes):
    """The forward's channel-run budget (bytes of a tile's input rows and filters; for benchmarks)."""
    global cd_run_bytes
    cd_run_bytes = nbytes


def supported() -> bool:
    """Whether the kernels run vectorized here: x86-64 built with GCC/Clang, and the CPU has AVX2 and FMA."""
    return bool(cd_supported())


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
    return G * ((outc + 3) // 4) * 4 * inc * kh * kw


def pack_weights(const float[::1] w, float[::1] packed, Py_ssize_t G, Py_ssize_t og, Py_ssize_t cg,
                 Py_ssize_t kh, Py_ssize_t kw, bint flip=False):
    """packed = w (G og, cg, kh, kw) in forward's layout; flip: the filters of the adjoint (bottom diff)."""
    if w.shape[0] < G * og * cg * kh * kw:
        raise ValueError("conv_direct: weight buffer too small")
    if packed.shape[0] < packed_size(G, og, cg, kh, kw, flip):
        raise ValueError("conv_direct: packed buffer too small")
    with nogil:
        cd_pack(&w[0], &packed[0], G, og, cg, kh, kw, flip)


def forward(const float[::1] x, const float[::1] packed, const float[::1] bias, float[::1] y,
            Py_ssize_t N, Py_ssize_t C, Py_ssize_t H, Py_ssize_t W, Py_ssize_t Co, Py_ssize_t G,
            Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t ph, Py_ssize_t pw, Py_ssize_t OH, Py_ssize_t OW):
    """y (N, Co, OH, OW) = the convolution of x (N, C, H, W) with the packed filters (+ bias unless None)."""
    cdef cd_geom d = _geometry(N, C, H, W, Co, G, kh, kw, ph, pw, OH, OW)
    if x.shape[0] < N * C * H * W or y.shape[0] < N * Co * OH * OW:
        raise ValueError("conv_direct: image or output buffer too small")
    if packed.shape[0] < G * d.nb * 4 * d.cg * kh * kw:
        raise ValueError("conv_direct: packed filter buffer too small")
    if bias is not None and bias.shape[0] < Co:
        raise ValueError("conv_direct: bias buffer too small")
    cdef const float* xs = &x[0]
    cdef const float* ws = &packed[0]
    cdef const float* bs = &bias[0] if bias is not None else NULL
    cdef float* ys = &y[0]
    cdef int nt = _threads(N * Co * OH * OW * d.cg * kh * kw)
    # tasks: (image, group, run of channel blocks); split the blocks when there are few images
    cdef Py_ssize_t runs = 1, t, n, g, r, per, padn = d.cg * d.Hp * d.Wp
    while N * G * runs < 4 * nt and runs < d.nb:
        runs += 1
    per = (d.nb + runs - 1) // runs
    runs = (d.nb + per - 1) // per
    cdef float* pad
    with nogil, parallel(num_threads=nt):
        pad = <float*>malloc(padn * sizeof(float))
        if pad == NULL:
            with gil:
                raise MemoryError()
        else:
            for t in prange(N * G * runs, schedule="dynamic"):
                n = t // (G * runs)
                g = (t // runs) % G
                r = t % runs
                cd_fwd_task(&d, xs, ws, bs, ys, pad, n, g, r * per, min(r * per + per, d.nb))
            free(pad)


def backward_weight(const float[::1] x, const float[::1] dy, float[::1] dw,
                    Py_ssize_t N, Py_ssize_t C, Py_ssize_t H, Py_ssize_t W, Py_ssize_t Co, Py_ssize_t G,
                    Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t ph, Py_ssize_t pw, Py_ssize_t OH, Py_ssize_t OW):
    """dw (Co, cg, kh, kw) += the correlation of dy (N, Co, OH, OW) with x (N, C, H, W) (Caffe accumulates)."""
    cdef cd_geom d = _geometry(N, C, H, W, Co, G, kh, kw, ph, pw, OH, OW)
    if x.shape[0] < N * C * H * W or dy.shape[0] < N * Co * OH * OW:
        raise ValueError("conv_direct: image or diff buffer too small")
    if dw.shape[0] < Co * d.cg * kh * kw:
        raise ValueError("conv_direct: weight diff buffer too small")
    cdef int R, T
    cd_wgt_shape(kh, kw, &R, &T)
    cdef Py_ssize_t nbw = (d.og + R - 1) // R, ntask = G * nbw * d.cg
    cdef Py_ssize_t img = C * d.PS + Co * d.QS, chunk = max(1, min(N, CHUNK_BYTES // (4 * img)))
    cdef Py_ssize_t n0, n1, t, i, g, b, c
    cdef int nt = _threads(N * Co * OH * OW * d.cg * kh * kw)
    cdef float* xpad = <float*>malloc(chunk * img * sizeof(float))
    cdef float* dypad = xpad + chunk * C * d.PS
    cdef float* accm
    if xpad == NULL:
        raise MemoryError()
    cdef const float* xs = &x[0]
    cdef const float* dys = &dy[0]
    cdef float* dws = &dw[0]
    try:
        for n0 in range(0, N, chunk):
            n1 = min(N, n0 + chunk)
            with nogil, parallel(num_threads=nt):
                for i in prange(n1 - n0, schedule="static"):
                    cd_pad_flat(&d, xs + (n0 + i) * C * H * W, xpad + i * C * d.PS, C)
                    cd_dy_flat(&d, dys + (n0 + i) * Co * OH * OW, dypad + i * Co * d.QS, Co)
            with nogil, parallel(num_threads=nt):
                accm = <float*>malloc(kh * kw * 4 * 8 * (sizeof(float) + sizeof(double)))
                if accm == NULL:
                    with gil:
                        raise MemoryError()
                else:
                    for t in prange(ntask, schedule="dynamic"):
                        g = t // (nbw * d.cg)
                        b = (t // d.cg) % nbw
                        c = t % d.cg
                        cd_wgt_task(&d, xpad, dypad, dws, accm, n0, n1, g, b, c)
                    free(accm)
    finally:
        free(xpad)

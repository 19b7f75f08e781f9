# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""2-D im2col / col2im on the CPU, OpenMP-parallel (Caffe's util/im2col.cpp, batched).

Caffe lowers one image at a time; here a block of images, or a block of output
rows of one image, is lowered at once (convolution sizes the block to stay in
cache while its GEMM reads it: conv_cpu). The column buffer is addressed with two
strides, so one kernel serves both layouts:

  batch layout  (convolution): col[r, n * P + p]   row_stride = nb * P, n_stride = P
  image layout  (Im2col layer): col[n, r, p]       row_stride = P,      n_stride = K * P

(P: the block's positions per image, (oh1 - oh0) * OW.)

with r = (c * kernel_h + i) * kernel_w + j (Caffe's row order: it matches the
weight blob's (C, kh, kw) flattening) and p = oh * out_w + ow. Positions in the
padding read as zero (im2col) and are dropped (col2im), as in Caffe.

im is (nb, C, H, W) contiguous, flattened; float32 or float64. The fused type
makes mixing dtypes an error rather than a silent reinterpretation; the only
mixes are the explicitly named conversions of the exact short-K forward
(im2col_2d_f64, batch_to_rows_f64: float32 -> float64; rows_to_batch_f32: float64
sums rounded once into float32).

The stores that add the bias (rows_to_batch, bias_act) also apply an activation in the same pass, for
inference folding's Convolution + ReLU/Clip (conv_base.BaseConvolutionLayer.epilogue): ACT_NONE; ACT_RELU,
y > 0 ? y : y * a (ReLU with negative_slope a); ACT_CLIP, y clamped to [a, b] (Clip): the same bits as
those layers' kernels (elementwise.pyx), applied after the rounding to the output's type, as the
separate layer would see it.
"""
from cython.parallel cimport prange
include "_threads.pxi"

ctypedef fused real:
    float
    double

ctypedef fused real_out:  # a second type where float32 <-> float64 conversion is allowed
    float
    double

cpdef enum Act:
    ACT_NONE = 0
    ACT_RELU = 1
    ACT_CLIP = 2


# The row copies and adds of im2col / col2im (LeNet conv2's rows are 8 positions long): C helpers, in the baseline
# build by 4 floats (SSE2) and libc's memcpy for long runs, in the AVX-512 build (lowering_avx512) by 16, then 8, 4, 2
# and 1, never masked (a masked load after an overlapping masked store is not forwarded, and masked loads that miss
# the cache are slow on Zen 5: col2im and the 1x1 / 2 im2col measured 1.7-1.8x slower with masked row ends); the
# loops over a block's images and rows in C too. A copy or one add per element: the same bits in every build.
# Measured (packages/layers/bench/ab_lowering.py; bench/README.md, session 16): LeNet conv2's im2col 0.67 -> 0.28 ms,
# col2im 0.48 -> 0.30-0.34. GCC's own 256-bit AVX2 forms measured no faster than SSE2's: no AVX2 build.
cdef extern from *:
    """
    #include <stddef.h>
    #include <string.h>
    #if defined(__SSE2__)
    #include <immintrin.h>
    #endif
    /* GCC would turn these loops into calls of memmove (-ftree-loop-distribute-patterns): a call per row of 8 */
    #if defined(__GNUC__) && !defined(__clang__)
    #pragma GCC optimize("no-tree-loop-distribute-patterns")
    #endif
    #if defined(__AVX512F__) && defined(__AVX512VL__)
    #define CAFFE_LOWER_V512 1
    #else
    #define CAFFE_LOWER_V512 0
    #endif
    /* d[k] = s[k], k < n: by 4 floats, and by libc's memcpy for long runs (a "same" layer's image rows, one run per
       image), in both builds: 16- and 8-float vectors measured slower here (0.29 against 0.22 ms at LeNet conv2, rows
       of 8 floats 48 bytes apart: a wider load crosses a cache line more often; 0.27-0.41 against 0.23-0.32 with
       long runs) */
    static inline void caffe_lower_copy_f(float* __restrict d, const float* __restrict s, ptrdiff_t n) {
        if (n >= 64) {
            memcpy(d, s, (size_t)n * sizeof(float));
            return;
        }
    #if defined(__SSE2__)
        for (; n >= 4; n -= 4, d += 4, s += 4)
            _mm_storeu_ps(d, _mm_loadu_ps(s));
    #endif
        for (; n > 0; n--)
            *d++ = *s++;
    }
    /* float64 (rarer: plain loops, vectorized as GCC sees fit, and memcpy for long runs) */
    static inline void caffe_lower_copy_d(double* __restrict d, const double* __restrict s, ptrdiff_t n) {
        if (n >= 32) {
            memcpy(d, s, (size_t)n * sizeof(double));
            return;
        }
        for (; n > 0; n--)
            *d++ = *s++;
    }
    /* float32 widened to float64 (the exact short-K forward's lowering where kernels.exact_gemm is not used) */
    static inline void caffe_lower_copy_fd(double* __restrict d, const float* __restrict s, ptrdiff_t n) {
        for (; n > 0; n--)
            *d++ = (double)*s++;
    }
    /* d[k] += s[k], k < n */
    static inline void caffe_lower_add_f(float* __restrict d, const float* __restrict s, ptrdiff_t n) {
    #if CAFFE_LOWER_V512
        for (; n >= 16; n -= 16, d += 16, s += 16)
            _mm512_storeu_ps(d, _mm512_add_ps(_mm512_loadu_ps(d), _mm512_loadu_ps(s)));
        if (n >= 8) {
            _mm256_storeu_ps(d, _mm256_add_ps(_mm256_loadu_ps(d), _mm256_loadu_ps(s)));
            n -= 8, d += 8, s += 8;
        }
        if (n & 4) {
            _mm_storeu_ps(d, _mm_add_ps(_mm_loadu_ps(d), _mm_loadu_ps(s)));
            d += 4, s += 4;
        }
        if (n & 2) {
            d[0] += s[0];
            d[1] += s[1];
            d += 2, s += 2;
        }
        if (n & 1)
            d[0] += s[0];
    #else
    #if defined(__SSE2__)
        for (; n >= 4; n -= 4, d += 4, s += 4)
            _mm_storeu_ps(d, _mm_add_ps(_mm_loadu_ps(d), _mm_loadu_ps(s)));
    #endif
        for (; n > 0; n--)
            *d++ += *s++;
    #endif
    }
    static inline void caffe_lower_add_d(double* __restrict d, const double* __restrict s, ptrdiff_t n) {
        for (; n > 0; n--)
            *d++ += *s++;
    }
    /* d[k] = 0, k < n (a "same" layer's padding rows and its rows' first or last columns, 1 or 2): memset for long
       runs, short ones by 4 floats and single stores, no loop GCC would vectorize with masked AVX-512 stores (the
       AVX-512 build's "same" im2col took 1.2-1.5x the baseline build's time with the Cython zeroing loops; the other
       paths keep their loops, which measured faster there than these) */
    static inline void caffe_lower_zero_f(float* d, ptrdiff_t n) {
        if (n >= 32) {
            memset(d, 0, (size_t)n * sizeof(float));
            return;
        }
    #if defined(__SSE2__)
        for (; n >= 4; n -= 4, d += 4)
            _mm_storeu_ps(d, _mm_setzero_ps());
    #else
        for (; n >= 4; n -= 4, d += 4)
            d[0] = d[1] = d[2] = d[3] = 0;
    #endif
        if (n & 2) {
            d[0] = d[1] = 0;
            d += 2;
        }
        if (n & 1)
            d[0] = 0;
    }
    static inline void caffe_lower_zero_d(double* d, ptrdiff_t n) {
        if (n >= 16) {
            memset(d, 0, (size_t)n * sizeof(double));
            return;
        }
        for (; n >= 2; n -= 2, d += 2)
            d[0] = d[1] = 0;
        if (n & 1)
            d[0] = 0;
    }
    /* `planes` x `rows` rows of n: d[p dn + r ds + k] = s[p sn + r ss + k] (+= for the adds): the loops over a block's
       images and rows of im2col's valid layers and of col2im, in C (the Cython loops around the row helpers cost
       40-50 cycles a row in the AVX-512 build: LeNet conv2's im2col 0.48 ms against 0.10 in a C loop) */
    #define CAFFE_LOWER_PLANES(name, td, ts, row)                                                            \
        static inline void name(td* __restrict d, ptrdiff_t dn, const ts* __restrict s, ptrdiff_t sn,      \
                                ptrdiff_t planes, ptrdiff_t ds, ptrdiff_t ss, ptrdiff_t rows, ptrdiff_t n) { \
            ptrdiff_t p, r;                                                                                \
            for (p = 0; p < planes; p++)                                                                   \
                for (r = 0; r < rows; r++)                                                                 \
                    row(d + p * dn + r * ds, s + p * sn + r * ss, n);                                      \
        }
    CAFFE_LOWER_PLANES(caffe_lower_copy_planes_f, float, float, caffe_lower_copy_f)
    CAFFE_LOWER_PLANES(caffe_lower_copy_planes_d, double, double, caffe_lower_copy_d)
    CAFFE_LOWER_PLANES(caffe_lower_copy_planes_fd, double, float, caffe_lower_copy_fd)
    CAFFE_LOWER_PLANES(caffe_lower_add_planes_f, float, float, caffe_lower_add_f)
    CAFFE_LOWER_PLANES(caffe_lower_add_planes_d, double, double, caffe_lower_add_d)
    /* The AVX-512 build's strided rows (the baseline build keeps its Cython loops, which GCC vectorizes well for
       SSE2), in C loops kept scalar: GCC 12 vectorized those loops for AVX-512 into element inserts (ResNet-50
       conv1's im2col took 6.0 ms instead of the baseline's 4.4, CaffeNet's 3.4 instead of 2.5; the strided col2im
       1.0-1.17x). Stride 2 with rows of 16 and more by a permute of two plain loads of 16 a block, the last block
       ending at the row's end (d[k] = s[2 k], k < n; s[2k .. 2k + 15] and s[2k + 15 .. 2k + 30]: never past
       s[2 n - 2]). */
    #if CAFFE_LOWER_V512
    static inline void caffe_lower_stride2_f(float* __restrict d, const float* __restrict s, ptrdiff_t n) {
        const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 17, 19, 21, 23, 25, 27, 29, 31);
        ptrdiff_t k = 0;
        for (;;) {
            if (k + 16 > n)
                k = n - 16;
            _mm512_storeu_ps(d + k, _mm512_permutex2var_ps(_mm512_loadu_ps(s + 2 * k), even,
                                                           _mm512_loadu_ps(s + 2 * k + 15)));
            if (k + 16 >= n)
                return;
            k += 16;
        }
    }
    /* Stride 4 (AlexNet's / CaffeNet's conv1: 11 x 11, stride 4) with rows of 16 and more: each block of 16 from
       four loads of 16 by two permutes and a lane shuffle, the last block ending at the row's end as above
       (d[k] = s[4 k], k < n; the loads cover s[4k .. 4k + 63], the fourth masked to s[4k + 48 .. 4k + 60]: never
       past s[4 n - 4]; a masked-off element is never read, so no fault past the image either). */
    static inline void caffe_lower_stride4_f(float* __restrict d, const float* __restrict s, ptrdiff_t n) {
        const __m512i quarter = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
        ptrdiff_t k = 0;
        __m512 lo, hi;
        for (;;) {
            if (k + 16 > n)
                k = n - 16;
            lo = _mm512_permutex2var_ps(_mm512_loadu_ps(s + 4 * k), quarter, _mm512_loadu_ps(s + 4 * k + 16));
            hi = _mm512_permutex2var_ps(_mm512_loadu_ps(s + 4 * k + 32), quarter,
                                        _mm512_maskz_loadu_ps((__mmask16)0x1fff, s + 4 * k + 48));
            _mm512_storeu_ps(d + k, _mm512_shuffle_f32x4(lo, hi, 0x44));  /* lo's lanes 0-7, then hi's 0-7 */
            if (k + 16 >= n)
                return;
            k += 16;
        }
    }
    #endif
    /* im2col: `rows` output rows of OW (ds apart) from image rows ss apart: columns [lo, hi) d[k] = s[k * stride],
       the others 0 */
    #if defined(__GNUC__) && !defined(__clang__)
    __attribute__((noinline, optimize("no-tree-vectorize")))
    #endif
    static void caffe_lower_strided_rows_f(float* __restrict d, ptrdiff_t ds, const float* __restrict s, ptrdiff_t ss,
                                           ptrdiff_t rows, ptrdiff_t OW, ptrdiff_t lo, ptrdiff_t hi,
                                           ptrdiff_t stride) {
        ptrdiff_t r, k;
        for (r = 0; r < rows; r++, d += ds, s += ss) {
            for (k = 0; k < lo; k++)
                d[k] = 0;
    #if CAFFE_LOWER_V512
            if (stride == 2 && hi - lo >= 16)
                caffe_lower_stride2_f(d + lo, s + lo * stride, hi - lo);
            else if (stride == 4 && hi - lo >= 16)
                caffe_lower_stride4_f(d + lo, s + lo * stride, hi - lo);
            else
    #endif
                for (k = lo; k < hi; k++)
                    d[k] = s[k * stride];
            for (k = hi; k < OW; k++)
                d[k] = 0;
        }
    }
    /* col2im: `planes` x `rows` rows of n, d[k * stride] += s[k] */
    #if defined(__GNUC__) && !defined(__clang__)
    __attribute__((noinline, optimize("no-tree-vectorize")))
    #endif
    static void caffe_lower_strided_add_planes_f(float* __restrict d, ptrdiff_t dn, const float* __restrict s,
                                                 ptrdiff_t sn, ptrdiff_t planes, ptrdiff_t ds, ptrdiff_t ss,
                                                 ptrdiff_t rows, ptrdiff_t n, ptrdiff_t stride) {
        ptrdiff_t p, r, k;
        for (p = 0; p < planes; p++)
            for (r = 0; r < rows; r++) {
                float* dr = d + p * dn + r * ds;
                const float* sr = s + p * sn + r * ss;
                for (k = 0; k < n; k++)
                    dr[k * stride] += sr[k];
            }
    }
    """
    bint CAFFE_LOWER_V512
    void caffe_lower_zero_f(float* d, Py_ssize_t n) nogil
    void caffe_lower_zero_d(double* d, Py_ssize_t n) nogil
    void caffe_lower_copy_f(float* d, const float* s, Py_ssize_t n) nogil
    void caffe_lower_copy_d(double* d, const double* s, Py_ssize_t n) nogil
    void caffe_lower_copy_fd(double* d, const float* s, Py_ssize_t n) nogil
    void caffe_lower_strided_rows_f(float* d, Py_ssize_t ds, const float* s, Py_ssize_t ss, Py_ssize_t rows,
                                    Py_ssize_t OW, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t stride) nogil
    void caffe_lower_strided_add_planes_f(float* d, Py_ssize_t dn, const float* s, Py_ssize_t sn, Py_ssize_t planes,
                                          Py_ssize_t ds, Py_ssize_t ss, Py_ssize_t rows, Py_ssize_t n,
                                          Py_ssize_t stride) nogil
    void caffe_lower_copy_planes_f(float* d, Py_ssize_t dn, const float* s, Py_ssize_t sn, Py_ssize_t planes,
                                   Py_ssize_t ds, Py_ssize_t ss, Py_ssize_t rows, Py_ssize_t n) nogil
    void caffe_lower_copy_planes_d(double* d, Py_ssize_t dn, const double* s, Py_ssize_t sn, Py_ssize_t planes,
                                   Py_ssize_t ds, Py_ssize_t ss, Py_ssize_t rows, Py_ssize_t n) nogil
    void caffe_lower_copy_planes_fd(double* d, Py_ssize_t dn, const float* s, Py_ssize_t sn, Py_ssize_t planes,
                                    Py_ssize_t ds, Py_ssize_t ss, Py_ssize_t rows, Py_ssize_t n) nogil
    void caffe_lower_add_planes_f(float* d, Py_ssize_t dn, const float* s, Py_ssize_t sn, Py_ssize_t planes,
                                  Py_ssize_t ds, Py_ssize_t ss, Py_ssize_t rows, Py_ssize_t n) nogil
    void caffe_lower_add_planes_d(double* d, Py_ssize_t dn, const double* s, Py_ssize_t sn, Py_ssize_t planes,
                                  Py_ssize_t ds, Py_ssize_t ss, Py_ssize_t rows, Py_ssize_t n) nogil


cdef inline void _zero(real_out* d, Py_ssize_t n) noexcept nogil:
    """d[k] = 0, k < n."""
    if n <= 0:
        return
    if real_out is float:
        caffe_lower_zero_f(d, n)
    else:
        caffe_lower_zero_d(d, n)


cdef inline void _copy_row(real_out* d, const real* s, Py_ssize_t n) noexcept nogil:
    """d[k] = s[k], k < n (float32 widened where real_out is double); d and s never overlap."""
    if n <= 0:
        return
    if real is float and real_out is float:
        caffe_lower_copy_f(d, s, n)
    elif real is double and real_out is double:
        caffe_lower_copy_d(d, s, n)
    elif real is float and real_out is double:
        caffe_lower_copy_fd(d, s, n)
    else:  # (no such lowering: float64 into float32)
        for k in range(n):
            d[k] = <real_out>s[k]


cdef inline void _copy_planes(real_out* d, Py_ssize_t dn, const real* s, Py_ssize_t sn, Py_ssize_t planes,
                              Py_ssize_t ds, Py_ssize_t ss, Py_ssize_t rows, Py_ssize_t n) noexcept nogil:
    """_copy_row over `planes` x `rows` rows: d + p dn + r ds <- s + p sn + r ss."""
    cdef Py_ssize_t p, r
    if planes <= 0 or rows <= 0 or n <= 0:
        return
    if real is float and real_out is float:
        caffe_lower_copy_planes_f(d, dn, s, sn, planes, ds, ss, rows, n)
    elif real is double and real_out is double:
        caffe_lower_copy_planes_d(d, dn, s, sn, planes, ds, ss, rows, n)
    elif real is float and real_out is double:
        caffe_lower_copy_planes_fd(d, dn, s, sn, planes, ds, ss, rows, n)
    else:
        for p in range(planes):
            for r in range(rows):
                _copy_row(d + p * dn + r * ds, s + p * sn + r * ss, n)


cdef inline void _add_planes(real* d, Py_ssize_t dn, const real* s, Py_ssize_t sn, Py_ssize_t planes,
                             Py_ssize_t ds, Py_ssize_t ss, Py_ssize_t rows, Py_ssize_t n) noexcept nogil:
    """d + p dn + r ds += s + p sn + r ss, n each, over `planes` x `rows` rows (they never overlap)."""
    if planes <= 0 or rows <= 0 or n <= 0:
        return
    if real is float:
        caffe_lower_add_planes_f(d, dn, s, sn, planes, ds, ss, rows, n)
    else:
        caffe_lower_add_planes_d(d, dn, s, sn, planes, ds, ss, rows, n)


cdef inline real_out _act(real_out y, int act, real_out a, real_out b) noexcept nogil:
    if act == ACT_RELU:  # as the ReLU layer's kernel (elementwise.pyx): the same bits, NaN stays NaN
        if a == 0:
            return 0 if y <= 0 else y
        return y if y > 0 else y * a
    if act == ACT_CLIP:  # Caffe's max(min_val, min(x, max_val)); NaN stays NaN
        if y < a:
            return a
        if y > b:
            return b
    return y


cdef inline void _col_range(Py_ssize_t w0, Py_ssize_t W, Py_ssize_t stride, Py_ssize_t OW,
                            Py_ssize_t* lo, Py_ssize_t* hi) noexcept nogil:
    """The output columns ow with 0 <= w0 + ow * stride < W form [lo, hi)."""
    cdef Py_ssize_t a, b
    if w0 >= 0:
        a = 0
    else:
        a = (-w0 + stride - 1) // stride
    if W - w0 <= 0:
        b = 0
    else:
        b = (W - w0 + stride - 1) // stride
    if b > OW:
        b = OW
    if a > b:
        a = b
    lo[0] = a
    hi[0] = b


cdef inline void _image_rows(Py_ssize_t i, Py_ssize_t dil_h, Py_ssize_t pad_h, Py_ssize_t H, Py_ssize_t stride_h,
                             Py_ssize_t oh0, Py_ssize_t oh1, Py_ssize_t* a, Py_ssize_t* b) noexcept nogil:
    """The output rows [a, b) of the band [oh0, oh1) whose kernel row i reads an image row (h = oh * stride_h - pad_h
    + i * dil_h inside [0, H)); oh0 <= a <= b <= oh1 (a band wholly in the padding: a == b)."""
    _col_range(i * dil_h - pad_h, H, stride_h, oh1, a, b)
    if a[0] < oh0:
        a[0] = oh0
    if b[0] < a[0]:
        b[0] = a[0]


cdef inline void _im2col_rows(const real* im, real_out* dst, Py_ssize_t n0, Py_ssize_t n1,
                              Py_ssize_t n_stride, Py_ssize_t plane_stride, Py_ssize_t H, Py_ssize_t W,
                              Py_ssize_t i, Py_ssize_t j, Py_ssize_t pad_h, Py_ssize_t pad_w,
                              Py_ssize_t stride_h, Py_ssize_t stride_w,
                              Py_ssize_t dil_h, Py_ssize_t dil_w,
                              Py_ssize_t oh0, Py_ssize_t oh1, Py_ssize_t OW) noexcept nogil:
    """Column-buffer row of kernel offset (i, j) for images n0..n1-1, output rows oh0..oh1-1
    (im: the channel plane of image 0)."""
    cdef Py_ssize_t n, ow, w0, lo, hi, a, b, k, k0, k1, r
    cdef const real* src
    cdef real_out* d
    w0 = j * dil_w - pad_w
    _col_range(w0, W, stride_w, OW, &lo, &hi)
    _image_rows(i, dil_h, pad_h, H, stride_h, oh0, oh1, &a, &b)
    if stride_h == 1 and stride_w == 1 and OW == W:
        # "Same" padding at stride 1: the rows a..b-1 that read the image are one shifted copy of
        # consecutive image rows; the few entries that wrap across a row edge are zeroed after.
        for n in range(n0, n1):
            d = dst + n * n_stride - oh0 * OW
            _zero(d + oh0 * OW, (a - oh0) * OW)
            _zero(d + b * OW, (oh1 - b) * OW)
            if b == a:
                continue
            d = d + a * OW
            src = im + n * plane_stride + (a - pad_h + i * dil_h) * W + w0
            k0 = -w0 if w0 < 0 else 0
            k1 = (b - a) * W - (w0 if w0 > 0 else 0)
            _copy_row(d + k0, src + k0, k1 - k0)
            if lo > 0 or hi < OW:
                for r in range(b - a):
                    _zero(d + r * OW, lo)
                    _zero(d + r * OW + hi, OW - hi)
        return
    # (the output rows outside [a, b) read the padding only: zero)
    if stride_w == 1 and lo == 0 and hi == OW and a == oh0 and b == oh1:
        # every output reads the image (valid layers: LeNet's): the block's rows of all its images in one C loop
        _copy_planes(dst + n0 * n_stride, n_stride, im + n0 * plane_stride + (a * stride_h - pad_h + i * dil_h) * W
                     + w0, plane_stride, n1 - n0, OW, stride_h * W, b - a, OW)
        return
    for n in range(n0, n1):
        d = dst + n * n_stride - oh0 * OW
        for k in range(oh0 * OW, a * OW):
            d[k] = 0
        for k in range(b * OW, oh1 * OW):
            d[k] = 0
        src = im + n * plane_stride + (a * stride_h - pad_h + i * dil_h) * W + w0
        d = d + a * OW
        if real is float and real_out is float and CAFFE_LOWER_V512 and stride_w > 1:
            caffe_lower_strided_rows_f(d, OW, src, stride_h * W, b - a, OW, lo, hi, stride_w)
            continue
        for r in range(b - a):
            for ow in range(lo):
                d[ow] = 0
            if stride_w == 1:
                _copy_row(d + lo, src + lo, hi - lo)
            else:
                for ow in range(lo, hi):
                    d[ow] = src[ow * stride_w]
            for ow in range(hi, OW):
                d[ow] = 0
            d = d + OW
            src = src + stride_h * W


cdef inline void _col2im_planes(const real* col, real* im, Py_ssize_t n0, Py_ssize_t n1,
                                Py_ssize_t n_stride, Py_ssize_t plane_stride, Py_ssize_t H, Py_ssize_t W,
                                Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t pad_h, Py_ssize_t pad_w,
                                Py_ssize_t stride_h, Py_ssize_t stride_w,
                                Py_ssize_t dil_h, Py_ssize_t dil_w, Py_ssize_t oh0, Py_ssize_t oh1,
                                Py_ssize_t OW, Py_ssize_t row_stride, bint accumulate) noexcept nogil:
    """Add one channel's kh*kw column rows (output rows oh0..oh1-1) into its planes of images n0..n1-1,
    zeroing the planes first unless accumulate.

    Row by row, image by image: each column row is read sequentially while the
    written planes (one channel of a block of images) stay in cache.
    """
    cdef Py_ssize_t i, j, n, r, k, w0, lo, hi, a, b
    cdef const real* s
    cdef real* dst
    if not accumulate:
        for n in range(n0, n1):
            dst = im + n * plane_stride
            for k in range(H * W):
                dst[k] = 0
    for i in range(kh):
        _image_rows(i, dil_h, pad_h, H, stride_h, oh0, oh1, &a, &b)  # (im2col's rows)
        for j in range(kw):
            w0 = j * dil_w - pad_w
            _col_range(w0, W, stride_w, OW, &lo, &hi)
            # the block's first image's first row's first column that reads the image, and its column entry
            dst = im + n0 * plane_stride + (a * stride_h - pad_h + i * dil_h) * W + w0 + lo * stride_w
            s = col + (i * kw + j) * row_stride + n0 * n_stride + (a - oh0) * OW + lo
            if stride_w == 1:  # the rows of all the block's images in one C loop
                _add_planes(dst, plane_stride, s, n_stride, n1 - n0, stride_h * W, OW, b - a, hi - lo)
            elif real is float and CAFFE_LOWER_V512:
                caffe_lower_strided_add_planes_f(dst, plane_stride, s, n_stride, n1 - n0, stride_h * W, OW, b - a,
                                                 hi - lo, stride_w)
            else:
                for n in range(n1 - n0):
                    for r in range(b - a):
                        for k in range(hi - lo):
                            dst[n * plane_stride + r * stride_h * W + k * stride_w] += s[n * n_stride + r * OW + k]


cdef inline Py_ssize_t _blocks(Py_ssize_t units, Py_ssize_t nb) noexcept nogil:
    """Split the images into enough blocks that units * blocks gives every thread several tasks."""
    cdef Py_ssize_t b = (32 + units - 1) // units
    if b > nb:
        b = nb
    if b < 1:
        b = 1
    return b


def im2col_2d(const real[::1] im, real[::1] col, Py_ssize_t nb, Py_ssize_t C,
              Py_ssize_t H, Py_ssize_t W, Py_ssize_t kh, Py_ssize_t kw,
              Py_ssize_t pad_h, Py_ssize_t pad_w, Py_ssize_t stride_h, Py_ssize_t stride_w,
              Py_ssize_t dil_h, Py_ssize_t dil_w, Py_ssize_t OH, Py_ssize_t OW,
              Py_ssize_t row_stride, Py_ssize_t n_stride, Py_ssize_t oh0=0, Py_ssize_t oh1=-1):
    """Lower nb images (nb, C, H, W) into col (see the module doc for the strides).

    Only output rows oh0 <= oh < oh1 (default: all) are lowered, each image's block of
    (oh1 - oh0) * OW columns starting at its n_stride offset: a cache-sized block of a big lowering.
    """
    _im2col(im, col, nb, C, H, W, kh, kw, pad_h, pad_w, stride_h, stride_w, dil_h, dil_w, OH, OW,
            row_stride, n_stride, oh0, oh1)


def im2col_2d_f64(const float[::1] im, double[::1] col, Py_ssize_t nb, Py_ssize_t C,
                  Py_ssize_t H, Py_ssize_t W, Py_ssize_t kh, Py_ssize_t kw,
                  Py_ssize_t pad_h, Py_ssize_t pad_w, Py_ssize_t stride_h, Py_ssize_t stride_w,
                  Py_ssize_t dil_h, Py_ssize_t dil_w, Py_ssize_t OH, Py_ssize_t OW,
                  Py_ssize_t row_stride, Py_ssize_t n_stride, Py_ssize_t oh0=0, Py_ssize_t oh1=-1):
    """im2col_2d of a float32 im into a float64 col (the exact short-K forward's lowering)."""
    _im2col(im, col, nb, C, H, W, kh, kw, pad_h, pad_w, stride_h, stride_w, dil_h, dil_w, OH, OW,
            row_stride, n_stride, oh0, oh1)


cdef _im2col(const real[::1] im, real_out[::1] col, Py_ssize_t nb, Py_ssize_t C,
             Py_ssize_t H, Py_ssize_t W, Py_ssize_t kh, Py_ssize_t kw,
             Py_ssize_t pad_h, Py_ssize_t pad_w, Py_ssize_t stride_h, Py_ssize_t stride_w,
             Py_ssize_t dil_h, Py_ssize_t dil_w, Py_ssize_t OH, Py_ssize_t OW,
             Py_ssize_t row_stride, Py_ssize_t n_stride, Py_ssize_t oh0, Py_ssize_t oh1):
    cdef Py_ssize_t rows = C * kh * kw
    cdef Py_ssize_t t, r, c, rem, blk, nblk, per, n0, n1
    if oh1 < 0:
        oh1 = OH
    if not 0 <= oh0 <= oh1 <= OH:
        raise ValueError("im2col_2d: bad output row range")
    if nb * rows * (oh1 - oh0) * OW == 0:
        return
    if im.shape[0] < nb * C * H * W:
        raise ValueError("im2col_2d: image buffer too small")
    if col.shape[0] < (rows - 1) * row_stride + (nb - 1) * n_stride + (oh1 - oh0) * OW:
        raise ValueError("im2col_2d: column buffer too small")
    cdef const real* src = &im[0]
    cdef real_out* dst = &col[0]
    nblk = _blocks(rows, nb)
    per = (nb + nblk - 1) // nblk
    cdef int nt = _threads(nb * rows * (oh1 - oh0) * OW)
    with nogil:
        for t in prange(rows * nblk, schedule="static", num_threads=nt):
            r = t // nblk
            blk = t - r * nblk
            n0 = blk * per
            n1 = n0 + per
            if n1 > nb:
                n1 = nb
            c = r // (kh * kw)
            rem = r - c * (kh * kw)
            _im2col_rows(src + c * H * W, dst + r * row_stride, n0, n1, n_stride, C * H * W,
                         H, W, rem // kw, rem - (rem // kw) * kw, pad_h, pad_w,
                         stride_h, stride_w, dil_h, dil_w, oh0, oh1, OW)


def col2im_2d(const real[::1] col, real[::1] im, Py_ssize_t nb, Py_ssize_t C,
              Py_ssize_t H, Py_ssize_t W, Py_ssize_t kh, Py_ssize_t kw,
              Py_ssize_t pad_h, Py_ssize_t pad_w, Py_ssize_t stride_h, Py_ssize_t stride_w,
              Py_ssize_t dil_h, Py_ssize_t dil_w, Py_ssize_t OH, Py_ssize_t OW,
              Py_ssize_t row_stride, Py_ssize_t n_stride, Py_ssize_t oh0=0, Py_ssize_t oh1=-1,
              bint accumulate=False):
    """Overwrite im (nb, C, H, W) with the sum of the column entries that read each pixel.

    With output rows oh0..oh1 (default: all) only that block of columns is read (laid out as
    im2col_2d writes it); with accumulate the sums are added to im instead of overwriting it.
    """
    cdef Py_ssize_t planes = nb * C
    cdef Py_ssize_t t, c, blk, nblk, per, n0, n1
    if oh1 < 0:
        oh1 = OH
    if not 0 <= oh0 <= oh1 <= OH:
        raise ValueError("col2im_2d: bad output row range")
    if planes * H * W == 0:
        return
    if im.shape[0] < planes * H * W:
        raise ValueError("col2im_2d: image buffer too small")
    if (oh1 - oh0) * OW == 0 or kh * kw == 0:
        if not accumulate:
            im[:planes * H * W] = 0
        return
    if col.shape[0] < (C * kh * kw - 1) * row_stride + (nb - 1) * n_stride + (oh1 - oh0) * OW:
        raise ValueError("col2im_2d: column buffer too small")
    cdef const real* src = &col[0]
    cdef real* dst = &im[0]
    nblk = _blocks(C, nb)
    per = (nb + nblk - 1) // nblk
    cdef int nt = _threads(planes * kh * kw * (oh1 - oh0) * OW)
    with nogil:
        for t in prange(C * nblk, schedule="static", num_threads=nt):
            c = t // nblk
            blk = t - c * nblk
            n0 = blk * per
            n1 = n0 + per
            if n1 > nb:
                n1 = nb
            _col2im_planes(src + c * kh * kw * row_stride, dst + c * H * W, n0, n1, n_stride,
                           C * H * W, H, W, kh, kw, pad_h, pad_w, stride_h, stride_w, dil_h, dil_w,
                           oh0, oh1, OW, row_stride, accumulate)


# -- the batched GEMM's layout changes ---------------------------------------------------------
# One GEMM per group produces (C, nb * Pb); the blobs are (nb, C, P). These move whole
# contiguous runs in parallel (NumPy's strided broadcast add is several times slower). A block
# of output positions p0 <= p < p0 + Pb of each image (a cache-sized block) is addressed by
# P (positions per image in the blob), p0 and Pb (default: all P).

def rows_to_batch(const real[::1] rows, real[::1] out, const real[::1] bias, Py_ssize_t nb,
                  Py_ssize_t C, Py_ssize_t P, Py_ssize_t p0=0, Py_ssize_t Pb=-1, int act=ACT_NONE,
                  double a=0, double b=0):
    """out[n, c, p0 + p] = act(rows[c, n * Pb + p] (+ bias[c] when bias is not None))."""
    _rows_to_batch(rows, out, bias, nb, C, P, p0, Pb, act, a, b)


def rows_to_batch_f32(const double[::1] rows, float[::1] out, const double[::1] bias, Py_ssize_t nb,
                      Py_ssize_t C, Py_ssize_t P, Py_ssize_t p0=0, Py_ssize_t Pb=-1, int act=ACT_NONE,
                      double a=0, double b=0):
    """rows_to_batch of float64 rows (and bias) into a float32 out, each sum rounded once (the exact
    short-K forward), then act."""
    _rows_to_batch(rows, out, bias, nb, C, P, p0, Pb, act, a, b)


cdef _rows_to_batch(const real[::1] rows, real_out[::1] out, const real[::1] bias, Py_ssize_t nb,
                    Py_ssize_t C, Py_ssize_t P, Py_ssize_t p0, Py_ssize_t Pb, int act, double a, double b):
    cdef Py_ssize_t t, n, c
    cdef bint has_bias = bias is not None
    _check_act(act)
    cdef real_out ra = <real_out>a, rb = <real_out>b
    if Pb < 0:
        Pb = P - p0
    if not (0 <= p0 and p0 + Pb <= P):
        raise ValueError("rows_to_batch: bad position block")
    if nb * C * Pb == 0:
        return
    if rows.shape[0] < nb * C * Pb or out.shape[0] < nb * C * P or (has_bias and bias.shape[0] < C):
        raise ValueError("rows_to_batch: buffer too small")
    cdef const real* src = &rows[0]
    cdef real_out* dst = &out[0]
    cdef const real* bs = &bias[0] if has_bias else NULL
    cdef int nt = _threads(nb * C * Pb)
    with nogil:
        for t in prange(nb * C, schedule="static", num_threads=nt):
            n = t // C
            c = t - n * C
            _copy_run(src + (c * nb + n) * Pb, dst + t * P + p0, Pb, bs[c] if has_bias else 0, act, ra, rb)


def batch_to_rows(const real[::1] batch, real[::1] rows, Py_ssize_t nb, Py_ssize_t C, Py_ssize_t P,
                  Py_ssize_t p0=0, Py_ssize_t Pb=-1):
    """rows[c, n * Pb + p] = batch[n, c, p0 + p]."""
    _batch_to_rows(batch, rows, nb, C, P, p0, Pb)


def batch_to_rows_f64(const float[::1] batch, double[::1] rows, Py_ssize_t nb, Py_ssize_t C, Py_ssize_t P,
                      Py_ssize_t p0=0, Py_ssize_t Pb=-1):
    """batch_to_rows of a float32 batch into float64 rows (the exact short-K forward of a 1x1 layer)."""
    _batch_to_rows(batch, rows, nb, C, P, p0, Pb)


cdef _batch_to_rows(const real[::1] batch, real_out[::1] rows, Py_ssize_t nb, Py_ssize_t C, Py_ssize_t P,
                    Py_ssize_t p0, Py_ssize_t Pb):
    cdef Py_ssize_t t, n, c
    if Pb < 0:
        Pb = P - p0
    if not (0 <= p0 and p0 + Pb <= P):
        raise ValueError("batch_to_rows: bad position block")
    if nb * C * Pb == 0:
        return
    if batch.shape[0] < nb * C * P or rows.shape[0] < nb * C * Pb:
        raise ValueError("batch_to_rows: buffer too small")
    cdef const real* src = &batch[0]
    cdef real_out* dst = &rows[0]
    cdef int nt = _threads(nb * C * Pb)
    with nogil:
        for t in prange(nb * C, schedule="static", num_threads=nt):
            c = t // nb
            n = t - c * nb
            _copy_run(src + (n * C + c) * P + p0, dst + t * Pb, Pb, 0, ACT_NONE, 0, 0)


cdef inline void _copy_run(const real* src, real_out* dst, Py_ssize_t P, real add, int act, real_out a,
                           real_out b) noexcept nogil:
    cdef Py_ssize_t p
    if act == ACT_NONE:
        if add == 0:
            for p in range(P):
                dst[p] = <real_out>src[p]
        else:
            for p in range(P):
                dst[p] = <real_out>(src[p] + add)
    else:
        for p in range(P):
            dst[p] = _act(<real_out>(src[p] + add), act, a, b)


cdef _check_act(int act):
    if act != ACT_NONE and act != ACT_RELU and act != ACT_CLIP:
        raise ValueError(f"unknown activation code {act}")


def bias_act(real[::1] out, const real[::1] bias, Py_ssize_t nb, Py_ssize_t C, Py_ssize_t P,
             Py_ssize_t p0=0, Py_ssize_t Pb=-1, int act=ACT_NONE, double a=0, double b=0):
    """out[n, c, p0 + p] = act(out[n, c, p0 + p] + bias[c]) in place (no bias when None): the epilogue of
    a GEMM written straight into the blob, or of a whole layer's output (direct and dense plans)."""
    cdef Py_ssize_t t, c, p, off
    cdef bint has_bias = bias is not None
    _check_act(act)
    if Pb < 0:
        Pb = P - p0
    if not (0 <= p0 and p0 + Pb <= P):
        raise ValueError("bias_act: bad position block")
    if nb * C * Pb == 0 or (not has_bias and act == ACT_NONE):
        return
    if out.shape[0] < nb * C * P or (has_bias and bias.shape[0] < C):
        raise ValueError("bias_act: buffer too small")
    cdef real* y = &out[0]
    cdef const real* bs = &bias[0] if has_bias else NULL
    cdef real ra = <real>a, rb = <real>b
    cdef int nt = _threads(nb * C * Pb)
    with nogil:
        for t in prange(nb * C, schedule="static", num_threads=nt):
            c = t % C
            off = t * P + p0
            _copy_run(y + off, y + off, Pb, bs[c] if has_bias else 0, act, ra, rb)

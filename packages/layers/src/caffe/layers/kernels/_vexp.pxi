# Shared by the kernel modules (Cython `include`): the AVX-512 float32 exp's reduction and polynomial.
cdef extern from *:
    """
    #ifndef CAFFE_EXP512_POLY
    #define CAFFE_EXP512_POLY
    #if defined(__AVX512F__) && defined(__x86_64__) && defined(__GNUC__)
    #include <immintrin.h>
    /* exp(x) = 2^n exp(r), 16 lanes: Cephes' expf with FMA, x = n ln2 + r (n by rounding with 1.5 * 2^23, ln2 in
       two parts), exp(r) = 1 + r + r^2 P(r) evaluated as (P(r) r + 1) r + 1. caffe_exp512_reduce returns the
       polynomial before its last step, p = P(r) r + 1 (exp(r) = p r + 1: elementwise's expm1 takes p r itself), and
       sets *n and *r; caffe_exp512_poly returns exp(r) and sets *n. The caller applies 2^n (VSCALEFPS) and decides
       what happens past the range (elementwise clamps the argument first, softmax zeroes what lies below
       ln(FLT_MIN)). */
    static inline __m512 caffe_exp512_reduce(__m512 x, __m512* n, __m512* r_out) {
        const __m512 big = _mm512_set1_ps(12582912.0f);  /* 1.5 * 2^23 */
        __m512 fx = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), big), big);
        __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
        __m512 p;
        r = _mm512_fmadd_ps(fx, _mm512_set1_ps(2.12194440e-4f), r);
        p = _mm512_fmadd_ps(_mm512_set1_ps(1.9875691500e-4f), r, _mm512_set1_ps(1.3981999507e-3f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
        *n = fx;
        *r_out = r;
        return _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    }
    static inline __m512 caffe_exp512_poly(__m512 x, __m512* n) {
        __m512 r;
        __m512 p = caffe_exp512_reduce(x, n, &r);
        return _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    }
    #endif
    #endif
    """

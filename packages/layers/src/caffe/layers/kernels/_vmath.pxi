# Shared by the kernel modules (Cython `include`): the math functions the elementwise loops call.
#
# glibc's libmvec has SIMD versions of expf/tanhf/... ; GCC uses them to vectorize a loop that
# calls these functions when their declarations carry `omp declare simd` (the -fopenmp the kernels
# are built with enables it). glibc only declares them so under -ffast-math, which would also
# break NaN/inf semantics elsewhere, so they are declared here. libmvec's functions are within
# 4 ulp, like NumPy's own SIMD loops. Elsewhere (no glibc / not x86-64) the loops stay scalar.
# Each module that includes this file links libm (`# distutils: libraries = m`, which on glibc
# brings libmvec along) and compiles with -fno-math-errno (so sqrt inlines and calls vectorize)
# and -fno-trapping-math (so selects between computed values become branch-free blends). The
# *_avx2 builds of the same sources get libmvec's 8-wide AVX2 versions.
cdef extern from *:
    """
    #include <math.h>
    #if defined(__GLIBC__) && defined(__x86_64__) && !defined(__FAST_MATH__)
    #pragma omp declare simd notinbranch
    extern float expf(float);
    #pragma omp declare simd notinbranch
    extern double exp(double);
    #pragma omp declare simd notinbranch
    extern float expm1f(float);
    #pragma omp declare simd notinbranch
    extern double expm1(double);
    #pragma omp declare simd notinbranch
    extern float logf(float);
    #pragma omp declare simd notinbranch
    extern double log(double);
    #pragma omp declare simd notinbranch
    extern float log1pf(float);
    #pragma omp declare simd notinbranch
    extern double log1p(double);
    #pragma omp declare simd notinbranch
    extern float tanhf(float);
    #pragma omp declare simd notinbranch
    extern double tanh(double);
    #pragma omp declare simd notinbranch
    extern float powf(float, float);
    #pragma omp declare simd notinbranch
    extern double pow(double, double);
    #endif
    """
    float expf(float) nogil
    double exp(double) nogil
    float expm1f(float) nogil
    double expm1(double) nogil
    float logf(float) nogil
    double log(double) nogil
    float log1pf(float) nogil
    double log1p(double) nogil
    float tanhf(float) nogil
    double tanh(double) nogil
    float powf(float, float) nogil
    double pow(double, double) nogil
    float sqrtf(float) nogil
    double sqrt(double) nogil
    float fabsf(float) nogil
    double fabs(double) nogil


# One name per function for both precisions (`real` is the fused float/double type).
cdef inline real _exp(real v) noexcept nogil:
    return expf(v) if real is float else exp(v)


cdef inline real _expm1(real v) noexcept nogil:
    return expm1f(v) if real is float else expm1(v)


cdef inline real _log(real v) noexcept nogil:
    return logf(v) if real is float else log(v)


cdef inline real _log1p(real v) noexcept nogil:
    return log1pf(v) if real is float else log1p(v)


cdef inline real _tanh(real v) noexcept nogil:
    return tanhf(v) if real is float else tanh(v)


cdef inline real _pow(real v, real p) noexcept nogil:
    return powf(v, p) if real is float else pow(v, p)


cdef inline real _sqrt(real v) noexcept nogil:
    return sqrtf(v) if real is float else sqrt(v)


# A loop that GCC vectorizes through the declarations above calls libmvec in its vector body and libm in its scalar
# remainder, and the two round differently (float32 tanh of -2.2757785e-4: x in the body, one ulp off in the
# remainder; float64 exp too): a value's bits would depend on where it falls in the array, so on the batch size. The
# kernels run such a loop over a multiple of TAIL elements and the last n % TAIL through the same loop on a padded
# copy (_pad_tail), so every element goes by libmvec.
cdef enum:
    TAIL = 16  # a multiple of every vector width GCC uses (16 float32 lanes in the AVX-512 builds)


cdef inline void _pad_tail(const real* src, real* dst, Py_ssize_t r) noexcept nogil:
    """dst[0..TAIL) = src[0..r), then src[r - 1] repeated (a value the loop already takes); 0 < r < TAIL."""
    cdef Py_ssize_t i
    for i in range(TAIL):
        dst[i] = src[i if i < r else r - 1]

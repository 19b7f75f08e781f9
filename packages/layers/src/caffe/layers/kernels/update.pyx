# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math -ffp-contract=off
"""The solvers' parameter updates in one pass over a parameter's data, diff and history (caffe-solver's six
solvers call them on the CPU; here because this package builds the compiled kernels).

Caffe's momentum SGD step for one parameter is five array passes (Regularize: t = decay w, g += t;
ComputeUpdateValue: h = momentum h + rate g, g = h; Net::Update: w -= g), each reading and writing whole
arrays: CaffeNet's 61M parameters made it ~95-120 ms an iteration on the 2-core development machine, a third of
the forward and backward. Each step here does them element by element: the same IEEE operations in the same
order as the solver's passes, each rounded to the parameter's dtype (no FMA contraction: fp-contract off; sqrt
is correctly rounded in both), so the same bits, reading and writing each array once. Elementwise, so the
result does not depend on the thread count.
"""
from cython.parallel cimport prange
from libc.math cimport sqrt, sqrtf

include "_threads.pxi"

ctypedef fused real:
    float
    double


cdef inline real _sqrt(real x) noexcept nogil:
    if real is float:
        return sqrtf(x)
    return sqrt(x)


cdef enum:
    CHUNK = 16384


cdef inline Py_ssize_t _check(str name, Py_ssize_t n, arrays) except -1:
    for a in arrays:
        if a.shape[0] != n:
            raise ValueError(f"{name}: the data has {n} elements, another array {a.shape[0]}")
    return n


def sgd_step(real[::1] w, real[::1] g, real[::1] h, real decay, real momentum, real rate):
    """Per element, in Caffe's order: g += decay * w (skipped when decay == 0, as the passes skip it);
    h = momentum * h + rate * g; g = h; w -= g."""
    cdef Py_ssize_t n = _check("sgd_step", w.shape[0], (g, h)), c, i, lo, hi
    if n == 0:
        return
    cdef real* wp = &w[0]
    cdef real* gp = &g[0]
    cdef real* hp = &h[0]
    cdef real gi, hi_
    cdef bint decayed = decay != 0
    cdef int nt = _threads(n)
    with nogil:
        for c in prange((n + CHUNK - 1) // CHUNK, schedule="static", num_threads=nt):
            lo = c * CHUNK
            hi = lo + CHUNK if lo + CHUNK < n else n
            if decayed:
                for i in range(lo, hi):
                    gi = gp[i] + wp[i] * decay
                    hi_ = hp[i] * momentum + gi * rate
                    hp[i] = hi_
                    gp[i] = hi_
                    wp[i] = wp[i] - hi_
            else:
                for i in range(lo, hi):
                    hi_ = hp[i] * momentum + gp[i] * rate
                    hp[i] = hi_
                    gp[i] = hi_
                    wp[i] = wp[i] - hi_


def nesterov_step(real[::1] w, real[::1] g, real[::1] h, real decay, real momentum, real rate):
    """NesterovSolver's step, per element in its order: g += decay * w (unless decay == 0); u = h;
    h = momentum * h + rate * g; g = (1 + momentum) * h - momentum * u; w -= g."""
    cdef Py_ssize_t n = _check("nesterov_step", w.shape[0], (g, h)), c, i, lo, hi
    if n == 0:
        return
    cdef real* wp = &w[0]
    cdef real* gp = &g[0]
    cdef real* hp = &h[0]
    cdef real gi, hn, u
    cdef real one_plus = <real>1 + momentum
    cdef real minus = -momentum
    cdef bint decayed = decay != 0
    cdef int nt = _threads(n)
    with nogil:
        for c in prange((n + CHUNK - 1) // CHUNK, schedule="static", num_threads=nt):
            lo = c * CHUNK
            hi = lo + CHUNK if lo + CHUNK < n else n
            for i in range(lo, hi):
                gi = gp[i] + wp[i] * decay if decayed else gp[i]
                hn = hp[i] * momentum + gi * rate
                u = hp[i] * minus + hn * one_plus
                hp[i] = hn
                gp[i] = u
                wp[i] = wp[i] - u


def adam_step(real[::1] w, real[::1] g, real[::1] m, real[::1] v, real decay, real beta1, real beta2, real eps,
              real rate_correction):
    """AdamSolver's step, per element in its order: g += decay * w (unless decay == 0);
    m = beta1 * m + (1 - beta1) * g; v = beta2 * v + (1 - beta2) * (g * g);
    g = (m / (sqrt(v) + eps)) * rate_correction; w -= g."""
    cdef Py_ssize_t n = _check("adam_step", w.shape[0], (g, m, v)), c, i, lo, hi
    if n == 0:
        return
    cdef real* wp = &w[0]
    cdef real* gp = &g[0]
    cdef real* mp = &m[0]
    cdef real* vp = &v[0]
    cdef real gi, mi, vi, u
    cdef real b1c = <real>1 - beta1
    cdef real b2c = <real>1 - beta2
    cdef bint decayed = decay != 0
    cdef int nt = _threads(n)
    with nogil:
        for c in prange((n + CHUNK - 1) // CHUNK, schedule="static", num_threads=nt):
            lo = c * CHUNK
            hi = lo + CHUNK if lo + CHUNK < n else n
            for i in range(lo, hi):
                gi = gp[i] + wp[i] * decay if decayed else gp[i]
                mi = mp[i] * beta1 + gi * b1c
                vi = vp[i] * beta2 + (gi * gi) * b2c
                u = (mi / (_sqrt(vi) + eps)) * rate_correction
                mp[i] = mi
                vp[i] = vi
                gp[i] = u
                wp[i] = wp[i] - u


def adagrad_step(real[::1] w, real[::1] g, real[::1] h, real decay, real delta, real rate):
    """AdaGradSolver's step, per element in its order: g += decay * w (unless decay == 0); h = h + g * g;
    g = (g / (sqrt(h) + delta)) * rate; w -= g."""
    cdef Py_ssize_t n = _check("adagrad_step", w.shape[0], (g, h)), c, i, lo, hi
    if n == 0:
        return
    cdef real* wp = &w[0]
    cdef real* gp = &g[0]
    cdef real* hp = &h[0]
    cdef real gi, hn, u
    cdef bint decayed = decay != 0
    cdef int nt = _threads(n)
    with nogil:
        for c in prange((n + CHUNK - 1) // CHUNK, schedule="static", num_threads=nt):
            lo = c * CHUNK
            hi = lo + CHUNK if lo + CHUNK < n else n
            for i in range(lo, hi):
                gi = gp[i] + wp[i] * decay if decayed else gp[i]
                hn = hp[i] + gi * gi
                u = (gi / (_sqrt(hn) + delta)) * rate
                hp[i] = hn
                gp[i] = u
                wp[i] = wp[i] - u


def rmsprop_step(real[::1] w, real[::1] g, real[::1] h, real decay, real rms_decay, real delta, real rate):
    """RMSPropSolver's step, per element in its order: g += decay * w (unless decay == 0);
    h = rms_decay * h + (1 - rms_decay) * (g * g); g = (g / (sqrt(h) + delta)) * rate; w -= g."""
    cdef Py_ssize_t n = _check("rmsprop_step", w.shape[0], (g, h)), c, i, lo, hi
    if n == 0:
        return
    cdef real* wp = &w[0]
    cdef real* gp = &g[0]
    cdef real* hp = &h[0]
    cdef real gi, hn, u
    cdef real keep = <real>1 - rms_decay
    cdef bint decayed = decay != 0
    cdef int nt = _threads(n)
    with nogil:
        for c in prange((n + CHUNK - 1) // CHUNK, schedule="static", num_threads=nt):
            lo = c * CHUNK
            hi = lo + CHUNK if lo + CHUNK < n else n
            for i in range(lo, hi):
                gi = gp[i] + wp[i] * decay if decayed else gp[i]
                hn = hp[i] * rms_decay + (gi * gi) * keep
                u = (gi / (_sqrt(hn) + delta)) * rate
                hp[i] = hn
                gp[i] = u
                wp[i] = wp[i] - u


def adadelta_step(real[::1] w, real[::1] g, real[::1] h, real[::1] h2, real decay, real momentum, real delta,
                  real rate):
    """AdaDeltaSolver's step, per element in its order: g += decay * w (unless decay == 0);
    h = momentum * h + (1 - momentum) * (g * g); g = g * sqrt((h2 + delta) / (h + delta));
    h2 = momentum * h2 + (1 - momentum) * (g * g); g = g * rate; w -= g."""
    cdef Py_ssize_t n = _check("adadelta_step", w.shape[0], (g, h, h2)), c, i, lo, hi
    if n == 0:
        return
    cdef real* wp = &w[0]
    cdef real* gp = &g[0]
    cdef real* hp = &h[0]
    cdef real* h2p = &h2[0]
    cdef real gi, hn, u
    cdef real one_minus = <real>1 - momentum
    cdef bint decayed = decay != 0
    cdef int nt = _threads(n)
    with nogil:
        for c in prange((n + CHUNK - 1) // CHUNK, schedule="static", num_threads=nt):
            lo = c * CHUNK
            hi = lo + CHUNK if lo + CHUNK < n else n
            for i in range(lo, hi):
                gi = gp[i] + wp[i] * decay if decayed else gp[i]
                hn = hp[i] * momentum + (gi * gi) * one_minus
                u = gi * _sqrt((h2p[i] + delta) / (hn + delta))
                h2p[i] = h2p[i] * momentum + (u * u) * one_minus
                hp[i] = hn
                u = u * rate
                gp[i] = u
                wp[i] = wp[i] - u

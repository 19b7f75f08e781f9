# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math -ffp-contract=off
"""The solvers' parameter updates in one pass over a parameter's data, diff and history (caffe-solver's six
solvers call them on the CPU; here because this package builds the compiled kernels).

Caffe's momentum SGD step for one parameter is five array passes (Regularize: t = decay w, g += t;
ComputeUpdateValue: h = momentum h + rate g, g = h; Net::Update: w -= g), each reading and writing whole
arrays: CaffeNet's 61M parameters made it ~95-120 ms an iteration on the 2-core development machine, a third of
the forward and backward. Each step here does them element by element: the same IEEE operations in the same
order as the solver's passes, each rounded to the parameter's dtype (no FMA contraction: fp-contract off; sqrt
is correctly rounded in both), so the same bits (but a NaN's sign and payload, which follow the order the
compiler gives a commutative operation's operands), reading and writing each array once. Elementwise, so the
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

cdef enum Rule:  # the solvers, by their ComputeUpdateValue
    SGD = 0
    NESTEROV = 1
    ADAM = 2
    ADAGRAD = 3
    RMSPROP = 4
    ADADELTA = 5


cdef inline real _grad(real* wp, real* gp, Py_ssize_t i, bint decayed, real decay) noexcept nogil:
    """g + decay * w: Regularize's L2 term (skipped when decay == 0, as the passes skip it)."""
    return gp[i] + wp[i] * decay if decayed else gp[i]


cdef inline void _piece(Rule rule, real* wp, real* gp, real* hp, real* h2p, Py_ssize_t lo, Py_ssize_t hi,
                        bint decayed, real decay, real a, real b, real c, real rate) noexcept nogil:
    """Elements lo .. hi - 1 of one rule's step (the public functions' docs say each rule and what a, b, c are):
    g = the regularized gradient, the rule's history and update u, then g = u and w -= u. One loop a rule, so
    each compiles to its own vector loop."""
    cdef Py_ssize_t i
    cdef real gi, hn, u
    cdef real one_minus_a = <real>1 - a, one_minus_b = <real>1 - b, one_plus_a = <real>1 + a, minus_a = -a
    if rule == SGD:  # a momentum
        for i in range(lo, hi):
            u = hp[i] * a + _grad(wp, gp, i, decayed, decay) * rate
            hp[i] = u
            gp[i] = u
            wp[i] = wp[i] - u
    elif rule == NESTEROV:  # a momentum
        for i in range(lo, hi):
            hn = hp[i] * a + _grad(wp, gp, i, decayed, decay) * rate
            u = hp[i] * minus_a + hn * one_plus_a
            hp[i] = hn
            gp[i] = u
            wp[i] = wp[i] - u
    elif rule == ADAM:  # a beta1, b beta2, c eps, rate: lr times the bias correction
        for i in range(lo, hi):
            gi = _grad(wp, gp, i, decayed, decay)
            hn = hp[i] * a + gi * one_minus_a
            h2p[i] = h2p[i] * b + (gi * gi) * one_minus_b
            u = (hn / (_sqrt(h2p[i]) + c)) * rate
            hp[i] = hn
            gp[i] = u
            wp[i] = wp[i] - u
    elif rule == ADAGRAD:  # c delta
        for i in range(lo, hi):
            gi = _grad(wp, gp, i, decayed, decay)
            hn = hp[i] + gi * gi
            u = (gi / (_sqrt(hn) + c)) * rate
            hp[i] = hn
            gp[i] = u
            wp[i] = wp[i] - u
    elif rule == RMSPROP:  # a rms_decay, c delta
        for i in range(lo, hi):
            gi = _grad(wp, gp, i, decayed, decay)
            hn = hp[i] * a + (gi * gi) * one_minus_a
            u = (gi / (_sqrt(hn) + c)) * rate
            hp[i] = hn
            gp[i] = u
            wp[i] = wp[i] - u
    else:  # ADADELTA: a momentum, c delta
        for i in range(lo, hi):
            gi = _grad(wp, gp, i, decayed, decay)
            hn = hp[i] * a + (gi * gi) * one_minus_a
            u = gi * _sqrt((h2p[i] + c) / (hn + c))
            h2p[i] = h2p[i] * a + (u * u) * one_minus_a
            hp[i] = hn
            u = u * rate
            gp[i] = u
            wp[i] = wp[i] - u


cdef _step(str name, Rule rule, real[::1] w, real[::1] g, real[::1] h, real[::1] h2, real decay, real a, real b,
           real c, real rate):
    """Checks the lengths, then runs _piece over CHUNK-element pieces on the OpenMP threads (h2: the second
    history, or h again for the rules with one)."""
    cdef Py_ssize_t n = w.shape[0], p, lo, hi
    for other in (g.shape[0], h.shape[0], h2.shape[0]):
        if other != n:
            raise ValueError(f"{name}: the data has {n} elements, another array {other}")
    if n == 0:
        return
    cdef real* wp = &w[0]
    cdef real* gp = &g[0]
    cdef real* hp = &h[0]
    cdef real* h2p = &h2[0]
    cdef bint decayed = decay != 0
    with nogil:
        for p in prange((n + CHUNK - 1) // CHUNK, schedule="static", num_threads=_threads(n)):
            lo = p * CHUNK
            hi = lo + CHUNK if lo + CHUNK < n else n
            _piece(rule, wp, gp, hp, h2p, lo, hi, decayed, decay, a, b, c, rate)


def sgd_step(real[::1] w, real[::1] g, real[::1] h, real decay, real momentum, real rate):
    """SGDSolver's step: h = momentum * h + rate * g; g = h."""
    _step("sgd_step", SGD, w, g, h, h, decay, momentum, 0, 0, rate)


def nesterov_step(real[::1] w, real[::1] g, real[::1] h, real decay, real momentum, real rate):
    """NesterovSolver's step: u = h; h = momentum * h + rate * g; g = (1 + momentum) * h - momentum * u."""
    _step("nesterov_step", NESTEROV, w, g, h, h, decay, momentum, 0, 0, rate)


def adam_step(real[::1] w, real[::1] g, real[::1] m, real[::1] v, real decay, real beta1, real beta2, real eps,
              real rate_correction):
    """AdamSolver's step: m = beta1 * m + (1 - beta1) * g; v = beta2 * v + (1 - beta2) * (g * g);
    g = (m / (sqrt(v) + eps)) * rate_correction."""
    _step("adam_step", ADAM, w, g, m, v, decay, beta1, beta2, eps, rate_correction)


def adagrad_step(real[::1] w, real[::1] g, real[::1] h, real decay, real delta, real rate):
    """AdaGradSolver's step: h = h + g * g; g = (g / (sqrt(h) + delta)) * rate."""
    _step("adagrad_step", ADAGRAD, w, g, h, h, decay, 0, 0, delta, rate)


def rmsprop_step(real[::1] w, real[::1] g, real[::1] h, real decay, real rms_decay, real delta, real rate):
    """RMSPropSolver's step: h = rms_decay * h + (1 - rms_decay) * (g * g); g = (g / (sqrt(h) + delta)) * rate."""
    _step("rmsprop_step", RMSPROP, w, g, h, h, decay, rms_decay, 0, delta, rate)


def adadelta_step(real[::1] w, real[::1] g, real[::1] h, real[::1] h2, real decay, real momentum, real delta,
                  real rate):
    """AdaDeltaSolver's step: h = momentum * h + (1 - momentum) * (g * g); g = g * sqrt((h2 + delta) / (h +
    delta)); h2 = momentum * h2 + (1 - momentum) * (g * g); g = g * rate."""
    _step("adadelta_step", ADADELTA, w, g, h, h2, decay, momentum, 0, delta, rate)

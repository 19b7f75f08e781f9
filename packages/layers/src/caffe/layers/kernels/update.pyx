# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math -ffp-contract=off
"""The solvers' parameter updates in one pass over a parameter's data, diff and history (caffe-solver's
SGDSolver calls them on the CPU; here because this package builds the compiled kernels).

Caffe's momentum SGD step for one parameter is five array passes (Regularize: t = decay w, g += t;
ComputeUpdateValue: h = momentum h + rate g, g = h; Net::Update: w -= g), each reading and writing whole
arrays: CaffeNet's 61M parameters made it ~95 ms an iteration on the 2-core development machine, a third of the
forward and backward. sgd_step does them element by element: the same IEEE operations in the same order, each
rounded to the parameter's dtype (no FMA contraction: fp-contract off), so the same bits as the passes, read
once and written once. Elementwise, so the result does not depend on the thread count.
"""
from cython.parallel cimport prange

include "_threads.pxi"

ctypedef fused real:
    float
    double

cdef enum:
    CHUNK = 16384


def sgd_step(real[::1] w, real[::1] g, real[::1] h, real decay, real momentum, real rate):
    """Per element, in Caffe's order: g += decay * w (skipped when decay == 0, as the passes skip it);
    h = momentum * h + rate * g; g = h; w -= g."""
    cdef Py_ssize_t n = w.shape[0], c, i, lo, hi
    if g.shape[0] != n or h.shape[0] != n:
        raise ValueError(f"sgd_step: data {n}, diff {g.shape[0]} and history {h.shape[0]} elements differ")
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

"""Learning-rate policies: Caffe's SGDSolver::GetLearningRate, formula by formula.

    fixed      base_lr
    step       base_lr * gamma ^ floor(iter / stepsize)
    exp        base_lr * gamma ^ iter
    inv        base_lr * (1 + gamma * iter) ^ (-power)
    multistep  base_lr * gamma ^ current_step, current_step advancing (by at most one per call)
               when iter reaches the next stepvalue
    poly       base_lr * (1 - iter / max_iter) ^ power
    sigmoid    base_lr * 1 / (1 + exp(-gamma * (iter - stepsize)))

The arithmetic follows Caffe's types: with Dtype float, `pow(float, int)` is evaluated
in double (C++11 promotes it) while `pow(float, float)` and `exp(float)` stay in float;
the result is a Dtype. Those float powers and exponentials are taken by the C library's `powf` / `expf`,
the functions Caffe's `std::pow(float, float)` / `std::exp(float)` call, not by NumPy's float32 ufuncs:
NumPy's AVX-512 builds take their own (SVML) float32 pow, which differs from glibc's in the last bit for
about a fifth of LeNet's "inv" rates, so the same solver would follow a different trajectory on an AVX-512
machine than on an AVX2 one (and than Caffe).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import math

import numpy as np

from caffe.solver.params import SolverError

log = logging.getLogger("caffe.solver")

POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")


def _libm_float_functions():
    """(powf, expf) of the C math library, or None where it cannot be loaded."""
    name = ctypes.util.find_library("m")
    try:
        libm = ctypes.CDLL(name) if name else None
        powf, expf = libm.powf, libm.expf
    except (OSError, AttributeError):
        return None
    powf.restype, powf.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
    expf.restype, expf.argtypes = ctypes.c_float, [ctypes.c_float]
    return powf, expf


_LIBM = _libm_float_functions()


def _pow(base, exponent, dt):
    """base ** exponent in Dtype `dt`: C's powf for float (as Caffe), pow (double) otherwise."""
    if dt is not np.float32:
        return dt(math.pow(float(base), float(exponent)))
    if _LIBM is not None:
        return dt(_LIBM[0](float(base), float(exponent)))
    return np.power(base, exponent)


def _exp(z, dt):
    """exp(z) in Dtype `dt`: C's expf for float (as Caffe), exp (double) otherwise; inf on overflow."""
    if dt is np.float32 and _LIBM is not None:
        return dt(_LIBM[1](float(z)))
    if dt is np.float32:
        with np.errstate(over="ignore"):
            return np.exp(z)
    try:
        return dt(math.exp(float(z)))
    except OverflowError:
        return dt(math.inf)


def learning_rate(param, iter_: int, current_step: int, dtype=np.float32, log_steps: bool = False):
    """(rate, current_step) for iteration `iter_`; `current_step` is the solver's, updated as Caffe does."""
    dt = np.dtype(dtype).type
    policy = param.lr_policy
    base_lr = dt(param.base_lr)
    gamma = param.gamma

    def check_gamma():
        if gamma < 0:
            raise SolverError(f"lr_policy {policy!r} needs gamma >= 0, got {gamma}")

    def check_stepsize():
        if param.stepsize <= 0:
            raise SolverError(f"lr_policy {policy!r} needs stepsize > 0, got {param.stepsize}")

    if policy == "fixed":
        rate = base_lr
    elif policy == "step":
        check_stepsize()
        current_step = iter_ // param.stepsize
        check_gamma()
        rate = dt(float(base_lr) * float(gamma) ** current_step)
    elif policy == "exp":
        check_gamma()
        rate = dt(float(base_lr) * float(gamma) ** iter_)
    elif policy == "inv":
        check_gamma()
        base = dt(1) + dt(gamma) * dt(iter_)
        rate = base_lr * _pow(base, -dt(param.power), dt)
    elif policy == "multistep":
        if current_step < len(param.stepvalue) and iter_ >= param.stepvalue[current_step]:
            current_step += 1
            if log_steps:
                log.info("MultiStep Status: Iteration %d, step = %d", iter_, current_step)
        check_gamma()
        rate = dt(float(base_lr) * float(gamma) ** current_step)
    elif policy == "poly":
        if param.max_iter <= 0:
            raise SolverError(f"lr_policy 'poly' needs max_iter > 0, got {param.max_iter}")
        frac = dt(1) - dt(iter_) / dt(param.max_iter)
        rate = base_lr * _pow(frac, dt(param.power), dt)
    elif policy == "sigmoid":
        check_gamma()
        check_stepsize()
        z = -dt(gamma) * (dt(iter_) - dt(param.stepsize))
        rate = base_lr * (dt(1) / (dt(1) + _exp(z, dt)))
    else:
        known = ", ".join(POLICIES)
        raise SolverError(f"Unknown learning rate policy: {policy!r} (known policies: {known})")
    return dt(rate), current_step


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
the result is a Dtype.
"""
from __future__ import annotations

import logging

import numpy as np

from caffe.solver.params import SolverError

log = logging.getLogger("caffe.solver")

POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")


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
        rate = base_lr * np.power(base, -dt(param.power))
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
        rate = base_lr * np.power(frac, dt(param.power))
    elif policy == "sigmoid":
        check_gamma()
        check_stepsize()
        z = -dt(gamma) * (dt(iter_) - dt(param.stepsize))
        with np.errstate(over="ignore"):
            rate = base_lr * (dt(1) / (dt(1) + np.exp(z)))
    else:
        known = ", ".join(POLICIES)
        raise SolverError(f"Unknown learning rate policy: {policy!r} (known policies: {known})")
    return dt(rate), current_step


"""AdamSolver (adam_solver.cpp): Kingma & Ba's Adam with Caffe's bias correction.

History [0, N) is m, [N, 2N) is v (as Caffe's history_ holds 2N blobs). With t = iter + 1,
beta1 = momentum, beta2 = momentum2, eps = delta:

    m = (1 - beta1) * g + beta1 * m
    v = (1 - beta2) * g^2 + beta2 * v
    g = lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps)

The correction factor is computed in double and stored as the Dtype, as C++ does with
pow(float, int).
"""
import math

from caffe.blob import Blob
from caffe.solver.registry import register_solver
from caffe.solver import sgd_solver
from caffe.solver.sgd_solver import SGDSolver


@register_solver("Adam")
class AdamSolver(SGDSolver):
    type = "Adam"

    def __init__(self, param_or_path):
        super().__init__(param_or_path)
        self.AdamPreSolve()

    def AdamPreSolve(self) -> None:
        self.history += [Blob(tuple(p.shape), dtype=p.dtype) for p in self.net.learnable_params]

    def _rates(self, i: int, rate):
        """(beta1, beta2, eps, the rate times the bias correction) in parameter i's dtype."""
        dt = self.net.learnable_params[i].dtype.type
        beta1, beta2 = dt(self.param.momentum), dt(self.param.momentum2)
        t_ = self.iter + 1
        correction = dt(math.sqrt(1.0 - float(beta2) ** t_) / (1.0 - float(beta1) ** t_))
        return beta1, beta2, dt(self.param.delta), self.local_rate(i, rate) * correction

    def ComputeUpdateValue(self, i: int, rate) -> None:
        xp = self._xp()
        p = self.net.learnable_params[i]
        dt = p.dtype.type
        n = len(self.net.learnable_params)
        beta1, beta2, eps, rate_correction = self._rates(i, rate)
        g = p.mutable_diff_xp(xp)
        m = self.history[i].mutable_data_xp(xp)
        v = self.history[n + i].mutable_data_xp(xp)
        t = self.temp[i].mutable_data_xp(xp)
        xp.multiply(m, beta1, out=m)             # m = (1 - beta1) * g + beta1 * m
        xp.multiply(g, dt(1) - beta1, out=t)
        xp.add(m, t, out=m)
        xp.multiply(g, g, out=t)                 # v = (1 - beta2) * g^2 + beta2 * v
        xp.multiply(v, beta2, out=v)
        xp.multiply(t, dt(1) - beta2, out=t)
        xp.add(v, t, out=v)
        xp.sqrt(v, out=t)                        # g = lr * correction * m / (sqrt(v) + eps)
        xp.add(t, eps, out=t)
        xp.divide(m, t, out=t)
        xp.multiply(t, rate_correction, out=g)

    _fused_compute = ComputeUpdateValue  # what _fused_step reproduces (SGDSolver._fused)

    def _fused_step(self, i: int, rate) -> None:
        sgd_solver._update.adam_step(*self._flat(i, 2), self._local_decay(i), *self._rates(i, rate))

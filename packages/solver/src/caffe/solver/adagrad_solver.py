"""AdaGradSolver (adagrad_solver.cpp): per-element rates from the sum of squared gradients.

    h += g^2;  g = lr * g / (sqrt(h) + delta)
"""
from caffe.solver.params import SolverError
from caffe.solver.registry import register_solver
from caffe.solver import sgd_solver
from caffe.solver.sgd_solver import SGDSolver


@register_solver("AdaGrad")
class AdaGradSolver(SGDSolver):
    type = "AdaGrad"

    def check_param(self, param) -> None:
        if param.momentum != 0:
            raise SolverError(f"Momentum cannot be used with AdaGrad (momentum is {param.momentum})")

    def ComputeUpdateValue(self, i: int, rate) -> None:
        xp = self._xp()
        p = self.net.learnable_params[i]
        dt = p.dtype.type
        delta = dt(self.param.delta)
        local_rate = self.local_rate(i, rate)
        g = p.mutable_diff_xp(xp)
        h = self.history[i].mutable_data_xp(xp)
        u = self.update[i].mutable_data_xp(xp)
        xp.square(g, out=u)
        xp.add(h, u, out=h)
        xp.sqrt(h, out=u)
        xp.add(u, delta, out=u)
        xp.divide(g, u, out=u)
        xp.multiply(u, local_rate, out=g)

    _fused_compute = ComputeUpdateValue  # what _fused_step reproduces (SGDSolver._fused)

    def _fused_step(self, i: int, rate) -> None:
        sgd_solver._update.adagrad_step(*self._flat(i), self._local_decay(i), self._scalar(self.param.delta, i),
                                        self.local_rate(i, rate))

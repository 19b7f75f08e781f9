"""RMSPropSolver (rmsprop_solver.cpp): a running mean of squared gradients.

    h = (1 - rms_decay) * g^2 + rms_decay * h;  g = lr * g / (sqrt(h) + delta)
"""
from caffe.solver.params import SolverError
from caffe.solver.registry import register_solver
from caffe.solver import sgd_solver
from caffe.solver.sgd_solver import SGDSolver


@register_solver("RMSProp")
class RMSPropSolver(SGDSolver):
    type = "RMSProp"

    def check_param(self, param) -> None:
        if param.momentum != 0:
            raise SolverError(f"Momentum cannot be used with RMSProp (momentum is {param.momentum})")
        if not 0 <= param.rms_decay < 1:
            raise SolverError(f"rms_decay should lie between 0 and 1 (got {param.rms_decay})")

    def ComputeUpdateValue(self, i: int, rate) -> None:
        xp = self._xp()
        p = self.net.learnable_params[i]
        dt = p.dtype.type
        delta = dt(self.param.delta)
        rms_decay = dt(self.param.rms_decay)
        local_rate = self.local_rate(i, rate)
        g = p.mutable_diff_xp(xp)
        h = self.history[i].mutable_data_xp(xp)
        u = self.update[i].mutable_data_xp(xp)
        xp.square(g, out=u)
        xp.multiply(h, rms_decay, out=h)           # axpby(1 - rms_decay, u, rms_decay, h)
        xp.multiply(u, dt(1) - rms_decay, out=u)
        xp.add(h, u, out=h)
        xp.sqrt(h, out=u)
        xp.add(u, delta, out=u)
        xp.divide(g, u, out=u)
        xp.multiply(u, local_rate, out=g)

    _fused_compute = ComputeUpdateValue  # what _fused_step reproduces (SGDSolver._fused)

    def _fused_step(self, i: int, rate) -> None:
        sgd_solver._update.rmsprop_step(*self._flat(i), self._local_decay(i), self._scalar(self.param.rms_decay, i),
                                        self._scalar(self.param.delta, i), self.local_rate(i, rate))

"""NesterovSolver (nesterov_solver.cpp): momentum SGD with Nesterov's look-ahead step.

    u = h;  h = lr * g + momentum * h;  g = (1 + momentum) * h - momentum * u
"""
from caffe.solver.registry import register_solver
from caffe.solver import sgd_solver
from caffe.solver.sgd_solver import SGDSolver


@register_solver("Nesterov")
class NesterovSolver(SGDSolver):
    type = "Nesterov"

    def ComputeUpdateValue(self, i: int, rate) -> None:
        xp = self._xp()
        p = self.net.learnable_params[i]
        dt = p.dtype.type
        momentum = dt(self.param.momentum)
        local_rate = self.local_rate(i, rate)
        g = p.mutable_diff_xp(xp)
        h = self.history[i].mutable_data_xp(xp)
        u = self.update[i].mutable_data_xp(xp)
        t = self.temp[i].mutable_data_xp(xp)
        xp.copyto(u, h)                      # save the old history to step back
        xp.multiply(h, momentum, out=h)      # h = local_rate * g + momentum * h
        xp.multiply(g, local_rate, out=t)
        xp.add(h, t, out=h)
        xp.multiply(u, -momentum, out=u)     # u = (1 + momentum) * h - momentum * u
        xp.multiply(h, dt(1) + momentum, out=t)
        xp.add(u, t, out=u)
        xp.copyto(g, u)

    _fused_compute = ComputeUpdateValue  # what _fused_step reproduces (SGDSolver._fused)

    def _fused_step(self, i: int, rate) -> None:
        sgd_solver._update.nesterov_step(*self._flat(i), self._local_decay(i), self._scalar(self.param.momentum, i),
                                         self.local_rate(i, rate))

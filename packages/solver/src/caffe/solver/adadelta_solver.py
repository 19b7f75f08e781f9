"""AdaDeltaSolver (adadelta_solver.cpp): Zeiler's AdaDelta, scaled by the learning rate.

Two history sets, laid out as Caffe's history_ vector: [0, N) the running mean of squared
gradients, [N, 2N) the running mean of squared updates (momentum is the decay):

    h  = (1 - m) * g^2 + m * h
    g  = g * sqrt((h2 + delta) / (h + delta))
    h2 = (1 - m) * g^2 + m * h2
    g  = lr * g
"""
from caffe.blob import Blob
from caffe.solver.registry import register_solver
from caffe.solver import sgd_solver
from caffe.solver.sgd_solver import SGDSolver


@register_solver("AdaDelta")
class AdaDeltaSolver(SGDSolver):
    type = "AdaDelta"

    def __init__(self, param_or_path):
        super().__init__(param_or_path)
        self.AdaDeltaPreSolve()

    def AdaDeltaPreSolve(self) -> None:
        # the second history set, appended after the first
        self.history += [Blob(tuple(p.shape), dtype=p.dtype) for p in self.net.learnable_params]

    def ComputeUpdateValue(self, i: int, rate) -> None:
        xp = self._xp()
        p = self.net.learnable_params[i]
        dt = p.dtype.type
        n = len(self.net.learnable_params)
        delta = dt(self.param.delta)
        momentum = dt(self.param.momentum)
        one_minus = dt(1) - momentum
        local_rate = self.local_rate(i, rate)
        g = p.mutable_diff_xp(xp)
        h = self.history[i].mutable_data_xp(xp)
        h2 = self.history[n + i].mutable_data_xp(xp)
        u = self.update[i].mutable_data_xp(xp)
        t = self.temp[i].mutable_data_xp(xp)
        xp.square(g, out=u)
        xp.multiply(h, momentum, out=h)          # h = (1 - m) * g^2 + m * h
        xp.multiply(u, one_minus, out=u)
        xp.add(h, u, out=h)
        xp.add(h2, delta, out=u)                 # u = delta + h2
        xp.add(h, delta, out=t)                  # t = delta + h
        xp.divide(u, t, out=u)
        xp.sqrt(u, out=u)
        xp.multiply(g, u, out=g)
        xp.square(g, out=u)
        xp.multiply(h2, momentum, out=h2)        # h2 = (1 - m) * update^2 + m * h2
        xp.multiply(u, one_minus, out=u)
        xp.add(h2, u, out=h2)
        xp.multiply(g, local_rate, out=g)

    _fused_compute = ComputeUpdateValue  # what _fused_step reproduces (SGDSolver._fused)

    def _fused_step(self, i: int, rate) -> None:
        sgd_solver._update.adadelta_step(*self._flat(i, 2), self._local_decay(i), self._scalar(self.param.momentum, i),
                                         self._scalar(self.param.delta, i), self.local_rate(i, rate))

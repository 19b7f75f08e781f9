"""The fused steps of the six solvers (kernels.update: Regularize, ComputeUpdateValue and Net.Update in one
pass) against the passes they replace, through whole solver steps: the same data, diff and
history bits; and the cases that keep the passes (another solver, L1 decay, a replaced Net.Update or step,
debug info, GPU mode)."""
import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

pytest.importorskip("caffe.net", reason="caffe-net (caffe.net.Net) is not installed")
pytest.importorskip("caffe.layers.kernels.update", reason="the compiled kernels are not built")

import caffe  # noqa: E402
from caffe.blob import context  # noqa: E402
from caffe.solver import Solver, sgd_solver  # noqa: E402
from caffe.solver.testing import Feeder, least_squares_net, random_batches, solver_param  # noqa: E402

NUM, DIM = 4, 3


def build(seed, share=False, **fields):
    context.set_random_seed(seed)
    text = least_squares_net(NUM, DIM, share=share, lr_mult=fields.pop("lr_mult", (1.0, 2.0)),
                             decay_mult=fields.pop("decay_mult", (1.0, 0.0)))
    fields.setdefault("lr_policy", "fixed")
    solver = Solver(solver_param(text, display=0, snapshot_after_train=False, random_seed=seed, **fields))
    Feeder(random_batches(seed, 5, NUM, DIM, share=share)).attach(solver.net)
    return solver


def state(solver):
    out = [h.data.copy() for h in solver.history]  # (Adam's: m, then v)
    for p in solver.net.learnable_params:
        out += [p.data.copy(), p.diff.copy()]
    return out


@pytest.mark.parametrize("solver_type", ["SGD", "Nesterov", "Adam", "AdaGrad", "RMSProp", "AdaDelta"])
@settings(max_examples=6)
@given(seed=st.integers(0, 2**16), momentum=st.sampled_from([0.0, 0.9]),
       weight_decay=st.sampled_from([0.0, 0.01]), iter_size=st.integers(1, 2), share=st.booleans(),
       clip=st.sampled_from([-1.0, 0.5]), lr_policy=st.sampled_from(["fixed", "inv"]))
@example(seed=0, momentum=0.9, weight_decay=0.01, iter_size=2, share=True, clip=0.5, lr_policy="inv")
def test_the_fused_step_is_the_passes_bit_for_bit(solver_type, seed, momentum, weight_decay, iter_size, share, clip,
                                                  lr_policy):
    if solver_type in ("AdaGrad", "RMSProp"):
        momentum = 0.0  # (Caffe refuses momentum for these)
    elif solver_type == "AdaDelta" and momentum == 0.0:
        momentum = 0.95
    fields = dict(type=solver_type, base_lr=0.1, momentum2=0.99, delta=1e-6, rms_decay=0.98, momentum=momentum,
                  weight_decay=weight_decay, iter_size=iter_size, clip_gradients=clip, lr_policy=lr_policy, gamma=0.1,
                  power=0.75, max_iter=10)
    fused = build(seed, share, **fields)
    assert fused._fused()
    fused.step(4)
    kernel, sgd_solver._update = sgd_solver._update, None
    try:
        plain = build(seed, share, **fields)
        assert not plain._fused()
        plain.step(4)
    finally:
        sgd_solver._update = kernel
    for a, b in zip(state(fused), state(plain)):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_the_cases_that_keep_the_passes():
    assert build(1, type="Nesterov", base_lr=0.1, momentum=0.9)._fused()
    assert build(1, type="Adam", base_lr=0.01, momentum=0.9)._fused()
    for other in ("AdaGrad", "RMSProp", "AdaDelta"):
        assert build(1, type=other, base_lr=0.1, momentum=0.0 if other != "AdaDelta" else 0.9)._fused()

    class Mine(sgd_solver.SGDSolver):  # a solver of one's own (its step replaced): the passes
        def ComputeUpdateValue(self, i, rate):
            super().ComputeUpdateValue(i, rate)
    context.set_random_seed(1)
    assert not Mine(solver_param(least_squares_net(NUM, DIM), base_lr=0.1, lr_policy="fixed"))._fused()
    assert not build(1, type="SGD", base_lr=0.1, weight_decay=0.01, regularization_type="L1")._fused()
    assert build(1, type="SGD", base_lr=0.1, weight_decay=0.0, regularization_type="L1")._fused()  # no decay
    s = build(1, type="SGD", base_lr=0.1)
    calls = []
    original = s.net.Update
    s.net.Update = lambda: (calls.append(1), original())
    assert not s._fused()
    s.step(1)
    assert calls == [1]  # a replaced Net.Update is called
    s = build(1, type="SGD", base_lr=0.1)
    s.ComputeUpdateValue = lambda i, rate: sgd_solver.SGDSolver.ComputeUpdateValue(s, i, rate)
    assert not s._fused()
    s = build(1, type="SGD", base_lr=0.1)
    s.net.debug_info = True
    assert not s._fused()


def test_gpu_mode_keeps_the_passes(monkeypatch):
    s = build(1, type="SGD", base_lr=0.1)
    assert s._fused()
    monkeypatch.setattr(sgd_solver.context, "mode", lambda: context.GPU)
    assert not s._fused()

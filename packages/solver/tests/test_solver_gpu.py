"""GPU mode: every solver's update on CuPy matches the CPU run (skipped without a usable GPU)."""
import numpy as np
import pytest

pytest.importorskip("caffe.net", reason="caffe-net (caffe.net.Net) is not installed")

from caffe.blob import context  # noqa: E402
from caffe.solver import Solver  # noqa: E402
from caffe.solver.testing import Feeder, least_squares_net, random_batches, solver_param  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not context.gpu_available(), reason="no usable GPU (CuPy and a CUDA device)")]


@pytest.mark.parametrize("solver_type", ["SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam"])
def test_gpu_updates_match_cpu(tmp_path, solver_type):
    results = []
    for mode in (context.CPU, context.GPU):
        context.set_mode(mode)
        try:
            context.set_random_seed(5)
            p = solver_param(least_squares_net(8, 5), type=solver_type, base_lr=0.05, lr_policy="inv", gamma=0.1,
                             power=0.75, momentum=0.0 if solver_type in ("AdaGrad", "RMSProp") else 0.9,
                             weight_decay=0.01, regularization_type="L1", clip_gradients=1.0, iter_size=2,
                             delta=1e-6, display=0, snapshot_prefix=str(tmp_path / f"m{mode}"))
            s = Solver(p)
            Feeder(random_batches(2, 4, 8, 5)).attach(s.net)
            s.step(5)
            s.snapshot()
            results.append([b.data.copy() for b in s.net.learnable_params] + [h.data.copy() for h in s.history])
        finally:
            context.set_mode_cpu()
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    # the GPU run's snapshot resumes on the CPU
    s = Solver(p)
    s.restore(str(tmp_path / f"m{context.GPU}_iter_5.solverstate"))
    for a, b in zip(results[1], [b.data for b in s.net.learnable_params] + [h.data for h in s.history]):
        np.testing.assert_array_equal(a, b)

"""The gradient reducer's bookkeeping, in one process: which buffers are reduced when, and the averaging.

A stand-in communicator plays N ranks that all computed the same gradients (so a sum is N times the
local gradient) and records every call; the multi-rank behaviour itself is tested under mpiexec.
"""
import argparse
import logging

import numpy as np
import pytest

pytest.importorskip("caffe.solver", reason="caffe-solver is not installed")

from caffe.blob import context  # noqa: E402
from caffe.parallel import ParallelError  # noqa: E402
from caffe.parallel.comm import Communicator  # noqa: E402
from caffe.parallel.reducer import GradientReducer  # noqa: E402
from caffe.parallel import selftest  # noqa: E402


class SameGradients(Communicator):
    """N ranks with identical gradients: allreduce multiplies by N; bcast leaves rank 0's values."""

    def __init__(self, size):
        self.size, self.rank = size, 0
        self.calls = []

    def allreduce(self, buf):
        self.calls.append(("allreduce", buf.size))
        buf *= self.size

    def iallreduce(self, buf):
        self.calls.append(("iallreduce", buf.size))
        buf *= self.size
        return "request"

    def wait(self, requests):
        self.calls.append(("wait", len(requests)))

    def bcast(self, buf, root=0):
        self.calls.append(("bcast", buf.size))

    def barrier(self):
        pass


@pytest.fixture
def ranks():
    def set_ranks(n):
        context.set_solver_count(n)
        context.set_solver_rank(0)
    yield set_ranks
    context.set_solver_count(1)
    context.set_solver_rank(0)
    context.set_multiprocess(False)


def make_solver(tmp_path, whole=False, iter_size=1):
    import caffe.solver
    selftest.collect_dropped_databases()  # see there: works around a deadlock in caffe.layers.db
    args = argparse.Namespace(type="SGD", momentum=0.9, weight_decay=0.01, iters=2, snapshot=0,
                              whole_reduce=whole, python_layer="none")
    db = str(tmp_path / "db")
    selftest.write_db(db, 8)
    path = selftest.write_solver(str(tmp_path), "t", db, 2, args)
    if iter_size > 1:
        with open(path, "a") as f:
            f.write(f"iter_size: {iter_size}\n")
    return caffe.solver.get_solver(path)


def local_gradients(solver):
    net = solver.net
    net.ClearParamDiffs()
    net.ForwardBackward()
    return [b.diff.copy() for b in net.learnable_params]


def param_counts(solver):
    # ip1 (weights, bias), ip2 (weights, bias)
    p = solver.net.learnable_params
    return [p[0].count() + p[1].count(), p[2].count() + p[3].count()]


def test_layer_wise_reduce_sends_each_layer_once_and_averages(tmp_path, ranks):
    ranks(3)
    solver = make_solver(tmp_path)
    comm = SameGradients(3)
    r = GradientReducer(solver, comm)
    assert r.layer_wise
    r.bcast()
    solver.net.after_backward(r)
    solver.net.ClearParamDiffs()
    r.on_start()
    solver.net.ForwardBackward()
    ip1, ip2 = param_counts(solver)
    # backward runs from the top: ip2's run first, then ip1's; layers without parameters send nothing
    assert comm.calls == [("bcast", ip1 + ip2), ("iallreduce", ip2), ("iallreduce", ip1)]
    summed = [b.diff.copy() for b in solver.net.learnable_params]  # 3 identical gradients, summed
    r.on_gradients_ready()
    assert comm.calls[-1] == ("wait", 2)
    for b, s in zip(solver.net.learnable_params, summed):
        np.testing.assert_allclose(b.diff, s / 3, rtol=1e-6)  # averaged: the local gradient again


def test_whole_reduce_is_one_call_at_gradients_ready(tmp_path, ranks):
    ranks(2)
    solver = make_solver(tmp_path, whole=True)
    comm = SameGradients(2)
    r = GradientReducer(solver, comm)
    assert not r.layer_wise
    solver.net.after_backward(r)  # registered anyway (as a user might): does nothing in whole mode
    g = local_gradients(solver)
    assert comm.calls == []
    r.on_gradients_ready()
    assert comm.calls == [("allreduce", sum(param_counts(solver)))]
    for b, x in zip(solver.net.learnable_params, g):
        np.testing.assert_allclose(b.diff, x, rtol=1e-6)


def test_layer_wise_without_the_net_callback_still_reduces(tmp_path, ranks):
    # layer_wise_reduce is on, but nobody called net.after_backward(reducer): Caffe would apply the local
    # gradients unreduced; here on_gradients_ready reduces them
    ranks(2)
    solver = make_solver(tmp_path)
    comm = SameGradients(2)
    r = GradientReducer(solver, comm)
    g = local_gradients(solver)
    r.on_gradients_ready()
    assert comm.calls == [("wait", 0), ("allreduce", sum(param_counts(solver)))]
    for b, x in zip(solver.net.learnable_params, g):
        np.testing.assert_allclose(b.diff, x, rtol=1e-6)


def test_iter_size_turns_the_layer_wise_reduce_into_one_reduce(tmp_path, ranks, caplog):
    ranks(2)
    solver = make_solver(tmp_path, iter_size=2)
    with caplog.at_level(logging.INFO, logger="caffe.parallel"):
        r = GradientReducer(solver, SameGradients(2))
    assert not r.layer_wise
    assert "iter_size 2" in caplog.text


def test_training_with_the_reducer_equals_training_without(tmp_path, ranks):
    # with identical gradients on every rank, the averaged update is the local one: the same trajectory
    import caffe.solver
    ranks(1)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain = make_solver(tmp_path / "a")
    start = [b.data.copy() for b in plain.net.learnable_params]
    plain.step(3)
    reduced = make_solver(tmp_path / "b")  # built as one rank, so its Data layer reads what `plain` reads
    for b, x in zip(reduced.net.learnable_params, start):
        b.data[...] = x
    ranks(4)
    r = GradientReducer(reduced, SameGradients(4))
    reduced.add_callback(r)
    reduced.net.after_backward(r)
    reduced.step(3)
    for a, b in zip(plain.net.learnable_params, reduced.net.learnable_params):
        np.testing.assert_allclose(a.data, b.data, rtol=1e-5, atol=1e-7)
    assert isinstance(reduced, caffe.solver.Solver)


def test_a_param_reallocated_after_the_buffers_is_refused(tmp_path, ranks):
    ranks(2)
    solver = make_solver(tmp_path)
    r = GradientReducer(solver, SameGradients(2))
    solver.net.learnable_params[1].reshape(50)  # grows: new memory outside the shared buffer
    with pytest.raises(ParallelError, match="learnable parameter 1 changed shape"):
        r.bcast()

"""Every solver's update against closed forms on a least-squares problem (as test_gradient_based_solver.cpp).

The net is Input -> InnerProduct(1) -> EuclideanLoss, loss = 1/(2N) ||X w^T + b - y||^2, so the gradient
is known in closed form; the reference below recomputes each iteration's rate, gradient, clipping,
regularization and update in float64 NumPy from the textbook formulas, and the float32 solver must follow
it. Hyperparameters are drawn: solver type, base_lr, momentum, weight decay (L1/L2), lr policy, iter_size,
clip_gradients, lr_mult/decay_mult, and shared parameters.
"""
import math

import numpy as np
import pytest
from hypothesis import example, given, strategies as st

pytest.importorskip("caffe.net", reason="caffe-net (caffe.net.Net) is not installed")

import caffe  # noqa: E402
from caffe.blob import context  # noqa: E402
from caffe.solver import Solver  # noqa: E402
from caffe.solver.testing import Feeder, least_squares_net, random_batches, solver_param  # noqa: E402

NUM, DIM = 4, 3
TYPES = ["SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam"]


def needs_layers():
    missing = {"Input", "InnerProduct", "EuclideanLoss"} - set(caffe.layer_type_list())
    if missing:
        pytest.skip(f"layers not implemented yet: {sorted(missing)}")


# ---- the independent reference ----------------------------------------------------------------

def rate_at(h, it):
    p = h["lr_policy"]
    base = h["base_lr"]
    if p == "fixed":
        return base
    if p == "step":
        return base * h["gamma"] ** (it // h["stepsize"])
    if p == "exp":
        return base * h["gamma"] ** it
    if p == "inv":
        return base * (1 + h["gamma"] * it) ** (-h["power"])
    if p == "multistep":
        return base * h["gamma"] ** sum(1 for s in h["stepvalue"] if it >= s)
    if p == "poly":
        return base * (1 - it / h["max_iter"]) ** h["power"]
    if p == "sigmoid":
        return base / (1 + math.exp(-h["gamma"] * (it - h["stepsize"])))
    raise AssertionError(p)


def grads(w, b, batch, share):
    """d/dw, d/db of 1/(2N)||Xw^T + b - y||^2 (summed over both branches when shared)."""
    gw, gb = np.zeros_like(w), np.zeros_like(b)
    for key in (("data", "data2") if share else ("data",)):
        x = batch[key].astype(np.float64)
        r = x @ w.T + b - batch["targets"].astype(np.float64)
        gw += r.T @ x / len(r)
        gb += r.sum(axis=0) / len(r)
    return gw, gb


def reference(h, w0, b0, batches, iters):
    """float64 weights after each of `iters` iterations."""
    params = [w0.astype(np.float64), b0.astype(np.float64)]
    hist = [np.zeros_like(p) for p in params]
    hist2 = [np.zeros_like(p) for p in params]
    k = h["iter_size"]
    out = []
    for it in range(iters):
        g = [np.zeros_like(p) for p in params]
        for j in range(k):
            gw, gb = grads(params[0], params[1], batches[(it * k + j) % len(batches)], h["share"])
            g[0] += gw
            g[1] += gb
        # Caffe computes no gradient for a param with lr_mult 0 (param_propagate_down is false): its diff
        # stays at zero, which matters to the clipping norm
        g = [x * (h["lr_mult"][i] != 0) for i, x in enumerate(g)]
        # Caffe clips the accumulated (not yet iter_size-normalized) gradient, then normalizes
        if h["clip"] >= 0:
            norm = math.sqrt(sum(float((x ** 2).sum()) for x in g))
            if norm > h["clip"]:
                g = [x * (h["clip"] / norm) for x in g]
        g = [x / k for x in g]
        rate = rate_at(h, it)
        for i in range(2):
            decay = h["weight_decay"] * h["decay_mult"][i]
            if h["reg"] == "L2":
                g[i] = g[i] + decay * params[i]
            else:
                g[i] = g[i] + decay * np.sign(params[i])
            lr = rate * h["lr_mult"][i]
            m, d = h["momentum"], h["delta"]
            t = h["type"]
            if t == "SGD":
                hist[i] = m * hist[i] + lr * g[i]
                step = hist[i]
            elif t == "Nesterov":
                old = hist[i]
                hist[i] = m * hist[i] + lr * g[i]
                step = (1 + m) * hist[i] - m * old
            elif t == "AdaGrad":
                hist[i] = hist[i] + g[i] ** 2
                step = lr * g[i] / (np.sqrt(hist[i]) + d)
            elif t == "RMSProp":
                rd = h["rms_decay"]
                hist[i] = rd * hist[i] + (1 - rd) * g[i] ** 2
                step = lr * g[i] / (np.sqrt(hist[i]) + d)
            elif t == "AdaDelta":
                hist[i] = m * hist[i] + (1 - m) * g[i] ** 2
                upd = g[i] * np.sqrt((hist2[i] + d) / (hist[i] + d))
                hist2[i] = m * hist2[i] + (1 - m) * upd ** 2
                step = lr * upd
            elif t == "Adam":
                b1, b2, tt = m, h["momentum2"], it + 1
                hist[i] = b1 * hist[i] + (1 - b1) * g[i]
                hist2[i] = b2 * hist2[i] + (1 - b2) * g[i] ** 2
                step = lr * math.sqrt(1 - b2 ** tt) / (1 - b1 ** tt) * hist[i] / (np.sqrt(hist2[i]) + d)
            params[i] = params[i] - step
        out.append([p.copy() for p in params])
    return out


# ---- drawn hyperparameters ----------------------------------------------------------------------

@st.composite
def hyper(draw, types=TYPES):
    t = draw(st.sampled_from(types))
    h = dict(type=t, share=draw(st.booleans()), iter_size=draw(st.integers(1, 3)),
             lr_policy=draw(st.sampled_from(["fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid"])),
             gamma=draw(st.sampled_from([0.5, 0.9])), power=draw(st.sampled_from([0.5, 1.0, 2.0])),
             stepsize=draw(st.integers(1, 3)), stepvalue=[1, 3], max_iter=10,
             weight_decay=draw(st.sampled_from([0.0, 0.01, 0.1])), reg=draw(st.sampled_from(["L2", "L1"])),
             lr_mult=(1.0, draw(st.sampled_from([0.0, 1.0, 2.0]))),
             decay_mult=(draw(st.sampled_from([0.0, 1.0])), draw(st.sampled_from([0.0, 1.0]))),
             clip=draw(st.sampled_from([-1.0, -1.0, 0.0, 0.5, 5.0])),
             delta=draw(st.sampled_from([1e-8, 1e-6, 0.1])), momentum2=draw(st.sampled_from([0.999, 0.9, 0.5])),
             rms_decay=draw(st.sampled_from([0.9, 0.98])))
    if t in ("AdaGrad", "RMSProp"):
        h["momentum"] = 0.0
    elif t == "Adam":
        h["momentum"] = draw(st.sampled_from([0.8, 0.9]))
    elif t == "AdaDelta":
        h["momentum"] = draw(st.sampled_from([0.9, 0.95]))
    else:
        h["momentum"] = draw(st.sampled_from([0.0, 0.5, 0.9]))
    h["base_lr"] = {"AdaDelta": 1.0, "AdaGrad": 0.1, "RMSProp": 0.01, "Adam": 0.01}.get(
        t, draw(st.sampled_from([0.01, 0.1])))
    return h


def build(h, seed):
    """The solver for hyperparameters h, fed with its batches; returns (solver, batches, w0, b0)."""
    context.set_random_seed(seed)
    text = least_squares_net(NUM, DIM, share=h["share"], lr_mult=h["lr_mult"], decay_mult=h["decay_mult"])
    p = solver_param(text, type=h["type"], base_lr=h["base_lr"], lr_policy=h["lr_policy"], gamma=h["gamma"],
                     power=h["power"], stepsize=h["stepsize"], stepvalue=h["stepvalue"], max_iter=h["max_iter"],
                     momentum=h["momentum"], momentum2=h["momentum2"], weight_decay=h["weight_decay"],
                     regularization_type=h["reg"], clip_gradients=h["clip"], iter_size=h["iter_size"],
                     delta=h["delta"], rms_decay=h["rms_decay"], display=0, snapshot_after_train=False,
                     random_seed=seed)
    solver = Solver(p)
    batches = random_batches(seed, 5, NUM, DIM, share=h["share"])
    Feeder(batches).attach(solver.net)
    w0 = solver.net.params["ip"][0].data.copy()
    b0 = solver.net.params["ip"][1].data.copy()
    return solver, batches, w0, b0


def assert_close(actual, want, h, it):
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(actual, want, rtol=2e-4, atol=2e-5 * scale,
                               err_msg=f"iteration {it}, hyperparameters {h}")


def pinned(t, **over):
    """Hyperparameters for an @example: every solver's non-default modes at once (momentum > 0 where the
    solver has one: AdaGrad and RMSProp take none, as in Caffe), overridable."""
    h = dict(type=t, share=False, iter_size=1, lr_policy="step", gamma=0.5, power=1.0, stepsize=2, stepvalue=[1, 3],
             max_iter=10, weight_decay=0.01, reg="L2", lr_mult=(1.0, 2.0), decay_mult=(1.0, 0.0), clip=-1.0,
             delta={"AdaDelta": 1e-6, "AdaGrad": 1e-6}.get(t, 1e-8), momentum2=0.999, rms_decay=0.98,
             momentum={"AdaGrad": 0.0, "RMSProp": 0.0, "AdaDelta": 0.95}.get(t, 0.9),
             base_lr={"AdaDelta": 1.0, "AdaGrad": 0.1, "RMSProp": 0.01, "Adam": 0.01}.get(t, 0.1))
    h.update(over)
    return h


# Pinned for the derandomized CI profile: each solver with its momentum (and the others on), each with
# iter_size 2 and shared weights and L1, Adam with a momentum2 far from 1 (at 0.999 four steps cannot tell a
# decayed second moment from an undecayed one), and clip_gradients at its boundary 0 (Caffe scales the gradient to
# zero; only a negative value turns clipping off), with and without momentum and weight decay.
@given(h=hyper(), seed=st.integers(0, 2**16))
@example(h=pinned("SGD"), seed=1)
@example(h=pinned("Nesterov"), seed=2)
@example(h=pinned("AdaGrad"), seed=3)
@example(h=pinned("RMSProp"), seed=4)
@example(h=pinned("AdaDelta"), seed=5)
@example(h=pinned("Adam"), seed=6)
@example(h=pinned("SGD", momentum=0.5, iter_size=2, share=True, reg="L1", clip=5.0), seed=7)
@example(h=pinned("Nesterov", momentum=0.5, iter_size=2, share=True, reg="L1", clip=0.5), seed=8)
@example(h=pinned("Adam", momentum=0.8, momentum2=0.5, iter_size=3, share=True, reg="L1", lr_policy="inv"), seed=9)
@example(h=pinned("AdaDelta", momentum=0.9, iter_size=2, share=True, reg="L1", lr_policy="poly"), seed=10)
@example(h=pinned("SGD", clip=0.0), seed=11)
@example(h=pinned("Nesterov", clip=0.0, weight_decay=0.0), seed=12)
@example(h=pinned("Adam", clip=0.0, iter_size=2), seed=13)
@example(h=pinned("SGD", momentum=0.0), seed=14)
def test_updates_match_closed_form(h, seed):
    needs_layers()
    solver, batches, w0, b0 = build(h, seed)
    assert type(solver).__name__ == h["type"] + "Solver"
    iters = 4
    want = reference(h, w0, b0, batches, iters)
    for it in range(iters):
        solver.step(1)
        assert solver.iter == it + 1
        w = solver.net.params["ip"][0].data
        b = solver.net.params["ip"][1].data
        assert_close(w, want[it][0], h, it)
        assert_close(b, want[it][1], h, it)
        if h["share"]:  # the sharing layer sees the very same weights
            np.testing.assert_array_equal(solver.net.params["ip2"][0].data, w)
    assert len(solver.history) == (4 if h["type"] in ("AdaDelta", "Adam") else 2)


@pytest.mark.parametrize("solver_type", TYPES)
def test_lr_mult_zero_freezes_a_param(solver_type):
    needs_layers()
    h = dict(type=solver_type, share=False, iter_size=1, lr_policy="fixed", gamma=0.5, power=1.0, stepsize=1,
             stepvalue=[1], max_iter=10, weight_decay=0.1, reg="L2", lr_mult=(1.0, 0.0), decay_mult=(1.0, 1.0),
             clip=-1.0, delta=1e-8, momentum2=0.999, rms_decay=0.9,
             momentum=0.0 if solver_type in ("AdaGrad", "RMSProp") else 0.9, base_lr=0.1)
    solver, _, w0, b0 = build(h, 7)
    solver.step(3)
    np.testing.assert_array_equal(solver.net.params["ip"][1].data, b0)
    assert not np.array_equal(solver.net.params["ip"][0].data, w0)


@given(solver_type=st.sampled_from(TYPES), k=st.integers(2, 3), seed=st.integers(0, 2**16))
def test_iter_size_k_equals_k_times_the_batch(solver_type, k, seed):
    """iter_size k with batch b trains as iter_size 1 with batch k*b (gradients are batch means)."""
    needs_layers()
    rng = np.random.default_rng(seed)
    small = [{"data": rng.standard_normal((NUM, DIM)).astype(np.float32),
              "targets": rng.standard_normal((NUM, 1)).astype(np.float32)} for _ in range(k * 3)]
    big = [{key: np.concatenate([small[i * k + j][key] for j in range(k)]) for key in ("data", "targets")}
           for i in range(3)]
    momentum = 0.0 if solver_type in ("AdaGrad", "RMSProp") else 0.9
    results = []
    for num, iter_size, batches in ((NUM, k, small), (NUM * k, 1, big)):
        context.set_random_seed(seed)
        p = solver_param(least_squares_net(num, DIM), type=solver_type, base_lr=0.05, lr_policy="fixed",
                         momentum=momentum, weight_decay=0.01, iter_size=iter_size, display=0,
                         delta=1e-6)
        solver = Solver(p)
        Feeder(batches).attach(solver.net)
        solver.step(3)
        results.append([b.data.copy() for b in solver.net.learnable_params] +
                       [b.data.copy() for b in solver.history])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_sgd_lr_property_and_history():
    needs_layers()
    p = solver_param(least_squares_net(NUM, DIM), type="SGD", base_lr=0.5, lr_policy="step", gamma=0.1,
                     stepsize=2, momentum=0.9, display=0)
    solver = caffe.SGDSolver(p)
    Feeder(random_batches(0, 2, NUM, DIM)).attach(solver.net)
    assert solver.lr == pytest.approx(0.5)
    solver.step(3)
    assert solver.lr == pytest.approx(0.05)  # the rate of the last update (iteration 2)
    assert [h.shape for h in solver.history] == [b.shape for b in solver.net.learnable_params]


def test_clip_gradients_scales_to_the_threshold():
    """With clip_gradients c and a gradient of norm > c, the first SGD step has norm lr * c."""
    needs_layers()
    p = solver_param(least_squares_net(NUM, DIM, filler_std=5.0), type="SGD", base_lr=1.0, lr_policy="fixed",
                     clip_gradients=0.01, display=0)
    solver = Solver(p)
    Feeder(random_batches(1, 1, NUM, DIM)).attach(solver.net)
    before = [b.data.copy() for b in solver.net.learnable_params]
    solver.step(1)
    step = np.sqrt(sum(float(((b.data - a) ** 2).sum()) for a, b in zip(before, solver.net.learnable_params)))
    assert step == pytest.approx(0.01, rel=1e-4)

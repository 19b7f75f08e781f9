"""GPU mode: the training loss stays on the device until the solver needs it (display, snapshots, reads of
`smoothed_loss`), and the numbers shown are exactly those of reading every loss at once (issue 14, item 3).
Needs a device: a real GPU, or the CuPy stand-in (scripts/test.sh's second run)."""
import logging
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, strategies as st

pytest.importorskip("caffe.net", reason="caffe-net (caffe.net.Net) is not installed")

from caffe.blob import context  # noqa: E402
from caffe.solver import NonFiniteLossError, Solver  # noqa: E402
from caffe.solver.solver import fmt  # noqa: E402
from caffe.solver.testing import Feeder, least_squares_net, random_batches, solver_param  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not context.gpu_available(), reason="no GPU (CuPy with a CUDA device, or the CuPy "
                                                                     "stand-in)")]

NUM, DIM = 4, 3


@pytest.fixture
def gpu():
    context.set_mode_gpu()
    yield
    context.set_mode_cpu()


def make(tmp, **fields):
    context.set_random_seed(3)
    base = dict(type="SGD", base_lr=0.05, lr_policy="fixed", momentum=0.9, display=0, max_iter=7,
                snapshot_prefix=str(tmp / "ls"), snapshot_after_train=False, solver_mode=1)
    base.update(fields)
    return Solver(solver_param(least_squares_net(NUM, DIM), **base))


def caffe_smoothed(losses, average_loss):
    """Caffe's UpdateSmoothedLoss, written out: the smoothed loss after each iteration."""
    window, smoothed, out = [], 0.0, []
    for it, loss in enumerate(losses):
        if len(window) < average_loss:
            window.append(loss)
            smoothed = (smoothed * (len(window) - 1) + loss) / len(window)
        else:
            idx = it % average_loss
            smoothed += (loss - window[idx]) / average_loss
            window[idx] = loss
        out.append(smoothed)
    return out


@pytest.mark.parametrize("display", [1, 3])
def test_displayed_losses_are_the_eager_numbers(tmp_path, caplog, gpu, display):
    s = make(tmp_path, display=display, average_loss=3)
    Feeder(random_batches(0, 7, NUM, DIM)).attach(s.net)
    raw = []  # each iteration's loss as the CPU reads it: the loss top's float32, times its weight 1, as a float
    s.add_callback(lambda: None, lambda: raw.append(0.0 + float(np.vdot(s.net.blobs["loss"].data.ravel(),
                                                                         s.net.blobs["loss"].diff.ravel()))))
    with caplog.at_level(logging.INFO, logger="caffe"):
        s.step(7)
    shown = [(int(m.group(1)), m.group(2)) for r in caplog.records
             if (m := re.fullmatch(r"Iteration (\d+) \(\S+ iter/s, \S+s/\d+ iters\), loss = (\S+)", r.getMessage()))]
    want = caffe_smoothed(raw, 3)
    assert shown == [(i, fmt(want[i])) for i in range(0, 7, display)]
    assert s.smoothed_loss == want[-1]  # the losses after the last display are read on demand, bit for bit
    assert s.losses == [raw[6], raw[4], raw[5]]  # Caffe's ring: iteration i in slot i % average_loss


def test_a_nan_loss_is_found_at_the_next_display(tmp_path, gpu):
    s = make(tmp_path, display=4, max_iter=10)
    batches = random_batches(0, 10, NUM, DIM)
    batches[2] = dict(batches[2], data=np.full((NUM, DIM), np.nan, np.float32))
    Feeder(batches).attach(s.net)
    with pytest.raises(NonFiniteLossError, match=r"Iteration 2: the training loss is nan; found when the losses kept "
                                                 r"on the GPU were read at iteration 4"):
        s.solve()
    assert s.iter == 4


def test_a_nan_loss_stops_before_the_snapshot(tmp_path, gpu):
    s = make(tmp_path, display=0, max_iter=10, snapshot=3, snapshot_after_train=True)
    batches = random_batches(0, 10, NUM, DIM)
    batches[4] = dict(batches[4], data=np.full((NUM, DIM), np.nan, np.float32))
    Feeder(batches).attach(s.net)
    with pytest.raises(NonFiniteLossError, match=r"Iteration 4: .* read at iteration 6.*ls_iter_3"):
        s.solve()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ls_iter_3.caffemodel", "ls_iter_3.solverstate"]


def test_a_second_step_smooths_only_its_own_losses(tmp_path, gpu):
    # Caffe's Step starts a new smoothing window; losses of the earlier Step still on the device are checked
    # at the next read, not folded into the new window
    s = make(tmp_path, display=0, average_loss=4)
    batches = random_batches(0, 6, NUM, DIM)
    Feeder(batches).attach(s.net)
    raw = []
    s.add_callback(lambda: None, lambda: raw.append(0.0 + float(np.vdot(s.net.blobs["loss"].data.ravel(),
                                                                         s.net.blobs["loss"].diff.ravel()))))
    s.step(3)  # no display: these three stay on the device
    s.step(2)
    assert s.losses == raw[3:] and s.smoothed_loss == caffe_smoothed(raw[3:], 4)[-1]
    t = make(tmp_path, display=0, average_loss=4)
    batches[1] = dict(batches[1], data=np.full((NUM, DIM), np.nan, np.float32))
    Feeder(batches).attach(t.net)
    t.step(3)
    t.step(1)
    with pytest.raises(NonFiniteLossError, match=r"Iteration 1: the training loss is nan; found when the losses kept "
                                                 r"on the GPU were read at iteration 4"):
        t.smoothed_loss


@pytest.mark.parametrize("nan_at, message", [
    (1, r"Iteration 1: the training loss is nan; training stopped before this iteration's update"),
    (0, r"Iteration 0: the training loss is nan; found when the losses kept on the GPU were read at iteration 1: "
        r"training stopped there \(the weights carry the updates of iterations 0 to 0\), no snapshot was written"),
])
def test_losses_are_read_when_read_every_are_waiting(tmp_path, gpu, monkeypatch, nan_at, message):
    from caffe.solver import solver as solver_module
    monkeypatch.setattr(solver_module, "LOSS_READ_EVERY", 2)
    s = make(tmp_path, display=0, max_iter=6)
    batches = random_batches(0, 6, NUM, DIM)
    batches[nan_at] = dict(batches[nan_at], data=np.full((NUM, DIM), np.nan, np.float32))
    Feeder(batches).attach(s.net)
    with pytest.raises(NonFiniteLossError, match=message):
        s.step(6)
    assert s.iter == 1  # the second loss waiting is the bound: read before iteration 1's update


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@given(display=st.integers(0, 4), average_loss=st.integers(1, 5), iters=st.integers(1, 9),
       read_every=st.integers(1, 4))
@example(display=0, average_loss=2, iters=9, read_every=1)  # no display: only the read-every bound reads
@example(display=5, average_loss=5, iters=3, read_every=4)  # nothing read before smoothed_loss is asked for
def test_deferred_losses_equal_reading_each_loss_at_once(display, average_loss, iters, read_every):
    """Whatever the display interval, smoothing window and read bound, the losses kept on the device give the
    displayed lines, smoothed_loss and Caffe's ring of losses that reading every loss at once gives."""
    from caffe.solver import solver as solver_module
    records = _Records()
    log = logging.getLogger("caffe")
    old_level, old_every = log.level, solver_module.LOSS_READ_EVERY
    context.set_mode_gpu()
    log.addHandler(records)
    log.setLevel(logging.INFO)
    solver_module.LOSS_READ_EVERY = read_every
    try:
        with tempfile.TemporaryDirectory() as tmp:
            s = make(Path(tmp), display=display, average_loss=average_loss, max_iter=iters)
            Feeder(random_batches(0, iters, NUM, DIM)).attach(s.net)
            raw = []
            s.add_callback(lambda: None, lambda: raw.append(0.0 + float(np.vdot(
                s.net.blobs["loss"].data.ravel(), s.net.blobs["loss"].diff.ravel()))))
            s.step(iters)
            smoothed = s.smoothed_loss
            ring = list(s.losses)
    finally:
        solver_module.LOSS_READ_EVERY = old_every
        log.removeHandler(records)
        log.setLevel(old_level)
        context.set_mode_cpu()
    shown = [(int(m.group(1)), m.group(2)) for msg in records.messages
             if (m := re.fullmatch(r"Iteration (\d+) \(\S+ iter/s, \S+s/\d+ iters\), loss = (\S+)", msg))]
    want = caffe_smoothed(raw, average_loss)
    assert shown == ([(i, fmt(want[i])) for i in range(0, iters, display)] if display else [])
    assert smoothed == want[-1]
    expect_ring = raw[:average_loss] if iters <= average_loss else \
        [raw[max(i for i in range(iters) if i % average_loss == slot)] for slot in range(average_loss)]
    assert ring == expect_ring

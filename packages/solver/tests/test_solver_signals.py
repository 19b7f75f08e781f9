"""SolverAction and SignalHandler (Caffe's sigint_effect / sighup_effect)."""
import os
import signal
import threading

import pytest

from caffe.solver import SignalHandler, SolverAction, SolverError, action_from_string

needs_sighup = pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP on this platform")


@pytest.mark.parametrize("text, action", [("stop", SolverAction.STOP), ("snapshot", SolverAction.SNAPSHOT),
                                          ("none", SolverAction.NONE), ("STOP", SolverAction.STOP),
                                          (SolverAction.SNAPSHOT, SolverAction.SNAPSHOT)])
def test_action_from_string(text, action):
    assert action_from_string(text) is action


def test_bad_effect_is_named():
    with pytest.raises(SolverError, match='Invalid signal effect "pause"'):
        action_from_string("pause")


def test_handler_is_not_installed_until_asked():
    before = signal.getsignal(signal.SIGINT)
    h = SignalHandler("stop", "snapshot")
    assert not h.installed
    assert signal.getsignal(signal.SIGINT) is before
    assert h.GetActionFunction()() is SolverAction.NONE


@needs_sighup
def test_signals_map_to_actions_and_previous_handlers_come_back():
    seen = []
    prev_int = signal.signal(signal.SIGINT, lambda *a: seen.append("int"))
    prev_hup = signal.signal(signal.SIGHUP, lambda *a: seen.append("hup"))
    try:
        mine_int, mine_hup = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGHUP)
        with SignalHandler(sigint_effect="stop", sighup_effect="snapshot") as h:
            action = h.GetActionFunction()
            os.kill(os.getpid(), signal.SIGHUP)
            assert action() is SolverAction.SNAPSHOT
            assert action() is SolverAction.NONE  # each signal is answered once
            os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt: the handler took it
            assert action() is SolverAction.STOP
            # both pending: SIGHUP is looked at first, as in Caffe's CheckForSignals
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGHUP)
            assert action() is SolverAction.SNAPSHOT
            assert action() is SolverAction.STOP
            assert action() is SolverAction.NONE  # a SIGINT is answered once too
        assert signal.getsignal(signal.SIGINT) is mine_int
        assert signal.getsignal(signal.SIGHUP) is mine_hup
        assert seen == []
    finally:
        signal.signal(signal.SIGINT, prev_int)
        signal.signal(signal.SIGHUP, prev_hup)


@needs_sighup
def test_effect_none_ignores_the_signal():
    with SignalHandler(sigint_effect="none", sighup_effect="none") as h:
        os.kill(os.getpid(), signal.SIGHUP)
        assert h.CheckForSignals() is SolverAction.NONE


def test_install_outside_the_main_thread_is_refused():
    errors = []

    def run():
        try:
            SignalHandler().install()
        except SolverError as exc:
            errors.append(str(exc))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert errors and "main thread" in errors[0]

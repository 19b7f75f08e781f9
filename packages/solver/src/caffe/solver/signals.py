"""SolverAction and the SIGINT/SIGHUP handler (Caffe's util/signal_handler.cpp).

The solver asks its action function once per iteration (after the update) and
before each test batch; the handler answers with the action configured for the
signal received since the last question (SIGHUP is looked at first, as in Caffe).
Handlers are installed only on request (`install()` or `with SignalHandler(...)`)
and the previous ones are put back on exit; nothing is installed by importing
or by building a solver.

Caffe's semantics, kept here: STOP ends Step after the current iteration (a snapshot
is written then only if that iteration is on the `snapshot` schedule); Solve then
writes its after-training snapshot when `snapshot_after_train` is set (the default)
and logs "Optimization stopped early.". SNAPSHOT writes a snapshot and trains on.
"""
from __future__ import annotations

import enum
import signal
import threading

from caffe.solver.params import SolverError


class SolverAction(enum.IntEnum):
    NONE = 0
    STOP = 1
    SNAPSHOT = 2


def action_from_string(value) -> SolverAction:
    """tools/caffe.cpp's GetRequestedAction: 'stop', 'snapshot' or 'none' (a SolverAction passes through)."""
    if isinstance(value, SolverAction):
        return value
    if isinstance(value, int):
        return SolverAction(value)
    name = str(value).strip().lower()
    table = {"stop": SolverAction.STOP, "snapshot": SolverAction.SNAPSHOT, "none": SolverAction.NONE}
    if name not in table:
        raise SolverError(f'Invalid signal effect "{value}" was specified (use stop, snapshot or none)')
    return table[name]


class SignalHandler:
    """Turns SIGINT / SIGHUP into SolverActions for `solver.SetActionFunction(handler.GetActionFunction())`."""

    def __init__(self, sigint_effect=SolverAction.STOP, sighup_effect=SolverAction.SNAPSHOT):
        self.sigint_action = action_from_string(sigint_effect)
        self.sighup_action = action_from_string(sighup_effect)
        self._got_sigint = False
        self._got_sighup = False
        self._previous: dict[int, object] = {}

    # -- installation ------------------------------------------------------------
    @staticmethod
    def _signals():
        sigs = [signal.SIGINT]
        if hasattr(signal, "SIGHUP"):  # absent on Windows
            sigs.append(signal.SIGHUP)
        return sigs

    def install(self) -> "SignalHandler":
        if self._previous:
            return self
        if threading.current_thread() is not threading.main_thread():
            raise SolverError("SignalHandler.install: signal handlers can only be installed from the main thread")
        for s in self._signals():
            self._previous[s] = signal.signal(s, self._handle)
        return self

    def uninstall(self) -> None:
        for s, prev in self._previous.items():
            signal.signal(s, prev if prev is not None else signal.SIG_DFL)
        self._previous.clear()

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    def __enter__(self) -> "SignalHandler":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()

    def _handle(self, signum, frame) -> None:
        if hasattr(signal, "SIGHUP") and signum == signal.SIGHUP:
            self._got_sighup = True
        elif signum == signal.SIGINT:
            self._got_sigint = True

    # -- questions from the solver -------------------------------------------------
    def CheckForSignals(self) -> SolverAction:
        if self._got_sighup:
            self._got_sighup = False
            return self.sighup_action
        if self._got_sigint:
            self._got_sigint = False
            return self.sigint_action
        return SolverAction.NONE

    check_for_signals = CheckForSignals

    def GetActionFunction(self):
        return self.CheckForSignals

    action_function = GetActionFunction

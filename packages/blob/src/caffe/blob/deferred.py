"""Values computed on the device that the host reads only when it needs them (the device stays busy).

In GPU mode a loss is a 0-d device array. Reading it on the host (`float()`) waits for the device and
copies it back; Caffe does that for every loss layer on every iteration. Here:

- `DeviceScalar` stands for a float that is an expression (+ - * / and negation, with Python numbers or
  other DeviceScalars) over 0-d device arrays. Nothing is read until the value is needed (`float()`,
  formatting, comparisons, `values()`); then every leaf of it goes back in ONE copy (a stack, cast to
  float64 on the device: exact for float32 and float64 leaves) and the expression is evaluated on the host
  in Python floats, in the order it was written. So `0.0 + float(a) + float(b)` and the lazy
  `0.0 + DeviceScalar(a) + DeviceScalar(b)` give the same bits: the solver's loss numbers in GPU mode are
  what reading every loss eagerly would give (Layer.Forward returns one per loss top in GPU mode, the Net
  sums them, the solver divides by iter_size and reads them at display iterations).
- `check(site, flag, value, make_error)`: a condition found on the device that must stop the program with
  a clear error (a label out of range) without a copy per call. The flag and the first offending value are
  folded into one pending entry per site on the device; every read of a DeviceScalar (and `flush()`)
  downloads the pending entries with it and raises `make_error(value)` for the first set flag. Per thread.

`values(scalars)` reads several DeviceScalars with one copy per device.
"""
from __future__ import annotations

import math
import operator
import threading
import weakref

import numpy as np

_local = threading.local()
_NUMBER = (int, float, np.integer, np.floating)


def _pending() -> "weakref.WeakKeyDictionary":
    pend = getattr(_local, "checks", None)
    if pend is None:
        pend = _local.checks = weakref.WeakKeyDictionary()
    return pend


def check(site, flag, value, make_error) -> None:
    """Defer a device-side check: `flag` (0-d bool device array) set means an error, `value` (0-d device array)
    is what make_error(value: float) -> Exception reports. Several checks of one site (a layer) since the last
    read fold into one (the first offending value is kept)."""
    pend = _pending()
    old = pend.get(site)
    if old is not None:
        xp = _module_of(flag)
        old_flag, old_value, _ = old
        value = xp.where(old_flag, xp.asarray(old_value).astype(np.float64), xp.asarray(value).astype(np.float64))
        flag = old_flag | flag
    pend[site] = (flag, value, make_error)


def pending_checks() -> int:
    """How many sites have checks waiting for the next read (this thread)."""
    return len(_pending())


def flush() -> None:
    """Read the pending device checks now (one copy per device) and raise the first failure."""
    _read([], take_checks=True)


def discard() -> None:
    """Forget this thread's pending checks without reading them (a net being torn down after an error)."""
    _pending().clear()


def _is_host(a) -> bool:
    return isinstance(a, (np.ndarray, np.generic, bool, int, float))


def _module_of(a):
    if _is_host(a):
        return np
    import cupy
    return cupy


def _device_of(a) -> int:
    dev = getattr(a, "device", None)
    return getattr(dev, "id", 0)


def _download(arrays) -> list[float]:
    """Host floats of 0-d device arrays: one stacked copy per device."""
    out: list[float | None] = [None] * len(arrays)
    by_device: dict[int, list[int]] = {}
    for i, a in enumerate(arrays):
        if _is_host(a):
            out[i] = float(a)
        else:
            by_device.setdefault(_device_of(a), []).append(i)
    if by_device:
        import cupy
        for dev, idx in by_device.items():
            with cupy.cuda.Device(dev):
                host = cupy.stack([arrays[i].reshape(()).astype(cupy.float64) for i in idx]).get()
            for k, i in enumerate(idx):
                out[i] = float(host[k])
    return out


def _read(scalars, take_checks: bool) -> list[float]:
    """Materialize `scalars` (DeviceScalars or numbers) and, when asked, this thread's pending checks."""
    leaves: list = []
    slots: dict[int, int] = {}
    for s in scalars:
        if isinstance(s, DeviceScalar) and s._value is None:
            s._collect(leaves, slots)
    checks = []
    if take_checks:
        pend = _pending()
        checks = [v for v in pend.values()]
        pend.clear()
    arrays = leaves + [c[0] for c in checks] + [c[1] for c in checks]
    host = _download(arrays) if arrays else []
    n, m = len(leaves), len(checks)
    for k, (_, _, make_error) in enumerate(checks):
        if host[n + k]:
            raise make_error(host[n + m + k])
    values = host[:n]
    out = []
    for s in scalars:
        if isinstance(s, DeviceScalar):
            out.append(s._evaluate(values, slots))
        else:
            out.append(float(s))
    return out


def values(scalars) -> list[float]:
    """The floats of several DeviceScalars (or numbers), read with one copy per device, pending checks too."""
    return _read(list(scalars), take_checks=True)


_OPS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv}


class DeviceScalar:
    """A float that lives on the device until read (see the module doc).

    DeviceScalar(array) wraps a 0-d (or one-element) device array; arithmetic with numbers or other
    DeviceScalars builds an expression without touching the device; float(), format(), comparisons,
    bool(), int() read it (once: the value is kept)."""

    __slots__ = ("_op", "_args", "_value", "__weakref__")

    def __init__(self, array=None, *, _op=None, _args=()):
        self._op = "leaf" if _op is None else _op
        self._args = (array,) if _op is None else _args
        self._value: float | None = None

    # -- building expressions ----------------------------------------------------------------------
    @classmethod
    def _node(cls, op, a, b):
        return cls(_op=op, _args=(a, b))

    def _bin(self, other, op, reverse=False):
        if not isinstance(other, (DeviceScalar,) + _NUMBER):
            return NotImplemented
        if isinstance(other, (np.integer, np.floating)):
            other = other.item()
        return DeviceScalar._node(op, other, self) if reverse else DeviceScalar._node(op, self, other)

    def __add__(self, other):
        return self._bin(other, "add")

    def __radd__(self, other):
        return self._bin(other, "add", True)

    def __sub__(self, other):
        return self._bin(other, "sub")

    def __rsub__(self, other):
        return self._bin(other, "sub", True)

    def __mul__(self, other):
        return self._bin(other, "mul")

    def __rmul__(self, other):
        return self._bin(other, "mul", True)

    def __truediv__(self, other):
        return self._bin(other, "truediv")

    def __rtruediv__(self, other):
        return self._bin(other, "truediv", True)

    def __neg__(self):
        return DeviceScalar(_op="neg", _args=(self,))

    def __pos__(self):
        return self

    # -- reading ------------------------------------------------------------------------------------
    @property
    def pending(self) -> bool:
        """Whether the value has not been read yet."""
        return self._value is None

    def _collect(self, leaves, slots) -> None:
        stack = [self]
        while stack:
            node = stack.pop()
            if not isinstance(node, DeviceScalar) or node._value is not None:
                continue
            if node._op == "leaf":
                key = id(node)
                if key not in slots:
                    slots[key] = len(leaves)
                    leaves.append(node._args[0])
            else:
                stack.extend(node._args)

    def _evaluate(self, values, slots) -> float:
        # iterative post-order walk (long sums stay well clear of the recursion limit)
        results: dict[int, float] = {}
        stack = [(self, False)]
        while stack:
            node, ready = stack.pop()
            if not isinstance(node, DeviceScalar):
                continue
            key = id(node)
            if key in results:
                continue
            if node._value is not None:
                results[key] = node._value
            elif node._op == "leaf":
                results[key] = values[slots[key]]
            elif not ready:
                stack.append((node, True))
                stack.extend((a, False) for a in node._args)
            else:
                args = [results[id(a)] if isinstance(a, DeviceScalar) else a for a in node._args]
                results[key] = -args[0] if node._op == "neg" else _OPS[node._op](*args)
        self._value = float(results[id(self)])
        return self._value

    def value(self) -> float:
        if self._value is None:
            _read([self], take_checks=True)
        return self._value

    def __float__(self) -> float:
        return self.value()

    def __int__(self) -> int:
        return int(self.value())

    def __bool__(self) -> bool:
        return bool(self.value())

    def __round__(self, ndigits=None):
        return round(self.value(), ndigits)

    def __abs__(self) -> float:
        return abs(self.value())

    def __format__(self, spec) -> str:
        return format(self.value(), spec)

    def __repr__(self) -> str:
        return f"DeviceScalar({self.value()!r})"

    def __str__(self) -> str:
        return str(self.value())

    def __hash__(self) -> int:
        return hash(self.value())

    def __eq__(self, other):
        return self.value() == (float(other) if isinstance(other, DeviceScalar) else other)

    def __ne__(self, other):
        return not self.__eq__(other)

    def __lt__(self, other):
        return self.value() < float(other)

    def __le__(self, other):
        return self.value() <= float(other)

    def __gt__(self, other):
        return self.value() > float(other)

    def __ge__(self, other):
        return self.value() >= float(other)

    def is_finite(self) -> bool:
        return math.isfinite(self.value())

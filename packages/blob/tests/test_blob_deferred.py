"""caffe.blob.deferred: lazy device scalars give exactly the floats of eager reads; deferred device checks raise
at the next read. Host (NumPy) leaves run in the normal run; device leaves (one copy per read) under a GPU or the
CuPy stand-in."""
import gc
import math
import struct

import numpy as np
import pytest
from hypothesis import given, strategies as st

from caffe.blob import context, deferred
from caffe.blob.deferred import DeviceScalar

OPS = ("add", "sub", "mul", "truediv", "radd", "rsub", "rmul", "neg")
finite32 = st.floats(-1e6, 1e6, width=32, allow_subnormal=False)
step = st.tuples(st.sampled_from(OPS), st.one_of(finite32, st.integers(1, 9)), st.booleans())


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def apply(acc, op, other):
    if op == "neg":
        return -acc
    if op.startswith("r"):
        return {"radd": lambda: other + acc, "rsub": lambda: other - acc, "rmul": lambda: other * acc}[op]()
    return {"add": lambda: acc + other, "sub": lambda: acc - other, "mul": lambda: acc * other,
            "truediv": lambda: acc / other}[op]()


def run(program, leaf):
    """The program with every `lazy` operand a leaf (lazy) or its float (eager); starts at 0.0 as a loss sum."""
    eager, lazy = 0.0, 0.0
    for op, value, is_leaf in program:
        if op == "truediv" and (is_leaf or value == 0):
            value, is_leaf = 3, False  # a divisor the eager side takes as the solver does (iter_size)
        v32 = np.float32(value) if is_leaf else value
        eager = apply(eager, op, float(v32) if is_leaf else value)
        lazy = apply(lazy, op, DeviceScalar(leaf(v32)) if is_leaf else value)
    return eager, lazy


@given(st.lists(step, max_size=12))
def test_lazy_expressions_give_the_eager_floats_bit_for_bit(program):
    eager, lazy = run(program, lambda v: np.asarray(v))
    got = float(lazy)
    assert bits(got) == bits(float(eager)) or (math.isnan(got) and math.isnan(eager))


def test_scalars_behave_as_floats():
    a = DeviceScalar(np.float32(1.5))
    b = 0.0 + a * 2
    assert b.pending and float(b) == 3.0 and not b.pending
    assert f"{b:g}" == "3" and "%g" % b == "3" and b == 3 and b > 2 and int(b) == 3 and bool(b)
    assert round(DeviceScalar(np.float32(2.25)), 1) == 2.2 and abs(-a) == 1.5
    assert DeviceScalar(np.float64(np.nan)).is_finite() is False
    assert deferred.values([a, 2, b]) == [1.5, 2.0, 3.0]


class Site:
    pass


def error(value):
    return ValueError(f"bad value {value:g}")


def test_checks_raise_at_the_next_read_with_the_first_value():
    deferred.discard()
    site = Site()
    deferred.check(site, np.bool_(False), np.float32(1), error)
    deferred.check(site, np.bool_(True), np.float32(7), error)
    deferred.check(site, np.bool_(True), np.float32(9), error)  # folded: the first offending value is kept
    assert deferred.pending_checks() == 1
    with pytest.raises(ValueError, match="bad value 7"):
        float(DeviceScalar(np.float32(1)))
    assert deferred.pending_checks() == 0
    deferred.flush()  # nothing left
    deferred.check(site, np.bool_(False), np.float32(3), error)
    assert float(DeviceScalar(np.float32(2))) == 2.0
    deferred.check(site, np.bool_(True), np.float32(4), error)
    with pytest.raises(ValueError, match="bad value 4"):
        deferred.flush()
    deferred.check(site, np.bool_(True), np.float32(4), error)
    deferred.discard()
    deferred.flush()


def test_a_dead_site_drops_its_check():
    deferred.discard()
    site = Site()
    deferred.check(site, np.bool_(True), np.float32(4), error)
    del site
    gc.collect()
    assert deferred.pending_checks() == 0
    deferred.flush()


@pytest.mark.gpu
@pytest.mark.skipif(not context.gpu_available(), reason="no GPU (CuPy with a CUDA device, or the CuPy stand-in)")
@given(st.lists(step, max_size=12))
def test_device_leaves_give_the_eager_floats_bit_for_bit(program):
    import cupy
    eager, lazy = run(program, lambda v: cupy.asarray(np.asarray(v)).reshape(()))
    got = float(lazy)
    assert bits(got) == bits(float(eager)) or (math.isnan(got) and math.isnan(eager))


@pytest.mark.gpu
@pytest.mark.skipif(not context.cupy_standin(), reason="copies are counted by the CuPy stand-in only")
def test_one_read_is_one_copy():
    import cupy
    from caffe.blob._standin import transfers
    deferred.discard()
    xs = cupy.arange(10, dtype=cupy.float32)
    scalars = [0.0 + DeviceScalar(xs[i]) / 2 for i in range(10)]
    site = Site()
    deferred.check(site, xs[3] > 5, xs[3], error)
    deferred.check(Site(), xs[9] > 100, xs[9], error)
    with transfers.counting() as delta:
        total = sum(scalars)  # builds an expression: nothing read
    assert delta["d2h"] == 0 and total.pending
    with transfers.counting() as delta:
        got = deferred.values(scalars + [total])
    assert delta["d2h"] == 1 and got == [i / 2 for i in range(10)] + [22.5]
    deferred.check(site, xs[7] > 5, xs[7], error)
    with transfers.counting() as delta, pytest.raises(ValueError, match="bad value 7"):
        float(DeviceScalar(xs[1]))
    assert delta["d2h"] == 1

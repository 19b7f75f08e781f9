"""SyncedMemory as a state machine: heads follow Caffe's transitions and data is never lost.

The model tracks the expected head and the bytes the memory must hold. GPU rules
run only where a usable GPU exists (they are simply not generated otherwise);
`test_gpu_rules_ran_on_gpu` records whether they did.
"""
import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from caffe.blob import SyncedMemory, context
from caffe.blob.syncedmem import HEAD_AT_CPU, HEAD_AT_GPU, SYNCED, UNINITIALIZED

HAS_GPU = context.gpu_available()


class SyncedMemoryMachine(RuleBasedStateMachine):
    @initialize(nbytes=st.integers(0, 64).map(lambda n: n * 4))
    def make(self, nbytes):
        self.mem = SyncedMemory(nbytes)
        self.expected = np.zeros(nbytes, np.uint8)  # lazily zero-filled on first touch
        self.head = UNINITIALIZED

    @invariant()
    def head_matches(self):
        if hasattr(self, "mem"):
            assert self.mem.head == self.head, (self.mem.head_name, self.head)

    # -- host rules -------------------------------------------------------------
    @rule()
    def read_cpu(self):
        view = self.mem.cpu_data()
        assert not view.flags.writeable
        np.testing.assert_array_equal(view, self.expected)
        if self.head == UNINITIALIZED:
            self.head = HEAD_AT_CPU
        elif self.head == HEAD_AT_GPU:
            self.head = SYNCED

    @rule(seed=st.integers(0, 2**32 - 1))
    def write_cpu(self, seed):
        view = self.mem.mutable_cpu_data()
        assert view.flags.writeable
        values = np.random.default_rng(seed).integers(0, 256, self.mem.size, dtype=np.uint8)
        view[...] = values
        self.expected = values
        self.head = HEAD_AT_CPU

    @rule()
    def typed_views_share_memory(self):
        if self.mem.size % 4:
            return
        as_f32 = self.mem.mutable_cpu_data(np.float32)
        as_u8 = self.mem.cpu_data()
        assert as_f32.size * 4 == as_u8.size == self.mem.size
        if self.mem.size:
            assert np.shares_memory(as_f32, as_u8)
        np.testing.assert_array_equal(as_u8, self.expected)
        self.head = HEAD_AT_CPU

    @rule(seed=st.integers(0, 2**32 - 1))
    def borrow_cpu(self, seed):
        outside = np.random.default_rng(seed).integers(0, 256, self.mem.size, dtype=np.uint8)
        self.mem.set_cpu_data(outside)
        assert not self.mem.own_cpu_data
        self.expected = outside.copy()
        self.head = HEAD_AT_CPU
        if self.mem.size:
            outside[0] ^= 0xFF  # borrowed, not copied: the change must show through
            self.expected[0] ^= 0xFF

    # -- device rules (only with a usable GPU) ----------------------------------
    @precondition(lambda self: HAS_GPU)
    @rule()
    def read_gpu(self):
        view = self.mem.gpu_data()
        np.testing.assert_array_equal(view.get(), self.expected)
        if self.head == UNINITIALIZED:
            self.head = HEAD_AT_GPU
        elif self.head == HEAD_AT_CPU:
            self.head = SYNCED
        _GPU_RULES_RAN.append(1)

    @precondition(lambda self: HAS_GPU)
    @rule(seed=st.integers(0, 2**32 - 1))
    def write_gpu(self, seed):
        import cupy
        values = np.random.default_rng(seed).integers(0, 256, self.mem.size, dtype=np.uint8)
        self.mem.mutable_gpu_data()[...] = cupy.asarray(values)
        self.expected = values
        self.head = HEAD_AT_GPU
        _GPU_RULES_RAN.append(1)

    @precondition(lambda self: HAS_GPU and self.head == HEAD_AT_CPU)
    @rule()
    def push_async(self):
        import cupy
        stream = cupy.cuda.Stream(non_blocking=True)
        self.mem.async_gpu_push(stream)
        stream.synchronize()
        self.head = SYNCED
        _GPU_RULES_RAN.append(1)


_GPU_RULES_RAN: list[int] = []

# gpu-marked: it also runs where a device is present (a real GPU or the CuPy stand-in), with its GPU rules
TestSyncedMemoryMachine = pytest.mark.gpu(SyncedMemoryMachine.TestCase)


@pytest.mark.gpu
def test_gpu_rules_ran_on_gpu():
    if not HAS_GPU:
        pytest.skip("no usable GPU here: the state machine's GPU rules were not generated")
    assert _GPU_RULES_RAN, "GPU rules never ran although a GPU is available"


def test_gpu_request_without_gpu_is_one_clear_error():
    if HAS_GPU:
        pytest.skip("a GPU is available")
    mem = SyncedMemory(16)
    with pytest.raises(context.NoGPUError, match="GPU"):
        mem.gpu_data()
    with pytest.raises(context.NoGPUError, match="GPU"):
        mem.mutable_gpu_data()
    assert mem.head == UNINITIALIZED  # nothing half-done
    with pytest.raises(context.NoGPUError):
        context.set_mode_gpu()
    assert context.mode() == context.CPU


def test_lazy_allocation():
    mem = SyncedMemory(1 << 20)
    assert mem.head == UNINITIALIZED and not mem.own_cpu_data
    mem.cpu_data()
    assert mem.own_cpu_data and mem.head == HEAD_AT_CPU


def test_async_push_needs_head_at_cpu():
    mem = SyncedMemory(8)
    with pytest.raises(RuntimeError, match="HEAD_AT_CPU"):
        mem.async_gpu_push()


def test_borrow_too_small_buffer_is_refused():
    mem = SyncedMemory(16)
    with pytest.raises(ValueError, match="16"):
        mem.set_cpu_data(np.zeros(3, np.uint8))

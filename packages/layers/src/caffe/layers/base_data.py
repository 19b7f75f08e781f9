"""BaseDataLayer and BasePrefetchingDataLayer (Caffe's base_data_layer.cpp).

A prefetching layer fills `data_param.prefetch` batches (default 4) in a background
thread, as Caffe's InternalThread: the runtime context (mode, device, solver
count/rank, a seed drawn from the parent's generator) is carried into the thread
with context.capture()/install(), so runs are reproducible under the runtime seed.
Two queues (free, full) bound the work ahead; Forward hands the oldest full batch to
the tops without copying (the top borrows the batch's memory, as Caffe's
set_cpu_data) and gives the previous one back to the thread.

GPU mode (Caffe's async_gpu_push): the thread also copies each batch it loads to the
device, on its own CUDA stream, from pinned host memory, and waits for that copy before
handing the batch over; Forward then lends the tops the batch's device memory
(set_gpu_data), so the training thread copies nothing. The thread pushes from the first
GPU-mode Forward on (or from the start when the layer was set up in GPU mode), to the
device that Forward ran on; batches loaded before are uploaded by the consumer as before.

The thread holds only a weak reference to its layer: dropping the net stops it.
An exception in the thread reaches the caller of Forward with its message.
Forward waits for a batch as long as it takes (Caffe's blocking queue), unless `stall_cpu_s` is set
(the tests set it): then a thread that burns that much CPU without delivering fails Forward.
"""
from __future__ import annotations

import os
import queue
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from caffe.blob import context
from caffe.layers.data_transformer import DataError, DataTransformer, decode_threads
from caffe.layers.db import DBError
from caffe.layers.layer import Layer, LayerError

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def decode_pool() -> ThreadPoolExecutor:
    """A process-wide pool that decodes images in parallel (Pillow releases the GIL while decoding)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=decode_threads(), thread_name_prefix="caffe-decode")
        return _pool


def _forget_pool_in_child() -> None:
    # A forked child inherits the pool but none of its threads: work submitted there would wait forever.
    global _pool, _pool_lock
    _pool = None
    _pool_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


def parallel_map(fn, items):
    """[fn(x) for x in items], on the decode pool when there is more than one item."""
    if len(items) <= 1 or decode_threads() == 1:
        return [fn(x) for x in items]
    return list(decode_pool().map(fn, items))


def host_array(shape, dtype, pinned: bool = False) -> np.ndarray:
    """An uninitialized host array; pinned (page-locked: the device copies it asynchronously) on request."""
    if pinned:
        import cupyx
        return cupyx.empty_pinned(tuple(shape), dtype=dtype)
    return np.empty(shape, dtype=dtype)


class Batch:
    """One prefetched batch: data (N, ...) and optional labels, as NumPy arrays in the tops' dtype, and in
    GPU mode their device copies (gpu_data, gpu_label; `pushed` while they hold this batch's values)."""
    __slots__ = ("data", "label", "pinned", "gpu_data", "gpu_label", "pushed")

    def __init__(self, data: np.ndarray, label: np.ndarray | None, pinned: bool = False):
        self.data = data
        self.label = label
        self.pinned = pinned
        self.gpu_data = self.gpu_label = None
        self.pushed = False

    def reshape_data(self, shape) -> np.ndarray:
        shape = tuple(int(s) for s in shape)
        if self.data.shape != shape:
            self.data = host_array(shape, self.data.dtype, self.pinned)
        return self.data

    def push(self, stream) -> None:
        """Copy data and label to the current device on `stream` (Caffe's async_gpu_push); the caller waits
        for the stream before handing the batch over."""
        self.gpu_data = _device_copy(self.gpu_data, self.data, stream)
        if self.label is not None:
            self.gpu_label = _device_copy(self.gpu_label, self.label, stream)
        self.pushed = True


def _device_copy(dev, host: np.ndarray, stream):
    import cupy
    if dev is None or dev.shape != host.shape or dev.dtype != host.dtype or dev.device.id != cupy.cuda.Device().id:
        dev = cupy.empty(host.shape, dtype=host.dtype)
    dev.set(np.ascontiguousarray(host), stream=stream)
    return dev


class PrefetchStalled(RuntimeError):
    """Forward gave up on a prefetch thread that used `stall_cpu_s` seconds of CPU without delivering a batch
    (not a LayerError: a test that expects a data error must not take a hang for it)."""


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc):
        self.exc = exc


def assign_top(top, array, on_device: bool = False) -> None:
    """Make `top` hold `array` (a host array, or a device array with on_device): borrow its memory when sizes
    agree (Caffe's set_cpu_data / set_gpu_data), else copy."""
    top.reshape(array.shape)
    mem = top.data_mem
    borrow = array.dtype == top.dtype and array.flags.c_contiguous and mem.size == array.nbytes
    if on_device:
        if borrow:
            mem.set_gpu_data(array)
        else:
            top.mutable_gpu_data()[...] = array
    elif borrow:
        top.set_cpu_data(array)
    else:
        top.mutable_cpu_data()[...] = array


class BaseDataLayer(Layer):
    """A layer with no bottoms whose tops are data (and labels): owns a DataTransformer."""
    exact_num_bottom_blobs = 0
    min_top_blobs = 1
    max_top_blobs = 2

    def layer_setup(self, bottom, top):
        self.output_labels = len(top) > 1
        self.transform_param = self.layer_param.transform_param
        self.data_transformer = DataTransformer(self.transform_param, self.phase,
                                                name=f"Layer '{self.name}' ({self.type})")
        self.data_transformer.init_rand()
        self.data_layer_setup(bottom, top)

    def data_layer_setup(self, bottom, top):
        pass

    def DataLayerSetUp(self, bottom, top):  # Caffe's name: the subclass's data_layer_setup (not an alias of this pass)
        self.data_layer_setup(bottom, top)

    def reshape(self, bottom, top):
        pass  # data layers reshape their tops in Forward, batch by batch

    def backward_cpu(self, top, propagate_down, bottom):
        pass

    def backward_gpu(self, top, propagate_down, bottom):
        pass


def _prefetch_loop(layer_ref, free: queue.Queue, full: queue.Queue, stop: threading.Event, state) -> None:
    context.install(state)
    started = False
    streams = {}  # device -> this thread's CUDA stream for the pushes
    try:
        while not stop.is_set():
            try:
                batch = free.get(timeout=0.5)
            except queue.Empty:
                if layer_ref() is None:
                    return
                continue
            if batch is None or stop.is_set():
                return
            layer = layer_ref()
            if layer is None:
                return
            try:
                if not started:
                    layer.thread_begin()  # open files/databases in the thread that reads them
                    started = True
                batch.pushed = False
                layer.load_batch(batch)
                device = layer._push_device
                if device is not None:
                    _push(batch, device, streams)
            except BaseException as exc:  # hand it to Forward, then stop
                full.put(_Failure(exc))
                return
            finally:
                del layer
            full.put(batch)
    finally:
        layer = layer_ref()
        if layer is not None and started:
            try:
                layer.thread_end()
            except Exception:
                pass


def _push(batch: Batch, device: int, streams: dict) -> None:
    import cupy
    with cupy.cuda.Device(device):
        stream = streams.get(device)
        if stream is None:
            stream = streams[device] = cupy.cuda.Stream(non_blocking=True)
        batch.push(stream)
        stream.synchronize()  # the batch is whole on the device before the training thread sees it


def _stop_thread(stop: threading.Event, free: queue.Queue, thread: threading.Thread) -> None:
    stop.set()
    free.put(None)
    if thread is not threading.current_thread():
        thread.join(timeout=10)


class BasePrefetchingDataLayer(BaseDataLayer):
    """Subclasses implement data_layer_setup (shape the tops), load_batch(batch) (fill one Batch,
    on the prefetch thread), and optionally thread_begin/thread_end (per-thread resources)."""

    # CPU seconds the process may spend while Forward waits for one batch (None: wait as long as it takes,
    # as Caffe). The waiting thread uses none, so it is the loading side's work: a thread that spins without
    # delivering (a bug) uses CPU at whatever rate it gets, while a loaded machine slows a healthy thread
    # without making it use more CPU per batch. The tests set it; a wall-clock limit would fail under load.
    stall_cpu_s: float | None = None

    def prefetch_count(self) -> int:
        n = int(self.layer_param.data_param.prefetch) if self.layer_param.HasField("data_param") else 4
        return max(1, n)

    def layer_setup(self, bottom, top):
        on_gpu = context.mode() == context.GPU and context.gpu_available()
        # the device the prefetch thread pushes batches to (None: it does not push); set before the thread starts
        self._push_device = context.device() if on_gpu else None
        super().layer_setup(bottom, top)
        dtype = top[0].dtype
        self._batches = [
            Batch(host_array(top[0].shape, dtype, on_gpu),
                  host_array(top[1].shape, top[1].dtype, on_gpu) if self.output_labels else None, on_gpu)
            for _ in range(self.prefetch_count())
        ]
        self._free: queue.Queue = queue.Queue()
        self._full: queue.Queue = queue.Queue()
        for b in self._batches:
            self._free.put(b)
        self._current = None
        self._failure = None
        self.start_internal_thread()

    def start_internal_thread(self) -> None:
        state = context.capture()  # Caffe's InternalThread: mode, device, solver coords, a fresh seed
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=_prefetch_loop, args=(weakref.ref(self), self._free, self._full, self._stop, state),
            name=f"caffe-prefetch-{self.name}", daemon=True)
        self._thread.start()
        self._finalizer = weakref.finalize(self, _stop_thread, self._stop, self._free, self._thread)

    StartInternalThread = start_internal_thread

    def stop_internal_thread(self) -> None:
        fin = getattr(self, "_finalizer", None)
        if fin is not None:
            fin()

    StopInternalThread = stop_internal_thread
    close = stop_internal_thread

    def thread_begin(self) -> None:
        pass

    def thread_end(self) -> None:
        pass

    def load_batch(self, batch: Batch) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement load_batch")

    def _next_full(self) -> Batch:
        if self._failure is not None:
            raise self._failure
        waited_from = time.process_time()
        while True:
            try:
                item = self._full.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive():
                    self._failure = self.error("the prefetch thread stopped without delivering data")
                    raise self._failure
                used = time.process_time() - waited_from
                if self.stall_cpu_s is not None and used > self.stall_cpu_s:
                    self._stop.set()  # it stops if it ever comes back; not joined (at exit neither): it would not answer
                    self._finalizer.detach()
                    raise PrefetchStalled(f"Layer '{self.name}' ({self.type}): the prefetch thread used {used:.1f} s "
                                          f"of CPU without delivering a batch (stall_cpu_s = {self.stall_cpu_s})")
        if isinstance(item, _Failure):
            exc = item.exc
            known = isinstance(exc, (DataError, LayerError, DBError))
            msg = str(exc) if known else f"{type(exc).__name__}: {exc}"
            if msg.startswith(f"Layer '{self.name}'"):
                self._failure = LayerError(msg)
            else:
                self._failure = self.error(msg)
            self._failure.__cause__ = exc
            raise self._failure
        return item

    def _next_batch(self) -> Batch:
        if self._current is not None:
            self._free.put(self._current)
            self._current = None
        batch = self._next_full()
        self._current = batch
        return batch

    def forward_cpu(self, bottom, top):
        self._assign_host(self._next_batch(), top)

    def forward_gpu(self, bottom, top):
        self._push_device = context.device()  # from now on the thread pushes what it loads to this device
        batch = self._next_batch()
        if not (batch.pushed and batch.gpu_data.device.id == context.device()):
            return self._assign_host(batch, top)  # loaded before pushing began: uploaded on first use
        assign_top(top[0], batch.gpu_data, on_device=True)
        if self.output_labels:
            assign_top(top[1], batch.gpu_label, on_device=True)

    def _assign_host(self, batch, top):
        assign_top(top[0], batch.data)
        if self.output_labels:
            assign_top(top[1], batch.label)

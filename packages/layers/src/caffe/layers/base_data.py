"""BaseDataLayer and BasePrefetchingDataLayer (Caffe's base_data_layer.cpp).

A prefetching layer fills `data_param.prefetch` batches (default 4) in a background
thread, as Caffe's InternalThread: the runtime context (mode, device, solver
count/rank, a seed drawn from the parent's generator) is carried into the thread
with context.capture()/install(), so runs are reproducible under the runtime seed.
Two queues (free, full) bound the work ahead; Forward hands the oldest full batch to
the tops without copying (the top borrows the batch's memory, as Caffe's
set_cpu_data) and gives the previous one back to the thread.

The thread holds only a weak reference to its layer: dropping the net stops it.
An exception in the thread reaches the caller of Forward with its message.
"""
from __future__ import annotations

import queue
import threading
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


def parallel_map(fn, items):
    """[fn(x) for x in items], on the decode pool when there is more than one item."""
    if len(items) <= 1 or decode_threads() == 1:
        return [fn(x) for x in items]
    return list(decode_pool().map(fn, items))


class Batch:
    """One prefetched batch: data (N, ...) and optional labels, as NumPy arrays in the tops' dtype."""
    __slots__ = ("data", "label")

    def __init__(self, data: np.ndarray, label: np.ndarray | None):
        self.data = data
        self.label = label

    def reshape_data(self, shape) -> np.ndarray:
        shape = tuple(int(s) for s in shape)
        if self.data.shape != shape:
            self.data = np.empty(shape, dtype=self.data.dtype)
        return self.data


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc):
        self.exc = exc


def assign_top(top, array: np.ndarray) -> None:
    """Make `top` hold `array`: borrow its memory when sizes agree (Caffe's set_cpu_data), else copy."""
    top.reshape(array.shape)
    mem = top.data_mem
    if array.dtype == top.dtype and array.flags.c_contiguous and mem.size == array.nbytes:
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

    DataLayerSetUp = data_layer_setup

    def reshape(self, bottom, top):
        pass  # data layers reshape their tops in Forward, batch by batch

    def backward_cpu(self, top, propagate_down, bottom):
        pass

    def backward_gpu(self, top, propagate_down, bottom):
        pass


def _prefetch_loop(layer_ref, free: queue.Queue, full: queue.Queue, stop: threading.Event, state) -> None:
    context.install(state)
    started = False
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
                layer.load_batch(batch)
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


def _stop_thread(stop: threading.Event, free: queue.Queue, thread: threading.Thread) -> None:
    stop.set()
    free.put(None)
    if thread is not threading.current_thread():
        thread.join(timeout=10)


class BasePrefetchingDataLayer(BaseDataLayer):
    """Subclasses implement data_layer_setup (shape the tops), load_batch(batch) (fill one Batch,
    on the prefetch thread), and optionally thread_begin/thread_end (per-thread resources)."""

    def prefetch_count(self) -> int:
        n = int(self.layer_param.data_param.prefetch) if self.layer_param.HasField("data_param") else 4
        return max(1, n)

    def layer_setup(self, bottom, top):
        super().layer_setup(bottom, top)
        dtype = top[0].dtype
        self._batches = [
            Batch(np.empty(top[0].shape, dtype=dtype),
                  np.empty(top[1].shape, dtype=top[1].dtype) if self.output_labels else None)
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
        while True:
            try:
                item = self._full.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive():
                    self._failure = self.error("the prefetch thread stopped without delivering data")
                    raise self._failure
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

    def forward_cpu(self, bottom, top):
        if self._current is not None:
            self._free.put(self._current)
            self._current = None
        batch = self._next_full()
        self._current = batch
        assign_top(top[0], batch.data)
        if self.output_labels:
            assign_top(top[1], batch.label)

    forward_gpu = forward_cpu  # tops are host memory; SyncedMemory moves them on first GPU use

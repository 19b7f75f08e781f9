"""Memory checks while a Net is built: refuse a net whose blobs cannot fit, naming what is too big.

Blob memory is allocated lazily (at the first Forward/Backward), and Linux overcommits, so
a net with one mistyped dimension (an Input width of 65536, `num_output: 99999`) would
otherwise build, then be killed by the OOM killer without a word. Net setup therefore asks,
after each layer: do the blobs not yet allocated still fit in the memory available (host
memory on the CPU, the device's on the GPU)? A TRAIN net is asked once more when it is
built, with the diffs that Backward will allocate. An allocation that fails inside a
layer's setup (a filler on a huge weight blob) is re-raised naming the layer, the blob, its
shape and the bytes. All raise caffe.blob.memory.BlobMemoryError (a MemoryError).
"""
from __future__ import annotations

from caffe.blob import context
from caffe.blob.fileio import format_bytes
from caffe.blob import memory as _memory
from caffe.blob.memory import CHECK_THRESHOLD, BlobMemoryError
from caffe.blob.syncedmem import UNINITIALIZED

_HINT = "reduce the batch size or the input / num_output dimensions, or free memory"


def _available() -> tuple[int | None, str]:
    if context.mode() == context.GPU and context.gpu_available():
        return _memory.available_device_memory(), "GPU memory"
    return _memory.available_memory(), "memory"


def _nbytes(blob) -> int:
    return int(blob.count()) * blob.dtype.itemsize


def _unallocated(mem) -> bool:
    return mem is None or mem.head == UNINITIALIZED


def _describe(blob) -> str:
    return f"shape {blob.shape_string()}, {format_bytes(_nbytes(blob))}"


def pending_data(net) -> list[tuple[int, int]]:
    """[(blob_id, bytes)] of the net's blobs whose data is not allocated yet (each memory once)."""
    seen, out = set(), []
    for blob_id, blob in enumerate(net._blobs):
        mem = getattr(blob, "data_mem", None)
        key = id(mem) if mem is not None else ("blob", blob_id)
        if key in seen or not _unallocated(mem):
            continue
        seen.add(key)
        out.append((blob_id, _nbytes(blob)))
    return out


class _SetupTally:
    """What the net's tops will need, added up layer by layer (each blob once)."""

    def __init__(self):
        self.counted: set[int] = set()
        self.total = 0
        self.available: int | None = None  # last reading; re-read only when the total comes near it


def check_after_setup(net, layer_id: int) -> None:
    """After layer `layer_id`'s SetUp: the data of every blob so far must fit in what is available."""
    tally = net.__dict__.get("_memcheck_tally")
    if tally is None:
        tally = net.__dict__["_memcheck_tally"] = _SetupTally()
    for blob_id in net.top_id_vecs[layer_id]:
        if blob_id in tally.counted:
            continue  # in place: the bottom's memory
        tally.counted.add(blob_id)
        blob = net._blobs[blob_id]
        if _unallocated(getattr(blob, "data_mem", None)):
            tally.total += _nbytes(blob)
    total = tally.total
    if total < CHECK_THRESHOLD or (tally.available is not None and total <= tally.available // 2):
        return  # far from the limit: spare the /proc reads
    available, kind = _available()
    tally.available = available
    if available is None or total <= available:
        return
    layer = net.layers[layer_id]
    tops = [(_nbytes(net._blobs[i]), i) for i in net.top_id_vecs[layer_id]]
    if tops:
        _, blob_id = max(tops)
        blob = net._blobs[blob_id]
        what = (f"its top '{net.blob_names[blob_id]}' ({_describe(blob)}) brings the data of the net's blobs "
                f"to {format_bytes(total)}")
    else:
        what = f"the data of the net's blobs needs {format_bytes(total)}"
    raise BlobMemoryError(f"Net '{net.name}': not enough {kind} at layer '{layer.name}' ({layer.type}): {what}, "
                          f"but only {format_bytes(available)} is available; {_HINT}", total, available)


def check_train_net(net) -> None:
    """A TRAIN net, once built: data plus the diffs Backward allocates must fit."""
    if net.phase != 0:
        return
    items = [(n, f"blob '{net.blob_names[i]}' (data)") for i, n in pending_data(net)]
    seen = set()
    for blob_id, blob in enumerate(net._blobs):
        if not net.blob_need_backward[blob_id]:
            continue
        mem = getattr(blob, "diff_mem", None)
        if mem is not None and (id(mem) in seen or not _unallocated(mem)):
            continue
        seen.add(id(mem))
        items.append((_nbytes(blob), f"blob '{net.blob_names[blob_id]}' (diff)"))
    for param_id, blob in enumerate(net.learnable_params):
        mem = getattr(blob, "diff_mem", None)
        if mem is not None and (id(mem) in seen or not _unallocated(mem)):
            continue
        seen.add(id(mem))
        layer_id, index = net.param_layer_indices[net.learnable_param_ids.index(param_id)]  # the owner
        items.append((_nbytes(blob), f"param {index} of layer '{net.layer_names[layer_id]}' (diff)"))
    total = sum(n for n, _ in items)
    tally = net.__dict__.get("_memcheck_tally")
    if total < CHECK_THRESHOLD or (tally is not None and tally.available is not None
                                   and total <= tally.available // 2):
        return  # far from the last reading: spare the /proc reads
    available, kind = _available()
    if available is None or total <= available:
        return
    largest = ", ".join(f"{what} {format_bytes(n)}" for n, what in sorted(items, key=lambda t: -t[0])[:3])
    raise BlobMemoryError(f"Net '{net.name}' (TRAIN): its blobs' data and diffs need {format_bytes(total)}, but "
                          f"only {format_bytes(available)} of {kind} is available (largest: {largest}); {_HINT}",
                          total, available)


def _blob_in_traceback(exc, nbytes: int):
    """The Blob being allocated when `exc` was raised: a local of one of the frames (a filler's `blob`,
    a Blob method's `self`) whose size is the one that failed. Diagnostics only."""
    from caffe.blob import Blob
    tb = exc.__traceback__
    found = None
    while tb is not None:
        for value in list(tb.tb_frame.f_locals.values()):
            if isinstance(value, Blob) and _nbytes(value) == nbytes:
                found = value
        tb = tb.tb_next
    return found


def layer_memory_error(net, layer_id: int, exc: MemoryError) -> BlobMemoryError:
    """A MemoryError inside layer `layer_id`'s SetUp, re-raised naming the layer and the blob."""
    layer = net.layers[layer_id]
    nbytes = getattr(exc, "nbytes", None)
    candidates = [(f"param blob {j}", b) for j, b in enumerate(layer.blobs)]
    candidates += [(f"top '{net.blob_names[i]}'", net._blobs[i]) for i in net.top_id_vecs[layer_id]]
    blob_text = ""
    if nbytes is not None:
        culprit = next(((name, b) for name, b in candidates if _nbytes(b) == nbytes), None)
        if culprit is None:
            blob = _blob_in_traceback(exc, nbytes)
            culprit = ("a parameter or buffer blob", blob) if blob else None
        blob_text = (f" for {culprit[0]} ({_describe(culprit[1])})" if culprit is not None
                     else f" for a blob of {format_bytes(nbytes)}")
    return BlobMemoryError(f"Layer '{layer.name}' ({layer.type}) of net '{net.name}': out of memory{blob_text}: "
                           f"{exc}; {_HINT}", nbytes, getattr(exc, "available", None))

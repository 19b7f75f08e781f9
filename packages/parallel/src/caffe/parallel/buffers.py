"""Caffe's contiguous parameter layout (Params/GPUParams and apply_buffers in parallel.cpp).

Every learnable parameter's data lives in one flat buffer and its diff in another, each parameter
blob borrowing its slice (SyncedMemory.set_cpu_data / set_gpu_data), so one collective call moves all
weights or all gradients. Parameters keep the order of `net.learnable_params`, which follows the
layers, so each layer's parameters form one contiguous run: the layer-wise reduce sends that run.
"""
from __future__ import annotations

import numpy as np

from caffe.parallel.comm import ParallelError


class ParamBuffers:
    """One data and one diff buffer for `params` (a list of Blob), in host (numpy) or device (cupy) memory.

    The current values are copied in, then each blob borrows its slice: from then on the blobs and
    the buffers are the same memory. `offsets[i]`/`counts[i]` place params[i] in the buffers.
    """

    def __init__(self, params, xp=np):
        self.params = list(params)
        self.xp = xp
        if not self.params:
            raise ParallelError("the net has no learnable parameters: nothing to train in parallel")
        dtypes = {np.dtype(b.dtype) for b in self.params}
        if len(dtypes) != 1:
            raise ParallelError(f"learnable parameters mix dtypes {sorted(map(str, dtypes))}; "
                                "one contiguous buffer needs a single dtype")
        self.dtype = dtypes.pop()
        self.offsets, self.counts, self.slots = [], [], []
        total = 0
        for blob in self.params:
            # a slot covers the blob's whole allocation (its capacity), so the borrowed memory is large enough
            slot = max(blob.count(), blob.data_mem.size // self.dtype.itemsize)
            self.offsets.append(total)
            self.counts.append(blob.count())
            self.slots.append(slot)
            total += slot
        self.size = total
        self.data = xp.zeros(total, self.dtype)
        self.diff = xp.zeros(total, self.dtype)
        on_gpu = xp is not np
        for blob, off, n, slot in zip(self.params, self.offsets, self.counts, self.slots):
            # copy from wherever the blob's data is current, then borrow (Caffe: apply_buffers copy, replace)
            if n:
                self.data[off:off + n] = blob.data_xp(xp).reshape(-1)
                self.diff[off:off + n] = blob.diff_xp(xp).reshape(-1)
            data, diff = self.data[off:off + slot], self.diff[off:off + slot]
            if on_gpu:
                blob.data_mem.set_gpu_data(data)
                blob.diff_mem.set_gpu_data(diff)
            else:
                blob.data_mem.set_cpu_data(data)
                blob.diff_mem.set_cpu_data(diff)
        self.verify()

    def _address(self, arr) -> int:
        return int(arr.data.ptr) if self.xp is not np else int(arr.__array_interface__["data"][0])

    def verify(self) -> None:
        """Raise unless every blob still lives in its slice (a reshape that grew a blob, or a share_data
        after the buffers were applied, would silently take it out of the reduce)."""
        on_gpu = self.xp is not np
        base_data, base_diff = self._address(self.data), self._address(self.diff)
        item = self.dtype.itemsize
        for i, (blob, off) in enumerate(zip(self.params, self.offsets)):
            if blob.count() != self.counts[i] or np.dtype(blob.dtype) != self.dtype:
                raise ParallelError(f"learnable parameter {i} changed shape or dtype after the parallel buffers "
                                    f"were built ({self.counts[i]} -> {blob.count()} elements)")
            for name, mem, base in (("data", blob.data_mem, base_data), ("diff", blob.diff_mem, base_diff)):
                head = mem.head_name
                if on_gpu:
                    ok = head in ("HEAD_AT_GPU", "SYNCED") and self._address(mem.gpu_data()) == base + off * item
                else:
                    ok = head in ("HEAD_AT_CPU", "SYNCED") and self._address(mem.cpu_data()) == base + off * item
                if not ok:
                    raise ParallelError(f"learnable parameter {i} ({blob.shape}) no longer uses the shared {name} "
                                        f"buffer (head {head}): it was reallocated or re-shared after the "
                                        "parallel buffers were built, and would not be reduced")

    def slice_of(self, blob) -> slice:
        for b, off, n in zip(self.params, self.offsets, self.slots):
            if b is blob:
                return slice(off, off + n)
        raise KeyError("blob is not a learnable parameter of this buffer")

    def layer_slices(self, net) -> list[slice | None] | None:
        """For each layer of `net`, the contiguous run of the buffers holding its parameters (None for a
        layer without learnable parameters); None overall when some layer's parameters are not its own
        contiguous run (shared weights: Caffe's layer-wise reduce refuses those nets)."""
        index = {id(b): i for i, b in enumerate(self.params)}
        out = []
        for layer in net.layers:
            blobs = list(getattr(layer, "blobs", []) or [])
            ids = []
            for b in blobs:
                i = index.get(id(b))
                if i is None:
                    return None  # a shared (non-owner) parameter, or one left out of learnable_params
                ids.append(i)
            if not ids:
                out.append(None)
                continue
            ids.sort()
            if ids != list(range(ids[0], ids[-1] + 1)):
                return None
            out.append(slice(self.offsets[ids[0]], self.offsets[ids[-1]] + self.slots[ids[-1]]))
        return out

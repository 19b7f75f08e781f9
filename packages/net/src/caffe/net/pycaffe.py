"""pycaffe's Net surface (python/caffe/pycaffe.py and _caffe.cpp), so existing scripts run unchanged.

Dict views (`blobs`, `params`, `layer_dict`, `blob_loss_weights`, `top_names`,
`bottom_names`) are ordered by layer/blob index; `forward`/`backward` take and
return arrays by blob name; `forward_all`/`forward_backward_all` run inputs
larger than a batch; weights I/O (`save`, `copy_from`, `save_hdf5`, `load_hdf5`).
"""
from __future__ import annotations

from collections import OrderedDict
from itertools import zip_longest

import numpy as np

from caffe.blob import deferred


class IndexedDict(OrderedDict):
    """An OrderedDict by name that also answers a blob id (C++-style code indexes by blob id)."""

    def __init__(self, items=(), by_index=None):
        super().__init__(items)
        self._by_index = list(by_index) if by_index is not None else None

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            return self._by_index[key] if self._by_index is not None else list(self.values())[key]
        return super().__getitem__(key)


class PycaffeNet:
    """Mixed into Net; relies on the attributes Net.Init sets."""

    # -- pycaffe's internal names ---------------------------------------------------------------------------
    @property
    def _layer_names(self) -> list[str]:
        return self.layer_names

    @property
    def _blob_names(self) -> list[str]:
        return self.blob_names

    def _top_ids(self, i: int) -> list[int]:
        return list(self.top_id_vecs[i])

    def _bottom_ids(self, i: int) -> list[int]:
        return list(self.bottom_id_vecs[i])

    def _cached(self, key, build):
        cache = self._pycaffe_cache
        if key not in cache:
            cache[key] = build()
        return cache[key]

    # -- dict views -------------------------------------------------------------------------------------
    @property
    def blobs(self) -> OrderedDict:
        """name -> Blob, in blob order (pycaffe: .data and .diff are writable NumPy views)."""
        return self._cached("blobs", lambda: OrderedDict(zip(self.blob_names, self._blobs)))

    @property
    def blob_loss_weights(self) -> IndexedDict:
        return self._cached("blob_loss_weights",
                            lambda: IndexedDict(zip(self.blob_names, self._blob_loss_weights),
                                                by_index=self._blob_loss_weights))

    @property
    def layer_dict(self) -> OrderedDict:
        return self._cached("layer_dict", lambda: OrderedDict(zip(self.layer_names, self.layers)))

    @property
    def params(self) -> OrderedDict:
        """layer name -> its parameter blobs, for layers that have any."""
        return self._cached("params", lambda: OrderedDict(
            (name, layer.blobs) for name, layer in zip(self.layer_names, self.layers) if len(layer.blobs)))

    @property
    def inputs(self) -> list[str]:
        return [self.blob_names[i] for i in self._inputs]

    @property
    def outputs(self) -> list[str]:
        return [self.blob_names[i] for i in self._outputs]

    @property
    def top_names(self) -> OrderedDict:
        return self._cached("top_names", lambda: OrderedDict(
            (name, [self.blob_names[j] for j in self.top_id_vecs[i]]) for i, name in enumerate(self.layer_names)))

    @property
    def bottom_names(self) -> OrderedDict:
        return self._cached("bottom_names", lambda: OrderedDict(
            (name, [self.blob_names[j] for j in self.bottom_id_vecs[i]])
            for i, name in enumerate(self.layer_names)))

    def _layer_index(self, name, what: str) -> int:
        try:
            return self.layer_names.index(name)
        except ValueError:
            raise ValueError(f"{what}: the net has no layer named '{name}'") from None

    # -- forward / backward ---------------------------------------------------------------------------------
    def _forward(self, start: int, end: int) -> float:
        return self.ForwardFromTo(start, end)

    def _backward(self, start: int, end: int) -> None:
        self.BackwardFromTo(start, end)

    def _set_blobs(self, values, expected, field: str, what: str) -> None:
        if set(values) != set(expected):
            raise ValueError(f"{what} arguments do not match net {'inputs' if field == 'data' else 'outputs'}: "
                             f"got {sorted(values)}, the net has {sorted(expected)}")
        for name, value in values.items():
            blob = self.blobs[name]
            value = np.asarray(value)
            if value.ndim == 0 or not blob.shape or value.shape[0] != blob.shape[0]:
                raise ValueError(f"{'Input' if field == 'data' else 'Diff'} '{name}' is not batch sized: "
                                 f"shape {value.shape}, blob shape {blob.shape}")
            target = blob.data if field == "data" else blob.diff
            try:
                target[...] = value
            except ValueError:
                raise ValueError(f"{'Input' if field == 'data' else 'Diff'} '{name}' has shape {value.shape}; "
                                 f"the blob has shape {blob.shape} (reshape the blob and call net.reshape() "
                                 f"to change it)") from None

    def forward(self, blobs=None, start=None, end=None, **kwargs) -> dict:
        """Copy `kwargs` into the input blobs, run layers start..end, return {name: data} of the outputs
        (the tops of `end` when given) plus `blobs`."""
        blobs = list(blobs or [])
        start_ind = self._layer_index(start, "forward(start=...)") if start is not None else 0
        if end is not None:
            end_ind = self._layer_index(end, "forward(end=...)")
            outputs = set(self.top_names[end] + blobs)
        else:
            end_ind = len(self.layers) - 1
            outputs = set(self.outputs + blobs)
        if kwargs:
            self._set_blobs(kwargs, self.inputs, "data", "Input blob")
        self._forward(start_ind, end_ind)
        deferred.flush()  # GPU mode: checks made on the device (labels, indices) fail here, as on the CPU
        return {out: self.blobs[out].data for out in outputs}

    def backward(self, diffs=None, start=None, end=None, **kwargs) -> dict:
        """Copy `kwargs` into the output diffs, run backward start..end, return {name: diff} of the inputs
        (the bottoms of `end` when given) plus `diffs`."""
        diffs = list(diffs or [])
        start_ind = self._layer_index(start, "backward(start=...)") if start is not None else len(self.layers) - 1
        if end is not None:
            end_ind = self._layer_index(end, "backward(end=...)")
            outputs = set(self.bottom_names[end] + diffs)
        else:
            end_ind = 0
            outputs = set(self.inputs + diffs)
        if kwargs:
            self._set_blobs(kwargs, self.outputs, "diff", "Top diff")
        self._backward(start_ind, end_ind)
        return {out: self.blobs[out].diff for out in outputs}

    def _batch(self, blobs: dict):
        """Split {name: array} into the net's batch size, zero-padding the last batch."""
        num = len(next(iter(blobs.values())))
        batch_size = next(iter(self.blobs.values())).shape[0]
        for b in range(num // batch_size):
            i = b * batch_size
            yield {name: blobs[name][i:i + batch_size] for name in blobs}
        remainder = num % batch_size
        if remainder:
            padded = {}
            for name, arr in blobs.items():
                arr = np.asarray(arr)
                padding = np.zeros((batch_size - remainder,) + arr.shape[1:], dtype=arr.dtype)
                padded[name] = np.concatenate([arr[-remainder:], padding])
            yield padded

    def forward_all(self, blobs=None, **kwargs) -> dict:
        """forward over inputs of any length (batched, last batch padded); returns whole arrays."""
        all_outs = {out: [] for out in set(self.outputs + list(blobs or []))}
        for batch in self._batch(kwargs):
            for out, data in self.forward(blobs=blobs, **batch).items():
                all_outs[out].extend(data.copy())
        all_outs = {out: np.asarray(v) for out, v in all_outs.items()}
        pad = len(next(iter(all_outs.values()))) - len(next(iter(kwargs.values())))
        if pad:
            all_outs = {out: v[:-pad] for out, v in all_outs.items()}
        return all_outs

    def forward_backward_all(self, blobs=None, diffs=None, **kwargs):
        """forward + backward over inputs (and output diffs) of any length; returns (outputs, diffs)."""
        all_outs = {out: [] for out in set(self.outputs + list(blobs or []))}
        all_diffs = {d: [] for d in set(self.inputs + list(diffs or []))}
        forward_batches = self._batch({k: kwargs[k] for k in self.inputs if k in kwargs})
        backward_batches = self._batch({k: kwargs[k] for k in self.outputs if k in kwargs})
        for fb, bb in zip_longest(forward_batches, backward_batches, fillvalue={}):
            for out, data in self.forward(blobs=blobs, **fb).items():
                all_outs[out].extend(data.copy())
            for name, diff in self.backward(diffs=diffs, **bb).items():
                all_diffs[name].extend(diff.copy())
        all_outs = {k: np.asarray(v) for k, v in all_outs.items()}
        all_diffs = {k: np.asarray(v) for k, v in all_diffs.items()}
        pad = len(next(iter(all_outs.values()))) - len(next(iter(kwargs.values())))
        if pad:
            all_outs = {k: v[:-pad] for k, v in all_outs.items()}
            all_diffs = {k: v[:-pad] for k, v in all_diffs.items()}
        return all_outs, all_diffs

    # -- MemoryData inputs --------------------------------------------------------------------------------
    def set_input_arrays(self, data, labels):
        """Hand arrays to the first layer, a MemoryData layer (labels may be 1-d)."""
        labels = np.asarray(labels)
        if labels.ndim == 1:
            labels = np.ascontiguousarray(labels[:, np.newaxis, np.newaxis, np.newaxis])
        return self._set_input_arrays(data, labels)

    def _set_input_arrays(self, data, labels):
        if not self.layers or self.layers[0].type != "MemoryData":
            first = f"'{self.layers[0].name}' is a {self.layers[0].type} layer" if self.layers else "there is none"
            raise TypeError(f"set_input_arrays may only be called if the first layer is a MemoryData layer "
                            f"(the first layer {first})")
        layer = self.layers[0]
        mp = layer.layer_param.memory_data_param
        for arr, what, dims in ((data, "data array", (mp.channels, mp.height, mp.width)),
                                (labels, "labels array", (1, 1, 1))):
            if not isinstance(arr, np.ndarray) or not arr.flags["C_CONTIGUOUS"]:
                raise ValueError(f"set_input_arrays: {what} must be a C-contiguous NumPy array")
            if arr.dtype != np.float32:
                raise ValueError(f"set_input_arrays: {what} must be float32, got {arr.dtype}")
            if arr.ndim != 4 or tuple(arr.shape[1:]) != tuple(dims):
                raise ValueError(f"set_input_arrays: {what} must have shape (N, {', '.join(map(str, dims))}), "
                                 f"got {arr.shape}")
        if data.shape[0] != labels.shape[0]:
            raise ValueError(f"set_input_arrays: data and labels must have the same first dimension "
                             f"({data.shape[0]} vs {labels.shape[0]})")
        if mp.batch_size and data.shape[0] % mp.batch_size:
            raise ValueError(f"set_input_arrays: the first dimension of the input arrays ({data.shape[0]}) must "
                             f"be a multiple of the batch size ({mp.batch_size})")
        self._input_arrays = (data, labels)  # the layer reads them in place: keep them alive
        layer.reset(data, labels, data.shape[0])

    # -- pycaffe methods over Caffe's -----------------------------------------------------------------------
    def reshape(self) -> None:
        self.Reshape()

    def clear_param_diffs(self) -> None:
        """Zero every learnable parameter's diff (Caffe's ClearParamDiffs)."""
        self.ClearParamDiffs()

    def copy_from(self, filename) -> None:
        self.CopyTrainedLayersFrom(filename)

    def share_with(self, other) -> None:
        self.ShareTrainedLayersWith(other)

    def save(self, filename, write_diff: bool = False) -> None:
        self.Save(filename, write_diff)

    def save_hdf5(self, filename, write_diff: bool = False) -> None:
        self.ToHDF5(filename, write_diff)

    def load_hdf5(self, filename) -> None:
        self.CopyTrainedLayersFromHDF5(filename)

"""MemoryData: batches from arrays in memory (Caffe's memory_data_layer.cpp, pycaffe's set_input_arrays).

`reset(data, labels, n)` hands the layer n items: data (n, channels, height, width),
labels n values; n must be a multiple of batch_size. Each Forward points the tops at
the next batch_size items without copying (wrapping at n). As in Caffe, reset()
does not transform; `add_datum_vector(datums)` / `add_mat_vector(images, labels)`
transform (transform_param) first.
"""
from __future__ import annotations

import logging

import numpy as np

from caffe.layers.base_data import BaseDataLayer, assign_top
from caffe.layers.data_transformer import DataError
from caffe.layers.registry import register_layer

log = logging.getLogger("caffe")


@register_layer("MemoryData")
class MemoryDataLayer(BaseDataLayer):
    exact_num_top_blobs = 2
    min_top_blobs = -1
    max_top_blobs = -1

    def data_layer_setup(self, bottom, top):
        p = self.layer_param.memory_data_param
        self.batch_size = int(p.batch_size)
        self.channels, self.height, self.width = int(p.channels), int(p.height), int(p.width)
        self.size = self.channels * self.height * self.width
        if self.batch_size * self.size <= 0:
            raise self.error("batch_size, channels, height, and width must be specified and positive "
                             f"in memory_data_param (got {self.batch_size}, {self.channels}, {self.height}, "
                             f"{self.width})")
        self.dtype = top[0].dtype
        top[0].reshape(self.batch_size, self.channels, self.height, self.width)
        top[1].reshape(self.batch_size)
        self.data = None
        self.labels = None
        self.n = 0
        self.pos = 0
        self.has_new_data = False

    def reset(self, data, labels, n: int | None = None) -> None:
        """Serve `data` and `labels` (kept by reference when already C-contiguous in the top dtype)."""
        data = np.asarray(data)
        labels = np.asarray(labels)
        if n is None:
            n = data.shape[0] if data.ndim else 0
        n = int(n)
        want = (self.channels, self.height, self.width)
        if data.ndim != 4 or data.shape[1:] != want:
            raise self.error(f"data array must have shape (n, {self.channels}, {self.height}, {self.width}), "
                             f"got {data.shape}")
        if data.shape[0] < n:
            raise self.error(f"data array holds {data.shape[0]} items, fewer than n = {n}")
        if labels.size < n or (labels.ndim and labels.shape[0] < n):
            raise self.error(f"labels array holds {labels.shape[0] if labels.ndim else labels.size} labels, "
                             f"fewer than n = {n}; data and labels must have the same first dimension")
        if n <= 0 or n % self.batch_size != 0:
            raise self.error(f"n must be a positive multiple of batch size {self.batch_size}, got n = {n}")
        if self.layer_param.HasField("transform_param"):
            log.warning("%s does not transform array data on Reset()", self.type)
        self.data = np.ascontiguousarray(data, dtype=self.dtype)
        self.labels = np.ascontiguousarray(labels.reshape(labels.shape[0], -1)[:, 0] if labels.ndim > 1
                                           else labels, dtype=self.dtype)
        self.n = n
        self.pos = 0

    Reset = reset
    set_input_arrays = reset

    def set_batch_size(self, new_size: int) -> None:
        if self.has_new_data:
            raise self.error("can't change batch_size until current data has been consumed")
        if int(new_size) <= 0:
            raise self.error(f"batch_size must be positive, got {new_size}")
        self.batch_size = int(new_size)

    def add_datum_vector(self, datums) -> None:
        """Transform Datums (transform_param) and serve them (count a multiple of batch_size)."""
        labels = [d.label for d in datums]
        try:
            images = [self.data_transformer.image(d, f"Datum {i}") for i, d in enumerate(datums)]
        except DataError as exc:  # a bad Datum: name the layer too
            raise self.error(str(exc)) from None
        self._add(images, labels, "datum")

    AddDatumVector = add_datum_vector

    def add_mat_vector(self, images, labels) -> None:
        """Transform (C, H, W) images and serve them with `labels`."""
        if len(images) != len(labels):
            raise self.error(f"{len(images)} images but {len(labels)} labels")
        self._add([np.asarray(im) for im in images], list(labels), "image")

    AddMatVector = add_mat_vector

    def _add(self, images, labels, what: str) -> None:
        if self.has_new_data:
            raise self.error(f"can't add {what}s until current data has been consumed")
        num = len(images)
        if num == 0:
            raise self.error(f"there is no {what} to add")
        if num % self.batch_size:
            raise self.error(f"the added data must be a multiple of the batch size {self.batch_size}, "
                             f"got {num} {what}s")
        out = np.empty((num, self.channels, self.height, self.width), dtype=self.dtype)
        try:
            self.data_transformer.transform_batch(images, out, where=lambda i: f"{what} {i}")
        except DataError as exc:
            raise self.error(str(exc).replace(f"{self.data_transformer.name}: ", "")) from None
        self.reset(out, np.asarray(labels, dtype=self.dtype), num)
        self.has_new_data = True

    def forward_cpu(self, bottom, top):
        if self.data is None:
            raise self.error("MemoryDataLayer needs to be initialized by calling reset() "
                             "(pycaffe: net.set_input_arrays)")
        b, p = self.batch_size, self.pos
        assign_top(top[0], self.data[p:p + b])  # no copy: the top borrows the caller's array
        assign_top(top[1], self.labels[p:p + b])
        self.pos = (p + b) % self.n
        if self.pos == 0:
            self.has_new_data = False

    forward_gpu = forward_cpu

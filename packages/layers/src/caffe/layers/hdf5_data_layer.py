"""HDF5Data: batches of rows from HDF5 files (Caffe's hdf5_data_layer.cpp).

hdf5_data_param.source is a text file listing .h5 paths (whitespace separated). Each
top reads the dataset named after it (top "data" <- dataset "data"), converted to
the top's dtype; all datasets of a file must have the same number of rows, and a
top's row shape must agree across files. Rows are served in order, moving to the
next file at the end of one and wrapping after the last. With shuffle, the file
order is shuffled at setup and at every wrap, and the row order at every file load,
with the runtime generator. Data-parallel sharding as in Data (rank r keeps rows
r, r+N, ...; not in TEST). Whole files are loaded into memory, as Caffe does.
"""
from __future__ import annotations

import logging
import os

import numpy as np

from caffe.blob import context
from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer

log = logging.getLogger("caffe")


@register_layer("HDF5Data")
class HDF5DataLayer(Layer):
    exact_num_bottom_blobs = 0
    min_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.hdf5_data_param
        self.batch_size = int(p.batch_size)
        if self.batch_size <= 0:
            raise self.error(f"hdf5_data_param.batch_size must be positive, got {self.batch_size}")
        if not p.source:
            raise self.error("hdf5_data_param.source must name a text file listing HDF5 files")
        from caffe.blob.fileio import FileInputError, read_text_file
        try:
            self.filenames = read_text_file(p.source, "HDF5 list file (hdf5_data_param.source)").split()
        except FileInputError as exc:
            raise self.error(str(exc)) from None
        if not self.filenames:
            raise self.error(f"HDF5 list file '{p.source}' lists no files; it must name at least one")
        self.top_names = list(self.layer_param.top) or [f"top{i}" for i in range(len(top))]
        if len(self.top_names) != len(top):
            raise self.error(f"the layer names {len(self.top_names)} tops but was given {len(top)} blobs")
        self.dtype = top[0].dtype
        self.file_permutation = np.arange(len(self.filenames))
        self.shuffle = bool(p.shuffle)
        if self.shuffle:
            context.rng().shuffle(self.file_permutation)
        self.current_file = 0
        self._row_shapes = None
        self.load_file(self.filenames[self.file_permutation[0]])
        self.current_row = 0
        self.offset = 0
        for t, b in zip(top, self.hdf_blobs):
            t.reshape((self.batch_size,) + b.shape[1:])

    def load_file(self, filename: str) -> None:
        """Load every top's dataset from one file (Caffe's LoadHDF5FileData)."""
        import h5py
        if not os.path.exists(filename):
            raise self.error(f"HDF5 file '{filename}' (listed in '{self.layer_param.hdf5_data_param.source}') "
                             f"does not exist")
        from caffe.blob.fileio import FileInputError, require_regular_file
        try:
            require_regular_file(filename, "HDF5 file")  # a FIFO would block HDF5's open
            f = h5py.File(filename, "r")
        except FileInputError as exc:
            raise self.error(f"{exc} (listed in '{self.layer_param.hdf5_data_param.source}')") from None
        except OSError as exc:
            raise self.error(f"cannot open HDF5 file '{filename}': {exc}") from None
        with f:
            blobs = []
            for name in self.top_names:
                if name not in f or not isinstance(f[name], h5py.Dataset):
                    have = ", ".join(sorted(k for k in f if isinstance(f[k], h5py.Dataset))) or "none"
                    raise self.error(f"HDF5 file '{filename}' has no dataset '{name}' for top '{name}' "
                                     f"(datasets: {have})")
                ds = f[name]
                if ds.ndim < 1:
                    raise self.error(f"HDF5 file '{filename}' dataset '{name}' is a scalar; "
                                     f"it needs at least one axis (rows)")
                if ds.dtype.kind not in "fiub":
                    what = "strings" if ds.dtype.kind in "SUO" else f"values of type {ds.dtype}"
                    raise self.error(f"HDF5 file '{filename}' dataset '{name}' holds {what}, not numbers")
                try:
                    blobs.append(np.asarray(ds[...], dtype=self.dtype))
                except (OSError, ValueError, TypeError) as exc:
                    raise self.error(f"HDF5 file '{filename}' dataset '{name}' cannot be read: {exc}") from None
        num = blobs[0].shape[0]
        for name, b in zip(self.top_names, blobs):
            if b.shape[0] != num:
                raise self.error(f"HDF5 file '{filename}': dataset '{name}' has {b.shape[0]} rows but "
                                 f"'{self.top_names[0]}' has {num}; every dataset needs the same number")
        shapes = [b.shape[1:] for b in blobs]
        if self._row_shapes is not None and shapes != self._row_shapes:
            raise self.error(f"HDF5 file '{filename}' has row shapes {shapes} but the first file had "
                             f"{self._row_shapes}")
        if num == 0:
            raise self.error(f"HDF5 file '{filename}' holds no rows")
        self._row_shapes = shapes
        self.hdf_blobs = blobs
        self.data_permutation = np.arange(num)
        if self.shuffle:
            context.rng().shuffle(self.data_permutation)
        log.debug("Successfully loaded %d rows from %s", num, filename)

    LoadHDF5FileData = load_file

    def reshape(self, bottom, top):
        pass  # shapes are set at setup

    def _skip(self) -> bool:
        n = context.solver_count()
        keep = (self.offset % n) == context.solver_rank() or self.phase == 1
        return not keep

    def _next(self) -> None:
        self.current_row += 1
        if self.current_row == self.hdf_blobs[0].shape[0]:
            if len(self.filenames) > 1:
                self.current_file += 1
                if self.current_file == len(self.filenames):
                    self.current_file = 0
                    if self.shuffle:
                        context.rng().shuffle(self.file_permutation)
                    log.debug("Looping around to first file.")
                self.load_file(self.filenames[self.file_permutation[self.current_file]])
            self.current_row = 0
            if self.shuffle:
                context.rng().shuffle(self.data_permutation)
        self.offset += 1

    def forward_cpu(self, bottom, top):
        outs = [t.mutable_cpu_data() for t in top]
        for i in range(self.batch_size):
            while self._skip():
                self._next()
            row = self.data_permutation[self.current_row]
            for out, b in zip(outs, self.hdf_blobs):
                out[i] = b[row]
            self._next()

    forward_gpu = forward_cpu

    def backward_cpu(self, top, propagate_down, bottom):
        pass

    backward_gpu = backward_cpu

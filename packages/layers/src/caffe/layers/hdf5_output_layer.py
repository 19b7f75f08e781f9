"""HDF5Output: write bottom[0] to dataset "data" and bottom[1] to "label" (Caffe's hdf5_output_layer.cpp).

hdf5_output_param.file_name is created (truncated) at setup. Each Forward appends
its batch along the first axis, stored as Caffe stores them: 4-d legacy shapes
(num, channels, height, width) in the bottoms' dtype. Caffe could write one batch
per file (a second Forward failed on the existing dataset); appending keeps that
first batch identical and makes later ones useful. The file is opened per Forward
and closed again, so readers can open it between iterations. No backward.
"""
from __future__ import annotations

import os

import numpy as np

from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer

DATA_DATASET = "data"
LABEL_DATASET = "label"


@register_layer("HDF5Output")
class HDF5OutputLayer(Layer):
    exact_num_bottom_blobs = 2
    exact_num_top_blobs = 0

    def layer_setup(self, bottom, top):
        import h5py
        self.file_name = self.layer_param.hdf5_output_param.file_name
        if not self.file_name:
            raise self.error("hdf5_output_param.file_name must name the HDF5 file to write")
        parent = os.path.dirname(os.path.abspath(self.file_name))
        if not os.path.isdir(parent):
            raise self.error(f"cannot create HDF5 file '{self.file_name}': folder '{parent}' does not exist")
        try:
            h5py.File(self.file_name, "w").close()
        except OSError as exc:
            raise self.error(f"cannot create HDF5 file '{self.file_name}': {exc}") from None

    def reshape(self, bottom, top):
        pass

    @staticmethod
    def _legacy(blob) -> tuple[int, int, int, int]:
        return (blob.num, blob.channels, blob.height, blob.width)

    def forward_cpu(self, bottom, top):
        import h5py
        if bottom[0].num != bottom[1].num:
            raise self.error(f"data and label must have the same num: bottom[0] {bottom[0].shape} vs "
                             f"bottom[1] {bottom[1].shape}")
        arrays = {DATA_DATASET: bottom[0].cpu_data().reshape(self._legacy(bottom[0])),
                  LABEL_DATASET: bottom[1].cpu_data().reshape(self._legacy(bottom[1]))}
        with h5py.File(self.file_name, "a") as f:
            for name, arr in arrays.items():
                if name not in f:
                    f.create_dataset(name, data=arr, maxshape=(None,) + arr.shape[1:],
                                     chunks=True if arr.size else None)
                    continue
                ds = f[name]
                if ds.shape[1:] != arr.shape[1:]:
                    raise self.error(f"bottom '{name}' changed shape from {ds.shape[1:]} to {arr.shape[1:]} "
                                     f"between batches; HDF5 file '{self.file_name}' needs one row shape")
                n = ds.shape[0]
                ds.resize(n + arr.shape[0], axis=0)
                ds[n:] = np.asarray(arr, dtype=ds.dtype)

    forward_gpu = forward_cpu

    def backward_cpu(self, top, propagate_down, bottom):
        pass

    backward_gpu = backward_cpu

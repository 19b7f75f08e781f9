"""Weights I/O for Net: caffemodel (binary NetParameter) and HDF5, in both directions.

Reading matches layers by name (unknown source layers are ignored, as in Caffe)
and refuses a shape mismatch with the layer, blob index, both shapes and the file.
Only regular files are read (caffe.blob.fileio). As Caffe's CopyTrainedLayersFrom logs
each layer it copies, the net's layers with parameters that got nothing from the file
are named in a warning (a caffemodel cut at a layer boundary, or one of another net).
Writing streams each layer's wire bytes straight from the parameter arrays: the
binary caffemodel is never built as one protobuf message (a CaffeNet-size model
would otherwise be copied several times), and every write is atomic.
"""
from __future__ import annotations

import logging
import os

import numpy as np

from caffe.blob.fileio import FileInputError, require_regular_file
from caffe.blob.proto_io import varint
from caffe.layers.layer import Layer
from caffe.proto import caffe_pb2

from caffe.net.graph import NetError
from caffe.net.protofile import ProtoFileError, atomic_open, atomic_path
from caffe.net.upgrade import ReadNetParamsFromBinaryFileOrDie

log = logging.getLogger("caffe.net")

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"

# Field numbers in caffe.proto: NetParameter.layer, LayerParameter.blobs, BlobProto.{shape,data,diff,...}
_NET_LAYER, _LAYER_BLOBS, _BLOB_SHAPE = 100, 7, 7
_BLOB_DATA, _BLOB_DIFF, _BLOB_DOUBLE_DATA, _BLOB_DOUBLE_DIFF = 5, 6, 8, 9


class WeightsError(NetError):
    """Weights that do not fit the net (shape or blob-count mismatch); names the file and layer."""


def _len_tag(field: int) -> bytes:
    return varint((field << 3) | 2)


def _shape_string(shape) -> str:
    count = int(np.prod(shape)) if len(shape) else 1
    return " ".join(str(d) for d in shape) + f" ({count})"


def is_hdf5(path) -> bool:
    """True for an HDF5 file (magic at the start, or wherever h5py finds a superblock)."""
    try:
        with open(path, "rb") as f:
            if f.read(8) == HDF5_MAGIC:
                return True
    except OSError:
        return False
    try:
        import h5py
    except ImportError:
        return False
    return bool(h5py.is_hdf5(path))


def _uses_base_to_proto(layer) -> bool:
    return getattr(type(layer), "to_proto", None) is Layer.to_proto


def _blob_pieces(blob, write_diff: bool) -> list:
    """The wire bytes of one BlobProto, as pieces (bytes, or memoryviews of the parameter arrays)."""
    double = blob.dtype == np.float64
    dtype = np.dtype("<f8" if double else "<f4")
    pieces = []
    if blob.shape:
        shape = caffe_pb2.BlobShape(dim=blob.shape).SerializeToString()
        pieces += [_len_tag(_BLOB_SHAPE) + varint(len(shape)) + shape]
    fields = [(_BLOB_DOUBLE_DATA if double else _BLOB_DATA, blob.cpu_data())]
    if write_diff:
        fields.append((_BLOB_DOUBLE_DIFF if double else _BLOB_DIFF, blob.cpu_diff()))
    for field, arr in fields:
        arr = np.ascontiguousarray(arr, dtype=dtype)
        if arr.size:
            pieces += [_len_tag(field) + varint(arr.nbytes), memoryview(arr.reshape(-1)).cast("B")]
    return pieces


def _write_layer(f, layer, write_diff: bool) -> None:
    """Write one NetParameter.layer entry: the layer's parameter (without blobs), then its blobs."""
    if not _uses_base_to_proto(layer):
        data = layer.to_proto(write_diff).SerializeToString()
        f.write(_len_tag(_NET_LAYER) + varint(len(data)))
        f.write(data)
        return
    lp = layer.layer_param
    if len(lp.blobs):
        lp = type(lp)()
        lp.CopyFrom(layer.layer_param)
        del lp.blobs[:]
    meta = lp.SerializeToString()
    blobs = []
    total = len(meta)
    for blob in layer.blobs:
        pieces = _blob_pieces(blob, write_diff)
        size = sum(len(p) for p in pieces)
        head = _len_tag(_LAYER_BLOBS) + varint(size)
        blobs.append((head, pieces))
        total += len(head) + size
    f.write(_len_tag(_NET_LAYER) + varint(total))
    f.write(meta)
    for head, pieces in blobs:
        f.write(head)
        for p in pieces:
            f.write(p)


class WeightsMixin:
    """Mixed into Net: CopyTrainedLayersFrom*, ToProto, Save, ToHDF5."""

    # -- reading ------------------------------------------------------------------------------------------
    def CopyTrainedLayersFrom(self, source) -> None:
        """Load weights from a NetParameter, a binary caffemodel, or an HDF5 caffemodel (.h5 or HDF5 magic)."""
        if isinstance(source, caffe_pb2.NetParameter):
            self._copy_trained_layers(source, "<NetParameter>")
            return
        path = os.fspath(source)
        try:
            require_regular_file(path, "weights file")  # before anything opens it: a FIFO would block
        except FileInputError as exc:
            raise ProtoFileError(str(exc), path) from None
        if path.endswith(".h5") or is_hdf5(path):
            self.CopyTrainedLayersFromHDF5(path)
        else:
            self.CopyTrainedLayersFromBinaryProto(path)

    def CopyTrainedLayersFromBinaryProto(self, path) -> None:
        path = os.fspath(path)
        param = ReadNetParamsFromBinaryFileOrDie(path)
        if not len(param.layer):
            raise ProtoFileError(f"Failed to read weights from '{path}': it holds no layers, so it is not a "
                                 f"caffemodel (the file may be corrupt or of another kind)", path)
        self._copy_trained_layers(param, path)

    def _copy_trained_layers(self, param, source: str) -> None:
        first: dict[str, int] = {}
        for i, name in enumerate(self.layer_names):
            first.setdefault(name, i)
        copied: set[int] = set()
        for source_layer in param.layer:
            name = source_layer.name
            target_id = first.get(name)
            if target_id is None:
                log.info("Ignoring source layer %s", name)
                continue
            log.info("Copying source layer %s Type:%s #blobs=%d", name, source_layer.type, len(source_layer.blobs))
            target_blobs = self.layers[target_id].blobs
            if len(target_blobs) != len(source_layer.blobs):
                raise WeightsError(f"Incompatible number of blobs for layer '{name}': '{source}' has "
                                   f"{len(source_layer.blobs)}, the net's layer has {len(target_blobs)}")
            for j, (target, proto) in enumerate(zip(target_blobs, source_layer.blobs)):
                if not target.shape_equals(proto):
                    from caffe.blob.proto_io import blob_proto_shape
                    raise WeightsError(
                        f"Cannot copy param {j} weights from layer '{name}'; shape mismatch.  Source param "
                        f"shape is {_shape_string(blob_proto_shape(proto))}; target param shape is "
                        f"{target.shape_string()} (weights file '{source}'). To learn this layer's parameters "
                        f"from scratch rather than copying from a saved net, rename the layer.")
                try:
                    target.from_proto(proto, reshape=False)
                except ValueError as exc:
                    raise WeightsError(f"Cannot copy param {j} weights from layer '{name}' of '{source}': "
                                       f"{exc}") from None
            copied.add(target_id)
        self._report_uncopied(copied, source)

    def _report_uncopied(self, copied: set, source: str) -> None:
        """Warn about the net's layers with parameters that the weights file did not fill."""
        missing = [i for i, layer in enumerate(self.layers)
                   if layer.blobs and i not in copied and not self._params_shared_from_copied(i, copied)]
        if not missing:
            return
        names = ", ".join(f"'{self.layer_names[i]}'" for i in missing)
        if not any(self.layers[i].blobs for i in copied):
            log.warning("No layer of the net got weights from '%s': none of its layers with parameters matches a "
                        "layer of the file by name (is it a model of another net?); layers %s keep their "
                        "initialization", source, names)
        else:
            log.warning("%d layer(s) with parameters got no weights from '%s' and keep their initialization: "
                        "%s (the file has no layer of that name: a model of another net, or one cut short?)",
                        len(missing), source, names)

    def _params_shared_from_copied(self, layer_id: int, copied: set) -> bool:
        """A layer whose every parameter is shared from a copied owner got its weights through the owner."""
        ids = self.param_id_vecs[layer_id]
        if not ids:
            return False
        for net_param_id in ids:
            owner = self.param_owners[net_param_id]
            if owner == -1 or self.param_layer_indices[owner][0] not in copied:
                return False
        return True

    def CopyTrainedLayersFromHDF5(self, path) -> None:
        import h5py
        path = os.fspath(path)
        try:
            require_regular_file(path, "HDF5 weights file")
            f = h5py.File(path, "r")
        except FileInputError as exc:
            raise ProtoFileError(str(exc), path) from None
        except (OSError, ValueError) as exc:
            raise ProtoFileError(f"Couldn't open HDF5 weights file '{path}': {exc}", path) from None
        copied: set[int] = set()
        with f:
            if "data" not in f or not isinstance(f["data"], h5py.Group):
                raise WeightsError(f"Error reading weights from '{path}': no 'data' group (an HDF5 caffemodel "
                                   f"stores data/<layer>/<index>)")
            data = f["data"]
            for name in data:
                if name not in self.layer_names_index:
                    log.info("Ignoring source layer %s", name)
                    continue
                target_id = self.layer_names_index[name]
                target_blobs = self.layers[target_id].blobs
                group = data[name]
                if not isinstance(group, h5py.Group):
                    raise WeightsError(f"Error reading weights from '{path}': data/{name} is a dataset, but an "
                                       f"HDF5 caffemodel stores layer '{name}' as a group of datasets "
                                       f"data/{name}/0, data/{name}/1, ...")
                log.info("Copying source layer %s #blobs=%d", name, len(group))
                if len(group) > len(target_blobs):
                    raise WeightsError(f"Incompatible number of blobs for layer '{name}': '{path}' has "
                                       f"{len(group)}, the net's layer has {len(target_blobs)}")
                for j, blob in enumerate(target_blobs):
                    key = str(j)
                    if key not in group:
                        if self.param_owners[self.param_id_vecs[target_id][j]] != -1:
                            continue  # weight-shared in this net: its owner holds the data
                        raise WeightsError(f"Incompatible number of blobs for layer '{name}': '{path}' lacks "
                                           f"param {j}")
                    _read_hdf5_param(group[key], blob, f"data/{name}/{key}", name, j, path)
                copied.add(target_id)
        self._report_uncopied(copied, path)

    # -- writing ------------------------------------------------------------------------------------------
    def ToProto(self, write_diff: bool = False):
        """The net as a NetParameter with every layer's blobs (what Save writes)."""
        param = caffe_pb2.NetParameter()
        param.name = self.name
        for layer in self.layers:
            lp = param.layer.add()
            if _uses_base_to_proto(layer):
                lp.CopyFrom(layer.layer_param)
                del lp.blobs[:]
                for blob in layer.blobs:
                    blob.to_proto(write_diff, proto=lp.blobs.add(), double=blob.dtype == np.float64)
            else:
                lp.CopyFrom(layer.to_proto(write_diff))
        return param

    def Save(self, filename, write_diff: bool = False) -> None:
        """Write a binary caffemodel (ToProto + WriteProtoToBinaryFile), streamed and atomic."""
        with atomic_open(filename, "caffemodel") as f:
            f.write(caffe_pb2.NetParameter(name=self.name).SerializeToString())
            for layer in self.layers:
                _write_layer(f, layer, write_diff)

    def ToHDF5(self, filename, write_diff: bool = False) -> None:
        """Write data/<layer>/<i> (owned params only) and, with write_diff, diff/<layer>/<i> (all)."""
        import h5py
        with atomic_path(filename, "HDF5 caffemodel") as tmp:
            with h5py.File(tmp, "w") as f:
                data = f.create_group("data")
                diff = f.create_group("diff") if write_diff else None
                for layer_id, layer in enumerate(self.layers):
                    name = layer.layer_param.name
                    if name in data:
                        raise NetError(f"Error saving weights to '{filename}': two layers are named '{name}'")
                    layer_data = data.create_group(name)
                    layer_diff = diff.create_group(name) if diff is not None else None
                    for param_id, blob in enumerate(layer.blobs):
                        if self.param_owners[self.param_id_vecs[layer_id][param_id]] == -1:
                            layer_data.create_dataset(str(param_id), data=blob.cpu_data())
                        if layer_diff is not None:
                            layer_diff.create_dataset(str(param_id), data=blob.cpu_diff())


def _read_hdf5_param(ds, blob, key: str, name: str, j: int, path: str) -> None:
    """One parameter blob from dataset `key` of an HDF5 caffemodel, with errors naming file, layer and blob."""
    import h5py
    if not isinstance(ds, h5py.Dataset):
        raise WeightsError(f"Error reading weights from '{path}': {key} (param {j} of layer '{name}') is a "
                           f"{type(ds).__name__.lower()}, not a dataset of numbers")
    if ds.dtype.kind not in "fiub":
        raise WeightsError(f"Error reading weights from '{path}': {key} (param {j} of layer '{name}') holds "
                           f"{_dtype_text(ds.dtype)}, not numbers")
    if tuple(ds.shape or ()) != blob.shape:
        raise WeightsError(
            f"Cannot copy param {j} weights from layer '{name}'; shape mismatch.  Source param "
            f"shape is {_shape_string(ds.shape or ())}; target param shape is {blob.shape_string()} "
            f"(weights file '{path}').")
    if not blob.count():
        return
    try:
        if ds.dtype == blob.dtype:
            ds.read_direct(blob.mutable_cpu_data())
        else:
            blob.mutable_cpu_data()[...] = ds[()]
    except (OSError, ValueError, TypeError) as exc:
        raise WeightsError(f"Error reading weights from '{path}': {key} (param {j} of layer '{name}') cannot "
                           f"be read: {exc}") from None


def _dtype_text(dtype) -> str:
    if dtype.kind in "SUO":
        return "strings"
    if dtype.kind == "V":
        return "compound records"
    return f"values of type {dtype}"

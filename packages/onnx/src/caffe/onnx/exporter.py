"""caffe.onnx.export(net, path): a caffe.Net, with its weights, as an ONNX model.

The layers are walked in Caffe's order (walk.py names the ONNX values); each layer's converter (registry.py)
emits its nodes. Inputs are the Input layers' tops; outputs the net's output blobs, by name.

Batch: the net's current input shapes are exported; `batch=N` reshapes the inputs first (and restores
them), `dynamic_batch=True` makes axis 0 of every input symbolic ("batch"). Output axes that follow
the batch are found the way Caffe would see them: by reshaping the net to another batch size and
comparing the output shapes.
"""
from __future__ import annotations

import contextlib
import os

import numpy as np
import onnx
from onnx import helper

from caffe.onnx import arith, conv, neuron, norm, pooling, shape  # noqa: F401  (they register converters)
from caffe.onnx import walk
from caffe.onnx.builder import ExportError, GraphBuilder, LayerContext
from caffe.onnx.registry import CONVERTERS, why_unsupported

DEFAULT_OPSET = 18
MIN_OPSET = 13
# ModelProto is one protobuf message, limited to 2 GiB: larger weights go to a file beside the model.
EXTERNAL_DATA_BYTES = 1 << 30


class UnsupportedLayersError(ExportError):
    """Layers without an ONNX form; `layers` lists (name, type, reason) for every one of them."""

    def __init__(self, net_name: str, layers):
        self.layers = list(layers)
        items = "; ".join(f"'{n}' ({t}): {why}" for n, t, why in self.layers)
        super().__init__(f"cannot export net '{net_name}' to ONNX: {len(self.layers)} layer"
                         f"{'s' if len(self.layers) != 1 else ''} without an ONNX equivalent: {items}")


def _opset(opset) -> int:
    latest = onnx.defs.onnx_opset_version()
    if opset is None:
        return min(DEFAULT_OPSET, latest)
    try:
        value = int(opset)
    except (TypeError, ValueError):
        raise ExportError(f"opset must be an integer, got {opset!r}") from None
    if not MIN_OPSET <= value <= latest:
        raise ExportError(f"opset {value} is not supported: caffe-onnx writes opsets {MIN_OPSET} to {latest} "
                          f"(the installed onnx package's newest)")
    return value


def _input_names(net) -> list[str]:
    return [net.blob_names[i] for i in net.input_blob_indices]


@contextlib.contextmanager
def _batch_size(net, batch):
    """Reshape every input to batch `batch` (axis 0) for the block; put the old shapes back after."""
    if batch is None:
        yield
        return
    if int(batch) < 1:
        raise ExportError(f"batch must be a positive integer, got {batch}")
    blobs = [net.blobs[name] for name in _input_names(net)]
    old = [b.shape for b in blobs]
    try:
        for b, s in zip(blobs, old):
            if len(s):
                b.reshape((int(batch),) + tuple(s[1:]))
        net.Reshape()
        yield
    finally:
        for b, s in zip(blobs, old):
            b.reshape(s)
        net.Reshape()


def _layer_params(net, i) -> list[np.ndarray]:
    """Layer i's parameter blobs as arrays, read through pycaffe's net.params (the stored values)."""
    name = net.layer_names[i]
    blobs = net.params.get(name) if net.layer_names.count(name) == 1 else None
    if blobs is None:
        blobs = net.layers[i].blobs
    return [np.array(b.data, dtype=net.dtype, copy=True) for b in blobs]


def _check_layers(net, contexts):
    bad = []
    for ctx in contexts:
        conv_ = CONVERTERS.get(ctx.type)
        if conv_ is None:
            bad.append((ctx.name, ctx.type, why_unsupported(ctx.type)))
        elif conv_.check is not None:
            why = conv_.check(ctx)
            if why:
                bad.append((ctx.name, ctx.type, why))
    if bad:
        raise UnsupportedLayersError(net.name, bad)


def check_net_param(param, phase: int = 1, level: int = 0, stages=()) -> None:
    """Refuse, before any Net is built, a NetParameter (a prototxt's, upgraded) whose layers in this phase
    include types without an ONNX form; UnsupportedLayersError names all of them. (A train_val net's data
    layers fail this way instead of on their missing databases.)"""
    from caffe.net.graph import FilterNet

    p = type(param)()
    p.CopyFrom(param)
    p.state.phase = phase
    p.state.level = level
    p.state.stage.extend(stages)
    bad = [(layer.name, layer.type, why_unsupported(layer.type)) for layer in FilterNet(p).layer
           if layer.type not in CONVERTERS]
    if bad:
        raise UnsupportedLayersError(param.name, bad)


def _batch_symbols(net, dynamic: bool):
    """Per output blob, its dimensions with the batch-following ones as names (dynamic) or ints."""
    outputs = [net.blob_names[b] for b in net.output_blob_indices]
    shapes = {name: list(net.blobs[name].shape) for name in outputs}
    if not dynamic:
        return shapes
    inputs = _input_names(net)
    batches = {net.blobs[n].shape[0] for n in inputs if len(net.blobs[n].shape)}
    if len(batches) > 1:
        raise ExportError(f"dynamic_batch needs every input to have the same batch size (axis 0); the inputs "
                          f"have {', '.join(f'{n} {tuple(net.blobs[n].shape)}' for n in inputs)}")
    if not batches:
        return shapes
    b0 = batches.pop()
    try:
        with _batch_size(net, b0 + 1):
            probe = {name: list(net.blobs[name].shape) for name in outputs}
    except Exception as exc:
        raise ExportError(f"dynamic_batch: net '{net.name}' does not reshape to batch {b0 + 1}, so its batch "
                          f"size is fixed: {exc}") from exc
    result = {}
    for name in outputs:
        dims = []
        for axis, (d0, d1) in enumerate(zip(shapes[name], probe[name])):
            if d0 == d1:
                dims.append(d0)
            elif d0 == b0 and d1 == b0 + 1:
                dims.append("batch")
            elif (d1 - d0) * b0 == d0:
                dims.append(f"{d1 - d0}*batch")
            else:
                dims.append(f"{name}_dim{axis}")
        result[name] = dims
    return result


def to_onnx(net, opset=None, *, batch=None, dynamic_batch: bool = False, doc_string: str = "") -> onnx.ModelProto:
    """The ONNX model of `net` (a caffe.Net with its weights), checked by onnx.checker."""
    opset = _opset(opset)
    if batch is not None and dynamic_batch:
        raise ExportError("batch and dynamic_batch exclude each other: give one")
    builder = GraphBuilder(net.dtype, opset, bool(dynamic_batch))
    with _batch_size(net, batch):
        steps, current = walk.steps(net, builder)
        _check_layers(net, [s for s in steps if isinstance(s, LayerContext)])
        out_dims = _batch_symbols(net, bool(dynamic_batch))
        walk.fold_batch_norm_scale(steps, set(current.values()))
        for ctx in steps:
            if isinstance(ctx, walk.AliasStep):
                ctx.emit(builder)
                continue
            if ctx.folded_into is not None:
                continue
            ctx.params = _layer_params(net, ctx.index)
            if ctx.fold is not None:
                ctx.fold.params = _layer_params(net, ctx.fold.index)
            try:
                CONVERTERS[ctx.type].convert(ctx)
            except ExportError:
                raise
            except Exception as exc:  # a bug here, not the user's: still say where
                raise ExportError(f"layer '{ctx.name}' ({ctx.type}): export failed: "
                                  f"{type(exc).__name__}: {exc}") from exc
        inputs = []
        for name in _input_names(net):
            dims = list(net.blobs[name].shape)
            if dynamic_batch and dims:
                dims[0] = "batch"
            inputs.append(helper.make_tensor_value_info(name, builder.elem_type, dims))
    outputs = [helper.make_tensor_value_info(current[b], builder.elem_type, out_dims[net.blob_names[b]])
               for b in net.output_blob_indices]
    graph = helper.make_graph(builder.nodes, net.name or "caffe_net", inputs, outputs, builder.initializers)
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="caffe-onnx",
                              producer_version=_version(), doc_string=doc_string or "")
    model.ir_version = helper.find_min_ir_version_for(opsets)
    helper.set_model_props(model, {"caffe_net_name": net.name, "caffe_phase": "TEST" if net.phase else "TRAIN"})
    return model


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("caffe-onnx")
    except Exception:  # a source tree without the installed distribution
        return "0"


def save(model: onnx.ModelProto, path) -> None:
    """Write `model` atomically; weights above 1 GiB go to `<path>.data` beside it (ONNX external data)."""
    from caffe.net.protofile import atomic_path

    path = os.fspath(path)
    large = sum(len(t.raw_data) for t in model.graph.initializer) > EXTERNAL_DATA_BYTES
    if not large:
        onnx.checker.check_model(model)
        with atomic_path(path) as tmp:
            onnx.save_model(model, tmp)
        return
    location = os.path.basename(path) + ".data"
    data_path = os.path.join(os.path.dirname(os.path.abspath(path)), location)
    with atomic_path(data_path) as tmp_data, atomic_path(path) as tmp:
        # onnx writes the data file next to the model under `location`: write it there, then move both
        onnx.save_model(model, tmp, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=os.path.basename(tmp_data), size_threshold=1024)
        # the model must name the final data file: rewrite its references
        reloaded = onnx.load_model(tmp, load_external_data=False)
        for t in reloaded.graph.initializer:
            for entry in t.external_data:
                if entry.key == "location":
                    entry.value = location
        onnx.save_model(reloaded, tmp)
    onnx.checker.check_model(path)


def export(net, path, opset=None, *, batch=None, dynamic_batch: bool = False, doc_string: str = "") -> onnx.ModelProto:
    """Write `net` (a caffe.Net in the TEST phase or a deploy net, with its weights) to `path` as ONNX.

    opset: the ONNX opset (default 18; 13 and later). batch: export with this batch size (axis 0 of
    every input). dynamic_batch: make the batch size symbolic. Returns the model. Raises
    UnsupportedLayersError naming every layer without an ONNX form, ExportError for bad options.
    """
    model = to_onnx(net, opset, batch=batch, dynamic_batch=dynamic_batch, doc_string=doc_string)
    save(model, path)
    return model

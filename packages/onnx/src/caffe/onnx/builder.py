"""The ONNX graph under construction: unique names, initializers, nodes, and one layer's view of it.

GraphBuilder owns the node list and the initializers and hands out unique names. LayerContext is what a
converter sees of one Caffe layer: its bottoms as ONNX tensor names with their shapes, its parameter blobs
as arrays, the tensor names its tops must be written to, and helpers that emit nodes and constants named
after the layer (the node that writes top 0 carries the layer's own name; helper nodes are `layer/op`).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


class ExportError(ValueError):
    """A net (or an export option) that cannot be exported; the message names the layer or option."""


class GraphBuilder:
    def __init__(self, dtype, opset: int, dynamic: bool):
        self.dtype = np.dtype(dtype)
        self.elem_type = helper.np_dtype_to_tensor_dtype(self.dtype)
        self.opset = opset
        self.dynamic = dynamic
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._tensor_names: set[str] = set()
        self._node_names: set[str] = set()

    def reserve(self, name: str) -> str:
        self._tensor_names.add(name)
        return name

    def tensor_name(self, base: str) -> str:
        """`base`, or `base_1`, `base_2`, ... : a tensor name not used yet."""
        name, i = base, 0
        while name in self._tensor_names:
            i += 1
            name = f"{base}_{i}"
        self._tensor_names.add(name)
        return name

    def node_name(self, base: str) -> str:
        name, i = base, 0
        while name in self._node_names:
            i += 1
            name = f"{base}_{i}"
        self._node_names.add(name)
        return name

    def initializer(self, array, base: str) -> str:
        name = self.tensor_name(base)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def add_node(self, op: str, inputs, outputs, name: str, domain: str = "", doc_string: str | None = None,
                 **attrs) -> None:
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(helper.make_node(op, list(inputs), list(outputs), name=self.node_name(name),
                                           doc_string=doc_string, domain=domain or None, **attrs))


class LayerContext:
    """One Caffe layer as a converter sees it (see the module doc)."""

    def __init__(self, builder: GraphBuilder, layer, name: str, bottoms, bottom_shapes, tops, top_shapes,
                 params=None, index: int = -1):
        self.b = builder
        self.index = index  # the layer's index in the net
        self.layer = layer
        self.param = layer.layer_param
        self.name = name
        self.type = layer.layer_param.type
        self.bottoms = list(bottoms)
        self.bottom_shapes = [tuple(s) for s in bottom_shapes]
        self.tops = list(tops)
        self.top_shapes = [tuple(s) for s in top_shapes]
        self.params = params  # the layer's parameter blobs as arrays (copies, net dtype)
        self.fold = None  # a following layer folded into this one's node (BatchNorm + Scale)
        self.folded_into = None

    # -- what converters read --------------------------------------------------------------------
    @property
    def dtype(self):
        return self.b.dtype

    @property
    def opset(self) -> int:
        return self.b.opset

    @property
    def dynamic(self) -> bool:
        return self.b.dynamic

    def error(self, message: str) -> ExportError:
        return ExportError(f"layer '{self.name}' ({self.type}): {message}")

    # -- what converters write -------------------------------------------------------------------
    def tmp(self, what: str) -> str:
        return self.b.tensor_name(f"{self.name}/{what}")

    def const(self, value, what: str, dtype=None) -> str:
        """An initializer holding `value` (the net's float dtype unless `dtype` is given)."""
        arr = np.asarray(value, dtype=self.dtype if dtype is None else dtype)
        return self.b.initializer(arr, f"{self.name}/{what}")

    def ints(self, values, what: str) -> str:
        return self.const(np.asarray(values, dtype=np.int64).reshape(-1), what, np.int64)

    def node(self, op: str, inputs, out=None, what: str | None = None, n_out: int = 1, doc: str | None = None,
             **attrs):
        """Emit one node; returns its output name (or names, for n_out > 1). `out` names the outputs
        (a top); by default fresh tensors `layer/what` are made."""
        what = what or op.lower()
        if out is None:
            outs = [self.tmp(what if n_out == 1 else f"{what}{i}") for i in range(n_out)]
        else:
            outs = [out] if isinstance(out, str) else list(out)
        main = bool(self.tops) and self.tops[0] in outs
        self.b.add_node(op, inputs, outs, self.name if main else f"{self.name}/{what}", doc_string=doc, **attrs)
        return outs if (n_out > 1 or isinstance(out, (list, tuple))) else outs[0]

    # -- small compositions shared by converters ----------------------------------------------------
    def scalar_op(self, op: str, x: str, value: float, what: str, out=None) -> str:
        return self.node(op, [x, self.const(value, what)], out=out, what=what)

    def reduce(self, op: str, x: str, axes, keepdims: int, out=None, what: str | None = None) -> str:
        """Reduce* over `axes`: axes as an input from opset 18 (13 for ReduceSum), an attribute before."""
        axes = [int(a) for a in axes]
        since = 13 if op == "ReduceSum" else 18
        if self.opset >= since:
            return self.node(op, [x, self.ints(axes, f"{what or op.lower()}_axes")], out=out, what=what,
                             keepdims=keepdims)
        return self.node(op, [x], out=out, what=what, axes=axes, keepdims=keepdims)

    def reshape(self, x: str, target, out=None, what: str = "reshape") -> str:
        """Reshape to `target` (ONNX's rules: 0 copies the input's dimension at that index, -1 is inferred)."""
        return self.node("Reshape", [x, self.ints(target, f"{what}_shape")], out=out, what=what)

    def unsqueeze_to(self, x: str, rank: int, ndim: int, out=None, what: str = "unsqueeze") -> str:
        """x (rank axes) followed by ndim - rank trailing 1 axes: how Caffe broadcasts over inner axes."""
        if ndim <= rank:
            return x if out is None else self.node("Identity", [x], out=out, what=what)
        axes = list(range(rank, ndim))
        return self.node("Unsqueeze", [x, self.ints(axes, f"{what}_axes")], out=out, what=what)

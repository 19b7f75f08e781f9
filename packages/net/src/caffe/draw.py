"""pycaffe's caffe.draw: a NetParameter as a graph (pydot), rendered by graphviz.

Layers are boxes (colored by type; in-place layers green), blobs are octagons, edges run
bottom -> layer -> top. `get_pydot_graph` builds the pydot graph, `draw_net` renders it to bytes,
`draw_net_to_file` writes a file in the format its extension names. Needs pydot (the `draw` extra:
pip install caffe-net[draw]); rendering images needs graphviz's `dot` program (e.g. apt-get install
graphviz), while DOT text (`.dot`, `.gv`, `.raw` files, or `net_to_dot`) needs only pydot.
"""
from __future__ import annotations

import os
import shutil

from caffe.proto import caffe_pb2

LAYER_STYLE_DEFAULT = {"shape": "record", "fillcolor": "#6495ED", "style": "filled"}
NEURON_LAYER_STYLE = {"shape": "record", "fillcolor": "#90EE90", "style": "filled"}
BLOB_STYLE = {"shape": "octagon", "fillcolor": "#E0E0E0", "style": "filled"}
_COLORS = {"Convolution": "#FF5050", "Deconvolution": "#FF5050", "Pooling": "#FF9900",
           "InnerProduct": "#CC33FF"}
# formats written as DOT text, without graphviz
TEXT_FORMATS = ("dot", "gv", "raw")


def _pydot():
    try:
        import pydot
    except ImportError:
        raise ImportError("caffe.draw needs pydot: pip install 'caffe-net[draw]' (or pip install pydot)") from None
    return pydot


def get_pooling_types_dict() -> dict[int, str]:
    """Pooling method number -> name (0 -> 'MAX', ...)."""
    return {v.number: name for name, v in caffe_pb2.PoolingParameter.PoolMethod.DESCRIPTOR.values_by_name.items()}


def get_edge_label(layer) -> str:
    """The label of a layer's edges to its tops: batch size for Data, num_output for conv/ip layers."""
    if layer.type == "Data":
        return f"Batch {layer.data_param.batch_size}"
    if layer.type in ("Convolution", "Deconvolution"):
        return str(layer.convolution_param.num_output)
    if layer.type == "InnerProduct":
        return str(layer.inner_product_param.num_output)
    return '""'


def get_layer_lr_mult(layer) -> tuple[float, float]:
    """(weights, bias) learning rate multipliers of a Convolution, Deconvolution or InnerProduct layer."""
    if layer.type not in ("Convolution", "Deconvolution", "InnerProduct"):
        raise ValueError(f"{layer.type} layers do not have a learning rate multiplier")
    if len(layer.param) > 2:
        raise ValueError(f"layer '{layer.name}': could not parse the learning rate multipliers "
                         f"({len(layer.param)} param specs)")
    mults = [p.lr_mult for p in layer.param] + [1.0] * (2 - len(layer.param))
    return mults[0], mults[1]


def _dims(values, h: int, w: int, has_hw: bool, default: int) -> str:
    if has_hw:
        return f"{h}x{w}"
    values = list(values) or [default]
    return "x".join(str(v) for v in values) if len(set(values)) > 1 else str(values[0])


def _spatial(layer, sep: str) -> str:
    if layer.type == "Pooling":
        p = layer.pooling_param
        if p.global_pooling:
            return "global pooling"
        kernel = _dims([p.kernel_size], p.kernel_h, p.kernel_w, p.HasField("kernel_h"), 1)
        stride = _dims([p.stride], p.stride_h, p.stride_w, p.HasField("stride_h"), 1)
        pad = _dims([p.pad], p.pad_h, p.pad_w, p.HasField("pad_h"), 0)
    else:
        p = layer.convolution_param
        kernel = _dims(p.kernel_size, p.kernel_h, p.kernel_w, p.HasField("kernel_h"), 1)
        stride = _dims(p.stride, p.stride_h, p.stride_w, p.HasField("stride_h"), 1)
        pad = _dims(p.pad, p.pad_h, p.pad_w, p.HasField("pad_h"), 0)
    return sep.join([f"kernel size: {kernel}", f"stride: {stride}", f"pad: {pad}"])


def get_layer_label(layer, rankdir: str, display_lrm: bool = False) -> str:
    """A layer's node label, double-quoted for DOT: name, (type), and for spatial layers kernel size,
    stride and pad; with display_lrm, the lr multipliers of learning layers. Parts are separated by
    spaces when the graph runs top-bottom (TB, BT), else by line breaks."""
    sep = " " if rankdir in ("TB", "BT") else r"\n"  # DOT's line break inside a quoted label
    kind = f"({layer.type} {get_pooling_types_dict()[layer.pooling_param.pool]})" if layer.type == "Pooling" \
        else f"({layer.type})"
    parts = [layer.name.replace("\\", "\\\\"), kind]
    if layer.type in ("Convolution", "Deconvolution", "Pooling"):
        parts.append(_spatial(layer, sep))
    if display_lrm and layer.type in ("Convolution", "Deconvolution", "InnerProduct"):
        lrm0, lrm1 = get_layer_lr_mult(layer)
        if lrm0 or lrm1:
            parts.append(f"lr mult: {lrm0:.1f}, {lrm1:.1f}")
    return '"' + sep.join(parts).replace('"', '\\"') + '"'


def choose_color_by_layertype(layertype: str) -> str:
    return _COLORS.get(layertype, LAYER_STYLE_DEFAULT["fillcolor"])


def _in_phase(layer, phase) -> bool:
    """Whether a layer is part of the net in `phase` (None: every layer). Rules without a phase
    (stage or level only) do not decide: drawing knows no stages."""
    if phase is None:
        return True
    if len(layer.include) and len(layer.exclude):
        raise ValueError(f"layer '{layer.name}' has both include and exclude specified")
    if len(layer.include):
        return any(not r.HasField("phase") or r.phase == phase for r in layer.include)
    return not any(r.HasField("phase") and r.phase == phase for r in layer.exclude)


def get_pydot_graph(caffe_net, rankdir: str, label_edges: bool = True, phase=None, display_lrm: bool = False):
    """The net as a pydot.Dot digraph. phase: caffe.TRAIN or caffe.TEST draws that phase's layers,
    None all of them; label_edges puts get_edge_label on each layer's top edges."""
    pydot = _pydot()
    graph = pydot.Dot(caffe_net.name or "Net", graph_type="digraph", rankdir=rankdir)
    nodes: dict[str, object] = {}
    edges: list[tuple[str, str, str]] = []
    for layer in caffe_net.layer:
        if not _in_phase(layer, phase):
            continue
        # one node per (name, type): a layer defined once per phase is drawn once
        node_id = f"{layer.name}_{layer.type}"
        in_place = len(layer.bottom) == 1 and len(layer.top) == 1 and layer.bottom[0] == layer.top[0]
        style = dict(NEURON_LAYER_STYLE) if in_place else \
            dict(LAYER_STYLE_DEFAULT, fillcolor=choose_color_by_layertype(layer.type))
        nodes[node_id] = pydot.Node(_quoted_id(node_id), label=get_layer_label(layer, rankdir, display_lrm), **style)
        for bottom in layer.bottom:
            nodes.setdefault(bottom + "_blob", pydot.Node(_quoted_id(bottom + "_blob"), label=_quoted(bottom),
                                                          **BLOB_STYLE))
            edges.append((bottom + "_blob", node_id, '""'))
        for top in layer.top:
            nodes.setdefault(top + "_blob", pydot.Node(_quoted_id(top + "_blob"), label=_quoted(top), **BLOB_STYLE))
            edges.append((node_id, top + "_blob", get_edge_label(layer) if label_edges else '""'))
    for node in nodes.values():
        graph.add_node(node)
    for src, dst, label in edges:
        graph.add_edge(pydot.Edge(nodes[src], nodes[dst], label=label))
    return graph


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _quoted_id(text: str) -> str:
    # always quoted, so names that are DOT keywords (graph, node, edge...) stay names
    return _quoted(text)


def net_to_dot(caffe_net, rankdir: str = "LR", phase=None, display_lrm: bool = False) -> str:
    """The DOT text of the net's graph (no graphviz needed)."""
    return get_pydot_graph(caffe_net, rankdir, phase=phase, display_lrm=display_lrm).to_string()


def _render(graph, ext: str) -> bytes:
    if ext in TEXT_FORMATS:
        return graph.to_string().encode()
    if shutil.which("dot") is None:
        raise RuntimeError(f"drawing a .{ext} image needs graphviz's 'dot' program, which is not on PATH "
                           f"(e.g. apt-get install graphviz); DOT text (.dot) needs only pydot")
    try:
        return graph.create(format=ext)
    except AssertionError as exc:  # pydot reports graphviz's own failures so
        raise RuntimeError(f"graphviz could not draw the net as .{ext}: {exc}") from None


def draw_net(caffe_net, rankdir: str, ext: str = "png", phase=None, display_lrm: bool = False) -> bytes:
    """The net drawn in format `ext` (png, svg, pdf, ... by graphviz; dot, gv, raw as DOT text), as bytes."""
    return _render(get_pydot_graph(caffe_net, rankdir, phase=phase, display_lrm=display_lrm), ext.lower())


def draw_net_to_file(caffe_net, filename, rankdir: str = "LR", phase=None, display_lrm: bool = False) -> None:
    """Draw the net into `filename`, in the format its extension names (.raw/.dot: DOT text)."""
    filename = os.fspath(filename)
    ext = filename.rsplit(".", 1)[-1] if "." in os.path.basename(filename) else "png"
    data = draw_net(caffe_net, rankdir, ext, phase, display_lrm)
    from caffe.net.protofile import atomic_open
    with atomic_open(filename) as f:
        f.write(data)

"""The walk over a Net's layers: which ONNX value each blob write becomes, and the steps to emit.

Each Caffe blob may be written several times (in-place layers share one blob); every write becomes a new
ONNX value (ONNX values are written once). The last write of a blob is named after the blob, so the
graph's outputs are the net's output blobs by name; earlier versions are named `blob/layer`. Caffe's
ShareData views (Flatten, Reshape, Split, a one-top Slice, a one-bottom Concat) see in-place writes through
any of them: such a write also gives every view a new value (an AliasStep, a Reshape).
"""
from __future__ import annotations

import numpy as np

from caffe.onnx.builder import LayerContext
from caffe.onnx.norm import can_fold_scale


def _shares_memory(layer) -> bool:
    """Layers whose tops are views of the bottom's memory in Caffe (ShareData), not copies."""
    t = layer.layer_param.type
    return (t in ("Flatten", "Reshape", "Split") or (t == "Slice" and len(layer.layer_param.top) == 1)
            or (t == "Concat" and len(layer.layer_param.bottom) == 1))


class AliasStep:
    """A blob that shares memory with one just written in place: its new value, reshaped (Caffe's ShareData
    views see writes through any of them)."""

    def __init__(self, blob: str, source: str, target: str, shape, node_name: str):
        self.blob, self.source, self.target, self.shape, self.node_name = blob, source, target, shape, node_name

    def emit(self, builder):
        dims = builder.initializer(np.asarray([-1] + list(self.shape[1:]), np.int64), f"{self.target}/shape")
        builder.add_node("Reshape", [self.source, dims], [self.target], self.node_name)


def _events(net):
    """Caffe's writes in order: ("layer", i), and ("alias", member, written, i) for each ShareData view of
    a blob written in place (so the tensor named after a blob always holds its value, as in Caffe)."""
    groups = {}  # blob id -> the set of blob ids sharing its memory
    produced = set(net.input_blob_indices)
    events = []
    for i, layer in enumerate(net.layers):
        events.append(("layer", i))
        for t in net.top_id_vecs[i]:
            if t in produced:  # in place: every view of this memory changes too
                events.extend(("alias", m, t, i) for m in sorted(groups.get(t, ())) if m != t and m in produced)
            produced.add(t)
        if _shares_memory(layer):
            for t in net.top_id_vecs[i]:
                merged = groups.get(t, {t}) | groups.get(net.bottom_id_vecs[i][0], {net.bottom_id_vecs[i][0]})
                for m in merged:
                    groups[m] = merged
    return events


def steps(net, builder):
    """LayerContexts (and AliasSteps) in order, the ONNX tensor names assigned (see the module doc)."""
    names = net.blob_names
    events = _events(net)
    last_write = {}
    for k, ev in enumerate(events):
        for b in (net.top_id_vecs[ev[1]] if ev[0] == "layer" else [ev[1]]):
            last_write[b] = k
    current = {}  # blob id -> its ONNX tensor name now
    for b in net.input_blob_indices:
        current[b] = builder.reserve(names[b])
    outputs = set(net.output_blob_indices) - set(current)  # an input written in place keeps the name as input
    for b in outputs:
        builder.reserve(names[b])

    def version(b, k, writer):
        if last_write[b] == k and b in outputs:
            return names[b]  # reserved above
        if last_write[b] == k:
            return builder.tensor_name(names[b])
        return builder.tensor_name(f"{names[b]}/{writer}")

    steps = []
    for k, ev in enumerate(events):
        if ev[0] == "alias":
            _, m, src, i = ev
            target = version(m, k, f"{net.layer_names[i]}_view")
            steps.append(AliasStep(names[m], current[src], target, net.blobs[names[m]].shape,
                                   builder.node_name(f"{net.layer_names[i]}/view_{names[m]}")))
            current[m] = target
            continue
        i = ev[1]
        layer = net.layers[i]
        lname = net.layer_names[i]
        bottoms = [current[b] for b in net.bottom_id_vecs[i]]
        tops = []
        for b in net.top_id_vecs[i]:
            if layer.layer_param.type != "Input":
                current[b] = version(b, k, lname)
            tops.append(current[b])
        steps.append(LayerContext(
            builder, layer, lname, bottoms, [net.blobs[names[b]].shape for b in net.bottom_id_vecs[i]], tops,
            [net.blobs[names[b]].shape for b in net.top_id_vecs[i]], index=i))
    return steps, current


def fold_batch_norm_scale(steps, final_values) -> None:
    """BatchNorm followed by its Scale becomes one BatchNormalization node (named after the BatchNorm),
    when nothing else reads the BatchNorm's output."""
    reads = {}
    for s in steps:
        for name in ([s.source] if isinstance(s, AliasStep) else s.bottoms):
            reads[name] = reads.get(name, 0) + 1
    for bn, sc in zip(steps, steps[1:]):
        if not (isinstance(bn, LayerContext) and isinstance(sc, LayerContext) and bn.type == "BatchNorm"
                and sc.type == "Scale" and bn.fold is None and bn.folded_into is None):
            continue
        out = bn.tops[0]
        if reads.get(out, 0) == 1 and out not in final_values and can_fold_scale(bn, sc):
            bn.fold, sc.folded_into = sc, bn
            bn.tops = [sc.tops[0]]

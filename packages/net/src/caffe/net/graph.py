"""Net-definition passes that run before any layer exists: FilterNet and InsertSplits.

FilterNet keeps the layers whose include/exclude NetStateRules the NetState meets
(net.cpp). InsertSplits gives every blob consumed more than once (as a bottom, or
as a bottom and a loss) its own Split layer, so that each consumer gets a private
diff that the Split layer sums in backward (insert_splits.cpp; same names).
"""
from __future__ import annotations

import logging

from caffe.proto import caffe_pb2

log = logging.getLogger("caffe.net")


class NetError(ValueError):
    """A net definition that cannot be built; the message names the layer and blob at fault."""


# -- FilterNet ---------------------------------------------------------------------------------------

def StateMeetsRule(state, rule, layer_name: str) -> bool:
    if rule.HasField("phase") and rule.phase != state.phase:
        log.info("The NetState phase (%d) differed from the phase (%d) specified by a rule in layer %s",
                 state.phase, rule.phase, layer_name)
        return False
    if rule.HasField("min_level") and state.level < rule.min_level:
        log.info("The NetState level (%d) is above the min_level (%d) specified by a rule in layer %s",
                 state.level, rule.min_level, layer_name)
        return False
    if rule.HasField("max_level") and state.level > rule.max_level:
        log.info("The NetState level (%d) is above the max_level (%d) specified by a rule in layer %s",
                 state.level, rule.max_level, layer_name)
        return False
    stages = set(state.stage)
    for stage in rule.stage:  # the state must have ALL of the rule's stages
        if stage not in stages:
            log.info("The NetState did not contain stage '%s' specified by a rule in layer %s", stage, layer_name)
            return False
    for stage in rule.not_stage:  # ... and NONE of its not_stages
        if stage in stages:
            log.info("The NetState contained a not_stage '%s' specified by a rule in layer %s", stage, layer_name)
            return False
    return True


def FilterNet(param):
    """A copy of `param` holding only the layers included in its NetState."""
    state = param.state
    filtered = caffe_pb2.NetParameter()
    filtered.CopyFrom(param)
    del filtered.layer[:]
    for layer in param.layer:
        if len(layer.include) and len(layer.exclude):
            raise NetError(f"Layer '{layer.name}' ({layer.type}) specifies both include and exclude "
                                     f"rules; specify either include rules or exclude rules, not both.")
        # No include rules: included unless an exclude rule is met. Otherwise: included if any include rule is.
        included = not len(layer.include)
        for rule in layer.exclude:
            if included and StateMeetsRule(state, rule, layer.name):
                included = False
        for rule in layer.include:
            if not included and StateMeetsRule(state, rule, layer.name):
                included = True
        if included:
            filtered.layer.add().CopyFrom(layer)
    return filtered


# -- InsertSplits -------------------------------------------------------------------------------------

def SplitLayerName(layer_name: str, blob_name: str, blob_idx: int) -> str:
    return f"{blob_name}_{layer_name}_{blob_idx}_split"


def SplitBlobName(layer_name: str, blob_name: str, blob_idx: int, split_idx: int) -> str:
    return f"{blob_name}_{layer_name}_{blob_idx}_split_{split_idx}"


def ConfigureSplitLayer(layer_name, blob_name, blob_idx, split_count, loss_weight, split_layer_param) -> None:
    split_layer_param.Clear()
    split_layer_param.bottom.append(blob_name)
    split_layer_param.name = SplitLayerName(layer_name, blob_name, blob_idx)
    split_layer_param.type = "Split"
    for k in range(split_count):
        split_layer_param.top.append(SplitBlobName(layer_name, blob_name, blob_idx, k))
        if loss_weight:
            # The loss moves to the first split output; the others carry none.
            split_layer_param.loss_weight.append(loss_weight if k == 0 else 0.0)


def unknown_bottom_error(param, layer_index: int, bottom_index: int) -> NetError:
    """The error for a bottom that no earlier layer produces; says when a later layer does (a cycle)."""
    layer = param.layer[layer_index]
    blob = layer.bottom[bottom_index]
    later = [(i, l.name) for i, l in enumerate(param.layer) if i >= layer_index and blob in l.top]
    msg = (f"Unknown bottom blob '{blob}' (layer '{layer.name}', bottom index {bottom_index}): "
           f"no earlier layer produces it")
    if later:
        i, name = later[0]
        what = "the layer itself" if i == layer_index else f"the later layer '{name}' (index {i})"
        msg += (f"; it is produced only by {what}. Layers run in prototxt order, so this is a cycle "
                f"in the net or the layers are out of order")
    return NetError(msg + ".")


def InsertSplits(param):
    """A copy of `param` with Split layers wherever a blob feeds more than one consumer."""
    split = caffe_pb2.NetParameter()
    split.CopyFrom(param)
    del split.layer[:]
    blob_name_to_last_top_idx = {}
    bottom_idx_to_source_top_idx = {}
    top_idx_to_bottom_count: dict = {}
    top_idx_to_loss_weight: dict = {}
    top_idx_to_bottom_split_idx: dict = {}
    layer_idx_to_layer_name = {-1: "input"}
    for i, name in enumerate(param.input):  # legacy net inputs (gone after the upgrade)
        blob_name_to_last_top_idx[name] = (-1, i)
    for i, layer in enumerate(param.layer):
        layer_idx_to_layer_name[i] = layer.name
        for j, blob_name in enumerate(layer.bottom):
            if blob_name not in blob_name_to_last_top_idx:
                raise unknown_bottom_error(param, i, j)
            top_idx = blob_name_to_last_top_idx[blob_name]
            bottom_idx_to_source_top_idx[(i, j)] = top_idx
            top_idx_to_bottom_count[top_idx] = top_idx_to_bottom_count.get(top_idx, 0) + 1
        for j, blob_name in enumerate(layer.top):
            blob_name_to_last_top_idx[blob_name] = (i, j)
        # A top used as a loss counts as one more consumer of that top.
        for j in range(min(len(layer.loss_weight), len(layer.top))):
            top_idx = blob_name_to_last_top_idx[layer.top[j]]
            top_idx_to_loss_weight[top_idx] = layer.loss_weight[j]
            if layer.loss_weight[j]:
                top_idx_to_bottom_count[top_idx] = top_idx_to_bottom_count.get(top_idx, 0) + 1
    for i, blob_name in enumerate(param.input):
        count = top_idx_to_bottom_count.get((-1, i), 0)
        if count > 1:
            ConfigureSplitLayer(layer_idx_to_layer_name[-1], blob_name, i, count, 0.0, split.layer.add())
    for i, source_layer in enumerate(param.layer):
        layer = split.layer.add()
        layer.CopyFrom(source_layer)
        for j, blob_name in enumerate(layer.bottom):
            top_idx = bottom_idx_to_source_top_idx[(i, j)]
            if top_idx_to_bottom_count.get(top_idx, 0) > 1:
                k = top_idx_to_bottom_split_idx.get(top_idx, 0)
                top_idx_to_bottom_split_idx[top_idx] = k + 1
                layer.bottom[j] = SplitBlobName(layer_idx_to_layer_name[top_idx[0]], blob_name, top_idx[1], k)
        for j, blob_name in enumerate(layer.top):
            top_idx = (i, j)
            count = top_idx_to_bottom_count.get(top_idx, 0)
            if count > 1:
                loss_weight = top_idx_to_loss_weight.get(top_idx, 0.0)
                ConfigureSplitLayer(layer_idx_to_layer_name[i], blob_name, j, count, loss_weight,
                                    split.layer.add())
                if loss_weight:
                    # The split layer now carries the loss; its first output is reserved for it.
                    layer.ClearField("loss_weight")
                    top_idx_to_bottom_split_idx[top_idx] = top_idx_to_bottom_split_idx.get(top_idx, 0) + 1
    return split

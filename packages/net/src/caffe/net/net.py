"""Net: Caffe's directed acyclic graph of layers (net.cpp), with pycaffe's surface.

Construction follows Net::Init exactly: upgrade the definition, FilterNet by the
NetState, InsertSplits, then create and SetUp each layer in prototxt order while
wiring blobs by name (in-place when a top repeats the bottom at the same index).
Input layer tops are the net's inputs; blobs nobody consumes are its outputs
(sorted by name, as Caffe's std::set). Parameter blobs are registered with their
ParamSpec (lr_mult, decay_mult, sharing by name); then a backward pass over the
graph decides which layers and bottoms need gradients, so no gradient is
computed that no loss uses.
"""
from __future__ import annotations

import ctypes
import logging
import math
import os

import numpy as np
from google.protobuf import text_format

from caffe.blob import Blob, context
from caffe.blob.syncedmem import UNINITIALIZED
from caffe.layers.layer import LayerError
from caffe.layers.registry import UnknownLayerTypeError, create_layer
from caffe.proto import caffe_pb2

from caffe.net import memcheck
from caffe.net.fold import build_units, fold_enabled
from caffe.net.graph import FilterNet, InsertSplits, NetError, unknown_bottom_error
from caffe.net.protofile import parse_text
from caffe.net.pycaffe import PycaffeNet
from caffe.net.upgrade import ReadNetParamsFromTextFileOrDie, UpgradeNetAsNeeded
from caffe.net.weights import WeightsMixin

# Parameter diffs at least this large are cleared by libc's memset, not NumPy's fill: glibc's large memset
# writes past the caches (no read of the lines first), CaffeNet's 244 MB of diffs 7.4 -> 2.6 ms on the 2-core
# development machine; smaller ones stay in cache for the backward that accumulates into them.
_MEMSET_MIN_BYTES = 1 << 20

log = logging.getLogger("caffe.net")

TRAIN = caffe_pb2.TRAIN
TEST = caffe_pb2.TEST


def _looks_like_path(s: str) -> bool:
    """A string names a file unless it reads as prototxt text (an existing file always wins)."""
    if os.path.exists(s) or s.endswith((".prototxt", ".pt", ".txt")):
        return True
    return not any(c in s for c in "\n{:")


def _callback(fn):
    """Accept a callable or a Caffe-style callback object with run(layer)."""
    run = fn if callable(fn) else getattr(fn, "run", None)
    if not callable(run):
        raise TypeError(f"a net callback must be callable (or have run(layer)); got {fn!r}")
    return run


class Net(WeightsMixin, PycaffeNet):
    """A network built from a NetParameter, a prototxt path or prototxt text.

    Net(network, phase=None, level=None, stages=None, weights=None, *, dtype=float32, fold=None)
    and pycaffe's legacy Net(network_file, weights_file, phase). fold: inference folding of BatchNorm/Scale
    into the Convolution/InnerProduct before them in the TEST phase (caffe.net.fold); None follows the
    environment variable CAFFE_FOLD (default on), False turns it off.
    """

    def __init__(self, network, phase=None, level=None, stages=None, weights=None, *, dtype=np.float32,
                 fold=None):
        if isinstance(phase, (str, os.PathLike)):  # pycaffe's legacy Net(file, weights, phase)
            if weights is not None:
                raise TypeError("Net(file, weights, phase): weights given twice")
            weights, phase, level = phase, level, None
        param, from_file = self._load_param(network)
        state = param.state
        if phase is not None:
            phase = int(phase)
            if phase not in (TRAIN, TEST):
                raise ValueError(f"Net: phase must be caffe.TRAIN (0) or caffe.TEST (1), got {phase}")
            state.phase = phase
        if stages:
            state.stage.extend([stages] if isinstance(stages, str) else list(stages))
        if level is not None:
            state.level = int(level)
        elif from_file:
            state.level = 0  # Caffe's file constructor always sets the level (default 0)
        self.dtype = np.dtype(dtype)
        self._before_forward: list = []
        self._after_forward: list = []
        self._before_backward: list = []
        self._after_backward: list = []
        self._input_arrays = None
        self._fold_flag = fold
        self.Init(param)
        if weights is not None:
            self.CopyTrainedLayersFrom(weights)

    @staticmethod
    def _load_param(network):
        """(an upgraded copy of the NetParameter, whether it came from a file or text)."""
        if isinstance(network, caffe_pb2.NetParameter):
            param = caffe_pb2.NetParameter()
            param.CopyFrom(network)
            UpgradeNetAsNeeded(param, "<NetParameter>")
            return param, False
        if isinstance(network, os.PathLike) or (isinstance(network, str) and _looks_like_path(network)):
            return ReadNetParamsFromTextFileOrDie(network), True
        if isinstance(network, str):
            param = parse_text(network, caffe_pb2.NetParameter(), source="<prototxt text>")
            UpgradeNetAsNeeded(param, "<prototxt text>")
            return param, True
        raise TypeError(f"Net needs a NetParameter, a prototxt path or prototxt text; got {type(network).__name__}")

    # -- Init ---------------------------------------------------------------------------------------
    def Init(self, in_param) -> None:
        self.phase = in_param.state.phase
        filtered = FilterNet(in_param)
        if log.isEnabledFor(logging.INFO):
            log.info("Initializing net from parameters: \n%s", text_format.MessageToString(filtered))
        param = InsertSplits(filtered)
        self.name = param.name
        self.layers, self.layer_names = [], []
        self._blobs, self.blob_names, self.blob_need_backward = [], [], []
        self.bottom_vecs, self.top_vecs, self.bottom_id_vecs, self.top_id_vecs = [], [], [], []
        self.param_id_vecs, self.bottom_need_backward, self.layer_need_backward = [], [], []
        self._blob_loss_weights = []
        self._inputs, self._outputs = [], []
        # parameters (Caffe's params_ & co.; `params` is pycaffe's dict, so the flat list is `_params`)
        self._params, self.param_owners, self.param_layer_indices = [], [], []
        self.param_names_index, self.param_display_names = {}, []
        self.learnable_params, self.learnable_param_ids = [], []
        self.params_lr, self.params_weight_decay, self.has_params_lr, self.has_params_decay = [], [], [], []
        self.memory_used = 0
        blob_name_to_idx: dict[str, int] = {}
        producer: dict[str, str] = {}
        available: set[str] = set()
        for layer_id, layer_param in enumerate(param.layer):
            if not layer_param.HasField("phase"):  # inherit the net's phase
                layer_param.phase = self.phase
            if len(layer_param.propagate_down) and len(layer_param.propagate_down) != len(layer_param.bottom):
                raise NetError(f"Layer '{layer_param.name}': propagate_down must be specified either 0 or "
                               f"bottom_size times ({len(layer_param.propagate_down)} given for "
                               f"{len(layer_param.bottom)} bottom(s))")
            layer = self._create_layer(layer_param)
            self.layers.append(layer)
            self.layer_names.append(layer_param.name)
            log.info("Creating Layer %s", layer_param.name)
            for vecs in (self.bottom_vecs, self.top_vecs, self.bottom_id_vecs, self.top_id_vecs,
                         self.param_id_vecs, self.bottom_need_backward):
                vecs.append([])
            need_backward = False
            for bottom_id in range(len(layer_param.bottom)):
                blob_id = self._append_bottom(param, layer_id, bottom_id, available, blob_name_to_idx)
                need_backward |= self.blob_need_backward[blob_id]  # a blob that needs backward: provide it
            num_top = len(layer_param.top)
            for top_id in range(num_top):
                self._append_top(param, layer_id, top_id, available, blob_name_to_idx, producer)
                if layer_param.type == "Input":
                    self._inputs.append(len(self._blobs) - 1)
            if getattr(layer, "auto_top_blobs", False):
                # Anonymous tops: not in the name map, so no other layer can consume them.
                needed = max(layer.min_top_blobs, layer.exact_num_top_blobs)
                while num_top < needed:
                    self._append_top(param, layer_id, num_top, None, None, None)
                    num_top += 1
            log.info("Setting up %s", layer_param.name)
            self._setup_layer(layer_id)
            for top_id, top in enumerate(self.top_vecs[layer_id]):
                blob_id = self.top_id_vecs[layer_id][top_id]
                while len(self._blob_loss_weights) <= blob_id:
                    self._blob_loss_weights.append(0.0)
                self._blob_loss_weights[blob_id] = layer.loss(top_id)
                log.info("Top shape: %s", top.shape_string())
                if layer.loss(top_id):
                    log.info("    with loss weight %g", layer.loss(top_id))
                self.memory_used += top.count()
            log.info("Memory required for data: %d", self.memory_used * self.dtype.itemsize)
            # Which parameters learn: the net definition's ParamSpec (lr_mult != 0) decides.
            param_size, num_param_blobs = len(layer_param.param), len(layer.blobs)
            if param_size > num_param_blobs:
                raise NetError(f"Too many params specified for layer '{layer_param.name}' ({layer_param.type}): "
                               f"{param_size} param specs for {num_param_blobs} parameter blob(s)")
            for param_id in range(num_param_blobs):
                lr_mult = layer_param.param[param_id].lr_mult if param_id < param_size else 1.0
                need_backward |= lr_mult != 0
                layer.set_param_propagate_down(param_id, lr_mult != 0)
            for param_id in range(num_param_blobs):
                self._append_param(layer_id, param_id)
            self.layer_need_backward.append(need_backward)
            if need_backward:
                for blob_id in self.top_id_vecs[layer_id]:
                    self.blob_need_backward[blob_id] = True
        self._prune_backward()
        self._force_backward = bool(param.force_backward)
        if param.force_backward:
            self._force_backward_all()
        memcheck.check_train_net(self)
        for name in sorted(available):  # what nobody consumed is the net's output (std::set order)
            log.info("This network produces output %s", name)
            self._outputs.append(blob_name_to_idx[name])
        self.blob_names_index = {name: i for i, name in enumerate(self.blob_names)}
        self.layer_names_index = {name: i for i, name in enumerate(self.layer_names)}
        self.ShareWeights()
        self.debug_info = bool(param.debug_info)
        self._pycaffe_cache = {}
        self.fold_units = []
        if (self.phase == TEST and not param.force_backward
                and fold_enabled(getattr(self, "_fold_flag", None))):
            self.fold_units = build_units(self)
        self._fold_at = {u.first: u for u in self.fold_units} or None
        log.info("Network initialization done.")

    def _create_layer(self, layer_param):
        try:
            return create_layer(layer_param)
        except UnknownLayerTypeError as exc:
            raise UnknownLayerTypeError(f"Layer '{layer_param.name}': {exc}") from None

    def _setup_layer(self, layer_id: int) -> None:
        layer = self.layers[layer_id]
        try:
            layer.SetUp(self.bottom_vecs[layer_id], self.top_vecs[layer_id])
        except LayerError:
            raise  # already names the layer
        except MemoryError as exc:  # name the layer and blob (caffe.net.memcheck)
            raise memcheck.layer_memory_error(self, layer_id, exc) from exc
        except (OverflowError, ValueError) as exc:
            if type(exc) not in (OverflowError, ValueError):  # a typed error (DataError, ...) says what is wrong
                exc.add_note(f"while setting up layer '{layer.name}' ({layer.type}) of net '{self.name}'")
                raise
            # Blob.reshape & co. name no layer
            raise LayerError(f"Layer '{layer.name}' ({layer.type}) of net '{self.name}': {exc}") from exc
        except Exception as exc:
            exc.add_note(f"while setting up layer '{layer.name}' ({layer.type}) of net '{self.name}'")
            raise
        memcheck.check_after_setup(self, layer_id)  # the blobs so far must fit before any is allocated

    def _append_top(self, param, layer_id, top_id, available, name_to_idx, producer) -> None:
        layer_param = param.layer[layer_id]
        blob_name = layer_param.top[top_id] if top_id < len(layer_param.top) else "(automatic)"
        if (name_to_idx is not None and top_id < len(layer_param.bottom)
                and blob_name == layer_param.bottom[top_id]):
            log.info("%s -> %s (in-place)", layer_param.name, blob_name)
            blob_id = name_to_idx[blob_name]
            self.top_vecs[layer_id].append(self._blobs[blob_id])
            self.top_id_vecs[layer_id].append(blob_id)
        elif name_to_idx is not None and blob_name in name_to_idx:
            raise NetError(self._duplicate_top_message(layer_param, top_id, blob_name, producer))
        else:
            log.info("%s -> %s", layer_param.name, blob_name)
            blob_id = len(self._blobs)
            self._blobs.append(Blob(dtype=self.dtype))
            self.blob_names.append(blob_name)
            self.blob_need_backward.append(False)
            if name_to_idx is not None:
                name_to_idx[blob_name] = blob_id
                producer[blob_name] = layer_param.name
            self.top_id_vecs[layer_id].append(blob_id)
            self.top_vecs[layer_id].append(self._blobs[blob_id])
        if available is not None:
            available.add(blob_name)

    @staticmethod
    def _duplicate_top_message(layer_param, top_id, blob_name, producer) -> str:
        msg = (f"Top blob '{blob_name}' produced by multiple sources: layer '{layer_param.name}' (top index "
               f"{top_id}) writes it, but layer '{producer.get(blob_name, '?')}' already produced it. Two "
               f"layers may write one blob only in place (the same name as bottom and top at the same index)")
        bottom = layer_param.bottom[top_id] if top_id < len(layer_param.bottom) else ""
        if bottom.startswith(blob_name + "_") and "_split_" in bottom:
            msg += (f"; here the layer was in place on '{blob_name}', but other layers consume '{blob_name}' "
                    f"too, so Caffe split it and in-place computation is not possible: rename the top")
        return msg + "."

    def _append_bottom(self, param, layer_id, bottom_id, available, name_to_idx) -> int:
        layer_param = param.layer[layer_id]
        blob_name = layer_param.bottom[bottom_id]
        if blob_name not in available:
            raise unknown_bottom_error(param, layer_id, bottom_id)
        blob_id = name_to_idx[blob_name]
        log.info("%s <- %s", layer_param.name, blob_name)
        self.bottom_vecs[layer_id].append(self._blobs[blob_id])
        self.bottom_id_vecs[layer_id].append(blob_id)
        available.discard(blob_name)
        need_backward = self.blob_need_backward[blob_id]
        if len(layer_param.propagate_down):  # propagate_down overrides, either way
            need_backward = bool(layer_param.propagate_down[bottom_id])
        self.bottom_need_backward[layer_id].append(need_backward)
        return blob_id

    def _append_param(self, layer_id: int, param_id: int) -> None:
        # The layer's own copy of its parameter: layers may add ParamSpecs in setup (BatchNorm does).
        layer = self.layers[layer_id]
        layer_param = layer.layer_param
        param_size = len(layer_param.param)
        spec = layer_param.param[param_id] if param_size > param_id else caffe_pb2.ParamSpec()
        param_name = spec.name if param_size > param_id else ""
        self.param_display_names.append(param_name or str(param_id))
        net_param_id = len(self._params)
        self._params.append(layer.blobs[param_id])
        self.param_id_vecs[layer_id].append(net_param_id)
        self.param_layer_indices.append((layer_id, param_id))
        if not param_name or param_name not in self.param_names_index:
            # This layer owns the blob: anonymous, or a name seen for the first time.
            self.param_owners.append(-1)
            if param_name:
                self.param_names_index[param_name] = net_param_id
            self.learnable_param_ids.append(len(self.learnable_params))
            self.learnable_params.append(self._params[net_param_id])
            self.has_params_lr.append(spec.HasField("lr_mult"))
            self.has_params_decay.append(spec.HasField("decay_mult"))
            self.params_lr.append(float(spec.lr_mult))
            self.params_weight_decay.append(float(spec.decay_mult))
            return
        owner_net_param_id = self.param_names_index[param_name]
        self.param_owners.append(owner_net_param_id)
        owner_layer_id, owner_param_id = self.param_layer_indices[owner_net_param_id]
        owner_layer = self.layer_names[owner_layer_id]
        log.info("Sharing parameters '%s' owned by layer '%s', param index %d",
                 param_name, owner_layer, owner_param_id)
        this_blob = layer.blobs[param_id]
        owner_blob = self.layers[owner_layer_id].blobs[owner_param_id]
        if param_size > param_id and spec.share_mode == caffe_pb2.ParamSpec.PERMISSIVE:
            if this_blob.count() != owner_blob.count():
                raise NetError(f"Cannot share param '{param_name}' owned by layer '{owner_layer}' with layer "
                               f"'{layer.name}'; count mismatch.  Owner layer param shape is "
                               f"{owner_blob.shape_string()}; sharing layer shape is {this_blob.shape_string()}")
        elif this_blob.shape != owner_blob.shape:
            raise NetError(f"Cannot share param '{param_name}' owned by layer '{owner_layer}' with layer "
                           f"'{layer.name}'; shape mismatch.  Owner layer param shape is "
                           f"{owner_blob.shape_string()}; sharing layer expects shape {this_blob.shape_string()}"
                           f" (set share_mode: PERMISSIVE to require only equal counts)")
        learnable_id = self.learnable_param_ids[owner_net_param_id]
        self.learnable_param_ids.append(learnable_id)
        for has_field, has_list, values, what in (("lr_mult", self.has_params_lr, self.params_lr, "lr_mult"),
                                                  ("decay_mult", self.has_params_decay,
                                                   self.params_weight_decay, "decay_mult")):
            if not spec.HasField(has_field):
                continue
            value = float(getattr(spec, has_field))
            if has_list[learnable_id]:
                if value != values[learnable_id]:
                    raise NetError(f"Shared param '{param_name}' has mismatched {what}: layer '{layer.name}' "
                                   f"gives {value:g}, but {values[learnable_id]:g} was set earlier")
            else:
                has_list[learnable_id] = True
                values[learnable_id] = value

    def _prune_backward(self) -> None:
        """Walk the net backwards: layers and bottoms that feed no loss need no backward."""
        blobs_under_loss: set[str] = set()
        blobs_skip_backp: set[str] = set()
        for layer_id in range(len(self.layers) - 1, -1, -1):
            layer = self.layers[layer_id]
            contributes_loss = False
            skip_propagate_down = True
            for top_id, blob_id in enumerate(self.top_id_vecs[layer_id]):
                blob_name = self.blob_names[blob_id]
                if layer.loss(top_id) or blob_name in blobs_under_loss:
                    contributes_loss = True
                if blob_name not in blobs_skip_backp:
                    skip_propagate_down = False
                if contributes_loss and not skip_propagate_down:
                    break
            # No top needs a gradient: neither does this layer, nor its bottoms.
            if self.layer_need_backward[layer_id] and skip_propagate_down:
                self.layer_need_backward[layer_id] = False
                self.bottom_need_backward[layer_id] = [False] * len(self.bottom_vecs[layer_id])
            if not contributes_loss:
                self.layer_need_backward[layer_id] = False
            log.info("%s %s backward computation.", self.layer_names[layer_id],
                     "needs" if self.layer_need_backward[layer_id] else "does not need")
            for bottom_id, blob_id in enumerate(self.bottom_id_vecs[layer_id]):
                blob_name = self.blob_names[blob_id]
                if contributes_loss:
                    blobs_under_loss.add(blob_name)
                else:
                    self.bottom_need_backward[layer_id][bottom_id] = False
                if not self.bottom_need_backward[layer_id][bottom_id]:
                    blobs_skip_backp.add(blob_name)

    def _force_backward_all(self) -> None:
        for layer_id, layer in enumerate(self.layers):
            self.layer_need_backward[layer_id] = True
            for bottom_id, blob_id in enumerate(self.bottom_id_vecs[layer_id]):
                need = self.bottom_need_backward[layer_id][bottom_id] or layer.allow_force_backward(bottom_id)
                self.bottom_need_backward[layer_id][bottom_id] = need
                self.blob_need_backward[blob_id] = self.blob_need_backward[blob_id] or need
            for param_id in range(len(layer.blobs)):
                layer.set_param_propagate_down(param_id, True)

    # -- forward / backward --------------------------------------------------------------------------------
    def ForwardFromTo(self, start: int, end: int) -> float:
        n = len(self.layers)
        if start < 0 or end >= n:
            raise IndexError(f"ForwardFromTo({start}, {end}): layer indices must lie in [0, {n - 1}]")
        if self._before_forward or self._after_forward or self.debug_info:
            return self._forward_observed(start, end)
        if self._fold_at is not None:
            if context.mode() == context.CPU:
                return self._forward_folded(start, end)
            self._unfold(start, end)
        # The plain loop: nothing per layer but the call (this is what small batches pay for).
        loss = 0.0
        layers, bottom_vecs, top_vecs = self.layers, self.bottom_vecs, self.top_vecs
        for i in range(start, end + 1):
            try:
                loss += layers[i].Forward(bottom_vecs[i], top_vecs[i])
            except LayerError:
                raise
            except Exception as exc:
                self._note(exc, i, "forward")
                raise
        return loss

    def _note(self, exc, i: int, what: str) -> None:
        layer = self.layers[i]
        exc.add_note(f"in the {what} pass of layer '{layer.name}' ({layer.type})")

    def _forward_observed(self, start: int, end: int) -> float:
        """Layer by layer, with the callbacks and debug info (never folded: they observe each layer)."""
        if self._fold_at is not None:
            self._unfold(start, end)
        loss = 0.0
        for i in range(start, end + 1):
            for cb in self._before_forward:
                cb(i)
            layer = self.layers[i]
            try:
                loss += layer.Forward(self.bottom_vecs[i], self.top_vecs[i])
            except LayerError:
                raise
            except Exception as exc:
                self._note(exc, i, "forward")
                raise
            if self.debug_info:
                self.ForwardDebugInfo(i)
            for cb in self._after_forward:
                cb(i)
        return loss

    def _forward_folded(self, start: int, end: int) -> float:
        """Folded chains lying wholly in [start, end] run as one step each; other layers one by one."""
        loss = 0.0
        fold_at = self._fold_at
        layers, bottom_vecs, top_vecs = self.layers, self.bottom_vecs, self.top_vecs
        i = start
        for unit in self.fold_units:  # a range may begin inside a chain
            if unit.first < start <= unit.last:
                self._unfold(start, start)
        while i <= end:
            unit = fold_at.get(i)
            if unit is not None:
                if unit.last <= end:
                    loss += unit.forward()
                    i = unit.last + 1
                    continue
                self._unfold(i, end)
            try:
                loss += layers[i].Forward(bottom_vecs[i], top_vecs[i])
            except LayerError:
                raise
            except Exception as exc:
                self._note(exc, i, "forward")
                raise
            i += 1
        return loss

    def _unfold(self, start: int, end: int) -> None:
        """Before layers of folded chains run one by one: compute their pending tops (so the layers read and
        overwrite what the unfolded forward would have left), and mark the chains as unfolded."""
        for unit in self.fold_units:
            if unit.first <= end and unit.last >= start:
                unit.settle()
                if start <= unit.first:
                    unit.ran_folded = False

    def fold(self, enabled: bool) -> None:
        """Turn inference folding on or off for this net (on only takes effect in the TEST phase without
        force_backward: as at construction)."""
        if self._fold_at is not None:
            self._unfold(0, len(self.layers) - 1)
        if not enabled:
            self._fold_at = None
            return
        if not self.fold_units and self.phase == TEST and not self._force_backward:
            self.fold_units = build_units(self)
        self._fold_at = {u.first: u for u in self.fold_units} or None

    def forward_steps(self) -> list:
        """The forward as it runs now: (first layer, last layer, run) per step, run() -> loss; a folded
        chain is one step (for per-layer timing: caffe-cli time, bench/bench_infer.py)."""
        steps = []
        fold_at = self._fold_at if context.mode() == context.CPU else None
        i, n = 0, len(self.layers)
        while i < n:
            unit = fold_at.get(i) if fold_at else None
            if unit is not None:
                steps.append((i, unit.last, unit.forward))
                i = unit.last + 1
                continue
            layer, bottom, top = self.layers[i], self.bottom_vecs[i], self.top_vecs[i]
            steps.append((i, i, lambda layer=layer, bottom=bottom, top=top: layer.Forward(bottom, top)))
            i += 1
        return steps

    @property
    def folded(self) -> bool:
        """Whether folded chains run in this net's forward (in CPU mode)."""
        return self._fold_at is not None

    def ForwardFrom(self, start: int) -> float:
        return self.ForwardFromTo(start, len(self.layers) - 1)

    def ForwardTo(self, end: int) -> float:
        return self.ForwardFromTo(0, end)

    def Forward(self) -> float:
        """Run every layer (inputs already in place); returns the total weighted loss."""
        return self.ForwardFromTo(0, len(self.layers) - 1)

    def BackwardFromTo(self, start: int, end: int) -> None:
        n = len(self.layers)
        if end < 0 or start >= n:
            raise IndexError(f"BackwardFromTo({start}, {end}): layer indices must lie in [0, {n - 1}]")
        if self.fold_units:
            self._check_backward(start, end)
        if self._before_backward or self._after_backward or self.debug_info:
            self._backward_observed(start, end)
            return
        layers, top_vecs, bottom_vecs = self.layers, self.top_vecs, self.bottom_vecs
        need, bottom_need = self.layer_need_backward, self.bottom_need_backward
        for i in range(start, end - 1, -1):
            if need[i]:
                try:
                    layers[i].Backward(top_vecs[i], bottom_need[i], bottom_vecs[i])
                except LayerError:
                    raise
                except Exception as exc:
                    self._note(exc, i, "backward")
                    raise

    def _backward_observed(self, start: int, end: int) -> None:
        for i in range(start, end - 1, -1):
            for cb in self._before_backward:
                cb(i)
            if self.layer_need_backward[i]:
                layer = self.layers[i]
                try:
                    layer.Backward(self.top_vecs[i], self.bottom_need_backward[i], self.bottom_vecs[i])
                except LayerError:
                    raise
                except Exception as exc:
                    self._note(exc, i, "backward")
                    raise
                if self.debug_info:
                    self.BackwardDebugInfo(i)
            for cb in self._after_backward:
                cb(i)

    def _check_backward(self, start: int, end: int) -> None:
        for unit in self.fold_units:
            if not unit.ran_folded or unit.first > start or unit.last < end:
                continue
            if any(self.layer_need_backward[i] for i in unit.ids if end <= i <= start):
                raise NetError(f"Backward through layers {', '.join(unit.names)} of net '{self.name}', which ran "
                               f"folded into one for inference in the last forward (TEST phase): their "
                               f"gradients need the unfolded forward. Build the net with fold=False (or "
                               f"CAFFE_FOLD=0, or force_backward: true in the prototxt) to run backward.")

    def BackwardFrom(self, start: int) -> None:
        self.BackwardFromTo(start, 0)

    def BackwardTo(self, end: int) -> None:
        self.BackwardFromTo(len(self.layers) - 1, end)

    def Backward(self) -> None:
        self.BackwardFromTo(len(self.layers) - 1, 0)
        if self.debug_info:
            asum_data = asum_diff = sumsq_data = sumsq_diff = 0.0
            for b in self.learnable_params:
                asum_data += b.asum_data()
                asum_diff += b.asum_diff()
                sumsq_data += b.sumsq_data()
                sumsq_diff += b.sumsq_diff()
            log.error("    [Backward] All net params (data, diff): L1 norm = (%g, %g); L2 norm = (%g, %g)",
                      asum_data, asum_diff, math.sqrt(sumsq_data), math.sqrt(sumsq_diff))

    def ForwardBackward(self) -> float:
        loss = self.Forward()
        self.Backward()
        return loss

    def Reshape(self) -> None:
        for i, layer in enumerate(self.layers):
            layer.reshape(self.bottom_vecs[i], self.top_vecs[i])

    # -- parameters --------------------------------------------------------------------------------------
    @staticmethod
    def _xp():
        if context.mode() == context.GPU:
            import cupy
            return cupy
        return np

    def ClearParamDiffs(self) -> None:
        xp = self._xp()
        for blob in self.learnable_params:
            diff = blob.mutable_diff_xp(xp)
            if xp is np and diff.nbytes >= _MEMSET_MIN_BYTES and diff.flags.c_contiguous:
                ctypes.memset(diff.ctypes.data, 0, diff.nbytes)  # all-zero bits: +0.0
            else:
                diff[...] = 0

    def Update(self) -> None:
        """data -= diff for every learnable parameter (shared ones share the owner's data and diff)."""
        if self.debug_info:
            for i in range(len(self._params)):
                self.UpdateDebugInfo(i)
        for blob in self.learnable_params:
            blob.update()

    def ShareWeights(self) -> None:
        for i, owner in enumerate(self.param_owners):
            if owner >= 0:
                self._params[i].share_data(self._params[owner])
                self._params[i].share_diff(self._params[owner])

    def ShareTrainedLayersWith(self, other: "Net") -> None:
        """Share (not copy) the parameter data of same-named layers of `other`."""
        first = {}
        for i, name in enumerate(self.layer_names):
            first.setdefault(name, i)
        for source_layer, name in zip(other.layers, other.layer_names):
            target_id = first.get(name)
            if target_id is None:
                log.info("Ignoring source layer %s", name)
                continue
            target_blobs = self.layers[target_id].blobs
            if len(target_blobs) != len(source_layer.blobs):
                raise NetError(f"Incompatible number of blobs for layer '{name}': the source net has "
                               f"{len(source_layer.blobs)}, this net has {len(target_blobs)}")
            for j, (target, source) in enumerate(zip(target_blobs, source_layer.blobs)):
                if target.shape != source.shape:
                    raise NetError(f"Cannot share param {j} weights from layer '{name}'; shape mismatch.  "
                                   f"Source param shape is {source.shape_string()}; target param shape is "
                                   f"{target.shape_string()}")
                target.share_data(source)

    # -- lookups ---------------------------------------------------------------------------------------
    def has_blob(self, name: str) -> bool:
        return name in self.blob_names_index

    def blob_by_name(self, name: str):
        if name not in self.blob_names_index:
            log.warning("Unknown blob name %s", name)
            return None
        return self._blobs[self.blob_names_index[name]]

    def has_layer(self, name: str) -> bool:
        return name in self.layer_names_index

    def layer_by_name(self, name: str):
        if name not in self.layer_names_index:
            log.warning("Unknown layer name %s", name)
            return None
        return self.layers[self.layer_names_index[name]]

    @property
    def input_blob_indices(self) -> list[int]:
        return list(self._inputs)

    @property
    def output_blob_indices(self) -> list[int]:
        return list(self._outputs)

    @property
    def input_blobs(self) -> list[Blob]:
        return [self._blobs[i] for i in self._inputs]

    @property
    def output_blobs(self) -> list[Blob]:
        return [self._blobs[i] for i in self._outputs]

    @property
    def output_blob_names(self) -> list[str]:
        return [self.blob_names[i] for i in self._outputs]

    @property
    def num_inputs(self) -> int:
        return len(self._inputs)

    @property
    def num_outputs(self) -> int:
        return len(self._outputs)

    @property
    def param_names(self) -> list[str]:
        return list(self.param_display_names)

    # -- callbacks (Net::Callback; fn(layer_index)) ----------------------------------------------------
    def before_forward(self, fn) -> None:
        self._before_forward.append(_callback(fn))

    def after_forward(self, fn) -> None:
        self._after_forward.append(_callback(fn))

    def before_backward(self, fn) -> None:
        self._before_backward.append(_callback(fn))

    def after_backward(self, fn) -> None:
        self._after_backward.append(_callback(fn))

    add_before_forward, add_after_forward = before_forward, after_forward
    add_before_backward, add_after_backward = before_backward, after_backward

    # -- debug info (the lines Caffe prints with debug_info: true) ---------------------------------------
    def set_debug_info(self, value: bool) -> None:
        self.debug_info = bool(value)

    @staticmethod
    def _mean(total: float, count: int) -> float:
        return total / count if count else float("nan")

    def ForwardDebugInfo(self, layer_id: int) -> None:
        name = self.layer_names[layer_id]
        for top, blob_id in zip(self.top_vecs[layer_id], self.top_id_vecs[layer_id]):
            log.info("    [Forward] Layer %s, top blob %s data: %g", name, self.blob_names[blob_id],
                     self._mean(top.asum_data(), top.count()))
        for blob, net_param_id in zip(self.layers[layer_id].blobs, self.param_id_vecs[layer_id]):
            log.info("    [Forward] Layer %s, param blob %s data: %g", name,
                     self.param_display_names[net_param_id], self._mean(blob.asum_data(), blob.count()))

    def BackwardDebugInfo(self, layer_id: int) -> None:
        name = self.layer_names[layer_id]
        for bottom_id, (bottom, blob_id) in enumerate(zip(self.bottom_vecs[layer_id],
                                                          self.bottom_id_vecs[layer_id])):
            if self.bottom_need_backward[layer_id][bottom_id]:
                log.info("    [Backward] Layer %s, bottom blob %s diff: %g", name, self.blob_names[blob_id],
                         self._mean(bottom.asum_diff(), bottom.count()))
        layer = self.layers[layer_id]
        for param_id, blob in enumerate(layer.blobs):
            if layer.param_propagate_down(param_id):
                log.info("    [Backward] Layer %s, param blob %d diff: %g", name, param_id,
                         self._mean(blob.asum_diff(), blob.count()))

    def UpdateDebugInfo(self, param_id: int) -> None:
        blob = self._params[param_id]
        owner = self.param_owners[param_id]
        layer_name = self.layer_names[self.param_layer_indices[param_id][0]]
        display = self.param_display_names[param_id]
        diff_mean = self._mean(blob.asum_diff(), blob.count())
        if owner < 0:
            log.info("    [Update] Layer %s, param %s data: %g; diff: %g", layer_name, display,
                     self._mean(blob.asum_data(), blob.count()), diff_mean)
        else:
            owner_layer = self.layer_names[self.param_layer_indices[owner][0]]
            log.info("    [Update] Layer %s, param blob %s (owned by layer %s, param %s) diff: %g",
                     layer_name, display, owner_layer, self.param_display_names[owner], diff_mean)

    # -- memory ---------------------------------------------------------------------------------------
    def memory_report(self) -> dict:
        """Bytes held by the net's blobs (allocated data and diff), counting shared memory once; the folded
        weights of inference folding (made at the first folded forward) apart."""
        seen: set[int] = set()

        def held(blobs) -> int:
            total = 0
            for b in blobs:
                for mem in b._memories():  # (not data_mem: that would compute pending blobs)
                    if mem is not None and id(mem) not in seen and mem.head != UNINITIALIZED:
                        seen.add(id(mem))
                        total += mem.size
            return total

        activations = held(self._blobs)
        params = held(self._params)
        folded = held(b for u in self.fold_units if u.clone is not None for b in u.clone.blobs)
        return {"activation_bytes": activations, "param_bytes": params, "folded_param_bytes": folded,
                "total_bytes": activations + params + folded,
                "memory_required_for_data": self.memory_used * self.dtype.itemsize}

    def __repr__(self) -> str:
        phase = "TRAIN" if self.phase == TRAIN else "TEST"
        return f"<caffe.Net '{self.name}' {phase}: {len(self.layers)} layers, {len(self._blobs)} blobs>"

"""Inference folding: BatchNorm / Scale after a Convolution or InnerProduct, folded into its weights.

In a TEST-phase net, a chain of consecutive layers

    Convolution | InnerProduct  ->  [BatchNorm (global stats)]  ->  [Scale]  ->  [ReLU | Clip]

(at least a BatchNorm or a Scale, or a Convolution and its activation alone; each layer reading the previous
one's top) computes an affine map per output channel after the GEMM, so it runs as ONE layer: a clone of the
Convolution/InnerProduct whose weights are W * k and bias (b - mean) * k + beta (k = gamma / sqrt(var + eps)),
followed by the activation: a Convolution applies it in the pass that adds the bias, block by block while
the block is in cache (conv_base's epilogue); after an InnerProduct it is a pass of its own (the same
conv_base.apply_epilogue). The BatchNorm, Scale and ReLU passes over the whole tensor (and their temporaries)
disappear. A Convolution followed by only a ReLU or Clip
(SqueezeNet, GoogLeNet, CaffeNet) has no weights to fold: the Convolution itself runs with the activation
as its epilogue for that call.

Transparent:
- the original layers, their parameter blobs (`net.params`, `ToProto`, `Save`) and blob names are untouched;
  the folded weights live in the clone (`net.fold_units[i].clone`);
- the chain's last top holds the result (within float rounding of the unfolded forward); a top of the chain
  that another chain layer overwrites in place held an intermediate value that no one could read anyway;
- a chain top that is NOT in place (say `conv1` -> BatchNorm -> `conv1/bn`) is "pending" after the forward:
  the first read of its data (any accessor, or another layer) runs the original layers up to it, so it
  holds exactly what the unfolded forward puts there. It is computed from the chain's bottom as it is at
  that moment: if the bottom was written after the forward (e.g. the next image was copied into `data`
  before reading `conv1`), a warning says so;
- the folded weights are recomputed before a forward whenever a source parameter may have changed: another
  blob object in the layer (reshape, share_with), another SyncedMemory, a newer SyncedMemory.version (every
  mutable access bumps it: copy_from, `.data[...] = `, solver updates), or a live view of the parameter's
  host memory anywhere (a view held across forwards could be written at any time: while one exists, the
  fold is recomputed at every forward).

Off: `Net(..., fold=False)`, environment CAFFE_FOLD=0, `caffe-cli test/time --fold=false`; never in the
TRAIN phase, with force_backward, in GPU mode (runs unfolded: untested on a GPU), or while forward callbacks
or debug_info are set (they observe each layer). A Backward that would run a layer of a chain that was
folded in the last forward raises NetError (rebuild with fold=False to take gradients in a TEST net).
"""
from __future__ import annotations

import logging
import os
import sys

import numpy as np

from caffe.blob.syncedmem import HEAD_AT_CPU, SYNCED, SyncedMemory
from caffe.layers import conv_base
from caffe.layers.layer import LayerError
from caffe.layers.registry import create_layer
from caffe.proto import caffe_pb2

log = logging.getLogger("caffe.net")

ENV = "CAFFE_FOLD"
PRODUCERS = ("Convolution", "InnerProduct")
ACTIVATIONS = ("ReLU", "Clip")


def fold_enabled(flag=None) -> bool:
    """The fold switch: an explicit flag wins, else the environment variable CAFFE_FOLD (default on)."""
    if flag is not None:
        return bool(flag)
    value = os.environ.get(ENV, "1").strip().lower()
    if value in ("0", "false", "off", "no"):
        return False
    if value in ("", "1", "true", "on", "yes"):
        return True
    raise ValueError(f"environment variable {ENV}={value!r}: expected 0 or 1 (or false/true, off/on)")


# -- is anyone holding a view of a memory? -------------------------------------------------------------

def _host_refs(mem) -> int:
    view = mem.cpu_data()
    return sys.getrefcount(view.base)


def _calibrate() -> int:
    mem = SyncedMemory(8)
    mem.mutable_cpu_data()
    return _host_refs(mem)


_QUIET_REFS = _calibrate()


def quiet(mem) -> bool:
    """True when no view of mem's host memory is alive (so only a new accessor call, which bumps
    mem.version, can write it). Borrowed memory (set_cpu_data) is watched while anything else holds its
    owner (e.g. the one buffer behind all parameters in data-parallel training)."""
    if mem.head not in (HEAD_AT_CPU, SYNCED):
        return False
    return _host_refs(mem) <= _QUIET_REFS


# -- one folded chain ------------------------------------------------------------------------------------

class FoldUnit:
    """Layers ids[0..] of a net (producer, [BatchNorm], [Scale], [activation]) run as one."""

    def __init__(self, net, ids: list[int]):
        self.ids = list(ids)
        self.layers = [net.layers[i] for i in ids]
        self.bottoms = [net.bottom_vecs[i] for i in ids]
        self.tops = [net.top_vecs[i] for i in ids]
        self.names = [net.layer_names[i] for i in ids]
        self.producer = self.layers[0]
        by_type = {layer.type: layer for layer in self.layers[1:]}
        self.bn = by_type.get("BatchNorm")
        self.scale = by_type.get("Scale")
        self.act = next((layer for layer in self.layers[1:] if layer.type in ACTIVATIONS), None)
        self.act_code = None if self.act is None else _act_code(self.act)  # conv_base's epilogue form
        # Convolution -> ReLU/Clip only: the producer itself runs, with the activation as its epilogue for
        # the call (no clone: its weights are the producer's own)
        self.act_only = self.bn is None and self.scale is None
        self.bottom = self.bottoms[0]
        self.final = self.tops[-1][0]
        # Tops other than the final one, with the position of the layer that writes them last.
        self.pending: list[tuple] = []
        for pos, top in enumerate(self.tops):
            blob = top[0]
            if blob is self.final:
                continue
            if self.pending and self.pending[-1][0] is blob:
                self.pending[-1] = (blob, pos)
            else:
                self.pending.append((blob, pos))
        self.clone = None
        self._state = None  # what the folded weights were computed from; None: recompute
        self._bottom_state = None
        self.ran_folded = False
        self.recomputes = 0

    @property
    def first(self) -> int:
        return self.ids[0]

    @property
    def last(self) -> int:
        return self.ids[-1]

    def describe(self) -> str:
        return f"{self.names[0]} <- {', '.join(self.names[1:])}"

    # -- the clone carrying the folded weights ----------------------------------------------------------
    def _make_clone(self):
        p = caffe_pb2.LayerParameter()
        p.CopyFrom(self.producer.layer_param)
        del p.blobs[:], p.param[:], p.loss_weight[:]
        p.name = f"{p.name}@folded"
        sub = p.convolution_param if p.type == "Convolution" else p.inner_product_param
        sub.bias_term = True
        for filler in (sub.weight_filler, sub.bias_filler):  # no random draws: the values are replaced
            filler.Clear()
            filler.type = "constant"
        clone = create_layer(p)
        clone.SetUp(self.bottom, [self.final])
        if hasattr(clone, "epilogue"):  # a Convolution: the activation (if any) in its store
            clone.epilogue = self.act_code
        return clone

    def _run_act_only(self, bottom, top):
        producer = self.producer
        producer.epilogue = self.act_code
        try:
            producer.Forward(bottom, top)
        finally:
            producer.epilogue = None  # run one by one (a pending top, fold off) it is the plain layer

    def _param_blobs(self):
        for layer in (self.producer, self.bn, self.scale):
            if layer is not None:
                for i, blob in enumerate(layer.blobs):
                    yield layer, i, blob

    def _fresh(self) -> bool:
        state = self._state
        if state is None:
            return False
        for layer, i, blob, mem, version in state:
            if len(layer.blobs) <= i or layer.blobs[i] is not blob:
                return False
            m = blob.data_mem
            if m is not mem or m.version != version or not quiet(m):
                return False
        return True

    def _record(self):
        state = []
        for layer, i, blob in self._param_blobs():
            mem = blob.data_mem
            if not quiet(mem):
                return None  # a view is alive: it may be written after this: recompute next time too
            state.append((layer, i, blob, mem, mem.version))
        return state

    def _channel_affine(self, channels: int):
        """(k, shift) in float64: the chain maps the producer's output z to z * k + shift per channel."""
        f64 = np.float64
        prod = self.producer
        if len(prod.blobs) > 1:
            shift = prod.blobs[1].cpu_data().reshape(-1).astype(f64)
        else:
            shift = np.zeros(channels, f64)
        k = np.ones(channels, f64)
        if self.bn is not None:
            bn = self.bn
            factor = float(bn.blobs[2].cpu_data().reshape(-1)[0])
            factor = 0.0 if factor == 0 else 1.0 / factor
            mean = bn.blobs[0].cpu_data().reshape(-1).astype(f64) * factor
            var = bn.blobs[1].cpu_data().reshape(-1).astype(f64) * factor
            inv = 1.0 / np.sqrt(var + float(bn.layer_param.batch_norm_param.eps))
            shift = (shift - mean) * inv
            k = k * inv
        if self.scale is not None:
            sc = self.scale
            gamma = sc.blobs[0].cpu_data().reshape(-1).astype(f64)
            shift = shift * gamma
            k = k * gamma
            if len(sc.blobs) > 1:
                shift = shift + sc.blobs[1].cpu_data().reshape(-1).astype(f64)
        return k, shift

    def _compute(self) -> None:
        clone = self.clone
        w = self.producer.blobs[0].cpu_data()
        transpose = self.producer.type == "InnerProduct" and self.producer.layer_param.inner_product_param.transpose
        channels = w.shape[1] if transpose else w.shape[0]
        k, shift = self._channel_affine(channels)
        wc = clone.blobs[0].mutable_cpu_data()
        if transpose:
            np.multiply(w, k[None, :], out=wc, casting="unsafe")
        else:
            np.multiply(w.reshape(channels, -1), k[:, None], out=wc.reshape(channels, -1), casting="unsafe")
        clone.blobs[1].mutable_cpu_data()[...] = shift
        self.recomputes += 1

    # -- running ------------------------------------------------------------------------------------------
    def forward(self) -> float:
        if self.act_only:
            run = self._run_act_only
        else:
            if self.clone is None:
                self.clone = self._make_clone()
            if not self._fresh():
                self._compute()
                self._state = self._record()
            run = self.clone.Forward
        for blob, _ in self.pending:
            blob._set_lazy(None)  # recomputed below (and only on demand)
        try:
            run(self.bottom, [self.final])
            if self.act is not None and not hasattr(self.producer, "epilogue"):  # InnerProduct: a pass of its own
                conv_base.apply_epilogue(np, self.final.mutable_cpu_data(), self.act_code)
        except LayerError:
            raise
        except Exception as exc:
            exc.add_note(f"in the forward pass of layers {', '.join(self.names)} folded into one "
                         f"(build the net with fold=False to run them one by one)")
            raise
        if self.pending:
            mem = self.bottom[0].data_mem
            self._bottom_state = (mem, mem.version)
            for j, (blob, _) in enumerate(self.pending):
                blob.reshape_like(self.final)
                blob._set_lazy(_Materializer(self, j))
        self.ran_folded = True
        return 0.0

    def settle(self) -> None:
        """Compute every pending top now (before layers of this chain run one by one)."""
        for blob, _ in self.pending:
            if blob._lazy_pending:
                blob.cpu_data()

    def materialize(self, j: int) -> None:
        for blob, _ in self.pending[: j + 1]:
            blob._set_lazy(None)
        mem = self.bottom[0].data_mem
        if self._bottom_state is not None and (mem is not self._bottom_state[0]
                                               or mem.version != self._bottom_state[1]):
            log.warning("Folded layers %s: blob computed on demand from the current contents of its bottom, "
                        "which was written after the forward (build the net with fold=False to keep the "
                        "values of the forward)", ", ".join(self.names))
        for pos in range(self.pending[j][1] + 1):
            layer = self.layers[pos]
            try:
                layer.Forward(self.bottoms[pos], self.tops[pos])
            except LayerError:
                raise
            except Exception as exc:
                exc.add_note(f"in the forward pass of layer '{layer.name}' ({layer.type}), run to compute a "
                             f"blob skipped by inference folding")
                raise


class _Materializer:
    __slots__ = ("unit", "j")

    def __init__(self, unit, j):
        self.unit, self.j = unit, j

    def __call__(self, blob):
        self.unit.materialize(self.j)


# -- finding the chains ----------------------------------------------------------------------------------

def _act_code(act) -> tuple:
    """A ReLU or Clip layer as (code, a, b) of conv_base's epilogue (its parameters as the proto holds them)."""
    if act.type == "ReLU":
        return (conv_base.ACT_RELU, float(act.layer_param.relu_param.negative_slope), 0.0)
    p = act.layer_param.clip_param
    return (conv_base.ACT_CLIP, float(p.min), float(p.max))


def _bn_uses_global_stats(layer) -> bool:
    p = layer.layer_param.batch_norm_param
    if p.HasField("use_global_stats"):
        return bool(p.use_global_stats)
    return layer.phase == caffe_pb2.TEST


def _producer_channels(net, i: int):
    """Output channels of a foldable Convolution/InnerProduct at layer i (channel axis 1), else None."""
    layer = net.layers[i]
    if layer.type not in PRODUCERS or len(net.bottom_vecs[i]) != 1 or len(net.top_vecs[i]) != 1:
        return None
    if layer.loss(0) or not layer.blobs:
        return None
    top = net.top_vecs[i][0]
    if layer.type == "Convolution":
        axis = layer.layer_param.convolution_param.axis
        if net.bottom_vecs[i][0].canonical_axis_index(axis) != 1:
            return None
        return top.shape[1] if top.num_axes >= 2 else None
    return top.shape[1] if top.num_axes == 2 else None  # InnerProduct: (M, num_output) only


def _accepts(net, j: int, stage: int, channels: int):
    """The stage (1 BatchNorm, 2 Scale, 3 activation) layer j takes in a chain, or None."""
    layer = net.layers[j]
    if len(net.bottom_vecs[j]) != 1 or len(net.top_vecs[j]) != 1 or layer.loss(0):
        return None
    bottom = net.bottom_vecs[j][0]
    if layer.type == "BatchNorm" and stage < 1:
        ok = (_bn_uses_global_stats(layer) and bottom.num_axes >= 2 and bottom.shape[1] == channels
              and len(layer.blobs) == 3 and layer.blobs[0].count() == channels)
        return 1 if ok else None
    if layer.type == "Scale" and stage < 2:
        p = layer.layer_param.scale_param
        if not layer.blobs or not -bottom.num_axes <= p.axis < bottom.num_axes:
            return None
        gamma = layer.blobs[0]
        per_channel = bottom.canonical_axis_index(p.axis) == 1 and gamma.shape == (channels,)
        if not (gamma.count() == 1 or per_channel):
            return None
        if len(layer.blobs) > 1 and layer.blobs[1].shape != gamma.shape:
            return None
        return 2
    if layer.type in ACTIVATIONS and stage < 3:
        return 3
    return None


def find_chains(net) -> list[list[int]]:
    """Layer index chains that fold (see the module docstring)."""
    readers: dict[int, set[int]] = {}
    for i, ids in enumerate(net.bottom_id_vecs):
        for blob_id in ids:
            readers.setdefault(blob_id, set()).add(i)
    outputs = set(net._outputs)
    chains = []
    n = len(net.layers)
    i = 0
    while i < n:
        channels = _producer_channels(net, i)
        if channels is None:
            i += 1
            continue
        chain, stage = [i], 0
        j = i + 1
        while j < n and net.bottom_id_vecs[j] == [net.top_id_vecs[chain[-1]][0]]:
            stage_j = _accepts(net, j, stage, channels)
            if stage_j is None:
                break
            chain.append(j)
            stage = stage_j
            j += 1
            if stage == 3:
                break
        # An intermediate top that a layer outside the chain reads ends the chain there (it must hold
        # its own value for that reader, so it becomes the chain's final blob).
        members = set(chain)
        tops = [net.top_id_vecs[k][0] for k in chain]
        for pos, blob_id in enumerate(tops):
            if blob_id == tops[-1]:
                break
            if (readers.get(blob_id, set()) - members) or blob_id in outputs:
                last = max(p for p, b in enumerate(tops) if b == blob_id)
                chain = chain[: last + 1]
                break
        affine = any(net.layers[k].type in ("BatchNorm", "Scale") for k in chain[1:])
        # a Convolution and its activation alone: no weights to fold, the activation in the store
        act_only = len(chain) == 2 and net.layers[i].type == "Convolution" and net.layers[chain[1]].type in ACTIVATIONS
        if affine or act_only:
            chains.append(chain)
            i = chain[-1] + 1
        else:
            i += 1
    return chains


def build_units(net) -> list[FoldUnit]:
    units = [FoldUnit(net, chain) for chain in find_chains(net)]
    for u in units:
        log.info("Inference folding: %s", u.describe())
    return units

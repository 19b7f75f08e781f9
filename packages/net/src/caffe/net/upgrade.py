"""Caffe's legacy-format upgrades (upgrade_proto.cpp), applied to every net and solver read.

Net definitions went through several formats; Caffe upgrades them on read, in this order:
  V0 (`layers { layer { type: "conv" ... } }`, padding layers)  -> V1 (`layers { type: CONVOLUTION }`)
  data-transform fields inside data_param & co.                 -> transform_param
  V1 (`layers`, enum types, blobs_lr / weight_decay)            -> `layer` with string types and ParamSpec
  top-level input / input_shape / input_dim                     -> an Input layer
  BatchNorm with three param specs                              -> lr_mult = decay_mult = 0
Solvers: the `solver_type` enum becomes the `type` string, and an unset or directory snapshot_prefix is
filled in from the solver file's name. Functions keep Caffe's names; each returns/edits the message.
"""
from __future__ import annotations

import logging
import os

from caffe.proto import caffe_pb2

from caffe.net.protofile import ProtoFileError, read_binary, read_text

log = logging.getLogger("caffe.net")


class UpgradeError(ValueError):
    """A legacy definition that cannot be upgraded (Caffe's LOG(FATAL) cases)."""


# -- V0 -> V1 ------------------------------------------------------------------------------

def NetNeedsV0ToV1Upgrade(net_param) -> bool:
    return any(l.HasField("layer") for l in net_param.layers)


def NetNeedsV1ToV2Upgrade(net_param) -> bool:
    return len(net_param.layers) > 0


def UpgradeV0PaddingLayers(param):
    """Fold V0 'padding' layers into the pad of the conv/pool layer that consumes them."""
    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    del out.layers[:]
    blob_name_to_last_top_idx = {name: -1 for name in param.input}
    for i, connection in enumerate(param.layers):
        layer = connection.layer
        if layer.type != "padding":
            out.layers.add().CopyFrom(connection)
        for j, blob_name in enumerate(connection.bottom):
            if blob_name not in blob_name_to_last_top_idx:
                raise UpgradeError(f"Unknown blob input '{blob_name}' to V0 layer '{layer.name}' "
                                   f"(bottom index {j})")
            top_idx = blob_name_to_last_top_idx[blob_name]
            if top_idx == -1:
                continue
            source = param.layers[top_idx]
            if source.layer.type == "padding":
                # Only conv and pool layers can take a padding layer's output, one input each.
                if layer.type not in ("conv", "pool"):
                    raise UpgradeError(f"Padding layer input to non-convolutional / non-pooling layer "
                                       f"'{layer.name}' of type {layer.type}")
                if len(connection.bottom) != 1:
                    raise UpgradeError(f"V0 layer '{layer.name}' takes a single blob as input")
                if len(source.bottom) != 1 or len(source.top) != 1:
                    raise UpgradeError(f"Padding layer '{source.layer.name}' must have one input and "
                                       f"one output")
                target = out.layers[len(out.layers) - 1]
                target.layer.pad = source.layer.pad
                target.bottom[j] = source.bottom[0]
        for blob_name in connection.top:
            blob_name_to_last_top_idx[blob_name] = i
    return out


_V0_TYPES = {
    "accuracy": "ACCURACY", "bnll": "BNLL", "concat": "CONCAT", "conv": "CONVOLUTION", "data": "DATA",
    "dropout": "DROPOUT", "euclidean_loss": "EUCLIDEAN_LOSS", "flatten": "FLATTEN",
    "hdf5_data": "HDF5_DATA", "hdf5_output": "HDF5_OUTPUT", "im2col": "IM2COL", "images": "IMAGE_DATA",
    "infogain_loss": "INFOGAIN_LOSS", "innerproduct": "INNER_PRODUCT", "lrn": "LRN",
    "multinomial_logistic_loss": "MULTINOMIAL_LOGISTIC_LOSS", "pool": "POOLING", "relu": "RELU",
    "sigmoid": "SIGMOID", "softmax": "SOFTMAX", "softmax_loss": "SOFTMAX_LOSS", "split": "SPLIT",
    "tanh": "TANH", "window_data": "WINDOW_DATA",
}


def UpgradeV0LayerType(type_name: str) -> int:
    try:
        return caffe_pb2.V1LayerParameter.LayerType.Value(_V0_TYPES[type_name])
    except KeyError:
        raise UpgradeError(f"Unknown V0 layer type: '{type_name}'") from None


# V0 field -> {V0 layer type: (V1 sub-message, field, how)}; how: "set", "add" (repeated) or "copy".
_V0_FIELDS = {
    "num_output": {"conv": ("convolution_param", "num_output", "set"),
                   "innerproduct": ("inner_product_param", "num_output", "set")},
    "biasterm": {"conv": ("convolution_param", "bias_term", "set"),
                 "innerproduct": ("inner_product_param", "bias_term", "set")},
    "weight_filler": {"conv": ("convolution_param", "weight_filler", "copy"),
                      "innerproduct": ("inner_product_param", "weight_filler", "copy")},
    "bias_filler": {"conv": ("convolution_param", "bias_filler", "copy"),
                    "innerproduct": ("inner_product_param", "bias_filler", "copy")},
    "pad": {"conv": ("convolution_param", "pad", "add"), "pool": ("pooling_param", "pad", "set")},
    "kernelsize": {"conv": ("convolution_param", "kernel_size", "add"),
                   "pool": ("pooling_param", "kernel_size", "set")},
    "group": {"conv": ("convolution_param", "group", "set")},
    "stride": {"conv": ("convolution_param", "stride", "add"), "pool": ("pooling_param", "stride", "set")},
    "dropout_ratio": {"dropout": ("dropout_param", "dropout_ratio", "set")},
    "local_size": {"lrn": ("lrn_param", "local_size", "set")},
    "alpha": {"lrn": ("lrn_param", "alpha", "set")},
    "beta": {"lrn": ("lrn_param", "beta", "set")},
    "k": {"lrn": ("lrn_param", "k", "set")},
    "source": {"data": ("data_param", "source", "set"), "hdf5_data": ("hdf5_data_param", "source", "set"),
               "images": ("image_data_param", "source", "set"),
               "window_data": ("window_data_param", "source", "set"),
               "infogain_loss": ("infogain_loss_param", "source", "set")},
    "batchsize": {"data": ("data_param", "batch_size", "set"),
                  "hdf5_data": ("hdf5_data_param", "batch_size", "set"),
                  "images": ("image_data_param", "batch_size", "set"),
                  "window_data": ("window_data_param", "batch_size", "set")},
    "rand_skip": {"data": ("data_param", "rand_skip", "set"), "images": ("image_data_param", "rand_skip", "set")},
    "shuffle_images": {"images": ("image_data_param", "shuffle", "set")},
    "new_height": {"images": ("image_data_param", "new_height", "set")},
    "new_width": {"images": ("image_data_param", "new_width", "set")},
    "concat_dim": {"concat": ("concat_param", "concat_dim", "set")},
    "det_fg_threshold": {"window_data": ("window_data_param", "fg_threshold", "set")},
    "det_bg_threshold": {"window_data": ("window_data_param", "bg_threshold", "set")},
    "det_fg_fraction": {"window_data": ("window_data_param", "fg_fraction", "set")},
    "det_context_pad": {"window_data": ("window_data_param", "context_pad", "set")},
    "det_crop_mode": {"window_data": ("window_data_param", "crop_mode", "set")},
    "hdf5_output_param": {"hdf5_output": (None, "hdf5_output_param", "copy")},
}
# Fields that apply to any V0 layer type: they move into transform_param.
_V0_TRANSFORM = {"scale": "scale", "meanfile": "mean_file", "cropsize": "crop_size", "mirror": "mirror"}
_V0_POOL = {0: caffe_pb2.PoolingParameter.MAX, 1: caffe_pb2.PoolingParameter.AVE,
            2: caffe_pb2.PoolingParameter.STOCHASTIC}


def UpgradeV0LayerParameter(v0_connection, layer_param) -> bool:
    """One V0 layer (inside a V1 `layers` entry) -> a V1LayerParameter. False if something was dropped."""
    compatible = True
    layer_param.Clear()
    layer_param.bottom.extend(v0_connection.bottom)
    layer_param.top.extend(v0_connection.top)
    if not v0_connection.HasField("layer"):
        return compatible
    v0 = v0_connection.layer
    t = v0.type
    if v0.HasField("name"):
        layer_param.name = v0.name
    if v0.HasField("type"):
        layer_param.type = UpgradeV0LayerType(t)
    layer_param.blobs.extend(v0.blobs)
    layer_param.blobs_lr.extend(v0.blobs_lr)
    layer_param.weight_decay.extend(v0.weight_decay)
    for field, targets in _V0_FIELDS.items():
        if not v0.HasField(field):
            continue
        if t not in targets:
            log.error("Unknown parameter %s for layer type %s", field, t)
            compatible = False
            continue
        sub, name, how = targets[t]
        msg = getattr(layer_param, sub) if sub else layer_param
        value = getattr(v0, field)
        if how == "set":
            setattr(msg, name, value)
        elif how == "add":
            getattr(msg, name).append(value)
        else:
            getattr(msg, name).CopyFrom(value)
    if v0.HasField("pool"):
        if t == "pool":
            layer_param.pooling_param.pool = _V0_POOL[v0.pool]
        else:
            log.error("Unknown parameter pool for layer type %s", t)
            compatible = False
    for field, name in _V0_TRANSFORM.items():
        if v0.HasField(field):
            setattr(layer_param.transform_param, name, getattr(v0, field))
    return compatible


def UpgradeV0Net(v0_net_param_padding_layers, net_param) -> bool:
    v0 = UpgradeV0PaddingLayers(v0_net_param_padding_layers)
    compatible = True
    net_param.Clear()
    if v0.HasField("name"):
        net_param.name = v0.name
    for connection in v0.layers:
        compatible &= UpgradeV0LayerParameter(connection, net_param.layers.add())
    net_param.input.extend(v0.input)
    net_param.input_dim.extend(v0.input_dim)
    if v0.HasField("force_backward"):
        net_param.force_backward = v0.force_backward
    return compatible


# -- data transformation fields ----------------------------------------------------------------

_DATA_SUBMSG = {"DATA": "data_param", "IMAGE_DATA": "image_data_param", "WINDOW_DATA": "window_data_param"}
_TRANSFORM_FIELDS = ("scale", "mean_file", "crop_size", "mirror")


def _data_submsg(v1_layer):
    name = caffe_pb2.V1LayerParameter.LayerType.Name(v1_layer.type) if v1_layer.HasField("type") else ""
    return _DATA_SUBMSG.get(name)


def NetNeedsDataUpgrade(net_param) -> bool:
    for layer in net_param.layers:
        sub = _data_submsg(layer)
        if sub and any(getattr(layer, sub).HasField(f) for f in _TRANSFORM_FIELDS):
            return True
    return False


def UpgradeNetDataTransformation(net_param) -> None:
    for layer in net_param.layers:
        sub = _data_submsg(layer)
        if not sub:
            continue
        msg = getattr(layer, sub)
        for f in _TRANSFORM_FIELDS:
            if msg.HasField(f):
                setattr(layer.transform_param, f, getattr(msg, f))
                msg.ClearField(f)


# -- V1 -> V2 ------------------------------------------------------------------------------------

_V1_TYPE_NAMES = {
    "NONE": "", "ABSVAL": "AbsVal", "ACCURACY": "Accuracy", "ARGMAX": "ArgMax", "BNLL": "BNLL",
    "CONCAT": "Concat", "CONTRASTIVE_LOSS": "ContrastiveLoss", "CONVOLUTION": "Convolution",
    "DECONVOLUTION": "Deconvolution", "DATA": "Data", "DROPOUT": "Dropout", "DUMMY_DATA": "DummyData",
    "EUCLIDEAN_LOSS": "EuclideanLoss", "ELTWISE": "Eltwise", "EXP": "Exp", "FLATTEN": "Flatten",
    "HDF5_DATA": "HDF5Data", "HDF5_OUTPUT": "HDF5Output", "HINGE_LOSS": "HingeLoss", "IM2COL": "Im2col",
    "IMAGE_DATA": "ImageData", "INFOGAIN_LOSS": "InfogainLoss", "INNER_PRODUCT": "InnerProduct",
    "LRN": "LRN", "MEMORY_DATA": "MemoryData", "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss",
    "MVN": "MVN", "POOLING": "Pooling", "POWER": "Power", "RELU": "ReLU", "SIGMOID": "Sigmoid",
    "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss", "SILENCE": "Silence", "SOFTMAX": "Softmax",
    "SOFTMAX_LOSS": "SoftmaxWithLoss", "SPLIT": "Split", "SLICE": "Slice", "TANH": "TanH",
    "WINDOW_DATA": "WindowData", "THRESHOLD": "Threshold",
}


def UpgradeV1LayerType(v1_type: int) -> str:
    try:
        return _V1_TYPE_NAMES[caffe_pb2.V1LayerParameter.LayerType.Name(v1_type)]
    except (KeyError, ValueError):
        raise UpgradeError(f"Unknown V1LayerParameter layer type: {v1_type}") from None


# Every V1 `*_param` sub-message has a LayerParameter field of the same name.
_V1_SUBMESSAGES = [f.name for f in caffe_pb2.V1LayerParameter.DESCRIPTOR.fields if f.name.endswith("_param")]


def UpgradeV1LayerParameter(v1, layer_param) -> bool:
    layer_param.Clear()
    compatible = True
    layer_param.bottom.extend(v1.bottom)
    layer_param.top.extend(v1.top)
    if v1.HasField("name"):
        layer_param.name = v1.name
    layer_param.include.extend(v1.include)
    layer_param.exclude.extend(v1.exclude)
    if v1.HasField("type"):
        layer_param.type = UpgradeV1LayerType(v1.type)
    layer_param.blobs.extend(v1.blobs)

    def spec(i):
        while len(layer_param.param) <= i:
            layer_param.param.add()
        return layer_param.param[i]

    for i, name in enumerate(v1.param):
        spec(i).name = name
    for i, mode in enumerate(v1.blob_share_mode):
        spec(i).share_mode = (caffe_pb2.ParamSpec.STRICT if mode == caffe_pb2.V1LayerParameter.STRICT
                              else caffe_pb2.ParamSpec.PERMISSIVE)
    for i, lr in enumerate(v1.blobs_lr):
        spec(i).lr_mult = lr
    for i, decay in enumerate(v1.weight_decay):
        spec(i).decay_mult = decay
    layer_param.loss_weight.extend(v1.loss_weight)
    for sub in _V1_SUBMESSAGES:
        if v1.HasField(sub):
            getattr(layer_param, sub).CopyFrom(getattr(v1, sub))
    if v1.HasField("layer"):
        log.error("Input NetParameter has V0 layer -- ignoring.")
        compatible = False
    return compatible


def UpgradeV1Net(v1_net_param, net_param) -> bool:
    if len(v1_net_param.layer):
        raise UpgradeError("Refusing to upgrade inconsistent NetParameter input; the definition includes "
                           "both 'layer' and 'layers' fields. The current format defines 'layer' fields with "
                           "string type like layer { type: 'Layer' ... } and not layers { type: LAYER ... }. "
                           "Manually switch the definition to 'layer' format to continue.")
    compatible = True
    net_param.CopyFrom(v1_net_param)
    del net_param.layers[:]
    del net_param.layer[:]
    for i, v1 in enumerate(v1_net_param.layers):
        if not UpgradeV1LayerParameter(v1, net_param.layer.add()):
            log.error("Upgrade of input layer %d failed.", i)
            compatible = False
    return compatible


# -- inputs and BatchNorm ---------------------------------------------------------------------------

def NetNeedsInputUpgrade(net_param) -> bool:
    return len(net_param.input) > 0


def UpgradeNetInput(net_param) -> None:
    """Top-level input fields -> an Input layer placed first. Bare `input` (old caffemodels) is dropped."""
    has_shape = len(net_param.input_shape) > 0
    has_dim = len(net_param.input_dim) > 0
    if has_shape or has_dim:
        if has_shape and has_dim:
            raise UpgradeError("Must specify either input_shape OR deprecated input_dim, not both.")
        n = len(net_param.input)
        if has_dim and len(net_param.input_dim) != 4 * n:
            raise UpgradeError(f"Incorrect input blob dimension specifications: {n} input(s) need "
                               f"{4 * n} input_dim values, got {len(net_param.input_dim)}")
        if has_shape and len(net_param.input_shape) != n:
            raise UpgradeError(f"Exactly one input_shape must be specified per input: {n} input(s), "
                               f"{len(net_param.input_shape)} input_shape(s)")
        layer = caffe_pb2.LayerParameter(name="input", type="Input")
        for i, name in enumerate(net_param.input):
            layer.top.append(name)
            shape = layer.input_param.shape.add()
            if has_shape:
                shape.CopyFrom(net_param.input_shape[i])
            else:
                shape.dim.extend(net_param.input_dim[4 * i:4 * i + 4])
        # Put the Input layer first so that every later layer finds its bottoms.
        rest = caffe_pb2.NetParameter()
        rest.layer.extend(net_param.layer)
        del net_param.layer[:]
        net_param.layer.append(layer)
        net_param.layer.extend(rest.layer)
    net_param.ClearField("input")
    net_param.ClearField("input_shape")
    net_param.ClearField("input_dim")


def NetNeedsBatchNormUpgrade(net_param) -> bool:
    return any(l.type == "BatchNorm" and len(l.param) == 3 for l in net_param.layer)


def UpgradeNetBatchNorm(net_param) -> None:
    """Old BatchNorm definitions declared 3 param specs; keep their names, force lr/decay mult to 0."""
    for layer in net_param.layer:
        if layer.type == "BatchNorm" and len(layer.param) == 3:
            for spec in layer.param:
                spec.lr_mult = 0.0
                spec.decay_mult = 0.0


# -- the whole net -------------------------------------------------------------------------------------

def NetNeedsUpgrade(net_param) -> bool:
    return (NetNeedsV0ToV1Upgrade(net_param) or NetNeedsV1ToV2Upgrade(net_param)
            or NetNeedsDataUpgrade(net_param) or NetNeedsInputUpgrade(net_param)
            or NetNeedsBatchNormUpgrade(net_param))


def UpgradeNetAsNeeded(param, param_file: str = "<NetParameter>") -> bool:
    """Upgrade `param` in place; True when every step was fully compatible (Caffe logs and continues).
    An UpgradeError names `param_file`."""
    try:
        return _upgrade_net_as_needed(param, param_file)
    except UpgradeError as exc:
        if str(exc).startswith(f"{param_file}: "):
            raise
        raise UpgradeError(f"{param_file}: {exc}") from None


def _upgrade_net_as_needed(param, param_file: str) -> bool:
    success = True
    if NetNeedsV0ToV1Upgrade(param):
        log.info("Attempting to upgrade input file specified using deprecated V0LayerParameter: %s", param_file)
        original = caffe_pb2.NetParameter()
        original.CopyFrom(param)
        if not UpgradeV0Net(original, param):
            success = False
            log.error("Warning: had one or more problems upgrading V0NetParameter to NetParameter "
                      "(see above); continuing anyway.")
        else:
            log.info("Successfully upgraded file specified using deprecated V0LayerParameter")
    if NetNeedsDataUpgrade(param):
        log.info("Attempting to upgrade input file specified using deprecated transformation parameters: %s",
                 param_file)
        UpgradeNetDataTransformation(param)
        log.info("Successfully upgraded file specified using deprecated data transformation parameters.")
    if NetNeedsV1ToV2Upgrade(param):
        log.info("Attempting to upgrade input file specified using deprecated V1LayerParameter: %s", param_file)
        original = caffe_pb2.NetParameter()
        original.CopyFrom(param)
        if not UpgradeV1Net(original, param):
            success = False
            log.error("Warning: had one or more problems upgrading V1LayerParameter (see above); "
                      "continuing anyway.")
        else:
            log.info("Successfully upgraded file specified using deprecated V1LayerParameter")
    if NetNeedsInputUpgrade(param):
        log.info("Attempting to upgrade input file specified using deprecated input fields: %s", param_file)
        UpgradeNetInput(param)
        log.info("Successfully upgraded file specified using deprecated input fields.")
    if NetNeedsBatchNormUpgrade(param):
        log.info("Attempting to upgrade batch norm layers using deprecated params: %s", param_file)
        UpgradeNetBatchNorm(param)
        log.info("Successfully upgraded batch norm layers using deprecated params.")
    return success


def ReadNetParamsFromTextFileOrDie(param_file, param=None):
    """Parse and upgrade a net prototxt; returns the NetParameter. Errors name the file (and line/column)."""
    param = caffe_pb2.NetParameter() if param is None else param
    read_text(param_file, param)
    UpgradeNetAsNeeded(param, os.fspath(param_file))
    return param


def ReadNetParamsFromBinaryFileOrDie(param_file, param=None):
    """Parse and upgrade a binary NetParameter (a caffemodel)."""
    param = caffe_pb2.NetParameter() if param is None else param
    read_binary(param_file, param)
    UpgradeNetAsNeeded(param, os.fspath(param_file))
    return param


# -- solvers -------------------------------------------------------------------------------------------

_SOLVER_TYPES = {0: "SGD", 1: "Nesterov", 2: "AdaGrad", 3: "RMSProp", 4: "AdaDelta", 5: "Adam"}


def SolverNeedsTypeUpgrade(solver_param) -> bool:
    return solver_param.HasField("solver_type")


def UpgradeSolverType(solver_param) -> bool:
    if solver_param.HasField("solver_type") and solver_param.HasField("type"):
        raise UpgradeError("Failed to upgrade solver: old solver_type field (enum) and new type field "
                           "(string) cannot be both specified in solver proto text.")
    if not solver_param.HasField("solver_type"):
        log.error("Warning: solver type already up to date. ")
        return False
    try:
        solver_param.type = _SOLVER_TYPES[solver_param.solver_type]
    except KeyError:
        raise UpgradeError(f"Unknown SolverParameter solver_type: {solver_param.solver_type}") from None
    solver_param.ClearField("solver_type")
    return True


def UpgradeSolverAsNeeded(param_file, param) -> bool:
    success = True
    if SolverNeedsTypeUpgrade(param):
        log.info("Attempting to upgrade input file specified using deprecated 'solver_type' field (enum)': %s",
                 param_file)
        if not UpgradeSolverType(param):
            success = False
            log.error("Warning: had one or more problems upgrading SolverType (see above).")
        else:
            log.info("Successfully upgraded file specified using deprecated 'solver_type' field (enum) to "
                     "'type' field (string).")
    return success


def UpgradeSnapshotPrefixProperty(param_file, param) -> None:
    """An unset snapshot_prefix becomes the solver file without extension; a directory gets its stem."""
    param_file = os.fspath(param_file)
    if not param.HasField("snapshot_prefix"):
        param.snapshot_prefix = os.path.splitext(param_file)[0]
        log.info("snapshot_prefix was not specified and is set to %s", param.snapshot_prefix)
    elif os.path.isdir(param.snapshot_prefix):
        stem = os.path.splitext(os.path.basename(param_file))[0]
        param.snapshot_prefix = os.path.join(param.snapshot_prefix, stem)
        log.info("snapshot_prefix was a directory and is replaced to %s", param.snapshot_prefix)


def ReadSolverParamsFromTextFileOrDie(param_file, param=None):
    param = caffe_pb2.SolverParameter() if param is None else param
    read_text(param_file, param)
    UpgradeSolverAsNeeded(os.fspath(param_file), param)
    UpgradeSnapshotPrefixProperty(param_file, param)
    return param


__all__ = [
    "UpgradeError", "ProtoFileError", "NetNeedsUpgrade", "UpgradeNetAsNeeded", "NetNeedsV0ToV1Upgrade",
    "UpgradeV0Net", "UpgradeV0PaddingLayers", "UpgradeV0LayerParameter", "UpgradeV0LayerType",
    "NetNeedsDataUpgrade", "UpgradeNetDataTransformation", "NetNeedsV1ToV2Upgrade", "UpgradeV1Net",
    "UpgradeV1LayerParameter", "UpgradeV1LayerType", "NetNeedsInputUpgrade", "UpgradeNetInput",
    "NetNeedsBatchNormUpgrade", "UpgradeNetBatchNorm", "ReadNetParamsFromTextFileOrDie",
    "ReadNetParamsFromBinaryFileOrDie", "SolverNeedsTypeUpgrade", "UpgradeSolverType", "UpgradeSolverAsNeeded",
    "UpgradeSnapshotPrefixProperty", "ReadSolverParamsFromTextFileOrDie",
]

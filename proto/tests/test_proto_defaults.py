"""Caffe's documented defaults (what an unset field reads as)."""

import struct

import pytest
from google.protobuf.descriptor import FieldDescriptor

from caffe.proto import caffe_pb2 as pb


def f32(x):
    """x rounded to float32, as a Python float (how float fields read back)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


DEFAULTS = [
    # (message, field, expected)
    (pb.BlobProto, "num", 0),
    (pb.Datum, "encoded", False),
    (pb.FillerParameter, "type", "constant"),
    (pb.FillerParameter, "value", 0.0),
    (pb.FillerParameter, "min", 0.0),
    (pb.FillerParameter, "max", 1.0),
    (pb.FillerParameter, "mean", 0.0),
    (pb.FillerParameter, "std", 1.0),
    (pb.FillerParameter, "sparse", -1),
    (pb.FillerParameter, "variance_norm", pb.FillerParameter.FAN_IN),
    (pb.NetParameter, "force_backward", False),
    (pb.NetParameter, "debug_info", False),
    (pb.SolverParameter, "snapshot_format", pb.SolverParameter.BINARYPROTO),
    (pb.SolverParameter, "solver_mode", pb.SolverParameter.GPU),
    (pb.SolverParameter, "solver_type", pb.SolverParameter.SGD),
    (pb.SolverParameter, "type", "SGD"),
    (pb.SolverParameter, "momentum2", 0.999),
    (pb.SolverParameter, "delta", 1e-8),
    (pb.SolverParameter, "rms_decay", 0.99),
    (pb.SolverParameter, "regularization_type", "L2"),
    (pb.SolverParameter, "clip_gradients", -1.0),
    (pb.SolverParameter, "iter_size", 1),
    (pb.SolverParameter, "average_loss", 1),
    (pb.SolverParameter, "test_interval", 0),
    (pb.SolverParameter, "test_initialization", True),
    (pb.SolverParameter, "snapshot", 0),
    (pb.SolverParameter, "snapshot_after_train", True),
    (pb.SolverParameter, "random_seed", -1),
    (pb.SolverParameter, "device_id", 0),
    (pb.SolverParameter, "layer_wise_reduce", True),
    (pb.SolverState, "current_step", 0),
    (pb.NetState, "phase", pb.TEST),
    (pb.NetState, "level", 0),
    (pb.ParamSpec, "lr_mult", 1.0),
    (pb.ParamSpec, "decay_mult", 1.0),
    (pb.ParamSpec, "share_mode", pb.ParamSpec.STRICT),
    (pb.TransformationParameter, "scale", 1.0),
    (pb.TransformationParameter, "mirror", False),
    (pb.TransformationParameter, "crop_size", 0),
    (pb.LossParameter, "normalization", pb.LossParameter.VALID),
    (pb.AccuracyParameter, "top_k", 1),
    (pb.AccuracyParameter, "axis", 1),
    (pb.ArgMaxParameter, "top_k", 1),
    (pb.ArgMaxParameter, "out_max_val", False),
    (pb.ConcatParameter, "axis", 1),
    (pb.ConcatParameter, "concat_dim", 1),
    (pb.BatchNormParameter, "moving_average_fraction", 0.999),
    (pb.BatchNormParameter, "eps", 1e-5),
    (pb.BiasParameter, "axis", 1),
    (pb.BiasParameter, "num_axes", 1),
    (pb.ContrastiveLossParameter, "margin", 1.0),
    (pb.ContrastiveLossParameter, "legacy_version", False),
    (pb.ConvolutionParameter, "bias_term", True),
    (pb.ConvolutionParameter, "group", 1),
    (pb.ConvolutionParameter, "pad_h", 0),
    (pb.ConvolutionParameter, "axis", 1),
    (pb.ConvolutionParameter, "force_nd_im2col", False),
    (pb.ConvolutionParameter, "engine", pb.ConvolutionParameter.DEFAULT),
    (pb.CropParameter, "axis", 2),
    (pb.DataParameter, "backend", pb.DataParameter.LEVELDB),
    (pb.DataParameter, "prefetch", 4),
    (pb.DataParameter, "rand_skip", 0),
    (pb.DataParameter, "scale", 1.0),
    (pb.DropoutParameter, "dropout_ratio", 0.5),
    (pb.EltwiseParameter, "operation", pb.EltwiseParameter.SUM),
    (pb.EltwiseParameter, "stable_prod_grad", True),
    (pb.ELUParameter, "alpha", 1.0),
    (pb.EmbedParameter, "bias_term", True),
    (pb.ExpParameter, "base", -1.0),
    (pb.ExpParameter, "scale", 1.0),
    (pb.ExpParameter, "shift", 0.0),
    (pb.FlattenParameter, "axis", 1),
    (pb.FlattenParameter, "end_axis", -1),
    (pb.HDF5DataParameter, "shuffle", False),
    (pb.HingeLossParameter, "norm", pb.HingeLossParameter.L1),
    (pb.ImageDataParameter, "batch_size", 1),
    (pb.ImageDataParameter, "is_color", True),
    (pb.ImageDataParameter, "root_folder", ""),
    (pb.InfogainLossParameter, "axis", 1),
    (pb.InnerProductParameter, "axis", 1),
    (pb.InnerProductParameter, "bias_term", True),
    (pb.InnerProductParameter, "transpose", False),
    (pb.LogParameter, "base", -1.0),
    (pb.LogParameter, "scale", 1.0),
    (pb.LogParameter, "shift", 0.0),
    (pb.LRNParameter, "local_size", 5),
    (pb.LRNParameter, "alpha", 1.0),
    (pb.LRNParameter, "beta", 0.75),
    (pb.LRNParameter, "k", 1.0),
    (pb.LRNParameter, "norm_region", pb.LRNParameter.ACROSS_CHANNELS),
    (pb.MVNParameter, "normalize_variance", True),
    (pb.MVNParameter, "across_channels", False),
    (pb.MVNParameter, "eps", 1e-9),
    (pb.PoolingParameter, "pool", pb.PoolingParameter.MAX),
    (pb.PoolingParameter, "stride", 1),
    (pb.PoolingParameter, "pad", 0),
    (pb.PoolingParameter, "global_pooling", False),
    (pb.PoolingParameter, "round_mode", pb.PoolingParameter.CEIL),
    (pb.PowerParameter, "power", 1.0),
    (pb.PowerParameter, "scale", 1.0),
    (pb.PowerParameter, "shift", 0.0),
    (pb.PReLUParameter, "channel_shared", False),
    (pb.PythonParameter, "param_str", ""),
    (pb.PythonParameter, "share_in_parallel", False),
    (pb.RecurrentParameter, "num_output", 0),
    (pb.RecurrentParameter, "debug_info", False),
    (pb.RecurrentParameter, "expose_hidden", False),
    (pb.ReductionParameter, "operation", pb.ReductionParameter.SUM),
    (pb.ReductionParameter, "axis", 0),
    (pb.ReductionParameter, "coeff", 1.0),
    (pb.ReLUParameter, "negative_slope", 0.0),
    (pb.ReshapeParameter, "axis", 0),
    (pb.ReshapeParameter, "num_axes", -1),
    (pb.ScaleParameter, "axis", 1),
    (pb.ScaleParameter, "num_axes", 1),
    (pb.ScaleParameter, "bias_term", False),
    (pb.SliceParameter, "axis", 1),
    (pb.SliceParameter, "slice_dim", 1),
    (pb.SoftmaxParameter, "axis", 1),
    (pb.SoftmaxParameter, "engine", pb.SoftmaxParameter.DEFAULT),
    (pb.SPPParameter, "pyramid_height", 0),
    (pb.SPPParameter, "pool", pb.SPPParameter.MAX),
    (pb.SwishParameter, "beta", 1.0),
    (pb.TileParameter, "axis", 1),
    (pb.ThresholdParameter, "threshold", 0.0),
    (pb.WindowDataParameter, "fg_threshold", 0.5),
    (pb.WindowDataParameter, "bg_threshold", 0.5),
    (pb.WindowDataParameter, "fg_fraction", 0.25),
    (pb.WindowDataParameter, "crop_mode", "warp"),
    (pb.V0LayerParameter, "biasterm", True),
    (pb.V0LayerParameter, "det_crop_mode", "warp"),
    (pb.V0LayerParameter, "concat_dim", 1),
]


@pytest.mark.parametrize(
    "cls, name, expected", DEFAULTS, ids=[f"{c.__name__}.{n}" for c, n, _ in DEFAULTS])
def test_default(cls, name, expected):
    msg = cls()
    assert not msg.HasField(name)
    value = getattr(msg, name)
    field = cls.DESCRIPTOR.fields_by_name[name]
    if field.type == FieldDescriptor.TYPE_FLOAT:
        assert value == f32(expected)
    else:
        assert value == expected
        assert type(value) is type(expected)


def test_net_state_rule_has_no_defaults():
    rule = pb.NetStateRule()
    for name in ("phase", "min_level", "max_level"):
        assert not rule.HasField(name)
    assert rule.phase == pb.TRAIN  # unset enum reads as its first value
    assert list(rule.stage) == [] and list(rule.not_stage) == []


def test_clip_min_max_are_required():
    fields = pb.ClipParameter.DESCRIPTOR.fields_by_name
    assert fields["min"].is_required and fields["max"].is_required
    layer = pb.LayerParameter(type="Clip")
    layer.clip_param.min = 0.0
    assert not layer.IsInitialized()
    layer.clip_param.max = 6.0
    assert layer.IsInitialized()


def test_unset_optional_messages_and_fields():
    solver = pb.SolverParameter()
    assert not solver.HasField("net_param") and not solver.HasField("base_lr")
    assert list(solver.weights) == [] and list(solver.stepvalue) == []
    assert not pb.BatchNormParameter().HasField("use_global_stats")
    assert not pb.LossParameter().HasField("ignore_label")
    assert not pb.LossParameter().HasField("normalize")

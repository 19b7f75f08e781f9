"""The schema's shape: Caffe's field numbers, labels and packed options."""

from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from caffe.proto import caffe_pb2 as pb

SRC = Path(__file__).resolve().parents[1] / "src"

LAYER_PARAM_NUMBERS = {
    "transform_param": 100, "loss_param": 101, "accuracy_param": 102, "argmax_param": 103,
    "batch_norm_param": 139, "bias_param": 141, "clip_param": 148, "concat_param": 104,
    "contrastive_loss_param": 105, "convolution_param": 106, "crop_param": 144,
    "data_param": 107, "dropout_param": 108, "dummy_data_param": 109, "eltwise_param": 110,
    "elu_param": 140, "embed_param": 137, "exp_param": 111, "flatten_param": 135,
    "hdf5_data_param": 112, "hdf5_output_param": 113, "hinge_loss_param": 114,
    "image_data_param": 115, "infogain_loss_param": 116, "inner_product_param": 117,
    "input_param": 143, "log_param": 134, "lrn_param": 118, "memory_data_param": 119,
    "mvn_param": 120, "parameter_param": 145, "pooling_param": 121, "power_param": 122,
    "prelu_param": 131, "python_param": 130, "recurrent_param": 146, "reduction_param": 136,
    "relu_param": 123, "reshape_param": 133, "scale_param": 142, "sigmoid_param": 124,
    "softmax_param": 125, "spp_param": 132, "slice_param": 126, "swish_param": 147,
    "tanh_param": 127, "threshold_param": 128, "tile_param": 138, "window_data_param": 129,
}

LAYER_COMMON_NUMBERS = {
    "name": 1, "type": 2, "bottom": 3, "top": 4, "loss_weight": 5, "param": 6, "blobs": 7,
    "include": 8, "exclude": 9, "phase": 10, "propagate_down": 11,
}

SOLVER_NUMBERS = {
    "train_net": 1, "test_net": 2, "test_iter": 3, "test_interval": 4, "base_lr": 5,
    "display": 6, "max_iter": 7, "lr_policy": 8, "gamma": 9, "power": 10, "momentum": 11,
    "weight_decay": 12, "stepsize": 13, "snapshot": 14, "snapshot_prefix": 15,
    "snapshot_diff": 16, "solver_mode": 17, "device_id": 18, "test_compute_loss": 19,
    "random_seed": 20, "train_net_param": 21, "test_net_param": 22, "debug_info": 23,
    "net": 24, "net_param": 25, "train_state": 26, "test_state": 27,
    "snapshot_after_train": 28, "regularization_type": 29, "solver_type": 30, "delta": 31,
    "test_initialization": 32, "average_loss": 33, "stepvalue": 34, "clip_gradients": 35,
    "iter_size": 36, "snapshot_format": 37, "rms_decay": 38, "momentum2": 39, "type": 40,
    "layer_wise_reduce": 41, "weights": 42,
}

# The only fields Caffe declares [packed = true].
PACKED = {
    "caffe.BlobShape.dim", "caffe.BlobProto.data", "caffe.BlobProto.diff",
    "caffe.BlobProto.double_data", "caffe.BlobProto.double_diff",
}


def _all_messages():
    out = []

    def visit(desc):
        out.append(desc)
        for nested in desc.nested_types:
            visit(nested)

    for desc in pb.DESCRIPTOR.message_types_by_name.values():
        visit(desc)
    return out


def _numbers(desc):
    return {f.name: f.number for f in desc.fields}


def test_file_level():
    assert pb.DESCRIPTOR.package == "caffe"
    assert len(pb.DESCRIPTOR.message_types_by_name) == 63
    assert set(pb.DESCRIPTOR.enum_types_by_name) == {"Phase"}
    nested_enums = [e for d in _all_messages() for e in d.enum_types]
    assert len(nested_enums) == 25
    assert pb.TRAIN == 0 and pb.TEST == 1


def test_layer_parameter_numbers():
    numbers = _numbers(pb.LayerParameter.DESCRIPTOR)
    assert numbers == {**LAYER_COMMON_NUMBERS, **LAYER_PARAM_NUMBERS}
    for name, field in pb.LayerParameter.DESCRIPTOR.fields_by_name.items():
        if name.endswith("_param"):
            assert field.message_type is not None and not field.is_repeated, name


def test_solver_parameter_numbers():
    assert _numbers(pb.SolverParameter.DESCRIPTOR) == SOLVER_NUMBERS
    assert pb.SolverParameter.DESCRIPTOR.fields_by_name["weights"].is_repeated
    assert dict(pb.SolverParameter.SolverType.items()) == {
        "SGD": 0, "NESTEROV": 1, "ADAGRAD": 2, "RMSPROP": 3, "ADADELTA": 4, "ADAM": 5}


def test_blob_and_datum_numbers():
    assert _numbers(pb.BlobProto.DESCRIPTOR) == {
        "num": 1, "channels": 2, "height": 3, "width": 4, "data": 5, "diff": 6, "shape": 7,
        "double_data": 8, "double_diff": 9}
    assert _numbers(pb.Datum.DESCRIPTOR) == {
        "channels": 1, "height": 2, "width": 3, "data": 4, "label": 5, "float_data": 6,
        "encoded": 7}
    assert _numbers(pb.SolverState.DESCRIPTOR) == {
        "iter": 1, "learned_net": 2, "history": 3, "current_step": 4}
    assert _numbers(pb.NetParameter.DESCRIPTOR) == {
        "name": 1, "layers": 2, "input": 3, "input_dim": 4, "force_backward": 5, "state": 6,
        "debug_info": 7, "input_shape": 8, "layer": 100}


def test_packed_fields_are_exactly_caffes():
    packed = {f.full_name for d in _all_messages() for f in d.fields if f.is_packed}
    assert packed == PACKED


def test_legacy_layer_messages():
    v1 = pb.V1LayerParameter
    assert v1.LayerType.Value("CONVOLUTION") == 4
    assert v1.LayerType.Value("ABSVAL") == 35
    assert v1.LayerType.Value("DECONVOLUTION") == 39
    assert len(v1.LayerType.keys()) == 40
    numbers = _numbers(v1.DESCRIPTOR)
    assert numbers["blobs_lr"] == 7 and numbers["weight_decay"] == 8
    assert numbers["param"] == 1001 and numbers["blob_share_mode"] == 1002
    assert numbers["layer"] == 1 and numbers["loss_param"] == 42
    v0 = _numbers(pb.V0LayerParameter.DESCRIPTOR)
    assert v0["hdf5_output_param"] == 1001 and v0["k"] == 22 and v0["concat_dim"] == 65
    assert 57 not in v0.values()  # OBSOLETE_can_clobber


def test_field_types_of_note():
    f = pb.BlobShape.DESCRIPTOR.fields_by_name["dim"]
    assert f.type == FieldDescriptor.TYPE_INT64
    assert pb.BlobProto.DESCRIPTOR.fields_by_name["num"].type == FieldDescriptor.TYPE_INT32
    assert pb.SolverParameter.DESCRIPTOR.fields_by_name["random_seed"].type == \
        FieldDescriptor.TYPE_INT64
    assert pb.Datum.DESCRIPTOR.fields_by_name["data"].type == FieldDescriptor.TYPE_BYTES
    assert pb.PoolingParameter.DESCRIPTOR.fields_by_name["round_mode"].number == 13


def test_every_parameter_message_exists():
    names = set(pb.DESCRIPTOR.message_types_by_name)
    for field in pb.LayerParameter.DESCRIPTOR.fields:
        if field.name.endswith("_param"):
            assert field.message_type.name in names


@pytest.mark.skipif(not SRC.is_dir(), reason="source tree not present")
def test_no_caffe_init_in_this_distribution():
    # `caffe` is a namespace shared by several distributions.
    assert not (SRC / "caffe" / "__init__.py").exists()
    assert (SRC / "caffe" / "proto" / "__init__.py").is_file()

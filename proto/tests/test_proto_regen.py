"""The checked-in caffe_pb2.py is exactly what regen.py makes from caffe.proto."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED_IN = ROOT / "src" / "caffe" / "proto" / "caffe_pb2.py"


def _regen_module():
    spec = importlib.util.spec_from_file_location("caffe_proto_regen", ROOT / "regen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_regenerated_module_matches_checked_in(tmp_path):
    pytest.importorskip("grpc_tools.protoc", reason="grpcio-tools (protoc) is not installed")
    if not (ROOT / "caffe.proto").is_file():
        pytest.skip("caffe.proto is not present (installed without the sdist)")
    out = _regen_module().generate(tmp_path)
    assert out == tmp_path / "caffe_pb2.py"
    assert out.read_bytes() == CHECKED_IN.read_bytes(), (
        "caffe_pb2.py is stale: run `python proto/regen.py`")


def test_module_descriptor():
    from caffe.proto import caffe_pb2

    assert caffe_pb2.DESCRIPTOR.name == "caffe.proto"
    assert caffe_pb2.DESCRIPTOR.package == "caffe"
    assert "source: caffe.proto" in CHECKED_IN.read_text()

"""Reading solver prototxts as Caffe's ReadSolverParamsFromTextFileOrDie does."""
import os

import pytest

from caffe.proto import caffe_pb2
from caffe.solver import SolverError, read_solver_params, upgrade_solver_as_needed


def write(path, text):
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("enum_name, type_name", [("SGD", "SGD"), ("NESTEROV", "Nesterov"),
                                                  ("ADAGRAD", "AdaGrad"), ("RMSPROP", "RMSProp"),
                                                  ("ADADELTA", "AdaDelta"), ("ADAM", "Adam")])
def test_deprecated_solver_type_is_upgraded(tmp_path, enum_name, type_name):
    p = read_solver_params(write(tmp_path / "s.prototxt", f'net: "n.prototxt" solver_type: {enum_name}'))
    assert p.type == type_name
    assert not p.HasField("solver_type")


def test_both_solver_type_and_type_is_an_error(tmp_path):
    path = write(tmp_path / "s.prototxt", 'solver_type: ADAM type: "Adam"')
    with pytest.raises(SolverError, match="solver_type field .enum. and new type field .string. cannot be both"):
        read_solver_params(path)


def test_upgrade_of_a_message():
    p = caffe_pb2.SolverParameter(solver_type=caffe_pb2.SolverParameter.NESTEROV)
    assert upgrade_solver_as_needed(p)
    assert p.type == "Nesterov"
    assert not upgrade_solver_as_needed(p)


def test_snapshot_prefix_defaults_to_the_solver_file_name(tmp_path):
    p = read_solver_params(write(tmp_path / "lenet_solver.prototxt", 'net: "x"'))
    assert p.snapshot_prefix == str(tmp_path / "lenet_solver")


def test_snapshot_prefix_directory_gets_the_file_stem(tmp_path):
    d = tmp_path / "snaps"
    d.mkdir()
    p = read_solver_params(write(tmp_path / "my.solver.prototxt", f'net: "x" snapshot_prefix: "{d}"'))
    assert p.snapshot_prefix == os.path.join(str(d), "my.solver")


def test_snapshot_prefix_given_is_kept(tmp_path):
    p = read_solver_params(write(tmp_path / "s.prototxt", 'net: "x" snapshot_prefix: "out/lenet"'))
    assert p.snapshot_prefix == "out/lenet"


def test_missing_solver_file_is_named(tmp_path):
    with pytest.raises(SolverError, match="solver file .*nope.prototxt.* not found"):
        read_solver_params(str(tmp_path / "nope.prototxt"))


def test_parse_error_names_file_and_line(tmp_path):
    path = write(tmp_path / "bad.prototxt", 'net: "x"\nbase_lrr: 0.1\n')
    with pytest.raises(SolverError, match=r"bad.prototxt.*2:1"):
        read_solver_params(path)


def test_upgrade_errors_name_the_file_or_the_message(tmp_path):
    path = write(tmp_path / "both.prototxt", 'solver_type: ADAM type: "Adam"')
    with pytest.raises(SolverError, match=rf"^{path}: failed to upgrade solver"):
        read_solver_params(path)
    with pytest.raises(SolverError, match=r"^<SolverParameter>: failed to upgrade solver"):
        upgrade_solver_as_needed(caffe_pb2.SolverParameter(solver_type=caffe_pb2.SolverParameter.ADAM, type="Adam"))


def test_an_empty_snapshot_prefix_also_defaults_to_the_solver_file_name(tmp_path):
    p = read_solver_params(write(tmp_path / "lenet_solver.prototxt", 'net: "x" snapshot_prefix: ""'))
    assert p.snapshot_prefix == str(tmp_path / "lenet_solver")


def test_registry_refuses_a_second_class_for_a_type_and_creates_registered_ones():
    from caffe.solver import registry
    from caffe.solver.sgd_solver import SGDSolver
    assert registry.register_solver("SGD")(SGDSolver) is SGDSolver  # the same class again: fine

    class Other(SGDSolver):
        pass
    with pytest.raises(SolverError, match=r"^Solver type SGD already registered\.$"):
        registry.register_solver("SGD")(Other)
    assert registry.solver_class("SGD") is SGDSolver
    try:
        registry.register_solver("MySGD")(Other)
        assert registry.solver_class("MySGD") is Other and "MySGD" in registry.solver_type_list()
    finally:
        registry._REGISTRY.pop("MySGD", None)

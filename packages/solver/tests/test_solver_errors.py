"""Bad solver definitions fail with errors that name the field or file at fault."""
import pytest

pytest.importorskip("caffe.net", reason="caffe-net (caffe.net.Net) is not installed")

import caffe  # noqa: E402
from caffe.solver import Solver, SolverError, UnknownSolverTypeError, get_solver  # noqa: E402
from caffe.solver.testing import least_squares_net, net_param, solver_param  # noqa: E402

NUM, DIM = 4, 3


def needs_layers():
    missing = {"Input", "InnerProduct", "EuclideanLoss"} - set(caffe.layer_type_list())
    if missing:
        pytest.skip(f"layers not implemented yet: {sorted(missing)}")


def net_text():
    return least_squares_net(NUM, DIM)


def test_missing_net_file_is_named(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "net.prototxt").write_text(net_text())
    solver = tmp_path / "sub" / "solver.prototxt"
    solver.write_text('net: "net.prototxt" base_lr: 0.1 lr_policy: "fixed"')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SolverError, match=r"solver 'sub/solver.prototxt': net file 'net.prototxt' not found "
                                          r"\(net paths are relative to the current directory.*exists next to "
                                          r"the solver file"):
        Solver("sub/solver.prototxt")
    solver.write_text('train_net: "nowhere.prototxt" base_lr: 0.1')
    with pytest.raises(SolverError, match="train_net file 'nowhere.prototxt' not found"):
        Solver("sub/solver.prototxt")


def test_unknown_solver_type_lists_the_known_ones(tmp_path):
    p = solver_param(net_text(), type="Adamax", base_lr=0.1)
    msg = r"Unknown solver type: 'Adamax' \(known types: AdaDelta, AdaGrad, Adam, Nesterov, RMSProp, SGD\)"
    with pytest.raises(UnknownSolverTypeError, match=msg):
        Solver(p)
    f = tmp_path / "s.prototxt"
    f.write_text('net: "x.prototxt" type: "Adamax"')
    with pytest.raises(UnknownSolverTypeError, match=msg):
        get_solver(str(f))


def test_train_net_must_be_given_exactly_once():
    with pytest.raises(SolverError, match="must specify a train net using one of these fields: net, net_param"):
        Solver(solver_param(None, base_lr=0.1))
    p = solver_param(net_text(), base_lr=0.1)
    p.train_net_param.CopyFrom(net_param(net_text()))
    with pytest.raises(SolverError, match="must not contain more than one .*it has net_param, train_net_param"):
        Solver(p)


def test_test_iter_without_test_nets():
    needs_layers()
    p = solver_param(None, base_lr=0.1, test_iter=[5], test_interval=10)
    p.train_net_param.CopyFrom(net_param(net_text()))
    with pytest.raises(SolverError, match="test_iter must be specified for each test network: 1 test_iter for 0 "
                                          "test_net/test_net_param"):
        Solver(p)


def test_test_nets_without_test_iter():
    needs_layers()
    p = solver_param(None, base_lr=0.1, test_interval=10)
    p.train_net_param.CopyFrom(net_param(net_text()))
    p.test_net_param.add().CopyFrom(net_param(net_text()))
    with pytest.raises(SolverError, match="0 test_iter for 1 test_net/test_net_param"):
        Solver(p)


def test_test_nets_need_a_test_interval():
    needs_layers()
    with pytest.raises(SolverError, match="test_interval is 0; it must be > 0"):
        Solver(solver_param(net_text(), base_lr=0.1, test_iter=[2]))


def test_test_state_count_must_match():
    needs_layers()
    p = solver_param(net_text(), base_lr=0.1, test_iter=[2], test_interval=5)
    p.test_state.add()
    p.test_state.add()
    with pytest.raises(SolverError, match="test_state must be unspecified or specified once per test net"):
        Solver(p)


@pytest.mark.parametrize("solver_type, fields, match", [
    ("AdaGrad", dict(momentum=0.9), "Momentum cannot be used with AdaGrad"),
    ("RMSProp", dict(momentum=0.9), "Momentum cannot be used with RMSProp"),
    ("RMSProp", dict(rms_decay=1.0), "rms_decay should lie between 0 and 1"),
    ("SGD", dict(average_loss=0), "average_loss should be >= 1"),
    ("SGD", dict(iter_size=0), "iter_size should be >= 1"),
])
def test_bad_hyperparameters(solver_type, fields, match):
    with pytest.raises(SolverError, match=match):
        Solver(solver_param(net_text(), type=solver_type, base_lr=0.1, **fields))


def test_bad_regularization_type_is_named_on_the_first_update():
    needs_layers()
    s = Solver(solver_param(net_text(), base_lr=0.1, lr_policy="fixed", weight_decay=0.1,
                            regularization_type="L3"))
    with pytest.raises(SolverError, match="Unknown regularization type: 'L3'"):
        s.step(1)


def test_snapshot_needs_a_writable_prefix(tmp_path):
    with pytest.raises(SolverError, match="snapshot is specified but snapshot_prefix is not"):
        Solver(solver_param(net_text(), base_lr=0.1, snapshot=10))
    with pytest.raises(SolverError, match="Cannot write to snapshot prefix '.*no/such/dir/x'"):
        Solver(solver_param(net_text(), base_lr=0.1, snapshot=10, snapshot_prefix=str(tmp_path / "no/such/dir/x")))


def test_missing_weights_file_is_named(tmp_path):
    needs_layers()
    with pytest.raises(SolverError, match="weights file 'absent.caffemodel' not found"):
        Solver(solver_param(net_text(), base_lr=0.1, weights=["absent.caffemodel"]))


def test_not_a_solver_parameter():
    with pytest.raises(TypeError, match="SolverParameter or the path"):
        Solver(42)


@pytest.mark.parametrize("field", ["net", "train_net", "test_net"])
def test_every_net_file_field_gets_the_next_to_the_solver_hint(tmp_path, monkeypatch, field):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "n.prototxt").write_text(net_text())
    (tmp_path / "here.prototxt").write_text(net_text())
    text = {"net": 'net: "n.prototxt" test_iter: 1 test_interval: 1',
            "train_net": 'train_net: "n.prototxt"',
            "test_net": 'train_net: "here.prototxt" test_net: "n.prototxt" test_iter: 1 test_interval: 1'}[field]
    (tmp_path / "sub" / "solver.prototxt").write_text(text + ' base_lr: 0.1 lr_policy: "fixed"')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SolverError, match=rf"{field} file 'n.prototxt' not found .*exists next to the solver file"):
        Solver("sub/solver.prototxt")


def test_test_net_counts_message_says_when_there_is_no_generic_net():
    needs_layers()
    p = solver_param(None, base_lr=0.1, test_iter=[1, 1], test_interval=1)
    p.train_net_param.CopyFrom(net_param(net_text()))
    p.test_net_param.add().CopyFrom(net_param(net_text()))
    with pytest.raises(SolverError, match=r"2 test_iter for 1 test_net/test_net_param \(with no generic "
                                          r"net/net_param, the counts must be equal\)"):
        Solver(p)
    p = solver_param(net_text(), base_lr=0.1, test_iter=[1], test_interval=1)
    p.test_net_param.add().CopyFrom(net_param(net_text()))
    p.test_net_param.add().CopyFrom(net_param(net_text()))
    with pytest.raises(SolverError, match=r"1 test_iter for 2 test_net/test_net_param$"):
        Solver(p)


def test_test_net_files_and_the_generic_net_fill_test_iter_exactly(tmp_path, monkeypatch):
    needs_layers()
    (tmp_path / "t.prototxt").write_text(least_squares_net(NUM, DIM, name="file"))
    p = solver_param(net_text(), base_lr=0.1, lr_policy="fixed", test_net=["t.prototxt"], test_iter=[1, 1, 1],
                     test_interval=1)
    monkeypatch.chdir(tmp_path)
    s = Solver(p)
    assert [n.name for n in s.test_nets] == ["file", "least_squares", "least_squares"]


def test_old_format_net_files_are_upgraded(tmp_path):
    # the solver reads net files through caffe.net's reader, which upgrades Caffe's V1 `layers` format
    needs_layers()
    (tmp_path / "v1.prototxt").write_text(
        'name: "v1"\ninput: "data"\ninput_shape { dim: 4 dim: 3 }\n'
        'layers { name: "ip" type: INNER_PRODUCT bottom: "data" top: "ip" '
        'inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.1 } } }\n')
    (tmp_path / "s.prototxt").write_text(f'net: "{tmp_path / "v1.prototxt"}" base_lr: 0.1 lr_policy: "fixed"')
    s = Solver(str(tmp_path / "s.prototxt"))
    assert s.net.name == "v1" and s.net.params["ip"][0].data.shape == (2, 3)


def test_create_solver_builds_the_type_the_message_names():
    needs_layers()
    from caffe.solver.registry import create_solver
    s = create_solver(solver_param(net_text(), type="Nesterov", base_lr=0.1, lr_policy="fixed", momentum=0.9))
    assert type(s).__name__ == "NesterovSolver"

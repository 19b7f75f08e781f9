"""Start-up checks, in one process: definition hashes, Python layers, how a database splits over ranks."""
import argparse
import logging

import pytest

pytest.importorskip("caffe.solver", reason="caffe-solver is not installed")

import caffe.solver  # noqa: E402
from caffe.parallel import ParallelError, checks, selftest  # noqa: E402


def args(**kw):
    base = dict(type="SGD", momentum=0.9, weight_decay=0.01, iters=2, snapshot=0, whole_reduce=False,
                python_layer="none")
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("db") / "train_lmdb")
    selftest.write_db(path, 10)
    return path


def solver(tmp_path, db, tag="a", batch=2, hidden=selftest.HIDDEN, **kw):
    selftest.collect_dropped_databases()  # see there: works around a deadlock in caffe.layers.db
    return caffe.solver.get_solver(selftest.write_solver(str(tmp_path), tag, db, batch, args(**kw), hidden=hidden))


class Gathered:
    """A communicator stand-in whose allgather returns what the other ranks would send."""

    def __init__(self, others):
        self.others = others
        self.host = "here"

    def allgather_object(self, obj):
        return [obj] + self.others


def test_definition_hash(tmp_path, db):
    a = solver(tmp_path, db, "a")
    same = solver(tmp_path, db, "b")  # other file names, same content
    assert checks.definition_hash(a) == checks.definition_hash(same)
    same.param.device_id = 3  # each rank has its own GPU
    assert checks.definition_hash(a) == checks.definition_hash(same)
    assert checks.definition_hash(a) != checks.definition_hash(solver(tmp_path, db, "c", hidden=7))
    assert checks.definition_hash(a) != checks.definition_hash(solver(tmp_path, db, "d", momentum=0.5))
    assert checks.definition_hash(a) != checks.definition_hash(solver(tmp_path, db, "e", batch=3))


def test_ranks_with_other_definitions_are_named(tmp_path, db):
    a = solver(tmp_path, db, "a")
    h = checks.definition_hash(a)
    checks.check_same_definition(Gathered([(h, "here", "s1"), (h, "there", "s2")]), a, "s0")
    with pytest.raises(ParallelError) as info:
        checks.check_same_definition(Gathered([(h, "m1", "s1"), ("f00", "m2", "/x/solver.prototxt"), (h, "m3", "s3")]),
                                     a, "s0")
    msg = str(info.value)
    assert "ranks [2] disagree with ranks [0, 1, 3]" in msg
    assert "rank 2 on m2: /x/solver.prototxt" in msg


def test_python_layers(tmp_path, db, caplog):
    plain = solver(tmp_path, db, "p", python_layer="plain")
    assert checks.check_python_layers(plain.net, 1) == []
    with caplog.at_level(logging.WARNING, logger="caffe.parallel"):
        w = checks.check_python_layers(plain.net, 4)
    assert len(w) == 1 and "runs in each of the 4 rank processes" in w[0] and "GIL" in w[0]
    assert "shard by caffe.solver_rank()" in caplog.text
    shared = solver(tmp_path, db, "s", python_layer="shared")
    with pytest.raises(ParallelError, match=r"Python layer .py. .* sets python_param.share_in_parallel: true.*cannot share one layer"):
        checks.check_python_layers(shared.net, 2)
    checks.check_python_layers(shared.net, 1)  # one rank: nothing to share


@pytest.mark.parametrize("count, batch, expect", [
    (2, 2, None),                       # 10 records, 2 ranks x 2: fine
    (3, 2, None),                       # 10 records over 3 ranks: uneven, but the ranks interleave: only logged
    (3, 4, "combined batch of 3 x 4 = 12 exceeds the 10 records"),
    (12, 1, "12 ranks for 10 records: 2 ranks have no record of their own"),
])
def test_database_split_over_ranks(tmp_path, db, caplog, count, batch, expect):
    s = solver(tmp_path, db, f"b{batch}", batch=batch)
    with caplog.at_level(logging.INFO, logger="caffe.parallel"):
        warnings = checks.check_data_sharding(s.net, count)
    if expect is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and expect in warnings[0] and "Data layer 'data'" in warnings[0]
    if (count, batch) == (3, 2):
        assert "do not divide by 3 ranks" in caplog.text
    assert checks.check_data_sharding(s.net, 1) == []

"""The tools that need caffe-net: extract_features and the proto upgraders."""
import os

import numpy as np
import pytest
from google.protobuf import text_format

from caffe.cli.main import main
from caffe.layers import db
from caffe.layers.data_transformer import array_to_datum
from caffe.proto import caffe_pb2

V1_NET = """name: "old"
layers { name: "data" type: DATA top: "data" top: "label"
         data_param { source: "db" batch_size: 2 scale: 0.5 } }
layers { name: "ip" type: INNER_PRODUCT bottom: "data" top: "ip" blobs_lr: 1 blobs_lr: 2
         inner_product_param { num_output: 3 } }
"""


def test_malformed_input_is_named_with_its_line(tmp_path, capsys):
    bad = tmp_path / "bad.prototxt"
    bad.write_text('name: "x"\nlayer { nmae: "y" }\n')
    assert main(["upgrade_net_proto_text", str(bad), str(tmp_path / "out.prototxt")]) == 1
    err = capsys.readouterr().err
    assert "failed to parse input text file as NetParameter" in err and "bad.prototxt" in err and "2:" in err
    assert main(["upgrade_net_proto_text", str(bad)]) == 1
    assert "Usage: upgrade_net_proto_text" in capsys.readouterr().err
    assert not (tmp_path / "out.prototxt").exists()


def test_upgrade_net_proto_text_and_binary(tmp_path, capsys):
    pytest.importorskip("caffe.net.upgrade", reason="the upgraders need caffe-net")
    src = tmp_path / "v1.prototxt"
    src.write_text(V1_NET)
    out = tmp_path / "new.prototxt"
    assert main(["upgrade_net_proto_text", str(src), str(out)]) == 0
    net = text_format.Parse(out.read_text(), caffe_pb2.NetParameter())
    assert not len(net.layers) and [l.type for l in net.layer] == ["Data", "InnerProduct"]
    assert net.layer[0].transform_param.scale == 0.5 and [p.lr_mult for p in net.layer[1].param] == [1, 2]
    assert main(["upgrade_net_proto_text", str(out), str(tmp_path / "again.prototxt")]) == 0
    assert "File already in latest proto format" in capsys.readouterr().err
    assert text_format.Parse((tmp_path / "again.prototxt").read_text(), caffe_pb2.NetParameter()) == net
    binary = tmp_path / "v1.caffemodel"
    binary.write_bytes(text_format.Parse(V1_NET, caffe_pb2.NetParameter()).SerializeToString())
    assert main(["upgrade_net_proto_binary", str(binary), str(tmp_path / "new.caffemodel")]) == 0
    assert caffe_pb2.NetParameter.FromString((tmp_path / "new.caffemodel").read_bytes()) == net


def test_upgrade_solver_proto_text(tmp_path):
    pytest.importorskip("caffe.net.upgrade", reason="the upgraders need caffe-net")
    src = tmp_path / "solver.prototxt"
    src.write_text('net: "n.prototxt"\nbase_lr: 0.1\nsolver_type: ADAM\n')
    out = tmp_path / "solver_new.prototxt"
    assert main(["upgrade_solver_proto_text", str(src), str(out)]) == 0
    solver = text_format.Parse(out.read_text(), caffe_pb2.SolverParameter())
    assert solver.type == "Adam" and not solver.HasField("solver_type") and solver.base_lr == pytest.approx(0.1)


def test_extract_features_round_trip(tmp_path, capsys):
    pytest.importorskip("caffe.net", reason="extract_features needs caffe-net")
    imgs = np.random.default_rng(0).integers(0, 256, size=(6, 2, 3, 3)).astype(np.uint8)
    src = str(tmp_path / "in_db")
    db.write_db(src, ((f"{i:08d}", array_to_datum(im, i).SerializeToString()) for i, im in enumerate(imgs)))
    proto = tmp_path / "feat.prototxt"
    proto.write_text(f'''name: "feat"
layer {{ name: "data" type: "Data" top: "data" top: "label"
        data_param {{ source: "{src}" batch_size: 4 backend: LMDB }} transform_param {{ scale: 0.5 }} }}''')
    weights = tmp_path / "empty.caffemodel"
    trained = caffe_pb2.NetParameter(name="feat")
    trained.layer.add(name="data", type="Data")  # a caffemodel of a net whose only layer has no weights
    weights.write_bytes(trained.SerializeToString())
    f1, f2 = tmp_path / "data_feats", tmp_path / "label_feats"
    assert main(["extract_features", str(weights), str(proto), "data,label", f"{f1},{f2}", "2", "lmdb"]) == 0
    assert "Successfully extracted the features!" in capsys.readouterr().err
    with db.open_db(str(f1)) as d:
        recs = [(k, caffe_pb2.Datum.FromString(v)) for k, v in d.items()]
    assert [k for k, _ in recs] == [b"%010d" % i for i in range(8)]  # 2 batches of 4 (wrapping at 6)
    for i, (_, dat) in enumerate(recs):
        assert (dat.channels, dat.height, dat.width) == (2, 3, 3)
        np.testing.assert_array_equal(np.asarray(dat.float_data, np.float32),
                                      imgs[i % 6].ravel().astype(np.float32) * 0.5)
    with db.open_db(str(f2)) as d:
        assert [caffe_pb2.Datum.FromString(v).float_data[0] for _, v in d.items()] == [0, 1, 2, 3, 4, 5, 0, 1]
    assert main(["extract_features", str(weights), str(proto), "nope", str(tmp_path / "x"), "1", "lmdb"]) == 1
    assert "Unknown feature blob name nope in the network" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "x")
    assert main(["extract_features", str(weights), str(proto), "data,label", str(tmp_path / "y"), "1",
                 "lmdb"]) == 1
    assert "must be equal" in capsys.readouterr().err

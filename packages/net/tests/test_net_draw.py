"""caffe.draw (pycaffe's net drawing on pydot): labels (line breaks, not a literal backslash-n), colors,
edge labels, lr multipliers, phase filtering, DOT text for every example net, and images when graphviz's
`dot` program is installed (skipped with the reason otherwise)."""
import pathlib
import shutil

import pytest
from google.protobuf import text_format

pydot = pytest.importorskip("pydot", reason="pydot (caffe-net's 'draw' extra) is not installed")

import caffe  # noqa: E402
import caffe.draw as draw  # noqa: E402
from caffe.proto import caffe_pb2  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pydot's parser on newer pyparsing

ROOT = pathlib.Path(__file__).resolve().parents[3]
SHARED = ROOT.parent / "shared" / "caffe-models"


def net_from(text):
    return text_format.Parse(text, caffe_pb2.NetParameter())


def layer(text):
    return text_format.Parse(text, caffe_pb2.LayerParameter())


CONV = layer('name: "conv1" type: "Convolution" bottom: "data" top: "conv1" param { lr_mult: 1 } param { lr_mult: 2 } '
             'convolution_param { num_output: 20 kernel_size: 5 stride: 2 pad: 1 }')


def test_labels():
    assert draw.get_layer_label(CONV, "LR") == r'"conv1\n(Convolution)\nkernel size: 5\nstride: 2\npad: 1"'
    assert draw.get_layer_label(CONV, "TB", display_lrm=True) == \
        '"conv1 (Convolution) kernel size: 5 stride: 2 pad: 1 lr mult: 1.0, 2.0"'
    pool = layer('name: "p" type: "Pooling" pooling_param { pool: AVE kernel_h: 3 kernel_w: 2 stride: 2 }')
    assert draw.get_layer_label(pool, "BT") == '"p (Pooling AVE) kernel size: 3x2 stride: 2 pad: 0"'
    gpool = layer('name: "g" type: "Pooling" pooling_param { global_pooling: true }')
    assert "global pooling" in draw.get_layer_label(gpool, "LR")
    assert draw.get_layer_label(layer('name: "q\\"x" type: "ReLU"'), "TB") == r'"q\"x (ReLU)"'
    assert draw.get_edge_label(CONV) == "20"
    assert draw.get_edge_label(layer('type: "Data" data_param { batch_size: 64 }')) == "Batch 64"
    assert draw.get_edge_label(layer('type: "InnerProduct" inner_product_param { num_output: 10 }')) == "10"
    assert draw.get_edge_label(layer('type: "ReLU"')) == '""'
    assert draw.get_pooling_types_dict() == {0: "MAX", 1: "AVE", 2: "STOCHASTIC"}
    assert draw.choose_color_by_layertype("Pooling") == "#FF9900"


def test_lr_mult():
    assert draw.get_layer_lr_mult(CONV) == (1.0, 2.0)
    assert draw.get_layer_lr_mult(layer('type: "InnerProduct"')) == (1.0, 1.0)
    assert draw.get_layer_lr_mult(layer('type: "InnerProduct" param { lr_mult: 0 }')) == (0.0, 1.0)
    with pytest.raises(ValueError, match="do not have a learning rate multiplier"):
        draw.get_layer_lr_mult(layer('type: "ReLU"'))
    with pytest.raises(ValueError, match="could not parse"):
        draw.get_layer_lr_mult(layer('name: "x" type: "Convolution" param {} param {} param {}'))
    frozen = layer('name: "f" type: "InnerProduct" param { lr_mult: 0 } param { lr_mult: 0 }')
    assert "lr mult" not in draw.get_layer_label(frozen, "LR", display_lrm=True)  # shown only when nonzero


NET = '''name: "tiny"
layer { name: "d" type: "Data" top: "data" top: "label" include { phase: TRAIN } data_param { batch_size: 8 } }
layer { name: "d" type: "Data" top: "data" top: "label" include { phase: TEST } data_param { batch_size: 4 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 3 } }
layer { name: "relu" type: "ReLU" bottom: "ip" top: "ip" }
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc" include { phase: TEST } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" exclude { phase: TEST } }
layer { name: "staged" type: "Silence" bottom: "ip" include { stage: "deploy" } }
'''


def nodes_and_edges(graph):
    nodes = {n.get_name().strip('"'): n for n in graph.get_nodes()}
    edges = [(e.get_source().strip('"'), e.get_destination().strip('"'), e.get("label")) for e in graph.get_edges()]
    return nodes, edges


def test_graph_structure_and_phases():
    net = net_from(NET)
    nodes, edges = nodes_and_edges(draw.get_pydot_graph(net, "LR"))
    assert set(nodes) == {"d_Data", "ip_InnerProduct", "relu_ReLU", "acc_Accuracy", "loss_SoftmaxWithLoss",
                          "staged_Silence", "data_blob", "label_blob", "ip_blob", "acc_blob", "loss_blob"}
    assert nodes["relu_ReLU"].get("fillcolor") == "#90EE90"  # in place
    assert nodes["ip_InnerProduct"].get("fillcolor") == "#CC33FF"
    assert nodes["loss_blob"].get("shape") == "octagon"
    assert ("ip_InnerProduct", "ip_blob", "3") in edges and ("ip_blob", "relu_ReLU", '""') in edges
    assert {("d_Data", "data_blob", "Batch 8"), ("d_Data", "data_blob", "Batch 4")} <= set(edges)
    train, _ = nodes_and_edges(draw.get_pydot_graph(net, "LR", phase=caffe.TRAIN))
    test, _ = nodes_and_edges(draw.get_pydot_graph(net, "LR", phase=caffe.TEST))
    assert "loss_SoftmaxWithLoss" in train and "acc_Accuracy" not in train
    assert "acc_Accuracy" in test and "loss_SoftmaxWithLoss" not in test
    assert "staged_Silence" in train and "staged_Silence" in test  # stages are not a phase
    _, bare = nodes_and_edges(draw.get_pydot_graph(net, "LR", label_edges=False))
    assert {label for *_, label in bare} == {'""'}
    both = net_from('layer { name: "x" type: "ReLU" include { phase: TRAIN } exclude { phase: TEST } }')
    with pytest.raises(ValueError, match="layer 'x' has both include and exclude"):
        draw.get_pydot_graph(both, "LR", phase=caffe.TRAIN)


def test_dot_text_has_line_breaks_not_backslashes(tmp_path):
    net = net_from(NET.replace('type: "InnerProduct"', 'type: "Convolution"').replace(
        "inner_product_param { num_output: 3 }", "convolution_param { num_output: 3 kernel_size: 1 }"))
    out = tmp_path / "net.dot"
    draw.draw_net_to_file(net, str(out), "LR", caffe.TRAIN)
    text = out.read_text()
    assert r'label="ip\n(Convolution)\nkernel size: 1\nstride: 1\npad: 0"' in text
    assert "\\\\n" not in text  # an escaped backslash would print as a literal \n
    parsed = pydot.graph_from_dot_data(text)[0]
    assert parsed.get_name() == "tiny" and parsed.get("rankdir") == "LR"
    assert draw.draw_net(net, "TB", ext="raw") == draw.net_to_dot(net, "TB").encode()


def example_nets():
    paths = sorted((ROOT / "examples").rglob("*.prototxt"))
    if SHARED.is_dir():
        paths += sorted(SHARED.rglob("*.prototxt"))
    return [p for p in paths if "solver" not in p.name]


def test_every_example_net_draws_as_dot():
    paths = example_nets()
    assert paths
    for path in paths:
        net = text_format.Merge(path.read_text(), caffe_pb2.NetParameter())
        graph = draw.get_pydot_graph(net, "LR")
        assert graph.to_string().startswith("digraph")
        layer_nodes = {f"{l.name}_{l.type}" for l in net.layer}
        blob_nodes = {f"{b}_blob" for l in net.layer for b in list(l.bottom) + list(l.top)}
        assert {n.get_name().strip('"') for n in graph.get_nodes()} == layer_nodes | blob_nodes, path


def test_images_need_graphviz(tmp_path, monkeypatch):
    net = net_from(NET)
    if shutil.which("dot") is None:
        with pytest.raises(RuntimeError, match="graphviz's 'dot' program"):
            draw.draw_net_to_file(net, str(tmp_path / "net.png"))
        pytest.skip("graphviz's dot program is not installed: PNG/SVG rendering not exercised")
    draw.draw_net_to_file(net, str(tmp_path / "net.png"), "TB", caffe.TEST, display_lrm=True)
    assert (tmp_path / "net.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = draw.draw_net(net, "LR", ext="svg").decode()
    assert "<svg" in svg and ">ip<" in svg and "(InnerProduct)" in svg  # one text line per label part
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="graphviz's 'dot' program"):
        draw.draw_net(net, "LR", ext="png")

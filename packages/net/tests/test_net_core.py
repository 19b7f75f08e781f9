"""Net::Init wiring, backward analysis, parameter sharing, forward/backward, callbacks, debug info, memory."""
import logging

import numpy as np
import pytest
from hypothesis import given, strategies as st

import caffe
from caffe.net import Net, NetError
from caffe.net.testing import ensure_split_layer, input_layer, python_layer

ensure_split_layer()


def tiny_net_text(loss_weight=1.0, extra_net=""):
    """data -> scale1 -> relu (in place) -> scale2 -> {loss, count}: s2 feeds two layers (a Split)."""
    return "\n".join([
        'name: "tiny"', extra_net,
        input_layer("input", {"data": (2, 3, 4), "label": (2,)}),
        python_layer("scale1", "ChannelScale", ["data"], ["s1"], param_str="0.5"),
        'layer { name: "relu" type: "ReLU" bottom: "s1" top: "s1" }',
        python_layer("scale2", "ChannelScale", ["s1"], ["s2"], param_str="2"),
        python_layer("loss", "SumSquaresLoss", ["s2"], ["loss"], extra=f"loss_weight: {loss_weight}"),
        python_layer("count", "CountCorrect", ["s2", "label"], ["correct"]),
    ])


def make_tiny(phase=caffe.TRAIN, **kw):
    net = Net(tiny_net_text(**kw), phase)
    rng = np.random.default_rng(0)
    net.blobs["data"].data[...] = rng.standard_normal((2, 3, 4))
    net.blobs["label"].data[...] = [0, 1]
    return net


def test_wiring_inplace_split_inputs_outputs():
    net = make_tiny()
    assert net.layer_names == ["input", "scale1", "relu", "scale2", "s2_scale2_0_split", "loss", "count"]
    assert net.inputs == ["data", "label"]
    assert net.outputs == ["correct", "loss"]  # sorted by name, as Caffe's std::set
    assert net.top_names["relu"] == ["s1"] and net.bottom_names["relu"] == ["s1"]
    assert net.blobs["s1"] is net.top_vecs[2][0] is net.bottom_vecs[2][0]  # in place: one blob
    assert net.top_names["s2_scale2_0_split"] == ["s2_scale2_0_split_0", "s2_scale2_0_split_1"]
    assert net.bottom_names["loss"] == ["s2_scale2_0_split_0"]
    assert net.bottom_names["count"] == ["s2_scale2_0_split_1", "label"]
    assert dict(net.blob_loss_weights)["loss"] == 1.0
    assert net.blob_loss_weights[net.blob_names_index["loss"]] == 1.0
    assert sum(net.blob_loss_weights.values()) == 1.0
    assert [l.phase for l in net.layers] == [caffe.TRAIN] * len(net.layers)
    assert list(net.params) == ["scale1", "scale2"] and len(net.learnable_params) == 2


def test_backward_analysis_prunes_what_no_loss_uses():
    net = make_tiny()
    need = dict(zip(net.layer_names, net.layer_need_backward))
    assert need == {"input": False, "scale1": True, "relu": True, "scale2": True, "s2_scale2_0_split": True,
                    "loss": True, "count": False}
    names = net.layer_names
    assert net.bottom_need_backward[names.index("scale1")] == [False]  # the input needs no gradient
    assert net.bottom_need_backward[names.index("count")] == [False, False]
    assert net.bottom_need_backward[names.index("loss")] == [True]


def test_no_loss_means_no_backward_and_frozen_params():
    def text(spec, loss):
        return "\n".join([input_layer("input", {"data": (2, 3)}),
                          python_layer("s", "ChannelScale", ["data"], ["y"], extra=spec),
                          python_layer("loss", "SumSquaresLoss", ["y"], ["loss"], extra=loss)])
    assert Net(text("", "loss_weight: 1"), caffe.TRAIN).layer_need_backward == [False, True, True]
    # lr_mult 0 and an input bottom: nothing below the loss needs a gradient, so neither does the loss
    frozen = Net(text("param { lr_mult: 0 }", "loss_weight: 1"), caffe.TRAIN)
    assert frozen.layer_need_backward == [False, False, False]
    assert not frozen.layers[1].param_propagate_down(0)
    # no loss anywhere: no backward at all
    assert Net(text("", ""), caffe.TRAIN).layer_need_backward == [False, False, False]


def test_propagate_down_false_skips_and_true_forces():
    base = [input_layer("input", {"data": (2, 3)}),
            python_layer("a", "ChannelScale", ["data"], ["a"], extra="param { lr_mult: 0 }")]
    loss = python_layer("loss", "SumSquaresLoss", ["a"], ["loss"], extra="loss_weight: 1 propagate_down: PD")
    off = Net("\n".join(base + [loss.replace("PD", "false")]), caffe.TRAIN)
    assert off.bottom_need_backward[2] == [False] and off.layer_need_backward[2] is False
    on = Net("\n".join(base + [loss.replace("PD", "true")]), caffe.TRAIN)
    assert on.bottom_need_backward[2] == [True]


def test_force_backward_respects_allow_force_backward(monkeypatch):
    from caffe.layers.python_layer import PythonLayer
    monkeypatch.setattr(PythonLayer, "allow_force_backward",
                        lambda self, i: not (self.layer_param.python_param.layer == "CountCorrect" and i == 1))
    net = make_tiny(extra_net="force_backward: true")
    names = net.layer_names
    assert all(net.layer_need_backward)
    assert net.bottom_need_backward[names.index("scale1")] == [True]
    assert net.bottom_need_backward[names.index("count")] == [True, False]  # labels stay without gradient
    net.ForwardBackward()
    assert np.abs(net.blobs["data"].diff).sum() > 0


def numerical_grad(f, arr, eps=1e-6):
    g = np.zeros_like(arr)
    flat, gflat = arr.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        up = f()
        flat[i] = old - eps
        down = f()
        flat[i] = old
        gflat[i] = (up - down) / (2 * eps)
    return g


@given(n=st.integers(1, 3), c=st.integers(1, 3), w1=st.floats(-2, 2), w2=st.floats(-2, 2),
       loss_weight=st.sampled_from([1.0, 0.5, 3.0]))
def test_net_gradients_match_finite_differences(n, c, w1, w2, loss_weight):
    text = "\n".join([
        "force_backward: true", input_layer("input", {"data": (n, c, 2)}),
        python_layer("a", "ChannelScale", ["data"], ["a"], param_str=repr(w1)),
        python_layer("b", "ChannelScale", ["a"], ["b"], param_str=repr(w2)),
        python_layer("sum", "SumAll", ["a", "b"], ["s"]),  # `a` feeds two layers: a Split sums its diffs
        python_layer("loss", "SumSquaresLoss", ["s"], ["loss"], extra=f"loss_weight: {loss_weight}")])
    net = Net(text, caffe.TRAIN, dtype=np.float64)
    net.blobs["data"].data[...] = np.random.default_rng(n * 7 + c).standard_normal((n, c, 2))
    net.ClearParamDiffs()
    loss = net.ForwardBackward()
    s = net.blobs["s"].data
    assert loss == pytest.approx(loss_weight * 0.5 * float((s * s).sum()))
    for arr, diff in [(net.blobs["data"].data, net.blobs["data"].diff)] + [
            (p.data, p.diff) for p in net.learnable_params]:
        np.testing.assert_allclose(diff, numerical_grad(net.Forward, arr), rtol=1e-5, atol=1e-7)


def random_dag(draw_ops, n_inputs):
    """Prototxt for a random DAG of SumAll layers over `n_inputs` inputs, all ending in one loss."""
    blobs = [f"in{i}" for i in range(n_inputs)]
    layers = [input_layer("input", {b: (2, 2) for b in blobs})]
    for k, picks in enumerate(draw_ops):
        bottoms = [blobs[p % len(blobs)] for p in picks]
        layers.append(python_layer(f"sum{k}", "SumAll", bottoms, [f"s{k}"]))
        blobs.append(f"s{k}")
    layers.append(python_layer("loss", "SumAll", blobs, ["total"], extra="loss_weight: 1"))
    return "\n".join(["force_backward: true"] + layers)


@given(n_inputs=st.integers(1, 3),
       ops=st.lists(st.lists(st.integers(0, 50), min_size=1, max_size=3), min_size=0, max_size=5))
def test_random_dag_gradient_counts_paths(n_inputs, ops):
    """d(sum of everything)/d(input) = number of paths from the input to the loss: Split sums every use."""
    net = Net(random_dag(ops, n_inputs), caffe.TRAIN, dtype=np.float64)
    for i in range(n_inputs):
        net.blobs[f"in{i}"].data[...] = 1.0
    net.ForwardBackward()
    # every blob is consumed at most once after split insertion
    consumed = [b for bots in net.bottom_names.values() for b in bots]
    assert len(consumed) == len(set(consumed))
    paths = {f"in{i}": 1.0 for i in range(n_inputs)}  # paths from the inputs, by linearity = blob values
    for k, picks in enumerate(ops):
        names = [f"in{i}" for i in range(n_inputs)] + [f"s{j}" for j in range(k)]
        paths[f"s{k}"] = sum(paths[names[p % len(names)]] for p in picks)
    for name, value in paths.items():
        np.testing.assert_allclose(net.blobs[name].data, value)
    for i in range(n_inputs):
        expected = numerical_grad(net.Forward, net.blobs[f"in{i}"].data, eps=0.5)
        np.testing.assert_allclose(net.blobs[f"in{i}"].diff, expected)


def sharing_text(spec_b, blob_b=""):
    return "\n".join([
        input_layer("input", {"data": (2, 3)}),
        python_layer("a", "ChannelScale", ["data"], ["a"], param_str="2", extra='param { name: "w" lr_mult: 2 }'),
        python_layer("b", "ChannelScale", ["a"], ["b"], extra=f"param {{ name: \"w\" {spec_b} }} {blob_b}"),
        python_layer("loss", "SumSquaresLoss", ["b"], ["loss"], extra="loss_weight: 1")])


def test_param_sharing_by_name():
    net = Net(sharing_text(""), caffe.TRAIN)
    assert net.param_owners == [-1, 0]
    assert net.learnable_params == [net.params["a"][0]] and net.learnable_param_ids == [0, 0]
    assert net.params_lr == [2.0] and net.has_params_lr == [True]
    assert net.params_weight_decay == [1.0] and net.has_params_decay == [False]
    wa, wb = net.params["a"][0], net.params["b"][0]
    assert wa.data_mem is wb.data_mem and wa.diff_mem is wb.diff_mem
    np.testing.assert_array_equal(wb.data, 2.0)  # b uses a's weights
    # decay_mult given only by the sharing layer fills the owner's entry
    assert Net(sharing_text("decay_mult: 0"), caffe.TRAIN).params_weight_decay == [0.0]
    # the gradient of a shared weight is the sum of both uses: d/dw of 0.5*sum((w^2 x)^2) = 2 w^3 x^2
    net.blobs["data"].data[...] = [[1, 2, 3], [4, 5, 6]]
    net.ClearParamDiffs()
    net.ForwardBackward()
    x2 = (np.array([[1, 2, 3], [4, 5, 6]]) ** 2).sum(0)
    np.testing.assert_allclose(wa.diff, 2 * 2.0 ** 3 * x2, rtol=1e-6)
    net.Update()  # updates the owner once; the sharer sees it
    np.testing.assert_allclose(wb.data, 2.0 - 2 * 8 * x2, rtol=1e-6)


def test_param_sharing_checks():
    with pytest.raises(NetError, match="Shared param 'w' has mismatched lr_mult"):
        Net(sharing_text("lr_mult: 3"), caffe.TRAIN)
    other_shape = "blobs { shape { dim: 1 dim: 3 } data: 1 data: 1 data: 1 }"
    with pytest.raises(NetError, match=r"Cannot share param 'w' owned by layer 'a' with layer 'b'; shape "
                                       r"mismatch.*3 \(3\).*1 3 \(3\)"):
        Net(sharing_text("", other_shape), caffe.TRAIN)
    net = Net(sharing_text("share_mode: PERMISSIVE", other_shape), caffe.TRAIN)  # counts agree: fine
    assert net.param_owners == [-1, 0]


def test_too_many_param_specs():
    text = "\n".join([input_layer("input", {"data": (2, 3)}),
                      python_layer("a", "ChannelScale", ["data"], ["a"], extra="param {} param {}")])
    with pytest.raises(NetError, match="Too many params specified for layer 'a'.*2 param specs for 1"):
        Net(text, caffe.TRAIN)


def test_loss_weight_scales_loss_and_gradients():
    nets = [make_tiny(loss_weight=w) for w in (1.0, 2.5)]
    losses = []
    for net in nets:
        net.ClearParamDiffs()
        losses.append(net.ForwardBackward())
    assert losses[1] == pytest.approx(2.5 * losses[0])
    for p1, p2 in zip(nets[0].learnable_params, nets[1].learnable_params):
        np.testing.assert_allclose(p2.diff, 2.5 * p1.diff, rtol=1e-6)


def test_update_and_clear_param_diffs():
    net = make_tiny()
    net.ClearParamDiffs()
    net.ForwardBackward()
    before = [p.data.copy() for p in net.learnable_params]
    diffs = [p.diff.copy() for p in net.learnable_params]
    assert any(np.abs(d).sum() > 0 for d in diffs)
    net.Update()
    for p, b, d in zip(net.learnable_params, before, diffs):
        np.testing.assert_allclose(p.data, b - d)
    net.ClearParamDiffs()
    assert all(not p.diff.any() for p in net.learnable_params)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_clear_param_diffs_zeroes_large_and_small_diffs_to_plus_zero(dtype, monkeypatch):
    """Diffs of 1 MB and more are cleared by libc's memset (net._MEMSET_MIN_BYTES), smaller ones by NumPy: either
    way every element is +0.0, whatever it held (NaN, -0.0, inf), shared diffs included."""
    from caffe.net import net as net_module
    text = "\n".join([
        'name: "wide"', input_layer("input", {"data": (2, 600)}),
        'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "a" param { name: "w" } '
        'inner_product_param { num_output: 500 } }',
        'layer { name: "ip2" type: "InnerProduct" bottom: "data" top: "b" param { name: "w" } '
        'inner_product_param { num_output: 500 } }',
        'layer { name: "small" type: "InnerProduct" bottom: "data" top: "c" inner_product_param { num_output: 3 } }',
    ])
    for threshold in (1 << 20, 1 << 40):  # the memset path for the 500 x 600 weights, then NumPy's for all
        monkeypatch.setattr(net_module, "_MEMSET_MIN_BYTES", threshold)
        net = Net(text, caffe.TRAIN, dtype=dtype)
        for p in net.learnable_params:
            d = p.diff
            d[...] = -1.5
            d.reshape(-1)[:3] = [np.nan, -0.0, np.inf]
        assert net.params["ip2"][0].diff[0, 0] != net.params["ip2"][0].diff[0, 0]  # shared with ip's: NaN
        net.ClearParamDiffs()
        for p in net.learnable_params:
            assert not p.diff.any() and not np.signbit(p.diff).any()
        assert not net.params["ip2"][0].diff.any()


def test_callbacks_run_around_every_layer():
    net = make_tiny()
    calls = []
    for name in ("before_forward", "after_forward", "before_backward", "after_backward"):
        getattr(net, name)(lambda i, name=name: calls.append((name, i)))
    net.ForwardBackward()
    n = len(net.layers)
    fwd = [c for i in range(n) for c in (("before_forward", i), ("after_forward", i))]
    bwd = [c for i in reversed(range(n)) for c in (("before_backward", i), ("after_backward", i))]
    assert calls == fwd + bwd

    class Recorder:  # Caffe-style callback object
        def __init__(self):
            self.seen = []

        def run(self, layer):
            self.seen.append(layer)

    rec = Recorder()
    net.add_after_forward(rec)
    net.ForwardTo(2)
    assert rec.seen == [0, 1, 2]
    with pytest.raises(TypeError, match="callable"):
        net.before_forward(42)


def test_forward_from_to_and_ranges():
    net = make_tiny()
    net.Forward()
    full = net.blobs["s2"].data.copy()
    net.blobs["s2"].data[...] = 0
    net.ForwardFromTo(3, 3)
    np.testing.assert_array_equal(net.blobs["s2"].data, full)
    with pytest.raises(IndexError, match=r"ForwardFromTo\(0, 99\)"):
        net.ForwardFromTo(0, 99)
    with pytest.raises(IndexError, match="BackwardFromTo"):
        net.BackwardFromTo(99, 0)


def test_debug_info_lines(caplog):
    net = make_tiny(extra_net="debug_info: true")
    assert net.debug_info
    with caplog.at_level(logging.INFO, logger="caffe.net"):
        net.ForwardBackward()
    lines = [r.getMessage() for r in caplog.records]
    s1 = np.abs(net.blobs["s1"].data).mean()
    assert f"    [Forward] Layer relu, top blob s1 data: {s1:g}" in lines
    w = np.abs(net.params["scale1"][0].data).mean()
    assert f"    [Forward] Layer scale1, param blob 0 data: {w:g}" in lines
    dw = np.abs(net.params["scale2"][0].diff).mean()
    assert f"    [Backward] Layer scale2, param blob 0 diff: {dw:g}" in lines
    dx = np.abs(net.blobs["s1"].diff).mean()
    assert f"    [Backward] Layer scale2, bottom blob s1 diff: {dx:g}" in lines
    assert not any("Layer count, bottom blob" in l for l in lines)  # no backward for the count layer
    assert any(l.startswith("    [Backward] All net params (data, diff): L1 norm = (") for l in lines)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="caffe.net"):
        net.Update()
    assert any(r.getMessage().startswith("    [Update] Layer scale1, param 0 data: ") for r in caplog.records)
    net.set_debug_info(False)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="caffe.net"):
        net.Forward()
    assert not caplog.records


def test_glog_format():
    from caffe.net.glog import GlogFormatter
    rec = logging.LogRecord("caffe.net", logging.INFO, "/x/net.py", 12, "Creating Layer %s", ("conv1",), None)
    text = GlogFormatter().format(rec)
    import re
    assert re.fullmatch(r"I\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ net\.py:12\] Creating Layer conv1", text), text


def test_memory_report_counts_shared_memory_once():
    def net_text(relu):
        return "\n".join([input_layer("input", {"data": (4, 8)}),
                          python_layer("a", "ChannelScale", ["data"], ["a"]),
                          'layer { name: "relu" type: "ReLU" bottom: "a" top: "a" }' if relu else "",
                          python_layer("loss", "SumSquaresLoss", ["a"], ["loss"], extra="loss_weight: 1")])
    reports = []
    for relu in (False, True):
        net = Net(net_text(relu), caffe.TRAIN)
        net.ForwardBackward()
        reports.append(net.memory_report())
    assert reports[0]["activation_bytes"] == reports[1]["activation_bytes"]  # in place: no new memory
    assert reports[0]["param_bytes"] == 2 * 8 * 4  # data + diff of one (8,) float32 param
    shared = Net(sharing_text(""), caffe.TRAIN)
    shared.ForwardBackward()
    assert shared.memory_report()["param_bytes"] == 2 * 3 * 4  # the shared weight counted once


def test_reshape_propagates_new_input_shape():
    net = make_tiny()
    net.blobs["data"].reshape(5, 3, 4)
    net.blobs["label"].reshape(5)
    net.Reshape()
    assert net.blobs["s2"].shape == (5, 3, 4) and net.blobs["s2_scale2_0_split_1"].shape == (5, 3, 4)


def test_share_trained_layers_with():
    train, test = make_tiny(caffe.TRAIN), make_tiny(caffe.TEST)
    assert [l.phase for l in test.layers] == [caffe.TEST] * len(test.layers)
    test.ShareTrainedLayersWith(train)
    train.params["scale1"][0].data[...] = 7
    np.testing.assert_array_equal(test.params["scale1"][0].data, 7)


def test_explicit_layer_phase_is_kept():
    text = input_layer("input", {"data": (1,)}).replace('type: "Input"', 'type: "Input" phase: TRAIN')
    assert Net(text, caffe.TEST).layers[0].phase == caffe.TRAIN


def test_auto_top_blobs_are_anonymous():
    from caffe.layers.layer import Layer
    from caffe.layers.registry import _REGISTRY, register_layer

    @register_layer("NetTestAutoTop")
    class AutoTop(Layer):
        auto_top_blobs = True
        exact_num_top_blobs = 2

        def reshape(self, bottom, top):
            for t in top:
                t.reshape(1)

    try:
        net = Net('layer { name: "a" type: "NetTestAutoTop" top: "x" }', caffe.TEST)
        assert net.blob_names == ["x", "(automatic)"] and net.outputs == ["x"]
    finally:
        _REGISTRY.pop("NetTestAutoTop", None)


def test_batch_norm_statistics_never_learn():
    from caffe.layers import layer_type_list
    if "BatchNorm" not in layer_type_list():
        pytest.skip("layer type BatchNorm is not implemented yet (caffe-layers)")
    head = input_layer("input", {"data": (4, 3)})
    bn = 'layer { name: "bn" type: "BatchNorm" bottom: "data" top: "bn" %s }'
    loss = python_layer("loss", "SumSquaresLoss", ["bn"], ["loss"], extra="loss_weight: 1")
    net = Net("\n".join([head, bn % "", loss]), caffe.TRAIN)
    # BatchNorm adds `param { lr_mult: 0 }` to its own definition; the net reads the layer's copy
    assert net.params_lr == [0.0, 0.0, 0.0] and net.has_params_lr == [True, True, True]
    # an old definition with three learnable specs is upgraded (rates 0, names kept) and builds
    old = Net("\n".join([head, bn % 'param { lr_mult: 1 name: "m" } param { lr_mult: 1 } param { lr_mult: 1 }',
                         loss]), caffe.TRAIN)
    assert old.params_lr == [0.0, 0.0, 0.0] and old.params_weight_decay == [0.0, 0.0, 0.0]
    assert old.param_display_names[:1] == ["m"]


def test_no_reallocation_between_iterations():
    net = make_tiny()
    net.ClearParamDiffs()
    net.ForwardBackward()
    net.Update()
    mems = [(b.data_mem, b.diff_mem) for b in list(net.blobs.values()) + net.learnable_params]
    report = net.memory_report()
    for _ in range(3):
        net.ClearParamDiffs()
        net.ForwardBackward()
        net.Update()
    assert [(b.data_mem, b.diff_mem) for b in list(net.blobs.values()) + net.learnable_params] == mems
    assert net.memory_report() == report

"""Inference folding (caffe.net.fold): same results, same blobs and params, never a stale fold."""
import logging

import numpy as np
import pytest
from hypothesis import given, strategies as st

import caffe
from caffe.net import Net, NetError
from caffe.net.fold import find_chains, fold_enabled, quiet

TOL = 1e-5


def close(a, b, tol=TOL):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = max(float(np.abs(b).max(initial=0.0)), 1e-30)
    return float(np.abs(a - b).max(initial=0.0)) <= tol * scale


def chain_text(kind="Convolution", c_in=3, c_out=4, hw=(5, 6), batch=2, bias=True, kernel=3, stride=1, pad=1,
               group=1, bn=True, bn_inplace=True, scale=True, scale_bias=True, scale_inplace=True, act="ReLU",
               act_inplace=True, tail=True, extra_net="", loss=False, transpose=False):
    """data -> producer -> [BatchNorm] -> [Scale] -> [act] -> [tail InnerProduct]; returns (text, final top)."""
    shape = (batch, c_in) + tuple(hw) if kind == "Convolution" else (batch, c_in)
    dims = " ".join(f"dim: {d}" for d in shape)
    lines = ['name: "chain"', extra_net,
             f'layer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ {dims} }} }} }}']
    if kind == "Convolution":
        lines.append(f'layer {{ name: "prod" type: "Convolution" bottom: "data" top: "prod" convolution_param {{ '
                     f'num_output: {c_out} kernel_size: {kernel} stride: {stride} pad: {pad} group: {group} '
                     f'bias_term: {str(bias).lower()} weight_filler {{ type: "gaussian" std: 0.5 }} '
                     f'bias_filler {{ type: "gaussian" std: 0.5 }} }} }}')
    else:
        lines.append(f'layer {{ name: "prod" type: "InnerProduct" bottom: "data" top: "prod" inner_product_param {{ '
                     f'num_output: {c_out} bias_term: {str(bias).lower()} transpose: {str(transpose).lower()} '
                     f'weight_filler {{ type: "gaussian" '
                     f'std: 0.5 }} bias_filler {{ type: "gaussian" std: 0.5 }} }} }}')
    cur = "prod"

    def step(name, type_, inplace, body=""):
        nonlocal cur
        top = cur if inplace else name
        lines.append(f'layer {{ name: "{name}" type: "{type_}" bottom: "{cur}" top: "{top}" {body} }}')
        cur = top

    if bn:
        step("bn", "BatchNorm", bn_inplace)
    if scale:
        step("scale", "Scale", scale_inplace,
             f'scale_param {{ bias_term: {str(scale_bias).lower()} filler {{ type: "gaussian" std: 1 }} '
             f'bias_filler {{ type: "gaussian" std: 1 }} }}')
    if act == "ReLU":
        step("act", "ReLU", act_inplace)
    elif act == "LeakyReLU":
        step("act", "ReLU", act_inplace, "relu_param { negative_slope: 0.1 }")
    elif act == "Clip":
        step("act", "Clip", act_inplace, "clip_param { min: -0.5 max: 1.5 }")
    final = cur
    if tail:
        lines.append(f'layer {{ name: "tail" type: "InnerProduct" bottom: "{cur}" top: "out" inner_product_param '
                     f'{{ num_output: 3 weight_filler {{ type: "gaussian" std: 0.3 }} }} }}')
    if loss:
        lines.append('layer { name: "loss" type: "EuclideanLoss" bottom: "out" bottom: "out2" top: "loss" }')
        lines[2] = lines[2].replace('top: "data"', 'top: "data" top: "out2"').replace(
            "} } }", "} shape { dim: %d dim: 3 } } }" % batch)
    return "\n".join(lines), final


def randomize_stats(net, rng, zero_factor=False):
    for layer in net.layers:
        if layer.type == "BatchNorm":
            c = layer.blobs[0].count()
            factor = 0.0 if zero_factor else float(rng.uniform(0.5, 2.0))
            layer.blobs[0].data[...] = rng.standard_normal(c) * factor
            layer.blobs[1].data[...] = rng.uniform(0.1, 2.0, c) * factor
            layer.blobs[2].data[...] = factor


def copy_params(src, dst):
    for name, blobs in src.params.items():
        for a, b in zip(blobs, dst.params[name]):
            b.data[...] = a.data


def pair(text, seed=0, zero_factor=False, **kw):
    """(folded, unfolded) TEST nets of `text` with the same random parameters and input."""
    rng = np.random.default_rng(seed)
    folded = Net(text, caffe.TEST, fold=True, **kw)
    plain = Net(text, caffe.TEST, fold=False, **kw)
    randomize_stats(folded, rng, zero_factor)
    copy_params(folded, plain)
    for name in folded.inputs:
        x = rng.standard_normal(folded.blobs[name].shape)
        folded.blobs[name].data[...] = x
        plain.blobs[name].data[...] = x
    return folded, plain


def preactivation_max(plain, final):
    """max |input of the chain's activation| (its "act" layer), from a forward that stops before it; None without."""
    if "act" not in plain.layer_names_index:
        return None
    i = plain.layer_names_index["act"]
    plain.ForwardTo(i - 1)
    return float(np.abs(plain.blobs[plain.blob_names[plain.bottom_id_vecs[i][0]]].data).max(initial=0.0))


def assert_same_forward(folded, plain, final):
    folded.Forward()
    pre = preactivation_max(plain, final)
    plain.Forward()
    assert folded.fold_units and all(u.ran_folded for u in folded.fold_units)
    # The fold changes the rounding of the producer's sums, which a BatchNorm's 1 / sqrt(var + eps) can amplify
    # (zero statistics: x 316); a Clip then bounds the output but not the sums, so an output in the clip range can
    # come from a sum that cancelled. The bound is relative to the activation's input where that is larger.
    out_max = float(np.abs(plain.blobs[final].data).max(initial=0.0))
    tol = TOL * max(1.0, pre / out_max) if pre is not None and out_max > 0 else TOL
    for name in plain.blobs:
        a, b = folded.blobs[name].data, plain.blobs[name].data
        assert a.shape == b.shape, name
        if name == final or name == "out":
            assert close(a, b, tol), (name, np.abs(a - b).max(), np.abs(b).max(), tol)
        else:  # inputs and skipped intermediates hold exactly what the unfolded forward leaves
            np.testing.assert_array_equal(a, b, err_msg=name)


@given(st.data())
def test_folded_forward_matches_unfolded_on_random_chains(data):
    kind = data.draw(st.sampled_from(["Convolution", "InnerProduct"]), "kind")
    act = data.draw(st.sampled_from([None, "ReLU", "LeakyReLU", "Clip"]), "act")
    # a Convolution and its activation alone (no BatchNorm, no Scale) fold too: the activation in its store
    act_only = kind == "Convolution" and act is not None and data.draw(st.booleans(), "act_only")
    bn = not act_only and data.draw(st.booleans(), "bn")
    scale = not act_only and (data.draw(st.booleans(), "scale") if bn else True)
    c_in = data.draw(st.integers(1, 6), "c_in")
    group = data.draw(st.sampled_from([g for g in (1, 2, 3) if c_in % g == 0]), "group")
    c_out = group * data.draw(st.integers(1, 4), "c_out/group")
    kw = dict(kind=kind, c_in=c_in, c_out=c_out, batch=data.draw(st.integers(1, 3), "batch"),
              bias=data.draw(st.booleans(), "bias"), bn=bn, scale=scale,
              bn_inplace=data.draw(st.booleans(), "bn_inplace"),
              scale_bias=data.draw(st.booleans(), "scale_bias"),
              scale_inplace=data.draw(st.booleans(), "scale_inplace"),
              act=act,
              act_inplace=data.draw(st.booleans(), "act_inplace"), tail=data.draw(st.booleans(), "tail"),
              transpose=kind == "InnerProduct" and data.draw(st.booleans(), "transpose"))
    if kind == "Convolution":
        kernel = data.draw(st.integers(1, 3), "kernel")
        kw.update(hw=(data.draw(st.integers(kernel, 7), "h"), data.draw(st.integers(kernel, 7), "w")),
                  kernel=kernel, stride=data.draw(st.integers(1, 2), "stride"),
                  pad=data.draw(st.integers(0, kernel - 1), "pad"), group=group)
    text, final = chain_text(**kw)
    dtype = data.draw(st.sampled_from([np.float32, np.float64]), "dtype")
    folded, plain = pair(text, seed=data.draw(st.integers(0, 2**16), "seed"),
                         zero_factor=data.draw(st.booleans(), "zero_factor") if bn else False, dtype=dtype)
    assert [u.names for u in folded.fold_units] and folded.fold_units[0].names[0] == "prod"
    assert_same_forward(folded, plain, final)
    # parameters and saved models are the unfolded ones
    for name in plain.params:
        for a, b in zip(folded.params[name], plain.params[name]):
            np.testing.assert_array_equal(a.data, b.data)
    assert folded.ToProto().SerializeToString() == plain.ToProto().SerializeToString()
    assert_same_forward(folded, plain, final)  # again: the cached fold


def test_pending_blob_is_computed_on_read_and_warns_when_its_bottom_changed(caplog):
    text, final = chain_text(bn_inplace=False, scale_inplace=True, act_inplace=False)
    folded, plain = pair(text)
    folded.Forward()
    plain.Forward()
    unit = folded.fold_units[0]
    assert [b for b, _ in unit.pending] == [folded.blobs["prod"], folded.blobs["bn"]]
    assert folded.blobs["prod"]._lazy_pending and folded.blobs["bn"]._lazy_pending
    np.testing.assert_array_equal(folded.blobs["bn"].cpu_data(), plain.blobs["bn"].cpu_data())
    assert not folded.blobs["prod"]._lazy_pending  # computed on the way
    np.testing.assert_array_equal(folded.blobs["prod"].data, plain.blobs["prod"].data)
    # memory accounting does not compute pending blobs
    folded.Forward()
    report = folded.memory_report()
    assert folded.blobs["prod"]._lazy_pending
    clone = folded.fold_units[0].clone
    assert report["folded_param_bytes"] == sum(b.count() * 4 for b in clone.blobs)  # data (no diff is used)
    # the next image arrives before the old intermediate is read: computed from it, with a warning
    folded.blobs["data"].data[...] = 0
    with caplog.at_level(logging.WARNING, logger="caffe.net"):
        folded.blobs["prod"].cpu_data()
    assert "written after the forward" in caplog.text


def test_the_fold_is_cached_and_recomputed_on_every_kind_of_parameter_change(tmp_path):
    text, final = chain_text()
    folded, plain = pair(text)
    unit = folded.fold_units[0]

    def check():
        assert_same_forward(folded, plain, final)

    check()
    check()
    assert unit.recomputes == 1  # nothing changed: the folded weights were kept
    # the original layers, run unfolded, keep no view of their parameters (else every forward recomputes)
    folded.fold(False)
    folded.Forward()
    folded.fold(True)
    check()
    assert unit.recomputes == 1
    # 1. pycaffe assignment to the weights, the bias, BatchNorm's statistics, Scale's gamma and beta
    for layer, i in (("prod", 0), ("prod", 1), ("bn", 0), ("bn", 1), ("bn", 2), ("scale", 0), ("scale", 1)):
        for net in (folded, plain):
            net.params[layer][i].data[...] *= 1.5
        check()
    assert unit.recomputes == 8
    # 2. a view held across forwards, written after the fold was computed
    w = folded.params["prod"][0].data
    w2 = plain.params["prod"][0].data
    check()
    w *= -1
    w2 *= -1
    check()
    del w, w2
    check()
    n = unit.recomputes
    check()
    assert unit.recomputes == n  # no view left: cached again
    # 3. a write through the SyncedMemory itself
    for net in (folded, plain):
        net.params["bn"][1].data_mem.mutable_cpu_data(np.float32)[0] += 3
    check()
    # 4. a solver's update (data -= diff)
    for net in (folded, plain):
        blob = net.params["scale"][0]
        blob.diff[...] = 0.25
        blob.update()
    check()
    # 5. copy_from a caffemodel (binary and HDF5) saved by another net
    other = Net(text, caffe.TEST, fold=False)
    randomize_stats(other, np.random.default_rng(7))
    for path in (tmp_path / "w.caffemodel", tmp_path / "w.h5"):
        for blobs in other.params.values():
            for b in blobs:
                b.data[...] *= 0.5
        other.save(str(path)) if path.suffix == ".caffemodel" else other.save_hdf5(str(path))
        folded.copy_from(str(path))
        plain.copy_from(str(path))
        check()
    # 6. share_with another net (the memory changes), then that net's weights change
    folded.share_with(other)
    plain.share_with(other)
    check()
    other.params["bn"][0].data[...] += 1
    check()
    # 7. a parameter blob reshaped in place (new memory) or replaced in the layer
    for net in (folded, plain):
        b = net.params["scale"][0]
        b.reshape(b.shape[0] * 2)
        b.reshape(b.shape[0] // 2)
        b.data[...] = 2.0
    check()
    # and the originals are what is saved
    assert folded.ToProto().SerializeToString() == plain.ToProto().SerializeToString()


def test_quiet_sees_views_anywhere():
    from caffe.blob import Blob
    b = Blob(4)
    b.data[...] = 1
    assert quiet(b.data_mem)
    v = b.cpu_data()[1:]
    assert not quiet(b.data_mem)
    del v
    assert quiet(b.data_mem)
    buffer = np.zeros(8, np.float32)
    b.set_cpu_data(buffer[:4])  # borrowed memory: watched while its owner lives elsewhere
    assert not quiet(b.data_mem)
    del buffer
    assert quiet(b.data_mem)


def test_switches_and_where_folding_is_off(monkeypatch):
    text, _ = chain_text()
    assert Net(text, caffe.TEST).fold_units  # on by default in TEST
    assert not Net(text, caffe.TRAIN).fold_units
    assert not Net(text, caffe.TEST, fold=False).fold_units
    assert not Net(chain_text(extra_net="force_backward: true")[0], caffe.TEST).fold_units
    monkeypatch.setenv("CAFFE_FOLD", "0")
    assert not Net(text, caffe.TEST).fold_units
    assert Net(text, caffe.TEST, fold=True).fold_units  # the argument wins
    monkeypatch.setenv("CAFFE_FOLD", "maybe")
    with pytest.raises(ValueError, match="CAFFE_FOLD"):
        fold_enabled()
    monkeypatch.delenv("CAFFE_FOLD")
    net = Net(text, caffe.TEST)
    net.fold(False)
    assert not net.folded
    net.fold(True)
    assert net.folded


def test_chains_stop_where_an_intermediate_has_other_readers():
    # the conv top feeds BatchNorm and a second branch: a Split; nothing folds
    text = "\n".join([
        'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 dim: 4 dim: 4 } } }',
        'layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 2 '
        'kernel_size: 1 } }',
        'layer { name: "bn" type: "BatchNorm" bottom: "c" top: "b" }',
        'layer { name: "r" type: "ReLU" bottom: "c" top: "r" }',
        # a second chain whose Scale top (not in place) is read by another layer: it ends at the Scale
        'layer { name: "c2" type: "Convolution" bottom: "b" top: "c2" convolution_param { num_output: 2 '
        'kernel_size: 1 } }',
        'layer { name: "bn2" type: "BatchNorm" bottom: "c2" top: "c2" }',
        'layer { name: "s2" type: "Scale" bottom: "c2" top: "s2" }',
        'layer { name: "r2" type: "ReLU" bottom: "s2" top: "r2" }',
        'layer { name: "other" type: "ReLU" bottom: "s2" top: "o2" }',
    ])
    net = Net(text, caffe.TEST)
    assert [u.names for u in net.fold_units] == [["c2", "bn2", "s2"]]
    assert find_chains(Net(text, caffe.TRAIN)) == []


def test_callbacks_partial_ranges_and_backward():
    text, final = chain_text(bn_inplace=False, loss=True)
    folded, plain = pair(text)
    names = folded.layer_names
    # a range that cuts the chain runs its layers one by one: exact
    for start, end in ((0, names.index("bn")), (names.index("scale"), len(names) - 1), (0, len(names) - 1)):
        folded.ForwardFromTo(start, end)
        plain.ForwardFromTo(start, end)
        np.testing.assert_array_equal(folded.blobs["prod"].data, plain.blobs["prod"].data)
        if end - start < len(names) - 1:
            np.testing.assert_array_equal(folded.blobs[final].data, plain.blobs[final].data)
    assert final == "bn" and close(folded.blobs[final].data, plain.blobs[final].data)
    assert folded.fold_units[0].ran_folded
    # backward through layers that ran folded is refused, with the way out
    with pytest.raises(NetError, match="fold=False"):
        folded.Backward()
    # after an unfolded forward (forward callbacks observe each layer: never folded) it runs, and matches
    seen = []
    folded.after_forward(seen.append)
    plain.after_forward(lambda i: None)
    folded.Forward()
    plain.Forward()
    assert seen == list(range(len(names)))
    assert not folded.fold_units[0].ran_folded
    folded.Backward()
    plain.Backward()
    for name in plain.params:
        for a, b in zip(folded.params[name], plain.params[name]):
            np.testing.assert_array_equal(a.diff, b.diff)


def test_backward_of_a_deploy_net_is_a_no_op_and_allowed():
    text, final = chain_text()
    net = Net(text, caffe.TEST)
    net.Forward()
    net.Backward()  # nothing needs backward: nothing to refuse


def test_debug_info_runs_unfolded():
    text, final = chain_text(extra_net="debug_info: true")
    folded, plain = pair(text)
    folded.Forward()
    assert not folded.fold_units[0].ran_folded


@pytest.mark.parametrize("act", ["ReLU", "LeakyReLU", "Clip"])
@pytest.mark.parametrize("act_inplace", [True, False])
def test_a_convolution_and_its_activation_alone_fold(act, act_inplace):
    """Convolution -> ReLU/Clip with no BatchNorm or Scale (SqueezeNet, GoogLeNet): one unit, the producer
    itself with the activation as its epilogue: the same bits as the two layers, the producer plain after
    it, a pre-activation top (not in place) computed on demand, no folded weights."""
    text, final = chain_text(bn=False, scale=False, act=act, act_inplace=act_inplace, c_in=3, c_out=5)
    folded, plain = pair(text, dtype=np.float32)
    unit = folded.fold_units[0]
    assert unit.names == ["prod", "act"] and unit.act_only
    for _ in range(2):
        folded.Forward()
        plain.Forward()
        assert unit.ran_folded and unit.clone is None
        assert folded.layers[folded.layer_names.index("prod")].epilogue is None
        np.testing.assert_array_equal(folded.blobs["out"].data, plain.blobs["out"].data)
        np.testing.assert_array_equal(folded.blobs[final].data, plain.blobs[final].data)
        if not act_inplace:  # the convolution's own top: the values before the activation
            np.testing.assert_array_equal(folded.blobs["prod"].data, plain.blobs["prod"].data)
    assert folded.memory_report()["folded_param_bytes"] == 0

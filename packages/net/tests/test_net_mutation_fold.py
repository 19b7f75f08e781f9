"""Mutation survivors of inference folding (caffe.net.fold; docs/MUTATION.md, caffe-net): which chains fold
(and which must not: a layer after the activation, a second BatchNorm or Scale, a Scale on another axis, loss
weights, an InnerProduct on axis 2), the affine map's corner cases (BatchNorm's zero factor, a count-1 Scale
with several axes, a transposed InnerProduct), the cache's guard against a replaced or removed parameter
blob, the environment switch's spellings, the loss a folded step returns, and the messages and warnings."""
import logging

import numpy as np
import pytest

import caffe
from caffe.blob import Blob
from caffe.blob.syncedmem import UNINITIALIZED, SyncedMemory
from caffe.net import Net, NetError
from caffe.net import fold

INPUT = 'layer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ {} }} }} }}'
FILL = 'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" std: 0.5 }'


def net_text(shape, *layers):
    """An Input of `shape`, then the layers given as (name, type, bottom, top, body) tuples."""
    lines = [INPUT.format(" ".join(f"dim: {d}" for d in shape))]
    for name, type_, bottom, top, body in layers:
        lines.append(f'layer {{ name: "{name}" type: "{type_}" bottom: "{bottom}" top: "{top}" {body} }}')
    return "\n".join(lines)


def conv(name="c", bottom="data", top="c", n=4, k=1, extra=""):
    return name, "Convolution", bottom, top, f"convolution_param {{ num_output: {n} kernel_size: {k} {FILL} }} {extra}"


def bn(name="bn", bottom="c", top="c", body=""):
    return name, "BatchNorm", bottom, top, body


def scale(name="s", bottom="c", top="c", param="bias_term: true"):
    return (name, "Scale", bottom, top,
            f'scale_param {{ {param} filler {{ type: "gaussian" std: 1 }} bias_filler {{ type: "gaussian" std: 1 }} }}')


def twins(text, seed=0):
    """(folded, unfolded) TEST nets with the same random parameters, BatchNorm statistics and input."""
    rng = np.random.default_rng(seed)
    folded, plain = Net(text, caffe.TEST, fold=True), Net(text, caffe.TEST, fold=False)
    for layer in folded.layers:
        if layer.type == "BatchNorm":
            c = layer.blobs[0].count()
            layer.blobs[0].data[...] = rng.standard_normal(c) * 1.5
            layer.blobs[1].data[...] = rng.uniform(0.2, 2.0, c) * 1.5
            layer.blobs[2].data[...] = 1.5
    for name, blobs in folded.params.items():
        for a, b in zip(blobs, plain.params[name]):
            b.data[...] = a.data
    for name in folded.inputs:
        x = rng.standard_normal(folded.blobs[name].shape)
        folded.blobs[name].data[...] = x
        plain.blobs[name].data[...] = x
    return folded, plain


def assert_same(folded, plain, tol=1e-5):
    loss_f = folded.ForwardFromTo(0, len(folded.layers) - 1)
    loss_p = plain.ForwardFromTo(0, len(plain.layers) - 1)
    assert loss_f == pytest.approx(loss_p, rel=tol, abs=1e-12)
    for name in plain.blobs:
        a = np.asarray(folded.blobs[name].data, np.float64)
        b = np.asarray(plain.blobs[name].data, np.float64)
        assert a.shape == b.shape, name
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * max(float(np.abs(b).max(initial=0)), 1e-30),
                                   err_msg=name)


def units(net):
    return [u.names for u in net.fold_units]


# -- the switch -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, on", [("0", False), ("false", False), ("FALSE", False), (" Off ", False),
                                       ("no", False), ("No", False), ("1", True), ("", True), ("true", True),
                                       ("True", True), ("on", True), ("ON", True), ("yes", True), ("YES", True)])
def test_the_environment_switch_takes_any_case(monkeypatch, value, on):
    monkeypatch.setenv(fold.ENV, value)
    assert fold.fold_enabled() is on
    assert fold.fold_enabled(not on) is (not on)  # the argument wins


# -- the view watch ---------------------------------------------------------------------------------------

def test_the_view_count_baseline_is_that_of_a_fresh_memory():
    assert fold._calibrate() == fold._QUIET_REFS


def test_a_memory_never_written_is_not_quiet_and_is_left_unallocated():
    mem = SyncedMemory(16)
    assert not fold.quiet(mem)
    assert mem.head == UNINITIALIZED  # quiet() made no host copy


# -- which chains fold ------------------------------------------------------------------------------------

CHAINS = {
    # a second BatchNorm or Scale ends the chain (one of each folds)
    "bn-bn-scale": ([conv(), bn("bn1"), bn("bn2"), scale()], [["c", "bn1"]]),
    "scale-scale": ([conv(), scale("s1"), scale("s2")], [["c", "s1"]]),
    # a layer after the affine part that is no activation ends the chain
    "bn-pool": ([conv(), bn(), ("p", "Pooling", "c", "p", "pooling_param { pool: MAX kernel_size: 2 }")],
                [["c", "bn"]]),
    # a Scale over H (as many rows as channels, or two) is not per channel
    "scale-axis2-H=C": ([conv(n=3), bn(), scale(param="axis: 2 num_axes: 1 bias_term: true")], [["c", "bn"]]),
    "scale-axis2-H=2": ([conv(n=3, k=2), bn(), scale(param="axis: 2 num_axes: 1 bias_term: true")],
                        [["c", "bn"]]),
    # one scalar gamma folds, whatever the axis that names it
    "scale-scalar": ([conv(), bn(), scale(param="num_axes: 0 bias_term: true")], [["c", "bn", "s"]]),
    "scale-axis-minus4": ([conv(), bn(), scale(param="axis: -4 num_axes: 1 bias_term: true")],
                          [["c", "bn", "s"]]),
    # a count-1 Scale with two axes (H, W of 1): gamma and beta of shape (1, 1)
    "scale-1x1": ([conv(k=3), bn(), scale(param="axis: 2 num_axes: 2 bias_term: true")], [["c", "bn", "s"]]),
    # explicit use_global_stats: true folds; false (batch statistics in TEST) does not
    "bn-global-true": ([conv(), bn(body="batch_norm_param { use_global_stats: true }"), scale()],
                       [["c", "bn", "s"]]),
    "bn-global-false": ([conv(), bn(body="batch_norm_param { use_global_stats: false }"), scale()], []),
    # a loss top is never folded away (its loss would be lost); one that a layer also reads gets a Split
    # (the loss moves to it), so a BatchNorm's loss is only seen at the end of the net
    "bn-loss": ([conv(), bn(top="b", body="loss_weight: 1")], []),
    # a layer with parameters that is not a Convolution/InnerProduct is no producer
    "scale-then-bn": ([scale(bottom="data", top="x"), bn(bottom="x", top="x")], []),
    # an InnerProduct on axis 2: its outputs are not on the channel axis
    "ip-axis2": ([("ip", "InnerProduct", "data", "ip", f"inner_product_param {{ num_output: 3 axis: 2 {FILL} }}"),
                  bn(bottom="ip", top="ip"), scale(bottom="ip", top="ip")], []),
}
SHAPES = {"scale-axis2-H=C": (2, 3, 3, 4), "scale-axis2-H=2": (2, 3, 3, 4), "scale-axis-minus4": (1, 3, 3, 4),
          "scale-1x1": (2, 3, 3, 3), "scale-then-bn": (2, 3), "ip-axis2": (2, 3, 5)}


@pytest.mark.parametrize("case", sorted(CHAINS))
def test_which_chains_fold(case):
    layers, expected = CHAINS[case]
    folded, plain = twins(net_text(SHAPES.get(case, (2, 3, 3, 4)), *layers))
    assert units(folded) == expected
    assert_same(folded, plain)
    assert_same(folded, plain)  # the cached fold


@pytest.mark.parametrize("first", ["folds", "does not fold"])
def test_a_chain_right_after_another_producer_folds(first):
    # the layer right after a chain, or after a producer whose chain does not fold, is looked at too
    head = [conv("c1", top="c1"), bn("bn1", "c1", "c1")] if first == "folds" else [conv("c1", top="c1")]
    folded, plain = twins(net_text((2, 3, 3, 4), *head, conv("c2", "c1", "c2"), bn("bn2", "c2", "c2"),
                                   scale("s2", "c2", "c2")))
    assert units(folded) == ([["c1", "bn1"]] if first == "folds" else []) + [["c2", "bn2", "s2"]]
    assert_same(folded, plain)


def test_a_convolution_on_two_axes_folds():
    folded, plain = twins(net_text((2, 3), conv(), bn(), scale()))
    assert folded.blobs["c"].shape == (2, 4) and units(folded) == [["c", "bn", "s"]]
    assert_same(folded, plain)


def test_the_chain_is_logged():
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("caffe.net")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        Net(net_text((2, 3, 4, 4), conv(), bn(), scale(), ("r", "ReLU", "c", "c", "")), caffe.TEST, fold=True)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    assert "Inference folding: c <- bn, s, r" in [r.getMessage() for r in records]


# -- the folded map ---------------------------------------------------------------------------------------

def test_batchnorm_with_a_zero_factor_uses_zero_statistics_whatever_they_hold():
    # Caffe: scale_factor = blobs[2] == 0 ? 0 : 1 / blobs[2]; the stored sums are multiplied by it
    folded, plain = twins(net_text((2, 3, 4, 4), conv(), bn(), scale()))
    for net in (folded, plain):
        layer = net.layers[net.layer_names.index("bn")]
        layer.blobs[0].data[...] = [3.0, -2.0, 1.0, 5.0]
        layer.blobs[1].data[...] = [4.0, 0.5, 2.0, 9.0]
        layer.blobs[2].data[...] = 0.0
    assert_same(folded, plain)


@pytest.mark.parametrize("k_in, n_out", [(3, 5), (5, 2)])
def test_a_transposed_inner_product_folds_per_output(k_in, n_out):
    ip = ("ip", "InnerProduct", "data", "ip",
          f"inner_product_param {{ num_output: {n_out} transpose: true {FILL} }}")
    folded, plain = twins(net_text((2, k_in), ip, bn(bottom="ip", top="ip"), scale(bottom="ip", top="ip")))
    assert units(folded) == [["ip", "bn", "s"]]
    assert_same(folded, plain)


def test_the_folded_step_adds_no_loss():
    text = net_text((2, 3, 3, 4), conv(), bn(), scale(),
                    ("loss", "EuclideanLoss", "c", "loss", "")).replace('bottom: "c" top: "loss"',
                                                                         'bottom: "c" bottom: "c" top: "loss"')
    folded, plain = twins(text)
    assert units(folded) == [["c", "bn", "s"]]
    assert folded.ForwardFromTo(0, 3) == 0.0  # the folded step alone
    assert_same(folded, plain)


# -- the cache --------------------------------------------------------------------------------------------

def test_a_parameter_blob_replaced_in_the_layer_is_refolded():
    folded, plain = twins(net_text((2, 3, 3, 4), conv(), bn(), scale()))
    assert_same(folded, plain)
    for net in (folded, plain):
        layer = net.layers[net.layer_names.index("s")]
        new = Blob(layer.blobs[0].shape)
        new.data[...] = np.arange(1, 5) * 0.5
        layer.blobs[0] = new
    assert_same(folded, plain)


def test_a_parameter_blob_removed_from_the_layer_is_refolded():
    # a Scale's bias blob dropped from the list (the layer keeps bias_term): the folded map has no beta,
    # as an unfolded net whose beta is zero
    folded, plain = twins(net_text((2, 3, 3, 4), conv(), bn(), scale()))
    assert_same(folded, plain)
    folded.layers[folded.layer_names.index("s")].blobs.pop()
    plain.layers[plain.layer_names.index("s")].blobs[1].data[...] = 0
    folded.Forward()
    plain.Forward()
    np.testing.assert_allclose(folded.blobs["c"].data, plain.blobs["c"].data, rtol=1e-5, atol=1e-5)


# -- before any forward, errors, warnings -----------------------------------------------------------------

def test_backward_before_any_forward_is_not_refused():
    # a Scale out of place (its backward then needs no saved forward, BatchNorm's would)
    text = net_text((2, 3, 3, 4), conv(), scale(top="s"),
                    ("loss", "EuclideanLoss", "s", "loss", "")).replace('bottom: "s" top: "loss"',
                                                                         'bottom: "s" bottom: "s" top: "loss"')
    net = Net(text, caffe.TEST, fold=True)
    assert units(net) == [["c", "s"]] and net.layer_need_backward[net.layer_names.index("c")]
    last = net.layer_names.index("s")
    net.BackwardFrom(last)  # nothing ran folded yet
    net.Forward()
    with pytest.raises(NetError, match="fold=False"):
        net.BackwardFrom(last)


def test_an_error_in_the_folded_step_names_the_layers():
    net = Net(net_text((2, 3, 3, 4), conv(), bn(), scale()), caffe.TEST, fold=True)
    net.Forward()

    def boom(bottom, top):
        raise RuntimeError("boom")

    net.fold_units[0].clone.Forward = boom
    with pytest.raises(RuntimeError, match="boom") as info:
        net.Forward()
    assert info.value.__notes__ == ["in the forward pass of layers c, bn, s folded into one (build the net with "
                                    "fold=False to run them one by one)"]


def test_an_error_computing_a_pending_blob_names_the_layer():
    net = Net(net_text((2, 3, 3, 4), conv(), bn(top="b"), scale(bottom="b", top="b")), caffe.TEST, fold=True)
    net.Forward()
    assert net.blobs["c"]._lazy_pending

    def boom(bottom, top):
        raise RuntimeError("boom")

    net.layers[net.layer_names.index("c")].Forward = boom
    with pytest.raises(RuntimeError, match="boom") as info:
        net.blobs["c"].cpu_data()
    assert info.value.__notes__ == ["in the forward pass of layer 'c' (Convolution), run to compute a blob "
                                    "skipped by inference folding"]


def test_a_pending_blob_warns_only_when_its_bottom_was_written_after_the_forward(caplog):
    folded, plain = twins(net_text((2, 3, 3, 4), conv(), bn(top="b"), scale(bottom="b", top="s")))
    folded.Forward()
    plain.Forward()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="caffe.net"):
        np.testing.assert_array_equal(folded.blobs["b"].data, plain.blobs["b"].data)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    folded.Forward()
    folded.blobs["data"].data[...] += 1  # the same memory, a newer version
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="caffe.net"):
        folded.blobs["c"].cpu_data()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        "Folded layers c, bn, s: blob computed on demand from the current contents of its bottom, which was "
        "written after the forward (build the net with fold=False to keep the values of the forward)"]


# -- the net's side (caffe.net.net: the folded forward, unfolding, the switch, backward's guard) -----------

TWO_LOSSES = "\n".join([
    'layer { name: "data" type: "Input" top: "data" top: "t1" top: "t2" input_param { shape { dim: 2 dim: 3 '
    'dim: 3 dim: 4 } shape { dim: 2 dim: 3 dim: 3 dim: 4 } shape { dim: 2 dim: 4 dim: 3 dim: 4 } } }',
    'layer { name: "loss1" type: "EuclideanLoss" bottom: "data" bottom: "t1" top: "loss1" }',
    net_text((1,), conv(), bn(top="b"), scale(bottom="b", top="s")).split("\n", 1)[1],
    'layer { name: "p" type: "Pooling" bottom: "s" top: "p" pooling_param { pool: AVE kernel_size: 1 } }',
    'layer { name: "loss2" type: "EuclideanLoss" bottom: "p" bottom: "t2" top: "loss2" }',
])


def test_losses_before_and_after_a_folded_step_add_up():
    folded, plain = twins(TWO_LOSSES)
    assert units(folded) == [["c", "bn", "s"]]
    assert_same(folded, plain)
    assert float(folded.blobs["loss1"].data) > 0 and float(folded.blobs["loss2"].data) > 0


def test_an_error_in_a_layer_beside_the_folded_ones_names_it():
    net = Net(TWO_LOSSES, caffe.TEST, fold=True)
    net.Forward()

    def boom(bottom, top):
        raise RuntimeError("boom")

    net.layers[net.layer_names.index("p")].Forward = boom
    with pytest.raises(RuntimeError, match="boom") as info:
        net.Forward()
    assert info.value.__notes__ == ["in the forward pass of layer 'p' (Pooling)"]


def test_forward_from_the_chain_start_leaves_the_old_pending_blobs_alone(caplog):
    folded, plain = twins(TWO_LOSSES)
    unit = folded.fold_units[0]
    folded.Forward()
    folded.blobs["data"].data[...] += 1  # the next input, then a forward from the chain's first layer
    plain.blobs["data"].data[...] += 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="caffe.net"):
        folded.ForwardFrom(unit.first)
        plain.ForwardFrom(unit.first)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # nothing computed from old tops
    assert unit.ran_folded and folded.blobs["c"]._lazy_pending
    np.testing.assert_allclose(folded.blobs["s"].data, plain.blobs["s"].data, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(folded.blobs["c"].data, plain.blobs["c"].data)


def chains2():
    """Two chains, A (c1, bn1, s1: bn1's top not in place, so pending) and B (c2, bn2, s2), and a loss."""
    return "\n".join([
        'layer { name: "data" type: "Input" top: "data" top: "t" input_param { shape { dim: 2 dim: 3 dim: 3 '
        'dim: 4 } shape { dim: 2 dim: 4 dim: 3 dim: 4 } } }',
        net_text((1,), conv("c1", top="c1"), bn("bn1", "c1", "b1"), scale("s1", "b1", "b1"),
                 conv("c2", "b1", "c2"), bn("bn2", "c2", "b2"), scale("s2", "b2", "b2")).split("\n", 1)[1],
        'layer { name: "loss" type: "EuclideanLoss" bottom: "b2" bottom: "t" top: "loss" }'])


def test_a_forward_over_part_of_the_net_unfolds_only_the_chains_it_cuts():
    net = Net(chains2(), caffe.TEST, fold=True)
    a, b = net.fold_units
    assert a.names == ["c1", "bn1", "s1"] and b.names == ["c2", "bn2", "s2"]
    net.Forward()
    assert a.ran_folded and b.ran_folded and net.blobs["c2"]._lazy_pending
    net.ForwardFromTo(0, a.first + 1)  # cuts A: B's pending blob stays pending, B still ran folded
    assert not a.ran_folded and b.ran_folded and net.blobs["c2"]._lazy_pending
    net.Forward()
    net.ForwardFromTo(0, b.first)  # ends at B's first layer: B runs unfolded
    assert not b.ran_folded
    net.Forward()
    net.ForwardFromTo(b.first, b.first + 1)  # starts at B's first layer and cuts it
    assert not b.ran_folded


def test_backward_is_refused_over_any_layer_of_a_chain_that_ran_folded():
    net = Net(chains2(), caffe.TEST, fold=True)
    a, b = net.fold_units
    net.Forward()
    # (A lies before each range: the check goes on to B)
    for start, end in ((b.first, b.first), (len(net.layers) - 1, b.last), (b.last, b.first), (b.last, b.last)):
        with pytest.raises(NetError) as info:
            net.BackwardFromTo(start, end)
        assert str(info.value).startswith("Backward through layers c2, bn2, s2 of net ")
    net.BackwardFromTo(len(net.layers) - 1, b.last + 1)  # the loss alone: allowed


def test_turning_folding_off_and_on_again():
    net = Net(chains2(), caffe.TEST, fold=True)
    plain = Net(chains2(), caffe.TEST, fold=False)
    net.Forward()
    net.fold(False)
    assert not net.folded and not any(u.ran_folded for u in net.fold_units)
    net.Forward()
    net.Backward()  # ran unfolded: allowed
    # a net built with fold=False can turn it on
    assert not plain.fold_units
    plain.fold(True)
    assert plain.folded and units(plain) == [["c1", "bn1", "s1"], ["c2", "bn2", "s2"]]


def test_forward_steps_are_the_folded_steps():
    folded, plain = twins(chains2())
    steps = folded.forward_steps()
    a, b = folded.fold_units
    n = len(folded.layers)
    assert [(s, e) for s, e, _ in steps] == ([(i, i) for i in range(a.first)] + [(a.first, a.last), (b.first, b.last)]
                                             + [(i, i) for i in range(b.last + 1, n)])
    loss = sum(run() for _, _, run in steps)
    plain_loss = plain.Forward()
    assert loss == pytest.approx(plain_loss, rel=1e-5) and loss > 0
    np.testing.assert_allclose(folded.blobs["b2"].data, plain.blobs["b2"].data, rtol=1e-5, atol=1e-5)
    assert [(s, e) for s, e, _ in plain.forward_steps()] == [(i, i) for i in range(n)]

"""RNN and LSTM (unrolled internal nets): forward against a NumPy reference, gradient properties on tiny
T, N, num_output, Caffe's parameter layout, state carried between batches, expose_hidden, errors."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import caffe.net.recurrent  # noqa: F401  registers RNN and LSTM
from caffe.blob import context
from caffe.layers import LayerError, create_layer
from caffe.layers.strategies import seeds
from caffe.layers.testing import blobs_from_arrays, check_layer_gradient, empty_tops, make_layer, run_forward

FILLERS = "weight_filler { type: 'gaussian' std: 0.6 } bias_filler { type: 'gaussian' std: 0.6 }"


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def recurrent(type_name, num_output, expose=False, name="rnn", phase=0):
    text = f"recurrent_param {{ num_output: {num_output} {FILLERS} expose_hidden: {str(expose).lower()} }}"
    return make_layer(type_name, text, name=name, phase=phase)


def reference(type_name, blobs, x, cont, xs=None, h0=None, c0=None):
    """Caffe's recurrences, step by step, with the parameters in Caffe's order."""
    T, N = cont.shape
    p = [b.data for b in blobs]
    static = xs is not None
    if type_name == "RNN":
        W_xh, b_h = p[0], p[1]
        W_xs = p[2] if static else None
        W_hh, W_ho, b_o = p[2 + static:]
        H = b_h.shape[0]
        h = np.zeros((N, H)) if h0 is None else h0.reshape(N, H)
        outs = []
        for t in range(T):
            pre = (cont[t][:, None] * h) @ W_hh.T + x[t].reshape(N, -1) @ W_xh.T + b_h
            if static:
                pre = pre + xs.reshape(N, -1) @ W_xs.T
            h = np.tanh(pre)
            outs.append(np.tanh(h @ W_ho.T + b_o))
        return np.stack(outs), [h]
    W_xc, b_c = p[0], p[1]
    W_xs = p[2] if static else None
    W_hc = p[2 + static]
    H = b_c.shape[0] // 4
    h = np.zeros((N, H)) if h0 is None else h0.reshape(N, H)
    c = np.zeros((N, H)) if c0 is None else c0.reshape(N, H)
    outs = []
    for t in range(T):
        k = cont[t][:, None]
        g = (k * h) @ W_hc.T + x[t].reshape(N, -1) @ W_xc.T + b_c
        if static:
            g = g + xs.reshape(N, -1) @ W_xs.T
        i, f, o, gg = (g[:, j * H:(j + 1) * H] for j in range(4))  # Caffe's gate order
        c = k * sigmoid(f) * c + sigmoid(i) * np.tanh(gg)
        h = sigmoid(o) * np.tanh(c)
        outs.append(h)
    return np.stack(outs), [h, c]


@st.composite
def recurrent_case(draw):
    T, N, H = draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    x_shape = (T, N) + tuple(draw(st.lists(st.integers(1, 2), min_size=1, max_size=2)))
    static = draw(st.booleans())
    rng = np.random.default_rng(draw(seeds()))
    cont = rng.integers(0, 2, size=(T, N)).astype(float)
    cont[0] = 0  # a fresh sequence: the state left by earlier forwards does not matter
    xs = rng.normal(size=(N, draw(st.integers(1, 2)))) if static else None
    return rng.normal(size=x_shape), cont, xs, H


@pytest.mark.parametrize("type_name", ["RNN", "LSTM"])
@given(case=recurrent_case())
def test_recurrent_gradient_and_forward(type_name, case):
    x, cont, xs, H = case
    bottoms = [x, cont] + ([xs] if xs is not None else [])
    layer = recurrent(type_name, H)
    # x (and the parameters), then x_static: Caffe defines no gradient for cont
    check_layer_gradient(layer, bottoms, mode="single", check_bottom=0)
    if xs is not None:
        check_layer_gradient(layer, bottoms, mode="single", check_bottom=2)
    bottom, top = run_forward(layer, bottoms)
    want, _ = reference(type_name, layer.blobs, x, cont, xs)
    np.testing.assert_allclose(top[0].data, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("type_name", ["RNN", "LSTM"])
def test_recurrent_gradient_exhaustive(type_name):
    rng = np.random.default_rng(5)
    x, xs = rng.normal(size=(2, 2, 2)), rng.normal(size=(2, 1))
    cont = np.array([[0.0, 0.0], [1.0, 0.0]])
    check_layer_gradient(recurrent(type_name, 1), [x, cont, xs], check_bottom=0)


def test_parameter_layout_matches_caffe():
    x, cont, xs = np.zeros((3, 2, 4)), np.zeros((3, 2)), np.zeros((2, 5))
    rnn = recurrent("RNN", 6)
    run_forward(rnn, [x, cont, xs])
    # W_xh, b_h, W_xh_static, W_hh, W_ho, b_o
    assert [b.shape for b in rnn.blobs] == [(6, 4), (6,), (6, 5), (6, 6), (6, 6), (6,)]
    lstm = recurrent("LSTM", 3)
    run_forward(lstm, [x, cont])
    assert [b.shape for b in lstm.blobs] == [(12, 4), (12,), (12, 3)]  # W_xc b_c W_hc
    names = lstm.unrolled_net.layer_names
    assert "rnn_x_transform" in names and "rnn_unit_3" in names and names[-1] == "h_pseudoloss"
    # shared parameters: every time step's W_hc is the one blob
    ts = [lstm.unrolled_net.layer_by_name(f"rnn_transform_{t}") for t in (1, 2, 3)]
    ts[0].blobs[0].data[...] = 1.5
    assert all(np.all(t.blobs[0].data == 1.5) for t in ts) and np.all(lstm.blobs[2].data == 1.5)


@pytest.mark.parametrize("type_name", ["RNN", "LSTM"])
def test_state_carries_over_between_batches(type_name):
    rng = np.random.default_rng(1)
    x1, x2 = rng.normal(size=(2, 2, 3)), rng.normal(size=(2, 2, 3))
    cont1, cont2 = np.array([[0.0, 0.0], [1.0, 1.0]]), np.array([[1.0, 0.0], [1.0, 1.0]])
    layer = recurrent(type_name, 2)
    bottom, top = run_forward(layer, [x1, cont1])
    _, state = reference(type_name, layer.blobs, x1, cont1)
    bottom[0].data[...] = x2
    bottom[1].data[...] = cont2
    layer.Forward(bottom, top)
    want, _ = reference(type_name, layer.blobs, x2, cont2, None, *state)
    np.testing.assert_allclose(top[0].data, want, rtol=1e-10)
    layer.reset()  # forget the state: as if every sequence started fresh
    layer.Forward(bottom, top)
    np.testing.assert_allclose(top[0].data, reference(type_name, layer.blobs, x2, cont2)[0], rtol=1e-10)


@pytest.mark.parametrize("type_name", ["RNN", "LSTM"])
@given(seed=seeds(), static=st.booleans())
def test_expose_hidden(type_name, seed, static):
    rng = np.random.default_rng(seed)
    T, N, H = 2, 2, 1 + seed % 2
    x, cont = rng.normal(size=(T, N, 2)), rng.integers(0, 2, size=(T, N)).astype(float)
    xs = rng.normal(size=(N, 1)) if static else None
    n_state = 1 if type_name == "RNN" else 2
    states = [rng.normal(size=(1, N, H)) for _ in range(n_state)]
    layer = recurrent(type_name, H, expose=True)
    bottom, top = run_forward(layer, [x, cont] + ([xs] if static else []) + states, n_top=1 + n_state)
    want, final = reference(type_name, layer.blobs, x, cont, xs, *states)
    np.testing.assert_allclose(top[0].data, want, rtol=1e-10)
    for t, f in zip(top[1:], final):
        assert t.shape == (1, N, H)
        np.testing.assert_allclose(t.data[0], f, rtol=1e-10)
    # the gradient to x and the parameters through the outputs (Caffe sends none through the states)
    check_layer_gradient(OutputsOnly(layer, n_state), [x, cont] + ([xs] if static else []) + states,
                         mode="single", check_bottom=0)


class OutputsOnly:
    """Present only the first top to the gradient checker: the exposed final states carry data only."""

    def __init__(self, layer, n_extra):
        self.layer, self.blobs, self.name, self.type = layer, layer.blobs, layer.name, layer.type
        self.extra = empty_tops(n_extra)

    def SetUp(self, bottom, top):
        self.layer.SetUp(bottom, top + self.extra)

    def Forward(self, bottom, top):
        return self.layer.Forward(bottom, top + self.extra)

    def Backward(self, top, propagate_down, bottom):
        self.layer.Backward(top + self.extra, propagate_down, bottom)


def test_saved_layer_reloads_its_weights():
    rng = np.random.default_rng(2)
    x, cont = rng.normal(size=(2, 1, 2)), np.array([[0.0], [1.0]])
    a = recurrent("LSTM", 2)
    _, ta = run_forward(a, [x, cont])
    b = create_layer(a.to_proto())
    _, tb = run_forward(b, [x, cont])
    np.testing.assert_allclose(tb[0].data, ta[0].data, rtol=1e-6)


def test_recurrent_errors():
    x, cont = np.zeros((3, 2, 4)), np.zeros((3, 2))
    with pytest.raises(LayerError, match=r"Layer 'rnn' \(RNN\): bottom\[1\] \(cont\).*\(3, 2\).*got shape \(2, 3\)"):
        run_forward(recurrent("RNN", 2), [x, np.zeros((2, 3))])
    with pytest.raises(LayerError, match=r"num_output must be positive"):
        run_forward(make_layer("LSTM", "recurrent_param { }"), [x, cont])
    layer = recurrent("LSTM", 2)
    bottom, top = run_forward(layer, [x, cont])
    bottom[0].reshape(4, 2, 4)
    bottom[1].reshape(4, 2)
    with pytest.raises(LayerError, match=r"input number of timesteps changed.*\(4, 2, 4\).*T = 3"):
        layer.Forward(bottom, top)
    bottom[0].reshape(3, 2, 4)
    bottom[1].reshape(3, 2)
    layer.Forward(bottom, top)
    with pytest.raises(LayerError, match="Cannot backpropagate to sequence indicators"):
        layer.Backward(top, [True, True], bottom)
    with pytest.raises(LayerError, match=r"bottom\[2\] \(h_0\) must have the hidden state shape \(1, 2, 2\)"):
        run_forward(recurrent("RNN", 2, expose=True), [x, cont, np.zeros((1, 2, 3))], n_top=2)
    with pytest.raises(LayerError, match=r"expects at least 4 bottom"):
        run_forward(recurrent("LSTM", 2, expose=True), [x, cont, np.zeros((1, 2, 2))], n_top=3)


@pytest.mark.gpu
@pytest.mark.skipif(not context.gpu_available(), reason="no GPU (CuPy with a CUDA device) available")
@pytest.mark.parametrize("type_name", ["RNN", "LSTM"])
def test_recurrent_cpu_gpu_parity(type_name):
    rng = np.random.default_rng(3)
    arrays = [rng.normal(size=(3, 2, 3)), np.array([[0.0, 0.0], [1.0, 1.0], [1.0, 0.0]]), rng.normal(size=(2, 2))]
    results = []
    for mode in (context.CPU, context.GPU):
        context.set_mode(mode)
        try:
            context.set_random_seed(1701)
            layer = recurrent(type_name, 2)
            bottom, top = blobs_from_arrays(arrays, np.float32), empty_tops(1, np.float32)
            layer.SetUp(bottom, top)
            layer.Forward(bottom, top)
            top[0].diff[...] = rng.normal(size=top[0].shape) if not results else results[0][-1]
            dtop = top[0].diff.copy()
            for p in layer.blobs:
                p.diff[...] = 0
            layer.Backward(top, [True, False, True], bottom)
            results.append([top[0].data.copy(), bottom[0].diff.copy(), bottom[2].diff.copy()]
                           + [p.diff.copy() for p in layer.blobs] + [dtop])
        finally:
            context.set_mode_cpu()
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def _fwd_bwd(type_name, arrays, fwd, bwd, dtop_seed=5):
    try:
        context.set_mode(fwd)
        context.set_random_seed(1701)
        layer = recurrent(type_name, 2)
        bottom, top = blobs_from_arrays(arrays, np.float64), empty_tops(1, np.float64)
        layer.SetUp(bottom, top)
        layer.Forward(bottom, top)
        out = top[0].data.copy()
        top[0].diff[...] = np.random.default_rng(dtop_seed).normal(size=top[0].shape)
        for p in layer.blobs:
            p.diff[...] = 0
        context.set_mode(bwd)
        layer.Backward(top, [True, False, True], bottom)
        return [out, bottom[0].diff.copy(), bottom[2].diff.copy()] + [p.diff.copy() for p in layer.blobs]
    finally:
        context.set_mode_cpu()


@pytest.mark.gpu
@pytest.mark.skipif(not context.gpu_available(), reason="no GPU (CuPy with a CUDA device, or the CuPy stand-in)")
@pytest.mark.parametrize("type_name", ["RNN", "LSTM"])
@pytest.mark.parametrize("modes", [(context.CPU, context.GPU), (context.GPU, context.CPU)], ids=["cpu-gpu", "gpu-cpu"])
def test_recurrent_forward_and_backward_in_different_modes_equal_one_mode(type_name, modes):
    # the unrolled net keeps every state its Backward needs in its own blobs (issue 14, item 2)
    rng = np.random.default_rng(4)
    arrays = [rng.normal(size=(3, 2, 3)), np.array([[0.0, 0.0], [1.0, 1.0], [1.0, 0.0]]), rng.normal(size=(2, 2))]
    one = _fwd_bwd(type_name, arrays, modes[0], modes[0])
    mixed = _fwd_bwd(type_name, arrays, *modes)
    for a, b in zip(one, mixed):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-12)


NET = """
layer { name: "in" type: "Input" top: "x" top: "cont" top: "target"
        input_param { shape { dim: 3 dim: 2 dim: 4 } shape { dim: 3 dim: 2 } shape { dim: 3 dim: 2 dim: 1 } } }
layer { name: "lstm1" type: "LSTM" bottom: "x" bottom: "cont" top: "h"
        recurrent_param { num_output: 5 weight_filler { type: "uniform" min: -0.1 max: 0.1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "h" top: "y"
        inner_product_param { num_output: 1 axis: 2 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "target" top: "loss" }
"""


def test_lstm_in_a_net_learns_and_round_trips_a_caffemodel(tmp_path):
    from caffe.net import Net
    net = Net(NET, phase=0)
    assert [b.shape for b in net.params["lstm1"]] == [(20, 4), (20,), (20, 5)]
    rng = np.random.default_rng(0)
    net.blobs["x"].data[...] = rng.normal(size=(3, 2, 4))
    net.blobs["cont"].data[...] = [[0, 0], [1, 1], [1, 1]]
    net.blobs["target"].data[...] = 0.5
    losses = []
    for _ in range(20):
        net.ClearParamDiffs()
        losses.append(net.ForwardBackward())
        for b in net.learnable_params:
            b.data[...] -= 0.5 * b.diff
    assert losses[-1] < 0.1 * losses[0]
    path = str(tmp_path / "lstm.caffemodel")
    net.Save(path)
    test = Net(NET, phase=1, weights=path)
    for name in ("x", "cont"):
        test.blobs[name].data[...] = net.blobs[name].data
    net.Forward()
    test.Forward()
    np.testing.assert_allclose(test.blobs["h"].data, net.blobs["h"].data, rtol=1e-6)
    # a solver's test net shares (not copies) the trained weights, every time step included
    shared = Net(NET, phase=1)
    shared.ShareTrainedLayersWith(net)
    for name in ("x", "cont"):
        shared.blobs[name].data[...] = net.blobs[name].data
    shared.Forward()
    np.testing.assert_array_equal(shared.blobs["h"].data, net.blobs["h"].data)

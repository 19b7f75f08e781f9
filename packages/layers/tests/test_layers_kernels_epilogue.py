"""The convolution's forward epilogue (conv_base.BaseConvolutionLayer.epilogue): bias + ReLU/Clip fused into
the store of every plan, for inference folding. The reference is the layer without an epilogue followed by
the ReLU or Clip layer itself: the same bits on every plan (the stores round as the layer's kernels do).
"""
import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from caffe.layers import conv_base, conv_cpu
from caffe.layers.kernels import lowering
from caffe.layers.testing import blobs_from_arrays, empty_tops, make_layer

FILL = "weight_filler { type: 'gaussian' std: 0.7 } bias_filler { type: 'gaussian' std: 0.5 }"

ACTS = {  # name -> (epilogue, the layer that computes the same; its parameters are float32 in the proto)
    "relu": ((conv_base.ACT_RELU, 0.0, 0.0), ("ReLU", "")),
    "leaky": ((conv_base.ACT_RELU, float(np.float32(0.1)), 0.0), ("ReLU", "relu_param { negative_slope: 0.1 }")),
    "clip": ((conv_base.ACT_CLIP, -0.5, 0.75), ("Clip", "clip_param { min: -0.5 max: 0.75 }")),
}


def test_codes_match_the_kernel_enum():
    assert (conv_base.ACT_NONE, conv_base.ACT_RELU, conv_base.ACT_CLIP) == \
        tuple(int(v) for v in (lowering.Act.ACT_NONE, lowering.Act.ACT_RELU, lowering.Act.ACT_CLIP))
    with pytest.raises(ValueError, match="unknown activation code 7"):
        lowering.bias_act(np.zeros(4, np.float32), None, 1, 1, 4, 0, 4, 7, 0.0, 0.0)
    with pytest.raises(ValueError, match="unknown activation code 3"):
        conv_base.apply_epilogue(np, np.zeros(4, np.float32), (3, 0.0, 0.0))


def _act_ref(y, act):
    code, a, b = act
    y = y.copy()
    if code == conv_base.ACT_RELU:
        if a == 0:  # Caffe's max(x, 0): NaN stays NaN
            y[y <= 0] = 0
        else:
            neg = ~(y > 0)
            y[neg] = y[neg] * y.dtype.type(a)
    elif code == conv_base.ACT_CLIP:
        y = np.where(y < y.dtype.type(a), y.dtype.type(a), y)
        y = np.where(y > y.dtype.type(b), y.dtype.type(b), y)
    return y


@given(nb=st.integers(1, 3), C=st.integers(1, 5), P=st.integers(1, 40), data=st.data(), bias=st.booleans(),
       dtype=st.sampled_from([np.float32, np.float64]), act=st.sampled_from(sorted(ACTS)))
@example(nb=1, C=2, P=3, data=None, bias=False, dtype=np.float32, act="relu")  # NaN and -0 below
def test_bias_act_and_rows_to_batch_against_numpy(nb, C, P, data, bias, dtype, act):
    p0 = data.draw(st.integers(0, P - 1)) if data is not None else 0
    Pb = data.draw(st.integers(1, P - p0)) if data is not None else P
    code = ACTS[act][0]
    rng = np.random.default_rng(nb * 1000 + C * 100 + P)
    out = rng.normal(size=(nb, C, P)).astype(dtype)
    out.reshape(-1)[::5] = np.nan if act == "relu" else out.reshape(-1)[::5]
    b = rng.normal(size=C).astype(dtype) if bias else None
    start = out.copy()
    lowering.bias_act(out.reshape(-1), b, nb, C, P, p0, Pb, *code)
    blk = start[:, :, p0:p0 + Pb] + (b.reshape(1, C, 1) if bias else 0)
    np.testing.assert_array_equal(out[:, :, p0:p0 + Pb], _act_ref(blk, code))
    np.testing.assert_array_equal(out[:, :, :p0], start[:, :, :p0])  # outside the block: untouched
    np.testing.assert_array_equal(out[:, :, p0 + Pb:], start[:, :, p0 + Pb:])
    rows = rng.normal(size=(C, nb * Pb)).astype(dtype)
    stored = start.copy()
    lowering.rows_to_batch(rows.reshape(-1), stored.reshape(-1), b, nb, C, P, p0, Pb, *code)
    blk = rows.reshape(C, nb, Pb).transpose(1, 0, 2) + (b.reshape(1, C, 1) if bias else 0)
    np.testing.assert_array_equal(stored[:, :, p0:p0 + Pb], _act_ref(blk, code))
    if dtype == np.float32:  # the exact forward's store: float64 sums rounded once, then the activation
        sums = rng.normal(size=(C, nb * Pb))
        b64 = rng.normal(size=C) if bias else None
        out32 = start.copy()
        lowering.rows_to_batch_f32(sums.reshape(-1), out32.reshape(-1), b64, nb, C, P, p0, Pb, *code)
        ref = (sums.reshape(C, nb, Pb).transpose(1, 0, 2) + (b64.reshape(1, C, 1) if bias else 0))
        np.testing.assert_array_equal(out32[:, :, p0:p0 + Pb], _act_ref(ref.astype(np.float32), code))


# -- every plan: the layer with an epilogue == the layer, then the ReLU / Clip layer ------------------

PLANS = {  # name -> (convolution_param text, channels, spatial size)
    "1x1": ("num_output: 6 kernel_size: 1", 5, 9),
    "1x1 small images": ("num_output: 6 kernel_size: 1", 5, 3),
    "exact (K <= 32)": ("num_output: 4 kernel_size: 3 pad: 1", 3, 7),
    "blocked": ("num_output: 5 kernel_size: 3 pad: 1 stride: 2", 6, 9),
    "direct (depthwise)": ("num_output: 6 kernel_size: 3 pad: 1 group: 6", 6, 8),
    "dense": ("num_output: 8 kernel_size: 3 pad: 1", 8, 10),
    "batched (generic)": ("num_output: 5 kernel_size: 3 pad: 1", 6, 9),
}


@pytest.mark.parametrize("plan", sorted(PLANS))
@pytest.mark.parametrize("act", sorted(ACTS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_plan_fuses_the_activation_bit_for_bit(plan, act, dtype, monkeypatch):
    param, C, S = PLANS[plan]
    text = f"convolution_param {{ {param} {FILL} }}"
    x = np.random.default_rng(len(plan) * 7 + len(act)).normal(size=(3, C, S, S)).astype(dtype)
    monkeypatch.setattr(conv_base, "CPU_PATHS", plan != "batched (generic)")
    if plan == "dense":
        monkeypatch.setattr(conv_cpu, "DENSE", "on")
    epilogue, act_text = ACTS[act]
    outs, plans = [], []
    for fused in (True, False):  # the same weights (the fillers' seed), with and without the epilogue
        layer = make_layer("Convolution", text)
        bottom, top = blobs_from_arrays([x], dtype), empty_tops(1, dtype)
        layer.SetUp(bottom, top)
        if fused:
            layer.epilogue = epilogue
            layer.Forward(bottom, top)
        else:
            layer.blobs[0].data[...] = weights
            layer.blobs[1].data[...] = bias
            layer.Forward(bottom, top)
            a = make_layer(*act_text)
            a.SetUp(top, top)
            a.Forward(top, top)
        weights, bias = layer.blobs[0].data.copy(), layer.blobs[1].data.copy()
        outs.append(top[0].data.copy())
        plans.append(layer.plan(np, x.dtype))
    np.testing.assert_array_equal(outs[0], outs[1])
    assert plans[0] == plans[1]
    expect = {"1x1": "1x1", "1x1 small images": "1x1", "direct (depthwise)": "direct",
              "batched (generic)": "batched", "exact (K <= 32)": "blocked", "blocked": "blocked"}.get(plan)
    if plan == "dense":
        expect = "dense" if dtype == np.float32 and conv_cpu._DENSE_SUPPORTED else "blocked"
    assert plans[0] == expect
    if plan == "exact (K <= 32)":
        assert layer.exact_forward(np.float32)
    if epilogue[0] == conv_base.ACT_RELU:  # the activation did something on this draw
        assert (outs[0] == 0).any() if epilogue[1] == 0 else (outs[0] < 0).any()


@pytest.mark.parametrize("slope", [0.0, 0.25])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_keeps_nan_as_caffe_on_every_path(slope, dtype):
    """Caffe's ReLU, max(x, 0) + slope * min(x, 0), passes NaN on (a diverging net shows its NaN loss):
    the CPU layer's kernel, its generic path (the GPU's code), and the convolution epilogue's three CPU
    forms (bias_act, rows_to_batch, apply_epilogue) all keep it; negatives go to 0 (or slope * x)."""
    from caffe.layers.testing import blobs_from_arrays, empty_tops, make_layer
    x = np.array([np.nan, -2.0, -0.0, 0.0, 3.0, -np.inf, np.inf], dtype)
    with np.errstate(invalid="ignore"):
        want = np.where(x <= 0, 0, x) if slope == 0 else np.where(x > 0, x, x * dtype(slope))
    assert np.isnan(want[0])
    layer = make_layer("ReLU", f"relu_param {{ negative_slope: {slope} }}")
    bottom, top = blobs_from_arrays([x], dtype), empty_tops(1, dtype)
    layer.SetUp(bottom, top)
    layer.Forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, want)
    top[0].data[...] = 7
    layer.forward_xp(np, bottom, top)
    np.testing.assert_array_equal(top[0].data, want)
    code = (conv_base.ACT_RELU, slope, 0.0)
    out = x.reshape(1, 1, -1).copy()
    lowering.bias_act(out.reshape(-1), None, 1, 1, x.size, 0, x.size, *code)
    np.testing.assert_array_equal(out.reshape(-1), want)
    stored = np.empty_like(out)
    lowering.rows_to_batch(x.copy(), stored.reshape(-1), None, 1, 1, x.size, 0, x.size, *code)
    np.testing.assert_array_equal(stored.reshape(-1), want)
    generic = x.copy()
    conv_base.apply_epilogue(np, generic, code)
    np.testing.assert_array_equal(generic, want)

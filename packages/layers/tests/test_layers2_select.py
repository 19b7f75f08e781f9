"""Eltwise, Filter, BatchReindex, ArgMax, Reduction, Embed: gradients, forward properties, errors."""
import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from caffe.layers import LayerError
from caffe.layers.strategies import random_array, seeds, shapes
from caffe.layers.testing import check_layer_gradient, make_layer, run_forward

small = shapes(1, 4, 1, 3).filter(lambda s: int(np.prod(s)) <= 24)


def distinct_arrays(seed, shape, n):
    """n arrays whose entries are all at least 0.02 apart: no ties within the checker's step."""
    count = int(np.prod(shape))
    values = np.random.default_rng(seed).permutation(n * count) * 0.02 - 0.01 * n * count
    return [values[i * count:(i + 1) * count].reshape(shape) for i in range(n)]


# -- Eltwise ----------------------------------------------------------------------------------------
@given(shape=small, seed=seeds(), n=st.integers(2, 4),
       coeff=st.lists(st.sampled_from([1.0, -0.5, 2.0, 0.0]), min_size=4, max_size=4), use_coeff=st.booleans())
def test_eltwise_sum_gradient(shape, seed, n, coeff, use_coeff):
    xs = [random_array(seed + i, shape) for i in range(n)]
    coeff = coeff[:n] if use_coeff else [1.0] * n
    text = "eltwise_param { operation: SUM " + (" ".join(f"coeff: {c}" for c in coeff) if use_coeff else "") + " }"
    layer = make_layer("Eltwise", text)
    bottom, top = check_layer_gradient(layer, xs, mode="eltwise")
    layer.Forward(bottom, top)
    np.testing.assert_allclose(top[0].data, sum(c * x for c, x in zip(coeff, xs)))


@given(shape=small, seed=seeds(), n=st.integers(2, 4), stable=st.booleans())
def test_eltwise_prod_gradient(shape, seed, n, stable):
    # away from 0 so the unstable top / bottom[i] form is well defined
    xs = [np.where(a < 0, a - 0.3, a + 0.3) for a in (random_array(seed + i, shape) for i in range(n))]
    layer = make_layer("Eltwise", f"eltwise_param {{ operation: PROD stable_prod_grad: {str(stable).lower()} }}")
    bottom, top = check_layer_gradient(layer, xs, mode="eltwise")
    layer.Forward(bottom, top)
    np.testing.assert_allclose(top[0].data, np.prod(xs, axis=0))


@given(shape=small, seed=seeds(), n=st.integers(2, 4))
def test_eltwise_max_gradient(shape, seed, n):
    xs = distinct_arrays(seed, shape, n)
    layer = make_layer("Eltwise", "eltwise_param { operation: MAX }")
    bottom, top = check_layer_gradient(layer, xs, mode="eltwise")
    layer.Forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, np.max(xs, axis=0))


def test_eltwise_max_ties_follow_caffe():
    # bottom[1] wins a tie with bottom[0]; a later bottom must be strictly larger
    layer = make_layer("Eltwise", "eltwise_param { operation: MAX }")
    bottom, top = run_forward(layer, [np.ones(2), np.ones(2), np.array([1.0, 2.0])])
    top[0].diff[...] = 1
    layer.Backward(top, [True] * 3, bottom)
    np.testing.assert_array_equal([b.diff for b in bottom], [[0, 0], [1, 0], [0, 1]])


def test_eltwise_errors():
    with pytest.raises(LayerError, match=r"Eltwise.*bottom\[0\] has shape \(2, 3\), bottom\[1\] has shape \(3, 2\)"):
        run_forward(make_layer("Eltwise"), [np.zeros((2, 3)), np.zeros((3, 2))])
    with pytest.raises(LayerError, match=r"one coefficient per bottom blob: 1 eltwise_param.coeff for 2 bottoms"):
        run_forward(make_layer("Eltwise", "eltwise_param { coeff: 1 }"), [np.zeros(2)] * 2)
    with pytest.raises(LayerError, match=r"only takes coefficients for summation"):
        run_forward(make_layer("Eltwise", "eltwise_param { operation: PROD coeff: 1 coeff: 2 }"), [np.zeros(2)] * 2)


# -- Filter / BatchReindex ---------------------------------------------------------------------------
@given(shape=small, seed=seeds(), n_data=st.integers(1, 2), data=st.data())
def test_filter_gradient_and_varying_count(shape, seed, n_data, data):
    xs = [random_array(seed + i, shape) for i in range(n_data)]
    sel = np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0, 3.0]), min_size=shape[0], max_size=shape[0])))
    sel_shape = data.draw(st.sampled_from([(shape[0],), (shape[0], 1), (shape[0], 1, 1)]))
    layer = make_layer("Filter")
    for i in range(n_data):
        # 'single' mode (0.5 * sum of top^2): the top count changes after setup, exhaustive mode would not
        bottom, top = check_layer_gradient(layer, xs + [sel.reshape(sel_shape)], n_top=n_data, check_bottom=i,
                                           mode="single")
    layer.Forward(bottom, top)
    keep = sel != 0
    for t, x in zip(top, xs):
        assert t.shape == (int(keep.sum()),) + shape[1:]
        np.testing.assert_array_equal(t.data, x[keep])
    for t in top:
        t.diff[...] = 1
    layer.Backward(top, [True] * n_data + [False], bottom)
    for b in bottom[:-1]:
        np.testing.assert_array_equal(b.diff, np.broadcast_to(keep.reshape((-1,) + (1,) * (len(shape) - 1)), shape))
    with pytest.raises(LayerError, match=r"Filter.*cannot backpropagate to the filter index input"):
        layer.Backward(top, [True] * (n_data + 1), bottom)


def test_filter_errors():
    with pytest.raises(LayerError, match=r"Selector blob.*singletons.*\(3, 2\)"):
        run_forward(make_layer("Filter"), [np.zeros((3, 2)), np.zeros((3, 2))])
    with pytest.raises(LayerError, match=r"same 0th dimension.*bottom\[0\] has shape \(4, 2\).*\(3,\)"):
        run_forward(make_layer("Filter"), [np.zeros((4, 2)), np.zeros(3)])


@given(shape=small, seed=seeds(), data=st.data())
def test_batch_reindex_gradient(shape, seed, data):
    x = random_array(seed, shape)
    idx = np.array(data.draw(st.lists(st.integers(0, shape[0] - 1), min_size=1, max_size=5)), dtype=float)
    layer = make_layer("BatchReindex")
    bottom, top = check_layer_gradient(layer, [x, idx], check_bottom=0)
    layer.Forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, x[idx.astype(int)])
    top[0].diff[...] = 1
    layer.Backward(top, [True, False], bottom)
    counts = np.bincount(idx.astype(int), minlength=shape[0]).astype(float)
    counts = counts.reshape((-1,) + (1,) * (len(shape) - 1))
    np.testing.assert_array_equal(bottom[0].diff, np.broadcast_to(counts, shape))


def test_batch_reindex_errors():
    with pytest.raises(LayerError, match=r"BatchReindex.*index 3.0 .*batch size 3"):
        run_forward(make_layer("BatchReindex"), [np.zeros((3, 2)), np.array([0.0, 3.0])])
    with pytest.raises(LayerError, match=r"index -1.0"):
        run_forward(make_layer("BatchReindex"), [np.zeros((3, 2)), np.array([-1.0])])
    with pytest.raises(LayerError, match=r"bottom\[1\] \(the indices\) must be 1-D"):
        run_forward(make_layer("BatchReindex"), [np.zeros((3, 2)), np.zeros((1, 1))])


# -- ArgMax (forward only) ------------------------------------------------------------------------------
def argmax_reference(x, top_k, out_max_val, axis):
    """Caffe's ranking: descending value, ties by the larger index."""
    if axis is None:
        v = x.reshape(x.shape[0], -1)
        rows = []
        for r in v:
            order = sorted(range(len(r)), key=lambda j: (r[j], j), reverse=True)[:top_k]
            rows.append(order + ([r[j] for j in order] if out_max_val else []))
        shape = [1] * max(x.ndim, 3)
        shape[0], shape[1], shape[2] = x.shape[0], 2 if out_max_val else 1, top_k
        return np.array(rows, dtype=float).reshape(shape)
    moved = np.moveaxis(x, axis, -1)
    out = np.empty(moved.shape[:-1] + (top_k,))
    for pos in np.ndindex(moved.shape[:-1]):
        r = moved[pos]
        order = sorted(range(len(r)), key=lambda j: (r[j], j), reverse=True)[:top_k]
        out[pos] = [r[j] for j in order] if out_max_val else order
    return np.moveaxis(out, -1, axis)


@given(shape=small, seed=seeds(), out_max_val=st.booleans(), use_axis=st.booleans(), ties=st.booleans(),
       data=st.data())
def test_argmax_forward(shape, seed, out_max_val, use_axis, ties, data):
    x = random_array(seed, shape)
    if ties:
        x = np.round(x * 2) / 2  # few distinct values: exercises the tie rule
    axis = data.draw(st.integers(-len(shape), len(shape) - 1)) if use_axis else None
    limit = shape[axis] if use_axis else int(np.prod(shape[1:]))
    top_k = data.draw(st.integers(1, limit))
    text = f"argmax_param {{ top_k: {top_k} out_max_val: {str(out_max_val).lower()} " + \
        (f"axis: {axis} " if use_axis else "") + "}"
    _, top = run_forward(make_layer("ArgMax", text), [x])
    want = argmax_reference(x, top_k, out_max_val, axis)
    assert top[0].shape == want.shape
    np.testing.assert_array_equal(top[0].data, want)


def test_argmax_ties_on_a_long_axis_go_to_the_larger_index():
    # a long axis (NumPy's default sort is not stable there): equal values rank by the larger index
    rng = np.random.default_rng(0)
    x = rng.integers(0, 3, size=(2, 64)).astype(float)
    _, top = run_forward(make_layer("ArgMax", "argmax_param { top_k: 20 }"), [x])
    np.testing.assert_array_equal(top[0].data, argmax_reference(x, 20, False, None))
    _, top = run_forward(make_layer("ArgMax", "argmax_param { top_k: 20 axis: 1 out_max_val: false }"), [x])
    np.testing.assert_array_equal(top[0].data, argmax_reference(x, 20, False, 1))


def test_argmax_errors():
    with pytest.raises(LayerError, match=r"ArgMax.*top_k 4 must be less than or equal.*\(2, 3\)"):
        run_forward(make_layer("ArgMax", "argmax_param { top_k: 4 }"), [np.zeros((2, 3))])
    with pytest.raises(LayerError, match=r"top_k 3 .*axis 0 of bottom\[0\] with shape \(2, 3\)"):
        run_forward(make_layer("ArgMax", "argmax_param { top_k: 3 axis: 0 }"), [np.zeros((2, 3))])
    layer = make_layer("ArgMax")
    bottom, top = run_forward(layer, [np.zeros((2, 3))])
    with pytest.raises(LayerError, match="no backward"):
        layer.Backward(top, [True], bottom)


# -- Reduction ------------------------------------------------------------------------------------------
# every operation at least once under the derandomized CI profile, with a coefficient and an inner axis
@given(shape=small, seed=seeds(), op=st.sampled_from(["SUM", "ASUM", "SUMSQ", "MEAN"]),
       coeff=st.sampled_from([1.0, -0.5, 2.0]), axis=st.integers(-4, 3))
@example(shape=(2, 3, 2), seed=1, op="SUM", coeff=-0.5, axis=1)
@example(shape=(2, 3, 2), seed=2, op="ASUM", coeff=2.0, axis=1)
@example(shape=(3, 4), seed=3, op="SUMSQ", coeff=-0.5, axis=0)
@example(shape=(2, 2, 3), seed=4, op="MEAN", coeff=2.0, axis=-1)
def test_reduction_gradient(shape, seed, op, coeff, axis):
    x = random_array(seed, shape)
    if op == "ASUM":  # |x| has a kink at 0
        x = np.where(np.abs(x) < 0.01, 0.05, x)
    axis = max(-len(shape), min(axis, len(shape) - 1))
    layer = make_layer("Reduction", f"reduction_param {{ operation: {op} axis: {axis} coeff: {coeff} }}")
    bottom, top = check_layer_gradient(layer, [x])
    layer.Forward(bottom, top)
    a = axis % len(shape)
    r = x.reshape(int(np.prod(shape[:a])), -1)
    f = {"SUM": r.sum(1), "ASUM": np.abs(r).sum(1), "SUMSQ": (r * r).sum(1), "MEAN": r.mean(1)}[op]
    assert top[0].shape == shape[:a]
    np.testing.assert_allclose(top[0].data.reshape(-1), coeff * f, rtol=1e-12)


# -- Embed ------------------------------------------------------------------------------------------------
@given(shape=shapes(1, 3, 1, 3), seed=seeds(), k=st.integers(1, 5), n=st.integers(1, 4), bias=st.booleans())
@example(shape=(2, 3), seed=1, k=4, n=3, bias=True)
@example(shape=(3,), seed=2, k=2, n=2, bias=False)
def test_embed_gradient(shape, seed, k, n, bias):
    idx = np.random.default_rng(seed).integers(0, k, size=shape).astype(float)
    text = (f"embed_param {{ num_output: {n} input_dim: {k} bias_term: {str(bias).lower()} "
            "weight_filler { type: 'gaussian' } bias_filler { type: 'gaussian' } }")
    layer = make_layer("Embed", text)
    bottom, top = check_layer_gradient(layer, [idx], check_bottom=-2)
    layer.Forward(bottom, top)
    want = layer.blobs[0].data[idx.astype(int)] + (layer.blobs[1].data if bias else 0)
    assert top[0].shape == shape + (n,)
    np.testing.assert_allclose(top[0].data, want)


def test_embed_errors():
    text = "embed_param { num_output: 2 input_dim: 3 }"
    with pytest.raises(LayerError, match=r"Embed.*index 3.0 in bottom\[0\].*input_dim = 3"):
        run_forward(make_layer("Embed", text), [np.array([0.0, 3.0])])
    with pytest.raises(LayerError, match=r"index 1.5"):
        run_forward(make_layer("Embed", text), [np.array([1.5])])
    with pytest.raises(LayerError, match=r"num_output must be positive"):
        run_forward(make_layer("Embed", "embed_param { input_dim: 3 }"), [np.array([0.0])])
    layer = make_layer("Embed", text)
    bottom, top = run_forward(layer, [np.array([1.0])])
    with pytest.raises(LayerError, match="Can't backpropagate to EmbedLayer input"):
        layer.Backward(top, [True], bottom)


def test_embed_checks_stored_blobs_dims_and_dtypes():
    text = "embed_param { num_output: 2 input_dim: 3 bias_term: true }"
    with pytest.raises(LayerError, match=r"embed_param.input_dim must be positive"):
        run_forward(make_layer("Embed", "embed_param { num_output: 2 input_dim: 0 }"), [np.array([0.0])])
    layer = make_layer("Embed", text)
    run_forward(layer, [np.array([0.0, 2.0])])
    from caffe.layers import create_layer
    proto = layer.to_proto()
    proto.embed_param.input_dim = 4  # the stored weights are 3 x 2
    with pytest.raises(LayerError, match=r"stored blobs have shapes \[\(3, 2\), \(2,\)\], expected "
                                         r"\[\(4, 2\), \(2,\)\]"):
        run_forward(create_layer(proto), [np.array([0.0])])
    # without a bias the stored weights alone are what is expected, and are used as they are
    layer = make_layer("Embed", "embed_param { num_output: 2 input_dim: 3 bias_term: false }")
    run_forward(layer, [np.array([0.0])])
    layer.blobs[0].data[...] = np.arange(6.0).reshape(3, 2)
    _, top = run_forward(create_layer(layer.to_proto()), [np.array([2.0, 1.0])])
    np.testing.assert_array_equal(top[0].data, [[4.0, 5.0], [2.0, 3.0]])
    assert not layer.allow_force_backward(0)  # the indices get no gradient, even forced
    for dtype in (np.float32, np.float64):  # parameters follow the bottom's dtype
        layer = make_layer("Embed", text)
        run_forward(layer, [np.array([1.0])], dtype=dtype)
        assert [b.dtype for b in layer.blobs] == [dtype, dtype]

"""Flatten, Reshape, Split, Concat, Slice, Tile, Crop, Silence, Parameter: gradients, sharing, errors."""
import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from caffe.blob import Blob
from caffe.layers import LayerError, create_layer
from caffe.layers.strategies import random_array, seeds, shapes
from caffe.layers.testing import check_layer_gradient, make_layer, run_forward

small = shapes(1, 4, 1, 3).filter(lambda s: int(np.prod(s)) <= 24)


# -- Flatten / Reshape share memory ------------------------------------------------------------
@st.composite
def flatten_case(draw):
    shape = draw(small)
    n = len(shape)
    a = draw(st.integers(0, n - 1))
    e = draw(st.integers(a, n - 1))
    # express each axis either directly or from the end
    axis = draw(st.sampled_from([a, a - n]))
    end_axis = draw(st.sampled_from([e, e - n]))
    return shape, axis, end_axis, a, e, draw(seeds())


@given(case=flatten_case())
def test_flatten_shape_gradient_and_sharing(case):
    shape, axis, end_axis, a, e, seed = case
    x = random_array(seed, shape)
    layer = make_layer("Flatten", f"flatten_param {{ axis: {axis} end_axis: {end_axis} }}")
    bottom, top = check_layer_gradient(layer, [x])
    want = shape[:a] + (int(np.prod(shape[a:e + 1])),) + shape[e + 1:]
    assert top[0].shape == want
    bottom[0].data[...] = x + 1  # writing the bottom shows in the top: shared, not copied
    np.testing.assert_array_equal(top[0].data.ravel(), (x + 1).ravel())
    top[0].diff[...] = 3
    np.testing.assert_array_equal(bottom[0].diff, 3)


@st.composite
def reshape_case(draw):
    shape = draw(small)
    n = len(shape)
    start = draw(st.integers(0, n))
    end = draw(st.integers(start, n))
    part = list(shape[start:end])
    # new dims for the replaced part: regroup its elements, then mark some with 0 (copy) or -1 (infer)
    count = int(np.prod(part)) if part else 1
    dims = draw(st.sampled_from([[count], [1, count], [count, 1], part or [1]]))
    if dims == part and part:
        k = draw(st.integers(0, len(part) - 1))
        dims = list(dims)
        dims[k] = draw(st.sampled_from([0, -1, dims[k]]))
    elif draw(st.booleans()):
        dims = list(dims)
        dims[draw(st.integers(0, len(dims) - 1))] = -1
    axis = draw(st.sampled_from([start, start - n - 1]))
    num_axes = end - start if end < n or draw(st.booleans()) else -1
    return shape, axis, num_axes, dims, start, end, draw(seeds())


@given(case=reshape_case())
def test_reshape_shape_gradient_and_sharing(case):
    shape, axis, num_axes, dims, start, end, seed = case
    x = random_array(seed, shape)
    text = "reshape_param { shape { " + " ".join(f"dim: {d}" for d in dims) + \
        f" }} axis: {axis} num_axes: {num_axes} }}"
    layer = make_layer("Reshape", text)
    bottom, top = check_layer_gradient(layer, [x])
    part = int(np.prod(shape[start:end]))
    new = [shape[start + i] if d == 0 else d for i, d in enumerate(dims)]
    if -1 in new:
        known = int(np.prod([d for d in new if d != -1]))
        new[new.index(-1)] = part // known
    assert top[0].shape == shape[:start] + tuple(new) + shape[end:]
    bottom[0].data[...] = 2 * x
    np.testing.assert_array_equal(top[0].data.ravel(), (2 * x).ravel())


def test_reshape_examples_from_caffe():
    x = np.zeros((2, 3, 4, 5))
    cases = {"shape { dim: 0 dim: -1 }": (2, 60),
             # copied (0) dims after a non-zero axis copy the axes they stand for
             "shape { dim: 0 dim: 0 dim: -1 } axis: 1": (2, 3, 4, 5),
             "shape { dim: 0 dim: 2 dim: 0 dim: -1 } axis: 1 num_axes: 3": (2, 3, 2, 5, 2),
             "shape { dim: 0 dim: 2 dim: 3 dim: -1 }": (2, 2, 3, 10),
             "shape { dim: 6 } axis: 0 num_axes: 2": (6, 4, 5),
             "shape { dim: 1 } axis: -1 num_axes: 0": (2, 3, 4, 5, 1),
             "shape { dim: 1 dim: 1 } axis: 1 num_axes: 0": (2, 1, 1, 3, 4, 5)}
    for text, want in cases.items():
        _, top = run_forward(make_layer("Reshape", f"reshape_param {{ {text} }}"), [x])
        assert top[0].shape == want, text


def test_reshape_errors():
    x = [np.zeros((2, 3, 4))]
    with pytest.raises(LayerError, match=r"Reshape.*\[5, -1\].*24.*\(2, 3, 4\).*not divisible by 5"):
        run_forward(make_layer("Reshape", "reshape_param { shape { dim: 5 dim: -1 } }"), x)
    with pytest.raises(LayerError, match=r"output count must match input count.*\[5, 5\].*\(5, 5\).*\(2, 3, 4\)"):
        run_forward(make_layer("Reshape", "reshape_param { shape { dim: 5 dim: 5 } }"), x)
    with pytest.raises(LayerError, match=r"\[-1, -1\] contains multiple -1 dims"):
        run_forward(make_layer("Reshape", "reshape_param { shape { dim: -1 dim: -1 } }"), x)
    with pytest.raises(LayerError, match=r"contains a 0 at position 3.*no axis 3"):
        run_forward(make_layer("Reshape", "reshape_param { shape { dim: 0 dim: 0 dim: 0 dim: 0 } }"), x)
    with pytest.raises(LayerError, match=r"reshape_param.axis 4 is out of range"):
        run_forward(make_layer("Reshape", "reshape_param { shape { dim: 1 } axis: 4 }"), x)
    with pytest.raises(LayerError, match=r"reshape_param.shape \[-2, 12\] has invalid dimension\(s\) \[-2\]"):
        run_forward(make_layer("Reshape", "reshape_param { shape { dim: -2 dim: 12 } }"), x)
    with pytest.raises(LayerError, match=r"reshape_param.num_axes must be >= -1, got -2"):
        run_forward(make_layer("Reshape", "reshape_param { shape { dim: 1 } num_axes: -2 }"), x)
    with pytest.raises(LayerError, match=r"flatten_param.axis 3 is out of range"):
        run_forward(make_layer("Flatten", "flatten_param { axis: 3 }"), x)
    with pytest.raises(LayerError, match=r"flatten_param.end_axis -4 is out of range"):
        run_forward(make_layer("Flatten", "flatten_param { end_axis: -4 }"), x)
    with pytest.raises(LayerError, match=r"Number of tiles must be positive, got tile_param.tiles 0"):
        run_forward(make_layer("Tile", "tile_param { tiles: 0 }"), x)
    b = Blob((2, 3), dtype=np.float64)
    with pytest.raises(LayerError, match="in-place"):
        make_layer("Flatten").SetUp([b], [b])


# -- Split / Concat / Slice ----------------------------------------------------------------------
@given(shape=small, seed=seeds(), n_top=st.integers(1, 3))
def test_split_shares_data_and_sums_diffs(shape, seed, n_top):
    x = random_array(seed, shape)
    layer = make_layer("Split")
    bottom, top = check_layer_gradient(layer, [x], n_top=n_top)
    bottom[0].data[...] = x - 1
    for t in top:
        np.testing.assert_array_equal(t.data, x - 1)
    diffs = [random_array(seed + i, shape) for i in range(n_top)]
    for t, d in zip(top, diffs):
        t.diff[...] = d
    layer.Backward(top, [True], bottom)
    np.testing.assert_allclose(bottom[0].diff, sum(diffs))


@st.composite
def concat_case(draw):
    shape = draw(shapes(1, 3, 1, 3))
    n = len(shape)
    axis = draw(st.integers(-n, n - 1))
    sizes = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    bshapes = [tuple(s if j != axis % n else k for j, s in enumerate(shape)) for k in sizes]
    legacy = axis >= 0 and draw(st.booleans())
    return bshapes, axis, legacy, draw(seeds())


@given(case=concat_case())
def test_concat_gradient(case):
    bshapes, axis, legacy, seed = case
    xs = [random_array(seed + i, s) for i, s in enumerate(bshapes)]
    text = f"concat_param {{ concat_dim: {axis} }}" if legacy else f"concat_param {{ axis: {axis} }}"
    layer = make_layer("Concat", text)
    bottom, top = check_layer_gradient(layer, xs)
    layer.Forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, np.concatenate(xs, axis=axis))


@given(case=concat_case(), even=st.booleans())
def test_slice_gradient(case, even):
    bshapes, axis, legacy, seed = case
    x = random_array(seed, np.concatenate([np.zeros(s) for s in bshapes], axis=axis).shape)
    sizes = [s[axis] for s in bshapes]
    field = f"slice_dim: {axis}" if legacy else f"axis: {axis}"
    if even:
        n = len(sizes)
        length = sum(sizes)
        n = n if length % n == 0 else 1
        sizes = [length // n] * n
        text = f"slice_param {{ {field} }}"
    else:
        points = np.cumsum(sizes)[:-1]
        text = f"slice_param {{ {field} " + " ".join(f"slice_point: {p}" for p in points) + " }"
    layer = make_layer("Slice", text)
    bottom, top = check_layer_gradient(layer, [x], n_top=len(sizes))
    layer.Forward(bottom, top)
    for t, want in zip(top, np.split(x, np.cumsum(sizes)[:-1], axis=axis)):
        np.testing.assert_array_equal(t.data, want)


def test_concat_slice_errors():
    with pytest.raises(LayerError,
                       match=r"Concat.*same shape, except at concat axis 1.*\(2, 3, 4\).*bottom\[1\].*\(3, 3, 4\)"):
        run_forward(make_layer("Concat"), [np.zeros((2, 3, 4)), np.zeros((3, 3, 4))])
    with pytest.raises(LayerError, match=r"Concat.*\(2, 3\).*bottom\[1\] has shape \(2, 3, 1\)"):
        run_forward(make_layer("Concat"), [np.zeros((2, 3)), np.zeros((2, 3, 1))])
    with pytest.raises(LayerError, match="not both"):
        run_forward(make_layer("Concat", "concat_param { axis: 1 concat_dim: 1 }"), [np.zeros((2, 3))] * 2)
    with pytest.raises(LayerError, match=r"Slice.*\(3\) should evenly divide input slice axis 1 of size 4"):
        run_forward(make_layer("Slice"), [np.zeros((2, 4))], n_top=3)
    with pytest.raises(LayerError, match=r"Slice.*slice_point \[1, 4\] out of range for axis 1 of size 4"):
        run_forward(make_layer("Slice", "slice_param { slice_point: 1 slice_point: 4 }"), [np.zeros((2, 4))], n_top=3)
    with pytest.raises(LayerError, match=r"slice_point has 1 entries for 3 tops"):
        run_forward(make_layer("Slice", "slice_param { slice_point: 1 }"), [np.zeros((2, 4))], n_top=3)
    with pytest.raises(LayerError, match=r"slice_dim 2 is out of range.*\(2, 4\)"):
        run_forward(make_layer("Slice", "slice_param { slice_dim: 2 }"), [np.zeros((2, 4))], n_top=2)


# -- Tile / Crop / Silence / Parameter -----------------------------------------------------------
@given(shape=shapes(1, 3, 1, 3), seed=seeds(), tiles=st.integers(1, 3), data=st.data())
def test_tile_gradient(shape, seed, tiles, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = random_array(seed, shape)
    layer = make_layer("Tile", f"tile_param {{ axis: {axis} tiles: {tiles} }}")
    bottom, top = check_layer_gradient(layer, [x])
    layer.Forward(bottom, top)
    a = axis % len(shape)
    want = np.tile(x.reshape(x.shape[:a] + (1,) + x.shape[a:]), (1,) * a + (tiles,) + (1,) * (len(shape) - a))
    np.testing.assert_array_equal(top[0].data, want.reshape(top[0].shape))


@st.composite
def crop_case(draw):
    shape = draw(shapes(1, 4, 1, 4).filter(lambda s: int(np.prod(s)) <= 32))
    n = len(shape)
    start = draw(st.integers(0, n - 1))
    axis = draw(st.sampled_from([start, start - n]))
    target = [shape[i] if i < start else draw(st.integers(1, shape[i])) for i in range(n)]
    mode = draw(st.sampled_from(["none", "one", "each"]))
    if mode == "one":
        room = min(shape[i] - target[i] for i in range(start, n))
        offsets = [draw(st.integers(0, room))]
    elif mode == "each":
        offsets = [draw(st.integers(0, shape[i] - target[i])) for i in range(start, n)]
    else:
        offsets = []
    # axes before `axis` are not cropped: bottom[1] may be smaller there
    ref = [draw(st.integers(1, 2)) if i < start else target[i] for i in range(n)]
    return shape, axis, start, ref, offsets, draw(seeds())


# Distinct offsets per axis (a permuted or shifted use of them changes the result or goes out of bounds),
# each at its boundaries: 0 and the largest that fits; one offset for every axis; axis given from the end.
@given(case=crop_case())
@example(case=((1, 1, 5, 6), 2, 2, [1, 1, 2, 2], [1, 3], 21))
@example(case=((2, 4, 5, 6), 1, 1, [1, 2, 3, 2], [2, 0, 4], 22))
@example(case=((2, 4, 5, 6), -3, 1, [1, 2, 3, 2], [1, 2, 3], 23))
@example(case=((1, 3, 5, 6), -2, 2, [1, 1, 3, 4], [2], 24))
def test_crop_gradient(case):
    shape, axis, start, ref, offsets, seed = case
    x = random_array(seed, shape)
    text = f"crop_param {{ axis: {axis} " + " ".join(f"offset: {o}" for o in offsets) + " }"
    layer = make_layer("Crop", text)
    bottom, top = check_layer_gradient(layer, [x, np.zeros(ref)], check_bottom=0)
    layer.Forward(bottom, top)
    n = len(shape)
    offs = [0] * start + ((offsets * (n - start)) if len(offsets) == 1 else (offsets or [0] * (n - start)))
    idx = tuple(slice(o, o + (shape[i] if i < start else ref[i])) for i, o in enumerate(offs))
    np.testing.assert_array_equal(top[0].data, x[idx])


def test_crop_errors():
    x, ref = np.zeros((1, 2, 5, 5)), np.zeros((1, 2, 3, 3))
    with pytest.raises(LayerError, match=r"Crop.*crop for dimension 2 is out-of-bounds with size 3 and offset 3"):
        run_forward(make_layer("Crop", "crop_param { offset: 3 }"), [x, ref])
    with pytest.raises(LayerError, match=r"number of crop_param.offset values \(3\).*\(2\)"):
        run_forward(make_layer("Crop", "crop_param { offset: 1 offset: 1 offset: 1 }"), [x, ref])
    with pytest.raises(LayerError, match=r"crop_param.axis 4 is out of range"):
        run_forward(make_layer("Crop", "crop_param { axis: 4 }"), [x, ref])
    # two offsets for three cropped axes (too few, not just too many)
    with pytest.raises(LayerError, match=r"number of crop_param.offset values \(2\).*following axis 1 \(3\)"):
        run_forward(make_layer("Crop", "crop_param { axis: 1 offset: 1 offset: 1 }"), [x, ref])
    with pytest.raises(LayerError, match=r"Crop.*bottom\[1\] \(shape \(2, 3, 3\)\) must have as many axes as "
                                         r"bottom\[0\] \(shape \(1, 2, 5, 5\)\)"):
        run_forward(make_layer("Crop"), [x, np.zeros((2, 3, 3))])


def test_crop_reference_bottom_gets_no_gradient_even_forced():
    # bottom[1] only gives the shape: force_backward must not reach it (Caffe propagates to bottom[0] only)
    layer = make_layer("Crop")
    assert layer.allow_force_backward(0) and not layer.allow_force_backward(1)


@given(shape=small, seed=seeds())
def test_silence_zeroes_bottom_diffs(shape, seed):
    x = random_array(seed, shape)
    layer = make_layer("Silence")
    bottom, top = run_forward(layer, [x, x], n_top=0)
    for b in bottom:
        b.diff[...] = 5
    layer.Backward(top, [True, False], bottom)
    np.testing.assert_array_equal(bottom[0].diff, 0)
    np.testing.assert_array_equal(bottom[1].diff, 5)


@given(shape=small)
def test_parameter_exposes_its_blob(shape):
    text = "parameter_param { shape { " + " ".join(f"dim: {d}" for d in shape) + " } }"
    layer = make_layer("Parameter", text)
    _, top = check_layer_gradient(layer, [], n_top=1)
    assert top[0].shape == shape and layer.blobs[0].shape == shape
    layer.blobs[0].data[...] = 7
    np.testing.assert_array_equal(top[0].data, 7)
    top[0].diff[...] = 2
    np.testing.assert_array_equal(layer.blobs[0].diff, 2)
    # a reloaded blob comes back into the top
    reloaded = create_layer(layer.to_proto())
    _, top2 = run_forward(reloaded, [], n_top=1)
    np.testing.assert_array_equal(top2[0].data, 7)


@pytest.mark.parametrize("type_, text, shape, match", [
    ("Reduction", "reduction_param { axis: 3 }", (2, 3), r"reduction_param.axis 3 is out of range for bottom\[0\] "
                                                         r"with shape \(2, 3\)"),
    ("Tile", "tile_param { axis: 2 tiles: 2 }", (2, 3), r"tile_param.axis 2 is out of range for bottom\[0\] with "
                                                        r"shape \(2, 3\)"),
    ("Tile", "tile_param { axis: 1 }", (2, 3), r"Number of tiles must be specified \(tile_param.tiles\)"),
    ("Reshape", "reshape_param { shape { dim: 6 } axis: 1 num_axes: 2 }", (2, 3),
     r"reshape_param.axis 1 \+ num_axes 2 exceed the 2 axes of bottom\[0\] with shape \(2, 3\)"),
    ("Flatten", "flatten_param { axis: 1 end_axis: 0 }", (2, 3),
     r"flatten_param.axis \(1 -> 1\) must not come after end_axis \(0 -> 0\)"),
    ("ArgMax", "argmax_param { top_k: 0 }", (2, 3), r"argmax_param.top_k must not be less than 1, got 0"),
    ("ArgMax", "argmax_param { axis: 2 }", (2, 3), r"argmax_param.axis 2 is out of range for bottom\[0\] with "
                                                   r"shape \(2, 3\)"),
])
def test_bad_parameters_are_named(type_, text, shape, match):
    with pytest.raises(LayerError, match=match):
        run_forward(make_layer(type_, text), [np.zeros(shape)])


def test_parameter_and_input_boundaries():
    # a zero-sized parameter is allowed (Caffe checks dims >= 0); a new parameter starts at 0 and learns
    layer = make_layer("Parameter", "parameter_param { shape { dim: 0 dim: 3 } }")
    _, top = run_forward(layer, [], n_top=1)
    assert top[0].shape == (0, 3)
    for dtype in (np.float32, np.float64):
        layer = make_layer("Parameter", "parameter_param { shape { dim: 2 } }")
        _, top = run_forward(layer, [], n_top=1, dtype=dtype)
        assert layer.blobs[0].dtype == dtype and layer.param_propagate_down(0)
        np.testing.assert_array_equal(layer.blobs[0].data, 0)
    with pytest.raises(LayerError, match=r"parameter_param.shape \[2, -1\] has a negative dimension"):
        run_forward(make_layer("Parameter", "parameter_param { shape { dim: 2 dim: -1 } }"), [], n_top=1)
    from caffe.layers import create_layer
    proto = make_layer("Parameter", "parameter_param { shape { dim: 2 } }").to_proto()
    run_layer = create_layer(proto)
    run_forward(run_layer, [], n_top=1)
    proto = run_layer.to_proto()
    proto.parameter_param.shape.dim[0] = 3  # the stored blob holds 2 values
    with pytest.raises(LayerError, match=r"stored blob shape \(2,\) does not match parameter_param.shape \[3\]"):
        run_forward(create_layer(proto), [], n_top=1)
    # an Input layer without shapes leaves its tops to be shaped later (Caffe allows 0, 1 or one per top)
    _, top = run_forward(make_layer("Input"), [], n_top=2)
    assert len(top) == 2

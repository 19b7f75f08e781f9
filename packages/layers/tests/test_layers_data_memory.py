"""MemoryData (pycaffe's set_input_arrays), DummyData and Input."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from caffe.blob import Blob, context
from caffe.layers import LayerError
from caffe.layers.data_transformer import array_to_datum
from caffe.layers.testing import make_layer


def memory_layer(b=2, c=1, h=2, w=3, extra=""):
    return make_layer("MemoryData", f"memory_data_param {{ batch_size: {b} channels: {c} height: {h} "
                                    f"width: {w} }} {extra}")


@given(b=st.integers(1, 3), c=st.integers(1, 3), hw=st.integers(1, 4), k=st.integers(1, 3))
def test_memory_data_serves_batches_in_order_and_wraps(b, c, hw, k):
    layer = memory_layer(b, c, hw, hw)
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    assert top[0].shape == (b, c, hw, hw) and top[1].shape == (b,)
    n = b * k
    data = np.random.default_rng(b * 100 + k).normal(size=(n, c, hw, hw)).astype(np.float32)
    labels = np.arange(n, dtype=np.float32)
    layer.reset(data, labels, n)
    for it in range(k + 1):
        layer.Forward([], top)
        i0 = (it % k) * b
        np.testing.assert_array_equal(top[0].data, data[i0:i0 + b])
        np.testing.assert_array_equal(top[1].data, labels[i0:i0 + b])


def test_memory_data_borrows_the_array():
    layer = memory_layer(2, 1, 1, 1)
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    data = np.zeros((4, 1, 1, 1), np.float32)
    layer.reset(data, np.zeros((4, 1, 1, 1), np.float32))  # pycaffe's 4-d labels are accepted
    layer.Forward([], top)
    data[1] = 7  # no copy was made, as in Caffe
    assert top[0].data[1, 0, 0, 0] == 7


def test_memory_data_errors():
    layer = memory_layer(2, 1, 2, 3)
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    with pytest.raises(LayerError, match="needs to be initialized by calling reset"):
        layer.Forward([], top)
    with pytest.raises(LayerError, match="n must be a positive multiple of batch size 2, got n = 3"):
        layer.reset(np.zeros((3, 1, 2, 3)), np.zeros(3), 3)
    with pytest.raises(LayerError, match=r"data array must have shape \(n, 1, 2, 3\), got \(2, 1, 3, 2\)"):
        layer.reset(np.zeros((2, 1, 3, 2)), np.zeros(2), 2)
    with pytest.raises(LayerError, match="same first dimension"):
        layer.reset(np.zeros((4, 1, 2, 3)), np.zeros(2), 4)
    with pytest.raises(LayerError, match="must be specified and positive"):
        memory_layer(0).SetUp([], [Blob(), Blob()])


def test_memory_data_add_datum_vector_transforms():
    layer = memory_layer(2, 1, 2, 2, "transform_param { scale: 0.5 mean_value: 1 }")
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    imgs = np.arange(16, dtype=np.uint8).reshape(4, 1, 2, 2)
    layer.add_datum_vector([array_to_datum(im, i) for i, im in enumerate(imgs)])
    with pytest.raises(LayerError, match="until current data has been consumed"):
        layer.add_datum_vector([array_to_datum(imgs[0], 0)] * 2)
    layer.Forward([], top)
    layer.Forward([], top)
    np.testing.assert_array_equal(top[0].data, (imgs[2:].astype(np.float32) - 1) * 0.5)
    np.testing.assert_array_equal(top[1].data, [2, 3])
    layer.add_datum_vector([array_to_datum(imgs[0], 9)] * 2)  # consumed: adding works again
    lay = memory_layer(2, 1, 2, 2)
    lay.SetUp([], [Blob(), Blob()])
    with pytest.raises(LayerError, match="multiple of the batch size 2, got 1"):
        lay.add_datum_vector([array_to_datum(imgs[0], 0)])


def test_dummy_data_shapes_fillers_and_refill():
    layer = make_layer("DummyData", """dummy_data_param {
        shape { dim: 2 dim: 3 } shape { dim: 4 }
        data_filler { type: "constant" value: 7 } data_filler { type: "uniform" min: 1 max: 2 } }""")
    top = [Blob(), Blob()]
    context.set_random_seed(1)
    layer.SetUp([], top)
    assert top[0].shape == (2, 3) and top[1].shape == (4,)
    layer.Forward([], top)
    first = top[1].data.copy()
    layer.Forward([], top)
    assert np.all(top[0].data == 7)
    assert np.all((first >= 1) & (first <= 2)) and not np.array_equal(first, top[1].data)  # refilled
    top[0].data[...] = 0
    layer.Forward([], top)
    assert np.all(top[0].data == 0)  # constants are filled once, at setup, as in Caffe


def test_dummy_data_legacy_fields_and_default_zero():
    layer = make_layer("DummyData", "dummy_data_param { num: 2 channels: 3 channels: 1 height: 4 width: 5 }")
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    layer.Forward([], top)
    assert top[0].shape == (2, 3, 4, 5) and top[1].shape == (2, 1, 4, 5)
    assert not top[0].data.any()


def test_dummy_data_errors():
    with pytest.raises(LayerError, match="number of data fillers must be 0, 1 or equal to the number of tops"):
        make_layer("DummyData", "dummy_data_param { shape { dim: 1 } data_filler {} data_filler {} "
                                "data_filler {} }").SetUp([], [Blob(), Blob()])
    with pytest.raises(LayerError, match="both shape and legacy fields"):
        make_layer("DummyData", "dummy_data_param { shape { dim: 1 } num: 1 }").SetUp([], [Blob()])
    with pytest.raises(LayerError, match="must specify 'shape' once, or once per top blob"):
        make_layer("DummyData", "dummy_data_param { shape { dim: 1 } shape { dim: 1 } }").SetUp(
            [], [Blob(), Blob(), Blob()])
    with pytest.raises(LayerError, match="channels must be specified once, or once per top"):
        make_layer("DummyData", "dummy_data_param { num: 1 channels: 1 channels: 2 channels: 3 height: 1 "
                                "width: 1 }").SetUp([], [Blob(), Blob()])


def test_input_shapes():
    layer = make_layer("Input", "input_param { shape { dim: 2 dim: 3 } shape { dim: 5 } }")
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    assert top[0].shape == (2, 3) and top[1].shape == (5,)
    top[0].data[...] = 4
    top[0].reshape(1, 6)  # the user reshapes inputs; Forward keeps shape and data
    layer.Forward([], top)
    assert top[0].shape == (1, 6)
    one = make_layer("Input", "input_param { shape { dim: 4 dim: 1 } }")
    tops = [Blob(), Blob(), Blob()]
    one.SetUp([], tops)
    assert all(t.shape == (4, 1) for t in tops)


def test_input_errors():
    with pytest.raises(LayerError, match="must give 0, 1 or one shape per top"):
        make_layer("Input", "input_param { shape { dim: 1 } shape { dim: 2 } }").SetUp(
            [], [Blob(), Blob(), Blob()])
    with pytest.raises(LayerError, match="expects exactly 0 bottom"):
        make_layer("Input", "input_param { shape { dim: 1 } }").SetUp([Blob(1)], [Blob()])

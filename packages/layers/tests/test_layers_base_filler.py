"""caffe.layers.filler: every filler type against Caffe's definition, reproducible under set_random_seed."""
import numpy as np
import pytest

from caffe.blob import Blob, context
from caffe.layers import filler
from caffe.layers.filler import FillerError, filler_param


def filled(shape, kind, seed=1701, **fields):
    b = Blob(*shape, dtype=np.float64)
    if not shape:
        b.reshape([])  # a scalar blob
    context.set_random_seed(seed)
    filler.fill(b, filler_param(kind, **fields))
    return b.data.copy()


def test_constant():
    np.testing.assert_array_equal(filled((2, 3, 4), "constant", value=1.5), 1.5)
    np.testing.assert_array_equal(filled((5,), "constant"), 0.0)  # default value 0


def test_uniform_range_and_mean():
    x = filled((100, 200), "uniform", min=-0.5, max=2.0)
    assert x.min() >= -0.5 and x.max() <= 2.0
    assert x.min() < -0.49 and x.max() > 1.99  # the whole range is used
    assert abs(x.mean() - 0.75) < 0.02  # std of the mean: 2.5 / sqrt(12 * 20000) ~ 0.005
    x = filled((1000,), "uniform")  # defaults [0, 1]
    assert 0 <= x.min() and x.max() <= 1


def test_gaussian_mean_and_std():
    x = filled((200, 100), "gaussian", mean=3.0, std=0.5)
    assert abs(x.mean() - 3.0) < 0.02   # std of the mean 0.0035
    assert abs(x.std() - 0.5) < 0.01    # std of the std ~ 0.0025


def test_gaussian_sparse_keeps_about_sparse_over_num_outputs():
    # Caffe: each element is nonzero with probability sparse / shape[0].
    x = filled((20, 5000), "gaussian", std=1.0, sparse=5)
    frac = np.count_nonzero(x) / x.size
    assert abs(frac - 5 / 20) < 0.01  # std of the fraction ~ 0.0014
    nz = x[x != 0]
    assert abs(nz.std() - 1.0) < 0.03  # the kept values are still N(0, 1)
    assert np.count_nonzero(filled((4, 100), "gaussian", sparse=0)) == 0
    assert np.count_nonzero(filled((4, 100), "gaussian", sparse=-1)) == 400  # -1: not sparse


def test_positive_unitball_rows_sum_to_one():
    x = filled((6, 3, 2, 2), "positive_unitball")
    assert (x >= 0).all() and (x <= 1).all()
    np.testing.assert_allclose(x.reshape(6, -1).sum(axis=1), 1.0, rtol=1e-12)


@pytest.mark.parametrize("norm, n", [("FAN_IN", 50 * 3 * 3), ("FAN_OUT", 40 * 3 * 3), ("AVERAGE", (450 + 360) / 2)])
def test_xavier_variance(norm, n):
    from caffe.proto import caffe_pb2
    vn = getattr(caffe_pb2.FillerParameter, norm)
    x = filled((40, 50, 3, 3), "xavier", variance_norm=vn)  # fan_in = 50*9, fan_out = 40*9
    bound = np.sqrt(3.0 / n)
    assert np.abs(x).max() <= bound and np.abs(x).max() > 0.99 * bound  # uniform(-bound, bound)
    assert abs(x.var() / (1.0 / n) - 1) < 0.03  # 18,000 draws: relative std of the variance ~ 0.0067


@pytest.mark.parametrize("norm, n", [("FAN_IN", 50 * 3 * 3), ("FAN_OUT", 40 * 3 * 3), ("AVERAGE", (450 + 360) / 2)])
def test_msra_variance(norm, n):
    from caffe.proto import caffe_pb2
    vn = getattr(caffe_pb2.FillerParameter, norm)
    x = filled((40, 50, 3, 3), "msra", variance_norm=vn)
    assert abs(x.mean()) < 4 * np.sqrt(2.0 / n / x.size)
    assert abs(x.var() / (2.0 / n) - 1) < 0.04  # gaussian: relative std of the variance ~ 0.0105


def test_xavier_on_a_vector_uses_count_as_fan_out():
    x = filled((10000,), "xavier", variance_norm=1)  # FAN_OUT; fan_in = count / shape[0] = 1
    assert np.abs(x).max() <= np.sqrt(3.0 / 10000)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_bilinear_matches_caffe_formula(k):
    x = filled((2, 3, k, k), "bilinear")
    f = int(np.ceil(k / 2.0))
    c = (k - 1) / (2.0 * f)
    expect = np.empty((k, k))
    for yy in range(k):
        for xx in range(k):
            expect[yy, xx] = (1 - abs(xx / f - c)) * (1 - abs(yy / f - c))
    for n in range(2):
        for ch in range(3):
            np.testing.assert_allclose(x[n, ch], expect, rtol=1e-15)


def test_bilinear_4x4_known_values():
    # The classic factor-2 upsampling kernel: outer product of [0.25, 0.75, 0.75, 0.25].
    x = filled((1, 1, 4, 4), "bilinear")
    v = np.array([0.25, 0.75, 0.75, 0.25])
    np.testing.assert_allclose(x[0, 0], np.outer(v, v))


def test_bilinear_rejects_bad_shapes():
    with pytest.raises(FillerError, match="4-d"):
        filled((3, 3), "bilinear")
    with pytest.raises(FillerError, match="square"):
        filled((1, 1, 3, 4), "bilinear")


def test_unknown_filler_type():
    with pytest.raises(FillerError, match="Unknown filler type 'gausian'"):
        filled((2,), "gausian")


@pytest.mark.parametrize("kind, fields", [("uniform", {}), ("gaussian", {"sparse": 3}), ("positive_unitball", {}),
                                          ("xavier", {}), ("msra", {})])
def test_fillers_are_reproducible_under_set_random_seed(kind, fields):
    a = filled((8, 4, 2), kind, seed=7, **fields)
    b = filled((8, 4, 2), kind, seed=7, **fields)
    c = filled((8, 4, 2), kind, seed=8, **fields)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_float32_blob():
    b = Blob(3, 4)
    context.set_random_seed(3)
    filler.fill(b, filler_param("gaussian", std=2.0))
    assert b.data.dtype == np.float32 and np.isfinite(b.data).all() and b.data.std() > 0


@pytest.mark.parametrize("norm, n", [("FAN_IN", 50), ("FAN_OUT", 40), ("AVERAGE", 45)])
def test_xavier_and_msra_on_inner_product_weights(norm, n):
    # a 2-d blob (num_output x input): fan_in = 50, fan_out = 40, as Caffe's count / shape[0] and / shape[1]
    from caffe.proto import caffe_pb2
    vn = getattr(caffe_pb2.FillerParameter, norm)
    x = filled((40, 50), "xavier", variance_norm=vn)
    bound = np.sqrt(3.0 / n)
    assert np.abs(x).max() <= bound and np.abs(x).max() > 0.95 * bound
    x = filled((400, 500), "msra", variance_norm=vn)  # fan_in 500, fan_out 400
    assert abs(x.var() / (2.0 / (10 * n)) - 1) < 0.03


def test_fan_based_fillers_take_any_first_axis_but_not_a_scalar():
    assert np.isfinite(filled((1, 5), "xavier")).all()
    with pytest.raises(FillerError, match=r"cannot compute fan-in/fan-out for a blob of shape \(\)"):
        filled((), "msra")


def test_a_blob_bigger_than_one_draw_chunk_fills_completely_and_alike_in_any_dtype():
    n = filler._CHUNK + 7
    a = filled((n,), "gaussian", seed=5, std=1.0)
    b = Blob(n)  # float32
    context.set_random_seed(5)
    filler.fill(b, filler_param("gaussian", std=1.0))
    np.testing.assert_array_equal(b.data, a.astype(np.float32))
    assert a[-7:].std() > 0 and len(np.unique(a[filler._CHUNK - 3:])) == 10  # the tail is drawn, not repeated


def test_uniform_bounds():
    np.testing.assert_array_equal(filled((5,), "uniform", min=0.5, max=0.5), 0.5)  # min == max: a constant
    with pytest.raises(FillerError, match=r"uniform filler: min \(1(\.0)?\) must not exceed max \(0(\.0)?\)"):
        filled((5,), "uniform", min=1.0, max=0.0)
    # the check is the uniform filler's: others do not read min and max
    np.testing.assert_array_equal(filled((3,), "constant", min=1.0, max=0.0, value=2.0), 2.0)


def test_sparse_gaussian_and_positive_unitball_on_small_blobs():
    x = filled((1000,), "gaussian", sparse=500)  # 1-d: 1000 outputs, each kept with probability 500 / 1000
    assert 400 < np.count_nonzero(x) < 600
    np.testing.assert_allclose(filled((), "positive_unitball"), 1.0)  # a scalar: the one value is the sum


def test_filler_param_defaults_and_bilinear_message():
    assert filler_param().type == "constant"
    with pytest.raises(FillerError, match=r"square kernels, got 3x4"):
        filled((1, 1, 3, 4), "bilinear")


def test_filler_errors_say_what_is_wrong():
    with pytest.raises(FillerError, match=r"filler 'uniform': sparsity \(sparse=2\) is only supported by the "
                                          r"gaussian filler"):
        filled((3,), "uniform", sparse=2)
    with pytest.raises(FillerError, match=r"sparse gaussian filler needs a blob with at least one axis"):
        filled((), "gaussian", sparse=1)

"""caffe.coord_map: maps of single layers against the receptive-field arithmetic, composition along
paths, crop(), and the errors pycaffe raises. (caffe-net's test_net_coord_map.py checks the maps
against real forward/backward passes.)"""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from caffe.coord_map import (AxisMismatchException, UndefinedMapException, compose, coord_map,
                             coord_map_from_to, crop, inverse)
from caffe.net_spec import NetSpec, layers as L, params as P


def conv_pool_deconv(ks=3, stride=1, pad=0, pool=2, dstride=2, dpad=0):
    n = NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 1, 100, 100]))
    n.aux = L.Input(shape=dict(dim=[2, 1, 20, 20]))
    n.conv = L.Convolution(n.data, num_output=4, kernel_size=ks, stride=stride, pad=pad)
    n.pool = L.Pooling(n.conv, pool=P.Pooling.MAX, kernel_size=pool, stride=pool)
    dks = [2 * s for s in dstride] if isinstance(dstride, list) else 2 * dstride
    n.deconv = L.Deconvolution(n.pool, num_output=4, kernel_size=dks, stride=dstride, pad=dpad)
    return n


@given(st.integers(1, 7), st.integers(1, 4), st.integers(0, 3), st.integers(1, 3))
def test_conv_map_is_the_receptive_field_center(ks, stride, pad, dilation):
    x = L.Input(shape=dict(dim=[1, 1, 50, 50]))
    fn = L.Convolution(x, kernel_size=ks, stride=stride, pad=pad, dilation=dilation, num_output=1).fn
    ax, a, b = coord_map(fn)
    extent = (ks - 1) * dilation + 1
    for y in range(4):  # input center of output y: y * stride - pad + (extent - 1) / 2
        center = y * stride - pad + (extent - 1) / 2
        assert ax == 1 and np.allclose(a * center + b, y)
    # deconvolution maps the other way round
    dfn = L.Deconvolution(x, kernel_size=ks, stride=stride, pad=pad, dilation=dilation, num_output=1).fn
    _, a, b = compose(coord_map(dfn), coord_map(fn))
    assert np.allclose(a, 1) and np.allclose(b, 0)


def test_identity_and_shift_through_conv_pool_deconv():
    n = conv_pool_deconv()
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    assert (ax, a.tolist(), b.tolist()) == (1, [1.0], [0.0])
    n = conv_pool_deconv(pool=4, dstride=4)
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    assert (ax, a.tolist(), b.tolist()) == (1, [1.0], [-1.0])


def test_pass_through_layers_and_padding():
    n = conv_pool_deconv()
    base = coord_map_from_to(n.deconv, n.data)
    n.relu = L.ReLU(n.deconv)
    n.bn = L.BatchNorm(n.relu)
    n.one = L.Convolution(n.bn, num_output=4, kernel_size=1)
    for top in (n.relu, n.bn, n.one):
        assert coord_map_from_to(top, n.data) == base
    for pad in (1, 5):
        m = conv_pool_deconv(pad=pad)
        assert coord_map_from_to(m.deconv, m.data)[2] == base[2] - pad  # conv padding shifts one way
        m = conv_pool_deconv(dpad=pad)
        assert coord_map_from_to(m.deconv, m.data)[2] == base[2] + pad  # deconv padding the other
        m = conv_pool_deconv(pad=pad, dpad=pad)
        assert coord_map_from_to(m.deconv, m.data)[2] == base[2]


def test_per_axis_and_nd_parameters():
    sq3, sq5 = conv_pool_deconv(3, 1, 0), conv_pool_deconv(5, 2, 10)
    rect = conv_pool_deconv([3, 5], [1, 2], [0, 10])
    _, a3, b3 = coord_map_from_to(sq3.deconv, sq3.data)
    _, a5, b5 = coord_map_from_to(sq5.deconv, sq5.data)
    _, ar, br = coord_map_from_to(rect.deconv, rect.data)
    assert (a3, b3, a5, b5) == (ar[0], br[0], ar[1], br[1])
    n = NetSpec()  # legacy kernel_h / kernel_w give the same per-axis map as a list
    n.data = L.Input(shape=dict(dim=[1, 1, 30, 30]))
    n.conv = L.Convolution(n.data, num_output=1, kernel_h=3, kernel_w=5, stride_h=1, stride_w=2, pad_h=0, pad_w=1)
    m = NetSpec()
    m.data = L.Input(shape=dict(dim=[1, 1, 30, 30]))
    m.conv = L.Convolution(m.data, num_output=1, kernel_size=[3, 5], stride=[1, 2], pad=[0, 1])
    for x, y in zip(coord_map_from_to(n.conv, n.data)[1:], coord_map_from_to(m.conv, m.data)[1:]):
        assert np.allclose(x, y)
    v = NetSpec()  # 3 spatial axes
    v.data = L.Input(shape=dict(dim=[1, 1, 20, 20, 20]))
    v.conv = L.Convolution(v.data, num_output=1, kernel_size=[3, 3, 3], pad=[0, 1, 2])
    ax, a, b = coord_map_from_to(v.conv, v.data)
    assert ax == 1 and np.all(a == 1) and list(b) == [1, 0, -1]


def test_multiple_bottoms_map_alike():
    n = conv_pool_deconv()
    n.c_data, n.c_aux = L.Convolution(n.data, n.aux, ntop=2, num_output=2, kernel_size=5, stride=2)
    assert coord_map_from_to(n.c_data, n.data) == coord_map_from_to(n.c_aux, n.aux)


def test_crop_and_crop_of_crop():
    n = conv_pool_deconv(pad=3)
    n.crop = crop(n.deconv, n.data)
    layer = n.to_proto().layer[-1]
    assert layer.type == "Crop" and list(layer.bottom) == ["deconv", "data"]
    assert layer.crop_param.axis == 2 and list(layer.crop_param.offset) == [3]
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    n.crop2 = L.Crop(n.deconv, n.data, axis=2, offset=4)
    assert coord_map_from_to(n.crop2, n.data) == (ax, a, b + 4)
    # only the first bottom of a Crop is mapped: the second gives the shape
    with pytest.raises(RuntimeError, match="connected by spatial layers"):
        coord_map_from_to(n.crop2, n.aux)


def test_errors():
    n = conv_pool_deconv()
    n.ip = L.InnerProduct(n.deconv, num_output=10)
    with pytest.raises(RuntimeError, match="connected by spatial layers"):
        coord_map_from_to(n.ip, n.data)
    m = conv_pool_deconv(pool=3, dstride=2)
    with pytest.raises(AssertionError, match="scale mismatch"):
        crop(m.deconv, m.data)
    m = conv_pool_deconv(dpad=10)  # the output is smaller than the input
    with pytest.raises(AssertionError, match="negative offset"):
        crop(m.deconv, m.data)
    m = conv_pool_deconv(ks=4, pad=3)  # an even kernel: a half-pixel offset (-2.5)
    with pytest.raises(AssertionError, match="noninteger offset"):
        crop(m.deconv, m.data)
    with pytest.raises(UndefinedMapException):
        coord_map(n.ip.fn)
    with pytest.raises(AxisMismatchException):
        compose((1, 1, 0), (2, 1, 0))
    assert inverse((1, 2.0, 3.0)) == (1, 0.5, -1.5)

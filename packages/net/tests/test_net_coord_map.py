"""caffe.coord_map against real nets: the map of random conv/pool stacks equals the center of each output's
receptive field found by a backward pass, and crop() builds Crop layers that fit."""
import numpy as np
from hypothesis import assume, given, settings, strategies as st

import caffe
from caffe import layers as L, params as P
from caffe.coord_map import coord_map_from_to, crop

layer_specs = st.lists(st.tuples(st.sampled_from(["Convolution", "Pooling"]), st.integers(1, 5),
                                 st.integers(1, 3), st.integers(0, 2)), min_size=1, max_size=3)


def write(tmp_path, n):
    proto = n.to_proto()
    proto.force_backward = True  # no loss: backward runs only when forced
    path = tmp_path / "net.prototxt"
    path.write_text(str(proto))
    return str(path)


@settings(deadline=None, max_examples=15)
@given(layer_specs)
def test_map_is_the_receptive_field_center(tmp_path_factory, specs):
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 48, 48]))
    top = n.data
    size = 48
    for i, (kind, ks, stride, pad) in enumerate(specs):
        pad = min(pad, ks - 1)  # Caffe's pooling needs pad < kernel
        assume(size + 2 * pad >= ks)  # a map smaller than the kernel is refused when the net is built
        span = size + 2 * pad - ks  # Caffe's output sizes: convolution floors, pooling ceils
        size = (span // stride if kind == "Convolution" else -(-span // stride)) + 1
        if kind == "Convolution":  # all-ones kernels: every input in the field gets gradient
            top = L.Convolution(top, kernel_size=ks, stride=stride, pad=pad, num_output=1,
                                weight_filler=dict(type="constant", value=1), bias_term=False)
        else:
            top = L.Pooling(top, kernel_size=ks, stride=stride, pad=pad, pool=P.Pooling.AVE)
        n[f"l{i}"] = top
    ax, a, b = coord_map_from_to(top, n.data)
    net = caffe.Net(write(tmp_path_factory.mktemp("cm"), n), caffe.TEST)
    out = net.blobs[f"l{len(specs) - 1}"]
    assume(min(out.shape[2:]) >= 1)
    y = out.shape[2] // 2
    out.diff[...] = 0
    out.diff[0, 0, y, y] = 1
    net.backward()  # Input layers get diffs: the receptive field of output (y, y)
    # The field must not be cut off by a border at any level: a window that runs past an intermediate
    # map's edge is clipped there (Caffe's pooling does), and coord_map knows nothing of clipping.
    for name in ["data"] + [f"l{i}" for i in range(len(specs) - 1)]:
        d = net.blobs[name].diff[0, 0]
        r, c = np.nonzero(d)
        assume(r.size and r.min() > 0 and r.max() < d.shape[0] - 1 and c.min() > 0 and c.max() < d.shape[1] - 1)
    rows, cols = np.nonzero(net.blobs["data"].diff[0, 0])
    center = (rows.min() + rows.max()) / 2.0
    assert ax == 1 and np.allclose(a * y + b, center)  # from the top's coordinates to the data's
    assert np.allclose((cols.min() + cols.max()) / 2.0, center)


def test_crop_fits_fcn_style_nets(tmp_path):
    for pad, pool in [(0, 2), (5, 2), (8, 4)]:
        n = caffe.NetSpec()
        n.data = L.Input(shape=dict(dim=[1, 3, 37, 41]))
        n.conv = L.Convolution(n.data, kernel_size=3, pad=pad, num_output=4)
        n.pool = L.Pooling(n.conv, kernel_size=pool, stride=pool, pool=P.Pooling.MAX)
        n.up = L.Deconvolution(n.pool, convolution_param=dict(num_output=4, kernel_size=2 * pool, stride=pool))
        n.score = crop(n.up, n.data)
        net = caffe.Net(write(tmp_path, n), caffe.TEST)
        assert net.blobs["score"].shape[2:] == net.blobs["data"].shape[2:]
        offset = list(n.to_proto().layer[-1].crop_param.offset)
        assert offset == [pad] if pool == 2 else offset[0] >= pad
        net.forward()

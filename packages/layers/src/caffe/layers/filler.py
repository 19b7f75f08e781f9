"""Fillers: initial values for parameter blobs, drawn from the runtime generator.

constant, uniform, gaussian (optionally sparse), positive_unitball, xavier,
msra (variance_norm FAN_IN / FAN_OUT / AVERAGE) and bilinear, as in Caffe's
filler.hpp. Reproducible under caffe.set_random_seed.
"""
from __future__ import annotations

import numpy as np

from caffe.blob import context


class FillerError(ValueError):
    pass


def _fans(blob):
    count = blob.count()
    if blob.num_axes < 1 or blob.shape[0] == 0:
        raise FillerError(f"cannot compute fan-in/fan-out for a blob of shape {blob.shape}")
    fan_in = count // blob.shape[0]
    fan_out = count // blob.shape[1] if blob.num_axes > 1 and blob.shape[1] else count
    return fan_in, fan_out


def _norm(param, fan_in, fan_out):
    from caffe.proto import caffe_pb2
    vn = param.variance_norm
    if vn == caffe_pb2.FillerParameter.AVERAGE:
        return (fan_in + fan_out) / 2.0
    if vn == caffe_pb2.FillerParameter.FAN_OUT:
        return float(fan_out)
    return float(fan_in)


_CHUNK = 1 << 20


def _draw(draw, shape, out_dtype):
    """float64 draws (the same values whatever the blob's dtype), written in chunks of _CHUNK values so a
    large blob (CaffeNet's fc6: 38M values) never needs a float64 temporary of its own size."""
    n = int(np.prod(shape, dtype=np.int64))
    out = np.empty(n, dtype=out_dtype)
    for i in range(0, n, _CHUNK):
        out[i:i + _CHUNK] = draw(min(_CHUNK, n - i))
    return out.reshape(shape)


def _uniform(rng, low, high, shape, dt):
    return _draw(lambda k: rng.uniform(low, high, size=k), shape, dt)


def _normal(rng, mean, std, shape, dt):
    return _draw(lambda k: rng.normal(mean, std, size=k), shape, dt)


def fill(blob, param) -> None:
    """Fill `blob`'s data according to a FillerParameter."""
    rng = context.rng()
    kind = param.type
    if param.sparse != -1 and kind != "gaussian":
        raise FillerError(f"filler {kind!r}: sparsity (sparse={param.sparse}) is only supported by the "
                          f"gaussian filler")
    if kind == "uniform" and param.min > param.max:
        raise FillerError(f"uniform filler: min ({param.min}) must not exceed max ({param.max})")
    shape = blob.shape
    data = blob.mutable_cpu_data()
    dt = data.dtype
    if kind == "constant":
        data[...] = param.value
    elif kind == "uniform":
        data[...] = _uniform(rng, param.min, param.max, shape, dt)
    elif kind == "gaussian":
        data[...] = _normal(rng, param.mean, param.std, shape, dt)
        sparse = param.sparse
        if sparse >= 0:
            # Caffe: each output keeps about `sparse` nonzero inputs (Bernoulli mask).
            if blob.num_axes < 1:
                raise FillerError("sparse gaussian filler needs a blob with at least one axis")
            num_outputs = shape[0]
            non_zero_probability = sparse / float(num_outputs) if num_outputs else 0.0
            mask = _draw(lambda k: rng.random(size=k), shape, dt) < non_zero_probability
            data *= mask
    elif kind == "positive_unitball":
        data[...] = _uniform(rng, 0.0, 1.0, shape, dt)
        num = shape[0] if shape else 1
        flat = data.reshape(num, -1)
        sums = flat.sum(axis=1, keepdims=True)
        flat /= np.where(sums == 0, 1, sums)
    elif kind == "xavier":
        fan_in, fan_out = _fans(blob)
        scale = np.sqrt(3.0 / _norm(param, fan_in, fan_out))
        data[...] = _uniform(rng, -scale, scale, shape, dt)
    elif kind == "msra":
        fan_in, fan_out = _fans(blob)
        std = np.sqrt(2.0 / _norm(param, fan_in, fan_out))
        data[...] = _normal(rng, 0.0, std, shape, dt)
    elif kind == "bilinear":
        if blob.num_axes != 4:
            raise FillerError(f"bilinear filler needs a 4-d blob, got shape {shape}")
        if shape[2] != shape[3]:
            raise FillerError(f"bilinear filler needs square kernels, got {shape[2]}x{shape[3]}")
        k = shape[3]
        f = np.ceil(k / 2.0)
        c = (k - 1) / (2.0 * f)
        idx = np.arange(k * k)
        x = idx % k
        y = (idx // k) % k
        kern = ((1 - np.abs(x / f - c)) * (1 - np.abs(y / f - c))).reshape(k, k)
        data[...] = kern
    else:
        raise FillerError(f"Unknown filler type {kind!r} (known: constant, uniform, gaussian, "
                          f"positive_unitball, xavier, msra, bilinear)")


def filler_param(type_name: str = "constant", **fields):
    """A FillerParameter built from keyword fields, e.g. filler_param('gaussian', std=0.1)."""
    from caffe.proto import caffe_pb2
    p = caffe_pb2.FillerParameter(type=type_name)
    for k, v in fields.items():
        setattr(p, k, v)
    return p

"""Fillers: initial values for parameter blobs, drawn from the runtime generator.

constant, uniform, gaussian (optionally sparse), positive_unitball, xavier,
msra (variance_norm FAN_IN / FAN_OUT / AVERAGE) and bilinear, as in Caffe's
filler.hpp. Reproducible under caffe.set_random_seed.

Gaussian values (the gaussian and msra fillers) come from one 64-bit seed per fill drawn from the runtime
generator, by the counter-based Box-Muller of caffe.layers.kernels.rng (gaussian_reference below is the
same bits in NumPy, where the kernels are not built); the other draws are NumPy's Generator's.
"""
from __future__ import annotations

import numpy as np

from caffe.blob import context
from caffe.layers import _cpu, splitmix


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


_ONE = np.uint64(0x3FF0000000000000)  # the bits of 1.0


def _poly(x, coefs):
    """Horner's scheme from the highest coefficient, one rounding per operation (the kernel's order)."""
    p = x * 0.0 + coefs[0]
    for c in coefs[1:]:
        p = p * x + c
    return p


def box_muller_reference(a, b, xp=np):
    """The pairs (float64, interleaved) kernels.rng makes from the SplitMix64 words a, b (uint64 arrays): its
    module doc's steps, one IEEE operation each, in its order: the same bits."""
    u1 = 2.0 - ((a >> np.uint64(12)) | _ONE).view(np.float64)  # (0, 1]
    u2 = ((b >> np.uint64(12)) | _ONE).view(np.float64) - 1.0  # [0, 1)
    m, e = xp.frexp(u1)
    low = m < 0.7071067811865476
    m = xp.where(low, m * 2.0, m)
    e = xp.where(low, e - 1, e).astype(np.float64)
    f = m - 1.0
    s = f / (2.0 + f)
    s2 = s * s
    p = _poly(s2, [1.0 / 17.0, 1.0 / 15.0, 1.0 / 13.0, 1.0 / 11.0, 1.0 / 9.0, 1.0 / 7.0, 1.0 / 5.0, 1.0 / 3.0])
    r = xp.sqrt(-2.0 * (e * 0.6931471805599453 + (2.0 * s + 2.0 * s * (s2 * p))))
    kq = ((u2 >= 0.125) * 1.0 + (u2 >= 0.375) * 1.0) + (u2 >= 0.625) * 1.0 + (u2 >= 0.875) * 1.0
    x = (u2 - kq * 0.25) * 6.283185307179586
    x2 = x * x
    sn = x + x * (x2 * _poly(x2, [-1.0 / 1307674368000.0, 1.0 / 6227020800.0, -1.0 / 39916800.0, 1.0 / 362880.0,
                                  -1.0 / 5040.0, 1.0 / 120.0, -1.0 / 6.0]))
    cs = 1.0 + x2 * _poly(x2, [1.0 / 20922789888000.0, -1.0 / 87178291200.0, 1.0 / 479001600.0,
                               -1.0 / 3628800.0, 1.0 / 40320.0, -1.0 / 720.0, 1.0 / 24.0, -0.5])
    c = xp.where(kq == 1.0, -sn, xp.where(kq == 2.0, -cs, xp.where(kq == 3.0, sn, cs)))
    sv = xp.where(kq == 1.0, cs, xp.where(kq == 2.0, -sn, xp.where(kq == 3.0, -cs, sn)))
    return xp.stack([r * c, r * sv], axis=1).reshape(-1)


def splitmix_words(seed: int, pairs_from: int, pairs_to: int, xp=np):
    """The words (a, b) of pairs pairs_from .. pairs_to - 1: SplitMix64 outputs 2j + 1 and 2j + 2 of seed."""
    first = np.uint64(2) * xp.arange(pairs_from, pairs_to, dtype=np.uint64) + np.uint64(1)
    return splitmix.outputs(seed, first), splitmix.outputs(seed, first + np.uint64(1))


def gaussian_reference(seed: int, count: int, mean: float = 0.0, std: float = 1.0, first: int = 0, xp=np):
    """Gaussian values number first .. first + count - 1 of `seed` (float64), as kernels.rng.gaussian_fill
    computes them: the same bits."""
    z = box_muller_reference(*splitmix_words(seed, first // 2, (first + count + 1) // 2, xp), xp=xp)
    lo = first - 2 * (first // 2)
    return mean + std * z[lo:lo + count]


def _normal(rng, mean, std, out) -> None:
    """out (flat, float32 or float64) = gaussian values (mean, std) of a seed drawn from rng (module doc)."""
    seed = int(rng.integers(0, 2 ** 63))
    if _cpu.rng is not None and out.dtype in _cpu.FLOATS:
        _cpu.rng.gaussian_fill(out, seed, float(mean), float(std))
        return
    for i in range(0, out.size, _CHUNK):  # (a float64 temporary of a chunk's size only)
        out[i:i + _CHUNK] = gaussian_reference(seed, min(_CHUNK, out.size - i), mean, std, first=i)


def _fill_normal(rng, mean, std, data) -> None:
    """data = gaussian values (mean, std), written in place where data is one contiguous run."""
    if data.flags.c_contiguous:
        _normal(rng, mean, std, data.reshape(-1))
        return
    flat = np.empty(data.size, data.dtype)
    _normal(rng, mean, std, flat)
    data[...] = flat.reshape(data.shape)


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
        _fill_normal(rng, param.mean, param.std, data)
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
        _fill_normal(rng, 0.0, std, data)
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

"""Fuzzing the loaders: mutated caffemodels (current and V1), prototxts, solver states, mean files and Datums.

Every load must end in a successful load or a clear error (one of the framework's error types, naming the
file or record), never in a crash, a hang, or an allocation beyond the input's own size (measured with
tracemalloc: NumPy arrays and Python objects; what protobuf's C parser allocates is bounded by the input
it parses). Examples are derandomized under CI; `ci` keeps the whole file to a few seconds, HYPOTHESIS_PROFILE
=long runs thousands.
"""
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

pytest.importorskip("caffe.solver", reason="the fuzz covers solver states: needs caffe-solver")

import caffe  # noqa: E402
from caffe.blob import context  # noqa: E402
from caffe.blob.fileio import FileInputError  # noqa: E402
from caffe.blob.memory import BlobMemoryError  # noqa: E402
from caffe.blob.proto_io import array_to_blob_proto  # noqa: E402
from caffe.layers import LayerError  # noqa: E402
from caffe.layers.data_transformer import (DataError, DataTransformer, array_to_datum, load_mean_file,  # noqa: E402
                                           parse_datum)
from caffe.net import Net, ProtoFileError, WeightsError  # noqa: E402
from caffe.net.graph import FilterNet, InsertSplits, NetError  # noqa: E402
from caffe.net.upgrade import ReadNetParamsFromTextFileOrDie, UpgradeError  # noqa: E402
from caffe.proto import caffe_pb2  # noqa: E402
from caffe.solver import Solver, SolverError  # noqa: E402
from caffe.solver.testing import least_squares_net, solver_param  # noqa: E402

CLEAR = (ProtoFileError, WeightsError, NetError, UpgradeError, SolverError, DataError, LayerError, FileInputError,
         BlobMemoryError)

NET = """name: "fuzz"
layer { name: "data" type: "Input" top: "data" input_param { shape: { dim: 2 dim: 1 dim: 8 dim: 8 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 3 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1" inner_product_param { num_output: 4 } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "prob" type: "Softmax" bottom: "ip1" top: "prob" }
"""

V1_NET = """name: "old"
input: "data" input_dim: 2 input_dim: 1 input_dim: 8 input_dim: 8
layers { name: "conv1" type: CONVOLUTION bottom: "data" top: "conv1" blobs_lr: 1 blobs_lr: 2
         convolution_param { num_output: 3 kernel_size: 3 } }
layers { name: "ip1" type: INNER_PRODUCT bottom: "conv1" top: "ip1" inner_product_param { num_output: 4 } }
"""

# scale with the profile: ci 12 -> 36 examples per loader (a few seconds in all), long 500 -> 1500
EXAMPLES = settings.default.max_examples * 3
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
HANG_S = 60  # a load taking longer than this counts as a hang (generous: the CI machine may be loaded)


# -- seeds ---------------------------------------------------------------------------------------------

def _net():
    return Net(NET, caffe.TEST)


def _seeds():
    seeds = {}
    net = _net()
    seeds["caffemodel"] = net.ToProto().SerializeToString()
    v1 = caffe_pb2.NetParameter()
    from google.protobuf import text_format
    text_format.Parse(V1_NET, v1)
    for layer, n in zip(v1.layers, (2, 2)):
        src = net.params["conv1" if layer.name == "conv1" else "ip1"]
        for blob in src[:n]:
            layer.blobs.add().CopyFrom(blob.to_proto())
    seeds["caffemodel_v1"] = v1.SerializeToString()
    seeds["mean"] = array_to_blob_proto(np.random.default_rng(0).random((1, 3, 4, 5), dtype=np.float32)
                                        ).SerializeToString()
    rng = np.random.default_rng(1)
    seeds["datum_raw"] = array_to_datum(rng.integers(0, 256, (3, 4, 5), dtype=np.uint8), 7).SerializeToString()
    seeds["datum_float"] = array_to_datum(rng.random((1, 3, 3), dtype=np.float32), 2).SerializeToString()
    try:
        import io
        from PIL import Image
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)).save(buf, format="PNG")
        seeds["datum_png"] = caffe_pb2.Datum(data=buf.getvalue(), encoded=True, label=1).SerializeToString()
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)).save(buf, format="JPEG")
        seeds["datum_jpeg"] = caffe_pb2.Datum(data=buf.getvalue(), encoded=True, label=1).SerializeToString()
    except ImportError:
        pass
    return seeds


SEEDS = _seeds()

# a byte string that decodes as a huge varint: as a length, a dimension or a count
HUGE_VARINTS = [b"\xff\xff\xff\xff\x0f", b"\xff\xff\xff\xff\xff\xff\xff\xff\x7f", b"\x80\x80\x80\x80\x08"]


@st.composite
def mutated(draw, seed: bytes):
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["set", "truncate", "insert", "delete", "varint", "dup"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "set" and data:
            data[pos] = draw(st.integers(0, 255))
        elif op == "truncate":
            del data[pos:]
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del data[pos:pos + draw(st.integers(1, 64))]
        elif op == "varint":
            data[pos:pos + draw(st.integers(0, 5))] = draw(st.sampled_from(HUGE_VARINTS))
        elif op == "dup" and data:
            n = draw(st.integers(1, 256))
            data[pos:pos] = data[pos:pos + n]
    return bytes(data)


TOKENS = ["{", "}", ":", '"', "layer", "layers", "dim:", "num_output:", "kernel_size:", "stride:", "pad:",
          "bottom:", "top:", "type:", '"Convolution"', '"Pooling"', "-1", "0", "99999", "2147483648",
          "1e39", "nan", "input_dim:", "phase: TRAIN", "include { phase: TEST }", "\n", "#", "'"]


@st.composite
def mutated_text(draw, seed: str):
    words = seed.replace("{", " { ").replace("}", " } ").split(" ")
    for _ in range(draw(st.integers(1, 5))):
        pos = draw(st.integers(0, len(words) - 1))
        op = draw(st.sampled_from(["replace", "insert", "delete", "number"]))
        if op == "replace":
            words[pos] = draw(st.sampled_from(TOKENS))
        elif op == "insert":
            words.insert(pos, draw(st.sampled_from(TOKENS) | st.text(max_size=8)))
        elif op == "delete" and len(words) > 1:
            del words[pos]
        else:
            words[pos] = str(draw(st.integers(-2**40, 2**40) | st.integers(-3, 300)))
    return " ".join(words)


# -- the check every load goes through -------------------------------------------------------------------

def load_checked(fn, input_size: int, names: tuple = (), bound: bool = True):
    """Run one load: a success or a CLEAR error naming one of `names`; never long, never a big allocation."""
    tracemalloc.start()
    start = time.monotonic()
    try:
        fn()
        outcome = None
    except CLEAR as exc:
        outcome = exc
    except Exception as exc:  # anything else is an internal error: show it
        raise AssertionError(f"internal error instead of a clear one: {type(exc).__name__}: {exc}") from exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    elapsed = time.monotonic() - start
    assert elapsed < HANG_S, f"a load took {elapsed:.0f} s"
    if bound:
        assert peak <= 16 * input_size + (4 << 20), f"allocated {peak} bytes for a {input_size}-byte input"
    if outcome is not None and names:
        assert any(n in str(outcome) for n in names), f"the error names none of {names}: {outcome}"
        assert len(str(outcome)) < 3000, "the message is not one readable line"
    return outcome


# -- caffemodels -------------------------------------------------------------------------------------

@FUZZ
@given(data=st.sampled_from(["caffemodel", "caffemodel_v1"]).flatmap(lambda k: mutated(SEEDS[k])))
def test_mutated_caffemodels(tmp_path_factory, data):
    path = str(tmp_path_factory.mktemp("w") / "fuzz.caffemodel")
    with open(path, "wb") as f:
        f.write(data)
    net = _net()
    load_checked(lambda: net.CopyTrainedLayersFrom(path), len(data), (path,))


# -- prototxts: parse, upgrade, filter, insert splits (the loader; building layers allocates by design) ----

@FUZZ
@given(text=st.sampled_from([NET, V1_NET]).flatmap(mutated_text))
def test_mutated_prototxts(tmp_path_factory, text):
    path = str(tmp_path_factory.mktemp("p") / "fuzz.prototxt")
    with open(path, "w") as f:
        f.write(text)

    def load():
        param = ReadNetParamsFromTextFileOrDie(path)
        param.state.phase = caffe.TEST
        InsertSplits(FilterNet(param))
    load_checked(load, len(text.encode()), (path, "layer", "Layer"))


# -- solver states -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def state_seed(tmp_path_factory):
    d = tmp_path_factory.mktemp("state")
    context.set_random_seed(1)
    s = Solver(solver_param(least_squares_net(4, 3), type="Nesterov", base_lr=0.01, lr_policy="fixed",
                            momentum=0.9, display=0, snapshot_prefix=str(d / "s")))
    s.step(1)
    s.Snapshot()
    s.release_snapshot_prefix()
    return d, (d / "s_iter_1.solverstate").read_bytes()


@FUZZ
@given(data=st.data())
def test_mutated_solverstates(state_seed, data):
    d, seed = state_seed
    raw = data.draw(mutated(seed))
    path = str(d / "fuzz.solverstate")
    with open(path, "wb") as f:
        f.write(raw)
    context.set_random_seed(1)
    solver = Solver(solver_param(least_squares_net(4, 3), type="Nesterov", base_lr=0.01, lr_policy="fixed",
                                 momentum=0.9, display=0, snapshot_prefix=str(d / "s")))
    load_checked(lambda: solver.Restore(path), len(raw), (path,))


# -- mean files and Datums -----------------------------------------------------------------------------

@FUZZ
@given(data=mutated(SEEDS["mean"]))
def test_mutated_mean_files(tmp_path_factory, data):
    path = str(tmp_path_factory.mktemp("m") / "mean.binaryproto")
    with open(path, "wb") as f:
        f.write(data)
    load_checked(lambda: load_mean_file(path), len(data), (path,))


@FUZZ
@given(kind=st.sampled_from(sorted(k for k in SEEDS if k.startswith("datum"))), data=st.data(),
       crop=st.sampled_from([0, 2]), force=st.sampled_from(["", "force_color: true", "force_gray: true"]))
def test_mutated_datums(kind, data, crop, force):
    raw = data.draw(mutated(SEEDS[kind]))
    where = "record 'fuzz' of LMDB 'db'"
    tp = caffe_pb2.TransformationParameter()
    from google.protobuf import text_format
    text_format.Parse(f"crop_size: {crop} scale: 0.5 {force}", tp)
    tf = DataTransformer(tp, phase=caffe.TEST, name="Layer 'data' (Data)")

    def load():
        datum = parse_datum(raw, where)
        image = tf.image(datum, where)
        shape = tf.infer_blob_shape(image, where)
        out = np.empty(shape[1:], np.float32)
        tf.transform(image, out, where=where)
    load_checked(load, len(raw), ("'fuzz'",))

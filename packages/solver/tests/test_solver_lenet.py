"""Fidelity against BVLC Caffe: 100 LeNet iterations of lenet_ref_solver.prototxt on the digits data.

The train net is lenet_train_input.prototxt (Input-fed), given each iteration exactly what Caffe's Data
layer delivered: records (i * 64) % 1500 onward of digits_train_lmdb (= digits records 0..1499), times
0.00390625; it starts from lenet_iter_0.caffemodel. The loss curve and the iteration-100 weights must
follow Caffe's, and Caffe's own lenet_iter_100.solverstate must resume here.

Tolerances: the issue's own bounds hold (test_issue_bounds_...): losses 0-19 within 1e-3, every weight at
iteration 100 within 5%. They needed LeNet's conv1 forward taken correctly rounded (caffe.layers.conv_base.
EXACT_FORWARD_MAX_K): with plain sgemm rounding, max-pooling near-ties flipped and our float32 run left
Caffe's trajectory at iteration 9 (while the same net in float64 followed Caffe's float32 losses to 3e-7).
The other tests keep looser, trajectory-robust checks (mean of late losses, direction and length of the
weights' displacement), so they say something useful even if a layer's rounding changes again.
"""
import os

import numpy as np
import pytest

pytest.importorskip("caffe.net", reason="caffe-net (caffe.net.Net) is not installed")

import caffe  # noqa: E402
from caffe.solver import SGDSolver, read_solver_params  # noqa: E402

REF = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "shared", "reference", "lenet")
REF = os.path.normpath(os.environ.get("CAFFE_LENET_REFERENCE", REF))
LAYERS = ["conv1", "conv2", "ip1", "ip2"]

pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(REF, "lenet_ref_solver.prototxt")),
                                reason=f"LeNet reference outputs from BVLC Caffe not found at {REF}")


def needs_layers():
    missing = ({"Input", "Convolution", "Pooling", "InnerProduct", "ReLU", "SoftmaxWithLoss"}
               - set(caffe.layer_type_list()))
    if missing:
        pytest.skip(f"layers not implemented yet: {sorted(missing)}")


def ref(*parts):
    return os.path.join(REF, *parts)


def lenet_solver(weights=None):
    """lenet_ref_solver.prototxt with the Input-fed train net in place of the LMDB one (no test nets)."""
    from caffe.net.upgrade import ReadNetParamsFromTextFileOrDie
    p = read_solver_params(ref("lenet_ref_solver.prototxt"))
    p.ClearField("net")
    p.net_param.CopyFrom(ReadNetParamsFromTextFileOrDie(ref("lenet_train_input.prototxt")))
    del p.test_iter[:]
    p.test_interval = 0
    p.display = 0
    p.snapshot_after_train = False
    if weights:
        p.weights.append(weights)
    return SGDSolver(p)


class DigitsFeed:
    """What Caffe's Data layer delivers at iteration i: 64 records from (i * 64) % 1500, wrapping at 1500."""

    def __init__(self, solver):
        self.images = np.load(ref("data", "digits_28x28_uint8.npy"))[:1500]
        self.labels = np.load(ref("data", "digits_labels.npy"))[:1500]
        self.solver = solver
        self.losses, self.fed_labels = [], []
        solver.add_callback(self.on_start, self.on_gradients_ready)

    def batch(self, i):
        idx = (np.arange(64) + i * 64) % 1500
        return self.images[idx, None].astype(np.float32) * np.float32(0.00390625), self.labels[idx]

    def on_start(self):
        data, labels = self.batch(self.solver.iter)
        self.solver.net.blobs["data"].data[...] = data
        self.solver.net.blobs["label"].data[...] = labels
        self.fed_labels.append(labels.astype(np.float32))

    def on_gradients_ready(self):
        self.losses.append(float(self.solver.net.blobs["loss"].data))


@pytest.fixture(scope="module")
def trained():
    needs_layers()
    solver = lenet_solver(weights=ref("lenet_iter_0.caffemodel"))
    feed = DigitsFeed(solver)
    np.testing.assert_array_equal(feed.batch(0)[0], np.load(ref("train100", "data_iter0.npy")))
    solver.step(100)
    return solver, feed


def displacement_agreement(ours, theirs, start):
    """(cosine, norm ratio) of the training displacements ours - start and theirs - start."""
    a = (np.asarray(ours, np.float64) - start).ravel()
    b = (np.asarray(theirs, np.float64) - start).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))), float(np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.slow
def test_loss_curve_follows_caffe(trained):
    solver, feed = trained
    np.testing.assert_array_equal(np.array(feed.fed_labels), np.load(ref("train100", "labels_per_iter.npy")))
    want = np.load(ref("train100", "loss_per_iter.npy")).astype(np.float64)
    got = np.array(feed.losses)
    assert solver.iter == 100 and got.shape == (100,)
    # the first nine updates reproduce Caffe's to float32 rounding (observed <= 4e-6)
    np.testing.assert_allclose(got[:9], want[:9], rtol=1e-5)
    # then one-ulp differences grow chaotically (observed 1.1e-3 at iteration 18 with a 2-thread BLAS,
    # 7e-4 with one thread; Caffe itself drifts ~1e-3 between BLAS thread counts)
    np.testing.assert_allclose(got[:20], want[:20], rtol=2e-3)
    assert got[80:].mean() == pytest.approx(want[80:].mean(), rel=0.02)


@pytest.mark.slow
def test_weights_after_100_iterations_follow_caffe(trained):
    """The weights moved as Caffe's did: same direction (cosine of the displacement from iteration 0 > 0.99)
    and same distance (norms within 2%); conv weights within 5% of Caffe's (max difference / max value).

    The max-difference metric is not used for the inner-product layers: a one-ulp change of the starting
    weights moves it between 1% and 29% (ip1 bias) there, while the displacement metrics stay within
    0.4% / 1%; a wrong lr_mult, momentum or learning rate moves the norm ratio far more than 2%."""
    solver, _ = trained
    for name in LAYERS:
        for i, suffix in enumerate("wb"):
            start = np.load(ref("params_iter0", f"{name}_{suffix}.npy")).astype(np.float64)
            want = np.load(ref("params_iter100", f"{name}_{suffix}.npy"))
            got = solver.net.params[name][i].data
            rel = np.abs(got - want).max() / np.abs(want).max()
            cos, ratio = displacement_agreement(got, want, start)
            msg = f"{name} {suffix}: cosine {cos:.4f}, norm ratio {ratio:.4f}, max rel. difference {rel:.4f}"
            assert cos > 0.99 and abs(ratio - 1) < 0.02, msg
            if name.startswith("conv"):
                assert rel < 0.05, msg


@pytest.mark.slow
def test_issue_bounds_loss_0_19_within_1e3_and_all_weights_within_5_percent(trained):
    """The issue's own bounds: losses of iterations 0-19 within 1e-3 relative, every weight at iteration 100
    within 5% (max abs difference over max abs value). They hold since LeNet's conv1 forward is taken
    correctly rounded (conv_base.EXACT_FORWARD_MAX_K), conv2's by Caffe's sgemm (conv_cpu.dense_rule keeps
    unpadded layers blocked: its dense forward gave 4.9%) and the float rates by C's powf, as Caffe's (NumPy's
    AVX-512 float32 pow gave 8.1%): measured 4e-7 and 2.1% (ip1 b), with 1 or 2 BLAS threads, on AVX2 and
    AVX-512 machines."""
    solver, feed = trained
    ref_loss = np.load(ref("train100", "loss_per_iter.npy"))
    rel = np.abs(np.array(feed.losses) - ref_loss) / np.abs(ref_loss)
    assert rel[:20].max() <= 1e-3
    for layer in LAYERS:
        for j, suffix in enumerate("wb"):
            theirs = np.load(ref("params_iter100", f"{layer}_{suffix}.npy"))
            ours = solver.net.params[layer][j].data
            assert np.abs(ours - theirs).max() / np.abs(theirs).max() <= 0.05, (layer, suffix)


@pytest.mark.slow
def test_history_after_100_iterations_follows_caffes_solverstate(trained):
    """Our momentum history against the one in Caffe's lenet_iter_100.solverstate (observed: cosine >= 0.99,
    norms within 5%)."""
    from caffe.proto import caffe_pb2
    solver, _ = trained
    state = caffe_pb2.SolverState()
    with open(ref("lenet_iter_100.solverstate"), "rb") as f:
        state.ParseFromString(f.read())
    assert len(state.history) == len(solver.history)
    for i, (ours, theirs) in enumerate(zip(solver.history, state.history)):
        want = np.asarray(theirs.data, np.float32).reshape(ours.shape)
        cos, ratio = displacement_agreement(ours.data, want, 0.0)
        assert cos > 0.98 and abs(ratio - 1) < 0.1, f"history {i}: cosine {cos:.4f}, norm ratio {ratio:.4f}"


@pytest.fixture(scope="module")
def solved_from_lmdb(tmp_path_factory, trained):
    """lenet_ref_solver.prototxt as Caffe ran it: Data layers on the digits LMDBs, a test net, Solve()."""
    lmdb = pytest.importorskip("lmdb")
    if "Data" not in caffe.layer_type_list():
        pytest.skip("the Data layer is not implemented yet")
    from caffe.proto import caffe_pb2
    import shutil
    work = tmp_path_factory.mktemp("lenet_lmdb")
    for name in ("lenet_ref_solver.prototxt", "lenet_digits_train_test.prototxt", "lenet_iter_0.caffemodel"):
        shutil.copy(ref(name), work / name)
    # Caffe's fillers drew lenet_iter_0 from its own generator: start from those weights (solver `weights`)
    with open(work / "lenet_ref_solver.prototxt", "a") as f:
        f.write('\nweights: "lenet_iter_0.caffemodel"\n')
    images = np.load(ref("data", "digits_28x28_uint8.npy"))
    labels = np.load(ref("data", "digits_labels.npy"))
    for db_name, records in (("digits_train_lmdb", range(0, 1500)), ("digits_test_lmdb", range(1500, 1797))):
        env = lmdb.open(str(work / db_name), map_size=1 << 26)
        with env.begin(write=True) as txn:  # one write transaction, keys '%08d' % i, as the README says
            for i in records:
                datum = caffe_pb2.Datum(channels=1, height=28, width=28, data=images[i].tobytes(),
                                        label=int(labels[i]))
                txn.put(b"%08d" % i, datum.SerializeToString())
        env.close()
    cwd = os.getcwd()
    os.chdir(work)  # every path in the prototxts is relative to the current directory, as in Caffe
    try:
        solver = caffe.get_solver("lenet_ref_solver.prototxt")
        losses = []
        solver.add_callback(None, lambda: losses.append(float(solver.net.blobs["loss"].data)))
        tests = []
        orig_test = solver.Test

        def test_and_record(i=0):
            orig_test(i)
            tests.append((solver.iter, list(solver.mean_scores[i])))

        solver.Test = test_and_record
        solver.solve()
    finally:
        os.chdir(cwd)
    return solver, losses, tests, work


@pytest.mark.slow
def test_solve_on_the_lmdbs_matches_the_input_fed_run_and_caffes_test(solved_from_lmdb, trained):
    solver, losses, tests, work = solved_from_lmdb
    input_solver, feed = trained
    # the Data layer delivers exactly what the Input-fed run was given: the same losses, bit for bit
    np.testing.assert_array_equal(np.array(losses), np.array(feed.losses))
    for a, b in zip(solver.net.learnable_params, input_solver.net.learnable_params):
        np.testing.assert_array_equal(a.data, b.data)
    # TestAll at iteration 0 and the final one at 100 (test_interval 100, test_iter 3)
    assert [it for it, _ in tests] == [0, 100]
    names = solver.test_nets[0].output_blob_names
    after = dict(zip(names, tests[1][1]))
    with open(ref("index.json")) as f:
        import json
        want = json.load(f)["train100_test_after"]
    assert after["accuracy"] == pytest.approx(want["accuracy_mean_3x100"], abs=0.02)
    assert after["loss"] == pytest.approx(want["loss_mean_3x100"], rel=0.05)
    # Solve's after-training snapshot, named as Caffe names it, with Caffe's layout
    from caffe.proto import caffe_pb2
    state = caffe_pb2.SolverState()
    state.ParseFromString((work / "lenet_iter_100.solverstate").read_bytes())
    theirs = caffe_pb2.SolverState()
    with open(ref("lenet_iter_100.solverstate"), "rb") as f:
        theirs.ParseFromString(f.read())
    assert (state.iter, state.learned_net, state.current_step) == (theirs.iter, theirs.learned_net,
                                                                   theirs.current_step)
    assert [tuple(h.shape.dim) for h in state.history] == [tuple(h.shape.dim) for h in theirs.history]


def test_caffes_solverstate_resumes_here(tmp_path, monkeypatch):
    """Restore BVLC Caffe's lenet_iter_100.solverstate (learned_net 'lenet_iter_100.caffemodel', a path
    relative to where Caffe ran) and take one more step."""
    needs_layers()
    monkeypatch.chdir(tmp_path)  # Caffe's relative learned_net is not here: it is found next to the state
    solver = lenet_solver()
    feed = DigitsFeed(solver)
    solver.restore(ref("lenet_iter_100.solverstate"))
    assert solver.iter == 100 and solver.current_step == 0
    assert [h.shape for h in solver.history] == [b.shape for b in solver.net.learnable_params]
    for name in LAYERS:
        np.testing.assert_array_equal(solver.net.params[name][0].data,
                                      np.load(ref("params_iter100", f"{name}_w.npy")))
    before = [b.data.copy() for b in solver.net.learnable_params]
    history = [h.data.copy() for h in solver.history]
    grads = []
    solver.add_callback(None, lambda: grads.extend(b.diff.astype(np.float64) for b in solver.net.learnable_params))
    solver.step(1)
    assert solver.iter == 101 and len(feed.losses) == 1 and np.isfinite(feed.losses[0])
    # one SGD step from the restored state: h = 0.9 h + rate * lr_mult * (g + 5e-4 * decay_mult * w); w -= h
    rate = 0.01 * (1 + 0.0001 * 100) ** -0.75
    for i, (b, w0, h0, g) in enumerate(zip(solver.net.learnable_params, before, history, grads)):
        h = 0.9 * h0 + rate * solver.net.params_lr[i] * (g + 5e-4 * solver.net.params_weight_decay[i] * w0)
        np.testing.assert_allclose(solver.history[i].data, h, rtol=1e-4, atol=1e-9)
        np.testing.assert_allclose(b.data, w0 - h, rtol=1e-5, atol=1e-8)
    solver.snapshot()  # snapshot_prefix "lenet", relative to the current directory as in Caffe
    assert (tmp_path / "lenet_iter_101.caffemodel").exists() and (tmp_path / "lenet_iter_101.solverstate").exists()

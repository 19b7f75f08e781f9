"""pycaffe as Caffe's example notebooks use it, on small generated data: nets written with NetSpec and
trained by solvers built from a SolverParameter (LMDB LeNet, HDF5 logistic regression, a Python data
layer with a multilabel loss, fine-tuning with frozen layers), the snake_case surface of pycaffe's
Solver, and Caffe's log lines on stderr during Net construction, solve() and step()."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import caffe
from caffe import layers as L, params as P
from caffe.proto import caffe_pb2

PYCAFFE_SOLVER = "net test_nets iter add_callback solve step restore snapshot share_weights apply_update param".split()


def write(path, proto):
    path.write_text(str(proto))
    return str(path)


def solver_param(train, test=None, **fields):
    s = caffe_pb2.SolverParameter()
    s.train_net = train
    if test:
        s.test_net.append(test)
        s.test_interval = 1000
        s.test_iter.append(2)
    s.base_lr, s.momentum, s.weight_decay = 0.01, 0.9, 5e-4
    s.lr_policy, s.gamma, s.power = "inv", 1e-4, 0.75
    s.display = 0
    s.random_seed = 0xCAFFE
    s.solver_mode = caffe_pb2.SolverParameter.GPU  # pycaffe ignores it: the mode is set_mode_*'s
    for k, v in fields.items():
        setattr(s, k, v)
    return s


@pytest.fixture(scope="module")
def digits_lmdb(tmp_path_factory):
    """Two tiny LMDBs of 12x12 'digits' (a bright bar whose row is the label)."""
    from caffe.layers.db import DBWriter
    d = tmp_path_factory.mktemp("digits")
    rng = np.random.default_rng(0)
    for split, n in (("train", 64), ("test", 32)):
        with DBWriter(str(d / f"{split}_lmdb"), "lmdb") as w:
            for i in range(n):
                label = int(rng.integers(4))
                img = rng.integers(0, 40, (1, 12, 12), dtype=np.uint8)
                img[0, 2 + 2 * label] = 255
                w.put(b"%08d" % i, caffe.io.array_to_datum(img, label).SerializeToString())
    return d


def lenet_like(source, batch):
    n = caffe.NetSpec()
    n.data, n.label = L.Data(batch_size=batch, backend=P.Data.LMDB, source=source,
                             transform_param=dict(scale=1. / 255), ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=3, num_output=4, weight_filler=dict(type="xavier"))
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.fc1 = L.InnerProduct(n.pool1, num_output=16, weight_filler=dict(type="xavier"))
    n.relu1 = L.ReLU(n.fc1, in_place=True)
    n.score = L.InnerProduct(n.relu1, num_output=4, weight_filler=dict(type="xavier"))
    n.loss = L.SoftmaxWithLoss(n.score, n.label)
    return n.to_proto()


def test_lmdb_lenet_stepped_from_python(digits_lmdb, tmp_path):
    caffe.set_mode_cpu()
    train = write(tmp_path / "train.prototxt", lenet_like(str(digits_lmdb / "train_lmdb"), 16))
    test = write(tmp_path / "test.prototxt", lenet_like(str(digits_lmdb / "test_lmdb"), 8))
    path = write(tmp_path / "solver.prototxt", solver_param(train, test, base_lr=0.05))
    solver = caffe.get_solver(path)
    assert isinstance(solver, caffe.SGDSolver)
    missing = [m for m in PYCAFFE_SOLVER if not hasattr(solver, m)]
    assert not missing, missing
    assert [(k, v.data.shape) for k, v in solver.net.blobs.items()][:2] == [("data", (16, 1, 12, 12)),
                                                                            ("label", (16,))]
    assert [k for k in solver.net.params] == ["conv1", "fc1", "score"]
    assert solver.param.max_iter == 0 and solver.lr == pytest.approx(0.05)
    solver.net.forward()
    solver.test_nets[0].forward()
    solver.step(1)
    assert np.abs(solver.net.params["conv1"][0].diff).max() > 0
    losses = []
    for it in range(60):
        solver.step(1)
        losses.append(float(solver.net.blobs["loss"].data))
        solver.test_nets[0].forward(start="conv1")  # the same test batch again, data layer skipped
    assert solver.iter == 61
    correct = 0
    for _ in range(4):
        solver.test_nets[0].forward()
        correct += int((solver.test_nets[0].blobs["score"].data.argmax(1)
                        == solver.test_nets[0].blobs["label"].data).sum())
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) and correct >= 24  # of 32: it learned the bars


def test_hdf5_logistic_regression_solved(tmp_path):
    import h5py
    rng = np.random.default_rng(1)
    X = rng.normal(size=(400, 4)).astype(np.float32)
    y = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(np.float32)
    lists = {}
    for split, sl in (("train", slice(0, 300)), ("test", slice(300, 400))):
        h5 = tmp_path / f"{split}.h5"
        with h5py.File(h5, "w") as f:
            f["data"], f["label"] = X[sl], y[sl]
        lists[split] = tmp_path / f"{split}.txt"
        lists[split].write_text(f"{h5}\n")

    def logreg(source, batch):
        n = caffe.NetSpec()
        n.data, n.label = L.HDF5Data(batch_size=batch, source=source, ntop=2)
        n.ip1 = L.InnerProduct(n.data, num_output=2, weight_filler=dict(type="xavier"))
        n.accuracy = L.Accuracy(n.ip1, n.label)
        n.loss = L.SoftmaxWithLoss(n.ip1, n.label)
        return n.to_proto()

    train = write(tmp_path / "train.prototxt", logreg(str(lists["train"]), 10))
    test = write(tmp_path / "test.prototxt", logreg(str(lists["test"]), 10))
    s = solver_param(train, test, max_iter=300, lr_policy="step", stepsize=200, gamma=0.1, base_lr=0.1,
                     solver_mode=caffe_pb2.SolverParameter.CPU, snapshot_after_train=False)
    s.test_interval = 300
    solver = caffe.get_solver(write(tmp_path / "solver.prototxt", s))
    solver.solve()
    net = solver.test_nets[0]
    accuracy = np.mean([float(net.forward()["accuracy"]) for _ in range(net.blobs["data"].num)])
    assert solver.iter == 300 and accuracy > 0.9


DATA_LAYER = textwrap.dedent('''
    import ast
    import numpy as np
    import caffe

    class MultilabelData(caffe.Layer):
        """Random images and their multi-hot labels: label k is on when channel k's mean is high."""
        def setup(self, bottom, top):
            params = ast.literal_eval(self.param_str)
            self.batch, self.shape = params["batch_size"], params["im_shape"]
            self.rng = np.random.default_rng(params["seed"])
        def reshape(self, bottom, top):
            top[0].reshape(self.batch, 3, *self.shape)
            top[1].reshape(self.batch, 3)
        def forward(self, bottom, top):
            on = self.rng.random((self.batch, 3)) < 0.5
            top[0].data[...] = self.rng.normal(size=top[0].data.shape) + 2.0 * on[:, :, None, None]
            top[1].data[...] = on
        def backward(self, top, propagate_down, bottom):
            pass
''')


def test_python_data_layer_multilabel(tmp_path, monkeypatch):
    (tmp_path / "multilabel_layers.py").write_text(DATA_LAYER)
    monkeypatch.syspath_prepend(str(tmp_path))

    def multilabel_net(params):
        n = caffe.NetSpec()
        n.data, n.label = L.Python(module="multilabel_layers", layer="MultilabelData", ntop=2,
                                   param_str=str(params))
        n.conv1 = L.Convolution(n.data, kernel_size=3, num_output=6, weight_filler=dict(type="xavier"))
        n.relu1 = L.ReLU(n.conv1, in_place=True)
        n.pool1 = L.Pooling(n.relu1, pool=P.Pooling.AVE, global_pooling=True)
        n.score = L.InnerProduct(n.pool1, num_output=3, weight_filler=dict(type="xavier"))
        n.loss = L.SigmoidCrossEntropyLoss(n.score, n.label)
        return str(n.to_proto())

    train = tmp_path / "train.prototxt"
    train.write_text(multilabel_net(dict(batch_size=16, im_shape=[8, 8], seed=0)))
    val = tmp_path / "val.prototxt"
    val.write_text(multilabel_net(dict(batch_size=16, im_shape=[8, 8], seed=1)))
    s = solver_param(str(train), str(val), base_lr=0.1)
    solver = caffe.SGDSolver(write(tmp_path / "solver.prototxt", s))
    weights = str(tmp_path / "init.caffemodel")
    solver.net.save(weights)
    solver.net.copy_from(weights)
    solver.test_nets[0].share_with(solver.net)
    solver.step(60)
    net = solver.test_nets[0]
    hits = 0.0
    for _ in range(4):
        net.forward()
        hits += np.mean((net.blobs["score"].data > 0) == (net.blobs["label"].data > 0.5))
    assert hits / 4 > 0.85  # hamming accuracy; a constant guess scores about 0.5


def test_fine_tuning_with_frozen_layers(tmp_path):
    learned = [dict(lr_mult=1, decay_mult=1), dict(lr_mult=2, decay_mult=0)]
    frozen = [dict(lr_mult=0)] * 2

    def small_net(data, label=None, train=True, classes=5, classifier="fc_new", learn_all=False):
        n = caffe.NetSpec()
        n.data = data
        param = learned if learn_all else frozen
        n.conv1 = L.Convolution(n.data, kernel_size=3, num_output=4, param=param,
                                weight_filler=dict(type="gaussian", std=0.1), bias_filler=dict(type="constant"))
        n.relu1 = L.ReLU(n.conv1, in_place=True)
        n.fc7 = L.InnerProduct(n.relu1, num_output=8, param=param, weight_filler=dict(type="gaussian", std=0.1))
        top = L.Dropout(n.fc7, in_place=True) if train else n.fc7
        fc = L.InnerProduct(top, num_output=classes, param=learned, weight_filler=dict(type="xavier"))
        n.__setattr__(classifier, fc)
        if not train:
            n.probs = L.Softmax(fc)
        if label is not None:
            n.label = label
            n.loss = L.SoftmaxWithLoss(fc, n.label)
            n.acc = L.Accuracy(fc, n.label)
        path = tmp_path / f"net_{len(list(tmp_path.iterdir()))}.prototxt"
        path.write_text(str(n.to_proto()))
        return str(path)

    base = caffe.Net(small_net(L.DummyData(shape=dict(dim=[1, 3, 6, 6])), train=False, classes=10,
                               classifier="fc8"), caffe.TEST)
    weights = str(tmp_path / "base.caffemodel")
    base.save(weights)
    deploy = caffe.Net(small_net(L.DummyData(shape=dict(dim=[1, 3, 6, 6])), train=False, classes=10,
                                 classifier="fc8"), weights, caffe.TEST)  # pycaffe's legacy (file, weights, phase) form
    deploy.blobs["data"].data[...] = np.random.default_rng(2).normal(size=(1, 3, 6, 6))
    probs = deploy.forward(start="conv1")["probs"][0]
    assert probs.shape == (10,) and abs(probs.sum() - 1) < 1e-5
    data, label = L.DummyData(shape=[dict(dim=[8, 3, 6, 6]), dict(dim=[8])],
                              data_filler=[dict(type="gaussian"), dict(type="constant", value=2)], ntop=2)
    style = caffe.get_solver(write(tmp_path / "solver.prototxt",
                                   solver_param(small_net(data, label, classes=5), base_lr=0.01)))
    style.net.copy_from(weights)  # same-named layers load; the new classifier keeps its fillers
    conv = style.net.params["conv1"][0].data.copy()
    np.testing.assert_array_equal(conv, base.params["conv1"][0].data)
    before = style.net.params["fc_new"][0].data.copy()
    for _ in range(5):
        style.step(1)
        loss, acc = (style.net.blobs[b].data.copy() for b in ("loss", "acc"))
    np.testing.assert_array_equal(style.net.params["conv1"][0].data, conv)  # frozen: lr_mult 0
    assert not np.array_equal(style.net.params["fc_new"][0].data, before) and np.isfinite(loss)


def test_log_lines_during_construction_and_training(tmp_path):
    net = tmp_path / "net.prototxt"
    net.write_text('layer { name: "d" type: "DummyData" top: "x" top: "y" dummy_data_param { '
                   'shape { dim: 4 dim: 3 } shape { dim: 4 } data_filler { type: "gaussian" } data_filler { } } }\n'
                   'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "ip" inner_product_param { num_output: 2 } }\n'
                   'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "y" top: "loss" }\n')
    solver = tmp_path / "solver.prototxt"
    solver.write_text(f'net: "{net}" base_lr: 0.01 lr_policy: "fixed" display: 1 max_iter: 2 '
                      f'snapshot_after_train: false')
    code = f"import caffe\ns = caffe.SGDSolver({str(solver)!r})\ns.step(1)\ns.solve()\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLOG_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    for line in ("] Creating Layer ip", "] Network initialization done.", "] Iteration 0 (",
                 "] Iteration 2, loss = ", "] Optimization Done."):
        assert line in out.stderr, (line, out.stderr[-2000:])
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           env={**env, "GLOG_minloglevel": "2"})
    assert quiet.returncode == 0 and quiet.stderr == ""

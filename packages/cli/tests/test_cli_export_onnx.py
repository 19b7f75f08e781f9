"""caffe-cli export_onnx end to end (with caffe-onnx and onnxruntime installed), and its clear error when
caffe-onnx is not installed (the cli's optional `onnx` extra)."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from caffe.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
LENET = ROOT / "examples" / "mnist" / "lenet.prototxt"

TRAIN_VAL = """name: "tv"
layer { name: "mnist" type: "Data" top: "data" top: "label" data_param { source: "no_such_db" batch_size: 4 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 3 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def test_export_onnx_without_caffe_onnx_names_the_package(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "caffe.onnx", None)  # an import of it now fails, as when not installed
    weights = tmp_path / "w.caffemodel"
    weights.write_bytes(b"")
    out = tmp_path / "net.onnx"
    code = main(["export_onnx", f"--model={LENET}", f"--weights={weights}", f"--output={out}"])
    err = capsys.readouterr().err
    assert code == 1 and "caffe-onnx" in err and 'pip install "caffe-cli[onnx]"' in err
    assert not out.exists()


@pytest.fixture
def lenet_weights(tmp_path):
    """LeNet's deploy net with random weights saved as a caffemodel; returns (net, weights path)."""
    pytest.importorskip("caffe.onnx", reason="export_onnx needs the caffe-onnx package (the cli's onnx extra)")
    import caffe
    from caffe.onnx.testing import randomize
    net = caffe.Net(str(LENET), caffe.TEST)
    randomize(net, np.random.default_rng(0))
    path = tmp_path / "lenet.caffemodel"
    net.save(str(path))
    return net, path


def _run_onnx(path, x):
    from caffe.onnx.testing import run_onnxruntime
    return run_onnxruntime(str(path), {"data": x})


def test_export_onnx_lenet_end_to_end(tmp_path, lenet_weights, capsys):
    pytest.importorskip("onnxruntime")
    net, weights = lenet_weights
    out = tmp_path / "lenet.onnx"
    assert main(["export_onnx", f"--model={LENET}", f"--weights={weights}", f"--output={out}"]) == 0
    err = capsys.readouterr().err
    assert "Exported net 'LeNet'" in err and str(out) in err and "prob (64, 10)" in err
    x = np.random.default_rng(1).uniform(0, 1, (64, 1, 28, 28)).astype(np.float32)
    got = _run_onnx(out, x)["prob"]
    np.testing.assert_allclose(got, net.forward(data=x)["prob"], rtol=1e-4, atol=1e-6)


def test_export_onnx_batch_and_dynamic_batch(tmp_path, lenet_weights, capsys):
    pytest.importorskip("onnxruntime")
    import onnx
    net, weights = lenet_weights
    fixed, dynamic = tmp_path / "b3.onnx", tmp_path / "dyn.onnx"
    assert main(["export_onnx", "-model", str(LENET), "-weights", str(weights), "-output", str(fixed),
                 "-batch", "3"]) == 0
    assert main(["export_onnx", f"--model={LENET}", f"--weights={weights}", f"--output={dynamic}",
                 "--dynamic_batch"]) == 0
    assert "prob ('batch', 10)" in capsys.readouterr().err
    dims = [d.dim_value for d in onnx.load(str(fixed)).graph.input[0].type.tensor_type.shape.dim]
    assert dims == [3, 1, 28, 28]
    for batch in (1, 5):
        x = np.random.default_rng(batch).uniform(0, 1, (batch, 1, 28, 28)).astype(np.float32)
        net.blobs["data"].reshape(batch, 1, 28, 28)
        want = net.forward(data=x)["prob"]
        np.testing.assert_allclose(_run_onnx(dynamic, x)["prob"], want, rtol=1e-4, atol=1e-6)


def test_export_onnx_console_script(tmp_path, lenet_weights):
    """The installed `caffe-cli` entry point, in a fresh process."""
    exe = Path(sys.executable).with_name("caffe-cli")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "caffe.cli.main"]
    _, weights = lenet_weights
    out = tmp_path / "lenet.onnx"
    proc = subprocess.run(cmd + ["export_onnx", f"--model={LENET}", f"--weights={weights}", f"--output={out}",
                                 "--opset=13"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    import onnx
    model = onnx.load(str(out))
    onnx.checker.check_model(model)
    assert model.opset_import[0].version == 13 and model.graph.name == "LeNet"
    assert [n.name for n in model.graph.node][:2] == ["conv1", "pool1"]


@pytest.mark.parametrize("args,match", [
    ([], "--model is required"),
    ([f"--model={LENET}"], "--weights is required"),
    ([f"--model={LENET}", "--weights=w"], "--output is required"),
    ([f"--model={LENET}", "--weights=w", "--output=o.onnx", "--batch=2", "--dynamic_batch"], "exclude each other"),
    ([f"--model={LENET}", "--weights=missing.caffemodel", "--output=o.onnx"], "--weights: file not found"),
    (["--model=missing.prototxt", "--weights=w", "--output=o.onnx"], "--model: file not found"),
])
def test_export_onnx_flag_errors(args, match, capsys, tmp_path, monkeypatch):
    """Flags and files are checked first (with or without caffe-onnx installed)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w").write_bytes(b"")
    assert main(["export_onnx"] + args) == 1
    assert match in capsys.readouterr().err


def test_export_onnx_refuses_train_val_nets_before_opening_databases(tmp_path, lenet_weights, capsys):
    model = tmp_path / "train_val.prototxt"
    model.write_text(TRAIN_VAL)
    _, weights = lenet_weights
    out = tmp_path / "tv.onnx"
    assert main(["export_onnx", f"--model={model}", f"--weights={weights}", f"--output={out}"]) == 1
    err = capsys.readouterr().err
    assert "'mnist' (Data): a data layer" in err and "'loss' (SoftmaxWithLoss)" in err and "no_such_db" not in err
    assert not out.exists()


def test_export_onnx_bad_output_directory(tmp_path, capsys):
    weights = tmp_path / "w.caffemodel"
    weights.write_bytes(b"")
    out = tmp_path / "no" / "such" / "dir.onnx"
    assert main(["export_onnx", f"--model={LENET}", f"--weights={weights}", f"--output={out}"]) == 1
    assert "does not exist" in capsys.readouterr().err

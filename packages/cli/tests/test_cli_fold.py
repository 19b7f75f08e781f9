"""caffe-cli test/time: the --fold flag and CAFFE_FOLD (inference folding, caffe.net.fold)."""
import os
import re
import subprocess
import sys

import numpy as np

NET = """name: "chain"
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 2 dim: 3 dim: 6 dim: 6 } shape { dim: 2 dim: 4 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" }
layer { name: "scale" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool" pooling_param { pool: AVE global_pooling: true } }
layer { name: "flat" type: "Flatten" bottom: "pool" top: "flat" }
layer { name: "loss" type: "EuclideanLoss" bottom: "flat" bottom: "label" top: "loss" }
"""


def cli(*args, cwd, env=None):
    full_env = dict(os.environ)
    full_env.pop("CAFFE_FOLD", None)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "caffe.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=full_env)


def test_fold_flag_and_environment_switch_folding_in_test_and_time(tmp_path):
    (tmp_path / "net.prototxt").write_text(NET)
    import caffe
    from caffe.net import Net
    net = Net(NET, caffe.TEST, fold=False)
    rng = np.random.default_rng(0)
    net.params["bn"][0].data[...] = rng.standard_normal(4)
    net.params["bn"][1].data[...] = rng.uniform(0.5, 2, 4)
    net.params["bn"][2].data[...] = 1
    net.save(str(tmp_path / "w.caffemodel"))
    timed = {}
    cases = (("default", [], {}), ("flag off", ["--fold=false"], {}), ("env off", [], {"CAFFE_FOLD": "0"}),
             ("flag wins", ["--fold=true"], {"CAFFE_FOLD": "0"}))
    for key, extra, env in cases:
        out = cli("time", "--model=net.prototxt", "--phase=TEST", "--iterations=1", *extra, cwd=tmp_path, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        timed[key] = "Folded into conv: bn, scale, relu" in out.stderr
        assert "Average Forward-Backward" in out.stderr
    assert timed == {"default": True, "flag off": False, "env off": False, "flag wins": True}
    losses = []
    for extra in ([], ["--fold=false"]):
        out = cli("test", "--model=net.prototxt", "--weights=w.caffemodel", "--iterations=2", *extra, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        losses.append(float(re.search(r"\] loss = ([\d.e+-]+)", out.stderr).group(1)))
    assert abs(losses[0] - losses[1]) <= 1e-5 * abs(losses[1])
    out = cli("test", "--model=net.prototxt", "--weights=w.caffemodel", "--fold=maybe", cwd=tmp_path)
    assert out.returncode != 0 and "fold" in out.stderr

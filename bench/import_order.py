"""CIFAR10-quick b100 fwd+bwd in a fresh process, NumPy imported before or after caffe (bench/README.md,
"The in-process gap was OpenBLAS's spinning threads"). Run alternated, several times:

    for i in 1 2 3; do python bench/import_order.py caffe_first; python bench/import_order.py numpy_first; done
"""
import os
import statistics
import sys
import time
from pathlib import Path

if sys.argv[1:] == ["numpy_first"]:
    import numpy  # noqa: F401  (loads OpenBLAS before caffe can set its thread timeout)
elif sys.argv[1:] != ["caffe_first"]:
    sys.exit(__doc__)
os.environ.setdefault("GLOG_minloglevel", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import caffe  # noqa: E402
from caffe.net import Net  # noqa: E402
from bench_nets import NETS, dummy_data_net  # noqa: E402

path, dshape, lshape, *_ = NETS["cifar10_quick"]
net = Net(dummy_data_net(path, dshape, lshape), caffe.TRAIN)
for _ in range(3):
    net.ForwardBackward()
times = []
for _ in range(12):
    t = time.perf_counter()
    net.ForwardBackward()
    times.append((time.perf_counter() - t) * 1e3)
print(f"{sys.argv[1]:12s} median {statistics.median(times):6.1f} ms  min {min(times):6.1f}  "
      f"load {os.getloadavg()[0]:.1f}")

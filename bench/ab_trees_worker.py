"""ab_trees.py's worker: builds one bench_nets DummyData net in the checkout given, then for each line n on stdin
times n Net.ForwardBackward steps and prints their median (ms)."""
import statistics
import sys
import time

sys.path.insert(0, sys.argv[1] + "/bench")
import bench_nets as bn  # noqa: E402  (the checkout's own)

import caffe  # noqa: E402
from caffe.net import Net  # noqa: E402

spec = bn.NETS[sys.argv[2]]
net = Net(bn.dummy_data_net(spec[0], spec[1], spec[2]), caffe.TRAIN)
for _ in range(5):
    net.ForwardBackward()
print("ready", flush=True)
for line in sys.stdin:
    times = []
    for _ in range(int(line)):
        t = time.perf_counter()
        net.ForwardBackward()
        times.append(time.perf_counter() - t)
    print(statistics.median(times) * 1e3, flush=True)

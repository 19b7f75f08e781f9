"""Each convolution of a net on the blocked plan: its forward (and with --backward its backward too) with
conv_cpu.GEMM512_LOWERED off (np.matmul) and on (kernels.gemm), interleaved in one process, medians of
--repeats; the folded TEST nets and seeded weights of bench_infer.py. Prints per layer and the total.

    python bench/ab_gemm512_lowered.py [--nets resnet50,googlenet] [--batches 1,8] [--repeats 9] [--backward]
"""
import os, sys, time, statistics, argparse
from pathlib import Path
os.environ.setdefault("GLOG_minloglevel", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np, caffe, bench_infer
from caffe.layers import conv_cpu
from caffe.net import Net
ap = argparse.ArgumentParser(); ap.add_argument("--nets", default="resnet50"); ap.add_argument("--batches", default="1,8")
ap.add_argument("--repeats", type=int, default=9); ap.add_argument("--backward", action="store_true")
a = ap.parse_args()
if not conv_cpu.GEMM512:
    sys.exit("conv_cpu.GEMM512 is off here (no AVX-512F, OpenBLAS's own AVX-512 kernels, or switched off)")
for name in a.nets.split(","):
    for batch in map(int, a.batches.split(",")):
        net = Net(str(bench_infer.MODELS / f"{name}_deploy.prototxt"), caffe.TEST, fold=True)
        s = list(net.blobs["data"].shape); net.blobs["data"].reshape([batch] + s[1:]); net.Reshape()
        bench_infer.randomize(net); net.blobs["data"].data[...] = np.random.default_rng(1).standard_normal(net.blobs["data"].shape)
        net.Forward()
        tot = {False: 0.0, True: 0.0}
        for i, (ln, l) in enumerate(zip(net._layer_names, net.layers)):
            if l.type != "Convolution" or l.plan(np, np.float32) != "blocked": continue
            bot = [net.blobs[b] for b in net.bottom_names[ln]]; top = [net.blobs[t] for t in net.top_names[ln]]
            res = {}
            for use in (False, True):
                conv_cpu.GEMM512_LOWERED = use; l.forward(bot, top); res[use] = top[0].data.copy()
            err = float(np.max(np.abs(res[True] - res[False])) / (np.max(np.abs(res[False])) + 1e-30))
            t = {False: [], True: []}
            for r in range(a.repeats):
                for use in ((False, True) if r % 2 == 0 else (True, False)):
                    conv_cpu.GEMM512_LOWERED = use
                    t0 = time.perf_counter(); l.forward(bot, top); t[use].append(time.perf_counter() - t0)
                    if a.backward:
                        top[0].diff[...] = 1e-3
                        t0 = time.perf_counter(); l.backward(top, [True], bot); t[use][-1] += time.perf_counter() - t0
            off, on = statistics.median(t[False]) * 1e3, statistics.median(t[True]) * 1e3
            tot[False] += off; tot[True] += on
            g = l.geom
            print(f"{name} b{batch} {ln:20s} k{g.kernel} s{g.stride} {l.conv_in_channels}->{l.conv_out_channels} {g.col_shape}: off {off:7.3f} on {on:7.3f} ms  {off/on:4.2f}x  err {err:.1e}", flush=True)
        print(f"{name} b{batch} total blocked: off {tot[False]:.2f} on {tot[True]:.2f} ms  {tot[False]/max(tot[True],1e-9):.2f}x", flush=True)

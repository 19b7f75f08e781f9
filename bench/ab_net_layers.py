"""Whole-net fwd+bwd and per-layer times under two convolution plan settings, interleaved in one process.

Usage:  python bench/ab_net_layers.py [--net cifar10_quick] [--repeats 15] [--modes auto,off] [--cpu-time]

The net (bench_nets' DummyData version, TRAIN phase) runs ForwardBackward, then each layer's Forward and
(where needed) Backward timed alone, once per repetition under each setting, alternating which goes first.
Settings: "auto": the default (conv_cpu.dense_rule); "off": no dense plan (CAFFE_CONV_DENSE=0); "blockedwgt":
the dense plan with every weight diff blocked (the rule before session 7's backward_weight_oc took
CIFAR10-quick conv3's; the x-vectorized kernel main had then is gone); "avx2" / "avx512": "auto" with that
variant of the dense kernels (the other settings: the kernel module's default, AVX-512 where the CPU has it);
"avx512narrow": "avx512" with the AVX2 rule's thresholds (conv_cpu.DENSE512_*: the wider AVX-512 rule off);
"f32wgrad": "auto" with an exact layer's weight diff by the float32 GEMM (conv_cpu.EXACT_WGRAD off);
"noblas512": "auto" with the rules for an OpenBLAS running AVX2 kernels (conv_cpu.BLAS512 off).
Prints the ForwardBackward medians (and minima) and per-layer medians, largest first.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
os.environ.setdefault("GLOG_minloglevel", "2")  # the net's set-up log off
sys.path.insert(0, str(Path(__file__).resolve().parent))

import caffe  # noqa: E402
from caffe.layers import conv_cpu  # noqa: E402
from caffe.net import Net  # noqa: E402
from bench_nets import NETS, dummy_data_net  # noqa: E402

_RULE = conv_cpu.dense_rule


def _no_dense_wgt(layer):
    return tuple(p for p in _RULE(layer) if p != "wgt")


_AVX512 = conv_cpu._cd is not None and conv_cpu._cd.AVX512


_WIDE = conv_cpu.DENSE512_MAX_OG, conv_cpu.DENSE512_MAX_KD
_BLAS512 = conv_cpu.BLAS512


def set_mode(mode):
    conv_cpu.DENSE = "off" if mode == "off" else "auto"
    conv_cpu.EXACT_WGRAD = mode != "f32wgrad"
    conv_cpu.BLAS512 = _BLAS512 and mode != "noblas512"
    conv_cpu.dense_rule = _no_dense_wgt if mode == "blockedwgt" else _RULE
    if conv_cpu._cd is not None:
        conv_cpu._cd.AVX512 = mode in ("avx512", "avx512narrow") or (mode not in ("avx2",) and _AVX512)
    narrow = mode == "avx512narrow"
    conv_cpu.DENSE512_MAX_OG, conv_cpu.DENSE512_MAX_KD = (conv_cpu.DENSE_MAX_OG, conv_cpu.DENSE_MAX_KD) if narrow \
        else _WIDE


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--net", default="cifar10_quick", choices=sorted(NETS))
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--modes", default="auto,off")
    ap.add_argument("--cpu-time", action="store_true")
    args = ap.parse_args(argv)
    modes = args.modes.split(",")
    clock = time.process_time if args.cpu_time else time.perf_counter
    path, dshape, lshape, *_ = NETS[args.net]
    net = Net(dummy_data_net(path, dshape, lshape), caffe.TRAIN)
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  load avg {os.getloadavg()[0]:.2f}  {args.net}  "
          f"{'CPU' if args.cpu_time else 'wall'} ms, medians of {args.repeats}  modes {modes}")
    for m in modes:
        set_mode(m)
        for _ in range(3):
            net.ForwardBackward()
    tot = {m: [] for m in modes}
    per = {m: {} for m in modes}
    for r in range(args.repeats):
        for m in (modes if r % 2 == 0 else modes[::-1]):
            set_mode(m)
            t = clock()
            net.ForwardBackward()
            tot[m].append((clock() - t) * 1e3)
            for i, layer in enumerate(net.layers):
                t = clock()
                layer.Forward(net.bottom_vecs[i], net.top_vecs[i])
                per[m].setdefault((i, "f"), []).append((clock() - t) * 1e3)
            for i in range(len(net.layers) - 1, -1, -1):
                if net.layer_need_backward[i]:
                    t = clock()
                    net.layers[i].Backward(net.top_vecs[i], net.bottom_need_backward[i], net.bottom_vecs[i])
                    per[m].setdefault((i, "b"), []).append((clock() - t) * 1e3)
    set_mode("oc")
    print("ForwardBackward  " + "  ".join(f"{m}: {statistics.median(tot[m]):7.2f} (min {min(tot[m]):6.2f})"
                                          for m in modes))
    first = per[modes[0]]
    print(f"{'layer':12s} " + " ".join(f"{m:>8s}" for m in modes))
    sums = {m: 0.0 for m in modes}
    for key in sorted(first, key=lambda k: -statistics.median(first[k])):
        meds = {m: statistics.median(per[m][key]) for m in modes}
        for m in modes:
            sums[m] += meds[m]
        i, k = key
        print(f"{net.layers[i].name:10s} {k} " + " ".join(f"{meds[m]:8.2f}" for m in modes))
    print(f"{'sum':12s} " + " ".join(f"{sums[m]:8.2f}" for m in modes))


if __name__ == "__main__":
    main()

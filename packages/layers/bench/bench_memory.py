"""The memory-bound layers against the machine's memory bandwidth (run through bench_layers.py --memory).

For each shape a np.copyto of an array of the layer's bottom size gives the bandwidth B
(bytes read + bytes written per second; the copy runs on one core, as NumPy does). B is taken
around each case: the median of five copies just before its runs and five just after (the VM's
speed drifts by up to 2x within minutes: against one median for the whole run, a case's ratio
moved with the moment it ran); the header prints all the shape's samples' median and spread. Each
layer's "ideal" time is one read of its inputs and one write of its outputs at B:

  forward   read every bottom, write every top          (Split writes nothing: its tops share)
  backward  read every top diff (+ the bottom data and/or top data the gradient needs, as
            marked per case: x, y), write every bottom diff

State a layer keeps between forward and backward (masks, saved inputs, x_norm) is not in
the ideal, so its cost shows in the ratio; where forward writes such state (MAX pooling's and
Eltwise MAX's int32 argmax mask, Dropout's uint8 mask, in-place BatchNorm's x_norm and in-place
Scale's copy of x: what Caffe's forward writes too), "x+st" is the forward's time over the ideal
with that write counted, and the backward's "x+st" its time over the ideal with the state's read
counted (the mask is an input of Caffe's backward as much as the top diff is; in-place BatchNorm's
x_norm and in-place Scale's copy are already in their backward ideals, as x). In a
TEST-phase net MAX pooling leaves its mask out until a Backward asks for it (the "TEST" case:
forward only); LRN's CPU forward writes no scale in either phase (its backward recomputes it).

--floor also times each layer on a cache-resident blob (about 1 MB a blob: N = 1, the same
channels, fewer positions) and scales its time to the full count, less the per-call cost measured on
a tiny blob (the fastest of 5 x --repeats runs each): "floor" is what the layer costs when memory is not what limits it (the compute: exp, pow,
the window compares), and "x fl" the full run's time over the larger of the floor and the ideal. Every layer runs float32 on its own; in place,
the bottom data is restored (untimed) before each forward and the top diff before each
backward, so every run sees the same values. Medians of --repeats; ratio = median /
ideal (1.0 = memory speed). --compare-xp interleaves the same layer's array-module-generic
NumPy path (forward_xp/backward_xp: the GPU path's code, and the CPU path before the kernels).

"mem" is the time over the same ideal, state counted as in x+st, at the memory bandwidth proper: np.copyto of
256 MB, far past the caches (STREAM's rule: arrays at least 4x the last-level cache), the median of three copies
before the case's runs and three after. x and x+st hold the layers to a stricter bar: B comes from a copy of the
layer's own size (25.7 MB), which partly stays in the 32 MB L3 between repetitions, so B mostly reads above the
memory bandwidth.
"""
from __future__ import annotations

import ctypes
import os
import statistics
import time

import numpy as np

from caffe.blob import Blob
from caffe.layers.testing import make_layer
from caffe.proto import caffe_pb2

SHAPES = {
    # ResNet-50 b8 res2 blocks (256 x 56 x 56) and MobileNet v1 / ResNet conv1 (64 x 112 x 112)
    "resnet": (8, 256, 56, 56),
    "mobilenet": (8, 64, 112, 112),
}
TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST


class Case:
    def __init__(self, name, type_, text="", bottoms=1, tops=1, in_place=False, phase=TRAIN, reads=(),
                 shape=None, labels=False, backward=True, state=(), state_in_reads=False):
        self.name, self.type, self.text = name, type_, text
        self.bottoms, self.tops, self.in_place, self.phase = bottoms, tops, in_place, phase
        self.reads = reads          # what backward reads besides the top diffs: "x" bottom data, "y" top data
        self.shape = shape          # a function of the bench shape, or None for the shape itself
        self.labels = labels        # bottom[1] is a label blob (SoftmaxWithLoss)
        self.backward = backward
        self.state = state          # forward's state writes: ("top" | "bottom", bytes per element) pairs
        self.state_in_reads = state_in_reads  # backward's `reads` already count its read of the state


def _half_channels(s):
    return (s[0], s[1] // 2) + tuple(s[2:])


CASES = [
    Case("BatchNorm global", "BatchNorm", "batch_norm_param { use_global_stats: true }", phase=TEST),
    Case("BatchNorm global in-place", "BatchNorm", "batch_norm_param { use_global_stats: true }",
         in_place=True, phase=TEST),
    Case("BatchNorm train", "BatchNorm", reads=("x",)),
    # in place the forward keeps x_norm_ (Caffe's: a later in-place layer overwrites the top), a float per element;
    # the backward reads it in x's place
    Case("BatchNorm train in-place", "BatchNorm", in_place=True, reads=("x",), state=(("bottom", 4),),
         state_in_reads=True),
    Case("Scale+bias", "Scale", "scale_param { bias_term: true }", reads=("x",)),
    # in place the forward keeps a copy of x (Caffe's temp_) for the scale's gradient: the backward's x
    Case("Scale+bias in-place", "Scale", "scale_param { bias_term: true }", in_place=True, reads=("x",),
         state=(("bottom", 4),), state_in_reads=True),
    Case("Bias", "Bias"),
    Case("Eltwise SUM", "Eltwise", "eltwise_param { operation: SUM }", bottoms=2),
    Case("Eltwise PROD", "Eltwise", "eltwise_param { operation: PROD }", bottoms=2, reads=("x",)),
    Case("Eltwise MAX", "Eltwise", "eltwise_param { operation: MAX }", bottoms=2, state=(("top", 4),)),
    Case("ReLU", "ReLU", reads=("x",)),
    Case("ReLU in-place", "ReLU", in_place=True, reads=("x",)),
    Case("PReLU", "PReLU", reads=("x",)),
    Case("Sigmoid", "Sigmoid", reads=("y",)),
    Case("TanH", "TanH", reads=("y",)),
    Case("ELU", "ELU", reads=("x", "y")),
    # Swish backward reads y and sigmoid(beta x): out of place in float32 (AVX-512 build) the sigmoid recomputed from
    # x, else the kept sigmoid_output_ (the size of x); y as Caffe reads it (a later in-place layer may change it)
    Case("Swish", "Swish", reads=("x", "y")),
    Case("BNLL", "BNLL", reads=("x",)),
    Case("AbsVal", "AbsVal", reads=("x",)),
    Case("Clip", "Clip", "clip_param { min: -0.5 max: 0.5 }", reads=("x",)),
    Case("Power 2", "Power", "power_param { power: 2 scale: 0.5 shift: 1 }", reads=("x",)),
    Case("Exp", "Exp", reads=("y",)),
    Case("Log", "Log", "log_param { shift: 3 }", reads=("x",)),
    Case("Threshold", "Threshold", backward=False),
    Case("Dropout", "Dropout", in_place=True, state=(("bottom", 1),)),
    Case("Softmax", "Softmax", reads=("y",)),
    Case("SoftmaxWithLoss", "SoftmaxWithLoss", bottoms=2, labels=True, reads=("y",)),
    # (the CPU forward writes no scale_ since session 12: the backward recomputes it from x)
    Case("LRN", "LRN", "lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 }", reads=("x", "y")),
    Case("LRN TEST", "LRN", "lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 }", phase=TEST, backward=False),
    Case("Concat", "Concat", bottoms=2, shape=_half_channels),
    Case("Slice", "Slice", tops=2),
    Case("Split", "Split", tops=2),
    Case("Pooling MAX 3/2", "Pooling", "pooling_param { pool: MAX kernel_size: 3 stride: 2 }",
         state=(("top", 4),)),
    Case("Pooling MAX 3/2 TEST", "Pooling", "pooling_param { pool: MAX kernel_size: 3 stride: 2 }",
         phase=TEST, backward=False),
    Case("Pooling AVE global", "Pooling", "pooling_param { pool: AVE global_pooling: true }",
         shape=lambda s: (s[0], 2048, 7, 7)),
]


def fix_malloc_threshold():
    """Keep every large buffer in its own page-aligned mmap, as in a fresh process.

    glibc raises its mmap threshold (up to 32 MB) when a large block is freed, after which large
    arrays come from the heap at arbitrary 16-byte offsets; a layer's source and destination can
    then sit a few bytes apart modulo 4096, and the CPU's 4K-aliasing stalls made copies 3x slower
    here. Setting the threshold (M_MMAP_THRESHOLD, 128 KB) stops that adjustment, so figures do not
    depend on what the benchmark allocated and freed before. (It also makes every large NumPy
    temporary a fresh mmap, page faults included, which the NumPy path pays: --malloc-default
    measures with glibc's own behaviour.)
    """
    try:
        ctypes.CDLL(None).mallopt(-3, 128 * 1024)
    except (OSError, AttributeError):  # not glibc
        pass


# The memory bandwidth proper: a copy far past the caches (the VM's L3 is 32 MB), STREAM's rule of at least 4x.
BIG_COPY = 256 << 20


def _median_ms(times):
    return statistics.median(times) * 1e3 if times else float("nan")


def _ratio(ms, ideal):
    return f"{ms / ideal:5.2f}" if ideal > 0 and ms == ms else f"{'-':>5s}"


_COPY_BUFFERS = {}


def copy_times(nbytes, repeats):
    """Seconds of each of `repeats` np.copyto of an nbytes float32 array (after one untimed); the arrays are made
    once per size."""
    if nbytes not in _COPY_BUFFERS:
        src = np.random.default_rng(0).standard_normal(nbytes // 4, dtype=np.float32)
        _COPY_BUFFERS[nbytes] = (src, np.empty_like(src))
    src, dst = _COPY_BUFFERS[nbytes]
    np.copyto(dst, src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return times


class Instance:
    """One layer with its blobs, set up; forward/backward timed by the CPU path or the xp path."""

    def __init__(self, case, shape, rng):
        self.case = case
        self.layer = make_layer(case.type, case.text, phase=case.phase)
        shapes = [shape] * case.bottoms
        self.bottom = []
        for i, s in enumerate(shapes):
            b = Blob(s)
            if i == 1 and case.labels:
                b.reshape(s[0], *s[2:])
                b.data[...] = rng.integers(0, s[1], b.shape)
            else:
                b.data[...] = rng.standard_normal(s, dtype=np.float32)
            self.bottom.append(b)
        if case.type == "Log":
            self.bottom[0].data[...] = np.abs(self.bottom[0].data)
        self.top = [self.bottom[0]] if case.in_place else [Blob() for _ in range(case.tops)]
        self.layer.SetUp(self.bottom, self.top)
        self.layer.Forward(self.bottom, self.top)
        self.x0 = [b.data.copy() for b in self.bottom]
        self.dy0 = [rng.standard_normal(t.shape, dtype=np.float32) for t in self.top]
        self.prop = [not (case.labels and i == 1) for i in range(case.bottoms)]

    def _restore_data(self):
        for b, x in zip(self.bottom, self.x0):
            b.data[...] = x

    def _restore_diff(self):
        for t, d in zip(self.top, self.dy0):
            t.diff[...] = d

    def run(self, xp_path):
        """One timed forward and backward; returns (fwd s, bwd s)."""
        layer = self.layer
        if self.case.in_place:  # (out of place, forward leaves the bottoms as they were)
            self._restore_data()
        t0 = time.perf_counter()
        if xp_path:
            layer.reshape(self.bottom, self.top)
            layer.forward_xp(np, self.bottom, self.top)
        else:
            layer.Forward(self.bottom, self.top)
        t1 = time.perf_counter()
        if not self.case.backward:
            return t1 - t0, float("nan")
        if self.case.in_place:
            self._restore_diff()
        t2 = time.perf_counter()
        if xp_path:
            layer.backward_xp(np, self.top, self.prop, self.bottom)
        else:
            layer.Backward(self.top, self.prop, self.bottom)
        t3 = time.perf_counter()
        return t1 - t0, t3 - t2

    def traffic(self):
        """(forward bytes, backward bytes) of one read of the inputs and one write of the outputs."""
        c = self.case
        item = 4
        bottoms = sum(b.count() for i, b in enumerate(self.bottom) if self.prop[i])
        labels = sum(b.count() for i, b in enumerate(self.bottom) if not self.prop[i])
        tops = sum(t.count() for t in self.top)
        if c.type == "SoftmaxWithLoss":  # the probabilities are its real output
            tops = self.bottom[0].count()
        fwd = 0 if c.type == "Split" else bottoms + labels + tops
        bwd = tops + bottoms + labels
        if "x" in c.reads:
            bwd += bottoms
        if "y" in c.reads:
            bwd += tops
        return fwd * item, bwd * item

    def state_bytes(self):
        """Bytes of state forward writes besides its tops (see the module's docstring)."""
        counts = {"top": sum(t.count() for t in self.top), "bottom": self.bottom[0].count()}
        return sum(counts[which] * size for which, size in self.case.state)


def _cache_shape(shape, elements):
    """N = 1, the same channels, positions cut so that the blob holds about `elements` values."""
    n, c = shape[0], shape[1]
    positions = max(1, elements // c)
    h = max(1, int(round(positions ** 0.5)))
    w = max(1, positions // h)
    if len(shape) > 2 and shape[2] * shape[3] <= 64:  # small planes (global pooling): keep the planes
        return (1, max(1, min(c, elements // (shape[2] * shape[3])))) + tuple(shape[2:])
    return (1, c, h, w)


def floor_times(case, shape, rng, repeats):
    """(forward ms, backward ms) of the layer at `shape` when memory does not limit it: the time on a
    cache-resident blob, less the per-call time on a tiny one, scaled to the full count, plus the
    per-call time back."""
    full = int(np.prod(shape))
    small = _cache_shape(shape, 256 * 1024)
    tiny = _cache_shape(shape, 8 * shape[2] * shape[3] if shape[2] * shape[3] <= 64 else 4 * shape[1])
    def med(s):
        inst = Instance(case, s, rng)
        runs = [inst.run(False) for _ in range(3 + 5 * repeats)][3:]
        return min(r[0] for r in runs), min(r[1] for r in runs), int(np.prod(s))  # the best case: no waits
    sf, sb, sn = med(small)
    tf, tb, tn = med(tiny) if tiny != small else (0.0, 0.0, 0)
    scale = (full - tn) / (sn - tn) if sn > tn else full / sn
    return (((sf - tf) * scale + tf) * 1e3, ((sb - tb) * scale + tb) * 1e3 if case.backward else float("nan"))


def run(shape_names, only, repeats, warmup, compare_xp, malloc_default=False, floor=False):
    if not malloc_default:
        fix_malloc_threshold()
    rng = np.random.default_rng(0)
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  {os.cpu_count()} CPUs  load avg "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}  numpy {np.__version__}  float32  "
          f"OMP_NUM_THREADS {os.environ.get('OMP_NUM_THREADS', 'unset')}  median of {repeats} after {warmup} warm-up  "
          f"malloc {'default' if malloc_default else 'mmap threshold fixed'}")
    cases = [c for c in CASES if not only or c.type in only or c.name in only]
    for sname in shape_names:
        base = SHAPES[sname]
        nbytes = int(np.prod(base)) * 4
        moved = 2 * (nbytes // 4 * 4)  # bytes a copy reads and writes
        copies, big_copies, rows = [], [], []
        head = (f"  {'case':26s} {'bottom':>17s} {'ideal f':>8s} {'fwd':>7s} {'x':>5s} {'x+st':>5s} {'mem':>5s} "
                f"{'ideal b':>8s} {'bwd':>7s} {'x':>5s} {'x+st':>5s} {'mem':>5s}")
        if floor:
            head += f" | {'floor f':>7s} {'x fl':>5s} {'floor b':>7s} {'x fl':>5s}"
        if compare_xp:
            head += f" | {'xp fwd':>7s} {'x':>5s} {'xp bwd':>7s} {'x':>5s}"
        for case in cases:
            # the bandwidths around this case (copies just before its runs and just after): the VM's speed drifts
            # by up to 2x within minutes, and ratios against the whole run's median moved with it
            local, local_big = copy_times(nbytes, 5), copy_times(BIG_COPY, 3)
            shape = case.shape(base) if case.shape else base
            inst = Instance(case, shape, rng)
            ref = Instance(case, shape, rng) if compare_xp else None
            cpu, xp = [], []
            for it in range(warmup + repeats):
                a = inst.run(False)
                b = ref.run(True) if ref else None
                if it >= warmup:
                    cpu.append(a)
                    if b:
                        xp.append(b)
            local += copy_times(nbytes, 5)
            local_big += copy_times(BIG_COPY, 3)
            copies += local
            big_copies += local_big
            bws = (moved / statistics.median(local), 2 * BIG_COPY / statistics.median(local_big))
            rows.append((case, shape, inst.traffic(), inst.state_bytes(), cpu, xp,
                         floor_times(case, shape, rng, repeats) if floor else None, bws))
            del inst, ref
        ts = sorted(copies)
        bw, hi, lo = moved / statistics.median(ts), moved / ts[len(ts) // 10], moved / ts[-1 - len(ts) // 10]
        bts = sorted(big_copies)
        bw_big = 2 * BIG_COPY / statistics.median(bts)
        print(f"\n{sname} {'x'.join(map(str, base))} float32 ({nbytes / 1e6:.1f} MB): np.copyto bandwidth "
              f"{bw / 1e9:.1f} GB/s at this size (median of {len(copies)} copies through the run; 10th-90th "
              f"percentile {hi / 1e9:.1f}-{lo / 1e9:.1f}); memory bandwidth {bw_big / 1e9:.1f} GB/s (copies of "
              f"{BIG_COPY >> 20} MB, median of {len(bts)} through the run, {2 * BIG_COPY / bts[-1] / 1e9:.1f}-"
              f"{2 * BIG_COPY / bts[0] / 1e9:.1f}) (read + write bytes / s); each case's ideals and ratios use the "
              f"copies around it")
        print(head)
        for case, shape, (fb, bb), st, cpu, xp, floors, (bw, bw_mem) in rows:  # (this case's bandwidths)
            ideal_f, ideal_b = fb / bw * 1e3, bb / bw * 1e3
            f, b = _median_ms([t[0] for t in cpu]), _median_ms([t[1] for t in cpu])
            with_state = _ratio(f, (fb + st) / bw * 1e3) if st else f"{'':>5s}"
            read_state = (_ratio(b, (bb + st) / bw * 1e3) if st and case.backward and not case.state_in_reads
                          else f"{'':>5s}")
            bst = st if case.backward and not case.state_in_reads else 0
            line = (f"  {case.name:26s} {'x'.join(map(str, shape)):>17s} {ideal_f:8.2f} {f:7.2f} {_ratio(f, ideal_f)} "
                    f"{with_state} {_ratio(f, (fb + st) / bw_mem * 1e3)} {ideal_b:8.2f} {b:7.2f} "
                    f"{_ratio(b, ideal_b)} {read_state} {_ratio(b, (bb + bst) / bw_mem * 1e3)}")
            if floor:
                ff, fbk = floors
                line += f" | {ff:7.2f} {_ratio(f, max(ff, ideal_f))} {fbk:7.2f} {_ratio(b, max(fbk, ideal_b))}"
            if compare_xp:
                xf, xb = _median_ms([t[0] for t in xp]), _median_ms([t[1] for t in xp])
                line += f" | {xf:7.2f} {_ratio(xf, ideal_f)} {xb:7.2f} {_ratio(xb, ideal_b)}"
            print(line, flush=True)

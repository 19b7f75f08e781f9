"""`caffe-cli plot LOG OUT.png`: training loss, test loss and accuracy against iterations.

Parses Caffe's glog training log (ours or real Caffe's) the way tools/extra/parse_log.py does.
matplotlib is an optional extra (`pip install caffe-cli[plot]`).
"""
from __future__ import annotations

import os

import re
from dataclasses import dataclass, field

_ITER = re.compile(r"Iteration (\d+)")
_TRAIN_LOSS = re.compile(r"Iteration (\d+) \(.*\), loss = ([-+\.\deEinfa]+)")
_TRAIN_LOSS_OLD = re.compile(r"Iteration (\d+), loss = ([-+\.\deEinfa]+)")
_TESTING = re.compile(r"Iteration (\d+), Testing net")
_TEST_OUT = re.compile(r"Test net output #(\d+): (\S+) = ([-+\.\deEinfa]+)(.*loss\))?")


@dataclass
class TrainingLog:
    train_iters: list = field(default_factory=list)
    train_loss: list = field(default_factory=list)
    test_iters: list = field(default_factory=list)
    test_outputs: dict = field(default_factory=dict)  # name -> list of values (aligned to test_iters)
    loss_outputs: set = field(default_factory=set)


def parse_log(text: str) -> TrainingLog:
    log = TrainingLog()
    test_iter = None
    for line in text.splitlines():
        m = _TRAIN_LOSS.search(line) or _TRAIN_LOSS_OLD.search(line)
        if m:
            log.train_iters.append(int(m.group(1)))
            log.train_loss.append(float(m.group(2)))
            continue
        m = _TESTING.search(line)
        if m:
            test_iter = int(m.group(1))
            log.test_iters.append(test_iter)
            continue
        m = _TEST_OUT.search(line)
        if m and test_iter is not None:
            name = m.group(2)
            values = log.test_outputs.setdefault(name, [])
            values.extend([float("nan")] * (len(log.test_iters) - 1 - len(values)))
            values.append(float(m.group(3)))
            if m.group(4) or "loss" in name:
                log.loss_outputs.add(name)
    return log


def plot_log(log_path: str, out_path: str) -> str:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("caffe-cli plot needs matplotlib: pip install 'caffe-cli[plot]'") from None
    try:
        with open(log_path, errors="replace") as f:
            text = f.read()
    except OSError as exc:
        raise RuntimeError(f"cannot read log file {log_path}: {exc.strerror}") from None
    log = parse_log(text)
    if not log.train_iters and not log.test_iters:
        raise RuntimeError(f"{log_path}: no training or test lines found (is it a Caffe training log?)")
    fig, ax = plt.subplots(figsize=(8, 5))
    if log.train_iters:
        ax.plot(log.train_iters, log.train_loss, label="train loss", color="tab:blue", lw=1)
    for name in sorted(log.loss_outputs):
        ax.plot(log.test_iters[:len(log.test_outputs[name])], log.test_outputs[name], "o-",
                label=f"test {name}", color="tab:orange")
    ax.set_xlabel("iteration")
    ax.set_ylabel("loss")
    others = [n for n in sorted(log.test_outputs) if n not in log.loss_outputs]
    handles, labels = ax.get_legend_handles_labels()
    if others:
        ax2 = ax.twinx()
        for name in others:
            ax2.plot(log.test_iters[:len(log.test_outputs[name])], log.test_outputs[name], "s-",
                     label=f"test {name}", color="tab:green")
        ax2.set_ylabel("accuracy" if any("acc" in n for n in others) else "test output")
        h2, l2 = ax2.get_legend_handles_labels()
        handles += h2
        labels += l2
    ax.legend(handles, labels, loc="best")
    ax.set_title(log_path)
    fig.tight_layout()
    from caffe.blob.fileio import atomic_path
    fmt = os.path.splitext(out_path)[1].lstrip(".").lower() or "png"
    try:
        with atomic_path(out_path, "plot") as tmp:  # the temporary name has no extension: say the format
            fig.savefig(tmp, dpi=100, format=fmt)
    finally:
        plt.close(fig)
    return out_path


def main(argv) -> int:
    from caffe.cli.main import CliError, GflagsParser
    parser = GflagsParser("plot", "plot a training log: caffe-cli plot LOG [OUT.png]")
    args = parser.parse(argv)
    if not 1 <= len(args.args) <= 2:
        raise CliError(f"expected LOG [OUT.png]\n{parser.format_usage().strip()}")
    log_path = args.args[0]
    out = args.args[1] if len(args.args) == 2 else log_path + ".png"
    try:
        plot_log(log_path, out)
    except RuntimeError as exc:
        raise CliError(str(exc)) from None
    print(out)
    return 0

"""`caffe-cli draw NET.prototxt OUT.{png,svg,pdf,dot}`: Caffe's python/draw_net.py on caffe.draw.

Flags as draw_net.py's: --rankdir (LR, TB, BT, RL), --phase (TRAIN, TEST or ALL), --display_lrm.
Needs pydot (caffe-cli[draw]); images need graphviz's `dot` program, DOT text (.dot, .gv, .raw) does not.
"""
from __future__ import annotations

from caffe.cli.main import CliError, GflagsParser


def main(argv) -> int:
    from google.protobuf import text_format
    from caffe.proto import caffe_pb2
    parser = GflagsParser("draw", "draw a net: caffe-cli draw NET.prototxt OUT.{png,svg,pdf,dot} "
                          "[--rankdir=LR] [--phase=TRAIN|TEST|ALL] [--display_lrm]")
    parser.add_flag("rankdir", str, "LR", "graph direction: LR, TB, BT or RL")
    parser.add_flag("phase", str, "ALL", "draw only the layers of this phase: TRAIN, TEST or ALL")
    parser.add_flag("display_lrm", bool, False, "show the learning rate multipliers of learning layers")
    args = parser.parse(argv)
    if len(args.args) != 2:
        raise CliError(f"expected NET.prototxt OUT\n{parser.format_usage().strip()}")
    net_path, out = args.args
    if args.rankdir not in ("LR", "TB", "BT", "RL"):
        raise CliError(f"--rankdir={args.rankdir}: expected LR, TB, BT or RL")
    phases = {"ALL": None, "TRAIN": caffe_pb2.TRAIN, "TEST": caffe_pb2.TEST}
    if args.phase.upper() not in phases:
        raise CliError(f"--phase={args.phase}: expected TRAIN, TEST or ALL")
    try:
        import caffe.draw
    except ImportError as exc:
        raise CliError(str(exc)) from None
    try:
        with open(net_path) as f:
            text = f.read()
    except OSError as exc:
        raise CliError(f"cannot read {net_path}: {exc.strerror}") from None
    net = caffe_pb2.NetParameter()
    try:
        text_format.Merge(text, net)
    except text_format.ParseError as exc:
        raise CliError(f"{net_path}:{exc}") from None
    print(f"Drawing net to {out}")
    try:
        caffe.draw.draw_net_to_file(net, out, args.rankdir, phases[args.phase.upper()], args.display_lrm)
    except (RuntimeError, ValueError, ImportError) as exc:
        raise CliError(str(exc)) from None
    return 0

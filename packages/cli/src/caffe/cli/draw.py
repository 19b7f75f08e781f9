"""`caffe-cli draw NET.prototxt OUT.png`: the net graph, as Caffe's python/draw_net.py draws it.

Layers are boxes, blobs are octagons, in-place layers sit on their blob's edge. Writes DOT text
itself (`.dot` output needs nothing else); other formats (png, svg, pdf) are rendered by graphviz's
`dot` program (the graphviz system package, e.g. `apt-get install graphviz`), with a clear error when
it is missing.
"""
from __future__ import annotations

import shutil
import subprocess

_LAYER_STYLE = 'shape=record, style=filled, fillcolor="#6495ED"'
_BLOB_STYLE = 'shape=octagon, style=filled, fillcolor="#E0E0E0"'


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _layer_label(layer, rankdir) -> str:
    sep = " " if rankdir in ("TB", "BT") else "\\n"
    label = f"{layer.name}{sep}({layer.type})"
    if layer.type in ("Convolution", "Deconvolution"):
        p = layer.convolution_param
        k = p.kernel_size[0] if len(p.kernel_size) else p.kernel_h
        s = p.stride[0] if len(p.stride) else (p.stride_h or 1)
        pad = p.pad[0] if len(p.pad) else p.pad_h
        label += f"{sep}kernel size: {k}{sep}stride: {s}{sep}pad: {pad}"
    elif layer.type == "Pooling":
        p = layer.pooling_param
        names = {0: "MAX", 1: "AVE", 2: "STOCHASTIC"}
        label += f"{sep}pool={names.get(p.pool, p.pool)}{sep}kernel size: {p.kernel_size}{sep}stride: {p.stride}"
    elif layer.type == "InnerProduct":
        label += f"{sep}num_output: {layer.inner_product_param.num_output}"
    return label


def net_to_dot(net_param, rankdir: str = "LR", phase: int | None = None) -> str:
    lines = [f"digraph {_quote(net_param.name or 'Net')} {{", f"  rankdir={rankdir};"]
    blob_nodes = set()
    for i, layer in enumerate(net_param.layer):
        if phase is not None:
            phases = [r.phase for r in layer.include if r.HasField("phase")]
            if phases and phase not in phases:
                continue
            if any(r.HasField("phase") and r.phase == phase for r in layer.exclude):
                continue
        node = f"layer_{i}_{layer.name}"
        lines.append(f"  {_quote(node)} [label={_quote(_layer_label(layer, rankdir))}, {_LAYER_STYLE}];")
        for b in layer.bottom:
            blob_nodes.add(b)
            lines.append(f"  {_quote('blob_' + b)} -> {_quote(node)};")
        for t in layer.top:
            if t in layer.bottom:
                continue  # in-place: the layer acts on the blob it reads
            blob_nodes.add(t)
            lines.append(f"  {_quote(node)} -> {_quote('blob_' + t)};")
    for b in sorted(blob_nodes):
        lines.append(f"  {_quote('blob_' + b)} [label={_quote(b)}, {_BLOB_STYLE}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def draw_net_to_file(net_param, out_path: str, rankdir: str = "LR", phase: int | None = None) -> str:
    dot = net_to_dot(net_param, rankdir, phase)
    ext = out_path.rsplit(".", 1)[-1].lower() if "." in out_path else "png"
    if ext in ("dot", "gv"):
        with open(out_path, "w") as f:
            f.write(dot)
        return out_path
    exe = shutil.which("dot")
    if exe is None:
        raise RuntimeError(f"drawing to .{ext} needs graphviz's 'dot' program, which is not on PATH "
                           f"(e.g. apt-get install graphviz); or write a .dot file")
    proc = subprocess.run([exe, f"-T{ext}", "-o", out_path], input=dot.encode(), capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError(f"graphviz failed to draw {out_path}: {proc.stderr.decode(errors='replace').strip()}")
    return out_path


def main(argv) -> int:
    from google.protobuf import text_format
    from caffe.cli.main import CliError, GflagsParser
    from caffe.proto import caffe_pb2
    parser = GflagsParser("draw", "draw a net: caffe-cli draw NET.prototxt OUT.{png,svg,pdf,dot} "
                          "[--rankdir=LR] [--phase=TRAIN|TEST|ALL]")
    parser.add_flag("rankdir", str, "LR", "graph direction: LR, TB, BT or RL")
    parser.add_flag("phase", str, "ALL", "draw only the layers of this phase: TRAIN, TEST or ALL")
    args = parser.parse(argv)
    if len(args.args) != 2:
        raise CliError(f"expected NET.prototxt OUT\n{parser.format_usage().strip()}")
    net_path, out = args.args
    if args.rankdir not in ("LR", "TB", "BT", "RL"):
        raise CliError(f"--rankdir={args.rankdir}: expected LR, TB, BT or RL")
    phases = {"ALL": None, "TRAIN": 0, "TEST": 1}
    if args.phase.upper() not in phases:
        raise CliError(f"--phase={args.phase}: expected TRAIN, TEST or ALL")
    try:
        with open(net_path) as f:
            text = f.read()
    except OSError as exc:
        raise CliError(f"cannot read {net_path}: {exc.strerror}") from None
    net = caffe_pb2.NetParameter()
    try:
        text_format.Parse(text, net)
    except text_format.ParseError as exc:
        raise CliError(f"{net_path}:{exc}") from None
    try:
        draw_net_to_file(net, out, args.rankdir, phases[args.phase.upper()])
    except RuntimeError as exc:
        raise CliError(str(exc)) from None
    print(out)
    return 0

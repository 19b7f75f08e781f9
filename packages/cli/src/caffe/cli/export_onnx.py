"""`caffe-cli export_onnx --model=deploy.prototxt --weights=w.caffemodel --output=net.onnx`: a trained
net as an ONNX model, through caffe-onnx (the cli's `onnx` extra: pip install "caffe-cli[onnx]").

Flags: --batch N (export with batch size N) or --dynamic_batch (a symbolic batch axis), --opset (default
caffe-onnx's, 18), --phase (default TEST), --level, --stage.
"""
from __future__ import annotations

import logging
import os

from caffe.cli.main import CliError, GflagsParser

log = logging.getLogger("caffe")

USAGE = ("export a trained net to ONNX: caffe-cli export_onnx --model=deploy.prototxt --weights=W.caffemodel "
         "--output=net.onnx [--batch=N | --dynamic_batch] [--opset=18]")


def _caffe_onnx():
    try:
        import caffe.onnx
    except ImportError as exc:
        missing = getattr(exc, "name", None) or "caffe.onnx"
        raise CliError(f"export_onnx needs the caffe-onnx package (import of '{missing}' failed): "
                       f"pip install \"caffe-cli[onnx]\" (or pip install caffe-onnx)") from None
    return caffe.onnx


def main(argv) -> int:
    from caffe.cli.caffe_tool import parse_phase, parse_stages, require_file

    p = GflagsParser("export_onnx", USAGE)
    p.add_flag("model", str, "", "the deploy net definition (prototxt)")
    p.add_flag("weights", str, "", "the trained weights (caffemodel or HDF5), separated by ','")
    p.add_flag("output", str, "", "the ONNX file to write")
    p.add_flag("batch", int, 0, "export with this batch size (0: the prototxt's)")
    p.add_flag("dynamic_batch", bool, False, "make the batch axis symbolic (any batch size)")
    p.add_flag("opset", int, 0, "the ONNX opset to target (0: caffe-onnx's default)")
    p.add_flag("phase", str, "TEST", "network phase (TRAIN or TEST)")
    p.add_flag("level", int, 0, "network level")
    p.add_flag("stage", str, "", "network stages, separated by ','")
    args = p.parse(argv)
    if args.args:
        raise CliError(f"unexpected arguments: {' '.join(args.args)}\n{p.format_usage().strip()}")
    for flag in ("model", "weights", "output"):
        if not getattr(args, flag):
            raise CliError(f"--{flag} is required\n{p.format_usage().strip()}")
    if args.batch and args.dynamic_batch:
        raise CliError("--batch and --dynamic_batch exclude each other: give one")
    if args.batch < 0:
        raise CliError(f"--batch={args.batch}: must be a positive batch size")
    require_file(args.model, "model")
    weights = [w for w in args.weights.split(",") if w]
    for w in weights:
        require_file(w, "weights")
    out_dir = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(out_dir):
        raise CliError(f"--output={args.output}: directory {out_dir} does not exist")
    onnx_export = _caffe_onnx()
    from caffe.net import Net
    from caffe.net.upgrade import ReadNetParamsFromTextFileOrDie
    phase, stages = parse_phase(args.phase, 1), parse_stages(args.stage)
    param = ReadNetParamsFromTextFileOrDie(args.model)
    # refuse data/loss/Python layers before building the net (a train_val net's databases may be absent)
    onnx_export.check_net_param(param, phase, args.level, stages)
    net = Net(param, phase, level=args.level, stages=stages)
    for w in weights:
        net.CopyTrainedLayersFrom(w)
    model = onnx_export.export(net, args.output, opset=args.opset or None, batch=args.batch or None,
                               dynamic_batch=args.dynamic_batch,
                               doc_string=f"exported by caffe-cli export_onnx from {os.path.basename(args.model)} "
                                          f"and {', '.join(os.path.basename(w) for w in weights)}")

    def shapes(values):
        return ", ".join(f"{v.name} {tuple(d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim)}"
                         for v in values)
    log.info("Exported net '%s' (%d layers -> %d ONNX nodes, opset %d) to %s", net.name, len(net.layers),
             len(model.graph.node), model.opset_import[0].version, args.output)
    log.info("ONNX inputs: %s", shapes(model.graph.input))
    log.info("ONNX outputs: %s", shapes(model.graph.output))
    return 0

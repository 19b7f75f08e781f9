"""upgrade_net_proto_text: rewrite a text NetParameter (prototxt) in an old format (V0, V1 'layers', old data transformation fields) in the latest format (Caffe's tools/upgrade_net_proto_text.cpp).

    caffe-cli upgrade_net_proto_text IN OUT

The upgrade itself is caffe.net.upgrade's; a file already in the latest format is
written out unchanged (and said so).
"""
from __future__ import annotations

from caffe.cli._upgrade import run


def main(argv: list[str]) -> int:
    return run(argv, "upgrade_net_proto_text", "net", binary=False)

"""upgrade_net_proto_binary: rewrite a binary NetParameter (caffemodel) in an old format in the latest format (Caffe's tools/upgrade_net_proto_binary.cpp).

    caffe-cli upgrade_net_proto_binary IN OUT

The upgrade itself is caffe.net.upgrade's; a file already in the latest format is
written out unchanged (and said so).
"""
from __future__ import annotations

from caffe.cli._upgrade import run


def main(argv: list[str]) -> int:
    return run(argv, "upgrade_net_proto_binary", "net", binary=True)

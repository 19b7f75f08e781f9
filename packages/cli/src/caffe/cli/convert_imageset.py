"""convert_imageset: images named in a list file -> an LMDB/LevelDB of Datums (Caffe's tools/convert_imageset.cpp).

    caffe-cli convert_imageset [FLAGS] ROOTFOLDER/ LISTFILE DB_NAME

LISTFILE holds "path label" lines (paths relative to ROOTFOLDER, which is prepended
as is). Records: key '%08d_<path>' of the line index, value a Datum: raw (channels,
height, width, BGR bytes channel-first, as Caffe's CVMatToDatum) or, with -encoded,
the image file's own bytes when no resize is asked and its extension matches
-encode_type (else re-encoded with Pillow; JPEG quality 95 as OpenCV's default).
Unlike Caffe, which logs and skips an unreadable image, a missing or undecodable
image stops the conversion with its line named (and leaves no database behind).
"""
from __future__ import annotations

import io
import logging
import os

from caffe.cli.main import CliError, GflagsParser, usage_error

log = logging.getLogger("caffe")

USAGE = """Convert a set of images to the leveldb/lmdb
format used as input for Caffe.
Usage:
    convert_imageset [FLAGS] ROOTFOLDER/ LISTFILE DB_NAME
The ImageNet dataset for the training demo is at
    http://www.image-net.org/download-images"""

# Pillow's format names for the encodings Caffe users pass (-encode_type / the file extension)
_FORMATS = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "bmp": "BMP", "tif": "TIFF", "tiff": "TIFF",
            "ppm": "PPM", "pgm": "PPM", "pbm": "PPM", "webp": "WEBP"}


def _ext(path: str) -> str:
    p = path.rfind(".")
    return (path[p + 1:] if p >= 0 else path).lower()


def _match_ext(path: str, encoding: str) -> bool:
    ext, enc = _ext(path), encoding.lower()
    return ext == enc or (enc == "jpg" and ext == "jpeg")


def image_to_datum(path: str, label: int, resize_height: int, resize_width: int, is_color: bool,
                   encoding: str, where: str):
    """Caffe's ReadImageToDatum."""
    from caffe.layers.data_transformer import array_to_datum, read_image
    from caffe.proto import caffe_pb2
    img = read_image(path, resize_height, resize_width, is_color, where=where)  # (C, H, W), BGR
    if not encoding:
        return array_to_datum(img, label)
    if not resize_height and not resize_width and _match_ext(path, encoding):
        from PIL import Image
        with Image.open(path) as probe:  # store the file itself when its channels are what was asked
            native_color = probe.mode not in ("1", "L", "LA", "I", "I;16", "F")
        if native_color == is_color:
            from caffe.blob.fileio import FileInputError, read_regular_file
            try:
                return caffe_pb2.Datum(data=read_regular_file(path, "image"), label=label, encoded=True)
            except FileInputError as exc:
                raise CliError(f"{where}: {exc}") from None
    fmt = _FORMATS.get(encoding.lower())
    if fmt is None:
        raise CliError(f"{where}: unknown encode_type '{encoding}' (use one of {', '.join(sorted(_FORMATS))})")
    from PIL import Image
    arr = img[0] if img.shape[0] == 1 else img[::-1].transpose(1, 2, 0)  # back to RGB, HWC
    buf = io.BytesIO()
    Image.fromarray(arr.copy()).save(buf, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return caffe_pb2.Datum(data=buf.getvalue(), label=label, encoded=True)


def convert(root_folder: str, list_file: str, db_name: str, gray: bool = False, shuffle: bool = False,
            backend: str = "lmdb", resize_width: int = 0, resize_height: int = 0, check_size: bool = False,
            encoded: bool = False, encode_type: str = "") -> int:
    from caffe.blob import context
    from caffe.layers.base_data import parallel_map
    from caffe.layers.db import DBWriter
    from caffe.layers.image_data_layer import read_list_file
    is_color = not gray
    lines = read_list_file(list_file, "LISTFILE")
    if shuffle:
        log.info("Shuffling data")
        order = context.rng().permutation(len(lines))
        lines = [lines[i] for i in order]
    log.info("A total of %d images.", len(lines))
    if encode_type and not encoded:
        log.info("encode_type specified, assuming encoded=true.")
        encoded = True
    resize_height, resize_width = max(0, resize_height), max(0, resize_width)

    def make(job):
        line_id, (path, label, lineno) = job
        enc = encode_type
        if encoded and not enc:
            if "." not in path:
                log.warning("Failed to guess the encoding of '%s'", path)
            enc = _ext(path)
        where = f"image '{root_folder + path}' (LISTFILE '{list_file}' line {lineno})"
        return image_to_datum(root_folder + path, label, resize_height, resize_width, is_color, enc, where)

    data_size = None
    count = 0
    with DBWriter(db_name, backend, batch=1000) as writer:
        chunk = 256  # decode a chunk in parallel (Pillow releases the GIL), write in list order
        for start in range(0, len(lines), chunk):
            jobs = list(enumerate(lines[start:start + chunk], start=start))
            for (line_id, (path, _, lineno)), datum in zip(jobs, parallel_map(make, jobs)):
                if check_size and not datum.encoded:
                    size = datum.channels * datum.height * datum.width
                    if data_size is None:
                        data_size = size
                    elif len(datum.data) != data_size:
                        raise CliError(f"image '{root_folder + path}' (LISTFILE '{list_file}' line {lineno}): "
                                       f"incorrect data field size {len(datum.data)}, expected {data_size} "
                                       f"(-check_size)")
                writer.put(f"{line_id:08d}_{path}".encode("utf-8"), datum.SerializeToString())
                count += 1
                if count % 1000 == 0:
                    log.info("Processed %d files.", count)
    if count % 1000:
        log.info("Processed %d files.", count)
    return count


def main(argv: list[str]) -> int:
    parser = GflagsParser("convert_imageset", USAGE)
    parser.add_flag("gray", bool, False, "When this option is on, treat images as grayscale ones")
    parser.add_flag("shuffle", bool, False, "Randomly shuffle the order of images and their labels")
    parser.add_flag("backend", str, "lmdb", "The backend {lmdb, leveldb} for storing the result")
    parser.add_flag("resize_width", int, 0, "Width images are resized to")
    parser.add_flag("resize_height", int, 0, "Height images are resized to")
    parser.add_flag("check_size", bool, False, "When this option is on, check that all the datum have the same size")
    parser.add_flag("encoded", bool, False, "When this option is on, the encoded image will be save in datum")
    parser.add_flag("encode_type", str, "", "Optional: What type should we encode the image as ('png','jpg',...).")
    ns = parser.parse(argv)
    if len(ns.args) != 3:
        raise usage_error(parser, f"expected 3 arguments, got {len(ns.args)}")
    root, list_file, db_name = ns.args
    if not os.path.isfile(list_file):
        raise CliError(f"cannot open LISTFILE '{list_file}': no such file")
    convert(root, list_file, db_name, gray=ns.gray, shuffle=ns.shuffle, backend=ns.backend,
            resize_width=ns.resize_width, resize_height=ns.resize_height, check_size=ns.check_size,
            encoded=ns.encoded, encode_type=ns.encode_type)
    return 0

"""caffe-cli: Caffe's command-line tools as subcommands.

    caffe-cli <command> [flags and arguments]
    caffe <command> [flags and arguments]      (the same program under Caffe's name)

Each command lives in its own module of caffe.cli with a `main(argv) -> int`; this
file holds the dispatch table and what the commands share: a gflags-compatible
argparse front end (`-flag x`, `-flag=x`, `--flag=x`, booleans as `-flag`,
`-flag=false`, `-noflag`; flags may follow positional arguments, as gflags allows),
glog-format logging on stderr (caffe.cli.glog: the line format Caffe's log parsers read), and
SIGTERM/Ctrl-C handling that unwinds (so database writers remove their partial work).
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import signal
import sys
import threading

# command -> (module, one-line description). Commands are imported only when run.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("caffe.cli.caffe_tool:train_main", "train or finetune a model (--solver, --snapshot, --weights, --gpu)"),
    "test": ("caffe.cli.caffe_tool:test_main", "score a model (--model, --weights, --iterations)"),
    "time": ("caffe.cli.caffe_tool:time_main", "benchmark model execution time, per layer (--model, --iterations)"),
    "device_query": ("caffe.cli.caffe_tool:device_query_main", "show GPU diagnostic information"),
    "plot": ("caffe.cli.plot:main", "plot training/test loss and accuracy from a training log (PNG)"),
    "draw": ("caffe.cli.draw:main", "draw a net's graph (png/svg/pdf via graphviz, or .dot)"),
    "convert_imageset": ("caffe.cli.convert_imageset", "convert a list of images to an LMDB/LevelDB of Datums"),
    "convert_mnist_data": ("caffe.cli.convert_mnist_data", "convert MNIST IDX image/label files to an LMDB/LevelDB"),
    "convert_mnist_siamese_data": ("caffe.cli.convert_mnist_siamese_data",
                                   "convert MNIST IDX files to a LevelDB/LMDB of random image pairs (siamese)"),
    "convert_cifar_data": ("caffe.cli.convert_cifar_data", "convert CIFAR-10 binary batches to train/test LMDBs"),
    "compute_image_mean": ("caffe.cli.compute_image_mean", "compute the mean image of a database (binaryproto)"),
    "extract_features": ("caffe.cli.extract_features", "run a net and save blobs' features to databases"),
    "upgrade_net_proto_text": ("caffe.cli.upgrade_net_proto_text", "upgrade a text NetParameter to the latest format"),
    "upgrade_net_proto_binary": ("caffe.cli.upgrade_net_proto_binary",
                                 "upgrade a binary NetParameter (caffemodel) to the latest format"),
    "upgrade_solver_proto_text": ("caffe.cli.upgrade_solver_proto_text",
                                  "upgrade a text SolverParameter to the latest format"),
    "export_onnx": ("caffe.cli.export_onnx", "export a trained net to ONNX (--model, --weights, --output; "
                                             "needs caffe-onnx)"),
}


# the name the program runs under: `caffe-cli`, or `caffe` (usage lines and glog file names follow it)
PROGRAM = "caffe-cli"


class CliError(Exception):
    """A user-facing failure of a command: printed as one line, exit status 1."""


# ----------------------------------------------------------------------------- flags

def _parse_bool(text: str) -> bool:
    t = str(text).strip().lower()
    if t in ("1", "true", "t", "yes", "y"):
        return True
    if t in ("0", "false", "f", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got {text!r}")


class GflagsParser(argparse.ArgumentParser):
    """argparse with gflags spellings. Declare flags with add_flag; positionals land in `args`."""

    def __init__(self, prog: str, usage_text: str = "", **kw):
        super().__init__(prog=f"{PROGRAM} {prog}", description=usage_text,
                         formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False, **kw)
        self._flag_types: dict[str, type] = {}
        self.add_argument("args", nargs="*", help=argparse.SUPPRESS)

    def add_flag(self, name: str, type_: type, default, help_text: str = "") -> None:
        self._flag_types[name] = type_
        conv = _parse_bool if type_ is bool else type_
        self.add_argument(f"--{name}", dest=name, type=conv, default=default,
                          help=f"{help_text} (default: {str(default).lower() if type_ is bool else repr(default)})")

    def normalize(self, argv: list[str]) -> list[str]:
        """gflags spellings -> argparse's: -x=v / --x=v / -x v -> --x=v / --x v; -b / -nob -> --b=true/false."""
        out: list[str] = []
        it = iter(argv)
        for arg in it:
            if arg == "--":
                out.append(arg)
                out.extend(it)
                break
            if not arg.startswith("-") or arg == "-" or arg in ("-h", "--help"):
                out.append(arg)
                continue
            body = arg.lstrip("-")
            name, eq, value = body.partition("=")
            if name in self._flag_types:
                if self._flag_types[name] is bool:
                    out.append(f"--{name}={value if eq else 'true'}")
                else:
                    out.append(f"--{name}={value}" if eq else f"--{name}")
            elif name.startswith("no") and self._flag_types.get(name[2:]) is bool and not eq:
                out.append(f"--{name[2:]}=false")
            else:
                try:
                    float(arg)  # a negative number is a positional argument
                    out.append(arg)
                except ValueError:
                    known = ", ".join(f"-{n}" for n in sorted(self._flag_types)) or "none"
                    raise CliError(f"unknown command line flag '{name}' (flags of {self.prog}: {known})") from None
        return out

    def parse(self, argv: list[str]) -> argparse.Namespace:
        return self.parse_intermixed_args(self.normalize(list(argv)))

    def error(self, message):  # argparse's errors as CliError (usage errors exit 1, as Caffe's tools)
        raise CliError(f"{message}\n{self.format_usage().strip()}")


def usage_error(parser: GflagsParser, message: str) -> CliError:
    return CliError(f"{message}\n\n{parser.format_help().rstrip()}")


# ----------------------------------------------------------------------------- logging

def _setup_logging(log_dir: str | None = None, program: str = "caffe-cli") -> logging.Logger:
    """glog-format lines on stderr (caffe.cli.glog), and in a file under log_dir (glog's --log_dir);
    GLOG_minloglevel=1/2/3 raises the bar, GLOG_log_dir sets log_dir, as glog's."""
    from caffe.cli.glog import setup_logging
    levels = {"0": logging.INFO, "1": logging.WARNING, "2": logging.ERROR, "3": logging.CRITICAL}
    setup_logging(log_dir=log_dir or os.environ.get("GLOG_log_dir") or None, program=program,
                  level=levels.get(os.environ.get("GLOG_minloglevel", "0"), logging.INFO))
    return logging.getLogger("caffe")


def pop_global_flags(argv: list[str]) -> tuple[list[str], dict]:
    """Take the flags every command accepts out of argv: --debug (show tracebacks), --log_dir=DIR."""
    out, flags = [], {"debug": False, "log_dir": None}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.lstrip("-").partition("=")
        if arg.startswith("-") and name == "debug":
            flags["debug"] = _parse_bool(value) if eq else True
        elif arg.startswith("-") and name == "log_dir":
            if not eq:
                if i + 1 >= len(argv):
                    raise CliError("--log_dir needs a directory")
                i += 1
                value = argv[i]
            flags["log_dir"] = value
        else:
            out.append(arg)
        i += 1
    return out, flags


# ----------------------------------------------------------------------------- dispatch

def _on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds: `with DBWriter(...)` removes its partial database


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"usage: {PROGRAM} <command> [flags] [args]", "", "commands:"]
    lines += [f"  {name:<{width}}  {desc}" for name, (_, desc) in COMMANDS.items()]
    lines += ["", f"Run '{PROGRAM} <command> --help' for a command's flags."]
    return "\n".join(lines)


def _program_name(program: str | None) -> str:
    if program:
        return program
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return name if name in ("caffe", "caffe-cli") else "caffe-cli"


def caffe_main(argv: list[str] | None = None) -> int:
    """The `caffe` command: this program under Caffe's tool name (`caffe train --solver=...`)."""
    return main(argv, program="caffe")


def main(argv: list[str] | None = None, program: str | None = None) -> int:
    global PROGRAM
    PROGRAM = _program_name(program)
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 1
    command, rest = argv[0], argv[1:]
    entry = COMMANDS.get(command)
    if entry is None:
        close = difflib.get_close_matches(command, COMMANDS, n=3)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        print(f"{PROGRAM}: unknown command '{command}'.{hint}\n\n{_usage()}", file=sys.stderr)
        return 1
    try:
        rest, flags = pop_global_flags(rest)
    except CliError as exc:
        print(f"{PROGRAM} {command}: {exc}", file=sys.stderr)
        return 1
    log = _setup_logging(flags["log_dir"], PROGRAM)
    if flags["debug"]:
        log.setLevel(logging.DEBUG)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        module_name, _, func = entry[0].partition(":")
        module = importlib.import_module(module_name)
        return int(getattr(module, func or "main")(rest) or 0)
    except KeyboardInterrupt:
        print(f"{PROGRAM} {command}: interrupted", file=sys.stderr)
        return 130
    except CliError as exc:
        print(f"{PROGRAM} {command}: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError, RuntimeError, ArithmeticError) as exc:
        # DBError, DataError, LayerError, SolverError, parse errors, NaN loss...: one clear line
        if flags["debug"]:
            raise
        print(f"{PROGRAM} {command}: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a bug rather than bad input: still one line unless --debug
        if flags["debug"]:
            raise
        print(f"{PROGRAM} {command}: internal error: {type(exc).__name__}: {exc} (rerun with --debug for "
              f"the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    # `python -m caffe.cli.main`: run the imported module, so commands raise the same CliError class
    from caffe.cli.main import main as _main
    sys.exit(_main())

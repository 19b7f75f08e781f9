"""caffe-cli's front end: gflags spellings, dispatch, errors."""
import subprocess
import sys

import pytest

from caffe.cli.main import COMMANDS, CliError, GflagsParser, main


def parser():
    p = GflagsParser("tool", "usage text")
    p.add_flag("backend", str, "lmdb", "backend")
    p.add_flag("resize_width", int, 0, "width")
    p.add_flag("gray", bool, False, "gray")
    p.add_flag("shuffle", bool, False, "shuffle")
    return p


@pytest.mark.parametrize("argv", [
    ["-backend", "leveldb", "a", "b"], ["-backend=leveldb", "a", "b"], ["--backend=leveldb", "a", "b"],
    ["--backend", "leveldb", "a", "b"], ["a", "b", "--backend=leveldb"], ["a", "-backend", "leveldb", "b"],
])
def test_gflags_spellings(argv):
    ns = parser().parse(argv)
    assert ns.backend == "leveldb" and ns.args == ["a", "b"]


@pytest.mark.parametrize("argv, gray, shuffle", [
    (["-gray", "x"], True, False), (["--gray", "x"], True, False), (["-gray=false", "x"], False, False),
    (["-nogray", "-shuffle", "x"], False, True), (["x", "--shuffle=true", "-gray=1"], True, True),
])
def test_booleans_take_no_separate_value(argv, gray, shuffle):
    ns = parser().parse(argv)
    assert (ns.gray, ns.shuffle, ns.args) == (gray, shuffle, ["x"])


def test_defaults_types_and_errors():
    ns = parser().parse(["-resize_width", "32"])
    assert ns.resize_width == 32 and ns.backend == "lmdb" and ns.gray is False and ns.args == []
    with pytest.raises(CliError, match="unknown command line flag 'colour'"):
        parser().parse(["-colour", "x"])
    with pytest.raises(CliError, match="invalid int value"):
        parser().parse(["-resize_width=wide"])
    with pytest.raises(CliError, match="expected a boolean"):
        parser().parse(["-gray=maybe"])
    assert parser().parse(["-5"]).args == ["-5"]  # a negative number is an argument


def test_dispatch(capsys):
    assert main([]) == 1
    assert "convert_imageset" in capsys.readouterr().err
    assert main(["--help"]) == 0
    assert "convert_mnist_data" in capsys.readouterr().out
    assert main(["convert_mnist"]) == 1
    assert "Did you mean: convert_mnist_data" in capsys.readouterr().err
    assert main(["convert_mnist_data", "only-one-arg"]) == 1
    err = capsys.readouterr().err
    assert "expected 3 arguments, got 1" in err and "input_image_file input_label_file output_db_file" in err


def test_every_command_module_imports_and_has_main():
    import importlib
    for name, (target, _) in COMMANDS.items():
        module, _, func = target.partition(":")
        assert callable(getattr(importlib.import_module(module), func or "main")), name


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "caffe.cli.main", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "compute_image_mean" in out.stdout

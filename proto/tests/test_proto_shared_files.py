"""Every prototxt shipped in ../shared parses with Caffe's schema.

Solver files (names containing ``solver``) parse as SolverParameter, the rest
as NetParameter. Skips when the shared folder beside the repository is absent.
"""

from pathlib import Path

import pytest
from google.protobuf import text_format

from caffe.proto import caffe_pb2

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
MODELS = SHARED / "caffe-models"
LENET = SHARED / "reference" / "lenet"


def _prototxts():
    files = []
    if MODELS.is_dir():
        files += sorted(MODELS.rglob("*.prototxt"))
    if LENET.is_dir():
        files += sorted(LENET.glob("*.prototxt"))
    if not files:
        return [pytest.param(None, id="no-shared-prototxts", marks=pytest.mark.skip(
            reason=f"shared prototxts not found ({MODELS} and {LENET} are absent)"))]
    return [pytest.param(f, id=str(f.relative_to(SHARED))) for f in files]


def _message_for(path: Path):
    return caffe_pb2.SolverParameter() if "solver" in path.name else caffe_pb2.NetParameter()


@pytest.mark.parametrize("path", _prototxts())
def test_prototxt_parses(path):
    msg = _message_for(path)
    text = path.read_text()
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as exc:  # keep line:column in the failure
        pytest.fail(f"{path}: {exc}")
    if isinstance(msg, caffe_pb2.NetParameter):
        assert len(msg.layer) + len(msg.layers) > 0, f"{path}: no layers parsed"
    else:
        assert msg.ListFields(), f"{path}: empty solver"
    # Text round trip: printing and parsing again gives the same message.
    again = type(msg)()
    text_format.Parse(text_format.MessageToString(msg), again)
    assert again == msg


def test_shared_models_are_found():
    if not MODELS.is_dir():
        pytest.skip(f"{MODELS} is absent")
    files = list(MODELS.rglob("*.prototxt"))
    assert len(files) >= 30, files
    solvers = [f for f in files if "solver" in f.name]
    assert solvers and len(solvers) < len(files)


def test_unknown_field_is_a_parse_error_with_position():
    with pytest.raises(text_format.ParseError) as info:
        text_format.Parse('name: "x"\nlayer { name: "a" no_such_field: 1 }\n',
                          caffe_pb2.NetParameter())
    assert "2:" in str(info.value)

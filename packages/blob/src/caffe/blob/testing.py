"""Shared test settings: hypothesis profiles, used by every package's tests/conftest.py.

Profiles: `ci` (default; few examples, fits CI's time), `dev` (more), `long`
(for long local runs). Choose with HYPOTHESIS_PROFILE=long.
"""
from __future__ import annotations

import os


def register_hypothesis_profiles() -> None:
    try:
        from hypothesis import HealthCheck, Phase, settings
    except ImportError:  # hypothesis is a test extra
        return
    common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                  print_blob=True)
    # under CI (CI=true) the examples are derandomized so a landing never hangs on a rare draw; local runs
    # (and the dev/long profiles) draw fresh examples every time
    settings.register_profile("ci", max_examples=12, derandomize=bool(os.environ.get("CI")), **common)
    settings.register_profile("dev", max_examples=50, **common)
    settings.register_profile("long", max_examples=500, **common)
    # scripts/mutation.sh: the CI draws, and a failing example fails at once (no shrinking: a mutant that
    # breaks a property would otherwise be re-run hundreds of times to find the smallest failing example)
    settings.register_profile("mutation", max_examples=12, derandomize=True,
                              phases=[Phase.explicit, Phase.reuse, Phase.generate], **common)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# --- GPU runs: real CuPy, the CuPy stand-in, or none --------------------------------------------------

def gpu_run_kind() -> str:
    """"standin" (CAFFE_CUPY_STANDIN: NumPy behind CuPy's API, no GPU), "gpu" (a usable CUDA device) or "none"."""
    from caffe.blob import context
    if context.cupy_standin():
        return "standin"
    return "gpu" if context.gpu_available() else "none"


def gpu_report_header() -> str:
    """One line for pytest's header saying what GPU-marked tests run on."""
    from caffe.blob import context
    kind = gpu_run_kind()
    if kind == "standin":
        from caffe.blob import _standin
        return "GPU: " + _standin.notice() + " Only gpu-marked tests run."
    if kind == "gpu":
        import cupy
        return f"GPU: real CuPy {cupy.__version__}, {context.gpu_count()} CUDA device(s): gpu-marked tests run on it"
    return f"GPU: none ({context._probe_gpu()[1]}): gpu-marked tests skip"


def standin_deselect(config, items) -> None:
    """Under the stand-in only gpu-marked tests run (the rest assume the machine's real GPU or none)."""
    if gpu_run_kind() != "standin":
        return
    keep = [it for it in items if it.get_closest_marker("gpu") is not None]
    dropped = [it for it in items if it.get_closest_marker("gpu") is None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def standin_summary(terminalreporter) -> None:
    if gpu_run_kind() != "standin":
        return
    from caffe.blob import _standin
    terminalreporter.write_sep("=", "CuPy STAND-IN: NO REAL GPU RAN", yellow=True, bold=True)
    terminalreporter.write_line(_standin.notice())
    terminalreporter.write_line(f"host<->device transfers in this run: {_standin.transfers!r}")

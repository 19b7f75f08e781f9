"""Shared test settings: hypothesis profiles, used by every package's tests/conftest.py.

Profiles: `ci` (default; few examples, fits CI's time), `dev` (more), `long`
(for long local runs). Choose with HYPOTHESIS_PROFILE=long.
"""
from __future__ import annotations

import os


def register_hypothesis_profiles() -> None:
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:  # hypothesis is a test extra
        return
    common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                  print_blob=True)
    # under CI (CI=true) the examples are derandomized so a landing never hangs on a rare draw; local runs
    # (and the dev/long profiles) draw fresh examples every time
    settings.register_profile("ci", max_examples=12, derandomize=bool(os.environ.get("CI")), **common)
    settings.register_profile("dev", max_examples=50, **common)
    settings.register_profile("long", max_examples=500, **common)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

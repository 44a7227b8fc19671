"""Local wheels for the tests that build a Python environment (pre-commit's hook virtualenv, `pip wheel` of this
checkout): `.ci/run` fills `.ci/wheels` at its install step (the build backend and memfit's dependencies), and these
tests install from there with no package index, so no test needs the network."""

from __future__ import annotations

import os
from pathlib import Path

import needs

WHEELS = Path(__file__).resolve().parents[2] / ".ci" / "wheels"


def offline(env: dict) -> dict:
    """env for pip (and what runs pip: pre-commit) with the local wheels and no index."""
    if not any(WHEELS.glob("*.whl")):
        needs.unavailable(f"no local wheels in {WHEELS} (.ci/run builds them at its install step): pip would need a package index")
    return {**env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELS), "PIP_CONFIG_FILE": os.devnull}

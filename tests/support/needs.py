"""Optional test dependencies: a user without an extra may skip those tests, CI never does.

CI installs every extra (.ci/run), so there a missing module or tool is a broken setup and fails
the run instead of hiding as a skip.
"""

import importlib
import os

import pytest


def unavailable(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI installs every test dependency: this is a broken setup)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def module(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as error:
        unavailable(f"{name} is not installed ({error})")

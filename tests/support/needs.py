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


def available(name: str) -> bool:
    """Whether `name` can be imported (without importing it)."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


class _Lazy:
    """A module imported when a test first uses it: a module-level `torch = needs.lazy("torch")` lets the tests that
    never touch torch run without it, and skips (or, under CI, fails) only those that do."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("__") or attr == "pytestmark":  # pytest's collector looking at a module's names
            raise AttributeError(attr)
        return getattr(module(self._name), attr)


def lazy(name: str):
    return _Lazy(name)

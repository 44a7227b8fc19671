"""memfit: a language-server-style static checker for training-memory footprints."""

from memfit.recipe.calculator import compute_footprint

__version__ = "0.1.0"
__all__ = ["DoesNotFit", "Result", "__version__", "check_config", "check_file", "compute_footprint"]

# The Python API (memfit/api/checking.py), loaded on first use: `import memfit` (and every CLI start, which imports
# this package first) pays nothing for it. importlib by name: the root imports no stage (tests/project/test_arch.py).
_API = ("check_file", "check_config", "DoesNotFit", "Result")


def __getattr__(name: str):
    if name in _API:
        import importlib

        return getattr(importlib.import_module("memfit.api.checking"), name)
    raise AttributeError(f"module 'memfit' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_API])

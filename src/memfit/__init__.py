"""memfit: a language-server-style static checker for training-memory footprints."""

from memfit.recipe.calculator import compute_footprint

__version__ = "0.1.0"
__all__ = ["__version__", "compute_footprint"]

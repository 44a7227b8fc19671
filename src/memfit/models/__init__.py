"""Model derivations: a declared model section -> the tensors training keeps.

Each kind of model is one module beside this one (keras.py: a Keras-style layer stack;
transformers from a config.json next); `derive` picks the one the document asks for.
"""

from __future__ import annotations


def derive(data: dict, config) -> list:
    """Tensors of the document's model section appended to config.tensors; the problems found."""
    from . import keras

    tensors, problems = keras.derive(data["model"], config)
    config.tensors.extend(tensors)
    return problems

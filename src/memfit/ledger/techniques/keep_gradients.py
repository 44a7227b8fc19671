"""Gradients kept between steps: `optimizer.zero_grad(set_to_none=False)` zeroes the gradients in place instead
of freeing them, so every gradient is allocated from the first instant of the next step's forward (PyTorch's
default has been `set_to_none=True` since 2.0; transformers' Trainer before 4.31 and many hand-written loops
zeroed in place). The step then runs as a later micro-batch of gradient accumulation does: the walk holds
every gradient through forward and backward.
"""

from __future__ import annotations

from dataclasses import replace

NAME = "keep_gradients"

KEYS = {
    "keep_gradients": {
        "title": "Gradients kept between steps",
        "description": "true: the gradients stay allocated between optimizer steps (zero_grad(set_to_none=False), the "
                       "old Trainer default), so they are on the device through the whole forward and backward. "
                       "Default false: PyTorch frees them (set_to_none=True).",
        "type": "boolean",
        "default": False,
    },
}


def applies(training: dict) -> bool:
    return training.get("keep_gradients") is True


def problems(config, training: dict) -> list:
    return []


def rewrite(step, config, training: dict):
    return replace(step, accumulating=True)

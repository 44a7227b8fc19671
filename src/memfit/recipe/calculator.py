"""Shapes x byte widths -> exact byte counts (the contract in the seed spec).

The arguments are checked here; the bytes come from the one cost model (costs.Recipe), the
same the checker uses.
"""

from __future__ import annotations

import math
from fractions import Fraction

from memfit.recipe.costs import OPTIMIZER_STATES, Recipe, Width, byte_width, optimizer_states, tensor_bytes, totals

__all__ = ["OPTIMIZER_STATES", "byte_width", "compute_footprint", "element_count", "optimizer_states", "tensor_bytes"]

_DIM_RULE = "dims must be non-negative integers"


def element_count(shape: object, argument: str) -> int:
    """N = product of dims; [] is a scalar (1), a zero dim gives 0."""
    if not isinstance(shape, (list, tuple)):
        raise TypeError(f"{argument} is {shape!r}: a shape must be a list of dims")
    for axis, dim in enumerate(shape):
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"{argument}[{axis}] is {dim!r}: {_DIM_RULE}")
        if dim < 0:
            raise ValueError(f"{argument}[{axis}] is {dim!r}: {_DIM_RULE}")
    return math.prod(shape)


def _shapes(shapes: object, argument: str) -> list[int]:
    if not isinstance(shapes, (list, tuple)):
        raise TypeError(f"{argument} is {shapes!r}: expected a list of shapes")
    return [element_count(shape, f"{argument}[{i}]") for i, shape in enumerate(shapes)]


def _width(width: object, argument: str) -> Fraction | int:
    exact = byte_width(width, argument)
    return exact.numerator if exact.denominator == 1 else exact


def compute_footprint(
    param_shapes,
    param_bytes_per_element,
    grad_bytes_per_element,
    activation_shapes,
    activation_bytes_per_element,
    optimizer,
    optimizer_bytes_per_element,
) -> dict[str, int]:
    """Training-memory footprint in exact bytes.

    >>> compute_footprint([[4, 3], [3]], 2, 4, [[2, 4]], 2, "adam", 4)
    {'parameters': 30, 'gradients': 60, 'activations': 16, 'optimizer_state': 120, 'total': 226}
    """
    params = _shapes(param_shapes, "param_shapes")
    acts = _shapes(activation_shapes, "activation_shapes")
    w_param = _width(param_bytes_per_element, "param_bytes_per_element")
    w_grad = _width(grad_bytes_per_element, "grad_bytes_per_element")
    w_act = _width(activation_bytes_per_element, "activation_bytes_per_element")
    w_opt = _width(optimizer_bytes_per_element, "optimizer_bytes_per_element")
    widths = {"parameters": w_param, "gradients": w_grad, "activations": w_act, "optimizer_state": w_opt}
    recipe = Recipe(str(optimizer), optimizer_states(optimizer), {c: Width(str(w), w) for c, w in widths.items()})
    costs = [recipe.cost("parameters", n) for n in params] + [recipe.cost("activations", n) for n in acts]
    return totals(costs)

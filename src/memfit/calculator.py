"""Shapes x byte widths -> exact byte counts (the contract in the seed spec).

Every count is a Python int, so dims of 10**12 and totals past 2**64 stay exact.
Widths may be fractional multiples of 1/8 byte (4-bit formats): a tensor's
storage is then rounded up to whole bytes, tensor by tensor, because packed
formats pad each tensor, never share a byte between two.
"""

from __future__ import annotations

import math
from fractions import Fraction
from numbers import Rational

# Optimizer -> state tensors kept per parameter, each the parameter's shape.
# Verified against torch.optim (2.x) `state[p]` after one step; see README.
OPTIMIZER_STATES: dict[str, int] = {
    "sgd": 0,  # plain SGD, momentum=0: no state
    "momentum": 1,  # SGD(momentum>0): momentum_buffer
    "sgd_momentum": 1,
    "nesterov": 1,  # SGD(nesterov=True): momentum_buffer
    "adagrad": 1,  # sum (plus a scalar step, not counted)
    "rmsprop": 1,  # square_avg (momentum>0 adds momentum_buffer, centered adds grad_avg)
    "adadelta": 2,  # square_avg, acc_delta
    "lion": 1,  # exp_avg (torch has no Lion; as the reference implementations keep)
    "adam": 2,  # exp_avg, exp_avg_sq
    "adamw": 2,  # exp_avg, exp_avg_sq
    "adamax": 2,  # exp_avg, exp_inf
    "nadam": 2,  # exp_avg, exp_avg_sq (mu_product is a scalar)
    "radam": 2,  # exp_avg, exp_avg_sq
}

_DIM_RULE = "dims must be non-negative integers"


def optimizer_states(optimizer: object, argument: str = "optimizer") -> int:
    """State tensors per parameter for an optimizer name (case-insensitive)."""
    if not isinstance(optimizer, str):
        raise TypeError(f"{argument} is {optimizer!r}: expected an optimizer name (str)")
    try:
        return OPTIMIZER_STATES[optimizer.strip().lower()]
    except KeyError:
        known = ", ".join(sorted(OPTIMIZER_STATES))
        raise ValueError(f"{argument} is {optimizer!r}: unknown optimizer; known: {known}") from None


def byte_width(width: object, argument: str) -> Fraction:
    """A bytes-per-element width as an exact Fraction: positive, a multiple of 1/8."""
    if isinstance(width, bool) or not isinstance(width, (int, float, Rational)):
        raise TypeError(f"{argument} is {width!r}: a byte width must be a number")
    if isinstance(width, float) and not math.isfinite(width):
        raise ValueError(f"{argument} is {width!r}: a byte width must be finite")
    exact = Fraction(width)  # exact for floats too: 0.5 -> 1/2, 0.1 -> not k/8
    if exact <= 0:
        raise ValueError(f"{argument} is {width!r}: a byte width must be positive")
    if (exact * 8).denominator != 1:
        raise ValueError(f"{argument} is {width!r}: a byte width must be a whole number of bits (a multiple of 1/8)")
    return exact


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


def tensor_bytes(elements: int, width: Fraction | int) -> int:
    """M = N * w, rounded up to a whole byte for sub-byte widths."""
    if isinstance(width, int):
        return elements * width
    return -(-(elements * width.numerator) // width.denominator)


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
    states = optimizer_states(optimizer)

    parameters = sum(tensor_bytes(n, w_param) for n in params)
    gradients = sum(tensor_bytes(n, w_grad) for n in params)
    activations = sum(tensor_bytes(n, w_act) for n in acts)
    optimizer_state = states * sum(tensor_bytes(n, w_opt) for n in params)
    return {
        "parameters": parameters,
        "gradients": gradients,
        "activations": activations,
        "optimizer_state": optimizer_state,
        "total": parameters + gradients + activations + optimizer_state,
    }

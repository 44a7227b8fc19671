"""THE cost model: a declared tensor under the config's recipe -> bytes per category.

Nothing else in memfit turns elements and widths into bytes: the seed contract
(calculator.compute_footprint) and the checker both call `Recipe.cost`. A recipe says how a
tensor's storage, its gradient and its optimizer state are kept; a mixed-precision recipe
(master weights), quantized storage or another optimizer-state layout is another Recipe with
its own `cost`, and no caller changes.

Every count is a Python int, so dims of 10**12 and totals past 2**64 stay exact. Widths may
be fractional multiples of 1/8 byte (4-bit formats): a tensor's storage is then rounded up
to whole bytes, tensor by tensor, because packed formats pad each tensor, never share a byte
between two.
"""

from __future__ import annotations

import math
from fractions import Fraction
from numbers import Rational

from memfit.recipe.dtypes import DTYPES
from memfit.recipe.optim import STATE_COUNTS

CATEGORIES = ("parameters", "gradients", "activations", "optimizer_state")
PARAMETERS, GRADIENTS, ACTIVATIONS, OPTIMIZER_STATE = CATEGORIES

# Optimizer -> state tensors kept per parameter (the seed's elementwise optimizers): read from the
# one optimizer table, recipe/optim.py, which also holds the 8-bit and factored layouts.
OPTIMIZER_STATES: dict[str, int] = STATE_COUNTS


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


def tensor_bytes(elements: int, width: Fraction | int) -> int:
    """M = N * w, rounded up to a whole byte for sub-byte widths."""
    if isinstance(width, int):
        return elements * width
    return -(-(elements * width.numerator) // width.denominator)


def dtype_bytes(elements: int, dtype) -> int:
    """Bytes of `elements` elements of a dtype named in recipe/dtypes.py (or a byte width):
    the one place a dtype name becomes bytes (models name dtypes, this prices them)."""
    w = DTYPES[dtype][0] if isinstance(dtype, str) else dtype
    if isinstance(w, Fraction) and w.denominator == 1:
        w = w.numerator
    return tensor_bytes(elements, w)


def dtype_elements(nbytes: int, dtype) -> int:
    """Whole elements of a dtype (a name in recipe/dtypes.py, or a byte width) that `nbytes` bytes of
    storage hold: dtype_bytes' inverse (a flat run of a storage's dtype)."""
    w = Fraction(DTYPES[dtype][0] if isinstance(dtype, str) else dtype)
    return nbytes * w.denominator // w.numerator


class Width:
    """A storage width: its name as written and bytes per element (an int when whole, so the
    common case stays integer arithmetic). Plain classes here: they are built on every start."""

    __slots__ = ("bytes", "name")

    def __init__(self, name: str, bytes: int | Fraction) -> None:
        self.name = name
        self.bytes = bytes

    def __eq__(self, other) -> bool:
        return isinstance(other, Width) and (self.name, self.bytes) == (other.name, other.bytes)

    def __repr__(self) -> str:
        return f"Width({self.name!r}, {self.bytes!r})"


def element_bytes(width: Width, copies: int = 1) -> int | Fraction:
    """Bytes per element of `copies` tensors kept at `width`, exact (half a byte for a 4-bit width): what a
    hover shows per trainable parameter element."""
    return copies * width.bytes


def width(value) -> Width:
    """A dtype name or a byte width (schema-checked) -> Width."""
    if isinstance(value, str):
        return Width(value, DTYPES[value][0])
    exact = byte_width(value, "dtype")
    return Width(str(value), exact.numerator if exact.denominator == 1 else exact)


class Recipe:
    """How training keeps a tensor: one storage width per category and the optimizer's
    state tensors per trainable parameter. `own` (a tensor's own dtype) overrides only its
    storage: a parameter's gradient and optimizer state keep the gradients/optimizer_state
    widths, as a mixed-precision recipe sets them, not the weight's storage format.
    Another recipe subclasses this and overrides `cost`."""

    __slots__ = ("optimizer", "states", "widths")

    def __init__(self, optimizer: str, states: int, widths: dict) -> None:
        self.optimizer = optimizer
        self.states = states
        self.widths = widths  # category -> Width

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.optimizer!r}, {self.states}, {self.widths!r})"

    def cost(self, category: str, elements: int, count: int = 1, trainable: bool = True, own: Width | None = None, shape=None) -> dict:
        """Bytes of `count` copies of a tensor of `elements` elements, per category. `shape`
        matters to recipes whose optimizer state depends on it (Adafactor's factored statistics)."""
        widths = self.widths
        if category == PARAMETERS:
            sizes = {PARAMETERS: count * tensor_bytes(elements, (own or widths[PARAMETERS]).bytes)}
            if trainable:
                sizes[GRADIENTS] = count * tensor_bytes(elements, widths[GRADIENTS].bytes)
                sizes[OPTIMIZER_STATE] = count * self.states * tensor_bytes(elements, widths[OPTIMIZER_STATE].bytes)
            return sizes
        return {category: count * tensor_bytes(elements, (own or widths[category]).bytes)}


def totals(costs) -> dict:
    """Per-category sums of cost dicts, and their total."""
    out = dict.fromkeys(CATEGORIES, 0)
    for sizes in costs:
        for category, size in sizes.items():
            out[category] += size
    out["total"] = sum(out[c] for c in CATEGORIES)
    return out

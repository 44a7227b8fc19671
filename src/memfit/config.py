"""A schema-valid document -> tensors with widths, the optimizer, and the budget.

Structure is the schema's job and already checked; what is left here is meaning:
dtype names to widths, units to bytes, the optimizer's state count, repeated and
frozen tensors, and the budget arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

from .calculator import byte_width, optimizer_states, tensor_bytes
from .diagnostics import Problem
from .dtypes import DTYPES
from .units import UnitError, parse_bytes, parse_percent, parse_reserve

CATEGORIES = ("parameters", "gradients", "activations", "optimizer_state")
DEFAULT_DTYPE = "float32"
DEFAULT_WARN_AT = Fraction(9, 10)


@dataclass(slots=True)
class Width:
    name: str  # a dtype name, or the number as written
    bytes: int | Fraction


@dataclass(slots=True)
class Tensor:
    """One declared tensor (count copies of it); bytes per category, all copies included."""

    category: str  # "parameters" or "activations"
    path: tuple  # where it is declared, for positions
    name: str
    shape: list
    count: int
    elements: int  # of one copy
    dtype: Width
    trainable: bool
    bytes: dict  # category -> int


@dataclass(slots=True)
class Config:
    name: str | None
    optimizer: str
    states: int
    widths: dict  # category -> Width
    tensors: list = field(default_factory=list)
    memory: int | None = None
    reserve: int = 0
    warn_at: Fraction = DEFAULT_WARN_AT
    footprint: dict = field(default_factory=dict)
    layers: list = field(default_factory=list)  # per-layer rows when a model section is declared

    @property
    def budget(self) -> int | None:
        return None if self.memory is None else self.memory - self.reserve


def width(value) -> Width:
    if isinstance(value, str):
        return Width(value, DTYPES[value][0])
    exact = byte_width(value, "dtype")
    return Width(str(value), exact.numerator if exact.denominator == 1 else exact)



def build(data: dict) -> tuple[Config, list[Problem]]:
    """Tensors declared explicitly; layer-derived ones and the footprint are added by check."""
    problems: list[Problem] = []
    try:
        states = optimizer_states(data["optimizer"])
    except ValueError as error:
        problems.append(Problem(("optimizer",), "unknown-optimizer", str(error)))
        states = 0
    declared = data.get("dtypes", {})
    widths = {c: width(declared.get(c, DEFAULT_DTYPE)) for c in CATEGORIES}
    config = Config(data.get("name"), data["optimizer"], states, widths)

    device = data.get("device", {})
    if "memory" in device:
        try:
            config.memory = parse_bytes(device["memory"])
        except UnitError as error:
            problems.append(Problem(("device", "memory"), "bad-unit", f"device.memory: {error}"))
    if "reserve" in device:
        try:
            config.reserve = parse_reserve(device["reserve"], config.memory)
        except UnitError as error:
            problems.append(Problem(("device", "reserve"), "bad-unit", f"device.reserve: {error}"))
        if config.memory is not None and config.reserve > config.memory:
            problems.append(
                Problem(("device", "reserve"), "bad-unit", f"device.reserve ({config.reserve:,} B) is more than device.memory ({config.memory:,} B): the budget would be negative")
            )
    if "warn_at" in device:
        config.warn_at = parse_percent(device["warn_at"])

    for category in ("parameters", "activations"):
        for i, item in enumerate(data.get(category, ())):
            config.tensors.append(_tensor(category, (category, i), item, config))
    return config, problems


def _tensor(category: str, path: tuple, item, config: Config) -> Tensor:
    if isinstance(item, list):
        shape, name, count, trainable, dtype = item, None, 1, True, None
    else:
        shape = item["shape"]
        name = item.get("name")
        count = item.get("count", 1)
        trainable = item.get("trainable", True)
        dtype = item.get("dtype")
    return make_tensor(category, path, name, shape, count, trainable, width(dtype) if dtype is not None else None, config)


def make_tensor(category, path, name, shape, count, trainable, dtype: Width | None, config: Config) -> Tensor:
    """Bytes of a tensor under the config's widths; `dtype` overrides only its own storage:
    a parameter's gradient and optimizer state keep the gradients/optimizer_state dtypes,
    as a mixed-precision recipe sets them, not the weight's storage format."""
    elements = math.prod(shape)  # dims are schema-checked ints here
    if category == "parameters":
        own = dtype or config.widths["parameters"]
        sizes = {"parameters": count * tensor_bytes(elements, own.bytes)}
        if trainable:
            sizes["gradients"] = count * tensor_bytes(elements, config.widths["gradients"].bytes)
            sizes["optimizer_state"] = count * config.states * tensor_bytes(elements, config.widths["optimizer_state"].bytes)
    else:
        own = dtype or config.widths["activations"]
        sizes = {"activations": count * tensor_bytes(elements, own.bytes)}
    label = name if name is not None else f"{path[0]}[{path[1]}]" if len(path) == 2 else ".".join(map(str, path))
    return Tensor(category, path, label, shape, count, elements, own, trainable, sizes)


def footprint(config: Config) -> dict:
    totals = dict.fromkeys(CATEGORIES, 0)
    for tensor in config.tensors:
        for category, size in tensor.bytes.items():
            totals[category] += size
    totals["total"] = sum(totals[c] for c in CATEGORIES)
    return totals

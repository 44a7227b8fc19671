"""A schema-valid document -> the recipe, the declared tensors, and the budget.

Structure is the schema's job and already checked; what is left here is meaning:
dtype names to widths, units to bytes, the optimizer's state count, repeated and
frozen tensors, and the budget arithmetic. Bytes come from the cost model (costs.py).
"""

from __future__ import annotations

import math
from dataclasses import field
from fractions import Fraction

from memfit.diagnostics import codes
from memfit.diagnostics.records import record
from memfit.recipe.costs import CATEGORIES, OPTIMIZER_STATES, Recipe, Width, optimizer_states, width
from memfit.diagnostics.diagnostic import Problem
from memfit.diagnostics.units import UnitError, parse_bytes, parse_percent, parse_reserve, with_bytes

__all__ = ["CATEGORIES", "Config", "Emitted", "Tensor", "Width", "build", "make_tensor", "width"]

DEFAULT_DTYPE = "float32"
DEFAULT_WARN_AT = Fraction(9, 10)


@record(slots=True, compiled_init=True)
class Tensor:
    """One declared tensor (count copies of it); its cost per category, all copies included."""

    category: str  # "parameters" or "activations"
    path: tuple  # where it is declared, for positions
    name: str
    shape: list
    count: int
    elements: int  # of one copy
    dtype: Width
    trainable: bool
    bytes: dict  # category -> int, from costs.Recipe.cost; per-device figures: placement.Placement.of
    roles: dict | None = None  # role -> int where a recipe splits a category (a grad accum buffer, a master copy): what placement shards
    buffer: bool = False  # a module's registered buffer (rotary inv_freq): a parameter-like tensor no engine shards


@record(frozen=True, slots=True)
class Config:
    """A checked document's meaning. Built once per stage and never changed after: each stage of the pipeline
    (models, placement, the step's walk) returns a new Config with what it adds (`dataclasses.replace`)."""

    name: str | None
    recipe: Recipe
    tensors: tuple = ()  # declared tensors, then the model section's, then the optimizer's constants
    memory: int | None = None
    reserve: int = 0
    warn_at: Fraction = DEFAULT_WARN_AT
    placement: object = None  # placement.Placement, once the tensors are all known
    layers: tuple = ()  # per-layer rows when a Keras-form model section is declared
    parallel: object = None  # sharding.Parallel when a `parallel` section is declared
    host_memory: int | None = None  # host.memory, bytes per node
    model: object = None  # models.hf.Model when the model is a transformer (block rows, summary)
    preset: object = None  # presets.Preset named by device.preset
    memory_origin: str | None = None  # how device memory was given when not as device.memory: "preset A100-80GB"
    overhead: int = 0  # runtime overhead on the device (device.overhead), bytes
    overhead_lines: tuple = ()  # presets.Line for `overhead: auto`; () for a given size
    granule: int | None = None  # the allocator's rounding the peak applies (`overhead: auto` on a preset)
    peak: dict | None = None  # ledger.step.peak() of a run, when the config has a training section
    step: object = None  # ledger.step.Step of a run: every tensor of the step and when it lives

    @property
    def optimizer(self) -> str:
        return self.recipe.optimizer

    @property
    def states(self) -> int:
        return self.recipe.states

    @property
    def widths(self) -> dict:
        return self.recipe.widths

    @property
    def footprint(self) -> dict:
        """Bytes per category on the device that must fit (from the placement)."""
        return self.placement.footprint if self.placement is not None else {}

    @property
    def budget(self) -> int | None:
        return None if self.memory is None else self.memory - self.reserve


@record(slots=True)
class Emitted:
    """What a model section emits while it is read (models/): its tensors priced by the recipe, the Keras form's
    layer rows, the transformer's Model. The pipeline folds it into a new Config; models never see the Config."""

    recipe: Recipe
    tensors: list = field(default_factory=list)
    layers: list = field(default_factory=list)
    model: object = None

    @property
    def widths(self) -> dict:
        return self.recipe.widths


def build(data: dict) -> tuple[Config, list[Problem]]:
    """Tensors declared explicitly; the layout (`parallel`, `host`: check.pipeline.configure asks placement),
    model-derived tensors and the placement are added by check."""
    problems: list[Problem] = []
    recipe = None
    if _beyond_seed(data):
        from memfit.recipe import precision

        recipe, problems = precision.from_config(data)
    if recipe is None:
        try:
            states = optimizer_states(data["optimizer"])
        except ValueError as error:
            if not problems:
                problems.append(Problem(("optimizer",), codes.UNKNOWN_OPTIMIZER, str(error)))
            states = 0
        declared = data.get("dtypes", {})
        widths = {c: width(declared.get(c, DEFAULT_DTYPE)) for c in CATEGORIES}
        recipe = Recipe(data["optimizer"], states, widths)
    fields: dict = {}  # the Config's fields, each set once as the document is read
    problems.extend(_device(data.get("device", {}), fields))
    declared = Emitted(recipe)
    for category in ("parameters", "activations"):
        for i, item in enumerate(data.get(category, ())):
            declared.tensors.append(_tensor(category, (category, i), item, declared))
    return Config(data.get("name"), recipe, tensors=tuple(declared.tensors), **fields), problems


def _beyond_seed(data: dict) -> bool:
    """A precision recipe, master weights, a second gradient buffer or an optimizer outside
    the seed's table (8-bit, factored, or unknown: the recipe module names the closest) take
    the recipe cost model (precision.TrainingRecipe); every other config keeps the seed's."""
    if "precision" in data or "master_weights" in data or "grad_accum_dtype" in (data.get("training") or {}):
        return True
    optimizer = data.get("optimizer")
    return not (isinstance(optimizer, str) and optimizer.strip().lower() in OPTIMIZER_STATES)


def _device(device: dict, fields: dict) -> list[Problem]:
    problems = _preset(device, fields)
    if "memory" in device:
        try:
            fields["memory"] = parse_bytes(device["memory"])
        except UnitError as error:
            problems.append(Problem(("device", "memory"), codes.BAD_UNIT, f"device.memory: {error}"))
    if "reserve" in device:
        try:
            fields["reserve"] = parse_reserve(device["reserve"], fields.get("memory"))
        except UnitError as error:
            problems.append(Problem(("device", "reserve"), codes.BAD_UNIT, f"device.reserve: {error}"))
        if fields.get("memory") is not None and fields.get("reserve", 0) > fields.get("memory"):
            problems.append(
                Problem(("device", "reserve"), codes.BAD_BUDGET, f"device.reserve ({fields.get('reserve', 0):,} B) is more than device.memory ({fields.get('memory'):,} B): the budget would be negative")
            )
    if "warn_at" in device:
        try:
            fields["warn_at"] = parse_percent(device["warn_at"])
        except UnitError as error:
            problems.append(Problem(("device", "warn_at"), codes.BAD_UNIT, f"device.warn_at: {error}"))
    problems.extend(_overhead(device, fields))
    return problems


def _preset(device: dict, fields: dict) -> list[Problem]:
    """device.preset fills device.memory from the table; an explicit memory wins, and a note says so."""
    if "preset" not in device:
        return []
    from memfit.config import presets

    name = device["preset"]
    preset = presets.lookup(name)
    choices = presets.ambiguous(name) if preset is None else []
    if choices:
        from memfit.diagnostics.units import human

        listed = ", ".join(f"{c} ({human(presets.PRESETS[c].memory)})" for c in choices)
        return [Problem(("device", "preset"), codes.UNKNOWN_PRESET, f"device preset {name!r} is ambiguous: it names cards with different memory: {listed}; name one")]
    if preset is None:
        near = presets.closest(name)
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        return [Problem(("device", "preset"), codes.UNKNOWN_PRESET, f"unknown device preset {name!r}{hint} (known: {', '.join(presets.PRESETS)})")]
    fields["preset"] = preset
    if "memory" in device:
        return [
            Problem(
                ("device", "preset"),
                codes.PRESET_OVERRIDDEN,
                f"device.memory {device['memory']} wins over preset {preset.name} ({with_bytes(preset.memory)}, the memory its driver reports)",
            )
        ]
    fields["memory"] = preset.memory
    fields["memory_origin"] = f"preset {preset.name}"
    return []


def _overhead(device: dict, fields: dict) -> list[Problem]:
    """device.overhead: `auto` (the preset's named lines and the allocator's rounding), a byte size, or 0."""
    if "overhead" not in device:
        return []
    value = device["overhead"]
    if value == "auto":
        if fields.get("preset") is None:
            if "preset" in device:  # an unknown preset: already reported
                return []
            return [Problem(("device", "overhead"), codes.UNKNOWN_PRESET, "overhead: auto is the runtime overhead of a device.preset, and none is given: name one, or give the overhead as a byte size")]
        from memfit.config import presets

        fields["overhead_lines"] = tuple(presets.overhead_lines(fields.get("preset")))
        fields["overhead"] = sum(line.bytes for line in fields.get("overhead_lines", ()))
        fields["granule"] = presets.ALLOCATOR_GRANULE
    else:
        try:
            fields["overhead"] = parse_bytes(value)
        except UnitError as error:
            return [Problem(("device", "overhead"), codes.BAD_UNIT, f"device.overhead: {error}")]
    if fields.get("memory") is not None and fields.get("overhead", 0) + fields.get("reserve", 0) >= fields.get("memory"):
        return [
            Problem(
                ("device", "overhead"),
                codes.BAD_BUDGET,
                f"device.overhead ({with_bytes(fields.get('overhead', 0))}) is not less than device.memory ({with_bytes(fields.get('memory'))})"
                + (f" minus the reserve ({with_bytes(fields.get('reserve', 0))})" if fields.get('reserve', 0) else "")
                + ": nothing would fit",
            )
        ]
    return []


def _tensor(category: str, path: tuple, item, config: Emitted) -> Tensor:
    if isinstance(item, list):
        shape, name, count, trainable, dtype = item, None, 1, True, None
    else:
        shape = item["shape"]
        name = item.get("name")
        count = item.get("count", 1)
        trainable = item.get("trainable", True)
        dtype = item.get("dtype")
    return make_tensor(category, path, name, shape, count, trainable, width(dtype) if dtype is not None else None, config)


def make_tensor(category, path, name, shape, count, trainable, dtype: Width | None, config: Config | Emitted) -> Tensor:
    """A declared tensor and its cost under the config's recipe; `dtype` overrides only its own storage."""
    elements = math.prod(shape)  # dims are schema-checked ints here
    recipe = config.recipe
    roles = None
    if getattr(recipe, "shaped", False):  # its optimizer state depends on the shape (Adafactor)
        roles = recipe.role_cost(category, elements, count, trainable, dtype, shape=shape)
        from memfit.recipe.precision import fold_roles

        sizes = fold_roles(roles)
    else:
        sizes = recipe.cost(category, elements, count, trainable, dtype)
    label = name if name is not None else f"{path[0]}[{path[1]}]" if len(path) == 2 else ".".join(map(str, path))
    return Tensor(category, path, label, shape, count, elements, dtype or recipe.widths[category], trainable, sizes, roles)


def optimizer_constants(config: Config) -> list[Tensor]:
    """Tensors an optimizer keeps once, not per parameter (bitsandbytes' quantization maps),
    as optimizer_state tensors, so placement, explain and every reporter see them; call it
    once every parameter has been costed."""
    shared = getattr(config.recipe, "shared", None)
    if shared is None:
        return []
    out = []
    for item in shared():
        short = config.recipe.spec.framework.rsplit(".", 1)[-1]
        elements = math.prod(item.shape)
        out.append(Tensor("optimizer_state", ("optimizer",), f"{short}.{item.label}", list(item.shape), 1, elements, width(item.dtype), False, {"optimizer_state": item.bytes}))
    return out

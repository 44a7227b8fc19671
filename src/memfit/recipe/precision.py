"""Precision recipes: which dtype each memory category of a parameter is kept in.

A recipe (Lightning's names) sets the dtype of parameters, gradients, optimizer
state and activations; `master_weights` adds an fp32 copy of every trainable
parameter (under optimizer_state, where the ZeRO paper counts it) and
`grad_accum_dtype` a second gradient buffer (under gradients), as DeepSpeed's
fp16/bf16 optimizers keep them. A dtype given explicitly for a category wins.

Counts are exact ints; a parameter's bytes come from `parameter_tensors`, which
lists every tensor a training step keeps for it, so `explain` can say where each
byte comes from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from memfit.diagnostics.records import record
from memfit.recipe import optim, quant
from memfit.recipe.costs import tensor_bytes
from memfit.recipe.dtypes import DTYPES, RECIPES  # the precisions' table, in the bottom module the native readers read too

CATEGORIES = ("parameters", "gradients", "activations", "optimizer_state")
DEFAULT_PRECISION = "32-true"


class RecipeError(ValueError):
    """Bad recipe input; `field` names the config key, `suggestions` the closest known names."""

    def __init__(self, message: str, field: str, suggestions: list[str] | None = None):
        super().__init__(message)
        self.field = field
        self.suggestions = suggestions or []


@record(frozen=True, slots=True)
class Resolved:
    precision: str
    parameters: str
    gradients: str
    optimizer_state: str
    activations: str
    autocast: str | None
    master_weights: str | None
    grad_accum_dtype: str | None
    origin: dict = field(default_factory=dict)  # category -> where its dtype came from
    explicit: frozenset = frozenset()  # categories set by `dtypes`
    # No `precision` key: today's semantics, each category its own dtype (float32
    # unless `dtypes` says otherwise), so configs written before recipes keep their numbers.
    legacy: bool = False


@dataclass(frozen=True, slots=True)
class Item:
    """One tensor a parameter brings: its category, what it is, its shape, dtype and exact bytes."""

    category: str
    label: str
    shape: tuple
    dtype: str
    bytes: int
    origin: str = ""  # where the dtype comes from, for explain


def closest(name: str, vocabulary) -> list[str]:
    import difflib

    return difflib.get_close_matches(str(name).strip().lower(), list(vocabulary), n=3, cutoff=0.4)


def _dtype(name, field_name: str):
    """A dtype name, or a byte width (an int or Fraction, as a config may give one)."""
    if isinstance(name, (int, Fraction)) and not isinstance(name, bool) and name > 0:
        return name
    if not isinstance(name, str) or name not in DTYPES:
        raise RecipeError(f"{field_name} is {name!r}: unknown dtype", field_name, closest(str(name), DTYPES))
    return name


def resolve(precision: str | None = None, dtypes: dict | None = None, master_weights: str | None = None, grad_accum_dtype: str | None = None) -> Resolved:
    """Per-category dtypes of a recipe; explicit `dtypes` entries win category by category.

    The optimizer state follows the master copy when there is one: the optimizer
    steps the fp32 master weights (DeepSpeed, Apex O2, Megatron), so its moments
    are fp32 too.
    """
    name = DEFAULT_PRECISION if precision is None else precision
    if not isinstance(name, str) or name.strip().lower() not in RECIPES:
        raise RecipeError(f"precision is {name!r}: unknown recipe; known: {', '.join(RECIPES)}", "precision", closest(str(name), RECIPES))
    name = name.strip().lower()
    recipe = RECIPES[name]
    given = dict(dtypes or {})
    master = None if master_weights is None else _dtype(master_weights, "master_weights")
    accum = None if grad_accum_dtype is None else _dtype(grad_accum_dtype, "training.grad_accum_dtype")
    chosen, origin = {}, {}
    for category in CATEGORIES:
        if category in given:
            chosen[category] = given[category]
            origin[category] = f"dtypes.{category}"
        elif category == "optimizer_state" and master is not None:
            chosen[category] = master
            origin[category] = "master_weights"
        else:
            chosen[category] = getattr(recipe, category)
            origin[category] = f"precision {name}"
    return Resolved(name, chosen["parameters"], chosen["gradients"], chosen["optimizer_state"], chosen["activations"], recipe.autocast, master, accum, origin, frozenset(given), precision is None)


def _width(dtype):
    """A dtype name or an explicit byte width (int/Fraction, as `dtypes` may give one)."""
    return DTYPES[dtype][0] if isinstance(dtype, str) else dtype


def _bytes(elements: int, dtype) -> int:
    width = _width(dtype)
    if isinstance(width, Fraction) and width.denominator == 1:
        width = width.numerator
    return tensor_bytes(elements, width)


def _elements(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def parameter_tensors(resolved: Resolved, optimizer: str, shape: tuple, *, trainable: bool = True, param_dtype=None, **optimizer_args) -> list[Item]:
    """Every tensor one parameter brings to a training step, with exact bytes.

    `param_dtype` is the parameter's own storage when it differs from the recipe
    (an fp32 LoRA adapter on a bf16 model). PyTorch keeps a gradient in its
    parameter's dtype and torch.optim its state too (zeros_like), so both follow
    the parameter unless `dtypes` sets them or a master copy carries the state.
    Without a `precision` key (legacy), each category keeps its own dtype.
    """
    shape = tuple(shape)
    n = _elements(shape)
    own = resolved.parameters if param_dtype is None else param_dtype
    own_origin = resolved.origin.get("parameters", "") if param_dtype is None else "the tensor's own dtype"
    items = [Item("parameters", "weight", shape, str(own), _bytes(n, own), own_origin)]
    if not trainable:
        return items
    follows = not resolved.legacy
    grad_follows = follows and "gradients" not in resolved.explicit
    grad = own if grad_follows else resolved.gradients
    pinned = "optimizer_state" in resolved.explicit or resolved.master_weights is not None
    state = own if follows and not pinned else resolved.optimizer_state
    grad_origin = "like its parameter" if grad_follows else resolved.origin.get("gradients", "")
    items.append(Item("gradients", "grad", shape, str(grad), _bytes(n, grad), grad_origin))
    if resolved.grad_accum_dtype is not None:
        items.append(Item("gradients", "grad accum buffer", shape, resolved.grad_accum_dtype, _bytes(n, resolved.grad_accum_dtype), "grad_accum_dtype"))
    if resolved.master_weights is not None:
        items.append(Item("optimizer_state", "master weight", shape, resolved.master_weights, _bytes(n, resolved.master_weights), "master_weights"))
    spec = optim.lookup(optimizer)
    short = spec.framework.split("(")[0].rsplit(".", 1)[-1]
    if spec.layout == "blockwise8":
        state_origin = f"{short}, 8-bit blockwise"
    elif follows and not pinned:
        state_origin = f"{short}, like its parameter"
    elif resolved.master_weights is not None and "optimizer_state" not in resolved.explicit:
        state_origin = f"{short}, follows master_weights"
    else:
        state_origin = f"{short}, {resolved.origin.get('optimizer_state', '')}"
    for label, state_shape, dtype in optim.state_tensors(optimizer, shape, state, **optimizer_args):
        items.append(Item("optimizer_state", label, tuple(state_shape), str(dtype), _bytes(_elements(state_shape), dtype), state_origin))
    return items


def totals(items) -> dict[str, int]:
    out = dict.fromkeys(CATEGORIES, 0)
    for item in items:
        out[item.category] += item.bytes
    return out


def model_state_bytes(resolved: Resolved, optimizer: str, shapes, *, trainable: bool = True, **optimizer_args) -> dict[str, int]:
    """Parameters, gradients and optimizer state of a list of parameter shapes, with
    the optimizer's once-per-optimizer constants (bitsandbytes' quantization maps)."""
    out = dict.fromkeys(CATEGORIES, 0)
    states = []
    for shape in shapes:
        items = parameter_tensors(resolved, optimizer, shape, trainable=trainable, **optimizer_args)
        states.extend(i for i in items if i.category == "optimizer_state")
        for category, size in totals(items).items():
            out[category] += size
    for label, shape, dtype in optim.shared_tensors(optimizer, states):
        out["optimizer_state"] += _bytes(_elements(shape), dtype)
    out["total"] = sum(out[c] for c in CATEGORIES)
    return out


def bytes_per_parameter(resolved: Resolved, optimizer: str, *, shape=(4096, 4096)) -> dict[str, Fraction]:
    """The "16 B/param" view: bytes per trainable parameter element by category,
    for a matrix of `shape` (large enough that bitsandbytes quantizes its state in
    8 bits; Adafactor's factored statistics depend on the shape)."""
    items = parameter_tensors(resolved, optimizer, shape)
    n = _elements(shape)
    return {c: Fraction(size, n) for c, size in totals(items).items() if c != "activations"}


# Named setups for the bytes-per-parameter table (docs/recipes.md, explain):
# (label, resolve() keyword arguments).
SETUPS: list[tuple[str, dict]] = [
    ("32-true", {"precision": "32-true"}),
    ("bf16-true", {"precision": "bf16-true"}),
    ("16-true", {"precision": "16-true"}),
    ("bf16-mixed", {"precision": "bf16-mixed"}),
    ("16-mixed", {"precision": "16-mixed"}),
    ("bf16-true +M", {"precision": "bf16-true", "master_weights": "float32"}),
    ("16-true +M (ZeRO)", {"precision": "16-true", "master_weights": "float32"}),
    ("16-true +M +A (DeepSpeed)", {"precision": "16-true", "master_weights": "float32", "grad_accum_dtype": "float32"}),
    ("16-true +M +G32 (Megatron)", {"precision": "16-true", "master_weights": "float32", "dtypes": {"gradients": "float32"}}),
]


def _decimal(value: Fraction) -> str:
    """Exact decimal of a Fraction whose denominator is a power of two (every width here)."""
    whole, rest = divmod(value.numerator, value.denominator)
    if rest == 0:
        return str(whole)
    digits = ""
    while rest and len(digits) < 12:
        rest *= 10
        digit, rest = divmod(rest, value.denominator)
        digits += str(digit)
    return f"{whole}.{digits}"


def table(optimizers=None, shape=(4096, 4096)) -> str:
    """Markdown: total bytes per trainable parameter (weights + gradients + optimizer
    state) for every setup x optimizer, on a `shape` matrix."""
    names = list(optim.OPTIMIZERS) if optimizers is None else list(optimizers)
    head = "| optimizer | " + " | ".join(label for label, _ in SETUPS) + " |"
    lines = [head, "|" + "---|" * (len(SETUPS) + 1)]
    for name in names:
        cells = []
        for _, kwargs in SETUPS:
            per = bytes_per_parameter(resolve(**kwargs), name, shape=shape)
            cells.append(_decimal(sum(per.values(), Fraction(0))))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


@record(frozen=True, slots=True)
class ViewRow:
    category: str
    label: str
    dtype: str
    bytes: int
    per_parameter: Fraction  # bytes per parameter element (per trainable element for gradients/optimizer state)
    origin: str


def per_parameter_view(entries, shared=(), every: int | None = None) -> tuple[list[ViewRow], int, int]:
    """The "16 B/param" view of a config: its parameter tensors' items grouped by what
    they are, each as bytes per parameter element (gradients and optimizer state per
    trainable element). `entries`: (items, count, elements, trainable) per declared
    parameter; `shared`: once-per-optimizer items. Returns (rows, all, trainable elements)."""
    groups: dict = {}
    given, every, trainable_elements = every, 0, 0
    for items, count, elements, trainable in entries:
        every += count * elements
        trainable_elements += count * elements if trainable else 0
        for item in items:
            key = (item.category, item.label, item.dtype, item.origin)
            groups[key] = groups.get(key, 0) + count * item.bytes
    for item in shared:
        key = (item.category, item.label, item.dtype, item.origin)
        groups[key] = groups.get(key, 0) + item.bytes
    every = every if given is None else given
    rows = []
    for (category, label, dtype, origin), size in groups.items():
        base = every if category == "parameters" else trainable_elements
        rows.append(ViewRow(category, label, dtype, size, Fraction(size, base) if base else Fraction(0), origin))
    order = {c: i for i, c in enumerate(CATEGORIES)}
    rows.sort(key=lambda r: (order[r.category], -r.bytes))
    return rows, every, trainable_elements


def shared_items(optimizer: str, items) -> list[Item]:
    """Once-per-optimizer tensors (bitsandbytes' quantization maps) as Items."""
    return [Item("optimizer_state", label, shape, dtype, _bytes(_elements(shape), dtype), "one per optimizer") for label, shape, dtype in optim.shared_tensors(optimizer, items)]


def view_lines(rows, every: int, trainable: int, width: int = 80) -> list[str]:
    """Text of the per-parameter view: one line per kind of tensor, then a total."""
    head = f"bytes per parameter ({every:,}, {trainable:,} trainable; grads, state per trainable):"
    out = [head if len(head) <= width else f"bytes per parameter ({trainable:,} of {every:,} trainable):"]
    total = Fraction(0)
    for r in rows:
        total += r.per_parameter if r.category != "parameters" or trainable == every else Fraction(0)
        value = f"{float(r.per_parameter):.4f}".rstrip("0").rstrip(".")
        value = "~0" if value == "0" and r.per_parameter else value
        line = f"  {r.category:<16} {value:>7}  {r.dtype:<9} {r.label} ({r.origin})"
        out.append(line if len(line) <= width else line[: width - 1] + "…")
    if trainable == every:
        value = f"{float(total):.4f}".rstrip("0").rstrip(".")
        out.append(f"  {'total':<16} {value:>7}  per parameter")
    return out


def schema_properties() -> dict:
    """JSON-schema properties for the recipe keys, generated from RECIPES (schemagen merges them)."""
    names = ", ".join(f"{name}: {recipe.summary}" for name, recipe in RECIPES.items())
    return {
        "precision": {
            "title": "Precision recipe",
            "description": f"Lightning's precision names; sets the dtypes of parameters, gradients, optimizer state and activations (explicit dtypes win per category). {names}.",
            "type": "string",
            "examples": list(RECIPES),
        },
        "master_weights": {
            "$ref": "#/$defs/dtype",
            "title": "Master weights",
            "description": "Keep a copy of every trainable parameter in this dtype (float32), counted under optimizer_state; the optimizer steps it, so its state takes this dtype too.",
        },
    }


def schema_training_properties() -> dict:
    return {
        "grad_accum_dtype": {
            "$ref": "#/$defs/dtype",
            "title": "Gradient accumulation dtype",
            "description": "A second gradient buffer per trainable parameter in this dtype, counted under gradients (DeepSpeed's data_types.grad_accum_dtype).",
        }
    }


# --- the config seam: `precision`, `master_weights`, `training.grad_accum_dtype`, `optimizer` ---

from memfit.recipe.costs import Recipe, Width  # noqa: E402  (costs imports nothing from here)


def _as_dtype(value):
    """A config dtype (a name or a byte width) as parameter_tensors takes it."""
    if isinstance(value, str):
        return value
    from memfit.recipe.costs import byte_width

    exact = byte_width(value, "dtype")
    return exact.numerator if exact.denominator == 1 else exact


def _as_width(value) -> Width:
    return Width(value, DTYPES[value][0]) if isinstance(value, str) else Width(str(value), value)


# A parameter's tensors by role: the 16-bit gradient and the fp32 accumulation buffer are both
# gradients, the master copy and the moments both optimizer state, but ZeRO and FSDP shard, keep
# and offload each on its own (placement/sharding.py SHARD_CLASS)
ROLE_OF_LABEL = {"weight": "parameters", "grad": "gradients", "grad accum buffer": "grad_accum", "master weight": "master"}
ROLE_CATEGORY = {"parameters": "parameters", "gradients": "gradients", "grad_accum": "gradients", "master": "optimizer_state",
                 "optimizer_state": "optimizer_state", "activations": "activations"}


def fold_roles(roles: dict) -> dict:
    """Bytes per role -> bytes per footprint category."""
    out: dict = {}
    for role, size in roles.items():
        category = ROLE_CATEGORY[role]
        out[category] = out.get(category, 0) + size
    return out


class TrainingRecipe(Recipe):
    """The cost model under a precision recipe: every parameter's tensors from
    parameter_tensors (master copy, gradient buffers, the optimizer's own layout)."""

    __slots__ = ("resolved", "spec", "any_8bit", "_seen")
    shaped = True  # cost() takes the tensor's shape

    def __init__(self, optimizer: str, resolved: Resolved) -> None:
        spec = optim.lookup(optimizer)
        widths = {c: _as_width(getattr(resolved, c)) for c in CATEGORIES}
        super().__init__(spec.name, len(spec.states), widths)
        self.resolved = resolved
        self.spec = spec
        self.any_8bit = False
        # (shape, trainable, own dtype) -> parameter_tensors' items, and (that, count) -> role_cost's sizes:
        # a config repeats a few shapes many times (a transformer's layers, a 5,000-tensor file's 97 shapes),
        # and parameter_tensors is a function of those and of this recipe's (fixed) resolution and optimizer
        self._seen: dict = {}

    def cost(self, category, elements, count=1, trainable=True, own=None, shape=None) -> dict:
        return fold_roles(self.role_cost(category, elements, count, trainable, own, shape))

    def role_cost(self, category, elements, count=1, trainable=True, own=None, shape=None) -> dict:
        """Bytes per role (ROLES: the placement shards and offloads each on its own); `cost`
        folds them into the footprint's categories."""
        if category != "parameters":
            return {category: count * tensor_bytes(elements, (own or self.widths[category]).bytes)}
        param_dtype = None if own is None else (own.name if own.name in DTYPES else own.bytes)
        key = (tuple(shape) if shape is not None else (elements,), trainable, param_dtype)
        seen = self._seen.get((key, count))
        if seen is not None:
            return dict(seen)
        sizes: dict = {}
        for item in self._items(key):
            role = ROLE_OF_LABEL.get(item.label, item.category)
            sizes[role] = sizes.get(role, 0) + count * item.bytes
            if item.dtype == "uint8" and item.category == "optimizer_state":
                self.any_8bit = True
        self._seen[(key, count)] = sizes
        return dict(sizes)

    def items(self, shape, trainable=True, own=None) -> list[Item]:
        param_dtype = None if own is None else (own.name if own.name in DTYPES else own.bytes)
        return list(self._items((tuple(shape), trainable, param_dtype)))

    def _items(self, key: tuple) -> list[Item]:
        """parameter_tensors for (shape, trainable, param_dtype), each key computed once per recipe."""
        items = self._seen.get(key)
        if items is None:
            shape, trainable, param_dtype = key
            items = self._seen[key] = parameter_tensors(self.resolved, self.optimizer, shape, trainable=trainable, param_dtype=param_dtype)
        return items

    def shared(self) -> list[Item]:
        """Once-per-optimizer tensors, given what cost() has seen (bitsandbytes' maps);
        config.optimizer_constants makes them config tensors."""
        if not self.any_8bit:
            return []
        marker = [Item("optimizer_state", "", (), "uint8", 0)]
        return shared_items(self.optimizer, marker)


# DeepSpeed's ZeRO engine runs a `*-mixed` request (Lightning's DeepSpeedStrategy, the Trainer's
# bf16=True / fp16=True with a DeepSpeed config) as its own 16-bit mode: the model is cast to the
# 16-bit dtype (deepspeed/runtime/engine.py `_configure_distributed_model`: module.bfloat16()/half()),
# the optimizer keeps an fp32 master partition and an fp32 gradient partition
# (runtime/zero/stage_1_and_2.py `single_partition_of_fp32_groups`, stage3.py `fp32_partitioned_groups_flat`,
# `grad_partitions_flat_buffer`) and fp32 Adam states. There is no autocast: activations are 16-bit.
ZERO_MIXED = {"bf16-mixed": "bf16-true", "16-mixed": "16-true"}


def engine_precision(data: dict) -> str | None:
    """The recipe a config's precision means on its engine: under `parallel.zero` >= 1 a `*-mixed`
    precision is DeepSpeed's 16-bit mode (ZERO_MIXED); else the precision as written. None when no
    known precision is given."""
    precision = data.get("precision")
    if not isinstance(precision, str) or precision.strip().lower() not in RECIPES:
        return None
    precision = precision.strip().lower()
    parallel = data.get("parallel")
    zero = parallel.get("zero") if isinstance(parallel, dict) else None
    if isinstance(zero, int) and not isinstance(zero, bool) and zero >= 1 and precision in ZERO_MIXED:
        return ZERO_MIXED[precision]
    return precision


def wants_training_recipe(data: dict) -> bool:
    """Whether a config uses anything beyond the seed contract's recipe (which stays
    byte-for-byte today's for configs without these keys)."""
    if "precision" in data or "master_weights" in data:
        return True
    training = data.get("training")
    if isinstance(training, dict) and "grad_accum_dtype" in training:
        return True
    optimizer = data.get("optimizer")
    try:
        return optim.lookup(optimizer).layout != "elementwise"
    except ValueError:
        return False


def from_config(data: dict):
    """(TrainingRecipe or None, problems) for a schema-valid config. Problems are
    diagnostics.Problem with stable codes, positioned at the key they are about."""
    from memfit.diagnostics import codes
    from memfit.diagnostics.diagnostic import Problem

    problems = []
    try:
        spec = optim.lookup(data["optimizer"])
    except ValueError:
        near = closest(str(data["optimizer"]), optim.OPTIMIZERS)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        seed = sorted(n for n, o in optim.OPTIMIZERS.items() if n in optim.STATE_COUNTS)
        known = ", ".join(seed + sorted(set(optim.OPTIMIZERS) - set(seed)))
        problems.append(Problem(("optimizer",), codes.UNKNOWN_OPTIMIZER, f"optimizer is {data['optimizer']!r}: unknown optimizer{hint} (known: {known})"))
        spec = None
    dtypes = {c: _as_dtype(v) for c, v in (data.get("dtypes") or {}).items()}
    training = data.get("training") or {}
    master = data.get("master_weights")
    accum = training.get("grad_accum_dtype")
    precision = data.get("precision")
    on_engine = engine_precision(data)
    if on_engine is not None and on_engine != precision.strip().lower():
        # DeepSpeed's 16-bit mode: 16-bit weights and gradients, fp32 master and gradient partitions
        precision = on_engine
        master = "float32" if master is None else master
        accum = "float32" if accum is None else accum
    try:
        resolved = resolve(precision, dtypes, None, None)
    except RecipeError as error:
        hint = f"; did you mean {error.suggestions[0]!r}?" if error.suggestions else ""
        problems.append(Problem(("precision",), codes.UNKNOWN_PRECISION, f"precision is {data.get('precision')!r}: unknown recipe{hint} (known: {', '.join(RECIPES)})"))
        return None, problems
    if spec is None:
        return None, problems
    if master is not None:
        master = _as_dtype(master)
        if _width(master) <= _width(resolved.parameters):
            problems.append(
                Problem(
                    ("master_weights",),
                    codes.MASTER_WEIGHTS_NOOP,
                    f"master_weights {master} with {resolved.parameters} parameters (precision {resolved.precision}): a master copy is only kept for weights narrower than it, so this changes nothing and is not counted",
                )
            )
            master = None
    resolved = resolve(precision, dtypes, master, None if accum is None else _as_dtype(accum))
    return TrainingRecipe(spec.name, resolved), problems


def explain_lines(config, width: int = 80) -> list[str]:
    """`memfit explain`'s bytes-per-parameter view of a built config (either cost model)."""
    view = explain_view(config)
    return view_lines(*view, width) if view is not None else []


def explain_view(config):
    """(rows, every, trainable) of the bytes-per-parameter view (per_parameter_view), or None
    when the config has no parameters to view (the HTML report's table reads the rows)."""
    recipe = config.recipe
    if not isinstance(recipe, TrainingRecipe):
        dtypes = {c: (w.name if w.name in DTYPES else w.bytes) for c, w in recipe.widths.items()}
        try:
            recipe = TrainingRecipe(recipe.optimizer, resolve(None, dtypes))
        except ValueError:
            return None
    entries, shared = [], []
    for t in config.tensors:
        if t.category == "parameters" and not t.buffer:  # (a module's buffers are not parameters: the view counts these)
            own = None if t.dtype == recipe.widths["parameters"] else t.dtype
            items = recipe.items(t.shape, t.trainable, own)
            kind = _kind(t.name, t.dtype.name, t.trainable)
            if kind is not None:
                items = [Item(i.category, kind[0] if i.label == "weight" else i.label, i.shape, i.dtype, i.bytes, kind[1] if i.label == "weight" else i.origin) for i in items]
            entries.append((items, t.count, t.elements, t.trainable))
        elif t.category == "optimizer_state":
            shared.append(Item("optimizer_state", t.name.rsplit(".", 1)[-1], tuple(t.shape), t.dtype.name, t.bytes["optimizer_state"], "one per optimizer"))
    if not entries:
        return None
    model = getattr(config, "model", None)
    logical = None
    if model is not None and any(_kind(t.name, t.dtype.name, t.trainable) for t in config.tensors if t.category == "parameters"):
        # quantized storage is not one element per parameter: count the model's, plus what peft adds
        added = sum(t.count * t.elements for t in config.tensors if t.category == "parameters" and (_kind(t.name, t.dtype.name, t.trainable) or ("",))[0] in ("LoRA adapter", "modules_to_save copy"))
        logical = sum(row.count * row.params for row in model.blocks) + added
    return per_parameter_view(entries, shared, logical)


def _kind(name: str, dtype: str, trainable: bool):
    """(label, origin) for the tensors lora and quantization make, by their framework names."""
    if ".quant_state." in name:
        return f"quant_state.{name.split('.quant_state.', 1)[1]}", "bitsandbytes"
    if name.endswith(".weight.SCB"):
        return "int8 row scales (SCB)", "bitsandbytes"
    if not trainable and dtype in (quant.PACKED_4BIT, "int8") and name.endswith(".weight"):
        return ("4-bit weight, packed" if dtype == quant.PACKED_4BIT else "int8 weight"), "quantization"
    if ".lora_A." in name or ".lora_B." in name:
        return "LoRA adapter", "peft"
    if ".modules_to_save." in name:
        return "modules_to_save copy", "peft"
    return None

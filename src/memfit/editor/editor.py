"""What an editor shows for one analysed text: hover text, inlay hints, the summary lens and
completion vocabularies. No LSP types here (lsp.py translates); positions are the core's,
0-based lines and code-point columns of the analysed text. Every number shown is taken
from check()'s Result (its placement's per-device bytes, result.budget): nothing is computed
a second time here.
"""

from __future__ import annotations

import gc
import re
from bisect import bisect_left
from dataclasses import dataclass
from functools import cached_property, wraps

from memfit.read import source
from memfit.check.pipeline import Result
from memfit.recipe.costs import byte_width, element_bytes
from memfit.diagnostics.diagnostic import Range
from memfit.recipe.dtypes import DTYPES, describe
from memfit.recipe.optim import OPTIMIZERS  # the one optimizer table
from memfit.ledger.step import PHASES, PHASE_WORDS, live_text
from memfit.ledger.step import summary as peak_summary
from memfit.whatif.fit import VARY, fit, location
from memfit.whatif.fixes import fixes
from memfit.report.present import pct as _pct
from memfit.report.present import shape_text as _shape
from memfit.diagnostics.units import UNITS, human, with_bytes

# LSP counts lines on these breaks only (libyaml also breaks on NEL/LS/PS; rare in configs)
_LINE_BREAK = re.compile(r"\r\n|\r|\n")

TENSOR_CATEGORIES = ("parameters", "activations")
STALE = " (last valid version)"  # said of a summary taken from the last analysis that had a footprint
_ROLE = {  # a tensor's byte categories, in the order they are shown, and what to call them
    "parameters": "parameter",
    "gradients": "gradient",
    "optimizer_state": "optimizer state",
    "activations": "activation",
}


def split_lines(text: str) -> list[str]:
    return _LINE_BREAK.split(text)


def _collector_paused(build):
    """`build` with Python's cyclic garbage collector held off: the editor's whole-document indexes are
    tens of thousands of acyclic tuples and lists (a 5,000-tensor config: 32,000 paths and as many spans),
    whose allocations set off a young collection every 700 and, every tenth of those, a full one that walked
    every live object (20-70 ms on the shared machine, inside the first inlay hint's answer). One young
    collection after it sees them once (and untracks the tuples of strings and numbers)."""

    @wraps(build)
    def paused(*args):
        enabled = gc.isenabled()
        gc.disable()
        try:
            return build(*args)
        finally:
            if enabled:
                gc.enable()

    return paused


@dataclass(frozen=True)
class Hint:
    line: int
    character: int
    label: str
    tooltip: str | None = None


@dataclass(frozen=True)
class Hover:
    range: Range
    markdown: str


class Analysis:
    """check()'s result for one version of a document, plus lazily built editor indexes
    (built at most once per analysis, i.e. per document version, and only if asked for)."""

    def __init__(self, text: str, result: Result, version: int | None = None) -> None:
        self.text = text
        self.result = result
        self.version = version

    @property
    def config(self):
        return self.result.config

    @cached_property
    def lines(self) -> list[str]:
        return split_lines(self.text)

    @cached_property
    @_collector_paused
    def index(self) -> tuple[dict, dict]:
        """Every node's value span and mapping key's span (source.spans: (start_line, start_character,
        end_line, end_character) tuples; `Range(*span)` where a Range is handed out)."""
        return source.spans(self.text)

    @cached_property
    @_collector_paused
    def _by_line(self) -> tuple[dict, list]:
        """Nodes by the line they sit on; multi-line nodes (block containers) apart."""
        single: dict[int, list] = {}
        multi: list = []
        values, keys = self.index
        for kind, table in (("value", values), ("key", keys)):
            for path, where in table.items():
                entry = (path, kind, where)
                if where[0] == where[2]:
                    single.setdefault(where[0], []).append(entry)
                else:
                    multi.append(entry)
        return single, multi

    @cached_property
    @_collector_paused
    def tensors(self) -> dict[tuple, list]:
        rows: dict[tuple, list] = {}
        for tensor in self.config.tensors if self.config is not None else ():
            rows.setdefault(tuple(tensor.path), []).append(tensor)
        return rows

    @cached_property
    def layers(self) -> dict[tuple, object]:
        return {tuple(row.path): row for row in getattr(self.config, "layers", None) or () if getattr(row, "path", None) is not None}

    @cached_property
    def native_paths(self) -> dict:
        """A native config's key paths -> the memfit key each one sets (the first, where several)."""
        out: dict = {}
        for memfit_path, at in (self.result.origins or {}).items():
            if at.file is None:
                out.setdefault(at.path, memfit_path)
        return out

    def written(self, path: tuple) -> tuple:
        """Where a memfit key is written in this file: itself, or in a native config the native
        key it came from (the `memfit` marker: the native file's main key)."""
        origins = getattr(self.result, "origins", None)
        if origins is None:
            return path
        at = origins.get(path)
        return at.path if at is not None and at.file is None else ("\0",)  # nothing written for it here

    def node_at(self, line: int, character: int):
        """The deepest node under the cursor: (path, 'key'|'value', range), or None."""
        single, multi = self._by_line
        best = None
        for entry in single.get(line, []) + multi:
            path, kind, where = entry
            if (where[0], where[1]) <= (line, character) <= (where[2], where[3]):  # Range.contains
                rank = (len(path), kind == "value")
                if best is None or rank > best[0]:
                    best = (rank, entry)
        return (best[1][0], best[1][1], Range(*best[1][2])) if best else None

    @cached_property
    def fixes(self) -> list:
        """The fixes for this version when it is over (or near) its budget, cheapest first."""
        return fixes(self.result, self.text) if self.config is not None else []

    @cached_property
    def fit(self):
        """The largest micro_batch that fits, for the hover on it (None without a batch axis)."""
        if self.config is None or self.result.data is None or location(self.result.data, "micro_batch") is None:
            return None
        return fit(self.result, self.text)

    def data_at(self, path: tuple):
        node = self.result.data
        for part in path:
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                return None
        return node

    # --- hover -----------------------------------------------------------------------

    def hover(self, line: int, character: int) -> Hover | None:
        if self.result.data is None:
            return None
        found = self.node_at(line, character)
        if found is None:
            return None
        path, kind, where = found
        if getattr(self.result, "origins", None) is not None:  # a native config: the memfit key its node means
            path = self.native_paths.get(path, path)
        text, subject = self._hover_text(path, kind)
        if not text:
            return None
        # the range of what the hover is about (a whole tensor item, a layer), not of the token
        span = self.index[0].get(subject) if subject != path else None
        return Hover(Range(*span) if span is not None else where, text)

    def _hover_text(self, path: tuple, kind: str) -> tuple[str | None, tuple]:
        head = path[:1]
        if kind == "value" and (path[-1:] == ("dtype",) or (head == ("dtypes",) and len(path) == 2)):
            return dtype_text(self.data_at(path)), path
        if head and head[0] in TENSOR_CATEGORIES:
            if len(path) == 1:
                return self._category_text(path[0]), path
            rows = self.tensors.get(path[:2])
            return (tensor_text(rows[0], self.config) if rows else None), path[:2]
        if head == ("optimizer",):
            return optimizer_text(self.data_at(path), self.config), path
        if head == ("device",) or head == ("memfit",):
            return self.budget_text(), path
        if path in _BATCH_AXES and self.fit is not None:
            text = micro_batch_text(self.fit)
            if head == ("training",) and self.config is not None and self.config.model is not None:
                text = "\n\n".join(t for t in (training_text(path[1], self.config.model), text) if t)
            return text, path
        if head == ("model",) and self.config is not None and self.config.model is not None:
            return model_text(self.config.model, self.config), path[:2]
        if head == ("training",) and len(path) == 2 and self.config is not None and self.config.model is not None:
            return training_text(path[1], self.config.model), path
        if path[:2] == ("model", "layers") and len(path) >= 3:
            row = self.layers.get(path[:3])
            return (layer_text(row, self.tensors.get(path[:3], []), self.config.placement) if row is not None else None), path[:3]
        return None, path

    def _category_text(self, category: str) -> str | None:
        if self.config is None:
            return None
        fp = self.config.footprint
        rows = [t for t in self.config.tensors if t.category == category]
        parts = ("parameters", "gradients", "optimizer_state") if category == "parameters" else ("activations",)
        lines = [f"**{category}**: {len(rows):,} tensor{'s' if len(rows) != 1 else ''}"]
        lines += [f"- {_ROLE[p]}s: {with_bytes(fp[p])}" for p in parts]
        if len(parts) > 1:
            lines.append(f"- together: {with_bytes(sum(fp[p] for p in parts))}")
        return "\n".join(lines)

    def budget_text(self) -> str | None:
        config = self.config
        if config is None:
            return None
        fp = config.footprint
        total = fp["total"]
        budget = self.result.budget
        lines = []
        if budget is None:
            lines.append("**budget**: none (set device.memory, e.g. '24 GiB')")
        else:
            lines.append(f"**budget**: {with_bytes(budget)} ({self.result.budget_origin})")
        lines.append(f"**total**: {with_bytes(total)}" + (f", {_pct(total, budget)} of the budget" if budget else ""))
        used = total
        if config.peak is not None:  # a run: the budget gate compares the peak
            used = config.peak["bytes"]
            lines.append(f"**{peak_summary(config.peak)}**" + (f", {_pct(used, budget)} of the budget" if budget else ""))
        if budget is not None:
            if used > budget:
                lines.append(f"**over** by {with_bytes(used - budget)}")
            else:
                lines.append(f"**headroom**: {with_bytes(budget - used)}")
        lines.append("")
        lines += [f"- {category}: {with_bytes(fp[category])}" for category in ("parameters", "gradients", "optimizer_state", "activations")]
        if config.peak is not None:
            lines += ["", *_peak_hover(config.peak, budget)]
        return "\n".join(lines)

    # --- inlay hints and the summary ------------------------------------------------

    def hints(self, first_line: int, last_line: int, stale: bool = False) -> list[Hint]:
        """Hints whose position lies on lines first_line..last_line (inclusive); `stale` when
        this analysis is the last good one, not the current text's."""
        if self.config is None:
            return []
        values, keys = self.index
        out: list[Hint] = []
        summary = self.summary()
        if summary and stale:
            summary += STALE
        marker = self.written(("memfit",))  # a native config: its main key (base_model, ...)
        memfit_key = keys.get(marker)
        if summary and memfit_key is not None:
            at = values.get(marker, memfit_key)
            if first_line <= at[2] <= last_line:
                out.append(Hint(at[2], at[3], summary))
        spots = self._tensor_spots
        for line, character, path in spots[bisect_left(spots, (first_line,)) : bisect_left(spots, (last_line + 1,))]:
            tensor = self.tensors[path][0]
            sizes = self.config.placement.of(tensor)
            out.append(Hint(line, character, tensor_hint(tensor, sizes), tensor_breakdown(sizes)))
        model = self.config.model
        if model is not None:
            for key in model.training:
                where = values.get(self.written(("training", key)))
                if where is None or not first_line <= where[2] <= last_line:
                    continue
                out.append(Hint(where[2], where[3], training_hint(key, model)))
        for path, row in self.layers.items():
            where = values.get(path)
            if where is None or not first_line <= where[2] <= last_line:
                continue
            out.append(Hint(where[2], where[3], layer_hint(row)))
        out.sort(key=lambda h: (h.line, h.character))
        return out

    @cached_property
    @_collector_paused
    def _tensor_spots(self) -> list[tuple[int, int, tuple]]:
        """Where each declared tensor's hint goes (the end of its shape, else of its item), sorted: a
        viewport's hints are a slice of it, not a pass over every tensor of the document."""
        values = self.index[0]
        spots = []
        for path in self.tensors:
            if path[:1] not in (("parameters",), ("activations",)) or len(path) != 2:
                continue  # layer-derived rows are hinted on their layer
            where = values.get(path + ("shape",)) or values.get(path)
            if where is not None:
                spots.append((where[2], where[3], path))
        spots.sort(key=lambda spot: spot[:2])
        return spots

    def summary(self) -> str | None:
        """One line: the total (a run's peak) and its share of the budget (a lens or hint on `memfit:`)."""
        if self.config is None:
            return None
        total = self.config.footprint["total"]
        budget = self.result.budget
        peak = self.config.peak
        what = f"total {human(total)}" if peak is None else f"total {human(total)}, peak {human(peak['bytes'])} in {peak['phase'].replace('_', ' ')}"
        used = total if peak is None else peak["bytes"]
        if budget is None:
            return f"memfit: {what}, no budget set"
        state = f"over by {human(used - budget)}" if used > budget else f"headroom {human(budget - used)}"
        return f"memfit: {what} = {_pct(used, budget)} of {human(budget)}, {state}"

    def summary_range(self) -> Range | None:
        span = self.index[1].get(self.written(("memfit",)))
        return None if span is None else Range(*span)


# --- hover texts (tables of data -> words) -----------------------------------------------


def _peak_hover(result: dict, budget) -> list[str]:
    """The phases as the hover shows them: a line each, the peak in bold."""
    out = ["phases of one training step (each at its worst moment):"]
    for phase in PHASES:
        size = with_bytes(result["phases"][phase]["bytes"])
        out.append(f"- **{PHASE_WORDS[phase]}: {size}** (the peak)" if phase == result["phase"] else f"- {PHASE_WORDS[phase]}: {size}")
    out.append(f"- at the peak: {live_text(result['live'])}")
    return out


def model_text(model, config) -> str:
    """Hover on the model section of a transformer: what memfit derived from its config."""
    fp = config.footprint
    head, _, rest = model.summary.partition("; ")
    lines = [f"**{head}**" + (f"  \n{rest}" if rest else "")]
    if model.file is not None:
        lines.append(f"from `{model.file}`")
    lines.append("")
    lines += [f"- {_ROLE[p]}s: {with_bytes(fp[p])}" for p in ("parameters", "gradients", "optimizer_state")]
    lines.append(f"- activations kept for backward: {with_bytes(model.activations)}")
    lines.append("")
    lines.append("| block | count | params (each) | saved (each) |")
    lines.append("| --- | ---: | ---: | ---: |")
    lines += [f"| {r.name} | {r.count:,} | {r.params:,} | {human(r.saved_bytes)} |" for r in model.blocks]
    return "\n".join(lines)


def training_hint(key: str, model) -> str:
    """What a training key costs: the activations figure, and what the alternatives would give."""
    now = model.training[key]
    if key in ("attention", "checkpointing"):
        from memfit.models.hf import ATTENTIONS, CHECKPOINTING

        options = ATTENTIONS if key == "attention" else CHECKPOINTING
        parts = [f"{option} {human(model.activations if option == now else model.activations_with(**{key: option}))}" for option in options]
        return "activations: " + " · ".join(parts)
    more = now + 1 if key == "micro_batch" else now * 2
    return f"activations {human(model.activations)}; at {more:,}: {human(model.activations_with(**{key: more}))}"


def training_text(key: str, model) -> str:
    meaning = {
        "micro_batch": "sequences per device per step: the batch axis of every activation",
        "seq_len": "tokens per sequence",
        "attention": "the attention kernel: what it keeps for backward",
        "checkpointing": "full: each layer keeps only its input and is recomputed in the backward",
    }[key]
    return f"**training.{key}** = {model.training[key]}: {meaning}  \n{training_hint(key, model)}"


def _batch_axes() -> tuple:
    return VARY["micro_batch"]


_BATCH_AXES = _batch_axes()


def micro_batch_text(found) -> str | None:
    """Hover on the batch axis: the largest micro_batch that fits (fit's answer, not recomputed)."""
    if found.max is None:
        return None
    budget = with_bytes(found.budget)
    if found.max == 0:
        return f"**micro_batch**: even 1 does not fit: it needs {with_bytes(found.bytes_at_next)} of the budget {budget}"
    lines = [f"**micro_batch**: the largest that fits is **{found.max:,}** (now {found.current:,})", ""]
    lines.append(f"- at {found.max:,}: {with_bytes(found.bytes_at_max)} of the budget {budget}")
    if found.bytes_at_next is not None:
        lines.append(f"- at {found.max + 1:,}: {with_bytes(found.bytes_at_next)}")
    return "\n".join(lines)


def _width_text(width) -> str:
    return f"{width.name}, {describe(width.bytes)}"


def tensor_text(tensor, config) -> str:
    role = "parameter" if tensor.category == "parameters" else "activation"
    copies = f" × {tensor.count:,} copies" if tensor.count != 1 else ""
    each = " each" if tensor.count != 1 else ""
    lines = [f"**{tensor.name}**: {role} {_shape(tensor.shape)}{copies}", f"{tensor.elements:,} elements{each}", ""]
    widths = {
        "parameters": tensor.dtype,
        "activations": tensor.dtype,
        "gradients": config.widths["gradients"],
        "optimizer_state": config.widths["optimizer_state"],
    }
    sizes = config.placement.of(tensor)
    for category, size in sizes.items():
        extra = f"{config.optimizer}: {config.states} × " if category == "optimizer_state" else ""
        lines.append(f"- {_ROLE[category]} ({extra}{_width_text(widths[category])}): {with_bytes(size)}")
    if tensor.category == "parameters" and not tensor.trainable:
        lines.append("- frozen (trainable: false): no gradient, no optimizer state")
    if len(sizes) > 1:
        lines.append(f"- together: {with_bytes(sum(sizes.values()))}")
    return "\n".join(lines)


def tensor_hint(tensor, sizes: dict) -> str:
    """`sizes`: the bytes per category the tensor puts on the device shown (Placement.of)."""
    own = sizes.get(tensor.category, 0)
    together = sum(sizes.values())
    copies = f"× {tensor.count:,} = " if tensor.count != 1 else ""  # the bytes are of all copies
    if tensor.category == "parameters" and not tensor.trainable:
        return f"{copies}{human(own)} (frozen)"
    if together != own:
        return f"{copies}{human(own)} ({human(together)} in training)"
    return copies + human(own)


def tensor_breakdown(sizes: dict) -> str:
    return ", ".join(f"{_ROLE[c]} {with_bytes(n)}" for c, n in sizes.items())


def dtype_text(value) -> str | None:
    if isinstance(value, str):
        if value not in DTYPES:
            return None
        width, what = DTYPES[value]
        return f"**{value}**: {describe(width)} ({what})"
    try:
        exact = byte_width(value, "dtype")
    except (TypeError, ValueError):
        return None
    return f"**{value}**: {describe(exact.numerator if exact.denominator == 1 else exact)} (a width given as a number)"


def optimizer_text(value, config) -> str | None:
    spec = OPTIMIZERS.get(value.strip().lower()) if isinstance(value, str) else None
    if spec is None:
        return None
    states = len(spec.states)
    if spec.layout != "elementwise":
        text = f"**{value}** ({spec.framework}): {spec.note}; state {', '.join(spec.states)}"
    else:
        text = f"**{value}**: {states} state tensor{'s' if states != 1 else ''} per trainable parameter, each of the parameter's shape"
    if config is not None and states and spec.layout == "elementwise":
        width = config.widths["optimizer_state"]
        per = element_bytes(width, states)
        text += f"\n\nstored as dtypes.optimizer_state ({_width_text(width)}): {describe(per).replace(' per element', '')} per trainable parameter element"
    if config is not None and config.footprint:
        text += f"\n\noptimizer state in this config: {with_bytes(config.footprint['optimizer_state'])}"
    return text


def layer_text(row, tensors=(), placement=None) -> str:
    """A layer row (path, type, name, output_shape, params, saved_bytes) and the tensor rows
    derived from it (their bytes on the device shown, from the placement)."""
    lines = [f"**layer {row.index}**: {row.type}" + (f" `{row.name}`" if row.name != row.type else "")]
    lines.append(f"- output shape: {_shape(row.output_shape)}")
    lines.append(f"- parameters: {row.params:,}")
    weights: dict[str, int] = {}
    for tensor in tensors:
        if tensor.category == "parameters":
            for category, size in (placement.of(tensor) if placement is not None else tensor.bytes).items():
                weights[category] = weights.get(category, 0) + size
    if weights:
        parts = " + ".join(f"{human(size)} {_ROLE[category]}" for category, size in weights.items())
        lines.append(f"- weights in training: {parts} = {human(sum(weights.values()))}")
    lines.append(f"- saved for backward (tensors first kept by this layer): {with_bytes(row.saved_bytes)}")
    return "\n".join(lines)


def layer_hint(row) -> str:
    parts = [f"→ {_shape(row.output_shape)}"]
    if row.params:
        parts.append(f"{row.params:,} params")
    return ", ".join(parts)


# --- completion ------------------------------------------------------------------------

_BLOCK_KEY = re.compile(r"""^(?P<indent>\s*)(?:-\s+)?["']?(?P<key>[A-Za-z_]+)["']?\s*:\s*(?:#.*)?$""")
_NUMBER_THEN_UNIT = re.compile(r"""^\s*[0-9]+(?:\.[0-9]+)?\s*(?P<unit>[A-Za-z]*)$""")
_SPECIAL = frozenset(":,{}[]\"'")
_QUOTES = frozenset("\"'")
_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_WORD_CHARS = _KEY_CHARS | frozenset("0123456789")

# The prefix matchers below scan backwards from the cursor once. The regular expressions they
# replace (key: value at the end of the prefix) were searched from every start position, which is
# quadratic in a long run of letters: 60,000 letters held the server for 30 s.


def _key_start(prefix: str, colon: int) -> int | None:
    """Start of `key["']?\\s*` ending just before prefix[colon] (a ':'), or None."""
    at = colon - 1
    while at >= 0 and prefix[at].isspace():
        at -= 1
    if at >= 0 and prefix[at] in _QUOTES:
        at -= 1
    end = at
    while at >= 0 and prefix[at] in _KEY_CHARS:
        at -= 1
    return at + 1 if at < end else None


def _key_before(prefix: str) -> tuple[str, str, int] | None:
    """(key, value, start of key) when the prefix ends in `key: value`, the value free of
    `:,{}[]"'` (an open quote before it allowed)."""
    last = len(prefix) - 1
    while last >= 0 and prefix[last] not in _SPECIAL:
        last -= 1
    if last < 0:
        return None
    value = prefix[last + 1 :]
    colon = last
    if prefix[colon] in _QUOTES:
        colon -= 1
        while colon >= 0 and prefix[colon].isspace():
            colon -= 1
    else:
        value = value.lstrip()
    if colon < 0 or prefix[colon] != ":":
        return None
    start = _key_start(prefix, colon)
    if start is None:
        return None
    key_end = start
    while key_end < len(prefix) and prefix[key_end] in _KEY_CHARS:
        key_end += 1
    return prefix[start:key_end], value, start


def _open_flow_parent(prefix: str) -> str | None:
    """The key of a flow mapping left open at the end of the prefix (`key: {a: 1, b`)."""
    brace = max(prefix.rfind("{"), prefix.rfind("}"))
    if brace < 0 or prefix[brace] != "{":
        return None
    colon = brace - 1
    while colon >= 0 and prefix[colon].isspace():
        colon -= 1
    if colon < 0 or prefix[colon] != ":":
        return None
    start = _key_start(prefix, colon)
    if start is None:
        return None
    end = start
    while prefix[end] in _KEY_CHARS:
        end += 1
    return prefix[start:end]


def _word_length(prefix: str) -> int:
    at = len(prefix)
    while at > 0 and prefix[at - 1] in _WORD_CHARS:
        at -= 1
    return len(prefix) - at

DTYPE_CATEGORIES = ("parameters", "gradients", "activations", "optimizer_state")


@dataclass(frozen=True)
class Choice:
    label: str
    detail: str
    kind: str  # "dtype", "optimizer", "unit", "layer"


def _parent_key(lines: list[str], line: int, prefix: str) -> str | None:
    """The mapping key that encloses the cursor: an open flow mapping on this line, or the
    nearest less-indented block key above it."""
    flow = _open_flow_parent(prefix)
    if flow:
        return flow
    indent = len(prefix) - len(prefix.lstrip())
    stripped = prefix.lstrip()
    if stripped.startswith("- "):
        indent += 2
    for above in range(line - 1, -1, -1):
        text = lines[above]
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        width = len(text) - len(text.lstrip())
        if width < indent:
            match = _BLOCK_KEY.match(text)
            return match.group("key") if match else None
    return None


def completion_context(lines: list[str], line: int, character: int) -> tuple[str, int] | None:
    """(vocabulary, start column of the word being typed), or None outside the closed vocabularies."""
    if line >= len(lines):
        return None
    prefix = lines[line][:character]
    found = _key_before(prefix)
    if found is None:
        return None
    key, value, key_start = found
    word_start = character - _word_length(prefix)
    if key == "dtype":
        return "dtype", word_start
    if key in DTYPE_CATEGORIES and _parent_key(lines, line, prefix[:key_start]) == "dtypes":
        return "dtype", word_start
    if key == "optimizer":
        return "optimizer", word_start
    if key in ("memory", "reserve"):
        unit = _NUMBER_THEN_UNIT.match(value)
        if unit:
            return "unit", character - len(unit.group("unit"))
        return None
    if key == "type" and layer_types():
        return "layer", word_start
    return None


def layer_types() -> list[str]:
    from memfit.models.keras import RULES

    return sorted(RULES)


def choices(vocabulary: str) -> list[Choice]:
    if vocabulary == "dtype":
        return [Choice(name, f"{describe(width)}: {what}", "dtype") for name, (width, what) in DTYPES.items()]
    if vocabulary == "optimizer":
        return [Choice(name, f"{o.framework}: {len(o.states)} state tensor{'s' if len(o.states) != 1 else ''} per parameter ({o.layout})", "optimizer") for name, o in OPTIMIZERS.items()]
    if vocabulary == "unit":
        return [Choice(name, f"{size:,} bytes", "unit") for name, size in UNITS.items()]
    if vocabulary == "layer":
        return [Choice(name, "layer type", "layer") for name in layer_types()]
    return []

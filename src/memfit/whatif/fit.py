"""`memfit fit`: the largest value of one training key for which a config fits.

Every number comes from the pipeline (check.evaluate on the loaded data with one key
changed); nothing here computes bytes. The footprint is monotone in the keys that can be
varied, so the answer is searched exactly: a guess from the first two points (exact where
the footprint is affine in the key, as it is in the batch), then galloping and bisection,
O(log n) pipeline runs in all, on data parsed once.
"""

from __future__ import annotations

from dataclasses import field

from memfit.diagnostics import codes
from memfit.check.pipeline import Options, Result, evaluate, gated, position
from memfit.check.search import CEILING, NoEffect, largest  # noqa: F401 (fit's search; fixes imports them from here)
from memfit.diagnostics.diagnostic import Problem
from memfit.diagnostics.records import record
from memfit.report.commands import REPORTERS as COMMANDS

# The name asked for -> where it lives in a config's data, first present wins. A new model
# form with its own batch axis (or sequence length) adds its path here.
VARY: dict[str, tuple[tuple[str, ...], ...]] = {
    "micro_batch": (("training", "micro_batch"), ("model", "batch_size")),
    "seq_len": (("training", "seq_len"),),
    "gradient_accumulation": (("training", "gradient_accumulation"),),
    "eval_batch": (("training", "eval_batch"),),  # the evaluation pass's batch (ledger/passes.py)
}
DEFAULT_VARY = "micro_batch"

OVER = frozenset({codes.BUDGET_EXCEEDED})  # the gate's verdict "does not fit"
CLEAR = frozenset({codes.BUDGET_EXCEEDED, codes.NEAR_BUDGET})  # "does not fit below the warning mark"


# A key naming a file the config refers to -> the key that takes that file's content inline.
# fit and fixes read such a file once and evaluate with its content inline (the footprint is
# the same either way); diff reads it at the revision compared.
REFERENCES: dict[tuple, tuple] = {("model", "hf_config"): ("model", "transformer")}


def referenced(data, path: str) -> dict[tuple, str]:
    """The files this config refers to, by key, resolved as the pipeline resolves them."""
    import os

    out = {}
    for key in REFERENCES:
        node = data
        for part in key:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, str):
            base = os.path.dirname(path) if path and not path.startswith("<") else "."
            out[key] = os.path.normpath(os.path.join(base, os.path.expanduser(node)))
    return out


def inline(data, path: str) -> dict:
    """The data with each referenced file's content inline (read once); unchanged where a file
    cannot be used, so that the pipeline reports it as it always does."""
    from memfit.models.hf_config import LoadError, load

    for key, file in referenced(data, path).items():
        try:
            raw = load(file).raw
        except (LoadError, OSError):
            continue
        inner = {k: v for k, v in read(data, key[:-1]).items() if k != key[-1]}
        inner[REFERENCES[key][-1]] = raw
        data = with_value(data, key[:-1], inner)
    return data


def locations(data, vary: str) -> tuple[tuple, ...]:
    """Every place the key named `vary` is written in this config (a form may accept two
    spellings of one axis, which must then agree: they are varied together)."""
    found = []
    for path in VARY[vary]:
        node = data
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            found.append(path)
    return tuple(found)


def location(data, vary: str) -> tuple | None:
    """Where the key named `vary` is written in this config (the first of its spellings), or None."""
    found = locations(data, vary)
    return found[0] if found else None


def read(data, path: tuple):
    for part in path:
        data = data[part]
    return data


def with_value(data: dict, path: tuple, value) -> dict:
    """A copy of `data` with one value replaced: the mappings along the path are copied,
    everything else is shared (the data is never mutated)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    return {**data, head: with_value(data[head], rest, value)}


class Probe:
    """The pipeline at one value of one key (written at one or more paths), memoized."""

    def __init__(self, data: dict, paths, options: Options, refuse=OVER, source: str = "<data>") -> None:
        self.data = data
        self.paths = (paths,) if paths and isinstance(paths[0], str) else tuple(paths)
        self.options = options
        self.refuse = refuse
        self.source = source  # the config's path: files it refers to are found beside it
        self.runs = 0
        self._seen: dict[int, Result] = {}

    def result(self, value: int) -> Result:
        if value not in self._seen:
            self.runs += 1
            data = self.data
            for path in self.paths:
                data = with_value(data, path, value)
            self._seen[value] = evaluate(data, self.options, self.source)
        return self._seen[value]

    def fits(self, value: int) -> bool:
        result = self.result(value)
        return result.footprint is not None and result.budget is not None and not any(d.code in self.refuse for d in result.diagnostics)

    def bytes(self, value: int) -> int | None:
        return gated(self.result(value))


@record
class Fit:
    path: str
    vary: str
    max: int | None = None
    bytes_at_max: int | None = None
    bytes_at_next: int | None = None
    budget: int | None = None
    diagnostics: list = field(default_factory=list)
    key: tuple | None = None  # where the varied value is written
    current: int | None = None  # its value as written
    runs: int = 0  # pipeline evaluations the search took
    usage: bool = False  # the question does not apply to this config (nothing to vary, no effect)

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "vary": self.vary,
            "max": self.max,
            "bytes_at_max": self.bytes_at_max,
            "bytes_at_next": self.bytes_at_next,
            "budget": self.budget,
            "diagnostics": [d.to_json() for d in self.diagnostics],
        }

    @property
    def failed(self) -> bool:
        return self.max is None or self.max == 0 or any(d.severity == codes.ERROR for d in self.diagnostics)


def fit(checked: Result, text: str, vary: str = DEFAULT_VARY, options: Options = Options(), refuse=OVER) -> Fit:
    """The answer for one checked config (`checked` is check()'s result on `text`)."""
    out = Fit(checked.path, vary)
    # what check says about the budget is the question fit answers; everything else stands
    out.diagnostics = [d for d in checked.diagnostics if d.code not in CLEAR]
    data = checked.data
    if checked.config is None or any(d.severity == codes.ERROR for d in out.diagnostics):
        return out
    out.budget = checked.budget
    key = location(data, vary)
    if key is None:
        where = " or ".join(".".join(p) for p in VARY[vary])
        message = f"nothing to vary: this config does not set {where} ({vary})"
        if vary == "micro_batch":
            message += "; tensors declared with explicit shapes have no batch axis memfit can change"
        return _usage(out, text, data, ("memfit",), message, on_key=True)
    out.key, out.current = key, read(data, key)
    probe = Probe(inline(data, checked.path), locations(data, vary), options, refuse, checked.path)
    try:
        out.max = largest(probe)
    except NoEffect:
        at_one = probe.bytes(1)
        message = f"{vary} does not change memory in this config (the footprint is {at_one:,} B at 1 and at {CEILING:,}): nothing to fit"
        return _usage(out, text, data, key, message)
    out.runs = probe.runs
    if out.max:
        out.bytes_at_max = probe.bytes(out.max)
    if out.max < CEILING:
        out.bytes_at_next = probe.bytes(out.max + 1)
    return out


def _usage(out: Fit, text: str, data, where: tuple, message: str, on_key: bool = False) -> Fit:
    out.usage = True
    out.diagnostics.extend(position(text, [Problem(where, codes.CANNOT_VARY, message, on_key=on_key)], data))
    return out


# the reporters: report/commands.py, the one registry of reporters by command
REPORTERS = COMMANDS["fit"]

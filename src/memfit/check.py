"""The one pipeline every front end calls: text -> data -> schema -> config -> tensors ->
footprint -> budget -> positioned diagnostics. The CLI, the hook and the language server
are thin shells over `check`; nothing here is computed anywhere else."""

from __future__ import annotations

import gc
import re
from dataclasses import dataclass, field
from fractions import Fraction

from . import source
from .config import Config, build, footprint
from .diagnostics import ERROR, FILE_START, WARNING, Diagnostic, Problem
from .units import with_bytes

# A memfit config has a top-level `memfit:` key; without one anywhere in the text, a file
# is not a config and is skipped in --skip-unrecognized mode before any parsing.
_MARKER = re.compile(r"""(?:^|[{,]|\n)[ \t]*["']?memfit["']?[ \t]*:""")


@dataclass(frozen=True)
class Options:
    budget: int | None = None  # bytes, from --budget: supplies or overrides device.memory - reserve
    warn_at: Fraction | None = None  # overrides device.warn_at
    skip_unrecognized: bool = False  # files that are not memfit configs are skipped, not errors


@dataclass
class Result:
    path: str
    diagnostics: list = field(default_factory=list)
    config: Config | None = None
    budget: int | None = None
    budget_origin: str | None = None  # where the budget comes from, as written: "device.memory 24 GiB - reserve 1 GiB"
    skipped: bool = False
    data: object = None

    @property
    def footprint(self) -> dict | None:
        return self.config.footprint if self.config is not None else None

    @property
    def failed(self) -> bool:
        return any(d.severity == ERROR for d in self.diagnostics)


def has_marker(text: str) -> bool:
    return _MARKER.search(text) is not None


def check(text: str, path: str = "<text>", options: Options = Options()) -> Result:
    """The pipeline, with Python's cyclic garbage collector paused: it builds only acyclic data
    (a big config is millions of dicts, lists and rows), so each collection would walk all of it
    for nothing; 15-20% of a 150,000-tensor check. Anything cyclic is collected after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _check(text, path, options)
    finally:
        if enabled:
            gc.enable()


def _check(text: str, path: str, options: Options) -> Result:
    result = Result(path)
    if options.skip_unrecognized and not has_marker(text):
        result.skipped = True
        return result
    loaded = source.load(text)
    result.diagnostics.extend(loaded.diagnostics)
    data = loaded.data
    if data is None and loaded.diagnostics:
        return result
    if not isinstance(data, dict) or "memfit" not in data:
        if options.skip_unrecognized:
            result.skipped = True
            result.diagnostics.clear()
            return result
        what = "the file is empty" if data is None else f"its top level is {_kind(data)}, not a mapping with a 'memfit' key" if not isinstance(data, dict) else "it has no top-level 'memfit' key"
        result.diagnostics.append(Diagnostic(FILE_START, ERROR, "not-a-config", f"not a memfit config: {what} (add 'memfit: 1')"))
        return result
    result.data = data

    from . import schema

    problems = schema.problems(data)
    if not problems:
        config, problems = build(data)
        if "model" in data:
            from .layers import derive

            tensors, layer_problems = derive(data["model"], config)
            config.tensors.extend(tensors)
            problems.extend(layer_problems)
        config.footprint = footprint(config)
        result.config = config
        if not any(p.code == "bad-unit" for p in problems):  # no budget can be trusted otherwise
            problems.extend(_budget(config, options, result, data))
    unique = not any(d.code == "duplicate-key" for d in result.diagnostics)
    result.diagnostics.extend(place(text, problems, data, unique_keys=unique))
    result.diagnostics.sort(key=lambda d: (d.range.start_line, d.range.start_character))
    return result


def _kind(data) -> str:
    return "a list" if isinstance(data, list) else "empty" if data is None else f"a scalar ({data!r})"


def place(text: str, problems: list[Problem], data, unique_keys: bool = False) -> list[Diagnostic]:
    """Positions for all problems in one pass over the text (cut short when it can be: see source.locate)."""
    if not problems:
        return []
    requests = {}
    for problem in problems:
        if problem.path == () and isinstance(data, dict) and "memfit" in data:
            requests[problem] = (("memfit",), source.KEY)  # the document as a whole: its marker
        else:
            requests[problem] = (problem.path, source.KEY if problem.on_key else source.VALUE)
    ranges = source.locate(text, requests.values(), unique_keys)
    return [Diagnostic(ranges[requests[p]], p.severity, p.code, p.message) for p in problems]


def _budget(config: Config, options: Options, result: Result, data: dict) -> list[Problem]:
    if options.budget is not None:
        budget, where, origin = options.budget, ("memfit",), "from --budget"
        on_key = True
    elif config.memory is not None:
        budget, where, on_key = config.budget, ("device", "memory"), False
        device = data["device"]
        origin = f"device.memory {device['memory']}" + (f" - reserve {device['reserve']}" if "reserve" in device else "")
    else:
        at = ("device",) if "device" in data else ("memfit",)
        return [Problem(at, "no-budget", "no memory budget: set device.memory (e.g. '24 GiB') or pass --budget", on_key=True)]
    result.budget, result.budget_origin = budget, origin
    total = config.footprint["total"]
    if total > budget:
        return [
            Problem(
                where,
                "budget-exceeded",
                f"total {with_bytes(total)} exceeds the budget {with_bytes(budget)} ({origin}) by {with_bytes(total - budget)}",
                on_key=on_key,
            )
        ]
    warn_at = options.warn_at if options.warn_at is not None else config.warn_at
    if budget and total > warn_at * budget:
        share = Fraction(total * 100, budget)
        return [
            Problem(
                where,
                "near-budget",
                f"total {with_bytes(total)} is {float(share):.1f}% of the budget {with_bytes(budget)} ({origin}), above the {float(warn_at * 100):g}% warning mark; headroom {with_bytes(budget - total)}",
                WARNING,
                on_key=on_key,
            )
        ]
    return []


def read(path: str) -> tuple[str | None, Diagnostic | None]:
    """A file's text, or an io diagnostic saying why there is none."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as error:
        return None, Diagnostic(FILE_START, ERROR, "io", f"cannot read {path}: {error.strerror or error}")
    if b"\0" in raw[:8192]:
        return None, Diagnostic(FILE_START, ERROR, "io", "binary file (it contains NUL bytes), not a YAML config")
    try:
        return raw.decode("utf-8-sig"), None
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n")
        column = error.start - (raw.rfind(b"\n", 0, error.start) + 1)
        from .diagnostics import Range

        where = Range(line, column, line, column + 1)
        return None, Diagnostic(where, ERROR, "io", f"not UTF-8 text: byte 0x{raw[error.start]:02x} at offset {error.start} cannot be decoded")


def check_file(path: str, options: Options = Options()) -> Result:
    text, problem = read(path)
    if problem is not None:
        if options.skip_unrecognized and problem.code == "io" and "cannot read" not in problem.message:
            return Result(path, skipped=True)
        return Result(path, [problem])
    return check(text, path, options)

"""The one pipeline every front end calls: text -> data -> schema -> config -> tensors ->
footprint -> budget -> positioned diagnostics. The CLI, the hook and the language server
are thin shells over `check`; nothing here is computed anywhere else."""

from __future__ import annotations

import gc
import re
from dataclasses import dataclass, field
from fractions import Fraction

from .diagnostics import ERROR, FILE_START, WARNING, Diagnostic, Problem, Range
from .units import with_bytes

# The marker of a memfit config: a top-level `memfit: <version>` (column 0 in block style, or
# in a flow mapping). In --skip-unrecognized mode a file without it is skipped before parsing:
# a GitLab job named `memfit:`, a Helm template or a CloudFormation `!Ref` never fails the hook.
_MARKER = re.compile(r"""(?:^\ufeff?|[{,][ \t]*)["']?memfit["']?[ \t]*:[ \t]*["']?[0-9]""", re.MULTILINE)


@dataclass(frozen=True)
class Options:
    budget: int | None = None  # bytes, from --budget: supplies or overrides device.memory - reserve
    warn_at: Fraction | None = None  # overrides device.warn_at
    skip_unrecognized: bool = False  # files that are not memfit configs are skipped, not errors


@dataclass
class Result:
    path: str
    diagnostics: list = field(default_factory=list)
    config: object = None  # config.Config when the footprint could be computed
    budget: int | None = None
    budget_origin: str | None = None  # where the budget comes from, as written: "device.memory 24 GiB - reserve 1 GiB"
    skipped: bool = False
    data: object = None
    fixes: list | None = None  # with --suggest: fixes.Fix, cheapest first

    @property
    def footprint(self) -> dict | None:
        return self.config.footprint if self.config is not None else None

    @property
    def failed(self) -> bool:
        return any(d.severity == ERROR for d in self.diagnostics)


def has_marker(text: str) -> bool:
    return _MARKER.search(text) is not None


def _is_config(data) -> bool:
    return isinstance(data, dict) and "memfit" in data and not isinstance(data["memfit"], (dict, list))


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
    from . import source  # after the marker test: a skipped file costs no YAML import

    loaded = source.load(text)
    result.diagnostics.extend(loaded.diagnostics)
    data = loaded.data
    if data is None and loaded.diagnostics:
        return result
    if not _is_config(data):
        if options.skip_unrecognized:
            result.skipped = True
            result.diagnostics.clear()
            return result
        what = "the file is empty" if data is None else f"its top level is {_kind(data)}, not a mapping with a 'memfit' key" if not isinstance(data, dict) else "it has no top-level 'memfit' key"
        result.diagnostics.append(Diagnostic(FILE_START, ERROR, "not-a-config", f"not a memfit config: {what} (add 'memfit: 1')"))
        return result
    result.data = data
    problems = _pipeline(data, options, result)
    unique = not any(d.code == "duplicate-key" for d in result.diagnostics)
    result.diagnostics.extend(place(text, problems, data, unique_keys=unique))
    result.diagnostics.sort(key=lambda d: (d.range.start_line, d.range.start_character))
    return result


def evaluate(data, options: Options = Options(), path: str = "<data>") -> Result:
    """The pipeline from loaded data, without positions (each diagnostic at the file start):
    fit and fixes re-run it with one key changed, never re-reading or re-parsing the text."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        result = Result(path, data=data)
        problems = _pipeline(data, options, result)
        result.diagnostics.extend(Diagnostic(FILE_START, p.severity, p.code, p.message) for p in problems)
        return result
    finally:
        if enabled:
            gc.enable()


def _pipeline(data: dict, options: Options, result: Result) -> list[Problem]:
    """schema -> config -> tensors -> footprint -> budget, on a document that is a config."""
    from . import schema
    from .config import build, footprint

    problems = schema.problems(data)
    if not problems:
        config, problems = build(data)
        if "model" in data:
            from .layers import derive

            tensors, layer_problems = derive(data["model"], config)
            config.tensors.extend(tensors)
            problems.extend(layer_problems)
        # an unknown optimizer or a layer that cannot apply leaves a number that is not the
        # footprint: report none rather than a wrong one; a bad unit spoils only the budget
        if not any(p.code != "bad-unit" for p in problems):
            config.footprint = footprint(config)
            result.config = config
            if not problems:
                problems.extend(_budget(config, options, result, data))
    return problems


def _kind(data) -> str:
    return "a list" if isinstance(data, list) else "empty" if data is None else f"a scalar ({data!r})"


def place(text: str, problems: list[Problem], data, unique_keys: bool = False) -> list[Diagnostic]:
    """Positions for all problems in one pass over the text (cut short when it can be: see source.locate)."""
    if not problems:
        return []
    requests = {}
    for problem in problems:
        if problem.path == () and isinstance(data, dict) and "memfit" in data:
            requests[problem] = (("memfit",), "key")  # the document as a whole: its marker
        else:
            requests[problem] = (problem.path, "key" if problem.on_key else "value")
    from . import source

    ranges = source.locate(text, requests.values(), unique_keys)
    return [Diagnostic(ranges[requests[p]], p.severity, p.code, p.message) for p in problems]


def _budget(config, options: Options, result: Result, data: dict) -> list[Problem]:
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


# YAML allows UTF-8, UTF-16 and UTF-32, told apart by a byte order mark (longest first)
_BOMS = (
    (b"\xff\xfe\x00\x00", "utf-32"),
    (b"\x00\x00\xfe\xff", "utf-32"),
    (b"\xff\xfe", "utf-16"),
    (b"\xfe\xff", "utf-16"),
)


def read(path: str) -> tuple[str | None, Diagnostic | None, bytes]:
    """A file's text, or an io diagnostic saying why there is none (and the raw bytes read)."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as error:
        return None, Diagnostic(FILE_START, ERROR, "io", f"cannot read {path}: {error.strerror or error}"), b""
    text, problem = decode(raw)
    return text, problem, raw


def decode(raw: bytes) -> tuple[str | None, Diagnostic | None]:
    """A config's bytes as text (by its byte order mark, else UTF-8), or an io diagnostic."""
    encoding = next((name for bom, name in _BOMS if raw.startswith(bom)), "utf-8-sig")
    if encoding == "utf-8-sig" and b"\0" in raw[:8192]:
        return None, Diagnostic(FILE_START, ERROR, "io", "binary file (it contains NUL bytes), not a YAML config")
    try:
        return raw.decode(encoding), None
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n")
        column = error.start - (raw.rfind(b"\n", 0, error.start) + 1)
        where = Range(line, column, line, column + 1)
        message = f"not {encoding.removesuffix('-sig').upper()} text: byte 0x{raw[error.start]:02x} at offset {error.start} cannot be decoded"
        return None, Diagnostic(where, ERROR, "io", message)


def check_file(path: str, options: Options = Options()) -> Result:
    text, problem, raw = read(path)
    if problem is not None:
        # in skip mode an undecodable file is skipped only when it does not even look like a config
        if options.skip_unrecognized and raw and not has_marker(raw.decode("utf-8", "replace")):
            return Result(path, skipped=True)
        return Result(path, [problem])
    return check(text, path, options)

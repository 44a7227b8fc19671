"""memfit's Python API: `check_file`, `check_config`, `Result`, `DoesNotFit` (docs/python.md).

The same pipeline the command line runs (check/pipeline.py: `check_file` for a file, `check` for a text), with the
command line's settings as keyword arguments, checked as argparse checks the flags: a result here is the result
`memfit check` gives for the same file and flags, and `Result.to_json()` is the entry `memfit check --format json`
prints for it (the json reporter renders it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from fractions import Fraction

from memfit.diagnostics.units import UnitError, parse_bytes, parse_percent

__all__ = ["Diagnostic", "DoesNotFit", "Result", "check_config", "check_file", "options"]

# keyword -> what it takes, as the command line's flag of the same name (cli/main.py)
SETTINGS = {
    "budget": "bytes (an int, or e.g. '80 GB'): supplies or overrides device.memory - reserve (--budget)",
    "warn_at": "a percentage, e.g. '90%' (--warn-at)",
    "device": "a GPU preset name, e.g. 'H100-80GB' (--device)",
    "gpus": "the world size, a positive int (--gpus)",
    "gpus_per_node": "a positive int (--gpus-per-node)",
    "host_memory": "bytes of host RAM per node (--host-memory)",
    "reserve": "bytes or a percentage kept free (--reserve)",
    "overhead": "'auto' or bytes (--overhead)",
    "launch": "an accelerate config file (--launch)",
    "model": "a model name or path for a config that names none (--model)",
    "input_format": "read as this format: memfit, axolotl, llama-factory, torchtune, hf-trainer, deepspeed, accelerate (--input-format)",
    "settings": "False: ignore [tool.memfit] in pyproject.toml and memfit.toml (--no-settings)",
    "online": "True: fetch a model's config.json alone, with the standard library, within a deadline and a size cap (--online)",
    "max_file_size": "bytes: refuse to read a config larger than this (--max-file-size)",
}


def _bytes(key: str, value) -> int:
    try:
        if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
            value = int(value.strip())
        return parse_bytes(value)
    except UnitError as error:
        raise ValueError(f"{key}: {error}") from None


def _positive(key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key}: {value!r} is not a positive number")
    return value


def options(**settings):
    """The pipeline's Options for the command line's settings as keywords; a bad value is a ValueError with the message
    the command line gives for its flag, an unknown keyword a TypeError."""
    from memfit.check.pipeline import Options

    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise TypeError(f"unknown memfit setting{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; the settings are {', '.join(SETTINGS)}")
    given = {k: v for k, v in settings.items() if v is not None}
    out: dict = {}
    if "budget" in given:
        out["budget"] = _bytes("budget", given["budget"])
    if "warn_at" in given:
        value = given["warn_at"]
        try:
            out["warn_at"] = value if isinstance(value, Fraction) else parse_percent(value)
        except UnitError as error:
            raise ValueError(f"warn_at: {error}") from None
    if "max_file_size" in given:
        out["max_file_size"] = _bytes("max_file_size", given["max_file_size"])
    if "host_memory" in given:
        out["host_memory"] = _bytes("host_memory", given["host_memory"])
    for key in ("gpus", "gpus_per_node"):
        if key in given:
            out[key] = _positive(key, given[key])
    if "reserve" in given:
        value = given["reserve"]
        try:
            parse_percent(value) if isinstance(value, str) and value.strip().endswith("%") else _bytes("reserve", value)
        except UnitError as error:
            raise ValueError(f"reserve: {error}") from None
        out["reserve"] = value
    if "overhead" in given:
        if given["overhead"] != "auto":
            _bytes("overhead", given["overhead"])
        out["overhead"] = given["overhead"]
    if "input_format" in given:
        from memfit.read.native import FORMATS

        if given["input_format"] not in FORMATS:
            raise ValueError(f"input_format: {given['input_format']!r} is not one of {', '.join(FORMATS)}")
        out["input_format"] = given["input_format"]
    for key in ("device", "launch", "model"):
        if key in given:
            if not isinstance(given[key], (str, os.PathLike)):
                raise ValueError(f"{key}: {given[key]!r} is not a string")
            out[key] = os.fspath(given[key])
    for key in ("settings", "online"):
        if key in given:
            out[key] = bool(given[key])
    return Options(**out)


@dataclass(frozen=True)
class Diagnostic:
    """One problem, placed as `memfit check` prints it: `line` and `column` 1-based (the text output's
    path:line:column); `file` the file it is in when it is not the checked one (a model's config.json)."""

    code: str
    severity: str
    message: str
    line: int
    column: int
    file: str | None = None

    def __str__(self) -> str:
        return f"{self.file + ':' if self.file else ''}{self.line}:{self.column}: {self.severity}[{self.code}] {self.message}"


class Result:
    """One config checked: the gate's verdict and the figures `memfit check` reports for it."""

    def __init__(self, checked, text: str | None = None) -> None:
        self._checked = checked  # check.pipeline.Result
        self.text = text  # check_config: the text the mapping was checked as (diagnostics' lines are in it)

    @property
    def path(self) -> str:
        return self._checked.path

    @property
    def input_format(self) -> str:
        return self._checked.input_format

    @property
    def fits(self) -> bool:
        """The gate's verdict: a budget, a figure, and no error (an error in the config is not a fit)."""
        from memfit.check.pipeline import gated

        checked = self._checked
        return not checked.failed and checked.budget is not None and gated(checked) is not None

    @property
    def peak(self) -> int | None:
        """The run's peak in bytes (per GPU under a parallel layout), or None for a config with no training
        section or with an error that leaves no figure."""
        found = self._checked.peak
        return found["bytes"] if found is not None else None

    @property
    def needs(self) -> int | None:
        """What the gate compares with the budget: the peak where there is one, else the four categories' total."""
        from memfit.check.pipeline import gated

        return gated(self._checked)

    @property
    def phase(self) -> str | None:
        found = self._checked.peak
        return found.get("phase") if found is not None else None

    @property
    def breakdown(self) -> dict | None:
        """What is live at the peak, bytes by category (the json's peak.live)."""
        found = self._checked.peak
        return dict(found["live"]) if found is not None and "live" in found else None

    @property
    def budget(self) -> int | None:
        return self._checked.budget

    @property
    def footprint(self) -> dict | None:
        """The seed's five keys: parameters, gradients, activations, optimizer_state, total (bytes)."""
        found = self._checked.footprint
        return dict(found) if found is not None else None

    @property
    def config(self) -> dict | None:
        """The memfit config the file means (a native file's, as `memfit convert` prints it)."""
        return self._checked.data if isinstance(self._checked.data, dict) else None

    @property
    def diagnostics(self) -> list[Diagnostic]:
        out = []
        for d in self._checked.diagnostics:
            out.append(Diagnostic(d.code, d.severity, d.message, d.range.start_line + 1, d.range.start_character + 1, d.file))
        return out

    def to_json(self) -> dict:
        """Exactly the entry `memfit check --format json` prints for this config in its `files` list."""
        import io
        import json

        from memfit.report.reporters import JsonReporter

        out = io.StringIO()
        JsonReporter(out).report([self._checked])
        return json.loads(out.getvalue())["files"][0]

    def report(self) -> str:
        """The lines `memfit check` prints for this config (its diagnostics, then the summary)."""
        import io

        from memfit.report.reporters import TextReporter

        out = io.StringIO()
        TextReporter(out).report([self._checked])
        return out.getvalue()

    def raise_if_not_fits(self) -> Result:
        """DoesNotFit unless the gate passes; the Result itself otherwise."""
        if not self.fits:
            raise DoesNotFit(self)
        return self

    def __repr__(self) -> str:
        return f"<memfit.Result {self.path!r} fits={self.fits} peak={self.peak} budget={self.budget}>"


class DoesNotFit(Exception):
    """A config that does not pass the gate; `result` is its Result, and the message is what `memfit check`
    prints for it."""

    def __init__(self, result: Result) -> None:
        self.result = result
        super().__init__(result.report().rstrip("\n"))


def check_file(path, **settings) -> Result:
    """Check one config file (memfit's form or a native format), as `memfit check PATH` with the same settings."""
    from memfit.check.pipeline import safe_check

    return Result(safe_check(os.fspath(path), options(**settings)))


def check_config(mapping, base=".", name: str = "<config>", **settings) -> Result:
    """Check a config held in memory: a mapping in any format memfit reads. Relative paths in it (a model's
    config.json, a DeepSpeed JSON) resolve against `base`, and the project settings found from `base` apply, as for
    a file there. The mapping is checked as YAML text (`Result.text`); the diagnostics' lines are in that text."""
    import yaml

    from memfit.check.pipeline import check, internal_error

    if not isinstance(mapping, dict):
        raise TypeError(f"check_config takes a mapping, not {type(mapping).__name__}")
    try:
        text = yaml.safe_dump(mapping, sort_keys=False, default_flow_style=False, allow_unicode=True)
    except yaml.YAMLError as error:
        raise TypeError(f"the mapping holds a value that is not plain data (str, int, float, bool, None, list, dict): {error}") from None
    path = os.path.join(os.fspath(base), name)  # base "": the name alone (no settings file applies to it)
    chosen = options(**settings)
    try:
        checked = check(text, path, chosen)
    except Exception as error:  # noqa: BLE001 (as safe_check: a bug in memfit is one diagnostic)
        from memfit.check.pipeline import Result as Checked

        checked = Checked(path, [internal_error(error)])
    return Result(checked, text)

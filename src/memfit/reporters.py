"""One reporter per output format, looked up by name in REPORTERS."""

from __future__ import annotations

import json
import os
import sys

from . import __version__
from .units import human


class Reporter:
    def __init__(self, out=None) -> None:
        self.out = out or sys.stdout

    def report(self, results: list) -> None:
        raise NotImplementedError


def counts(results) -> tuple[int, int, int, int]:
    checked = [r for r in results if not r.skipped]
    errors = sum(d.severity == "error" for r in checked for d in r.diagnostics)
    warnings = sum(d.severity == "warning" for r in checked for d in r.diagnostics)
    failed = sum(r.failed for r in checked)
    return len(checked), failed, errors, warnings


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 'es' if word.endswith('x') else 's'}"


class TextReporter(Reporter):
    """ruff-style lines: path:line:col: severity[code] message (1-based), then a summary."""

    def report(self, results) -> None:
        write = self.out.write
        for result in results:
            for d in result.diagnostics:
                write(diagnostic_line(result.path, d) + "\n")
            if result.fixes is not None:
                write("".join(line + "\n" for line in fix_lines(result)))
        checked = [r for r in results if not r.skipped]
        if len(checked) <= HANDFUL:
            # a passing check says what it found; past a handful of files it stays quiet, as linters do
            write("".join(found_line(r) + "\n" for r in checked if not r.failed and r.footprint is not None and r.budget is not None))
        write(summary_line(results) + "\n")


HANDFUL = 5  # up to this many configs, a passing check prints each one's total against its budget


def found_line(result) -> str:
    from .explain import _pct

    total, budget = result.footprint["total"], result.budget
    return f"{result.path}: total {human(total)} of {human(budget)} ({_pct(total, budget)}), fits"


def fix_lines(result) -> list[str]:
    """--suggest: the fixes under the file's diagnostics, each with its edit as path:line:col."""
    if not result.fixes:
        if any(d.code in ("budget-exceeded", "near-budget") for d in result.diagnostics):
            return [f"{result.path}: no single change memfit knows of makes this config fit"]
        return []
    budget = f" of {human(result.budget)}" if result.budget is not None else ""
    codes = {d.code for d in result.diagnostics}
    goal = "" if "budget-exceeded" in codes else " (each brings it below the warning mark)"
    lines = [f"{result.path}: {_plural(len(result.fixes), 'fix')}, cheapest in training speed first{goal}:"]
    for i, fix in enumerate(result.fixes, 1):
        lines.append(f"  {i}. {fix.title}: total {human(fix.total)}{budget}")
        for edit in fix.edits:
            r = edit.range
            where = f"{result.path}:{r.start_line + 1}:{r.start_character + 1}"
            if (r.start_line, r.start_character) == (r.end_line, r.end_character):
                lines.append(f"     {where}: insert {edit.new_text.strip(chr(10))!r}")
            else:
                lines.append(f"     {where}: replace with {edit.new_text!r}")
    return lines


def diagnostic_line(path: str, d) -> str:
    return f"{path}:{d.range.start_line + 1}:{d.range.start_character + 1}: {d.severity}[{d.code}] {d.message}"


def summary_line(results) -> str:
    checked, failed, errors, warnings = counts(results)
    skipped = len(results) - checked
    tail = f", {skipped} skipped (not memfit configs)" if skipped else ""
    if failed:
        return f"memfit: {_plural(failed, 'config')} of {checked} failed ({_plural(errors, 'error')}, {_plural(warnings, 'warning')}){tail}"
    warned = f" ({_plural(warnings, 'warning')})" if warnings else ""
    return f"memfit: {_plural(checked, 'config')} checked, all fit{warned}{tail}"


class JsonReporter(Reporter):
    """The published json contract: files[].{path, footprint, budget, diagnostics}."""

    def report(self, results) -> None:
        files = [
            {
                "path": r.path,
                "footprint": r.footprint,
                "budget": r.budget,
                "diagnostics": [d.to_json() for d in r.diagnostics],
                **({"fixes": [f.to_json() for f in r.fixes]} if r.fixes is not None else {}),
            }
            for r in results
            if not r.skipped
        ]
        json.dump({"files": files}, self.out, indent=2)
        self.out.write("\n")


# Every diagnostic code (a published contract): a one-line description and what to do.
# The SARIF reporter publishes these as rules; code scanning shows `help` beside an alert.
RULES: dict[str, tuple[str, str]] = {
    "yaml-syntax": ("The file is not valid YAML", "Fix the YAML syntax at the position shown; memfit reads YAML 1.1 with core tags only."),
    "duplicate-key": ("A mapping key appears twice", "Remove one of the duplicated keys: YAML loaders silently keep only the last one."),
    "schema": ("The config does not match the memfit schema", "Compare the node with `memfit schema`; unknown keys usually are typos of a known key."),
    "unknown-dtype": ("A dtype name memfit does not know", "Use a known dtype name such as bfloat16 or float32, or a positive byte width that is a multiple of 1/8."),
    "unknown-optimizer": ("An optimizer memfit does not know", "Use a known optimizer name (adam, adamw, sgd, ...): it sets the optimizer state kept per parameter."),
    "bad-unit": ("A byte quantity or percentage that cannot be read", "Write an integer byte count or '<number> <unit>' with B, kB, MB, GB, TB, KiB, MiB, GiB or TiB, e.g. '24 GiB'."),
    "shape-mismatch": ("A layer cannot take the shape that reaches it", "Fix the layer's arguments (kernel, strides, padding, target_shape) or the layers before it; the message names the incoming shape."),
    "no-budget": ("No memory budget to check against", "Set device.memory (and optionally device.reserve) in the config, or pass --budget."),
    "budget-exceeded": ("The training footprint exceeds the memory budget", "Reduce the footprint (batch size, dtypes, optimizer, frozen layers) or raise the budget; `memfit explain` shows the breakdown."),
    "near-budget": ("The training footprint is close to the memory budget", "The config fits, but with little headroom; `memfit explain` shows where the memory goes."),
    "not-a-config": ("The file is not a memfit config", "Add a top-level `memfit: 1`, or pass --skip-unrecognized to skip files that are not memfit configs."),
    "io": ("The file cannot be read", "Check that the path exists and is a readable UTF-8 text file, and that a directory holds *.yaml or *.yml files."),
    "internal": ("memfit itself failed on this file", "This is a bug in memfit; please report it with the file that triggers it."),
}
INFORMATION_URI = "https://pypi.org/project/memfit/"
GITHUB_COMMANDS = {"error": "error", "warning": "warning", "information": "notice"}
SARIF_LEVELS = {"error": "error", "warning": "warning", "information": "note"}


def display_path(path: str) -> str:
    """A path as CI systems want it: relative to the working directory (the repository root
    in CI) when under it, with forward slashes."""
    if os.path.isabs(path):
        try:
            relative = os.path.relpath(path)
        except ValueError:  # another drive (Windows): keep it absolute
            relative = path
        if not relative.startswith(".."):
            path = relative
    return path.replace(os.sep, "/")


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


class GithubReporter(Reporter):
    """GitHub Actions workflow commands: each diagnostic becomes an annotation on the file and
    line in the pull request's diff; the summary line stays in the log."""

    def report(self, results) -> None:
        write = self.out.write
        for result in results:
            path = _escape_property(display_path(result.path))
            for d in result.diagnostics:
                r = d.range
                properties = (
                    f"file={path},line={r.start_line + 1},col={r.start_character + 1},"
                    f"endLine={r.end_line + 1},endColumn={r.end_character + 1},title={_escape_property(f'memfit {d.code}')}"
                )
                write(f"::{GITHUB_COMMANDS.get(d.severity, 'notice')} {properties}::{_escape_data(d.message)}\n")
        write(summary_line(results) + "\n")


class SarifReporter(Reporter):
    """SARIF 2.1.0 for code scanning (github/codeql-action/upload-sarif and other viewers).
    Regions are 1-based; endColumn is exclusive as SARIF defines it; columns count Unicode
    code points, as the YAML positions do (declared in run.columnKind)."""

    SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"

    def report(self, results) -> None:
        codes = list(RULES) + sorted({d.code for r in results for d in r.diagnostics} - RULES.keys())
        index = {code: i for i, code in enumerate(codes)}
        sarif_results = []
        for result in results:
            if result.skipped:
                continue
            uri = display_path(result.path)
            for d in result.diagnostics:
                r = d.range
                entry = {
                    "ruleId": d.code,
                    "ruleIndex": index[d.code],
                    "level": SARIF_LEVELS.get(d.severity, "note"),
                    "message": {"text": d.message},
                    "locations": [
                        {
                            "physicalLocation": {
                                "artifactLocation": {"uri": uri, "uriBaseId": "%SRCROOT%"},
                                "region": {
                                    "startLine": r.start_line + 1,
                                    "startColumn": r.start_character + 1,
                                    "endLine": r.end_line + 1,
                                    "endColumn": r.end_character + 1,
                                },
                            }
                        }
                    ],
                }
                if result.footprint is not None:
                    entry["properties"] = {"footprint": result.footprint, "budget": result.budget}
                sarif_results.append(entry)
        run = {
            "tool": {"driver": {"name": "memfit", "version": __version__, "informationUri": INFORMATION_URI, "rules": [_rule(c) for c in codes]}},
            "columnKind": "unicodeCodePoints",
            "results": sarif_results,
            "properties": {
                "files": [{"path": display_path(r.path), "footprint": r.footprint, "budget": r.budget} for r in results if not r.skipped],
            },
        }
        json.dump({"$schema": self.SCHEMA, "version": "2.1.0", "runs": [run]}, self.out, indent=2)
        self.out.write("\n")


def _rule(code: str) -> dict:
    short, help_text = RULES.get(code, (f"memfit diagnostic {code}", "See memfit's documentation for this diagnostic code."))
    return {
        "id": code,
        "name": "".join(part.capitalize() for part in code.split("-")),
        "shortDescription": {"text": short},
        "fullDescription": {"text": f"{short}. {help_text}"},
        "help": {"text": help_text},
        "defaultConfiguration": {"level": "warning" if code == "near-budget" else "error"},
    }


def summary_markdown(results) -> str:
    """A Markdown table for a CI job summary ($GITHUB_STEP_SUMMARY): one row per config."""
    lines = [
        "### memfit",
        "",
        "| file | total | budget | headroom | verdict |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for result in results:
        if result.skipped:
            continue
        total = result.footprint["total"] if result.footprint is not None else None
        budget = result.budget
        headroom = budget - total if total is not None and budget is not None else None
        cells = [
            f"`{display_path(result.path)}`".replace("|", "\\|"),
            human(total) if total is not None else "—",
            human(budget) if budget is not None else "—",
            human(headroom) if headroom is not None else "—",
            _verdict(result, headroom),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(summary_line(results))
    return "\n".join(lines) + "\n\n"


def _verdict(result, headroom: int | None) -> str:
    codes = [d.code for d in result.diagnostics if d.severity == "error"]
    if "budget-exceeded" in codes:
        return f"❌ exceeds by {human(-headroom)}"
    if codes:
        return "❌ " + ", ".join(dict.fromkeys(codes))
    if any(d.code == "near-budget" for d in result.diagnostics):
        return "⚠️ fits, near budget"
    return "✅ fits"


REPORTERS: dict[str, type[Reporter]] = {
    "text": TextReporter,
    "json": JsonReporter,
    "github": GithubReporter,
    "sarif": SarifReporter,
}


"""One reporter per output format, looked up by name in REPORTERS."""

from __future__ import annotations

import json
import os
import sys
from urllib.parse import quote

from memfit import __version__

from memfit.diagnostics import codes
from memfit.diagnostics.codes import CODES, lookup
from memfit.report.present import pct
from memfit.report.present import plural as _plural
from memfit.diagnostics.safe_text import markdown_code, printable
from memfit.diagnostics.units import human


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
            write("".join(f"{printable(r.path)}: {came_from(r)}\n" for r in checked if r.failed and came_from(r)))
        write(summary_line(results) + "\n")


HANDFUL = 5  # up to this many configs, a passing check prints each one's total against its budget


def found_line(result) -> str:
    used, budget = result.gated, result.budget
    peak = getattr(result, "parallel_peak", None)
    origin = came_from(result)
    tail = f" ({origin})" if origin else ""
    if peak is not None:  # the budget is per GPU: the most-loaded rank at its worst moment
        return f"{result.path}: GPU rank {peak['rank']} of {peak['ranks']}: peak {human(used)} of {human(budget)} ({pct(used, budget)}), fits" + tail
    what = "peak" if getattr(result, "peak", None) else "total"  # what the gate compared
    return f"{result.path}: {what} {human(used)} of {human(budget)} ({pct(used, budget)}), fits" + tail


def came_from(result) -> str:
    """Where the device, the model and the settings came from, when not from the checked file itself
    (json `provenance`): `device RTX-4090 from memfit.toml; model meta-llama/Meta-Llama-3-8B: ../models/x.json
    (the settings' models table ...)`."""
    found = getattr(result, "provenance", None)
    if not found:
        return ""
    parts = []
    device = found.get("device")
    if device:
        value = device.get("preset", device.get("memory"))
        parts.append(f"device {value} from {device['from']}")
    model = found.get("model")
    if model:
        parts.append(f"model {model['name']}: {model['config']}, from {model['from']}")
    named = " ".join(parts)
    if found.get("settings") and found["settings"] not in named:
        parts.append(f"settings {found['settings']}")
    return printable("; ".join(parts))


def fix_lines(result) -> list[str]:
    """--suggest: the fixes under the file's diagnostics, each with its edit as path:line:col."""
    found = {d.code for d in result.diagnostics}
    if not result.fixes:
        if not found & {codes.BUDGET_EXCEEDED, codes.NEAR_BUDGET}:
            return []
        closest = getattr(result, "closest", None)
        together = f"up to {closest.searched} together" if closest is not None else "combined"
        lines = [f"{result.path}: no change memfit knows of, alone or {together}, makes this config fit"]
        if closest is not None:
            figure = "peak" if result.peak else "total"
            lines.append(f"  closest: {closest.title}: {figure} {human(closest.total)} of {human(closest.budget)}, over by {human(closest.over)}")
        return lines
    budget = f" of {human(result.budget)}" if result.budget is not None else ""
    goal = "" if codes.BUDGET_EXCEEDED in found else " (each brings it below the warning mark)"
    count = f"{len(result.fixes)} fix{'' if len(result.fixes) == 1 else 'es'}"
    combined = " (no single change fits: combinations)" if any("+" in fix.kind for fix in result.fixes) else ""
    lines = [f"{result.path}: {count}, cheapest in training speed first{goal}{combined}:"]
    figure = "peak" if result.peak else "total"  # what the gate compares: a run's peak, else the total
    for i, fix in enumerate(result.fixes, 1):
        lines.append(f"  {i}. {fix.title}: {figure} {human(fix.total)}{budget}")
        if not fix.edits and getattr(result, "origins", None) is not None:  # a native config: its format's keys
            lines.append(f"     no text edit: {result.input_format} has no key of this file for this change (ZeRO, FSDP and offload are the DeepSpeed JSON's or the launch config's); make it there")
        elif not fix.edits:
            lines.append("     no text edit: memfit finds no edit of this file that makes exactly this change (a key reached through an alias or merge key, or a layout its edits do not write); make it by hand")
        for edit in fix.edits:
            r = edit.range
            where = f"{result.path}:{r.start_line + 1}:{r.start_character + 1}"
            if (r.start_line, r.start_character) == (r.end_line, r.end_character):
                lines.append(f"     {where}: insert {edit.new_text.strip(chr(10))!r}")
            else:
                lines.append(f"     {where}: replace with {edit.new_text!r}")
    return lines


def diagnostic_line(path: str, d) -> str:
    """path:line:col: severity[code] message; a problem inside a referenced file is placed in
    that file and names the key of `path` that refers to it."""
    where = d.file if d.file is not None else path
    line = f"{printable(where)}:{d.range.start_line + 1}:{d.range.start_character + 1}: {d.severity}[{d.code}] {printable(d.message)}"
    if d.file is not None and d.related is not None:
        line += f" (referenced from {printable(path)}:{d.related.start_line + 1}:{d.related.start_character + 1})"
    return line


def summary_line(results) -> str:
    checked, failed, errors, warnings = counts(results)
    skipped = len(results) - checked
    tail = f", {skipped} skipped (not memfit configs)" if skipped else ""
    if failed:
        return f"memfit: {_plural(failed, 'config')} of {checked} failed ({_plural(errors, 'error')}, {_plural(warnings, 'warning')}){tail}"
    warned = f" ({_plural(warnings, 'warning')})" if warnings else ""
    return f"memfit: {_plural(checked, 'config')} checked, all fit{warned}{tail}"


class JsonReporter(Reporter):
    """The published json contract: files[].{path, footprint, budget, diagnostics}, and `peak`
    beside `footprint` for a config with a training section."""

    def report(self, results) -> None:
        files = [
            _entry(r, {"budget": r.budget, **({"provenance": r.provenance} if getattr(r, "provenance", None) else {}), "diagnostics": [d.to_json() for d in r.diagnostics], **({"fixes": [f.to_json() for f in r.fixes]} if r.fixes is not None else {}), **({"closest": r.closest.to_json()} if r.fixes is not None and getattr(r, "closest", None) is not None else {})})
            for r in results
            if not r.skipped
        ]
        json.dump({"files": files}, self.out, indent=2)
        self.out.write("\n")


def _entry(result, rest: dict) -> dict:
    entry = {"path": result.path, "input_format": getattr(result, "input_format", "memfit"), "footprint": result.footprint}
    if result.peak is not None:
        entry["peak"] = result.peak
    host = getattr(result, "host", None)  # under offload: the most-loaded node's host memory
    if host is not None:
        entry["host"] = host
    entry.update(rest)
    return entry


# Every diagnostic code (a published contract), from the registry: a one-line description and
# what to do. The SARIF reporter publishes these as rules; code scanning shows `help` beside an alert.
RULES: dict[str, tuple[str, str]] = {code.id: (code.summary, code.help) for code in CODES.values()}
# Links to memfit's docs at the installed commit, in its own repository (diagnostics/provenance.py):
# memfit is installed from git, so there is no package page to point at. Left out where unknown.
DOCS_PAGE = "README.md"
CODES_PAGE = "docs/cli.md#diagnostic-codes-stable"
GITHUB_COMMANDS = {"error": "error", "warning": "warning", "information": "notice"}
SARIF_LEVELS = {"error": "error", "warning": "warning", "information": "note"}


def display_path(path: str) -> str:
    """A path as CI systems want it: relative to the repository root (GitHub's workspace when
    set, else the working directory) when under it, normalised (no `./`, no `a/../`), with
    forward slashes; a path outside it stays absolute."""
    root = os.environ.get("GITHUB_WORKSPACE") or os.getcwd()
    absolute = os.path.normpath(os.path.join(os.getcwd(), path))
    try:
        relative = os.path.relpath(absolute, root)
    except ValueError:  # another drive (Windows): keep it absolute
        relative = os.pardir
    if relative != os.pardir and not relative.startswith(os.pardir + os.sep):
        path = relative
    elif not os.path.isabs(path):
        path = absolute
    return path.replace(os.sep, "/")


def _artifact(path: str) -> dict:
    """A SARIF artifactLocation: a percent-encoded URI reference, relative to the root when it can be."""
    shown = display_path(path)
    encoded = quote(os.fsencode(shown), safe="/")  # the file system's bytes: a name that is not UTF-8 too
    if shown.startswith("/") or os.path.isabs(shown):
        return {"uri": "file://" + (encoded if encoded.startswith("/") else "/" + encoded)}
    return {"uri": encoded, "uriBaseId": "%SRCROOT%"}


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
            for d in result.diagnostics:
                path = _escape_property(printable(display_path(d.file if d.file is not None else result.path)))
                r = d.range
                properties = (
                    f"file={path},line={r.start_line + 1},col={r.start_character + 1},"
                    f"endLine={r.end_line + 1},endColumn={r.end_character + 1},title={_escape_property(f'memfit {d.code}')}"
                )
                write(f"::{GITHUB_COMMANDS.get(d.severity, 'notice')} {properties}::{_escape_data(printable(d.message))}\n")
        write(summary_line(results) + "\n")


class SarifReporter(Reporter):
    """SARIF 2.1.0 for code scanning (github/codeql-action/upload-sarif and other viewers).
    Regions are 1-based; endColumn is exclusive as SARIF defines it; columns count Unicode
    code points, as the YAML positions do (declared in run.columnKind)."""

    SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"

    def report(self, results) -> None:
        ids = list(RULES) + sorted({d.code for r in results for d in r.diagnostics} - RULES.keys())
        index = {code: i for i, code in enumerate(ids)}
        sarif_results = []
        for result in results:
            if result.skipped:
                continue
            artifact = _artifact(result.path)
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
                                "artifactLocation": _artifact(d.file) if d.file is not None else artifact,
                                "region": _region(r),
                            }
                        }
                    ],
                }
                if d.file is not None and d.related is not None:
                    entry["relatedLocations"] = [
                        {
                            "id": 0,
                            "physicalLocation": {"artifactLocation": artifact, "region": _region(d.related)},
                            "message": {"text": "referenced here"},
                        }
                    ]
                if result.footprint is not None:
                    entry["properties"] = _entry(result, {"budget": result.budget})
                    del entry["properties"]["path"]
                sarif_results.append(entry)
        run = {
            "tool": {"driver": _driver(ids)},
            "columnKind": "unicodeCodePoints",
            "results": sarif_results,
            "properties": {
                "files": [{**_entry(r, {"budget": r.budget}), "path": display_path(r.path)} for r in results if not r.skipped],
            },
        }
        json.dump({"$schema": self.SCHEMA, "version": "2.1.0", "runs": [run]}, self.out, indent=2)
        self.out.write("\n")


def _region(r) -> dict:
    return {"startLine": r.start_line + 1, "startColumn": r.start_character + 1, "endLine": r.end_line + 1, "endColumn": r.end_character + 1}


def _driver(ids) -> dict:
    from memfit.diagnostics.provenance import web_base

    base = web_base()
    driver = {"name": "memfit", "version": __version__}
    if base is not None:
        driver["informationUri"] = f"{base}/{DOCS_PAGE}"
    driver["rules"] = [_rule(c, base) for c in ids]
    return driver


def _rule(code: str, base: str | None = None) -> dict:
    entry = lookup(code)
    short, help_text = entry.summary, entry.help
    rule = {
        "id": code,
        "name": "".join(part.capitalize() for part in code.split("-")),
        "shortDescription": {"text": short},
        "fullDescription": {"text": f"{short}. {help_text}"},
        "help": {"text": help_text},
        "defaultConfiguration": {"level": SARIF_LEVELS.get(entry.severity, "note")},
    }
    if base is not None:
        rule["helpUri"] = f"{base}/{CODES_PAGE}"
    return rule


def summary_markdown(results) -> str:
    """A Markdown table for a CI job summary ($GITHUB_STEP_SUMMARY): one row per config."""
    runs = any(r.peak is not None for r in results if not r.skipped)
    lines = [
        "### memfit",
        "",
        "| file | total | peak | budget | headroom | verdict |" if runs else "| file | total | budget | headroom | verdict |",
        "| --- | ---: | ---: | ---: | ---: | --- |" if runs else "| --- | ---: | ---: | ---: | --- |",
    ]
    for result in results:
        if result.skipped:
            continue
        total = result.footprint["total"] if result.footprint is not None else None
        peak = result.peak
        used = peak["bytes"] if peak is not None else total
        budget = result.budget
        headroom = budget - used if used is not None and budget is not None else None
        cells = [
            markdown_code(display_path(result.path)),
            human(total) if total is not None else "—",
            *([f"{human(peak['bytes'])} ({peak['phase'].replace('_', ' ')})" if peak is not None else "—"] if runs else []),
            human(budget) if budget is not None else "—",
            human(headroom) if headroom is not None else "—",
            _verdict(result, headroom),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(summary_line(results))
    return "\n".join(lines) + "\n\n"


def _verdict(result, headroom: int | None) -> str:
    errors = [d.code for d in result.diagnostics if d.severity == codes.ERROR]
    if codes.BUDGET_EXCEEDED in errors:
        return f"❌ exceeds by {human(-headroom)}"
    if errors:
        return "❌ " + ", ".join(dict.fromkeys(errors))
    if any(d.code == codes.NEAR_BUDGET for d in result.diagnostics):
        return "⚠️ fits, near budget"
    return "✅ fits"


REPORTERS: dict[str, type[Reporter]] = {
    "text": TextReporter,
    "json": JsonReporter,
    "github": GithubReporter,
    "sarif": SarifReporter,
}


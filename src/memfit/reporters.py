"""One reporter per output format, looked up by name in REPORTERS."""

from __future__ import annotations

import json
import sys


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
    return f"{n} {word}{'' if n == 1 else 's'}"


class TextReporter(Reporter):
    """ruff-style lines: path:line:col: severity[code] message (1-based), then a summary."""

    def report(self, results) -> None:
        write = self.out.write
        for result in results:
            for d in result.diagnostics:
                write(f"{result.path}:{d.range.start_line + 1}:{d.range.start_character + 1}: {d.severity}[{d.code}] {d.message}\n")
        checked, failed, errors, warnings = counts(results)
        skipped = len(results) - checked
        tail = f", {skipped} skipped (not memfit configs)" if skipped else ""
        if failed:
            write(f"memfit: {_plural(failed, 'config')} of {checked} failed ({_plural(errors, 'error')}, {_plural(warnings, 'warning')}){tail}\n")
        else:
            warned = f" ({_plural(warnings, 'warning')})" if warnings else ""
            write(f"memfit: {_plural(checked, 'config')} checked, all fit{warned}{tail}\n")


class JsonReporter(Reporter):
    """The published json contract: files[].{path, footprint, budget, diagnostics}."""

    def report(self, results) -> None:
        files = [
            {
                "path": r.path,
                "footprint": r.footprint,
                "budget": r.budget,
                "diagnostics": [d.to_json() for d in r.diagnostics],
            }
            for r in results
            if not r.skipped
        ]
        json.dump({"files": files}, self.out, indent=2)
        self.out.write("\n")


REPORTERS: dict[str, type[Reporter]] = {
    "text": TextReporter,
    "json": JsonReporter,
}


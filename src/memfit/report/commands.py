"""The reporters of the what-if commands (`fit`, `fit --vary gpus`, `diff`) beside check's (report/reporters.py):
REPORTERS is the one registry of reporters, by command and format. They render the results the commands hand
them (whatif.fit.Fit, whatif.gpus.GpuFit, whatif.diff.Comparison) and import no stage above the report."""

from __future__ import annotations

import json

from memfit.diagnostics.safe_text import markdown_code, printable
from memfit.diagnostics.units import human
from memfit.recipe.costs import CATEGORIES
from memfit.report import reporters as check_reporters

# --- fit ----------------------------------------------------------------------------------


def fit_line(found) -> str | None:
    if found.max is None:
        return None
    figures = [found.budget, found.bytes_at_max, found.bytes_at_next]
    shown = [human(n) for n in figures if n is not None]
    # at 2 decimals the three figures can read the same; then each also gives its exact bytes (the same units
    # whatever the key varied: micro_batch and seq_len alike)
    size = human if len(set(shown)) == len(shown) else (lambda n: f"{human(n)} = {n:,} B")
    budget = size(found.budget)
    if found.max == 0:
        now = f" (the config has {found.current})" if found.current not in (None, 1) else ""
        return f"{found.path}: does not fit at any {found.vary}: at 1{now} it needs {size(found.bytes_at_next)} of {budget}"
    line = f"{found.path}: {found.vary} ≤ {found.max} fits ({size(found.bytes_at_max)} of {budget})"
    if found.bytes_at_next is not None:
        line += f"; {found.max + 1} needs {size(found.bytes_at_next)}"
    return line


class FoundText:
    """Each result's diagnostics, then its lines (`render`: fit_line's one line, or gpus_table's table)."""

    render = staticmethod(lambda found: [])

    def __init__(self, out) -> None:
        self.out = out

    def report(self, fits: list) -> None:
        for found in fits:
            for d in found.diagnostics:
                self.out.write(check_reporters.diagnostic_line(found.path, d) + "\n")
            for line in self.render(found):
                self.out.write(line + "\n")


class FoundJson:
    """{"files": [each result's to_json()]} (fit, fit --vary gpus)."""

    def __init__(self, out) -> None:
        self.out = out

    def report(self, fits: list) -> None:
        json.dump({"files": [f.to_json() for f in fits]}, self.out, indent=2)
        self.out.write("\n")


class FitText(FoundText):
    render = staticmethod(lambda found: [line] if (line := fit_line(found)) is not None else [])


# --- fit --vary gpus ----------------------------------------------------------------------


def gpus_table(found) -> list[str]:
    if not found.rows:
        return []
    shape = "" if found.tensor == found.pipeline == 1 else f" (tensor {found.tensor} x pipeline {found.pipeline} kept)"
    lines = [f"{found.path}: the fewest GPUs that pass memfit check, per strategy{shape}; budget {human(found.budget)} per GPU"]
    header = ("GPUs", "strategy", "peak per GPU", "host per node")
    rows = []
    for row in found.rows:
        if row.data is None:
            rows.append(("—", row.strategy, row.reason, ""))
        else:
            rows.append((f"{row.gpus:,}", row.strategy, human(row.peak), human(row.host) if row.host is not None else "—"))
    width = [max(len(r[i]) for r in [header, *rows] if not (r is not header and r[0] == "—" and i == 2)) for i in range(4)]
    for r in [header, *rows]:
        if r is not header and r[0] == "—":
            lines.append(f"  {r[0]:>{width[0]}}  {r[1]:<{width[1]}}  {r[2]}")
        else:
            lines.append(f"  {r[0]:>{width[0]}}  {r[1]:<{width[1]}}  {r[2]:>{width[2]}}  {r[3]:>{width[3]}}".rstrip())
    lines += _why_one_gpu(found)
    return lines


def _why_one_gpu(found) -> list[str]:
    """Why a strategy fits on one GPU where the model's own bytes are far over the budget: the offload keeps the
    parameters (beside their gradients and optimizer state) on the host, and the GPU holds what runs."""
    out = []
    for row in found.rows:
        if row.gpus != 1 or row.on_device is None or row.host is None or row.budget is None or row.host <= row.budget:
            continue  # (only where the host alone holds more than a GPU could: where one GPU is a surprise)
        held = sum(row.on_device.values())
        out.append(f"  {row.strategy} on 1 GPU: the parameters, gradients and optimizer state are on the host "
                   f"({human(row.host)}; {human(held)} stays on the GPU);")
        out.append(f"    the GPU holds one gathered unit at a time, its gradients and the activations: {human(row.peak)}")
    return out


class GpusText(FoundText):
    render = staticmethod(lambda found: gpus_table(found))


# --- diff ---------------------------------------------------------------------------------


def _signed(n: int) -> str:
    return ("+" if n > 0 else "") + human(n) if n else "±0"


def _share(entry) -> str:
    growth = entry.growth
    if growth is None:
        return ""
    tenths = round(growth * 1000)
    return f"{'+' if tenths > 0 else '-' if tenths < 0 else '±'}{abs(tenths) // 10}.{abs(tenths) % 10}%"


def _verdict(entry) -> str:
    """"pass → fail", "fail → pass", "fails" or "" (a pass that stays a pass, or a side missing)."""
    before, after = entry.before.status, entry.after.status
    if before in ("pass", "fail") and after in ("pass", "fail") and before != after:
        return f"{before} → {after}"
    if after == "fail" or (after is None and before == "fail"):
        return "fails"
    return ""


def _order(entries) -> list:
    """Pass → fail first, then largest growth of the gated figure; configs without a difference last."""
    return sorted(entries, key=lambda e: (not e.newly_failing, e.gated_delta is None, -(e.gated_delta or 0), e.path))


class DiffText:
    def __init__(self, out) -> None:
        self.out = out

    def report(self, comparison) -> None:
        write = self.out.write
        write(f"memfit diff: working tree against {printable(comparison.base)} ({comparison.commit[:12]})\n")
        for e in comparison.entries:
            before, after, change = e.before.gated, e.after.gated, e.gated_delta
            label = "peak " if e.label == "peak" else ""  # a run's gated figure is its peak; else the total, unlabelled
            if e.before.result is None:
                head = f"added, {label}{human(after)}" if after is not None else "added, no footprint"
            elif e.after.result is None:
                head = f"removed (was {label}{human(before)})" if before is not None else "removed"
            elif change is None:
                head = f"{label}{human(before) if before is not None else 'no footprint'} → {human(after) if after is not None else 'no footprint'}"
            elif not change and not any((e.delta or {}).values()):
                head = f"{label}{human(after)}, unchanged"
            else:
                head = f"{label}{human(before)} → {human(after)} ({_signed(change)}, {_share(e)})"
            verdict = _verdict(e)
            if verdict:
                head += f"; {verdict.upper() if e.newly_failing else verdict}"
            write(f"{printable(e.path)}: {head}\n")
            delta = e.delta
            if delta is not None and e.before.result is not None and e.after.result is not None:
                for category in CATEGORIES:
                    if delta.get(category):
                        write(f"  {category:<16} {_signed(delta[category])}\n")
            if e.newly_failing:
                for d in e.after.result.diagnostics:
                    if d.severity == "error":
                        write(f"  {check_reporters.diagnostic_line(e.path, d)}\n")
            for name, side in (("before", e.before), ("after", e.after)):
                if side.result is not None and side.footprint is None:
                    where = printable(comparison.base) if name == "before" else "the working tree"
                    write(f"  no footprint at {where}:\n")
                    for d in side.result.diagnostics:
                        write(f"  {check_reporters.diagnostic_line(e.path, d)}\n")
        if not comparison.entries:
            write("no memfit configs at either side\n")


class DiffJson:
    def __init__(self, out) -> None:
        self.out = out

    def report(self, comparison) -> None:
        json.dump(comparison.to_json(), self.out, indent=2)
        self.out.write("\n")


class DiffMarkdown:
    """A table for a pull-request comment or a job summary: configs that now fail first, then largest growth."""

    def __init__(self, out) -> None:
        self.out = out

    def report(self, comparison) -> None:
        def cell(side) -> str:
            if side.result is None:
                return "—"
            return human(side.gated) if side.gated is not None else "❌ no footprint"

        lines = [
            f"### memfit: memory against {markdown_code(comparison.base)}",
            "",
            "| config | before | after | change | status | " + " | ".join(CATEGORIES) + " |",
            "| --- | ---: | ---: | ---: | --- | " + " | ".join("---:" for _ in CATEGORIES) + " |",
        ]
        for e in _order(comparison.entries):
            delta, change = e.delta, e.gated_delta
            if e.before.result is None:
                shown = "added"
            elif e.after.result is None:
                shown = "removed"
            elif change is None:
                shown = "—"
            else:
                shown = _signed(change) + (f" ({_share(e)})" if _share(e) else "")
            verdict = _verdict(e)
            status = f"❌ **{verdict}**" if e.newly_failing else verdict or ("pass" if e.after.status == "pass" else "—")
            parts = [_signed(delta.get(c, 0)) if delta is not None else "—" for c in CATEGORIES]
            lines.append(f"| {markdown_code(e.path)} | {cell(e.before)} | {cell(e.after)} | {shown} | {status} | " + " | ".join(parts) + " |")
        if not comparison.entries:
            lines.append("| (no memfit configs) | | | | | " + " | ".join("" for _ in CATEGORIES) + " |")
        self.out.write("\n".join(lines) + "\n\n")


REPORTERS = {
    "check": check_reporters.REPORTERS,
    "fit": {"text": FitText, "json": FoundJson},
    "gpus": {"text": GpusText, "json": FoundJson},
    "diff": {"text": DiffText, "json": DiffJson, "markdown": DiffMarkdown},
}

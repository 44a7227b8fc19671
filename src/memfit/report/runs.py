"""`memfit runs PATH...`: the runs MemfitCallback recorded (integrations/record.py), predicted against measured: per
run the predicted peak, the measured allocated and reserved peaks (torch.cuda.max_memory_allocated / _reserved after
the first steps), the error, and over all the measured runs the median and the worst error. This is memfit's error
on the user's own hardware.

The error of a run is (predicted - measured allocated) / measured allocated: negative when memfit was low. A run is
flagged `low` when its measured allocated peak exceeds the prediction, `oom-after-pass` when it died of out-of-memory
after memfit said it fits. Exit 1 when a run was low by more than 5% or died of out-of-memory after a pass; a line
that is not a run record is reported with its line number and skipped.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from fractions import Fraction

from memfit.diagnostics.safe_text import printable
from memfit.diagnostics.units import human
from memfit.read.inputs import read as read_file

EXIT_OK, EXIT_FAILED = 0, 1
TOLERANCE = Fraction(5, 100)  # low by more than this share of the measured peak fails the command
STATUSES = ("started", "completed", "stopped", "oom", "failed", "interrupted")


@dataclass
class Run:
    path: str
    line: int
    id: str
    time: str
    device: str
    status: str
    predicted: int | None
    fits: bool | None
    allocated: int | None
    reserved: int | None
    steps: int | None
    seq_len: int | None

    @property
    def error(self) -> Fraction | None:
        """(predicted - allocated) / allocated; None without both figures."""
        if self.predicted is None or not self.allocated:
            return None
        return Fraction(self.predicted - self.allocated, self.allocated)

    @property
    def low(self) -> bool:
        return self.predicted is not None and self.allocated is not None and self.allocated > self.predicted

    @property
    def oom_after_pass(self) -> bool:
        return self.status == "oom" and self.fits is True

    @property
    def flags(self) -> list[str]:
        return [name for name, on in (("low", self.low), ("oom-after-pass", self.oom_after_pass)) if on]

    def to_json(self) -> dict:
        error = self.error
        return {
            "path": self.path,
            "line": self.line,
            "id": self.id,
            "time": self.time,
            "device": self.device,
            "status": self.status,
            "seq_len": self.seq_len,
            "predicted": self.predicted,
            "fits": self.fits,
            "allocated": self.allocated,
            "reserved": self.reserved,
            "steps": self.steps,
            "difference": self.predicted - self.allocated if error is not None else None,
            "error": float(error) if error is not None else None,
            "flags": self.flags,
        }


def _int(value, what: str):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} is {value!r}: a byte count (a non-negative integer) or null")
    return value


def parse(entry, path: str, line: int) -> Run:
    """One record line's run; ValueError says why a line is not one."""
    if not isinstance(entry, dict):
        raise ValueError("not a JSON object")
    if entry.get("record") != 1:
        raise ValueError(f"record is {entry.get('record')!r}: memfit writes record 1")
    predicted, measured = entry.get("predicted"), entry.get("measured")
    if not isinstance(predicted, dict):
        raise ValueError("no `predicted` object")
    if not isinstance(measured, dict):
        raise ValueError("no `measured` object")
    status = entry.get("status")
    if status not in STATUSES:
        raise ValueError(f"status is {status!r}: one of {', '.join(STATUSES)}")
    fits = predicted.get("fits")
    if fits is not None and not isinstance(fits, bool):
        raise ValueError(f"predicted.fits is {fits!r}: true, false or null")
    steps = measured.get("steps")
    seq_len = predicted.get("seq_len")
    return Run(
        path, line, str(entry.get("id", "")), str(entry.get("time", "")), str(entry.get("device", "")), status,
        _int(predicted.get("peak"), "predicted.peak"), fits,
        _int(measured.get("allocated"), "measured.allocated"), _int(measured.get("reserved"), "measured.reserved"),
        steps if isinstance(steps, int) and not isinstance(steps, bool) else None,
        seq_len if isinstance(seq_len, int) and not isinstance(seq_len, bool) else None,
    )


def read(paths: list[str]) -> tuple[list[Run], list[tuple[str, int, str]]]:
    """The runs of the record files, and the lines skipped: (path, line number (0: the file), why)."""
    runs, skipped = [], []
    for path in paths:
        text, problem, _ = read_file(path)
        if problem is not None:
            skipped.append((path, 0, problem.message))
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                runs.append(parse(json.loads(line), path, number))
            except ValueError as error:  # json.JSONDecodeError is a ValueError
                skipped.append((path, number, f"not a memfit run record: {error}"))
    return runs, skipped


def summary(runs: list[Run]) -> dict:
    from statistics import median

    measured = [r for r in runs if r.error is not None]
    errors = [r.error for r in measured]
    worst = max(measured, key=lambda r: (abs(r.error), -r.line)) if measured else None
    return {
        "runs": len(runs),
        "measured": len(measured),
        "median_error": float(median(errors)) if errors else None,
        "worst_error": float(worst.error) if worst is not None else None,
        "worst": f"{worst.path}:{worst.line}" if worst is not None else None,
        "low": sum(r.low for r in runs),
        "low_beyond_tolerance": sum(r.error is not None and r.error < -TOLERANCE for r in runs),
        "oom_after_pass": sum(r.oom_after_pass for r in runs),
    }


def failed(runs: list[Run]) -> bool:
    return any((r.error is not None and r.error < -TOLERANCE) or r.oom_after_pass for r in runs)


def _percent(share: Fraction | float | None) -> str:
    return "-" if share is None else f"{float(share) * 100:+.1f}%"


def text(runs: list[Run], skipped: list) -> str:
    def size(n):
        return "-" if n is None else human(n)

    rows = [("run", "device", "status", "tokens", "predicted", "allocated", "reserved", "error", "flags")]
    for r in runs:
        rows.append((f"{r.path}:{r.line}", r.device or "-", r.status, str(r.seq_len or "-"), size(r.predicted), size(r.allocated), size(r.reserved), _percent(r.error), ", ".join(r.flags)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    found = summary(runs)
    if found["measured"]:
        tail = f"error median {_percent(found['median_error'])}, worst {_percent(found['worst_error'])} ({found['worst']})"
    else:
        tail = "no measured peaks (off CUDA a run records its prediction only)"
    lines.append(f"memfit runs: {found['runs']} run{'s' if found['runs'] != 1 else ''}, {found['measured']} measured; {tail}")
    for r in runs:
        if r.low:
            lines.append(f"{r.path}:{r.line}: low: measured {r.allocated:,} B allocated, {r.allocated - r.predicted:,} B above the prediction {r.predicted:,} B ({_percent(r.error)})")
        if r.oom_after_pass:
            lines.append(f"{r.path}:{r.line}: died of out-of-memory after memfit said it fits (predicted {size(r.predicted)})")
    return "\n".join(lines) + "\n"


def run(args) -> int:
    """The command: the table (or --format json) on stdout, skipped lines on stderr."""
    runs, skipped = read(args.paths)
    for path, line, why in skipped:
        sys.stderr.write(printable(f"{path}:{line}: {why}" if line else f"memfit runs: {why}") + "\n")
    if args.format == "json":
        out = {"runs": [r.to_json() for r in runs], "summary": summary(runs), "skipped": [{"path": p, "line": n, "message": m} for p, n, m in skipped]}
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    else:
        sys.stdout.write(text(runs, skipped))
    unreadable = any(line == 0 for _, line, _ in skipped)
    return EXIT_FAILED if failed(runs) or unreadable else EXIT_OK

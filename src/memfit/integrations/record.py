"""The record of a run: one JSON line per run in a file the user names (`MemfitCallback(record=path)`), written before
the run's first step and completed after, so that a run that dies still leaves its line (`status` says how it
ended). `memfit runs` (report/runs.py) reads these lines.

A line, keys in this order (docs/python.md has the table):
  record (1: this layout), id, time (UTC, ISO 8601), memfit (its version), status (started | completed | stopped |
  oom | failed | interrupted), device (the GPU's name, or cpu), world_size, versions (torch, transformers, peft,
  bitsandbytes: None where not installed), config (the memfit config, model inline), predicted (peak, phase,
  breakdown, footprint, budget, fits, seq_len, seq_source, diagnostics), measured (allocated, reserved, steps: null
  off CUDA), error (how a failed run ended).

Lines are rewritten in place under an advisory lock (fcntl, where there is one): several runs may share one file.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager

LAYOUT = 1
STATUSES = ("started", "completed", "stopped", "oom", "failed", "interrupted")
PACKAGES = ("torch", "transformers", "peft", "bitsandbytes")


def versions() -> dict:
    from importlib import metadata

    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


@contextmanager
def _locked(path: str):
    """The record file opened for reading and writing, created if need be, under an exclusive lock."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    with os.fdopen(descriptor, "r+", encoding="utf-8") as handle:
        try:
            import fcntl
        except ImportError:  # no advisory locks (Windows): a lone writer is the common case
            fcntl = None
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield handle
        finally:
            if fcntl is not None:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def append(path: str, entry: dict) -> None:
    line = json.dumps(entry, separators=(",", ":")) + "\n"
    with _locked(path) as handle:
        text = handle.read()
        if text and not text.endswith("\n"):
            line = "\n" + line  # a line cut short by a run that died writing stays on its own line
        handle.seek(0, os.SEEK_END)
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


def update(path: str, run_id: str, changes: dict) -> bool:
    """The line of run `run_id` with `changes` merged in (top-level keys replaced); False when it is not there."""
    with _locked(path) as handle:
        lines = handle.read().split("\n")
        found = False
        for i, line in enumerate(lines):
            if f'"id":"{run_id}"' not in line:
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("id") != run_id:
                continue
            entry.update(changes)
            lines[i] = json.dumps(entry, separators=(",", ":"))
            found = True
            break
        if found:
            handle.seek(0)
            handle.write("\n".join(lines))
            handle.truncate()
            handle.flush()
            os.fsync(handle.fileno())
        return found

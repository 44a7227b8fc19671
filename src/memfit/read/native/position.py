"""Diagnostics on native files: the reader's problems at their native nodes, and the pipeline's
problems (on memfit key paths) mapped through the origins to the native key each came from; a
problem inside a referenced file (a DeepSpeed JSON, a launch config, the model's config.json) is
placed there and linked from the key that names it."""

from __future__ import annotations

import os

from memfit.diagnostics import codes
from memfit.diagnostics.diagnostic import FILE_START, Diagnostic
from memfit.read.native.base import At, Native

NO_BUDGET_HINT = "no memory budget: pass --device PRESET or --budget BYTES, or set device or budget in [tool.memfit] (pyproject.toml) or a memfit.toml beside the config"


def origin(native: Native, path: tuple) -> At:
    """The native node a memfit key path comes from: the longest prefix with an origin."""
    for i in range(len(path), 0, -1):
        found = native.origins.get(path[:i])
        if found is not None:
            return found
    return native.root


def place(native: Native, text: str, path: str, problems) -> list[Diagnostic]:
    """Every problem as a positioned diagnostic: `problems` are the pipeline's (memfit paths)."""
    from memfit.read import source

    wanted: dict[str | None, set] = {}
    items = []  # (At, level, code, message, file override, range override, at-in-file)

    def need(at: At) -> None:
        wanted.setdefault(at.file, set()).add((at.path, "key" if at.on_key or not at.path else "value"))

    for found in native.found:
        items.append((found.at, found.level, found.code, found.message, found.range, None))
        if found.range is None:
            need(found.at)
        if found.at.file is not None and found.at.file in native.refs:
            need(native.refs[found.at.file])
    for problem in problems:
        at = origin(native, problem.path)
        message = NO_BUDGET_HINT if problem.code == codes.NO_BUDGET else problem.message
        if problem.file is not None:  # inside the model's config.json: placed there, linked from the native key
            items.append((at, problem.level, problem.code, message, problem.at or FILE_START, problem.file))
        else:
            items.append((at, problem.level, problem.code, message, None, None))
        need(at)
    ranges: dict = {}
    for file, requests in wanted.items():
        body = text if file is None else native.texts.get(file)
        if body is None:
            continue
        located = source.locate(body, requests)
        for request, where in located.items():
            ranges[(file, request)] = where

    def where(at: At):
        return ranges.get((at.file, (at.path, "key" if at.on_key or not at.path else "value")), FILE_START)

    out = []
    for at, level, code, message, fixed, other in items:
        if other is not None:  # the model's config.json
            related = where(at) if at.file is None else where(native.refs.get(at.file, native.root))
            out.append(Diagnostic(fixed, level, code, message, file=other, related=related))
        elif at.file is None:
            out.append(Diagnostic(fixed or where(at), level, code, message))
        else:
            ref = native.refs.get(at.file)
            related = where(ref) if ref is not None and ref.file is None else where(native.root)
            out.append(Diagnostic(fixed or where(at), level, code, message, file=_shown(at.file, path), related=related))
    out.sort(key=lambda d: (d.file is not None, d.range.start_line, d.range.start_character))
    return out


def _shown(file: str, path: str) -> str:
    """A referenced file's path as the checked path is given (relative stays relative)."""
    if os.path.isabs(file) or path.startswith("<"):
        return file
    return os.path.normpath(file)

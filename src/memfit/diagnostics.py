"""Diagnostics as a language server has them: a 0-based range, a severity, a stable code
(see codes.py), a message, and, for a problem inside another file (a model's config.json),
that file and where the checked file refers to it."""

from __future__ import annotations

from dataclasses import dataclass

from .codes import ERROR, WARNING, lookup

__all__ = ["ERROR", "WARNING", "FILE_START", "Range", "Diagnostic", "Problem"]


@dataclass(frozen=True, slots=True)
class Range:
    start_line: int
    start_character: int
    end_line: int
    end_character: int

    def to_json(self) -> dict:
        return {
            "start": {"line": self.start_line, "character": self.start_character},
            "end": {"line": self.end_line, "character": self.end_character},
        }

    def contains(self, line: int, character: int) -> bool:
        return (self.start_line, self.start_character) <= (line, character) <= (self.end_line, self.end_character)


FILE_START = Range(0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class Diagnostic:
    range: Range  # in `file` when it is set, else in the checked file
    severity: str
    code: str
    message: str
    file: str | None = None  # the file the problem is in, when it is not the checked file
    related: Range | None = None  # then: the key of the checked file that refers to `file`

    def to_json(self) -> dict:
        out = {"range": self.range.to_json(), "severity": self.severity, "code": self.code, "message": self.message}
        if self.file is not None:
            out["file"] = self.file
            if self.related is not None:
                out["related"] = self.related.to_json()
        return out


def diagnostic(range: Range, code: str, message: str, **where) -> Diagnostic:
    """A diagnostic at the severity the registry gives its code."""
    return Diagnostic(range, lookup(code).severity, code, message, **where)


# A problem found before positions are known: the path of the YAML node it concerns,
# and whether it is about the mapping key at that path rather than its value. `file` and
# `at`: a problem inside a referenced file, at `at` there; `path` is then the referencing key.
@dataclass(frozen=True, slots=True)
class Problem:
    path: tuple
    code: str
    message: str
    severity: str | None = None  # None: the code's default severity
    on_key: bool = False
    file: str | None = None
    at: Range | None = None

    @property
    def level(self) -> str:
        return self.severity or lookup(self.code).severity

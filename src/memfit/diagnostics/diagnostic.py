"""Diagnostics as a language server has them: a 0-based range, a severity, a stable code
(see codes.py), a message, and, for a problem inside another file (a model's config.json),
that file and where the checked file refers to it."""

from __future__ import annotations

from memfit.diagnostics.codes import ERROR, WARNING, lookup
from memfit.diagnostics.records import record

__all__ = ["ERROR", "FILE_START", "WARNING", "Diagnostic", "Problem", "Range"]


@record(frozen=True, slots=True)
class Range:
    """A span of a file: zero-based lines and characters, as the language server counts them."""

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
MESSAGE_LIMIT = 1000


def clip_middle(message: str, limit: int = MESSAGE_LIMIT) -> str:
    """The start and the end of a long message (where the value and the advice are), the middle cut."""
    head, tail = limit * 6 // 10, limit * 3 // 10
    return f"{message[:head]}… ({len(message) - head - tail:,} characters cut) …{message[-tail:]}"


@record(frozen=True, slots=True)
class Diagnostic:
    """One problem as memfit reports it: where it is, its severity, its code and its message."""

    range: Range  # in `file` when it is set, else in the checked file
    severity: str
    code: str
    message: str
    # the file the problem is in, when it is not the checked file: a path as the checked path is
    # given (joined onto the checked file's directory by whoever reads the reference), so the CLI
    # shows it as the user would open it and the language server (absolute paths) can link it
    file: str | None = None
    related: Range | None = None  # then: the key of the checked file that refers to `file`

    def __post_init__(self) -> None:
        # A message may quote a value from the config; whatever the raise site, a long one is cut
        # here, the one place every message passes: a small file gives a small report.
        if len(self.message) > MESSAGE_LIMIT:
            object.__setattr__(self, "message", clip_middle(self.message))

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
@record(frozen=True, slots=True)
class Problem:
    """A problem before positions are known (above: what its path, file and `at` say)."""

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

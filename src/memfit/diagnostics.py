"""Diagnostics as a language server has them: a 0-based range, a severity, a stable code, a message."""

from __future__ import annotations

from dataclasses import dataclass

ERROR = "error"
WARNING = "warning"
INFORMATION = "information"


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
    range: Range
    severity: str
    code: str
    message: str

    def to_json(self) -> dict:
        return {"range": self.range.to_json(), "severity": self.severity, "code": self.code, "message": self.message}


# A problem found before positions are known: the path of the YAML node it concerns,
# and whether it is about the mapping key at that path rather than its value.
@dataclass(frozen=True, slots=True)
class Problem:
    path: tuple
    code: str
    message: str
    severity: str = ERROR
    on_key: bool = False

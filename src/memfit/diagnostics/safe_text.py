"""Text from a config (names, values, file names) on its way to a person: escaped and cut short.

A config is untrusted input. Printed raw, a name holding ESC sequences sets the terminal's title or
clears the screen, a newline starts a `::error` workflow command in a CI log, a bidirectional
override reorders what a reviewer reads, and a 1 MB value echoed a thousand times is a 1 GB report.
Every human-facing output (text, explain, the Markdown summary) passes such text through here;
the machine formats escape by their own rules (JSON, SARIF, GitHub's workflow-command encoding).
"""

from __future__ import annotations

import re

ECHO_LIMIT = 120  # characters of a value quoted back in a message

# C0 controls but tab, DEL, C1 controls, line/paragraph separators, bidirectional embeddings,
# overrides and isolates, BOM/zero-width no-break space, and lone surrogates (a file name that is
# not UTF-8 reaches Python as U+DC80..U+DCFF; a strict UTF-8 stream refuses to write it)
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ufeff\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\x1b": "\\x1b", "\x00": "\\0"}
_MARKDOWN_PUNCTUATION = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~&\"'=:$])")


def _escape(match: re.Match) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, as surrogateescape keeps it
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """The text with every character that could act on a terminal or a log escaped, Python-style."""
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text


def clip(text: str, limit: int = ECHO_LIMIT) -> str:
    """At most `limit` characters, saying how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters)"


def echo(value) -> str:
    """A value from the config, quoted back in a message: cut short, then made printable."""
    text = value if isinstance(value, str) else _short_repr(value)
    return printable(clip(text))


def _short_repr(value) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 1000:
        # repr() of a long int is quadratic and refused past 4,300 digits: say how long it is instead
        return f"an integer of about {value.bit_length() * 30103 // 100000:,} digits"
    return repr(value)


def markdown_text(text: str) -> str:
    """Text for a Markdown table cell (GitHub's job summary): printable, with every character
    Markdown or HTML could read as syntax backslash-escaped, so a `|` cannot split the row and a
    `<script>` stays text."""
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", printable(text))


def markdown_code(text: str) -> str:
    """Text as a Markdown code span in a table cell: printable, `|` escaped (GFM splits cells on it
    even inside code spans), and a fence longer than any run of backticks inside."""
    text = printable(text).replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or longest else ""
    return f"{fence}{pad}{text}{pad}{fence}"


ELLIPSIS = "…"


def shape_text(shape, brackets: str = "[]") -> str:
    """[32, 20, 20] or, with brackets="()", Keras's (32, 20, 20)."""
    return brackets[0] + ", ".join(map(str, shape)) + brackets[1]


def cut(text: str, width: int) -> str:
    """At most `width` characters: a longer text ends in an ellipsis."""
    return text if len(text) <= width else text[: width - 1] + ELLIPSIS

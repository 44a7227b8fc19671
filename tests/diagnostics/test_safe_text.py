"""The escaping every human-facing output relies on, and the config decision the hook relies on."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from memfit.read.marker import is_marked
from memfit.diagnostics.safe_text import clip, echo, markdown_code, markdown_text, printable


@given(st.text())
def test_printable_leaves_nothing_a_terminal_or_a_log_would_act_on(text):
    out = printable(text)
    out.encode("utf-8")  # no lone surrogate left
    assert "\n" not in out and "\r" not in out and "\x1b" not in out
    assert not any(ord(c) < 0x20 and c != "\t" or 0x7F <= ord(c) <= 0x9F for c in out)
    assert not any(c in out for c in "\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


@given(st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E) | st.sampled_from("éλ語🙂\t")))
def test_printable_keeps_ordinary_text(text):
    assert printable(text) == text


def test_escapes_are_readable():
    assert printable("a\x1b]0;x\x07\n::error::b\u202e\udcff") == "a\\x1b]0;x\\x07\\n::error::b\\u202e\\xff"


def test_echo_cuts_long_values_short():
    assert len(echo("x" * 1_000_000)) < 200
    assert clip("abc", 5) == "abc"
    assert echo(10**5000) == "an integer of about 5,000 digits"


@given(st.text(max_size=40))
def test_markdown_cells_cannot_split_a_row_or_open_a_tag(text):
    for cell in (markdown_text(text), markdown_code(text)):
        unescaped_pipes = [i for i, c in enumerate(cell) if c == "|" and (i == 0 or cell[i - 1] != "\\")]
        assert not unescaped_pipes
        assert "\n" not in cell
    assert "<" not in markdown_text(text).replace("\\<", "")


def test_the_usual_marker_needs_no_parse():
    assert is_marked("memfit: 1\n" + "x: [\n" * 3)  # broken YAML, but a config: its errors are reported

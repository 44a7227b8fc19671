"""What a client does with the edits memfit offers (`--suggest`'s json, the editor's code actions)."""

from __future__ import annotations


def apply_edits(text: str, edits: list[dict]) -> str:
    """LSP-style edits (0-based lines and code-point columns of the original text), applied last first."""
    lines = text.split("\n")
    starts = [0]
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line) + 1)

    def offset(position):
        return starts[position["line"]] + position["character"]

    for edit in sorted(edits, key=lambda e: (e["range"]["start"]["line"], e["range"]["start"]["character"]), reverse=True):
        r = edit["range"]
        text = text[: offset(r["start"])] + edit["new_text"] + text[offset(r["end"]) :]
    return text

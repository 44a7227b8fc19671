"""docs/accuracy.md's published rows (issue 32): each row names a config file in tests/support/published/ whose header
cites the source (repository, file and commit) and the measured figure the table prints, so a published cell cannot
drift from the file that reproduces it; memfit's cells are held by tests/project/test_docs.py (tools/doc_tables.py)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT / "tests" / "support" / "published"


def rows() -> list[list[str]]:
    sys.path.insert(0, str(ROOT / "tools"))
    import doc_tables

    text = (ROOT / "docs" / "accuracy.md").read_text(encoding="utf-8")
    lines = text.split("\n")
    return [doc_tables.cells(line) for _, kind, _, start, end in doc_tables.found(text) if kind == "published" for line in lines[start:end]]


def test_each_published_row_is_its_config_files_measurement():
    found = rows()
    assert len(found) >= 43  # torchtune 13, transformers 9, LitGPT 12 + 9
    named = set()
    for row in found:
        name = re.fullmatch(r"\[`([\w.-]+)`\]\(\.\./tests/support/published/\1\)", row[1])[1]
        header = (PUBLISHED / name).read_text(encoding="utf-8").split("\nmodel:")[0]
        assert re.search(r"^# [\w-]+/[\w-]+ [\w./-]+ at [0-9a-f]{40}: ", header, re.M), name  # the source and its commit
        assert f"# measured: {row[2]}\n" in header + "\n", (name, row[2])
        named.add(name)
    assert named == {p.name for p in PUBLISHED.glob("*.yaml")}  # every config is a row of the page

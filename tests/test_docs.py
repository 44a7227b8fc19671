"""What a newcomer reads: the README's first screen is a quick start, every example is listed with
the numbers memfit prints for it, every relative link (README, docs/, the examples' comments)
points at a file and heading that exist, and every pinned version is the release tag."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    return {slug(h) for h in re.findall(r"^#+ (.*)$", text, re.MULTILINE)}


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # absolute URLs are not this test's business (no network)
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken


def test_files_named_in_the_examples_exist():
    for example in sorted((ROOT / "examples").rglob("*.yaml")):
        for name in re.findall(r"\b((?:docs|examples|schemas)/[\w./-]+\w)", example.read_text(encoding="utf-8")):
            assert (ROOT / name).exists() or (example.parent / name).exists(), f"{example.name} names {name}"


def test_the_first_screen_is_a_quick_start():
    head = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:25]
    assert "## Quick start" in head
    assert any(line.startswith("python3 -m venv .venv") and "memfit check" in line for line in head)


def test_the_examples_table_lists_every_example_with_its_numbers():
    from memfit.diagnostics.units import human

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Examples") :]
    section = section[: section.index("\n## ")]
    rows = dict(re.findall(r"^\| \[`([^`]+)`\]\([^)]+\) \| .* \| ([^|]+) \|$", section, re.MULTILINE))
    examples = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples").rglob("*.yaml"))
    assert sorted(rows) == examples
    report = subprocess.run(
        [sys.executable, "-m", "memfit", "check", "--format", "json", *examples], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    for entry in json.loads(report.stdout)["files"]:
        assert rows[entry["path"]].strip() == f"{human(entry['footprint']['total'])} / {human(entry['budget'])}", entry["path"]


def test_pinned_versions_are_the_release_tag():
    from memfit import __version__

    tag = f"v{__version__}"
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert "<tag>" not in text, page
        for pin in re.findall(r"^\s*rev: (\S+)$", text, re.MULTILINE) + re.findall(r"(?:memfit|git URL>)@(v[\w.]+)", text):
            assert pin == tag, f"{page.relative_to(ROOT)} pins {pin}, the release tag is {tag} (docs/releasing.md)"

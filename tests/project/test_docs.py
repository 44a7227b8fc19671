"""What a newcomer reads: the README's first screen is a quick start, every example is listed with
the numbers memfit prints for it, every relative link (README, docs/, the examples' comments)
points at a file and heading that exist, and every pinned version is the release tag."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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
        peak = entry.get("peak")  # the gate compares a run's peak, else the total
        needs = peak["bytes"] if peak else entry["footprint"]["total"]
        assert rows[entry["path"]].strip() == f"{human(needs)} / {human(entry['budget'])}", entry["path"]


def test_pins_work_today():
    """A pin names something that exists: `<commit-SHA>` (the user writes one, or `pre-commit autoupdate` does),
    or the release tag of this version only once that tag exists in the repository (docs/releasing.md)."""
    from memfit import __version__

    tag = f"v{__version__}"
    tagged = subprocess.run(["git", "tag", "--list", tag], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip() == tag
    allowed = {"<commit-SHA>"} | ({tag} if tagged else set())
    found = 0
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert "<tag>" not in text, page
        pins = re.findall(r"^\s*rev: (<commit-SHA>|\S+)", text, re.MULTILINE) + re.findall(r"(?:/memfit|git URL>)@(<commit-SHA>|[\w.]+)", text)
        for pin in pins:
            found += 1
            assert pin in allowed, f"{page.relative_to(ROOT)} pins {pin}, which does not exist (allowed: {sorted(allowed)}; docs/releasing.md)"
    assert found >= 6  # the README's and docs' pre-commit, pip, Action and GitLab snippets

def _sync_docs():
    import importlib.util

    spec = importlib.util.spec_from_file_location("sync_docs", ROOT / "tools" / "sync_docs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sync_docs"] = module
    spec.loader.exec_module(module)
    return module


def test_every_shown_output_is_what_the_program_prints():
    """Each marked block (tools/sync_docs.py) is rerun against the bundled examples; a page that differs
    fails with the diff. `python tools/sync_docs.py` rewrites them."""
    sync = _sync_docs()
    stale = [sync.diff(page, *sync.refresh(page)) for page in sync.pages()]
    stale = [d for d in stale if d]
    assert not stale, "pages differ from the program's output (run `python tools/sync_docs.py`):\n" + "\n".join(stale)


def test_the_pages_mark_their_command_outputs():
    """A block that shows `$ memfit ...` with its output is marked, so the test above reruns it. Blocks that
    show a run through other tools (pre-commit, git commit) are not memfit's output alone and are left out."""
    sync = _sync_docs()
    unmarked = []
    for page in sync.pages():
        lines = page.read_text(encoding="utf-8").split("\n")
        marked = {b.start - 1 for b in sync.blocks(page)}  # the fence line of each marked block
        fence = None
        for i, line in enumerate(lines):
            if line.strip().startswith("```"):
                fence = None if fence is not None else i
            elif fence is not None and line.strip().startswith("$ memfit ") and fence not in marked:
                if i + 1 < len(lines) and not lines[i + 1].strip().startswith("```"):
                    unmarked.append(f"{page.relative_to(ROOT)}:{i + 1}: {line.strip()}")
    assert not unmarked, unmarked


def test_the_sync_tool_rewrites_a_stale_block(tmp_path):
    """The rewrite is real: a page with a wrong figure in a marked block comes back with the program's (the page is
    written in a scratch directory, never into the checkout)."""
    sync = _sync_docs()
    page = tmp_path / "_sync_probe.md"
    page.write_text(
        "# probe\n\n<!-- memfit-docs run -->\n```text\n$ memfit check examples/atari-cnn.yaml\nexamples/atari-cnn.yaml: total 1.00 MiB\n```\n",
        encoding="utf-8",
    )
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "sync_docs.py"), "--check", str(page)], capture_output=True, text=True, check=False)
    assert done.returncode == 1 and "-examples/atari-cnn.yaml: total 1.00 MiB" in done.stdout, done.stdout + done.stderr
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "sync_docs.py"), str(page)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    text = page.read_text(encoding="utf-8")
    # the Atari CNN: 3,356,322 float32 parameters with Adam (4 + 4 + 8 bytes each) + 6,619,392 B of
    # activations (docs/layers.md derives both by hand) = 60,320,544 B = 57.53 MiB, against 2 GiB
    assert "total 57.53 MiB of 2.00 GiB" in text and 3_356_322 * 16 + 6_619_392 == 60_320_544
    assert sync.diff(page, *sync.refresh(page)) == ""


def _doc_tables():
    return _sync_docs()._doc_tables()


def test_every_measurement_table_prints_what_memfit_prints():
    """memfit's cells of every marked measurement table (tools/doc_tables.py: peak.md's MemTracker tables,
    parallel.md's DeepSpeed and Korthikanti tables) are what `memfit check` prints for the row's config, to the byte;
    the reference cells are asserted by the tests that run the reference (test_peak.py, test_deepspeed_configs.py,
    test_korthikanti_configs.py). `python tools/doc_tables.py` rewrites them."""
    import needs

    needs.module("torch"), needs.module("transformers")  # the tables' models are built from transformers configs
    tables = _doc_tables()
    marked = [p for p in tables.pages() if "memfit-docs table=" in p.read_text(encoding="utf-8")]
    assert {p.name for p in marked} >= {"peak.md", "parallel.md"}
    stale = tables.check(marked)
    assert not stale, "measurement tables differ from memfit's output (run `python tools/doc_tables.py`):\n" + stale


def test_the_table_tool_rewrites_a_drifted_figure(tmp_path):
    """A documented figure that drifts fails the check: Korthikanti's Table 2 at a small layer (the paper's bytes are
    the formula's, s = 64, b = 2, h = 64, a = 4, t = 2: sbh(10 + 24/2 + 5as/(ht)) = 8192 x (22 + 10) = 262,144 B),
    with memfit's cell one byte off; the rewrite puts memfit's figure back and the check is clean."""
    tables = _doc_tables()
    page = tmp_path / "probe.md"
    page.write_text(
        '# probe\n\n<!-- memfit-docs table="korthikanti" s="64" b="2" h="64" a="4" t="2" -->\n'
        "| recompute | sequence parallel | Table 2 | paper (bytes) | memfit (bytes) | difference |\n"
        "|---|---|---|---:|---:|---:|\n"
        "| none | no | sbh(10 + 24/t + 5as/(ht)) | 262,144 | 262,145 | 0 |\n", encoding="utf-8")
    assert 64 * 2 * 64 * (10 + 24 // 2 + 5 * 4 * 64 // (64 * 2)) == 262_144
    assert "-| none | no | sbh(10 + 24/t + 5as/(ht)) | 262,144 | 262,145 | 0 |" in tables.check([page])
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "doc_tables.py"), str(page)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    row = page.read_text(encoding="utf-8").splitlines()[-1]
    paper, ours = (int(c.replace(",", "")) for c in row.split("|")[4:6])
    # the paper leaves out each LayerNorm's fp32 mean and 1/std: 2 norms x 8 bytes per token (docs/parallel.md)
    assert paper == 262_144 and ours == paper + 2 * 8 * 64 * 2, row
    assert tables.check([page]) == ""

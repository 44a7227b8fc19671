"""Keep every command output shown in README.md and docs/*.md what the program prints.

A block of output in a page is preceded by a marker, an HTML comment (invisible on GitHub):

    <!-- memfit-docs run -->
    ```text
    $ memfit fit examples/gpt2-small.yaml
    examples/gpt2-small.yaml: micro_batch ≤ 20 fits ...
    ```

`run`: the block's `$ ` lines are the commands; what follows each, up to the next `$ ` line, is its output.

    <!-- memfit-docs cmd="memfit check --format json examples/x.yaml" select="files.0.peak" -->

`cmd="..."`: the whole block is that command's output (the command is named only in the marker: for JSON
shown in part). `select="a.0.b"` keeps one value of a JSON output (keys and list indices, dot-separated),
printed as JSON (a container on one line when that line is at most 100 characters, 130 for one holding only
numbers and strings, else one item a line).

`<!-- memfit-docs examples-table -->` before a Markdown table whose first cell links each example: its
last cell is rewritten to what `memfit check --format json` gives for that file, the figure the budget gate
compares (a run's peak, else the total) over the budget (tests/project/test_docs.py checks the same).

`setup="NAME"`: the commands run in a scratch directory made from `tests/docs_setups/NAME/` (its files
copied; `setup.sh` there, when present, is run first: it may `git init`, commit and edit, and install
memfit's pre-commit hook: `$MEMFIT_ROOT` is this tree, `$MEMFIT_PYTHON` this interpreter, which has pre-commit). Without it the
scratch directory holds links to the repository's `examples/`, `action.yml` and `README.md`. Either way
`memfit` is this tree's (src/ first on the path) and stdout and stderr are shown together, in order.

`<!-- memfit-docs table="KIND" ...-->` before a Markdown table of measured figures: tools/doc_tables.py rewrites
memfit's cells of it (this tool calls it, except from `refresh(page)` without `tables=True`).

    python tools/sync_docs.py            # rewrite every marked block from the program's real output
    python tools/sync_docs.py --check    # print the differences, exit 1 if any (what tests/project/test_docs.py runs)
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETUPS = ROOT / "tests" / "docs_setups"
LINKED = ("examples", "action.yml", "README.md")
MARKER = re.compile(r"^(?P<indent>[ \t]*)<!-- memfit-docs(?P<attrs>(?: [^>]*)?) -->[ \t]*$")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+)[\w-]*[ \t]*$")
ATTR = re.compile(r'([\w-]+)(?:="([^"]*)")?')
# A fixed author, committer and date: a setup's commits (and the short SHAs `memfit diff` prints) are the same
# on every run.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "memfit docs",
    "GIT_AUTHOR_EMAIL": "docs@memfit.invalid",
    "GIT_COMMITTER_NAME": "memfit docs",
    "GIT_COMMITTER_EMAIL": "docs@memfit.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


class DocsError(Exception):
    pass


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the marker
    attrs: dict[str, str]
    indent: str
    start: int  # index of the first content line
    end: int  # index of the closing fence
    lines: list[str]  # the content as written, indent removed

    def where(self) -> str:
        return f"{_name(self.page)}:{self.line}"


def _name(page: Path) -> str:
    """The page as the messages name it: relative to the repository when it is in it (a test's page is not)."""
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)


def blocks(page: Path, text: str | None = None) -> list[Block]:
    lines = (page.read_text(encoding="utf-8") if text is None else text).split("\n")
    found = []
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if not m:
            continue
        attrs = {k: v for k, v in ATTR.findall(m["attrs"])}
        j = i + 1
        if "examples-table" in attrs or "table" in attrs:
            k = j
            while k < len(lines) and lines[k].startswith("|"):
                k += 1
            found.append(Block(page, i + 1, attrs, "", j, k, lines[j:k]))
            continue
        while j < len(lines) and not lines[j].strip():
            j += 1
        fence = FENCE.match(lines[j]) if j < len(lines) else None
        if not fence:
            raise DocsError(f"{_name(page)}:{i + 1}: a memfit-docs marker must be followed by a fenced block")
        indent, close = fence["indent"], fence["indent"] + fence["fence"]
        k = j + 1
        while k < len(lines) and lines[k].rstrip() != close:
            k += 1
        if k == len(lines):
            raise DocsError(f"{_name(page)}:{j + 1}: the fenced block is not closed")
        content = [ln[len(indent) :] if ln.startswith(indent) else ln.lstrip() for ln in lines[j + 1 : k]]
        found.append(Block(page, i + 1, attrs, indent, j + 1, k, content))
    return found


def _shim(bindir: Path) -> dict[str, str]:
    """`memfit` on PATH runs this tree's code with this interpreter."""
    exe = bindir / "memfit"
    exe.write_text(f"#!{sys.executable}\nimport sys\nfrom memfit.cli.main import main\nsys.exit(main())\n", encoding="utf-8")
    exe.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "MEMFIT_", "GITHUB_", "CI"))}
    env.update(GIT_ENV)
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["NO_COLOR"] = "1"
    env["COLUMNS"] = "120"
    # pre-commit, for the pages' `git commit` scenes (tests/docs_setups/precommit-*): its own cache, no colour
    env["PRE_COMMIT_HOME"] = str(bindir.parent / "pre-commit-home")
    env["PRE_COMMIT_COLOR"] = "never"
    tool = bindir / "pre-commit"  # this interpreter's pre-commit (a test dependency), whatever PATH holds
    tool.write_text(f"#!{sys.executable}\nimport sys\nfrom pre_commit.main import main\nsys.exit(main())\n", encoding="utf-8")
    tool.chmod(0o755)
    return env


def _scratch(setup: str | None, work: Path, env: dict[str, str]) -> Path:
    cwd = work / "cwd"
    if setup is None:
        cwd.mkdir()
        for name in LINKED:
            (cwd / name).symlink_to(ROOT / name)
        return cwd
    source = SETUPS / setup
    if not source.is_dir():
        raise DocsError(f"no setup {setup!r} ({source.relative_to(ROOT)} does not exist)")
    shutil.copytree(source, cwd, symlinks=True)
    script = cwd / "setup.sh"
    if script.exists():
        env = dict(env, MEMFIT_ROOT=str(ROOT), MEMFIT_PYTHON=sys.executable)
        done = subprocess.run(["bash", "-euo", "pipefail", str(script)], cwd=cwd, env=env, capture_output=True, text=True, check=False)
        script.unlink(missing_ok=True)
        if done.returncode:
            raise DocsError(f"setup {setup!r} failed:\n{done.stdout}{done.stderr}")
    return cwd


def run(command: str, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, check=False
    )
    return done.stdout.rstrip("\n")


def compact(value, indent: int = 0, width: int = 100) -> str:
    """JSON with a container on one line when it fits, else one item a line."""
    flat = json.dumps(value, ensure_ascii=False)
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    leaf = not any(isinstance(v, (dict, list)) for v in items)  # scalars only: one line up to 130 characters
    if not isinstance(value, (dict, list)) or indent + len(flat) <= (130 if leaf else width) or not value:
        return flat
    pad = " " * (indent + 2)
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(k, ensure_ascii=False)}: {compact(v, indent + 2, width)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [f"{pad}{compact(v, indent + 2, width)}" for v in value]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def select(output: str, path: str, where: str) -> str:
    try:
        value = json.loads(output)
    except ValueError as exc:
        raise DocsError(f"{where}: select={path!r} needs JSON output: {exc}\n{output}") from None
    for part in path.split("."):
        try:
            value = value[int(part)] if isinstance(value, list) else value[part]
        except (KeyError, IndexError, ValueError):
            raise DocsError(f"{where}: {path!r}: no {part!r} in the output") from None
    return compact(value)


def render(block: Block, work: Path, env: dict[str, str]) -> list[str]:
    """The block's content as the program prints it now."""
    if "examples-table" in block.attrs:
        return examples_table(block.lines, env)
    if "table" in block.attrs:
        return block.lines  # a measurement table: tools/doc_tables.py rewrites it (refresh(tables=True))
    unknown = set(block.attrs) - {"run", "cmd", "select", "setup"}
    if unknown or ("run" in block.attrs) == ("cmd" in block.attrs):
        raise DocsError(f"{block.where()}: a marker takes `run` or cmd=\"...\" (and select=, setup=), not {sorted(block.attrs)}")
    scratch = work / f"b{block.line}"
    scratch.mkdir()
    cwd = _scratch(block.attrs.get("setup"), scratch, env)
    if "cmd" in block.attrs:
        out = run(block.attrs["cmd"], cwd, env)
        if "select" in block.attrs:
            out = select(out, block.attrs["select"], block.where())
        return out.split("\n")
    commands = [ln[2:] for ln in block.lines if ln.startswith("$ ")]
    if not commands:
        raise DocsError(f"{block.where()}: a `run` block needs `$ ` command lines")
    new = []
    for command in commands:
        new.append(f"$ {command}")
        out = run(command, cwd, env)
        if out:
            new.extend(out.split("\n"))
    return new


ROW = re.compile(r"^\| \[`([^`]+)`\]\([^)]+\) \|(.*)\| ([^|]+) \|$")


def gated_figure(entry: dict) -> int:
    """The figure the budget gate compares, as `check --format json` reports it: a run's peak, else the total."""
    peak = entry.get("peak")
    return peak["bytes"] if isinstance(peak, dict) else entry["footprint"]["total"]


def examples_table(lines: list[str], env: dict[str, str]) -> list[str]:
    from memfit.diagnostics.units import human

    paths = [m.group(1) for m in map(ROW.match, lines) if m]
    done = subprocess.run(
        [sys.executable, "-m", "memfit", "check", "--format", "json", *paths], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    figures = {e["path"]: f"{human(gated_figure(e))} / {human(e['budget'])}" for e in json.loads(done.stdout)["files"]}
    out = []
    for line in lines:
        m = ROW.match(line)
        out.append(line if m is None else line[: m.start(3)] + f"{figures[m.group(1)]} |")
    return out


def refresh(page: Path, tables: bool = False) -> tuple[str, str]:
    """The page as written and as it should be; with `tables`, its measurement tables too (tools/doc_tables.py:
    memfit's cells; that needs the frameworks the tables' models are built with)."""
    text = page.read_text(encoding="utf-8")
    lines = text.split("\n")
    found = blocks(page, text)
    if not found:
        return text, text
    with tempfile.TemporaryDirectory(prefix="memfit-docs-") as tmp:
        work = Path(tmp)
        bindir = work / "bin"
        bindir.mkdir()
        env = _shim(bindir)
        for block in reversed(found):
            new = render(block, work, env)
            lines[block.start : block.end] = [block.indent + ln if ln else ln for ln in new]
    new = "\n".join(lines)
    if tables and any("table" in b.attrs for b in found):
        new = _doc_tables().refresh_text(new)
    return text, new


def _doc_tables():
    import importlib.util

    if "doc_tables" not in sys.modules:
        spec = importlib.util.spec_from_file_location("doc_tables", ROOT / "tools" / "doc_tables.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["doc_tables"] = module
        spec.loader.exec_module(module)
    return sys.modules["doc_tables"]


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def diff(page: Path, old: str, new: str) -> str:
    name = _name(page)
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"{name} (the page)", f"{name} (the program)"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="print the differences and exit 1 if any; change nothing")
    parser.add_argument("pages", nargs="*", type=Path, help="pages (default: README.md and docs/*.md)")
    args = parser.parse_args(argv)
    stale = 0
    for page in [p.resolve() for p in args.pages] or pages():
        try:
            old, new = refresh(page, tables=True)
        except DocsError as exc:
            print(f"sync_docs: {exc}", file=sys.stderr)
            return 2
        if old == new:
            continue
        stale += 1
        if args.check:
            sys.stdout.write(diff(page, old, new))
        else:
            page.write_text(new, encoding="utf-8")
            print(f"rewrote {_name(page)}")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())

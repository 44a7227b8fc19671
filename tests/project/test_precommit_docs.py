"""docs/pre-commit.md's scenes (issue 22: docs that cannot go stale).

tools/sync_docs.py makes each `git commit` / `pre-commit run` block again in a scratch repository
(tests/docs_setups/precommit-*) with memfit's hook definition run from the checkout, and
tests/test_docs.py fails when the page differs. Here the same scenes are run through the real hook, as a
user installs it (`repo:` + `rev:` naming a commit, pre-commit cloning it and building its virtualenv with
pip), and every line the page shows must come out, but for what differs by construction: the commit's SHA
and the insertion count (the user's .pre-commit-config.yaml is not the scene's), and pre-commit's own
[INFO] lines about building its environment."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import needs
import wheelhouse
import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "pre-commit.md"
SHELL_COMMANDS = ("$ git commit", "$ pre-commit ")


def _sync_docs():
    import importlib.util

    spec = importlib.util.spec_from_file_location("sync_docs", ROOT / "tools" / "sync_docs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sync_docs"] = module
    spec.loader.exec_module(module)
    return module


def scenes() -> list:
    return [b for b in _sync_docs().blocks(PAGE) if b.attrs.get("setup", "").startswith("precommit-")]


def test_every_commit_and_hook_run_shown_in_the_pages_is_a_marked_block():
    """A block showing `$ git commit` or `$ pre-commit ...` with output is one sync_docs reruns (the pages'
    `$ memfit` blocks are held to this by tests/test_docs.py)."""
    sync = _sync_docs()
    unmarked = []
    for page in sync.pages():
        lines = page.read_text(encoding="utf-8").split("\n")
        marked = {b.start - 1 for b in sync.blocks(page)}
        fence = None
        for i, line in enumerate(lines):
            if line.strip().startswith("```"):
                fence = None if fence is not None else i
            elif fence is not None and line.strip().startswith(SHELL_COMMANDS) and fence not in marked:
                if i + 1 < len(lines) and not lines[i + 1].strip().startswith("```"):
                    unmarked.append(f"{page.relative_to(ROOT)}:{i + 1}: {line.strip()}")
    assert not unmarked, unmarked
    assert len(scenes()) == 3  # the refused commit, the one that goes through, the budget from the hook's args


def stable(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        if line.startswith(("[INFO]", "[WARNING]")):
            continue  # pre-commit building and caching its environment (the first run only)
        line = re.sub(r"^\[(\w+) \(root-commit\) [0-9a-f]{7,}\]", r"[\1 (root-commit) <sha>]", line)
        line = re.sub(r"\b\d+ insertions?\(\+\)", "<n> insertions(+)", line)
        out.append(line)
    return out


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    needs.module("pre_commit")
    if shutil.which("git") is None:
        needs.unavailable("git is not installed")
    base = tmp_path_factory.mktemp("precommit-docs-env")
    (base / "home").mkdir()
    clean = wheelhouse.offline({k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "PRE_COMMIT", "MEMFIT_"))})
    sync = _sync_docs()
    return {
        **clean,
        **sync.GIT_ENV,
        "HOME": str(base / "home"),
        "XDG_CONFIG_HOME": str(base / "home" / ".config"),
        "PRE_COMMIT_HOME": str(base / "pre-commit-cache"),
        "PRE_COMMIT_COLOR": "never",
        "NO_COLOR": "1",
        "MEMFIT_ROOT": str(ROOT),
        "MEMFIT_PYTHON": sys.executable,
    }


@pytest.fixture(scope="module")
def hook_repo(tmp_path_factory, env) -> tuple[Path, str]:
    """This checkout's files as they are now, committed to a scratch repository: what `rev:` names."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        needs.unavailable(f"{ROOT} is not a git checkout: {listed.stderr.strip()}")
    repo = tmp_path_factory.mktemp("memfit-hook-repo")
    for name in filter(None, listed.stdout.split("\0")):
        source = ROOT / name
        if not source.exists() and not source.is_symlink():
            continue
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, repo / name, follow_symlinks=False)
    for args in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-q", "--no-verify", "-m", "snapshot"]):
        done = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, env=env, capture_output=True, text=True, check=True).stdout.strip()
    return repo, sha


@pytest.mark.slow
@pytest.mark.parametrize("index", range(3))
def test_the_real_hook_prints_what_the_page_shows(tmp_path, env, hook_repo, index):
    block = scenes()[index]
    setup = ROOT / "tests" / "docs_setups" / block.attrs["setup"] / "setup.sh"
    work = tmp_path / "user-repo"
    work.mkdir()
    done = subprocess.run(["bash", "-euo", "pipefail", str(setup)], cwd=work, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    # the user's config: memfit's hook by repository and commit, with the scene's args
    scene = (work / ".pre-commit-config.yaml").read_text(encoding="utf-8")
    args = re.search(r"^\s*args: (.*)$", scene, re.MULTILINE)
    path, sha = hook_repo
    user = f"repos:\n  - repo: {path}\n    rev: {sha}\n    hooks:\n      - id: memfit\n" + (f"        args: {args.group(1)}\n" if args else "")
    (work / ".pre-commit-config.yaml").write_text(user, encoding="utf-8")
    subprocess.run(["git", "add", ".pre-commit-config.yaml"], cwd=work, env=env, check=True)
    command = block.lines[0][2:]
    assert block.lines[0].startswith("$ ") and command.startswith(("git commit", "pre-commit "))
    if command.startswith("pre-commit "):
        command = f"{sys.executable} -m pre_commit {command[len('pre-commit '):]}"
    ran = subprocess.run(["bash", "-c", command], cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900, check=False)
    shown = [line for line in block.lines[1:]]
    assert stable(ran.stdout.rstrip("\n").split("\n")) == stable(shown), ran.stdout
    # and what the page says happened did: refused commits leave no commit
    made = subprocess.run(["git", "rev-list", "--count", "HEAD"], cwd=work, env=env, capture_output=True, text=True, check=False)
    assert (made.returncode == 0) == ("Passed" in "\n".join(shown) and command.startswith("git commit"))

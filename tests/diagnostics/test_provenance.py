"""`memfit --version` names the commit (memfit is installed from git: the commit is what a pin names), and
SARIF's help links point at the docs in memfit's own repository at that commit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@memfit.invalid", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@memfit.invalid",
    "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
}


def _clone_of_the_source(tmp_path: Path, remote: str) -> tuple[Path, str]:
    """This tree's src/ committed in a scratch repository whose origin is `remote` (never contacted)."""
    repo = tmp_path / "memfit-clone"
    shutil.copytree(ROOT / "src", repo / "src", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, **GIT_ENV}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "snapshot"], ["remote", "add", "origin", remote]):
        assert subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, check=False).returncode == 0, args
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()
    return repo, sha


def _memfit(repo: Path, *args, cwd=ROOT):
    env = {**os.environ, "PYTHONPATH": str(repo / "src")}
    return subprocess.run([sys.executable, "-m", "memfit", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_version_prints_the_version_and_the_commit(tmp_path):
    from memfit import __version__

    repo, sha = _clone_of_the_source(tmp_path, "https://git.example.invalid/team/memfit.git")
    done = _memfit(repo, "--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"memfit {__version__} (commit {sha})"


def test_sarif_help_links_point_at_the_docs_at_that_commit(tmp_path):
    repo, sha = _clone_of_the_source(tmp_path, "git@git.example.invalid:team/memfit.git")
    done = _memfit(repo, "check", "--format", "sarif", "examples/over-budget/gpt2-medium-on-t4.yaml")
    driver = json.loads(done.stdout)["runs"][0]["tool"]["driver"]
    base = f"https://git.example.invalid/team/memfit/blob/{sha}"
    assert driver["informationUri"] == f"{base}/README.md"
    assert {rule["helpUri"] for rule in driver["rules"]} == {f"{base}/docs/cli.md#diagnostic-codes-stable"}
    # the page and its heading exist in the repository the link names
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert "\n## Diagnostic codes (stable)\n" in page

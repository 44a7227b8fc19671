"""Which memfit this is: its commit and the repository it came from, for `memfit --version` and for the
links SARIF gives to the docs (memfit is installed from git, not from a package index: the commit is
what a pin names).

Where they come from, first found wins:
1. a git checkout of memfit around the running source (a clone run in place, `pip install -e`);
2. pip's record of a VCS install (`pip install "memfit @ git+URL@SHA"`: PEP 610 `direct_url.json`,
   `vcs_info.commit_id` and the URL);
3. pip's record of an install from a local directory (`pip install .` in a clone): that directory's git
   checkout, as it is now.
None when none of these says (a copied tree, a wheel built elsewhere).
"""

from __future__ import annotations

import json
import re
import subprocess
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def origin() -> tuple[str | None, str | None]:
    """(commit SHA, repository URL), each None where unknown."""
    root = Path(__file__).resolve().parents[3]  # src/memfit/diagnostics/ -> the checkout's root
    if (root / ".git").exists() and (root / "src" / "memfit").is_dir():
        found = _git(root)
        if found[0]:
            return found
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        record = distribution("memfit").read_text("direct_url.json")
    except (ImportError, PackageNotFoundError, OSError):
        record = None
    if record:
        try:
            direct = json.loads(record)
        except ValueError:
            direct = {}
        url = direct.get("url") if isinstance(direct.get("url"), str) else None
        vcs = direct.get("vcs_info") if isinstance(direct.get("vcs_info"), dict) else {}
        if vcs.get("commit_id"):
            return str(vcs["commit_id"]), url
        if url and url.startswith("file://"):
            return _git(Path(url[len("file://") :]))
    return None, None


def _git(where: Path) -> tuple[str | None, str | None]:
    def run(*args):
        try:
            done = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=5, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None

    commit = run("rev-parse", "HEAD")
    return (commit, run("remote", "get-url", "origin")) if commit else (None, None)


def version_text(version: str) -> str:
    """`memfit --version`: the version and, where known, the commit."""
    commit, _ = origin()
    return f"memfit {version} (commit {commit})" if commit else f"memfit {version} (commit unknown: not installed from git)"


def web_base() -> str | None:
    """The repository's web address at this commit (https://host/owner/name/blob/SHA), for links to its
    docs; None when the repository or commit is unknown or not a web host."""
    commit, url = origin()
    if not commit or not url:
        return None
    url = re.sub(r"^git\+", "", url)
    match = re.match(r"^(?:https?://(?:[^@/]+@)?|git@|ssh://git@)([^/:]+)[:/](.+?)(?:\.git)?/?$", url)
    if not match:
        return None
    host, repo = match.groups()
    return f"https://{host}/{repo}/blob/{commit}"

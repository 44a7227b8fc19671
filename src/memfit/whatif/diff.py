"""`memfit diff REV [PATHS...]`: each config's footprint at a git revision beside the working
tree's, category by category. The revision's files are read from git's object store (what
`git show REV:path` prints, many at once through `git cat-file --batch`); nothing is checked
out. Paths are relative to the repository root. Every footprint comes from check()."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from fractions import Fraction

from memfit.check.pipeline import Options, Result, check
from memfit.recipe.costs import CATEGORIES
from memfit.read.inputs import YAML_SUFFIXES, decode, has_marker


class UsageError(Exception):
    """Bad input the command cannot start from (exit 2): not a repository, an unknown revision,
    a path outside the repository."""


def _git(args: list[str], cwd: str, data: bytes | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=cwd, input=data, capture_output=True, check=False)
    except FileNotFoundError:
        raise UsageError("git is not installed (memfit diff reads the revision with git)") from None


def repository(cwd: str) -> str:
    done = _git(["rev-parse", "--show-toplevel"], cwd)
    if done.returncode != 0:
        raise UsageError(f"{cwd} is not inside a git repository (memfit diff compares against a git revision)")
    return os.path.realpath(done.stdout.decode().strip())


def commit(root: str, rev: str) -> str:
    if rev.startswith("-"):
        raise UsageError(f"unknown revision {rev!r}")
    done = _git(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"], root)
    if done.returncode != 0:
        raise UsageError(f"unknown revision {rev!r}: not a commit in this repository (in CI, fetch it first, e.g. actions/checkout with fetch-depth: 0)")
    return done.stdout.decode().strip()


def relative(root: str, path: str, cwd: str) -> str:
    """A path given on the command line, relative to the repository root ('' for the root)."""
    full = os.path.realpath(os.path.join(cwd, path))
    inside = os.path.relpath(full, root)
    if inside == os.pardir or inside.startswith(os.pardir + os.sep) or os.path.isabs(inside):
        raise UsageError(f"{path}: outside the repository {root}")
    return "" if inside == os.curdir else inside.replace(os.sep, "/")


def _yaml(name: str) -> bool:
    return name.endswith(YAML_SUFFIXES)


def tree_files(root: str, rev: str) -> list[str]:
    done = _git(["ls-tree", "-r", "-z", "--name-only", rev], root)
    return [n for n in done.stdout.decode("utf-8", "surrogateescape").split("\0") if n and _yaml(n)]


def work_files(root: str) -> list[str]:
    """Tracked and untracked (not ignored) YAML files present in the working tree."""
    done = _git(["ls-files", "-z", "--cached", "--others", "--exclude-standard"], root)
    names = dict.fromkeys(n for n in done.stdout.decode("utf-8", "surrogateescape").split("\0") if n and _yaml(n))
    return [n for n in names if os.path.isfile(os.path.join(root, n))]


def blobs(root: str, rev: str, names: list[str]) -> dict[str, bytes]:
    """The files' bytes at the revision, in one git process."""
    if not names:
        return {}
    request = "".join(f"{rev}:{name}\n" for name in names).encode("utf-8", "surrogateescape")
    out = _git(["cat-file", "--batch"], root, request).stdout
    found, at = {}, 0
    for name in names:
        end = out.index(b"\n", at)
        header = out[at:end].split()
        at = end + 1
        if len(header) == 3 and header[1] == b"blob":
            size = int(header[2])
            found[name] = out[at : at + size]
            at += size + 1
    return found


@dataclass
class Side:
    result: Result | None = None  # None: the file is not there

    @property
    def footprint(self) -> dict | None:
        return self.result.footprint if self.result is not None else None


@dataclass
class Entry:
    path: str
    before: Side = field(default_factory=Side)
    after: Side = field(default_factory=Side)

    @property
    def delta(self) -> dict | None:
        before, after = self.before.footprint, self.after.footprint
        if (before is None and self.before.result is not None) or (after is None and self.after.result is not None):
            return None  # a side that is there but has no footprint: no honest difference
        before, after = before or {}, after or {}
        keys = [k for k in dict.fromkeys([*before, *after]) if isinstance(before.get(k, 0), int) and isinstance(after.get(k, 0), int)]
        return {k: after.get(k, 0) - before.get(k, 0) for k in keys}

    @property
    def growth(self) -> Fraction | None:
        """The total's growth as a share of the base total (None for an added or broken config)."""
        before, after = self.before.footprint, self.after.footprint
        if before is None or after is None or not before["total"]:
            return None
        return Fraction(after["total"] - before["total"], before["total"])

    def to_json(self) -> dict:
        entry = {"path": self.path, "before": self.before.footprint, "after": self.after.footprint, "delta": self.delta}
        diagnostics = [
            {**d.to_json(), "side": name}
            for name, side in (("before", self.before), ("after", self.after))
            if side.result is not None and side.footprint is None
            for d in side.result.diagnostics
        ]
        if diagnostics:
            entry["diagnostics"] = diagnostics
        return entry


@dataclass
class Comparison:
    base: str  # the revision as given
    commit: str
    entries: list

    def to_json(self) -> dict:
        return {"base": self.base, "files": [e.to_json() for e in self.entries]}


def compare(rev: str, paths: list[str], cwd: str | None = None, options: Options = Options()) -> Comparison:
    cwd = cwd or os.getcwd()
    root = repository(cwd)
    sha = commit(root, rev)
    wanted = [relative(root, p, cwd) for p in paths] or [""]
    at_rev, here = tree_files(root, sha), work_files(root)

    def under(prefix: str, names):
        return [n for n in names if not prefix or n == prefix or n.startswith(prefix + "/")]

    explicit = {w for w in wanted if w in at_rev or w in here or os.path.isfile(os.path.join(root, w))}
    names = sorted(dict.fromkeys([*explicit, *(n for w in wanted for n in under(w, at_rev)), *(n for w in wanted for n in under(w, here))]))
    old = blobs(root, sha, names)
    entries = []
    for name in names:
        entry = Entry(name)
        texts = {}
        if name in old:
            texts["before"] = old[name]
        full = os.path.join(root, name)
        if os.path.isfile(full):
            with open(full, "rb") as handle:
                texts["after"] = handle.read()
        # found by searching a directory: only memfit configs (as --skip-unrecognized decides), and
        # the native configs the settings include
        if name not in explicit and not any(has_marker(raw.decode("utf-8", "replace")) for raw in texts.values()) and not _included(full, options):
            continue
        if "before" in texts:
            entry.before = Side(_at_revision(texts["before"], name, root, sha, options))
        if "after" in texts:
            entry.after = Side(_checked(texts["after"], name, options, os.path.join(root, name)))
        entries.append(entry)
    for w in wanted:
        if w and w not in explicit and not under(w, names) and not os.path.isdir(os.path.join(root, w)):
            raise UsageError(f"{w}: no such file in the working tree or at {rev}")
    return Comparison(rev, sha, entries)


def _included(path: str, options: Options) -> bool:
    """A native config the settings' include globs name (read/native/settings.py)."""
    from memfit.read.native import settings

    return settings.included(path, settings.effective(path, options))


def _checked(raw: bytes, name: str, options: Options, where: str) -> Result:
    """check() on a file's bytes, as if at `where` (files it refers to are found beside it),
    reported under `name`."""
    text, problem = decode(raw)
    if problem is not None:
        return Result(name, [problem])
    try:
        result = check(text, where, options)
    except Exception as error:  # noqa: BLE001
        from memfit.check.pipeline import internal_error

        return Result(name, [internal_error(error)])
    result.path = name
    base = os.path.dirname(where)
    result.diagnostics = [_renamed(d, base, os.path.dirname(name)) for d in result.diagnostics]
    return result


def _renamed(d, base: str, name_dir: str):
    """A diagnostic placed in a referenced file: that file named relative to the repository root."""
    if getattr(d, "file", None) is None:
        return d
    import dataclasses

    inside = os.path.relpath(d.file, base)
    return dataclasses.replace(d, file=os.path.normpath(os.path.join(name_dir, inside)).replace(os.sep, "/"))


def _native_references(raw: bytes, name: str, root: str, options: Options) -> list[str]:
    """A native config's other files inside the repository (its model's config.json, DeepSpeed
    JSON, launch config, found as the working tree lays them out) and the settings files above
    it: what its check at the revision must read as they were there."""
    current = _checked(raw, name, options, os.path.join(root, name))
    out = []
    for full in current.references:
        rel = os.path.relpath(full, root)
        if not rel.startswith(os.pardir) and not os.path.isabs(rel):
            out.append(rel.replace(os.sep, "/"))
    here = os.path.dirname(name)
    while True:
        out += [os.path.join(here, settings).replace(os.sep, "/") for settings in ("memfit.toml", "pyproject.toml")]
        if not here:
            return out
        here = os.path.dirname(here)


def _at_revision(raw: bytes, name: str, root: str, sha: str, options: Options) -> Result:
    """The config as it was at the revision, with the files it refers to (hf_config) as they
    were there too: both are written to a scratch directory, laid out as in the repository,
    and checked from there (git's object store is read; nothing is checked out)."""
    import tempfile

    from memfit.whatif.fit import referenced
    from memfit.read.source import load

    text, problem = decode(raw)
    data = load(text).data if problem is None else None
    files = referenced(data, name) if isinstance(data, dict) else {}
    inside = [f.replace(os.sep, "/") for f in files.values() if not os.path.isabs(f) and not f.startswith(os.pardir)]
    if isinstance(data, dict) and "memfit" not in data:
        inside += _native_references(raw, name, root, options)
    if not inside:
        return _checked(raw, name, options, os.path.join(root, name))
    with tempfile.TemporaryDirectory(prefix="memfit-diff-") as scratch:
        for file, content in {name: raw, **blobs(root, sha, inside)}.items():
            target = os.path.join(scratch, file)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as handle:
                handle.write(content)
        return _checked(raw, name, options, os.path.join(scratch, name))


def parse_share(text: str) -> Fraction:
    """'5%' (or '5') -> 1/20."""
    from decimal import Decimal, InvalidOperation

    number = text.strip().removesuffix("%").strip()
    try:
        share = Fraction(Decimal(number))
    except (InvalidOperation, ValueError):
        raise ValueError(f"{text!r} is not a percentage, e.g. '5%'") from None
    if share < 0:
        raise ValueError(f"{text!r} must not be negative")
    return share / 100


def grown(comparison: Comparison, limit: Fraction) -> list:
    return [e for e in comparison.entries if e.growth is not None and e.growth > limit]


# --- reporters ---------------------------------------------------------------------------


def _signed(n: int) -> str:
    from memfit.diagnostics.units import human

    return ("+" if n > 0 else "") + human(n) if n else "±0"


def _share(entry: Entry) -> str:
    growth = entry.growth
    if growth is None:
        return ""
    tenths = round(growth * 1000)
    return f"{'+' if tenths > 0 else '-' if tenths < 0 else '±'}{abs(tenths) // 10}.{abs(tenths) % 10}%"


def _order(entries) -> list:
    """Largest growth first; configs without a difference (broken on a side) last."""
    return sorted(entries, key=lambda e: (e.delta is None, -(e.delta or {}).get("total", 0), e.path))


class TextReporter:
    def __init__(self, out) -> None:
        self.out = out

    def report(self, comparison: Comparison) -> None:
        from memfit.report.reporters import diagnostic_line
        from memfit.diagnostics.units import human

        write = self.out.write
        write(f"memfit diff: working tree against {comparison.base} ({comparison.commit[:12]})\n")
        for e in comparison.entries:
            before, after, delta = e.before.footprint, e.after.footprint, e.delta
            if e.before.result is None:
                head = f"added, {human(after['total'])}" if after is not None else "added, no footprint"
            elif e.after.result is None:
                head = f"removed (was {human(before['total'])})" if before is not None else "removed"
            elif delta is None:
                head = f"{human(before['total']) if before else 'no footprint'} → {human(after['total']) if after else 'no footprint'}"
            elif not any(delta.values()):
                head = f"{human(after['total'])}, unchanged"
            else:
                head = f"{human(before['total'])} → {human(after['total'])} ({_signed(delta['total'])}, {_share(e)})"
            write(f"{e.path}: {head}\n")
            if delta is not None and e.before.result is not None and e.after.result is not None:
                for category in CATEGORIES:
                    if delta.get(category):
                        write(f"  {category:<16} {_signed(delta[category])}\n")
            for name, side in (("before", e.before), ("after", e.after)):
                if side.result is not None and side.footprint is None:
                    where = comparison.base if name == "before" else "the working tree"
                    write(f"  no footprint at {where}:\n")
                    for d in side.result.diagnostics:
                        write(f"  {diagnostic_line(e.path, d)}\n")
        if not comparison.entries:
            write("no memfit configs at either side\n")


class JsonReporter:
    def __init__(self, out) -> None:
        self.out = out

    def report(self, comparison: Comparison) -> None:
        import json

        json.dump(comparison.to_json(), self.out, indent=2)
        self.out.write("\n")


class MarkdownReporter:
    """A table for a pull-request comment or a job summary, largest growth first."""

    def __init__(self, out) -> None:
        self.out = out

    def report(self, comparison: Comparison) -> None:
        from memfit.diagnostics.units import human

        def cell(side: Side) -> str:
            if side.result is None:
                return "—"
            return human(side.footprint["total"]) if side.footprint is not None else "❌ no footprint"

        lines = [
            f"### memfit: memory against `{comparison.base}`",
            "",
            "| config | before | after | change | " + " | ".join(CATEGORIES) + " |",
            "| --- | ---: | ---: | ---: | " + " | ".join("---:" for _ in CATEGORIES) + " |",
        ]
        for e in _order(comparison.entries):
            delta = e.delta
            if e.before.result is None:
                change = "added"
            elif e.after.result is None:
                change = "removed"
            elif delta is None:
                change = "—"
            else:
                change = _signed(delta["total"]) + (f" ({_share(e)})" if _share(e) else "")
            parts = [_signed(delta.get(c, 0)) if delta is not None else "—" for c in CATEGORIES]
            name = f"`{e.path}`".replace("|", "\\|")
            lines.append(f"| {name} | {cell(e.before)} | {cell(e.after)} | {change} | " + " | ".join(parts) + " |")
        if not comparison.entries:
            lines.append("| (no memfit configs) | | | | " + " | ".join("" for _ in CATEGORIES) + " |")
        self.out.write("\n".join(lines) + "\n\n")


REPORTERS = {"text": TextReporter, "json": JsonReporter, "markdown": MarkdownReporter}

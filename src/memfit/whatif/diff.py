"""`memfit diff REV [PATHS...]`: each config's footprint at a git revision beside the working
tree's, category by category. The revision's files are read from git's object store (what
`git show REV:path` prints, many at once through `git cat-file --batch`); nothing is checked
out. Paths are relative to the repository root. Every footprint comes from check()."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from fractions import Fraction

from memfit.check.pipeline import Options, Result, check
from memfit.check.pipeline import gated
from memfit.diagnostics.safe_text import printable
from memfit.read.inputs import YAML_SUFFIXES, decode, has_marker, read_bytes
from memfit.report.commands import REPORTERS as COMMANDS


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


@dataclass(frozen=True)
class Blob:
    """A file in the revision's tree, as `git ls-tree -r -l -z` lists it."""

    mode: str
    oid: str
    size: int | None  # None for what is not a blob (a submodule)


def tree(root: str, rev: str) -> dict[str, Blob]:
    """Every file at the revision: name -> Blob. NUL-separated (-z), so no name can split a record."""
    done = _git(["ls-tree", "-r", "-l", "-z", "--full-tree", "--end-of-options", rev], root)
    if done.returncode != 0:
        raise UsageError(f"cannot list the files at {rev}: {done.stderr.decode('utf-8', 'replace').strip()[:200]}")
    out: dict[str, Blob] = {}
    for record in done.stdout.split(b"\0"):
        if not record:
            continue
        meta, tab, name = record.partition(b"\t")
        fields = meta.split()
        if not tab or len(fields) != 4:
            raise UsageError(f"git ls-tree printed a record memfit cannot read: {record[:80]!r}")
        mode, kind, oid, size = (f.decode("ascii", "replace") for f in fields)
        if not _OID.fullmatch(oid):
            raise UsageError(f"git ls-tree printed an object name memfit cannot read: {oid[:80]!r}")
        out[name.decode("utf-8", "surrogateescape")] = Blob(mode, oid, int(size) if kind == "blob" and size.isdigit() else None)
    return out


_OID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def tree_files(root: str, rev: str) -> list[str]:
    return [n for n in tree(root, rev) if _yaml(n)]


def work_files(root: str) -> list[str]:
    """Tracked and untracked (not ignored) YAML files present in the working tree."""
    done = _git(["ls-files", "-z", "--cached", "--others", "--exclude-standard"], root)
    names = dict.fromkeys(n for n in done.stdout.decode("utf-8", "surrogateescape").split("\0") if n and _yaml(n))
    return [n for n in names if os.path.lexists(os.path.join(root, n))]


def blobs(root: str, objects: list[str]) -> dict[str, bytes]:
    """Blobs' bytes by object name, in one git process. Only object names (hex) are written to git,
    one a line, and each answer must name the object asked for, be a blob and have its size."""
    wanted = list(dict.fromkeys(objects))
    if not wanted:
        return {}
    for oid in wanted:
        if not _OID.fullmatch(oid):
            raise ValueError(f"not an object name: {oid[:80]!r}")
    out = _git(["cat-file", "--batch"], root, "".join(f"{oid}\n" for oid in wanted).encode("ascii")).stdout
    found, at = {}, 0
    for oid in wanted:
        end = out.find(b"\n", at)
        if end < 0:
            raise UsageError(f"git cat-file stopped before object {oid}")
        header = out[at:end].split()
        at = end + 1
        if len(header) != 3 or header[0].decode("ascii", "replace") != oid or header[1] != b"blob" or not header[2].isdigit():
            raise UsageError(f"git cat-file answered {out[at - 1 - len(out[at:end]) : end][:80]!r} for object {oid}")
        size = int(header[2])
        if out[at + size : at + size + 1] != b"\n":
            raise UsageError(f"git cat-file's answer for object {oid} is not {size} bytes long")
        found[oid] = out[at : at + size]
        at += size + 1
    return found


def _revision_file(root: str, name: str, entry: Blob | None, rev: str, limit: int) -> tuple[bytes | None, object]:
    """(bytes, None) of a regular file at the revision, or (None, an io diagnostic) as check's inputs would say."""
    from memfit.diagnostics import codes
    from memfit.diagnostics.diagnostic import FILE_START, diagnostic

    shown = printable(name)
    if entry is None:
        return None, diagnostic(FILE_START, codes.IO, f"cannot read {shown} at {printable(rev)}: no such file")
    if entry.mode == "120000":
        return None, diagnostic(FILE_START, codes.IO, f"cannot read {shown} at {printable(rev)}: it is a symbolic link, not a regular file")
    if entry.size is None or entry.mode not in ("100644", "100755"):
        return None, diagnostic(FILE_START, codes.IO, f"cannot read {shown} at {printable(rev)}: it is not a regular file")
    if entry.size > limit:
        return None, diagnostic(
            FILE_START, codes.IO,
            f"cannot read {shown} at {printable(rev)}: it is {entry.size:,} bytes, over the {limit:,}-byte limit on a config (raise it with --max-file-size)",
        )
    return blobs(root, [entry.oid])[entry.oid], None


STATUSES = ("pass", "fail", "error")  # a side's verdict: fits its budget, does not (an error such as budget-exceeded), no footprint


@dataclass
class Side:
    result: Result | None = None  # None: the file is not there

    @property
    def footprint(self) -> dict | None:
        return self.result.footprint if self.result is not None else None

    @property
    def peak(self) -> dict | None:
        return self.result.peak if self.result is not None and self.result.footprint is not None else None

    @property
    def gated(self) -> int | None:
        """The figure the budget gate compares (check.pipeline.gated): the run's peak, else the total."""
        return gated(self.result) if self.result is not None and self.result.footprint is not None else None

    @property
    def status(self) -> str | None:
        if self.result is None:
            return None
        if self.result.footprint is None:
            return "error"
        return "fail" if self.result.failed else "pass"


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
    def gated_delta(self) -> int | None:
        """after − before of the gated figure (an added config's is its figure, a removed one's the negative)."""
        if (self.before.result is not None and self.before.gated is None) or (self.after.result is not None and self.after.gated is None):
            return None
        return (self.after.gated or 0) - (self.before.gated or 0)

    @property
    def label(self) -> str:
        """What the gated figure is: "peak" when a side is a run (a training section), else "total"."""
        return "peak" if self.before.peak is not None or self.after.peak is not None else "total"

    @property
    def growth(self) -> Fraction | None:
        """The gated figure's growth as a share of the base's (None for an added or broken config)."""
        before, after = self.before.gated, self.after.gated
        if before is None or after is None or not before:
            return None
        return Fraction(after - before, before)

    @property
    def newly_failing(self) -> bool:
        """A config that passed its budget gate at the revision and fails it now."""
        return self.before.status == "pass" and self.after.status == "fail"

    def to_json(self) -> dict:
        entry = {"path": self.path, "before": self.before.footprint, "after": self.after.footprint, "delta": self.delta}
        entry["before_peak"], entry["after_peak"] = self.before.peak, self.after.peak
        entry["gated"] = {"figure": self.label, "before": self.before.gated, "after": self.after.gated, "delta": self.gated_delta}
        entry["status"] = {"before": self.before.status, "after": self.after.status}
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
    listing = tree(root, sha)
    at_rev, here = [n for n in listing if _yaml(n)], work_files(root)

    def under(prefix: str, names):
        return [n for n in names if not prefix or n == prefix or n.startswith(prefix + "/")]

    explicit = {w for w in wanted if w in listing or w in here or os.path.lexists(os.path.join(root, w)) and not os.path.isdir(os.path.join(root, w))}
    names = sorted(dict.fromkeys([*explicit, *(n for w in wanted for n in under(w, at_rev)), *(n for w in wanted for n in under(w, here))]))
    limit = options.max_file_size
    small = [listing[n].oid for n in names if n in listing and listing[n].size is not None and listing[n].size <= limit and listing[n].mode in ("100644", "100755")]
    old = blobs(root, small)  # one git process for every file at the revision
    entries = []
    for name in names:
        entry = Entry(name)
        texts, problems = {}, {}
        if name in listing:
            known = listing[name]
            if known.oid in old and known.mode in ("100644", "100755"):
                texts["before"] = old[known.oid]
            else:
                problems["before"] = _revision_file(root, name, known, rev, limit)[1]
        full = os.path.join(root, name)
        if os.path.lexists(full):
            raw, problem = read_bytes(full, limit)  # check's input checks: a regular file, at most the limit
            if problem is not None:
                problems["after"] = _renamed_io(problem, full, name)
            else:
                texts["after"] = raw
        # found by searching a directory: only memfit configs (as --skip-unrecognized decides) and the
        # native configs the settings include; a file that cannot be read is reported (it may be one)
        if name not in explicit and not problems and not any(has_marker(raw.decode("utf-8", "replace")) for raw in texts.values()) and not _included(full, options):
            continue
        if "before" in texts:
            entry.before = Side(_at_revision(texts["before"], name, root, listing, options))
        elif "before" in problems:
            entry.before = Side(Result(name, [problems["before"]]))
        if "after" in texts:
            entry.after = Side(_checked(texts["after"], name, options, os.path.join(root, name)))
        elif "after" in problems:
            entry.after = Side(Result(name, [problems["after"]]))
        entries.append(entry)
    for w in wanted:
        if w and w not in explicit and not under(w, names) and not os.path.isdir(os.path.join(root, w)):
            raise UsageError(f"{printable(w)}: no such file in the working tree or at {printable(rev)}")
    return Comparison(rev, sha, entries)


def _renamed_io(problem, full: str, name: str):
    """An io diagnostic about the working tree's file, naming it relative to the repository root."""
    import dataclasses

    return dataclasses.replace(problem, message=problem.message.replace(full, printable(name)))


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


def _at_revision(raw: bytes, name: str, root: str, listing: dict, options: Options) -> Result:
    """The config as it was at the revision, with the files it refers to (hf_config) as they
    were there too: both are written to a scratch directory, laid out as in the repository,
    and checked from there (git's object store is read; nothing is checked out). A referenced
    file that is not a regular file of at most the size limit there is left out (check says so)."""
    import posixpath
    import tempfile

    from memfit.whatif.fit import referenced
    from memfit.read.source import load

    text, problem = decode(raw)
    data = load(text).data if problem is None else None
    files = referenced(data, name) if isinstance(data, dict) else {}
    inside = [posixpath.normpath(f.replace(os.sep, "/")) for f in files.values() if not os.path.isabs(f)]
    inside = [f for f in inside if f != os.pardir and not f.startswith(os.pardir + "/")]
    if isinstance(data, dict) and "memfit" not in data:
        inside += _native_references(raw, name, root, options)
    if not inside:
        return _checked(raw, name, options, os.path.join(root, name))
    usable = {
        f: listing[f].oid for f in inside
        if f in listing and listing[f].mode in ("100644", "100755") and listing[f].size is not None and listing[f].size <= options.max_file_size
    }
    contents = blobs(root, list(usable.values()))
    with tempfile.TemporaryDirectory(prefix="memfit-diff-") as scratch:
        for file, content in {name: raw, **{f: contents[oid] for f, oid in usable.items()}}.items():
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
    """Configs whose gated figure grew by more than `limit`, and configs that passed and now fail."""
    return [e for e in comparison.entries if (e.growth is not None and e.growth > limit) or e.newly_failing]


# the reporters: report/commands.py, the one registry of reporters by command
REPORTERS = COMMANDS["diff"]

"""The input seam: which files to check, their text, and whether a text is a memfit config.

Only regular files are read. A FIFO, a device (/dev/zero), a socket or a symlink to one is
refused after a stat, before any read: opening a FIFO would wait for a writer and reading a
device may never end. The file is opened with O_NONBLOCK (so a FIFO swapped in after the stat
cannot block the open) and checked again on the open descriptor; at most the size limit is
read. Encodings: UTF-8 (with or without a BOM), UTF-16 and UTF-32 told apart by their BOM.
"""

from __future__ import annotations

import errno
import os
import stat

from memfit.diagnostics import codes
from memfit.diagnostics.diagnostic import FILE_START, Diagnostic, Range, diagnostic
from memfit.read.marker import is_marked

DEFAULT_MAX_FILE_SIZE = 64 * 2**20  # far above any hand-written config; a 150,000-tensor one is ~10 MiB
YAML_SUFFIXES = (".yaml", ".yml")

# never configs, and often huge: a `memfit check .` must not crawl them
PRUNED = {"node_modules", "__pycache__", "site-packages"}

# YAML allows UTF-8, UTF-16 and UTF-32, told apart by a byte order mark (longest first)
_BOMS = (
    (b"\xff\xfe\x00\x00", "utf-32"),
    (b"\x00\x00\xfe\xff", "utf-32"),
    (b"\xff\xfe", "utf-16"),
    (b"\xfe\xff", "utf-16"),
)


def has_marker(text: str) -> bool:
    """Whether the text may be a memfit config, however its key is spelt (marker.py says how)."""
    return is_marked(text)


def is_config(data) -> bool:
    return isinstance(data, dict) and "memfit" in data and not isinstance(data["memfit"], (dict, list))


def _walk_yaml(top: str):
    for root, dirs, names in os.walk(top):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in PRUNED]
        yield from (os.path.join(root, name) for name in names if name.endswith(YAML_SUFFIXES))


def expand(paths: list[str]) -> list[tuple[str, Diagnostic | None]]:
    """Files to check, in a stable order; a directory without YAML files is itself a problem.
    Nothing is opened here: what a listed name turns out to be is read()'s to say."""
    out: list[tuple[str, Diagnostic | None]] = []
    for path in paths:
        if os.path.isdir(path):
            found = sorted(name for name in _walk_yaml(path))
            if not found:
                out.append((path, diagnostic(FILE_START, codes.IO, f"no *.yaml or *.yml files in directory {path}")))
            out.extend((name, None) for name in found)
        else:
            out.append((path, None))
    return out


def _kind(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    for test, name in kinds:
        if test(mode):
            return name
    return "not a regular file"


def _io(message: str) -> Diagnostic:
    return diagnostic(FILE_START, codes.IO, message)


def read_bytes(path: str, max_size: int = DEFAULT_MAX_FILE_SIZE) -> tuple[bytes | None, Diagnostic | None]:
    """A regular file's bytes (at most max_size), or an io diagnostic saying why not."""
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):  # as open() says it
            return None, _io(f"cannot read {path}: {os.strerror(errno.EISDIR)}")
        kind = _kind(mode)
        if kind is not None:
            return None, _io(f"cannot read {path}: it is {kind}, not a regular file")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as error:
        return None, _io(f"cannot read {path}: {error.strerror or error}")
    try:
        with os.fdopen(fd, "rb") as handle:
            status = os.fstat(handle.fileno())
            kind = _kind(status.st_mode)  # swapped after the stat: judge what was opened
            if kind is not None:
                return None, _io(f"cannot read {path}: it is {kind}, not a regular file")
            if status.st_size > max_size:
                return None, _too_big(path, status.st_size, max_size)
            # sized by the stat, not the limit (a read of 64 MiB allocates 64 MiB); a file that
            # grows while it is read is read on, up to one byte past the limit
            raw = handle.read(status.st_size + 1)
            if len(raw) > status.st_size:
                raw += handle.read(max_size + 1 - len(raw))
    except OSError as error:
        return None, _io(f"cannot read {path}: {error.strerror or error}")
    if len(raw) > max_size:
        return None, _too_big(path, len(raw), max_size)
    return raw, None


def _too_big(path: str, size: int, limit: int) -> Diagnostic:
    return _io(f"cannot read {path}: it is {size:,} bytes, over the {limit:,}-byte limit on a config (raise it with --max-file-size)")


def decode(raw: bytes) -> tuple[str | None, Diagnostic | None]:
    """A file's bytes as text, or an io diagnostic at the first byte that cannot be decoded."""
    encoding = next((name for bom, name in _BOMS if raw.startswith(bom)), "utf-8-sig")
    if encoding == "utf-8-sig" and b"\0" in raw[:8192]:
        at = raw.index(b"\0")
        line = raw[:at].count(b"\n")
        column = len(raw[raw.rfind(b"\n", 0, at) + 1 : at].decode("utf-8", "replace"))
        return None, diagnostic(Range(line, column, line, column + 1), codes.IO, "binary file (a NUL byte here), not a YAML config")
    try:
        return raw.decode(encoding), None
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n")
        column = error.start - (raw.rfind(b"\n", 0, error.start) + 1)
        where = Range(line, column, line, column + 1)
        message = f"not {encoding.removesuffix('-sig').upper()} text: byte 0x{raw[error.start]:02x} at offset {error.start} cannot be decoded"
        return None, diagnostic(where, codes.IO, message)


def read(path: str, max_size: int = DEFAULT_MAX_FILE_SIZE) -> tuple[str | None, Diagnostic | None, bytes]:
    """A file's text, or an io diagnostic saying why there is none (and the raw bytes read)."""
    raw, problem = read_bytes(path, max_size)
    if problem is not None:
        return None, problem, b""
    text, problem = decode(raw)
    return text, problem, raw


def looks_like_config(raw: bytes) -> bool:
    """Whether undecodable bytes still carry the marker (then they are reported, not skipped)."""
    return has_marker(raw.decode("utf-8", "replace"))

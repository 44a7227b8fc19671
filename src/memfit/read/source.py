"""YAML text -> plain data, and later, ranges for the few nodes that have a problem.

One streaming pass over libyaml's parser events builds the data (no node tree is kept:
it costs more time and memory than the data itself). Positions are resolved lazily,
in one more pass, for all problem paths at once, so errors never cost a re-walk each.
Only the YAML core types are built (safe loading); any other tag is a diagnostic.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import field

import yaml
from yaml.events import (
    AliasEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
)

from memfit.diagnostics import codes
from memfit.diagnostics.diagnostic import ERROR, FILE_START, Diagnostic, Range
from memfit.diagnostics.records import record
from memfit.diagnostics.safe_text import echo

try:  # the C parser is ~10x faster; pure Python stays correct where libyaml is missing
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover
    from yaml import SafeLoader as _Loader

_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_SEQ = "tag:yaml.org,2002:seq"
_MAP = "tag:yaml.org,2002:map"
_SCALAR_TAGS = {_STR, _INT, _FLOAT, _BOOL, _NULL}

# Aliases may repeat a subtree, but not blow it up: the expanded document may hold at
# most this many nodes per parser event (plus a floor), which stops "billion laughs". A
# string counts one node per _CHARS_PER_NODE characters, so a long anchored string repeated
# a thousand times (1 MB x 1000: a gigabyte of report) is a bomb too.
_EXPANSION_PER_EVENT = 100
_EXPANSION_FLOOR = 100_000
_CHARS_PER_NODE = 64

# Nesting deeper than this is refused where it starts: a config is a few levels deep, and the
# stages after loading (schema checks, positions, reports) may then recurse without a guard.
MAX_DEPTH = 64

# An integer literal longer than this is refused where it is written. Python itself refuses to
# convert more than 4,300 decimal digits (int <-> str is quadratic), so every output could not
# print it; the limit also bounds what a hex literal (which Python converts freely) can spell.
MAX_INT_CHARS = 4300
_MAX_INT_BITS = 14284  # 10**4300 < 2**14285


# Number forms only YAML 1.1 reads as numbers: 064 (octal 52), 1:30 (base 60: 90), 1_000, 0b101.
# YAML 1.2 (and editors' yaml-language-server) reads most of them as text, so a dim written
# so is ambiguous: it stays text here and the schema reports it instead of a surprising size.
_YAML11_ONLY = re.compile(r"[_:]|^[-+]?0[0-9]|^[-+]?0b")


class _Scalars:
    """Plain-scalar resolution with YAML 1.1's rules (as PyYAML's SafeLoader), memoised by text."""

    def __init__(self) -> None:
        self._resolvers = yaml.resolver.Resolver.yaml_implicit_resolvers
        self._constructor = yaml.constructor.SafeConstructor()
        self._cache: dict[str, object] = {}

    def tag(self, value: str) -> str:
        for tag, regexp in self._resolvers.get(value[:1] if value else "", ()):
            if regexp.match(value):
                return tag
        return _STR

    def plain(self, value: str):
        try:
            return self._cache[value]
        except KeyError:
            pass
        tag = self.tag(value)
        if tag in (_INT, _FLOAT) and _YAML11_ONLY.search(value):
            tag = _STR  # see _YAML11_ONLY
        result = self.construct(tag, value)
        self._cache[value] = result
        return result

    def construct(self, tag: str, value: str):
        if tag not in (_INT, _FLOAT, _BOOL, _NULL):
            return value  # dates (and PyYAML's odd '=' value tag) stay text: the data model is JSON's
        if tag == _INT and len(value) > MAX_INT_CHARS:
            raise _TooLong(len(value))
        node = yaml.ScalarNode(tag, value)
        method = {
            _INT: self._constructor.construct_yaml_int,
            _FLOAT: self._constructor.construct_yaml_float,
            _BOOL: self._constructor.construct_yaml_bool,
            _NULL: self._constructor.construct_yaml_null,
        }[tag]
        result = method(node)
        if tag == _INT and result.bit_length() > _MAX_INT_BITS:  # 0x... spells big numbers in few characters
            raise _TooLong(result.bit_length() * 30103 // 100000 + 1)
        return result


class _TooLong(ValueError):
    def __init__(self, length: int) -> None:
        super().__init__(length)
        self.length = length


def _range(start, end) -> Range:
    return Range(start.line, start.column, end.line, end.column)


# libyaml counts NEL, LINE SEPARATOR and PARAGRAPH SEPARATOR as line breaks, as YAML 1.1 says;
# editors (LSP) and every other tool count only CR, LF and CRLF. In a text holding one of them,
# each mark's line and column are recomputed from its character index.
_EXOTIC_BREAKS = re.compile("[\x85\u2028\u2029]")
_BREAK = re.compile(r"\r\n|\r|\n")


class _Lines:
    def __init__(self, text: str) -> None:
        self.starts = [0] + [m.end() for m in _BREAK.finditer(text)]

    def at(self, index: int) -> tuple[int, int]:
        line = bisect_right(self.starts, index) - 1
        return line, index - self.starts[line]

    def fix(self, mark):
        """A mark like libyaml's (whose own are read-only), with the editor's line and column."""
        return _Mark(mark.index, *self.at(mark.index))


class _Mark:
    __slots__ = ("column", "index", "line")

    def __init__(self, index: int, line: int, column: int) -> None:
        self.index, self.line, self.column = index, line, column


def _lines_if_needed(text: str) -> _Lines | None:
    return _Lines(text) if _EXOTIC_BREAKS.search(text) else None


class LoadError(Exception):
    def __init__(self, diagnostic: Diagnostic) -> None:
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic


@record
class Loaded:
    """The document's data (None when it could not be built) and the load diagnostics."""

    data: object
    diagnostics: list[Diagnostic] = field(default_factory=list)


def _events(text: str):
    lines = _lines_if_needed(text)
    loader = _Loader(text)
    try:
        while loader.check_event():
            event = loader.get_event()
            if lines is not None:
                event.start_mark, event.end_mark = lines.fix(event.start_mark), lines.fix(event.end_mark)
            yield event
    except yaml.YAMLError as error:
        if lines is not None:
            for name in ("problem_mark", "context_mark"):
                if getattr(error, name, None) is not None:
                    setattr(error, name, lines.fix(getattr(error, name)))
        raise
    finally:
        loader.dispose()


def _syntax(error: yaml.YAMLError, text: str) -> Diagnostic:
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    context = getattr(error, "context_mark", None)
    if context is not None and mark is not None and mark.index >= len(text.rstrip()):
        mark = context  # found at the end of the file (an unclosed [ or {): point where it opened
    problem = getattr(error, "problem", None) or str(error)
    context = getattr(error, "context", None)
    message = f"{context}: {problem}" if context else problem
    if isinstance(error, yaml.reader.ReaderError):
        # a character YAML does not allow (a control character, a lone surrogate): libyaml gives
        # its index, not a mark; say which character, escaped, at its own line and column
        line, column = _Lines(text).at(error.position) if 0 <= error.position <= len(text) else (0, 0)
        return Diagnostic(
            Range(line, column, line, column + 1),
            ERROR,
            codes.YAML_SYNTAX,
            f"invalid YAML: the character {echo(chr(error.character) if isinstance(error.character, int) else str(error.character))} (U+{error.character if isinstance(error.character, int) else 0:04X}) is not allowed in YAML",
        )
    where = Range(mark.line, mark.column, mark.line, mark.column + 1) if mark else FILE_START
    return Diagnostic(where, ERROR, codes.YAML_SYNTAX, f"invalid YAML: {message}")


def load(text: str) -> Loaded:
    """Build the data in one pass over the parser's events (check() pauses the cyclic GC
    around it: the build allocates many containers and none can form a cycle)."""
    try:
        return _build(text)
    except LoadError as error:
        return Loaded(None, [error.diagnostic])
    except yaml.YAMLError as error:
        return Loaded(None, [_syntax(error, text)])


def _tag_error(event, what: str) -> LoadError:
    return LoadError(
        _syntax_at(event.start_mark, event.end_mark, f"unsupported tag {event.tag} on a {what}: memfit loads plain YAML data only (safe loading)")
    )


def _syntax_at(start, end, message: str) -> Diagnostic:
    return Diagnostic(_range(start, end), ERROR, codes.YAML_SYNTAX, message)


def _alias(event, anchors: dict, open_anchors: set) -> tuple[object, int]:
    """The (value, node count) an alias stands for; a recursive or dangling alias is an error."""
    if event.anchor in open_anchors:
        raise LoadError(_syntax_at(event.start_mark, event.end_mark, f"alias *{event.anchor} refers to a node that contains it (a recursive structure)"))
    if event.anchor not in anchors:
        raise LoadError(_syntax_at(event.start_mark, event.end_mark, f"alias *{event.anchor} refers to no anchor &{event.anchor} before it"))
    return anchors[event.anchor]


def _build(text: str) -> Loaded:
    scalars = _Scalars()
    diagnostics: list[Diagnostic] = []
    anchors: dict[str, tuple[object, int]] = {}
    open_anchors: set[str] = set()
    # a frame: [container, size, anchor, pending_key, pending_key_event, is_map, start_mark, merges]
    stack: list[list] = []
    root = None
    documents = 0
    expanded = 0

    def add(value, size: int, event, start=None) -> None:
        nonlocal root
        if not stack:
            root = value
            return
        frame = stack[-1]
        frame[1] += size
        if not frame[5]:
            frame[0].append(value)
            return
        if frame[3] is _NO_KEY:
            if isinstance(value, (list, dict)):
                raise LoadError(
                    _syntax_at(start or event.start_mark, event.end_mark, "a mapping key must be a plain scalar, not a list or mapping")
                )
            frame[3] = value
            frame[4] = event
            return
        key, key_event = frame[3], frame[4]
        frame[3] = _NO_KEY
        mapping = frame[0]
        if key_event.__class__ is ScalarEvent and key_event.tag is None and key_event.value == "<<" and not key_event.style:
            if frame[7]:  # a second merge key: YAML (and PyYAML) keeps the last one's keys first
                diagnostics.append(
                    Diagnostic(
                        _range(key_event.start_mark, key_event.end_mark),
                        ERROR,
                        codes.DUPLICATE_KEY,
                        "duplicate merge key '<<': YAML keeps only one of them; merge a list instead (<<: [*a, *b])",
                    )
                )
            frame[7].insert(0, (value, event))  # applied at the mapping's end: explicit keys win wherever they are
            return
        if key in mapping:
            diagnostics.append(
                Diagnostic(
                    _range(key_event.start_mark, key_event.end_mark),
                    ERROR,
                    codes.DUPLICATE_KEY,
                    f"duplicate key {key!r}: YAML keeps only one of them; remove or rename this one",
                )
            )
        mapping[key] = value

    for events, event in enumerate(_events(text), 1):
        kind = event.__class__
        if kind is ScalarEvent:
            value = _scalar(event, scalars)
            size = 1 + len(value) // _CHARS_PER_NODE if value.__class__ is str else 1
            if event.anchor is not None:
                anchors[event.anchor] = (value, size)
            add(value, size, event)
        elif kind is SequenceStartEvent or kind is MappingStartEvent:
            is_map = kind is MappingStartEvent
            if event.tag not in (None, "!", _MAP if is_map else _SEQ):
                raise _tag_error(event, "mapping" if is_map else "sequence")
            if len(stack) >= MAX_DEPTH:
                raise LoadError(_syntax_at(event.start_mark, event.end_mark, f"nesting deeper than {MAX_DEPTH} levels: a memfit config needs a handful; refusing to load it"))
            if event.anchor is not None:
                open_anchors.add(event.anchor)
            stack.append([{} if is_map else [], 1, event.anchor, _NO_KEY, None, is_map, event.start_mark, []])
        elif kind is SequenceEndEvent or kind is MappingEndEvent:
            container, size, anchor, _, _, _, start, merges = stack.pop()
            for value, merge_event in merges:
                _merge(container, value, merge_event)
            if anchor is not None:
                open_anchors.discard(anchor)
                anchors[anchor] = (container, size)
            add(container, size, event, start)
        elif kind is AliasEvent:
            value, size = _alias(event, anchors, open_anchors)
            expanded += size
            if expanded > _EXPANSION_FLOOR + _EXPANSION_PER_EVENT * events:
                raise LoadError(
                    _syntax_at(event.start_mark, event.end_mark, "aliases expand this document beyond a sane size (an alias bomb?); refusing to load it")
                )
            add(value, size, event)
        elif kind is DocumentStartEvent:
            documents += 1
            if documents > 1:
                diagnostics.append(
                    _syntax_at(event.start_mark, event.end_mark, "a memfit config is one YAML document; this file has more (only the first is checked)")
                )
                break
        elif kind is StreamEndEvent:
            break
    return Loaded(root, diagnostics)


_NO_KEY = object()

_TAG_NAMES = {_INT: "an integer", _FLOAT: "a number", _BOOL: "a boolean", _NULL: "null"}


def _scalar(event, scalars: _Scalars):
    """A scalar event's value; a tag that cannot apply to it, or an integer too long to print,
    is a diagnostic on the scalar itself."""
    try:
        if event.tag is None or event.tag == "!":
            return scalars.plain(event.value) if event.implicit[0] else event.value
        if event.tag in _SCALAR_TAGS:
            return scalars.construct(event.tag, event.value)
    except _TooLong as error:
        raise LoadError(
            Diagnostic(
                _range(event.start_mark, event.end_mark),
                ERROR,
                codes.TOO_LARGE,
                f"an integer of {error.length:,} digits: memfit reads integers of at most {MAX_INT_CHARS:,} digits",
            )
        ) from None
    except (ValueError, KeyError, TypeError, OverflowError):
        short = event.tag.rsplit(":", 1)[-1]
        raise LoadError(
            _syntax_at(event.start_mark, event.end_mark, f"!!{short} {echo(event.value)} is not {_TAG_NAMES.get(event.tag, 'a ' + short)}")
        ) from None
    raise _tag_error(event, "scalar")


def _merge(mapping: dict, value, event) -> None:
    """YAML's merge key (<<: *base): keys already present win."""
    sources = value if isinstance(value, list) else [value]
    for source in sources:
        if not isinstance(source, dict):
            raise LoadError(
                _syntax_at(event.start_mark, event.end_mark, "a merge key (<<) takes a mapping or a list of mappings")
            )
        for key, item in source.items():
            mapping.setdefault(key, item)


# --- positions -------------------------------------------------------------------------

KEY = "key"
VALUE = "value"


def locate(text: str, requests, unique_keys: bool = False) -> dict[tuple, Range]:
    """Ranges for (path, KEY|VALUE) requests, in one pass; a path that does not exist as
    written (inside an alias, or missing) gets its nearest existing ancestor's range. With
    unique_keys (the document has no duplicate key, so the first node at a path is the only
    one) the pass stops as soon as every request has its own node: a typo near the top of a
    huge config is not followed by a walk through the rest."""
    requests = set(requests)
    wanted: set[tuple] = set()
    for path, _ in requests:
        for i in range(len(path) + 1):
            wanted.add(path[:i])
    values: dict[tuple, Range] = {}
    keys: dict[tuple, Range] = {}
    _walk(text, wanted, values, keys, set(requests) if unique_keys else None)
    found: dict[tuple, Range] = {}
    for request in requests:
        path, kind = request
        if kind == KEY and path in keys:
            found[request] = keys[path]
            continue
        for i in range(len(path), -1, -1):
            if path[:i] in values:
                found[request] = values[path[:i]]
                break
        else:
            found[request] = FILE_START
    return found


class _Found(Exception):
    """Every request of an early-stopping walk has its node."""


def _walk(text: str, wanted, values: dict, keys: dict, outstanding: set | None = None) -> None:
    """Record value and key ranges of the wanted paths (all paths when wanted is None); stop
    once `outstanding` (path, KEY|VALUE) requests, if given, all have their exact node."""
    scalars = _Scalars()
    # frame: [path, is_map, next_index_or_pending_key, start_mark, last_end_mark]
    stack: list[list] = []
    everything = wanted is None
    documents = 0

    def child_path(frame):
        return frame[0] + (frame[2],)

    def finish(path, start, end):
        if everything or path in wanted:
            values[path] = _range(start, end)
            if outstanding is not None:
                outstanding.discard((path, KEY))  # a list item has no key: its value stands for it
                outstanding.discard((path, VALUE))
                if not outstanding:
                    raise _Found
        if stack:
            frame = stack[-1]
            frame[4] = end
            if frame[1]:
                frame[2] = _NO_KEY
            else:
                frame[2] += 1

    events = _events(text)
    try:
        for event in events:
            kind = event.__class__
            if kind is DocumentStartEvent:
                documents += 1
                if documents > 1:
                    break
                continue
            if kind in (ScalarEvent, AliasEvent, SequenceStartEvent, MappingStartEvent):
                if stack and stack[-1][1] and stack[-1][2] is _NO_KEY:
                    # a mapping key: remember it; its value's path follows
                    frame = stack[-1]
                    key = _key_of(event, scalars)
                    frame[2] = key
                    path = frame[0] + (key,)
                    if everything or path in wanted:
                        keys[path] = _range(event.start_mark, event.end_mark)
                        if outstanding is not None:
                            outstanding.discard((path, KEY))
                            if not outstanding:
                                raise _Found
                    if kind in (SequenceStartEvent, MappingStartEvent):
                        stack.append([path + ("?",), kind is MappingStartEvent, _NO_KEY if kind is MappingStartEvent else 0, event.start_mark, event.end_mark])
                    continue
                path = child_path(stack[-1]) if stack else ()
                if kind is ScalarEvent or kind is AliasEvent:
                    finish(path, event.start_mark, event.end_mark)
                elif not everything and path not in wanted:
                    finish(path, event.start_mark, _skip(events, event))  # nothing asked for inside
                else:
                    is_map = kind is MappingStartEvent
                    stack.append([path, is_map, _NO_KEY if is_map else 0, event.start_mark, event.end_mark])
            elif kind is SequenceEndEvent or kind is MappingEndEvent:
                path, _, _, start, last_end = stack.pop()
                # block containers end where the next token starts; stop at their last child
                end = event.end_mark if event.start_mark.index != event.end_mark.index else last_end
                if stack and stack[-1][1] and stack[-1][2] is not _NO_KEY and path[-1:] == ("?",):
                    stack[-1][2] = object()  # a complex key: its value gets a path nothing asks for
                    continue
                finish(path, start, end)
    except yaml.YAMLError:
        pass  # positions up to the error are still good
    except _Found:
        pass


def _skip(events, start):
    """Consume a container no request is in; its end mark, as the walk above would find it
    (a block container ends at its last child), without building a path for anything inside."""
    lasts = [start.end_mark]
    for event in events:
        kind = event.__class__
        if kind is SequenceStartEvent or kind is MappingStartEvent:
            lasts.append(event.end_mark)
        elif kind is SequenceEndEvent or kind is MappingEndEvent:
            last = lasts.pop()
            end = event.end_mark if event.start_mark.index != event.end_mark.index else last
            if not lasts:
                return end
            lasts[-1] = end
        else:
            lasts[-1] = event.end_mark
    return lasts[0]


def _key_of(event, scalars: _Scalars):
    if event.__class__ is ScalarEvent:
        if event.tag is None or event.tag == "!":
            return scalars.plain(event.value) if event.implicit[0] else event.value
        return event.value
    return object()  # aliases and complex keys never match a path


def keys_at(text: str, wanted: set) -> dict[tuple, Range]:
    """The ranges of the mapping keys at the wanted paths that the text itself writes (a key reached
    through a merge key or an alias has none)."""
    values: dict[tuple, Range] = {}
    keys: dict[tuple, Range] = {}
    _walk(text, wanted, values, keys)
    return keys


def index(text: str) -> tuple[dict[tuple, Range], dict[tuple, Range]]:
    """Every node's value range and every mapping key's range."""
    values: dict[tuple, Range] = {}
    keys: dict[tuple, Range] = {}
    _walk(text, None, values, keys)
    return values, keys


def spans(text: str) -> tuple[dict[tuple, tuple], dict[tuple, tuple]]:
    """`index` with each range as a plain (start_line, start_character, end_line, end_character)
    tuple: what the editor indexes a whole document with (`Range(*span)` where one is needed). A
    5,000-tensor config has 32,000 nodes and keys: building a Range for each was a third of the walk."""
    values: dict[tuple, tuple] = {}
    keys: dict[tuple, tuple] = {}
    if _lines_if_needed(text) is not None:
        _walk_all(_events(text), values, keys)
        return values, keys
    # the parser's own events, without _events' generator around each one (its marks need no fixing here)
    loader = _Loader(text)
    try:
        _walk_all(iter(loader.get_event, None), values, keys)
    finally:
        loader.dispose()
    return values, keys


def _walk_all(events, values: dict, keys: dict) -> None:
    """_walk with every path wanted, spans as tuples, its helpers inlined (the language server runs it
    on a whole document for the first inlay hint or hover). The same frames and the same rules:
    tests/project/test_speed_equivalence.py holds it to _walk's ranges. The open frame is a local (the
    stack holds its parents) and a plain key is resolved from the scalar cache without a call."""
    scalars = _Scalars()
    resolved = scalars._cache
    # frame: [path, is_map, next_index_or_pending_key, start_mark, last_end_mark]; None outside the root
    frame: list | None = None
    stack: list = []
    documents = 0
    no_key = _NO_KEY
    scalar_event, alias_event, map_start, seq_start = ScalarEvent, AliasEvent, MappingStartEvent, SequenceStartEvent
    try:
        for event in events:
            kind = event.__class__
            if kind is scalar_event or kind is map_start or kind is seq_start or kind is alias_event:
                start, end = event.start_mark, event.end_mark
                if frame is not None and frame[1] and frame[2] is no_key:
                    # a mapping key: remember it; its value's path follows
                    if kind is scalar_event and event.implicit[0] and (event.tag is None or event.tag == "!"):
                        key = event.value
                        key = resolved[key] if key in resolved else scalars.plain(key)
                    else:
                        key = _key_of(event, scalars)
                    frame[2] = key
                    path = frame[0] + (key,)
                    keys[path] = (start.line, start.column, end.line, end.column)
                    if kind is map_start:
                        stack.append(frame)
                        frame = [path + ("?",), True, no_key, start, end]
                    elif kind is seq_start:
                        stack.append(frame)
                        frame = [path + ("?",), False, 0, start, end]
                    continue
                path = frame[0] + (frame[2],) if frame is not None else ()
                if kind is map_start:
                    stack.append(frame)
                    frame = [path, True, no_key, start, end]
                    continue
                if kind is seq_start:
                    stack.append(frame)
                    frame = [path, False, 0, start, end]
                    continue
            elif kind is SequenceEndEvent or kind is MappingEndEvent:
                path, _, _, start, last_end = frame
                frame = stack.pop()
                # block containers end where the next token starts; stop at their last child
                end = event.end_mark if event.start_mark.index != event.end_mark.index else last_end
                if frame is not None and frame[1] and frame[2] is not no_key and path[-1:] == ("?",):
                    frame[2] = object()  # a complex key: its value gets a path nothing asks for
                    continue
            elif kind is DocumentStartEvent:
                documents += 1
                if documents > 1:
                    break
                continue
            else:
                continue
            # a node is finished (a scalar, an alias, a container's end): its span, and its parent moves on
            values[path] = (start.line, start.column, end.line, end.column)
            if frame is not None:
                frame[4] = end
                if frame[1]:
                    frame[2] = no_key
                else:
                    frame[2] += 1
    except yaml.YAMLError:
        pass  # positions up to the error are still good

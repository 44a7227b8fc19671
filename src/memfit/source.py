"""YAML text -> plain data, and later, ranges for the few nodes that have a problem.

One streaming pass over libyaml's parser events builds the data (no node tree is kept:
it costs more time and memory than the data itself). Positions are resolved lazily,
in one more pass, for all problem paths at once, so errors never cost a re-walk each.
Only the YAML core types are built (safe loading); any other tag is a diagnostic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

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

from . import codes
from .diagnostics import ERROR, FILE_START, Diagnostic, Range

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
# most this many nodes per parser event (plus a floor), which stops "billion laughs".
_EXPANSION_PER_EVENT = 100
_EXPANSION_FLOOR = 100_000


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
        node = yaml.ScalarNode(tag, value)
        method = {
            _INT: self._constructor.construct_yaml_int,
            _FLOAT: self._constructor.construct_yaml_float,
            _BOOL: self._constructor.construct_yaml_bool,
            _NULL: self._constructor.construct_yaml_null,
        }[tag]
        return method(node)


def _range(start, end) -> Range:
    return Range(start.line, start.column, end.line, end.column)


class LoadError(Exception):
    def __init__(self, diagnostic: Diagnostic) -> None:
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic


@dataclass
class Loaded:
    """The document's data (None when it could not be built) and the load diagnostics."""

    data: object
    diagnostics: list[Diagnostic] = field(default_factory=list)


def _events(text: str):
    loader = _Loader(text)
    try:
        while loader.check_event():
            yield loader.get_event()
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
            frame[7].append((value, event))  # applied at the mapping's end: explicit keys win wherever they are
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
            if event.tag is None or event.tag == "!":
                value = scalars.plain(event.value) if event.implicit[0] else event.value
            elif event.tag in _SCALAR_TAGS:
                value = scalars.construct(event.tag, event.value)
            else:
                raise _tag_error(event, "scalar")
            if event.anchor is not None:
                anchors[event.anchor] = (value, 1)
            add(value, 1, event)
        elif kind is SequenceStartEvent or kind is MappingStartEvent:
            is_map = kind is MappingStartEvent
            if event.tag not in (None, "!", _MAP if is_map else _SEQ):
                raise _tag_error(event, "mapping" if is_map else "sequence")
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


def index(text: str) -> tuple[dict[tuple, Range], dict[tuple, Range]]:
    """Every node's value range and every mapping key's range (for the editor)."""
    values: dict[tuple, Range] = {}
    keys: dict[tuple, Range] = {}
    _walk(text, None, values, keys)
    return values, keys

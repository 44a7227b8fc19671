"""Is a YAML text a memfit config? The answer --skip-unrecognized (the hook, the Action, the editor)
acts on: a file judged "not a config" is skipped, so a config must never be judged so, however
its `memfit` key is spelt; and a file that is not one must not fail for being unparseable.

1. The usual spelling, `memfit: 1` at column 0, is recognised by a regular expression: no parse,
   so the hook stays cheap on big configs.
2. A text that cannot spell the key at all (no `memfit`, and no backslash escape that could make
   one) is not a config: most YAML in a repository is skipped here, unparsed.
3. Anything else is composed (YAML's node graph: anchors, aliases, tags, merge keys, escapes and
   complex keys resolved; nothing constructed, so an alias bomb or an unknown tag costs nothing):
   a config has a top-level mapping with a `memfit` key whose value is a scalar, as check() wants.
4. Text that does not even compose (a Helm template) is a config only when a line outside
   comments, at the document's outermost indentation, starts with the key: a broken config is
   then reported, while a comment mentioning `{memfit: 1}` changes nothing.
"""

from __future__ import annotations

import re

_USUAL = re.compile(r"""^\ufeff?["']?memfit["']?[ \t]*:[ \t]*["']?[0-9]""", re.MULTILINE)
_KEY_LINE = re.compile(r"""^(?P<indent>[ \t]*)(?:\?[ \t]+)?["']?memfit["']?[ \t]*:""")
_COMMENT_OR_BLANK = re.compile(r"^[ \t]*(?:#.*)?$")
_MERGE = "tag:yaml.org,2002:merge"


def is_marked(text: str) -> bool:
    if _USUAL.search(text):
        return True
    if "memfit" not in text and "\\" not in text:
        return False
    import yaml

    try:
        loader = yaml.CSafeLoader if hasattr(yaml, "CSafeLoader") else yaml.SafeLoader
        documents = yaml.compose_all(text, Loader=loader)
        return any(_has_marker_key(document) for document in documents)
    except (yaml.YAMLError, RecursionError, ValueError):
        return _marker_line(text)


def _has_marker_key(node, depth: int = 0) -> bool:
    """A mapping node with a `memfit` key whose value is a scalar (merged mappings included)."""
    import yaml

    if not isinstance(node, yaml.MappingNode) or depth > 20:
        return False
    for key, value in node.value:
        if isinstance(key, yaml.ScalarNode) and key.tag == _MERGE or (isinstance(key, yaml.ScalarNode) and key.value == "<<" and key.style is None):
            merged = value.value if isinstance(value, yaml.SequenceNode) else [value]
            if any(_has_marker_key(item, depth + 1) for item in merged):
                return True
        elif isinstance(key, yaml.ScalarNode) and key.value == "memfit" and isinstance(value, yaml.ScalarNode):
            return True
    return False


def _marker_line(text: str) -> bool:
    """For text YAML cannot read: the key on a line of its own at the outermost indentation."""
    lines = [line for line in text.splitlines() if not _COMMENT_OR_BLANK.match(line) and not line.lstrip().startswith(("---", "..."))]
    if not lines:
        return False
    outermost = min(len(line) - len(line.lstrip(" \t")) for line in lines)
    for line in lines:
        found = _KEY_LINE.match(line)
        if found and len(found.group("indent")) == outermost:
            return True
    return False

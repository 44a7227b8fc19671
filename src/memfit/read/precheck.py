"""Is a document valid against the schema? A yes/no answer compiled once from the schema itself.

jsonschema stays the authority on *what* is wrong and where (schema.problems asks it whenever
this says no); this only spares the common case, a valid config, from jsonschema's import
(~30 ms, a pre-commit hook's whole budget) and from its per-node cost (seconds on 150,000
tensors). It reads the schema, never a copy of it: each keyword the schema uses becomes a
closure with jsonschema's exact semantics for that keyword (Draft 2020-12, no format assertion;
the caller passes its own integer and number types and multipleOf, as schema.py does for memfit's
dialect). A keyword it does not know makes `compile_schema` raise Unsupported, and then every
document goes to jsonschema as before.
"""

from __future__ import annotations

import re
from fractions import Fraction
from numbers import Number


class Unsupported(Exception):
    """The schema uses a keyword (or reference form) this compiler does not implement."""


# keywords that never make a document invalid (format is not asserted: the validator has no format checker)
_ANNOTATIONS = frozenset(
    {"$schema", "$anchor", "$comment", "$defs", "title", "description", "examples", "default", "deprecated", "readOnly", "writeOnly", "format", "then", "else"}
)


def _is_number(x) -> bool:
    kind = type(x)
    if kind is int or kind is float:  # the common case, without the ABC check
        return True
    return isinstance(x, Number) and not isinstance(x, bool)


def _is_integer(x) -> bool:
    if type(x) is int:
        return True
    return not isinstance(x, bool) and (isinstance(x, int) or (isinstance(x, float) and x.is_integer()))


# jsonschema's Draft 2020-12 types; compile_schema(types=...) replaces any of them
TYPES = {
    "object": lambda x: isinstance(x, dict),
    "array": lambda x: isinstance(x, list),
    "string": lambda x: isinstance(x, str),
    "integer": _is_integer,
    "number": _is_number,
    "boolean": lambda x: isinstance(x, bool),
    "null": lambda x: x is None,
}


def _float_multiple(x, divisor) -> bool:
    """jsonschema's own multipleOf: float division, exact only when that overflows."""
    if isinstance(divisor, float):
        quotient = x / divisor
        try:
            return int(quotient) == quotient
        except OverflowError:
            return (Fraction(x) / Fraction(divisor)).denominator == 1
    return not (x % divisor)


def _unbool(x):
    return ("bool", x) if isinstance(x, bool) else x


def equal(one, two) -> bool:
    """jsonschema's equality for const/enum: True is not 1, lists and mappings compare deeply."""
    if one is two:
        return True
    if isinstance(one, str) or isinstance(two, str):
        return one == two
    if isinstance(one, list) and isinstance(two, list):
        return len(one) == len(two) and all(equal(a, b) for a, b in zip(one, two))
    if isinstance(one, dict) and isinstance(two, dict):
        return one.keys() == two.keys() and all(equal(one[k], two[k]) for k in one)
    if isinstance(one, (list, dict)) or isinstance(two, (list, dict)):
        return False
    return _unbool(one) == _unbool(two)


def _always(x) -> bool:
    return True


def _never(x) -> bool:
    return False


class _Compiler:
    def __init__(self, root: dict, types: dict, multiple_of, lazy: bool = True) -> None:
        self.root = root
        self.lazy = lazy
        self.types = types
        self.is_number = types["number"]
        self.multiple_of = multiple_of
        self.done: dict[int, object] = {}
        self.busy: set[int] = set()

    def compiled(self, schema):
        if schema is True:
            return _always
        if schema is False:
            return _never
        if not isinstance(schema, dict):
            raise Unsupported(f"a schema must be an object or a boolean, not {schema!r}")
        key = id(schema)
        if key in self.done:
            return self.done[key]
        if key in self.busy:  # a recursive $ref: bind late
            return lambda x: self.done[key](x)
        self.busy.add(key)
        checks = []
        for keyword, value in schema.items():
            if keyword in _ANNOTATIONS:
                continue
            if keyword == "$id" and schema is self.root:
                continue
            make = KEYWORDS.get(keyword)
            if make is None:
                raise Unsupported(f"keyword {keyword!r}")
            checks.append(make(self, value, schema))
        self.busy.discard(key)
        self.done[key] = _all(checks)
        return self.done[key]

    def resolve(self, ref: str):
        if ref.startswith("#/"):
            node = self.root
            for part in ref[2:].split("/"):
                part = part.replace("~1", "/").replace("~0", "~")
                if isinstance(node, list):
                    part = int(part)
                try:
                    node = node[part]
                except (KeyError, IndexError, TypeError):
                    raise Unsupported(f"$ref {ref!r} points nowhere") from None
            return node
        if ref.startswith("#") and len(ref) > 1:
            found = _anchor(self.root, ref[1:])
            if found is not None:
                return found
        raise Unsupported(f"$ref {ref!r}: only local references are compiled")


def _anchor(node, name: str):
    if isinstance(node, dict):
        if node.get("$anchor") == name:
            return node
        node = list(node.values())
    if isinstance(node, list):
        for child in node:
            found = _anchor(child, name)
            if found is not None:
                return found
    return None


def _all(checks: list):
    if not checks:
        return _always
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:
        first, second = checks
        return lambda x: first(x) and second(x)

    def every(x) -> bool:
        for check in checks:
            if not check(x):
                return False
        return True

    return every


# --- one maker per keyword: (compiler, the keyword's value, the schema it is in) -> check -------


def _type(c, value, schema):
    names = value if isinstance(value, list) else [value]
    try:
        tests = [c.types[name] for name in names]
    except KeyError as error:
        raise Unsupported(f"type {error}") from None
    if len(tests) == 1:
        return tests[0]
    if names == ["array", "object"] or names == ["object", "array"]:
        return lambda x: isinstance(x, (list, dict))
    return lambda x: any(test(x) for test in tests)


def _enum(c, values, schema):
    if all(isinstance(v, str) for v in values):
        # equal() with a str on one side is ==, and no non-str equals a str
        names = frozenset(values)
        return lambda x: isinstance(x, str) and x in names
    return lambda x: any(equal(x, v) for v in values)


def _const(c, value, schema):
    return lambda x: equal(x, value)


def _properties(c, value, schema):
    # each property's schema is compiled the first time a document has that property: a check
    # compiles the few sections its config uses, not the whole schema (half of a small config's
    # start-up otherwise). An unsupported keyword found then raises from the predicate, and the
    # caller hands the document to jsonschema, as it does for one found up front.
    pairs: list = []
    for name, sub in value.items():
        pairs.append((name, _on_first_use(c, sub, pairs, len(pairs), name) if c.lazy else c.compiled(sub)))

    def check(x) -> bool:
        if not isinstance(x, dict):
            return True
        for name, sub in pairs:
            if name in x and not sub(x[name]):
                return False
        return True

    return check


def _on_first_use(c, schema, pairs: list, index: int, name: str):
    """A check that compiles `schema` when first called and puts the compiled one in its place."""

    def first(x) -> bool:
        check = c.compiled(schema)
        pairs[index] = (name, check)
        return check(x)

    return first


def _additional(c, value, schema):
    known = schema.get("properties", {})
    patterns = "|".join(schema.get("patternProperties", {}))
    sub = c.compiled(value)

    def extras(x):
        for key in x:
            if key not in known and not (patterns and re.search(patterns, key)):
                yield key

    if value is False:
        return lambda x: not isinstance(x, dict) or next(extras(x), _NONE) is _NONE
    return lambda x: not isinstance(x, dict) or all(sub(x[key]) for key in extras(x))


_NONE = object()


def _pattern_properties(c, value, schema):
    pairs = [(pattern, c.compiled(sub)) for pattern, sub in value.items()]
    return lambda x: not isinstance(x, dict) or all(sub(v) for pattern, sub in pairs for k, v in x.items() if re.search(pattern, k))


def _required(c, value, schema):
    return lambda x: not isinstance(x, dict) or all(name in x for name in value)


def _dependent_required(c, value, schema):
    return lambda x: not isinstance(x, dict) or all(each in x for name, needs in value.items() if name in x for each in needs)


def _property_names(c, value, schema):
    sub = c.compiled(value)
    return lambda x: not isinstance(x, dict) or all(sub(key) for key in x)


def _items(c, value, schema):
    if "prefixItems" in schema:
        raise Unsupported("prefixItems")
    sub = c.compiled(value)

    def check(x) -> bool:
        if not isinstance(x, list):
            return True
        for item in x:
            if not sub(item):
                return False
        return True

    return check


def _length(kind, compare):
    def make(c, value, schema):
        return lambda x: not isinstance(x, kind) or compare(len(x), value)

    return make


def _bound(compare):
    def make(c, value, schema):
        is_number = c.is_number

        def check(x) -> bool:
            if type(x) is int:  # a number under any dialect, and the common case
                return compare(x, value)
            return not is_number(x) or compare(x, value)

        return check

    return make


def _multiple_of(c, value, schema):
    is_number, multiple = c.is_number, c.multiple_of
    return lambda x: not is_number(x) or multiple(x, value)


def _pattern(c, value, schema):
    search = re.compile(value).search
    return lambda x: not isinstance(x, str) or search(x) is not None


def _any_of(c, value, schema):
    subs = [c.compiled(sub) for sub in value]
    return lambda x: any(sub(x) for sub in subs)


def _all_of(c, value, schema):
    return _all([c.compiled(sub) for sub in value])


def _one_of(c, value, schema):
    subs = [c.compiled(sub) for sub in value]
    return lambda x: sum(1 for sub in subs if sub(x)) == 1


def _not(c, value, schema):
    sub = c.compiled(value)
    return lambda x: not sub(x)


def _if(c, value, schema):
    test = c.compiled(value)
    then = c.compiled(schema.get("then", True))
    otherwise = c.compiled(schema.get("else", True))
    return lambda x: then(x) if test(x) else otherwise(x)


def _ref(c, value, schema):
    return c.compiled(c.resolve(value))


KEYWORDS = {
    "type": _type,
    "enum": _enum,
    "const": _const,
    "properties": _properties,
    "additionalProperties": _additional,
    "patternProperties": _pattern_properties,
    "required": _required,
    "dependentRequired": _dependent_required,
    "propertyNames": _property_names,
    "items": _items,
    "minItems": _length(list, lambda n, v: n >= v),
    "maxItems": _length(list, lambda n, v: n <= v),
    "minLength": _length(str, lambda n, v: n >= v),
    "maxLength": _length(str, lambda n, v: n <= v),
    "minProperties": _length(dict, lambda n, v: n >= v),
    "maxProperties": _length(dict, lambda n, v: n <= v),
    "minimum": _bound(lambda x, v: not x < v),
    "maximum": _bound(lambda x, v: not x > v),
    "exclusiveMinimum": _bound(lambda x, v: not x <= v),
    "exclusiveMaximum": _bound(lambda x, v: not x >= v),
    "multipleOf": _multiple_of,
    "pattern": _pattern,
    "anyOf": _any_of,
    "allOf": _all_of,
    "oneOf": _one_of,
    "not": _not,
    "if": _if,
    "$ref": _ref,
}


def compile_schema(root: dict, at: tuple = (), types: dict | None = None, multiple_of=None, lazy: bool = True):
    """A predicate: document -> True if the schema accepts it (or, with `at`, a path of keys into
    the schema, the subschema there, its $refs resolved against the whole). `types` replaces
    type predicates (x -> bool), `multiple_of(x, divisor) -> bool` the multipleOf test for
    numbers, as the validator they must agree with was extended. Raises Unsupported: up front
    for what the schema's top holds, and, with `lazy`, from the predicate for a property's
    schema first compiled then (`lazy=False` compiles every part now)."""
    if root.get("$schema", "https://json-schema.org/draft/2020-12/schema") != "https://json-schema.org/draft/2020-12/schema":
        raise Unsupported(f"$schema {root['$schema']!r}")
    node = root
    for key in at:
        node = node[key]
    return _Compiler(root, {**TYPES, **(types or {})}, multiple_of or _float_multiple, lazy).compiled(node)

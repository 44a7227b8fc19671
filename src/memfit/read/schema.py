"""The JSON Schema (shipped in the package) and its errors, translated for people.

The schema is the single source of the format's structure. jsonschema reports an unknown
key on the mapping that holds it and a failed anyOf as a dump; the translation here puts
each problem on the node it concerns, in words, with the code users filter on.
"""

from __future__ import annotations

import json
import math
import os
from functools import lru_cache

from memfit.diagnostics import codes
from memfit.diagnostics.diagnostic import Problem

SCHEMA_FILE = "memfit.schema.json"


def shipped_text() -> str:
    """The checked-in schema (schemagen.py generates it; a test keeps the two identical). Read
    beside the package's files where they are on disk (importlib.resources costs a hook a tenth
    of its start-up: pathlib, zipfile, tempfile), through it where they are not (a zip import)."""
    beside = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), SCHEMA_FILE)
    try:
        with open(beside, encoding="utf-8") as shipped:
            return shipped.read()
    except FileNotFoundError:
        from importlib.resources import files

        return files("memfit").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def schema() -> dict:
    return json.loads(shipped_text())


# memfit's dialect of JSON Schema, in one place for both jsonschema (validator_class) and the
# compiled yes/no check (precheck): the two must agree on every document.


def is_integer(instance) -> bool:
    # YAML tells 2 from 2.0 (JSON Schema's integer would accept 2.0) and True from 1
    return type(instance) is int or (isinstance(instance, int) and not isinstance(instance, bool))


def is_number(instance) -> bool:
    # .inf and .nan are YAML floats but no size, width or rate; jsonschema's multipleOf would crash on them
    if type(instance) is int:  # the common case first: this runs for every dim of every tensor
        return True
    if isinstance(instance, bool):
        return False
    return isinstance(instance, int) or (isinstance(instance, float) and math.isfinite(instance))


def is_multiple(instance, divisor) -> bool:
    # exact, with Fractions: jsonschema divides as floats, which overflows on huge ints
    from fractions import Fraction

    return (Fraction(instance) / Fraction(divisor)).denominator == 1


DIALECT = {"types": {"integer": is_integer, "number": is_number}, "multiple_of": is_multiple}


def _multiple_of(validator, divisor, instance, schema):
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "number") and not is_multiple(instance, divisor):
        yield ValidationError(f"{instance!r} is not a multiple of {divisor}")


def _type_check(test):
    return lambda checker, instance: test(instance)


@lru_cache(maxsize=1)
def validator_class():
    """jsonschema's Draft 2020-12 validator with memfit's dialect."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine_many({name: _type_check(test) for name, test in DIALECT["types"].items()})
    return jsonschema.validators.extend(base, validators={"multipleOf": _multiple_of}, type_checker=checker)


@lru_cache(maxsize=1)
def validator():
    """Built once per process. No remote $ref can be fetched: the schema has only local refs
    and the registry is empty, so an unknown ref fails instead of going to the network."""
    from referencing import Registry

    return validator_class()(schema(), registry=Registry())


def path_text(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "the top level"


@lru_cache(maxsize=1)
def precheck():
    """The schema compiled to a yes/no predicate (see precheck.py), or None if it cannot be."""
    from memfit.read.precheck import Unsupported, compile_schema

    try:
        return compile_schema(schema(), **DIALECT)
    except Unsupported:
        return None


def problems(data) -> list[Problem]:
    """The schema's problems with the document, translated. A document the compiled schema
    accepts has none, and then jsonschema is neither imported nor run."""
    valid = precheck()
    if valid is not None:
        try:
            accepted = valid(data)
        except Exception:  # noqa: BLE001 - jsonschema decides (and reports) whatever the predicate cannot
            accepted = False
        if accepted:
            from memfit.read import patterns

            return patterns.problems(data)  # user regexes: valid, and bounded in matching cost
    found: dict[Problem, None] = {}  # ordered, and one `required` error per key must not repeat
    narrowed, origins = _narrowed(data) if valid is not None else (data, {})
    for error in validator().iter_errors(narrowed):
        if len(error.path) >= 2 and error.path[0] in origins:
            error.path[1] = origins[error.path[0]][error.path[1]]  # back to the item's index in the document
        found.update(dict.fromkeys(_translate(error)))
    if not found:
        from memfit.read import patterns

        return patterns.problems(data)
    return list(found)


# a list property whose own schema says no more than this can have no error about the list
# itself (its length, its contents as a whole) once it is a list: only its items can be wrong
_LIST_ONLY = {"type", "items", "title", "description", "examples", "default", "$comment"}


@lru_cache(maxsize=1)
def _item_checks() -> dict:
    """Compiled checks of the items of each top-level list property (parameters, activations)."""
    from memfit.read.precheck import Unsupported, compile_schema

    checks = {}
    for key, sub in schema().get("properties", {}).items():
        if isinstance(sub, dict) and sub.get("type") == "array" and "items" in sub and set(sub) <= _LIST_ONLY:
            try:
                checks[key] = compile_schema(schema(), ("properties", key, "items"), **DIALECT)
            except Unsupported:
                pass
    return checks


def _narrowed(data) -> tuple[object, dict]:
    """The document with each long list cut down to the items the compiled check rejects, and
    where each kept item came from: jsonschema then walks the few wrong tensors, not all 150,000
    (a typo in a huge config costs seconds less). Errors come out in the same order."""
    if not isinstance(data, dict):
        return data, {}
    narrowed, origins = data, {}
    for key, check in _item_checks().items():
        items = data.get(key)
        if not isinstance(items, list):
            continue
        wrong = [i for i, item in enumerate(items) if not _accepts(check, item)]
        if len(wrong) < len(items):
            if narrowed is data:
                narrowed = dict(data)
            narrowed[key] = [items[i] for i in wrong]
            origins[key] = wrong
    return narrowed, origins


def _accepts(check, item) -> bool:
    try:
        return bool(check(item))
    except Exception:  # noqa: BLE001 - jsonschema decides
        return False


def _translate(error) -> list[Problem]:
    """One jsonschema error -> problems on the node they concern, in words: first by the kind
    of value the failing subschema describes (its $anchor), then by the failing keyword."""
    path = tuple(error.absolute_path)
    anchor = error.schema.get("$anchor") if isinstance(error.schema, dict) else None
    by_anchor = _by_anchor(error, path, anchor)
    return by_anchor if by_anchor is not None else _by_keyword(error, path)


def _by_anchor(error, path: tuple, anchor) -> list[Problem] | None:
    where = path_text(path)
    keyword = error.validator
    value = error.instance
    if anchor == "dtype":
        from memfit.recipe.dtypes import DTYPES, nearest

        if isinstance(value, str):
            near = nearest(value)
            hint = f"; did you mean {' or '.join(near)}?" if near else f" (known: {', '.join(DTYPES)})"
            return [Problem(path, codes.UNKNOWN_DTYPE, f"{where}: unknown dtype {value!r}{hint}")]
        return [Problem(path, codes.UNKNOWN_DTYPE, f"{where} is {value!r}: a dtype is a name such as 'bfloat16' or a positive byte width that is a multiple of 1/8")]
    if anchor == "bytes" or (keyword == "anyOf" and path[-1:] == ("reserve",)):
        from memfit.diagnostics.units import UnitError, parse_bytes, parse_reserve

        try:
            parse_reserve(value, 1) if path[-1:] == ("reserve",) else parse_bytes(value)
            message = f"{where} is {value!r}: not a byte quantity"
        except UnitError as why:
            message = f"{where}: {why}"
        return [Problem(path, codes.BAD_UNIT, message)]
    if anchor == "percent":
        return [Problem(path, codes.BAD_UNIT, f"{where} is {value!r}: write a percentage such as '90%'")]

    if anchor == "layer-type" and keyword == "enum":
        import difflib

        known = error.schema["enum"]
        ratio = {name: difflib.SequenceMatcher(None, str(value).lower(), name.lower()).ratio() for name in known}
        ranked = sorted(known, key=lambda name: -ratio[name])
        return [Problem(path, codes.SCHEMA, f"{where}: unknown layer type {value!r}; known types, nearest first: {', '.join(ranked)}")]
    return None


def _by_keyword(error, path: tuple) -> list[Problem]:
    where = path_text(path)
    keyword = error.validator
    value = error.instance
    if keyword == "additionalProperties":
        import difflib

        known = list(error.schema.get("properties", {}))
        extra = [key for key in value if key not in error.schema.get("properties", {})]
        out = []
        from memfit.read.names import framework_hint

        for key in extra:
            near = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            framework = framework_hint(key)  # a framework's name for a memfit key (names.FRAMEWORK_NAMES)
            hint = f"; {framework}" if framework else f"; did you mean {near[0]!r}?" if near else f" (known: {', '.join(known)})"
            out.append(Problem(path + (key,), codes.SCHEMA, f"unknown key {key!r} in {where}{hint}", on_key=True))
        return out
    if keyword == "required":
        missing = [key for key in error.validator_value if key not in value]
        return [Problem(path, codes.SCHEMA, f"{where} is missing the required key {key!r}", on_key=bool(path)) for key in missing]
    if keyword == "const" and path == ("memfit",):
        return [Problem(path, codes.SCHEMA, f"memfit is {_show(value)}: this memfit reads format version 1 (write 'memfit: 1')")]
    if keyword in ("minimum", "type") and _is_dim(path):
        return [Problem(path, codes.SCHEMA, f"{where} is {_show(value)}; dims must be non-negative integers")]
    if keyword in ("minItems", "maxItems"):
        n = error.validator_value
        bound = f"{'at least' if keyword == 'minItems' else 'at most'} {n} item{'s' if n != 1 else ''}"
        return [Problem(path, codes.SCHEMA, f"{where} has {len(value)} item{'s' if len(value) != 1 else ''}; it must have {bound}")]
    if keyword in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        bound = {"minimum": "at least", "exclusiveMinimum": "more than", "maximum": "at most", "exclusiveMaximum": "less than"}[keyword]
        return [Problem(path, codes.SCHEMA, f"{where} is {_show(value)}; it must be {bound} {error.validator_value}")]
    if keyword == "type":
        expected = error.validator_value
        expected = " or ".join(map(_article, expected)) if isinstance(expected, list) else _article(expected)
        return [Problem(path, codes.SCHEMA, f"{where} is {_show(value)}; expected {expected}")]
    if keyword == "enum":
        import difflib

        allowed = [str(v) for v in error.validator_value]
        near = difflib.get_close_matches(str(value), allowed, n=len(allowed), cutoff=0.0)  # all, nearest first
        return [Problem(path, codes.SCHEMA, f"{where}: unknown value {_show(value)}; expected one of {', '.join(near)}")]
    if keyword in ("anyOf", "oneOf") and error.context:
        from jsonschema.exceptions import best_match

        # the branch written for the value's own type says more than "expected an integer"
        fitting = [e for e in error.context if e.validator != "type"]
        return _translate(best_match(fitting or error.context))
    return [Problem(path, codes.SCHEMA, f"{where}: {error.message}")]


def _is_dim(path) -> bool:
    # parameters[i][j] (bare shape) or parameters[i].shape[j]
    return (len(path) == 3 and path[0] in ("parameters", "activations") and isinstance(path[2], int)) or (
        len(path) == 4 and path[0] in ("parameters", "activations") and path[2] == "shape"
    ) or (len(path) >= 2 and path[-2] == "shape" and isinstance(path[-1], int))


def _show(value) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "empty (null)"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"  # YAML's yes/no/on/off are booleans too
    return repr(value)


def _article(name: str) -> str:
    words = {"object": "a mapping", "array": "a list", "integer": "an integer", "string": "a string", "number": "a number", "boolean": "true or false"}
    return words.get(name, name)

"""The JSON Schema (shipped in the package) and its errors, translated for people.

The schema is the single source of the format's structure. jsonschema reports an unknown
key on the mapping that holds it and a failed anyOf as a dump; the translation here puts
each problem on the node it concerns, in words, with the code users filter on.
"""

from __future__ import annotations

import difflib
import json
import math
from functools import lru_cache
from importlib.resources import files

from .diagnostics import Problem

SCHEMA_FILE = "memfit.schema.json"


def schema_text() -> str:
    return files("memfit").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def schema() -> dict:
    return json.loads(schema_text())


def _is_integer(checker, instance) -> bool:
    # YAML tells 2 from 2.0 (JSON Schema's integer would accept 2.0) and True from 1
    return isinstance(instance, int) and not isinstance(instance, bool)


def _is_number(checker, instance) -> bool:
    # .inf and .nan are YAML floats but no size, width or rate; jsonschema's multipleOf would crash on them
    if isinstance(instance, bool):
        return False
    return isinstance(instance, int) or (isinstance(instance, float) and math.isfinite(instance))


def _multiple_of(validator, divisor, instance, schema):
    # exact, with Fractions: jsonschema divides as floats, which overflows on huge ints
    from fractions import Fraction

    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "number") and (Fraction(instance) / Fraction(divisor)).denominator != 1:
        yield ValidationError(f"{instance!r} is not a multiple of {divisor}")


@lru_cache(maxsize=1)
def validator():
    """Built once per process. No remote $ref can be fetched: the schema has only local refs
    and the registry is empty, so an unknown ref fails instead of going to the network."""
    import jsonschema
    from referencing import Registry

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine_many({"integer": _is_integer, "number": _is_number})
    cls = jsonschema.validators.extend(base, validators={"multipleOf": _multiple_of}, type_checker=checker)
    return cls(schema(), registry=Registry())


def path_text(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "the top level"


def problems(data) -> list[Problem]:
    found: dict[Problem, None] = {}  # ordered, and one `required` error per key must not repeat
    for error in validator().iter_errors(data):
        found.update(dict.fromkeys(_translate(error)))
    return list(found)


def _translate(error) -> list[Problem]:
    path = tuple(error.absolute_path)
    where = path_text(path)
    keyword = error.validator
    anchor = error.schema.get("$anchor") if isinstance(error.schema, dict) else None
    value = error.instance

    if anchor == "dtype":
        from .dtypes import DTYPES, nearest

        if isinstance(value, str):
            near = nearest(value)
            hint = f"; did you mean {' or '.join(near)}?" if near else f" (known: {', '.join(DTYPES)})"
            return [Problem(path, "unknown-dtype", f"{where}: unknown dtype {value!r}{hint}")]
        return [Problem(path, "unknown-dtype", f"{where} is {value!r}: a dtype is a name such as 'bfloat16' or a positive byte width that is a multiple of 1/8")]
    if anchor == "bytes" or (keyword == "anyOf" and path[-1:] == ("reserve",)):
        from .units import UnitError, parse_bytes, parse_reserve

        try:
            parse_reserve(value, 1) if path[-1:] == ("reserve",) else parse_bytes(value)
            message = f"{where} is {value!r}: not a byte quantity"
        except UnitError as why:
            message = f"{where}: {why}"
        return [Problem(path, "bad-unit", message)]
    if anchor == "percent":
        return [Problem(path, "bad-unit", f"{where} is {value!r}: write a percentage such as '90%'")]

    if anchor == "layer-type" and keyword == "enum":
        known = error.schema["enum"]
        ranked = sorted(known, key=lambda name: -difflib.SequenceMatcher(None, str(value).lower(), name.lower()).ratio())
        return [Problem(path, "schema", f"{where}: unknown layer type {value!r}; known types, nearest first: {', '.join(ranked)}")]

    if keyword == "additionalProperties":
        known = list(error.schema.get("properties", {}))
        extra = [key for key in value if key not in error.schema.get("properties", {})]
        out = []
        for key in extra:
            near = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]!r}?" if near else f" (known: {', '.join(known)})"
            out.append(Problem(path + (key,), "schema", f"unknown key {key!r} in {where}{hint}", on_key=True))
        return out
    if keyword == "required":
        missing = [key for key in error.validator_value if key not in value]
        return [Problem(path, "schema", f"{where} is missing the required key {key!r}", on_key=bool(path)) for key in missing]
    if keyword == "const" and path == ("memfit",):
        return [Problem(path, "schema", f"memfit is {value!r}: this memfit reads format version 1 (write 'memfit: 1')")]
    if keyword in ("minimum", "type") and _is_dim(path):
        return [Problem(path, "schema", f"{where} is {value!r}; dims must be non-negative integers")]
    if keyword in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "minItems", "maxItems"):
        bound = {"minimum": "at least", "exclusiveMinimum": "more than", "maximum": "at most", "exclusiveMaximum": "less than", "minItems": "at least this many items:", "maxItems": "at most this many items:"}[keyword]
        return [Problem(path, "schema", f"{where} is {_show(value)}; it must be {bound} {error.validator_value}")]
    if keyword == "type":
        expected = error.validator_value
        expected = " or ".join(map(_article, expected)) if isinstance(expected, list) else _article(expected)
        return [Problem(path, "schema", f"{where} is {_show(value)}; expected {expected}")]
    if keyword == "enum":
        near = difflib.get_close_matches(str(value), [str(v) for v in error.validator_value], n=3, cutoff=0.0)
        return [Problem(path, "schema", f"{where}: unknown value {value!r}; expected one of {', '.join(near)}")]
    if keyword in ("anyOf", "oneOf") and error.context:
        from jsonschema.exceptions import best_match

        # the branch written for the value's own type says more than "expected an integer"
        fitting = [e for e in error.context if e.validator != "type"]
        return _translate(best_match(fitting or error.context))
    return [Problem(path, "schema", f"{where}: {error.message}")]


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
    return repr(value)


def _article(name: str) -> str:
    words = {"object": "a mapping", "array": "a list", "integer": "an integer", "string": "a string", "number": "a number", "boolean": "true or false"}
    return words.get(name, name)

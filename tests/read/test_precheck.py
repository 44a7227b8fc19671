"""The compiled yes/no schema check must agree with jsonschema on every document, or a config
jsonschema rejects would pass unreported. Each test compares against jsonschema itself."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from benchmark_module import bench
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfit.read import schema as memfit_schema
from memfit.read.precheck import Unsupported, compile_schema

ROOT = Path(__file__).resolve().parents[2]




def reference(schema: dict, dialect: bool = True):
    """jsonschema as memfit configures it (integers exclude 2.0, numbers exclude inf, exact
    multipleOf), or stock Draft 2020-12."""
    return (memfit_schema.validator_class() if dialect else jsonschema.Draft202012Validator)(schema)


def fast(schema: dict, dialect: bool = True):
    return compile_schema(schema, **(memfit_schema.DIALECT if dialect else {}))


def outcome(check, instance):
    """True/False, or the exception both must raise (jsonschema's multipleOf cannot take inf)."""
    try:
        return bool(check(instance))
    except Exception as error:  # noqa: BLE001
        return type(error).__name__


def agree(fast, slow) -> bool:
    """Equal outcomes; where jsonschema raises (it evaluates every keyword, the predicate stops
    at the first failure) the predicate may say no instead: memfit then asks jsonschema anyway."""
    return fast == slow or (isinstance(slow, str) and fast is False)


MEMFIT = memfit_schema.schema()
FAST = fast(MEMFIT)
SLOW = memfit_schema.validator()

# values that sit on the schema's edges: bools vs ints, floats vs ints, multiples of 1/8, units, dtypes
EDGES = st.sampled_from(
    [0, 1, -1, 2, 1.0, 2.0, 0.5, 0.125, 0.1, 3.75, -0.5, True, False, None, "", "bf16", "bfloat16", "Float32", "nf4", "bfloat61",
     "24 GiB", "24GiB", "1 kb", "10%", "90 %", "x%", "adam", [], {}, [1, 2], [1, -2], [1.5], ["3"], {"shape": [1]}, {"shape": []},
     {"shape": [2], "count": 0}, {"shape": [2], "trainable": "yes"}, {"name": 3, "shape": [1]}, 10**30, float("inf"), float("nan"),
     [1, True], [1, 1], [True, 1], {"k": False}, {"k": 0}, 0.0, 6, 9, 7, 4.5, "ab", "abcd", "abcde", "d", {"x": 1}, {"x": 1, "y": 2},
     {"x": 1, "y": 2, "z": 3}, {"y": 1}, {"x": 1.0}, {"x": 1, "Q": 2}, {"Q": 1}, [[0, [1]], 2], [[-1]]]
)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**20), st.floats(allow_nan=False), st.text(max_size=6), EDGES)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(["shape", "name", "dtype", "count", "trainable", "memory", "reserve", "shpae", "x"]), inner, max_size=4)), max_leaves=8)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, prefix + (i,))


def _set(doc, path, value):
    node = doc
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 50), picks=st.lists(st.tuples(st.integers(0, 10**6), VALUES, st.sampled_from(["replace", "add", "delete"])), min_size=1, max_size=3))
def test_agrees_with_jsonschema_on_mutated_benchmark_configs(seed, picks):
    doc = yaml.load(bench.config_text(12, seed=seed), Loader=yaml.CSafeLoader)
    assert FAST(doc) and SLOW.is_valid(doc)
    for index, value, action in picks:
        value = copy.deepcopy(value)  # EDGES' lists and dicts are shared between examples
        paths = [p for p in _paths(doc) if p]
        path = paths[index % len(paths)]
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        if action == "replace":
            _set(doc, path, value)
        elif action == "add" and isinstance(parent, dict):
            parent[["shpae", "shape", "count", "dtype", "extra", "memfit", "model"][index % 7]] = value
        elif action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif isinstance(parent, list):
            parent.append(value)
    assert agree(outcome(FAST, doc), outcome(SLOW.is_valid, doc)), doc


# a schema that uses every keyword the compiler knows, so the other helpers' schema additions
# (a model section, say) stay fast and right
EVERY_KEYWORD = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "urn:test",
    "type": "object",
    "properties": {
        "a": {"oneOf": [{"type": "integer", "maximum": 5}, {"type": "number", "exclusiveMaximum": 3, "exclusiveMinimum": -3}]},
        "b": {"not": {"const": [1, True]}},
        "c": {"if": {"type": "string"}, "then": {"minLength": 2, "maxLength": 4, "pattern": "^[a-c]"}, "else": {"enum": [1, "x", None, [1], {"k": False}]}},
        "d": {"allOf": [{"$ref": "#item"}, {"minProperties": 1, "maxProperties": 2}]},
        "e": {"type": "array", "items": {"$ref": "#/$defs/tree"}, "minItems": 1, "maxItems": 3},
        "f": {"multipleOf": 0.125, "minimum": 0},
        "g": {"multipleOf": 3},
        "h": {"propertyNames": {"pattern": "^[a-z]+$"}, "dependentRequired": {"x": ["y"]}},
        "i": {"type": ["boolean", "null", "string"]},
        "j": True,
        "k": False,
    },
    "patternProperties": {"^z": {"type": "integer"}},
    "additionalProperties": {"type": "string"},
    "$defs": {
        "item": {"$anchor": "item", "type": "object", "additionalProperties": False, "properties": {"x": {"type": "integer"}, "y": {}}, "required": ["x"]},
        "tree": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "array", "items": {"$ref": "#/$defs/tree"}}]},
    },
}
FAST_EVERY, SLOW_EVERY = fast(EVERY_KEYWORD), reference(EVERY_KEYWORD)
STOCK_FAST_EVERY, STOCK_SLOW_EVERY = fast(EVERY_KEYWORD, dialect=False), reference(EVERY_KEYWORD, dialect=False)
KEYS = st.sampled_from(["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "z1", "zz", "other", "x", "y", "Q"])
ANY = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=4)), max_leaves=10)


@settings(max_examples=1500, deadline=None)
@given(instance=st.one_of(ANY, st.dictionaries(KEYS, ANY, max_size=6)))
def test_agrees_with_jsonschema_on_every_supported_keyword(instance):
    assert agree(outcome(FAST_EVERY, instance), outcome(SLOW_EVERY.is_valid, instance)), instance
    assert agree(outcome(STOCK_FAST_EVERY, instance), outcome(STOCK_SLOW_EVERY.is_valid, instance)), instance


@settings(max_examples=300, deadline=None)
@given(key=KEYS, value=ANY)
def test_agrees_with_jsonschema_keyword_by_keyword(key, value):
    # one key at a time, so one keyword's disagreement is not hidden by another's failure
    instance = {key: value}
    assert agree(outcome(FAST_EVERY, instance), outcome(SLOW_EVERY.is_valid, instance)), instance
    assert agree(outcome(STOCK_FAST_EVERY, instance), outcome(STOCK_SLOW_EVERY.is_valid, instance)), instance


# where a plausible implementation would differ from jsonschema: bools are not ints, float
# quotients, oneOf's "exactly one", pattern-matched keys, anchors, empty and false schemas
EDGE_CASES = [
    ({"const": [1, True]}, [1, 1]),
    ({"const": [1, True]}, [1, True]),
    ({"enum": [1, "x"]}, True),
    ({"enum": [1, "x"]}, 1.0),
    ({"const": False}, 0),
    ({"const": {"a": [0]}}, {"a": [False]}),
    ({"oneOf": [{"type": "integer"}, {"minimum": 0}]}, 1),
    ({"oneOf": [{"type": "integer"}, {"minimum": 0}]}, 1.5),
    ({"oneOf": [{"type": "integer"}, {"minimum": 0}]}, -1),
    ({"patternProperties": {"^z": {"type": "integer"}}, "additionalProperties": False}, {"z1": 1}),
    ({"patternProperties": {"^z": {"type": "integer"}}, "additionalProperties": False}, {"z1": "s"}),
    ({"patternProperties": {"^z": {"type": "integer"}}, "additionalProperties": False}, {"a": 1}),
    ({"multipleOf": 0.125}, 0.1),
    ({"multipleOf": 0.125}, 0.375),
    ({"multipleOf": 0.125}, 10**400),
    ({"multipleOf": 0.125}, 10**400 + 1),
    ({"multipleOf": 0.1}, 0.3),
    ({"multipleOf": 0.125}, 1e308),
    ({"multipleOf": 0.125}, float("inf")),
    ({"exclusiveMinimum": 0, "multipleOf": 0.125}, float("-inf")),
    ({"multipleOf": 3}, 9.0),
    ({"multipleOf": 3}, 7),
    ({"multipleOf": 3}, "7"),
    ({"type": "integer"}, 2.0),
    ({"type": "integer"}, 2.5),
    ({"type": "number"}, float("inf")),
    ({"minimum": 0}, float("-inf")),
    ({"multipleOf": 0.125}, 10**400 // 8 * 8),
    ({"multipleOf": 0.125}, float("nan")),
    ({"type": "integer"}, True),
    ({"type": "number"}, True),
    ({"type": "number"}, 2.5),
    ({"type": ["array", "object"]}, "[]"),
    ({"type": ["array", "object"]}, {}),
    ({"minimum": 0}, "-1"),
    ({"minimum": 0}, -1),
    ({"minimum": 0}, float("nan")),
    ({"exclusiveMinimum": 0}, 0),
    ({"maximum": 5}, 5),
    ({"maximum": 5}, 6),
    ({"exclusiveMaximum": 5}, 5),
    ({"minLength": 2}, "é"),
    ({"maxLength": 1}, "éé"),
    ({"if": {"type": "string"}, "then": {"minLength": 2}}, "a"),
    ({"if": {"type": "string"}, "else": {"type": "null"}}, 1),
    ({"then": {"type": "null"}}, 1),
    ({"$ref": "#a", "$defs": {"x": {"$anchor": "a", "type": "string"}}}, 1),
    ({"$ref": "#/$defs/x~1y", "$defs": {"x/y": {"type": "string"}}}, 1),
    ({"maxItems": 1}, [1, 2]),
    ({"maxItems": 2}, [1, 2]),
    ({"minItems": 1}, []),
    ({"required": ["a"]}, []),
    ({"required": ["a"]}, {"b": 1}),
    ({"dependentRequired": {"x": ["y"]}}, {"x": 1}),
    ({"propertyNames": {"pattern": "^a"}}, {"b": 1}),
    ({"not": {"type": "string"}}, "s"),
    ({"items": {"type": "integer"}}, [1, "2"]),
    ({"items": False}, []),
    ({"items": False}, [1]),
    ({"properties": {"a": False}}, {"a": 1}),
    ({"additionalProperties": {"type": "string"}, "properties": {"a": {}}}, {"a": 1, "b": 2}),
    ({"pattern": "b"}, "abc"),
    ({"format": "email"}, "not an email"),
    ({"minProperties": 1}, {}),
    ({"maxProperties": 1}, {"a": 1, "b": 2}),
    ({"allOf": [{"minimum": 1}, {"maximum": 2}]}, 3),
]


@pytest.mark.parametrize("dialect", [True, False], ids=["memfit", "stock"])
@pytest.mark.parametrize(("schema", "instance"), EDGE_CASES)
def test_agrees_with_jsonschema_on_edge_cases(schema, instance, dialect):
    assert agree(outcome(fast(schema, dialect), instance), outcome(reference(schema, dialect).is_valid, instance))


def test_the_every_keyword_schema_really_uses_every_supported_keyword():
    from memfit.read.precheck import KEYWORDS

    used = {key for path in _paths(EVERY_KEYWORD) for key in path if isinstance(key, str)}
    assert set(KEYWORDS) - used == set()


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "array", "uniqueItems": True},
        {"unevaluatedProperties": False},
        {"properties": {"a": {"$id": "urn:other", "type": "string"}}},
        {"$ref": "https://example.com/schema.json"},
        {"$ref": "#/$defs/missing"},
        {"type": "decimal"},
        {"$schema": "http://json-schema.org/draft-07/schema#"},
    ],
)
def test_what_it_cannot_compile_it_refuses(schema):
    with pytest.raises(Unsupported):
        compile_schema(schema, lazy=False)
    with pytest.raises(Unsupported):  # compiled on first use: refused then, never answered
        compile_schema(schema)({"a": "x"})


def test_the_shipped_schema_compiles_whole():
    """Lazily compiled parts that failed would send every config to jsonschema (slow, still right)."""
    assert callable(compile_schema(memfit_schema.schema(), lazy=False, **memfit_schema.DIALECT))


def test_an_unsupported_part_first_met_in_a_document_leaves_the_answer_to_jsonschema(monkeypatch):
    import memfit.read.precheck as precheck

    doc = yaml.safe_load(bench.config_text(5))
    expected = memfit_schema.problems({**doc, "training": {"micro_batch": -1}})
    assert expected
    memfit_schema.precheck.cache_clear()
    real = precheck.KEYWORDS["minimum"]
    monkeypatch.setitem(precheck.KEYWORDS, "minimum", lambda *a: (_ for _ in ()).throw(Unsupported("minimum")))
    try:
        assert memfit_schema.problems({**doc, "training": {"micro_batch": -1}}) == expected
        assert memfit_schema.problems(doc) == []
    finally:
        monkeypatch.setitem(precheck.KEYWORDS, "minimum", real)
        memfit_schema.precheck.cache_clear()


def test_without_a_compiled_schema_problems_come_from_jsonschema_alone(monkeypatch):
    doc = yaml.safe_load(bench.config_text(5))
    doc["parameters"][0] = [3, -1]
    expected = memfit_schema.problems(doc)
    monkeypatch.setattr(memfit_schema, "precheck", lambda: None)
    assert memfit_schema.problems(doc) == expected
    assert [p.code for p in expected] == ["schema"] and expected[0].path == ("parameters", 0, 1)


def _imports_after_check(tmp_path, text: str) -> str:
    config = tmp_path / "c.yaml"
    config.write_text(text, encoding="utf-8")
    code = "import sys\nfrom memfit.cli.main import main\nmain(['check', sys.argv[1]])\nprint('jsonschema' in sys.modules, file=sys.stderr)"
    done = subprocess.run([sys.executable, "-c", code, str(config)], capture_output=True, text=True, check=False)
    return done.stderr.strip()


def test_a_valid_config_is_checked_without_importing_jsonschema(tmp_path):
    assert _imports_after_check(tmp_path, bench.config_text(75)) == "False"


def test_an_invalid_config_is_explained_by_jsonschema(tmp_path):
    assert _imports_after_check(tmp_path, bench.config_text(75).replace("optimizer:", "optimiser:")) == "True"


@pytest.mark.parametrize(
    ("change", "valid"),
    [
        (lambda d: d["parameters"].append([2.0, 3]), False),
        (lambda d: d["parameters"].append([True]), False),
        (lambda d: d["parameters"].append([10**400, 3]), True),
        (lambda d: d["dtypes"].update(parameters=float("inf")), False),
        (lambda d: d["dtypes"].update(parameters=0.1), False),
        (lambda d: d["dtypes"].update(parameters=10**400 + 1), True),
        (lambda d: d["dtypes"].update(parameters=2.0**-10), False),
        (lambda d: d["dtypes"].update(parameters=1e300), True),
        (lambda d: d["activations"].append({"shape": [1], "count": True}), False),
    ],
)
def test_memfits_own_check_uses_memfits_dialect(change, valid, monkeypatch):
    # the compiled check as problems() really builds it, against jsonschema alone
    doc = yaml.safe_load(bench.config_text(20))
    change(doc)
    assert memfit_schema.precheck()(doc) is valid
    found = memfit_schema.problems(doc)
    monkeypatch.setattr(memfit_schema, "precheck", lambda: None)
    assert found == memfit_schema.problems(doc)
    assert bool(found) is not valid

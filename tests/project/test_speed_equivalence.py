"""The fast paths (compiled schema check, worker processes) change no diagnostic, position or
byte count. The reference here is independent of memfit's pipeline: PyYAML's composer for data
and positions, jsonschema's iter_errors for which nodes are wrong, and the footprint summed
straight from the data. The configs are the benchmark's own (smaller), valid and with errors
injected at known nodes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import jsonschema
import pytest
import yaml
from benchmark_module import bench

from memfit.check import pipeline as memfit_check
from memfit.read import schema as memfit_schema
from memfit.recipe.calculator import OPTIMIZER_STATES
from memfit.recipe.dtypes import DTYPES

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "schemas" / "memfit.schema.json").read_text(encoding="utf-8"))




# --- the independent reference ------------------------------------------------------------


def composed(text: str) -> tuple[dict, dict]:
    """Value nodes and key nodes by path, from PyYAML's node tree."""
    values, keys = {}, {}

    def walk(node, path):
        values[path] = node
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                keys[path + (key.value,)] = key
                walk(value, path + (key.value,))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, path + (i,))

    walk(yaml.compose(text, Loader=yaml.CSafeLoader), ())
    return values, keys


def span(node) -> dict:
    return {"start": {"line": node.start_mark.line, "character": node.start_mark.column}, "end": {"line": node.end_mark.line, "character": node.end_mark.column}}


def reference_errors(data) -> set[tuple]:
    """Paths jsonschema finds wrong; an unknown key is reported at the key itself."""
    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine("integer", lambda c, x: isinstance(x, int) and not isinstance(x, bool))
    found = set()
    for error in jsonschema.validators.extend(base, type_checker=checker)(SCHEMA).iter_errors(data):
        path = tuple(error.absolute_path)
        if error.validator == "additionalProperties":
            found.update(path + (key,) for key in error.instance if key not in error.schema["properties"])
        else:
            found.add(path)
    return found


def _width(value) -> Fraction:
    return Fraction(DTYPES[value][0]) if isinstance(value, str) else Fraction(value)


def _ceil(x: Fraction) -> int:
    return -(-x.numerator // x.denominator)


def reference_footprint(data: dict) -> dict:
    dtypes = data.get("dtypes", {})
    width = {c: _width(dtypes.get(c, "float32")) for c in ("parameters", "gradients", "activations", "optimizer_state")}
    states = OPTIMIZER_STATES[data["optimizer"].lower()]
    out = dict.fromkeys(("parameters", "gradients", "activations", "optimizer_state"), 0)
    for category in ("parameters", "activations"):
        for item in data.get(category, []):
            item = {"shape": item} if isinstance(item, list) else item
            elements = 1
            for dim in item["shape"]:
                elements *= dim
            count = item.get("count", 1)
            own = _width(item["dtype"]) if "dtype" in item else width[category]
            out[category] += count * _ceil(elements * own)
            if category == "parameters" and item.get("trainable", True):
                out["gradients"] += count * _ceil(elements * width["gradients"])
                out["optimizer_state"] += count * states * _ceil(elements * width["optimizer_state"])
    out["total"] = sum(out.values())
    return out


def reference_budget(data: dict) -> int:
    device = data["device"]
    gib = {name: int(re.fullmatch(r"(\d+) GiB", device[name]).group(1)) * 2**30 for name in ("memory", "reserve")}
    return gib["memory"] - gib["reserve"]


# --- injecting errors at known nodes --------------------------------------------------------

# (what to find, the edit, the code memfit must report, whether the diagnostic sits on the key)
INJECTIONS = [
    ("bare dim", "-3", "schema", False),
    ("dtype", "bfloat61", "unknown-dtype", False),
    ("count", "0", "schema", False),
    ("trainable", "maybe", "schema", False),  # not "yes": YAML 1.1 reads that as true
    ("name key", "nmae", "schema", True),
    ("activation dim", "2.5", "schema", False),
]


def inject(text: str, at: float = 0.0) -> tuple[str, list[tuple]]:
    """One error of each kind, each in a different tensor from the `at` share of its list on;
    returns the text and [(path, code, on_key)]."""
    values, keys = composed(text)
    edits, expected, used = [], [], set()

    def pick(category, test):
        i = max(5, int(len(values[(category,)].value) * at))
        while (category, i) in values:
            if (category, i) not in used and test(values[(category, i)], (category, i)):
                used.add((category, i))
                return (category, i)
            i += 1
        raise AssertionError(f"no tensor to inject into in {category}")

    for what, new, code, on_key in INJECTIONS:
        if what in ("bare dim", "activation dim"):
            category = "parameters" if what == "bare dim" else "activations"
            item = pick(category, lambda node, p: isinstance(node, yaml.SequenceNode))
            path, node = item + (1,), values[item + (1,)]
        elif what == "name key":
            item = pick("parameters", lambda node, p: p + ("name",) in keys)
            path, node = item + ("nmae",), keys[item + ("name",)]
        else:
            item = pick("parameters", lambda node, p, w=what: p + (w,) in values)
            path, node = item + (what,), values[item + (what,)]
        edits.append((node.start_mark.index, node.end_mark.index, new))
        expected.append((path, code, on_key))
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    return text, expected


def memfit_json(paths: list[Path], *extra: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", *extra, *map(str, paths)], capture_output=True, text=True, check=False)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


# --- the tests ------------------------------------------------------------------------------

SEEDS = range(8)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("speed")
    files = []
    for seed in SEEDS:
        text = bench.config_text(300, seed=seed)
        valid = root / f"valid-{seed}.yaml"
        valid.write_text(text, encoding="utf-8")
        broken_text, expected = inject(text)
        broken = root / f"broken-{seed}.yaml"
        broken.write_text(broken_text, encoding="utf-8")
        files += [(valid, text, []), (broken, broken_text, expected)]
    return files


def test_valid_configs_have_the_reference_footprint_and_budget(corpus):
    report = memfit_json([path for path, _, expected in corpus if not expected])
    verdicts = set()
    for entry, (path, text, _) in zip(report["files"], [c for c in corpus if not c[2]]):
        data = yaml.load(text, Loader=yaml.CSafeLoader)
        assert entry["path"] == str(path)
        assert entry["footprint"] == reference_footprint(data)
        assert entry["budget"] == reference_budget(data)
        total, budget = entry["footprint"]["total"], entry["budget"]
        codes = [d["code"] for d in entry["diagnostics"]]
        want = ["budget-exceeded"] if total > budget else ["near-budget"] if total * 10 > budget * 9 else []
        assert codes == want
        if codes:
            values, _ = composed(text)
            assert entry["diagnostics"][0]["range"] == span(values[("device", "memory")])
        verdicts.add(tuple(codes))
    assert len(verdicts) >= 2  # the corpus has configs that fit and configs that do not


def test_injected_errors_are_reported_at_the_reference_positions(corpus):
    broken = [c for c in corpus if c[2]]
    report = memfit_json([path for path, _, _ in broken])
    for entry, (path, text, expected) in zip(report["files"], broken):
        data = yaml.load(text, Loader=yaml.CSafeLoader)
        assert reference_errors(data) == {p for p, _, _ in expected}  # jsonschema sees exactly what was injected
        values, keys = composed(text)
        want = sorted((code, json.dumps(span(keys[p] if on_key else values[p]))) for p, code, on_key in expected)
        got = sorted((d["code"], json.dumps(d["range"])) for d in entry["diagnostics"])
        assert got == want, path
        assert entry["footprint"] is None
        for d, (p, _, _) in zip(sorted(entry["diagnostics"], key=lambda d: (d["range"]["start"]["line"])), sorted(expected, key=lambda e: (values.get(e[0]) or keys[e[0]]).start_mark.line)):
            assert memfit_schema.path_text(p[:2]) in d["message"]


def test_worker_processes_give_the_same_report_in_the_same_order(corpus, tmp_path):
    # interleave, and add a directory, a missing file and a non-config, as a hook's file list can have
    paths = [path for path, _, _ in corpus] * 4
    (tmp_path / "notes.yaml").write_text("title: not a memfit config\n", encoding="utf-8")
    paths[5:5] = [tmp_path / "missing.yaml", tmp_path / "notes.yaml", corpus[0][0].parent]
    one = memfit_json(paths, "--jobs", "1")
    two = memfit_json(paths, "--jobs", "2")
    assert one == two
    assert [f["path"] for f in one["files"][:5]] == [str(p) for p in paths[:5]]
    assert len(one["files"]) == len(paths) - 1 + len(corpus)  # the directory expands to its files


def test_the_compiled_check_changes_no_result(corpus, monkeypatch):
    def results():
        return [memfit_check.check(text, str(path)) for path, text, _ in corpus]

    fast = results()
    monkeypatch.setattr(memfit_schema, "precheck", lambda: None)  # jsonschema for every document, as before
    slow = results()
    assert [(r.diagnostics, r.footprint, r.budget) for r in fast] == [(r.diagnostics, r.footprint, r.budget) for r in slow]
    assert any(r.diagnostics for r in fast) and any(r.footprint for r in fast)


def test_a_big_config_with_errors_near_its_end(tmp_path):
    text = bench.config_text(20_000, seed=7)
    broken_text, expected = inject(text, at=0.9)
    path = tmp_path / "big.yaml"
    path.write_text(broken_text, encoding="utf-8")
    (entry,) = memfit_json([path])["files"]
    values, keys = composed(broken_text)
    want = sorted((code, json.dumps(span(keys[p] if on_key else values[p]))) for p, code, on_key in expected)
    assert sorted((d["code"], json.dumps(d["range"])) for d in entry["diagnostics"]) == want
    assert min(d["range"]["start"]["line"] for d in entry["diagnostics"]) > 15_000
    (path.parent / "valid.yaml").write_text(text, encoding="utf-8")
    (entry,) = memfit_json([path.parent / "valid.yaml"])["files"]
    assert entry["footprint"] == reference_footprint(yaml.load(text, Loader=yaml.CSafeLoader))


def test_many_errors_of_all_kinds_come_out_the_same_and_in_the_same_order(monkeypatch):
    # several wrong tensors far apart, two errors on one node, wrong things outside the lists too
    text = bench.config_text(400, seed=3)
    values, _ = composed(text)
    edits = []
    for category, i, new in [("parameters", 250, '{shape: [1, -1, "x"], count: 0.5, colour: red, dtype: f16}'), ("parameters", 17, "[2, 2.0]"), ("activations", 60, "{}"), ("activations", 3, "[true]")]:
        while not values[(category, i)].flow_style:  # a block mapping's span runs into the next item
            i += 1
        node = values[(category, i)]
        edits.append((node.start_mark.index, node.end_mark.index, new))
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    text = text.replace("optimizer:", "optimiser: adam\noptimizer:").replace("  reserve: 2 GiB", "  reserve: lots")
    fast = memfit_check.check(text)
    monkeypatch.setattr(memfit_schema, "precheck", lambda: None)
    slow = memfit_check.check(text)
    assert fast.diagnostics == slow.diagnostics
    assert len(fast.diagnostics) >= 10
    doubled = [d.message.split(".count ")[1] for d in fast.diagnostics if ".count is 0.5" in d.message]
    assert doubled == ["is 0.5; expected an integer", "is 0.5; it must be at least 1"]


def test_positions_stopping_early_equal_those_of_a_full_walk():
    from memfit.read import source

    text = bench.config_text(300, seed=11)
    values, _ = composed(text)
    paths = sorted(values, key=str)
    requests = [(p, source.VALUE) for p in paths[::7]] + [(p, source.KEY) for p in paths[::5]]
    requests += [(("parameters", 999, "shape"), source.VALUE), (("activations", 3, "nope"), source.KEY), (("nowhere",), source.VALUE)]
    for chunk in (requests[:1], requests[:3], requests[40:60], requests):
        assert source.locate(text, chunk, unique_keys=True) == source.locate(text, chunk)


def test_with_a_duplicate_key_the_position_is_that_of_the_value_memfit_read():
    # YAML keeps the last of two equal keys; a stop at the first would point at the wrong one
    text = "memfit: 1\noptimizer: adam\nparameters:\n  - [1, 2]\ndevice: {memory: 1 GiB}\nparameters:\n  - [3, -4]\n"
    result = memfit_check.check(text)
    assert [(d.code, d.range.start_line, d.range.start_character) for d in result.diagnostics] == [("duplicate-key", 5, 0), ("schema", 6, 8)]


TRICKY = """\
memfit: 1
base: &b
  shape: [1, 2]
  count: 2
empty_list: []
empty_map: {}
block_empty:
nested:
  - - [1, 2]
    - {a: [], b: {}}
  -
    - x
  - ? [complex, key]
    : value
  - <<: *b
    name: merged
  - *b
  - "quoted": 'single'
last:
  - a: 1
    b:
      - 2
      - c: 3
"""


@pytest.mark.parametrize("text", [TRICKY, bench.config_text(40, seed=5)], ids=["tricky", "benchmark"])
def test_positions_asked_for_a_few_nodes_equal_those_of_the_whole_index(text):
    # locate skips the subtrees nothing is asked in and stops early; index walks every node
    from memfit.read import source

    values, keys = source.index(text)

    def expected(path, kind):
        if kind == source.KEY and path in keys:
            return keys[path]
        return next(values[path[:i]] for i in range(len(path), -1, -1) if path[:i] in values)

    # the paths a problem can have (a complex key's inside gets placeholder parts; nothing asks for it)
    paths = sorted((p for p in values if all(isinstance(part, (str, int)) for part in p)), key=str)
    singles = [[(p, kind)] for p in paths for kind in (source.VALUE, source.KEY)]
    groups = [[(paths[i], source.VALUE), (paths[-1 - i], source.KEY)] for i in range(len(paths))]
    missing = [[(p + ("missing", 0), source.VALUE)] for p in paths[::3]]
    assert len(paths) > 20
    for requests in singles + groups + missing:
        for unique in (False, True):
            assert source.locate(text, requests, unique) == {r: expected(*r) for r in requests}, requests


_SECOND_DOCUMENT = "memfit: 1\nparameters:\n  - [1, 2]\n---\nmemfit: 1\nparameters:\n  - [3, 4]\n"
_EXOTIC_BREAK = "memfit: 1\nname: 'a\u2028b'\nparameters:\n  - {name: w, shape: [4, 8]}\n"
_BROKEN = "memfit: 1\nparameters:\n  - [1, 2\nlast: 5\n"


@pytest.mark.parametrize(
    "text",
    [TRICKY, bench.config_text(60, seed=7), _SECOND_DOCUMENT, _EXOTIC_BREAK, _BROKEN],
    ids=["tricky", "benchmark", "second-document", "exotic-break", "syntax-error"],
)
def test_the_editors_index_equals_the_walk_of_every_node(text):
    # the language server indexes a document with source.spans (plain tuples, a walk with its helpers inlined):
    # every span the one index's general walk gives, in the same order
    from memfit.diagnostics.diagnostic import Range
    from memfit.read import source

    def named(tables):
        """A complex key's or an alias key's inside has a placeholder part (a fresh object each walk): as the path of
        its parent, in order, so two walks compare."""
        return [[(tuple(part if isinstance(part, (str, int)) else "?" for part in path), span) for path, span in table.items()] for table in tables]

    values, keys = source.spans(text)
    assert named(({p: Range(*s) for p, s in values.items()}, {p: Range(*s) for p, s in keys.items()})) == named(source.index(text))
    assert len(values) > (1 if text is _BROKEN else 5)

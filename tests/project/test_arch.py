"""The architecture's own promises (issue 10): no import cycles, the schema generated from the
tables and checked in, one cost model, the code registry, the input seam, other-file diagnostics."""

import ast
import re
import io
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import needs
import pytest

from memfit import compute_footprint

from memfit.diagnostics import codes
from memfit.check.pipeline import Options, check, check_file
from memfit.diagnostics.diagnostic import Problem, Range

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "memfit"


# --- no import cycles ----------------------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, modules: set) -> set:
    """memfit modules that `name` imports anywhere: top level, inside functions, under
    `if TYPE_CHECKING:`; `from . import x` counts as importing x when x is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "memfit")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "memfit":
                continue
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in modules)
    # importing a.b runs a/__init__ first, which is an edge too (but not a module to itself)
    out = set()
    for target in found:
        parts = target.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {m for m in out if m in modules and m != name}


def import_graph() -> dict:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: _imports(path, name, set(files)) for name, path in files.items()}


def _cycle(graph: dict):
    state: dict = {}
    stack: list = []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert "memfit.models.keras" in graph and "memfit.check.pipeline" in graph["memfit.cli.runner"]
    # the package root imports calculator (compute_footprint): every module imports the root
    # first, so an edge into the root is not a cycle through it; the root itself must stay small
    root = graph.pop("memfit")
    graph = {name: {m for m in deps if m != "memfit"} for name, deps in graph.items()}
    graph["memfit"] = root
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_cycle_finder_sees_function_level_and_type_checking_imports(tmp_path):
    code = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import x\ndef f():\n    from . import c\n"
    path = tmp_path / "memfit" / "a.py"
    path.parent.mkdir()
    path.write_text(code)
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path / "memfit"
    try:
        assert _imports(path, "memfit.a", {"memfit.a", "memfit.b", "memfit.c"}) == {"memfit.b", "memfit.c"}
    finally:
        PACKAGE = saved
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]


def test_the_root_module_imports_only_the_calculator_and_the_cost_model():
    graph = import_graph()
    # a stage's package __init__ is empty: importing through it adds no module
    assert graph["memfit.recipe"] == set()
    assert graph["memfit"] <= {"memfit.recipe.calculator", "memfit.recipe"}
    assert graph["memfit.recipe.calculator"] <= {"memfit.recipe.costs", "memfit", "memfit.recipe"}
    assert graph["memfit.recipe.costs"] <= {"memfit.recipe.dtypes", "memfit.recipe.optim", "memfit", "memfit.recipe"}
    assert graph["memfit.recipe.optim"] <= {"memfit", "memfit.recipe"}  # the optimizer table: data


def test_checking_imports_neither_the_language_server_nor_jsonschema(tmp_path):
    config = tmp_path / "ok.yaml"
    config.write_text("memfit: 1\ndevice: {memory: 1 GiB}\noptimizer: adam\nparameters: [[4, 3]]\n")
    code = (
        "import sys; from memfit.cli.main import main; status = main(['check', sys.argv[1]]);"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'pygls', 'lsprotocol', 'jsonschema', 'memfit.editor.lsp'}), status)"
    )
    done = subprocess.run([sys.executable, "-c", code, str(config)], capture_output=True, text=True, timeout=120, check=False)
    assert done.stdout.strip().endswith("[] 0"), done.stdout + done.stderr


# --- the generated schema -----------------------------------------------------------------


def test_the_checked_in_schema_is_the_generated_one():
    from memfit.cli.schemagen import schema_text

    generated = schema_text()
    stale = "schemas/memfit.schema.json is stale: run `PYTHONPATH=src python -m memfit schema > src/memfit/memfit.schema.json`"
    assert (ROOT / "schemas" / "memfit.schema.json").read_text(encoding="utf-8") == generated, stale
    assert (PACKAGE / "memfit.schema.json").read_text(encoding="utf-8") == generated, stale


def test_the_schema_follows_the_tables():
    from memfit.recipe.costs import OPTIMIZER_STATES
    from memfit.recipe.dtypes import DTYPES
    from memfit.models.keras import ACTIVATIONS, RULES, defaults
    from memfit.cli.schemagen import generate
    from memfit.diagnostics.units import UNITS

    doc = generate()
    defs = doc["$defs"]
    assert defs["dtype"]["anyOf"][0]["enum"] == list(DTYPES)
    assert defs["activation_function"]["enum"] == list(ACTIVATIONS)
    assert defs["layer_type"]["enum"] == list(RULES)
    assert all(f"|{unit}|" in defs["bytes"]["anyOf"][1]["pattern"].replace("(", "|").replace(")", "|") for unit in UNITS)
    from memfit.recipe.optim import OPTIMIZERS

    assert doc["properties"]["optimizer"]["examples"] == list(OPTIMIZERS)
    assert set(OPTIMIZER_STATES) <= set(OPTIMIZERS)  # the seed contract's optimizers are all in the table
    for kind, args in defaults().items():
        assert {k: v["default"] for k, v in defs[f"layer_{kind}"]["properties"].items() if "default" in v} == args


def test_the_unit_pattern_accepts_what_parse_bytes_reads():
    import re

    from memfit.diagnostics.units import BYTES_PATTERN, UNITS, UnitError, parse_bytes

    pattern = re.compile(BYTES_PATTERN)
    for text in ["24 GiB", "80GB", " 1.5 MiB ", ".5 KiB", "7 B", "24 GIB", "24 KB", "24", "1e3 B", "-1 GiB", "24 GiBs"]:
        try:
            parse_bytes(text)
            readable = True
        except UnitError:
            readable = False
        if pattern.match(text):
            # the schema lets through only what memfit reads (a fraction of a byte is memfit's to refuse)
            assert readable or "." in text, text
        else:
            assert not readable, text
    assert all(pattern.match(f"1 {unit}") for unit in UNITS)


# --- one cost model ---------------------------------------------------------------------------


def test_the_checker_and_the_seed_contract_share_the_cost_model():
    text = "memfit: 1\ndevice: {memory: 1 GiB}\noptimizer: adam\ndtypes: {parameters: bf16, gradients: float32, activations: 0.5, optimizer_state: 4}\nparameters: [[4, 3], [3], {shape: [5], trainable: false}]\nactivations: [[2, 3]]\n"
    result = check(text)
    expected = compute_footprint([[4, 3], [3]], 2, 4, [[2, 3]], 0.5, "adam", 4)
    frozen = 5 * 2
    assert result.footprint == {**expected, "parameters": expected["parameters"] + frozen, "total": expected["total"] + frozen}


def test_a_recipe_plugs_in_without_touching_the_callers():
    from memfit.recipe.costs import Recipe
    from memfit.placement.place import place

    class MasterWeights(Recipe):  # a float32 copy of every trainable weight (mixed precision)
        def cost(self, category, elements, count=1, trainable=True, own=None):
            sizes = Recipe.cost(self, category, elements, count, trainable, own)
            if category == "parameters" and trainable:
                sizes["optimizer_state"] += count * elements * 4
            return sizes

    plain = check("memfit: 1\noptimizer: adam\nparameters: [[10]]\n").config
    from memfit.config.build import make_tensor

    config = replace(plain, recipe=MasterWeights(plain.recipe.optimizer, plain.recipe.states, plain.recipe.widths))
    config = replace(config, tensors=(make_tensor("parameters", ("parameters", 0), None, [10], 1, True, None, config),))
    config = replace(config, placement=place(config.tensors))
    assert config.footprint["optimizer_state"] == 2 * 10 * 4 + 10 * 4


def test_a_built_config_is_never_changed():
    """Each stage returns a new Config (dataclasses.replace); none writes into one already built."""
    import dataclasses

    from memfit.config.build import Config

    assert Config.__dataclass_params__.frozen
    for name in ("tensors", "layers", "overhead_lines"):
        assert isinstance(getattr(Config(None, None), name), tuple), name  # no list to append to either
    result = check((ROOT / "examples" / "llama-3-8b.yaml").read_text(), str(ROOT / "examples" / "llama-3-8b.yaml"))
    config = result.config
    assert config.peak is not None and config.step is not None and isinstance(config.tensors, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.peak = None
    # nothing in the package assigns to a config's attribute or appends to its tensors
    offenders = []
    for path in (ROOT / "src" / "memfit").rglob("*.py"):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"\bconfig\.\w+\s*=[^=]|\bconfig\.(tensors|layers)\.(append|extend)\(", code):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, offenders


# --- the code registry ----------------------------------------------------------------------


def test_every_code_has_a_severity_summary_and_help():
    for code in codes.CODES.values():
        assert code.severity in (codes.ERROR, codes.WARNING, codes.INFORMATION) and code.summary and not code.summary.endswith(".") and code.help.endswith(".")


def test_no_module_compares_code_strings():
    literals = set(codes.CODES)
    for path in PACKAGE.rglob("*.py"):
        if path.name == "codes.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                for side in [node.left, *node.comparators]:
                    assert not (isinstance(side, ast.Constant) and side.value in literals and side.value != "schema"), (path, ast.unparse(node))


# --- the input seam --------------------------------------------------------------------------


def memfit(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "memfit", *map(str, args)], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe.yaml"
    os.mkfifo(path)
    return path


def test_a_fifo_argument_is_an_io_error_not_a_hang(fifo):
    done = memfit("check", fifo, timeout=30)
    assert done.returncode == 1
    assert f"{fifo}:1:1: error[io] cannot read {fifo}: it is a FIFO (named pipe), not a regular file" in done.stdout


def test_a_fifo_in_a_walked_directory_is_an_io_error(fifo, tmp_path):
    (tmp_path / "ok.yaml").write_text("memfit: 1\ndevice: {memory: 1 GiB}\noptimizer: adam\nparameters: [[4]]\n")
    done = memfit("check", tmp_path, timeout=30)
    assert done.returncode == 1
    assert "error[io]" in done.stdout and "FIFO" in done.stdout and "1 config of 2 failed" in done.stdout


def test_explain_on_a_fifo_does_not_block(fifo):
    done = memfit("explain", fifo, timeout=30)
    assert done.returncode == 1 and "not a regular file" in done.stdout


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="a system without /dev/zero")
def test_dev_zero_and_a_symlink_to_it_are_refused(tmp_path):
    link = tmp_path / "zero.yaml"
    link.symlink_to("/dev/zero")
    done = memfit("check", "/dev/zero", link, timeout=30)
    assert done.returncode == 1
    assert done.stdout.count("it is a character device, not a regular file") == 2


def test_a_file_over_the_size_limit_is_refused_and_the_limit_can_be_raised(tmp_path):
    config = tmp_path / "big.yaml"
    config.write_text("memfit: 1\ndevice: {memory: 1 GiB}\noptimizer: adam\nparameters: [[4]]\n" + "# padding\n" * 200)
    size = config.stat().st_size
    done = memfit("check", "--max-file-size", "1 KiB", config)
    assert done.returncode == 1
    assert f"error[io] cannot read {config}: it is {size:,} bytes, over the 1,024-byte limit on a config (raise it with --max-file-size)" in done.stdout
    assert memfit("check", "--max-file-size", "1MiB", config).returncode == 0
    assert check_file(str(config), Options(max_file_size=size)).failed is False
    assert check_file(str(config), Options(max_file_size=size - 1)).failed is True


# --- a problem inside another file -----------------------------------------------------------


def _referenced():
    """A synthetic problem inside a model's config.json, referenced from model.config."""
    from memfit.check.pipeline import Result, position

    text = "memfit: 1\noptimizer: adam\nmodel:\n  config: hf/config.json\n"
    problem = Problem(("model", "config"), codes.SCHEMA, "hidden_size is 'x'; expected an integer", file="hf/config.json", at=Range(3, 17, 3, 20))
    diagnostics = position(text, [problem], {"memfit": 1, "optimizer": "adam", "model": {"config": "hf/config.json"}})
    return Result("train.yaml", diagnostics)


def test_a_referenced_file_problem_is_placed_in_that_file_and_linked_from_the_key():
    (d,) = _referenced().diagnostics
    assert (d.file, d.range, d.related) == ("hf/config.json", Range(3, 17, 3, 20), Range(3, 10, 3, 24))
    assert d.to_json()["file"] == "hf/config.json" and d.to_json()["related"]["start"] == {"line": 3, "character": 10}


@pytest.mark.parametrize("name", ["text", "json", "sarif", "github"])
def test_every_reporter_shows_the_referenced_file(name):
    from memfit.report.reporters import REPORTERS

    out = io.StringIO()
    REPORTERS[name](out).report([_referenced()])
    text = out.getvalue()
    if name == "text":
        assert "hf/config.json:4:18: error[schema] hidden_size is 'x'; expected an integer (referenced from train.yaml:4:11)" in text
    elif name == "github":
        assert "::error file=hf/config.json,line=4,col=18," in text
    elif name == "json":
        assert json.loads(text)["files"][0]["diagnostics"][0]["file"] == "hf/config.json"
    else:
        result = json.loads(text)["runs"][0]["results"][0]
        assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "hf/config.json"
        assert result["relatedLocations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "train.yaml"
        assert result["relatedLocations"][0]["physicalLocation"]["region"]["startLine"] == 4


def test_the_language_server_links_the_referenced_file():
    needs.module("pygls")
    from pygls.workspace import PositionCodec

    from memfit.editor.editor import Analysis
    from memfit.editor.lsp import MemfitServer

    class Server(MemfitServer):
        codec = PositionCodec()  # as an initialized server's workspace has it (UTF-16)

    result = _referenced()
    server = Server()
    sent = server.diagnostic(Analysis("memfit: 1\noptimizer: adam\nmodel:\n  config: hf/config.json\n", result), result.diagnostics[0])
    assert (sent.range.start.line, sent.range.start.character) == (3, 10)
    (link,) = sent.related_information
    assert link.location.uri.endswith("/hf/config.json") or link.location.uri == "hf/config.json"
    assert (link.location.range.start.line, link.location.range.start.character) == (3, 17)


# --- presentation ----------------------------------------------------------------------------


def test_the_explain_bar_turns_yellow_at_the_warning_mark_in_force():
    from memfit.report.explain import render

    text = "memfit: 1\ndevice: {memory: 1 KiB, warn_at: 50%}\noptimizer: sgd\nparameters: [[100]]\n"  # 800 B (weights and gradients) of 1,024: 78%
    coloured = render(check(text, "c.yaml"), colour=True)
    assert "\x1b[33m" in coloured  # above device.warn_at 50%: yellow, not the default 90% mark's green
    assert "\x1b[32m" in render(check(text, "c.yaml", Options(warn_at=__import__("fractions").Fraction(9, 10))), colour=True)


def test_presentation_helpers():
    from memfit.report.present import cut, pct, shape_text

    assert shape_text([32, 20]) == "[32, 20]" and shape_text([32, 20], "()") == "(32, 20)"
    assert cut("abcdef", 4) == "abc…" and cut("abc", 4) == "abc"
    assert pct(1, 3) == "33.3%" and pct(1, 0) == "-"


# --- the ledger's structure (issue 19) -------------------------------------------------------


def _module_sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"))


def test_only_the_recipe_maps_dtype_names_to_widths():
    """A dtype name becomes bytes in recipe/ alone (recipe/dtypes.py's table, recipe/costs.py's
    dtype_bytes): a dict literal elsewhere that maps two or more dtype names to numbers is a
    second width table, and a `* DTYPES[...]` or `* WIDTH[...]` product is a second formula."""
    from memfit.recipe.dtypes import DTYPES

    offenders = []
    for path, tree in _module_sources():
        if path.parent.name == "recipe":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                names = [k.value for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant) and k.value in DTYPES and isinstance(v, ast.Constant) and isinstance(v.value, (int, float))]
                if len(names) >= 2:
                    offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} maps {names} to widths")
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
                for side in (node.left, node.right):
                    if isinstance(side, ast.Subscript) and isinstance(side.value, ast.Name) and side.value.id in ("DTYPES", "WIDTH", "_WIDTH"):
                        offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} multiplies by {side.value.id}[...]")
    assert not offenders, offenders


def test_no_module_level_mutable_state():
    """No module keeps state between calls (a recipe carried from one check to the next was a
    bug): no `global` statement, and no module-level list, dict or set mutated inside a function."""
    offenders = []
    mutators = {"append", "extend", "insert", "pop", "remove", "clear", "update", "add", "setdefault", "discard", "popitem"}
    for path, tree in _module_sources():
        mutable = set()
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, (ast.List, ast.Dict, ast.Set)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                mutable |= {t.id for t in targets if isinstance(t, ast.Name)}
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            local = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
            for node in ast.walk(fn):
                if isinstance(node, ast.Global):
                    offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} global {node.names}")
                if isinstance(node, ast.Assign):
                    for t in node.targets:
                        if isinstance(t, ast.Name):
                            local.add(t.id)
                        if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id in mutable - local:
                            offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} writes {t.value.id}[...]")
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in mutators:
                    owner = node.func.value
                    if isinstance(owner, ast.Name) and owner.id in mutable - local:
                        offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {owner.id}.{node.func.attr}()")
    assert not offenders, offenders


def test_the_pipeline_only_calls_stages():
    """check/pipeline.py wires the stages: it reads no config.json, knows no transformer internals
    and prices no tensor (models.dispatch, placement, ledger and the recipe do)."""
    tree = ast.parse((PACKAGE / "check" / "pipeline.py").read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported |= {f"{node.module}.{a.name}" for a in node.names} | {node.module}
    internals = {"memfit.models.hf_config", "memfit.models.hf_sharded", "memfit.models.hf_activations", "memfit.models.hf", "memfit.models.keras",
                 "memfit.recipe.costs.tensor_bytes", "memfit.recipe.costs.dtype_bytes", "memfit.recipe.dtypes"}
    assert not imported & internals, imported & internals


def test_the_tests_mirror_the_stages():
    """A module's tests are found by its path: tests/<stage>/ for src/memfit/<stage>/, nothing loose in tests/."""
    tests = ROOT / "tests"
    stages = {p.name for p in (ROOT / "src" / "memfit").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name not in {"__pycache__", "docs_setups"}}
    assert folders - stages <= {"project", "support"}, folders - stages
    loose = sorted(p.name for p in tests.glob("test_*.py"))
    assert not loose, f"tests outside a stage folder: {loose}"
    assert not list((tests / "support").glob("test_*.py")), "tests/support/ holds shared helpers, not tests"


# --- the stage order and the structure rules (issue 31) -------------------------------------
#
# The stages, lowest first: a module imports only its own stage, a lower one, and the shared bottom
# (every import counts: top level, inside functions, under `if TYPE_CHECKING:`). The package root
# (`memfit`, `memfit.__main__`) sits above them all and is importable by each (it loads the calculator
# only: test_the_root_module_imports_only_the_calculator_and_the_cost_model).
STAGES = (
    "read",
    "recipe",
    "config",
    "models",
    "placement",
    "ledger.techniques",  # one module per technique: a rewrite of the step's program
    "ledger",  # the step, its walk and scans (ledger.rewrites applies ledger.techniques)
    "check",
    "report",
    "whatif",
    "editor",
    "api",
    "integrations",
    "cli",
)
# The shared bottom any stage may import: diagnostics/, the recipe's tables (the one dtype table, the
# one optimizer table, the byte costs of a tensor), and models/'s data-only tables (family names
# mapped to what peft and bitsandbytes do with them; the generated config keys). A bottom module
# imports nothing but the bottom.
BOTTOM = ("memfit.diagnostics", "memfit.recipe.dtypes", "memfit.recipe.optim", "memfit.recipe.costs",
          "memfit.models.family_keys", "memfit.models.adapter_tables", "memfit.models.litgpt_configs")
# Stages that may not import a stage below them all the same: rendering reads the results and the
# scans it is handed, never a model's internals or the pipeline.
FORBIDDEN = {"report": {"models", "check"}}

# Imports against the order that stay until the files that make them are split. Each entry is
# (importer, imported): remove it with the move it names; this list only shrinks. (The layout's
# arithmetic a rank's share of the activations needs lives in models/layout.py, which placement reuses.)
STAGE_EXCEPTIONS: set = set()


def stage_of(module: str) -> str | None:
    """The stage a memfit module belongs to (None: the package root, above every stage)."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return None
    if parts[1:3] == ["ledger", "techniques"]:
        return "ledger.techniques"
    return parts[1]


def _in_bottom(module: str) -> bool:
    return any(module == b or module.startswith(b + ".") for b in BOTTOM)


def import_edges(path: Path, name: str, modules: set, text: str | None = None):
    """Every memfit import of one module: (imported module, names, line, enclosing function or None).
    `from a import b` names the module a.b where b is one; a bare package import names the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8") if text is None else text)
    parents = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node

    def function(node):
        while node in parents:
            node = parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node.name
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "memfit":
                    yield alias.name, (), node.lineno, function(node)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "memfit":
                continue
            plain = []
            for alias in node.names:
                if f"{target}.{alias.name}" in modules:
                    yield f"{target}.{alias.name}", (), node.lineno, function(node)
                else:
                    plain.append(alias.name)
            if plain or not node.names:
                yield target, tuple(plain), node.lineno, function(node)


def _all_edges():
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    for name, path in sorted(files.items()):
        for target, names, line, fn in import_edges(path, name, set(files)):
            yield name, path, target, names, line, fn


def _against_the_order(importer: str, target: str) -> bool:
    here, there = stage_of(importer), stage_of(target)
    if there is None or _in_bottom(target):
        return False
    if _in_bottom(importer):  # the bottom imports only the bottom
        return True
    if here is None or here == there:
        return False
    if there in FORBIDDEN.get(here, ()):
        return True
    if there == "diagnostics":
        return False
    return STAGES.index(there) > STAGES.index(here)


def test_every_import_follows_the_stage_order():
    """read -> recipe -> config -> models -> placement -> ledger.techniques -> ledger -> check -> report
    -> whatif -> editor -> api -> integrations -> cli, over diagnostics/ and the recipe's tables:
    every memfit import, function-level ones included, goes to its own stage, a lower one or the bottom."""
    stages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert stages == {s.split(".")[0] for s in STAGES} | {"diagnostics"}, "a new stage: place it in STAGES"
    offenders, used = [], set()
    for importer, path, target, names, line, fn in _all_edges():
        if not _against_the_order(importer, target):
            continue
        key = (importer, target)
        if key in STAGE_EXCEPTIONS:
            used.add(key)
            continue
        where = f" in {fn}()" if fn else ""
        offenders.append(f"{path.relative_to(PACKAGE)}:{line}{where}: {importer} ({stage_of(importer)}) imports {target} {list(names)}")
    assert not offenders, "\n".join(offenders)
    assert used == set(STAGE_EXCEPTIONS), f"fixed, drop from STAGE_EXCEPTIONS: {set(STAGE_EXCEPTIONS) - used}"


def test_the_order_check_sees_what_it_must():
    assert _against_the_order("memfit.models.keras", "memfit.report.present")  # models -> report
    assert _against_the_order("memfit.config.build", "memfit.placement.sharding")  # config -> placement
    assert _against_the_order("memfit.report.reporters", "memfit.check.pipeline")  # report -> check, though above it
    assert _against_the_order("memfit.ledger.techniques.x", "memfit.ledger.step")  # a technique under the ledger
    assert _against_the_order("memfit.recipe.dtypes", "memfit.recipe.precision")  # the bottom imports only the bottom
    assert not _against_the_order("memfit.ledger.rewrites", "memfit.ledger.techniques.x")
    assert not _against_the_order("memfit.ledger.techniques.x", "memfit.recipe.precision")
    assert not _against_the_order("memfit.read.schema", "memfit.recipe.dtypes")  # a table is the bottom
    assert not _against_the_order("memfit.cli.main", "memfit")
    code = "def f():\n    from memfit.report import present\n    from ..check.pipeline import gated\n"
    path = PACKAGE / "models" / "keras.py"
    edges = {(t, fn) for t, _, _, fn in import_edges(path, "memfit.models.keras", {"memfit.report.present", "memfit.check.pipeline"}, code)}
    assert edges == {("memfit.report.present", "f"), ("memfit.check.pipeline", "f")}


# A private name (one starting with an underscore) is its package's: another stage neither imports
# it nor reaches it through a module (`module._name`). The ledger reads the models stage's public names
# (hf.module_tree, hf_activations.layer_sizes, ...) since hf.py and hf_activations.py were split.
PRIVATE_EXCEPTIONS: set = set()


def _private_uses(path: Path, name: str, modules: set):
    """(module, private name, line) for each private name `name` takes from another memfit module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases = {}
    for target, names, line, _ in import_edges(path, name, modules):
        for n in names:
            if n.startswith("_") and not n.startswith("__"):
                yield target, n, line
    for node in ast.walk(tree):  # `from memfit.models import hf as h` / `import memfit.models.hf as h`
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("memfit"):
            for alias in node.names:
                if f"{node.module}.{alias.name}" in modules:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.ImportFrom) and node.level and node.module is None:
            package = name if path.name == "__init__.py" else name.rpartition(".")[0]
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            for alias in node.names:
                if ".".join(base + [alias.name]) in modules:
                    aliases[alias.asname or alias.name] = ".".join(base + [alias.name])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in modules:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            if node.attr.startswith("_") and not node.attr.startswith("__"):
                yield aliases[node.value.id], node.attr, node.lineno


def test_no_private_name_crosses_a_stage():
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    offenders, used = [], set()
    for name, path in sorted(files.items()):
        for target, private, line in _private_uses(path, name, set(files)):
            if stage_of(target) == stage_of(name):
                continue
            if (name, target, private) in PRIVATE_EXCEPTIONS:
                used.add((name, target, private))
                continue
            offenders.append(f"{path.relative_to(PACKAGE)}:{line}: {name} uses {target}.{private}")
    assert not offenders, "\n".join(offenders)
    assert used == set(PRIVATE_EXCEPTIONS), f"fixed, drop from PRIVATE_EXCEPTIONS: {set(PRIVATE_EXCEPTIONS) - used}"


# Sizes. Modules and functions over the limits wait for their split (their files are edited by other
# helpers this session or are owned by one); the lists only shrink.
MODULE_LINES, FUNCTION_LINES = 1200, 120
# hf_activations.py and hf.py are split by family and job (models/hf_act_*.py, models/hf_*.py)
LONG_MODULES: set = set()
LONG_FUNCTIONS: set = set()


def test_no_module_or_function_is_too_long():
    offenders, used = [], set()
    for path, tree in _module_sources():
        where = path.relative_to(PACKAGE).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MODULE_LINES:
            if where in LONG_MODULES:
                used.add(where)
            else:
                offenders.append(f"{where}: {lines} lines (limit {MODULE_LINES})")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > FUNCTION_LINES:
                    if (where, node.name) in LONG_FUNCTIONS:
                        used.add((where, node.name))
                    else:
                        offenders.append(f"{where}:{node.lineno} {node.name}(): {length} lines (limit {FUNCTION_LINES})")
    assert not offenders, "\n".join(offenders)
    assert used == LONG_MODULES | LONG_FUNCTIONS, f"now short enough, drop: {(LONG_MODULES | LONG_FUNCTIONS) - used}"


def test_one_family_class():
    """One `Family`: the family's facts in models/families/. What its blocks save is a facet of it, an
    `ActivationRules` (models/hf_act_ops.py) kept by the family's model_type, not a second family class."""
    found = sorted(f"{path.relative_to(PACKAGE).as_posix()}" for path, tree in _module_sources()
                   for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == "Family")
    assert found == ["models/families/__init__.py"], found
    from memfit.models.families import SUPPORTED
    from memfit.models.hf_act_families import FAMILIES as RULES
    from memfit.models.hf_act_ops import ActivationRules

    assert set(RULES) <= set(SUPPORTED), f"activation rules of no family: {set(RULES) - set(SUPPORTED)}"
    assert all(isinstance(rules, ActivationRules) for rules in RULES.values())


def _model_types() -> set:
    from memfit.models import families, hf_activations
    from memfit.models.adapter_tables import DEFAULT_TARGETS

    return set(families.SUPPORTED) | set(hf_activations.FAMILIES) | set(DEFAULT_TARGETS) | {"t5", "bart", "whisper", "llava"}


# Branches on a model type outside models/ that wait for their file's split; the list only shrinks.
# (torchtune's builders and Phi-3's fused projections are data in models/adapter_tables.py.)
MODEL_TYPE_EXCEPTIONS: set = set()


def _model_type_uses(tree, types: set):
    """Where a literal model type is branched on (a comparison), looked up (`x["gpt2"]`) or keys a table."""

    def named(node):
        if isinstance(node, ast.Constant) and node.value in types:
            return [node.value]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in types]
        return []

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                for value in named(side):
                    yield node.lineno, f"compares with {value!r}"
        elif isinstance(node, ast.Subscript):
            for value in named(node.slice):
                yield node.lineno, f"looks up {value!r}"
        elif isinstance(node, ast.Dict):
            for key in node.keys:
                for value in named(key) if key is not None else ():
                    yield node.lineno, f"keys a table by {value!r}"


def test_no_model_type_branch_outside_models():
    """Family physics and family-specific constants live in models/ (name tables such as peft's default
    targets as data there, models/adapter_tables.py); no other stage branches on a model type."""
    types = _model_types()
    assert {"gpt2", "llama", "t5", "phi3"} <= types
    offenders, used = [], set()
    for path, tree in _module_sources():
        where = path.relative_to(PACKAGE).as_posix()
        if where.startswith("models/"):
            continue
        for line, what in _model_type_uses(tree, types):
            if where in MODEL_TYPE_EXCEPTIONS:
                used.add(where)
            else:
                offenders.append(f"{where}:{line} {what}")
    assert not offenders, "\n".join(offenders)
    assert used == MODEL_TYPE_EXCEPTIONS, f"fixed, drop: {MODEL_TYPE_EXCEPTIONS - used}"
    hits = list(_model_type_uses(ast.parse("if cfg['model_type'] in ('gemma', 'x'):\n    t = {'gpt2': 1}['gpt2']\n"), types))
    assert [what for _, what in hits] == ["compares with 'gemma'", "looks up 'gpt2'", "keys a table by 'gpt2'"]


def test_the_extension_table_names_files_that_exist():
    """docs/architecture.md's "Extending memfit" lists what each extension touches: every path it names
    exists (a `<name>` path: its folder, and the folder's existing modules follow the pattern)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text[text.index("## Extending memfit"):]
    section = section[: section.index("\n## ", 1)]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| extension") and not line.startswith("| ---")]
    kinds = [row.split("|")[1].strip().split(" (")[0] for row in rows]
    assert kinds == ["a family", "a technique", "an optimizer", "an input format", "a layout"], kinds
    paths = {p for p in re.findall(r"`([\w./<>-]+)`", section) if "/" in p and not p.endswith("/")}
    assert len(paths) >= 15, paths
    missing = []
    for path in sorted(paths):
        if "<name>" in path:
            pattern = (ROOT / path).name.replace("<name>", "*")
            if not list((ROOT / path).parent.glob(pattern)):
                missing.append(path)
        elif not (ROOT / path).exists():
            missing.append(path)
    assert not missing, missing


def test_one_registry_of_reporters():
    """Rendering lives in report/: the what-if commands' reporters sit beside check's, and
    report/commands.py's REPORTERS (command -> format -> reporter, check's table its "check" entry) is
    the one registry; a command's module names its entry, never a table of its own."""
    tables = []
    for path, tree in _module_sources():
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            if isinstance(getattr(node, "value", None), ast.Dict) and any(isinstance(t, ast.Name) and "REPORTERS" in t.id for t in targets):
                tables.append(path.relative_to(PACKAGE).as_posix())
    assert sorted(tables) == ["report/commands.py", "report/reporters.py"], tables
    from memfit.report.commands import REPORTERS
    from memfit.report.reporters import REPORTERS as CHECK
    from memfit.whatif import diff, fit, gpus

    assert REPORTERS["check"] is CHECK and (fit.REPORTERS, gpus.REPORTERS, diff.REPORTERS) == (REPORTERS["fit"], REPORTERS["gpus"], REPORTERS["diff"])


# GPT-2's own names for the general keys (GPT2Config.attribute_map: n_layer for num_hidden_layers, ...) are the
# family's: code reads the general key through the family's attribute_map (models/dispatch.layout_dims), not
# `cfg["n_layer"] if gpt2 else cfg["num_hidden_layers"]` again (a reader, below models/, through
# read/native/base.model_value and the generated models/family_keys.ATTRIBUTE_MAPS). Where they are still named,
# by file and count; this list only shrinks.
FAMILY_NAME_USES = {
    "models/hf_layers.py": 3,  # head_dim and num_layers: the rule itself (hf.py before its split)
    "models/hf_params.py": 1,  # and again, in the summary line
    "models/hf_act_eval.py": 4,  # hf_activations' sizes (hf_activations.py before its split)
    "models/hf_act_layers.py": 1,  # and its layer count
    "models/hf_config.py": 6,  # config.json's key table and bounds: every name a config.json may carry
    "models/traced.py": 3,  # an unknown model's attributes: every name a config class may use
    "models/litgpt_configs.py": 18,  # LitGPT's own Config fields (n_embd, n_layer, n_head), which GPT-2's names share
}


def test_gpt2s_own_key_names_stay_in_its_family():
    from memfit.models.families import FAMILIES

    names = set(FAMILIES["gpt2"].attribute_map.values())
    assert {"n_layer", "n_head", "n_embd"} <= names
    found = {}
    for path, tree in _module_sources():
        where = path.relative_to(PACKAGE).as_posix()
        if where.startswith("models/families/") or where == "models/family_keys.py":
            continue
        count = sum(1 for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in names)
        if count:
            found[where] = count
    grown = {w: n for w, n in found.items() if n > FAMILY_NAME_USES.get(w, 0)}
    assert not grown, f"GPT-2's own key names named again (read them through the family's attribute_map): {grown}"
    assert found == FAMILY_NAME_USES, f"fewer now: lower FAMILY_NAME_USES to {found}"


# Per-element widths multiplied outside recipe/ wait for their file's split; the list only shrinks.
WIDTH_PRODUCT_EXCEPTIONS: set = set()


def _width_products(tree):
    """Bytes made by multiplying with a width: `n * w.bytes` (a Width's bytes per element), `n * width(...)` /
    `_width(...)` / `byte_width(...)`, a width read back off a tensor's bytes (`n // elements if n % elements == 0
    else 4`), or asking the recipe for one element's bytes (`dtype_bytes(1, ...)`) to
    multiply it elsewhere. The recipe prices whole tensors: `dtype_bytes(elements, dtype)`, `Recipe.cost`."""
    widths = {"width", "_width", "byte_width", "element_width"}
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for side in (node.left, node.right):
                if isinstance(side, ast.Attribute) and side.attr == "bytes" and "width" in ast.unparse(side.value).lower():
                    yield node.lineno, ast.unparse(node)
                elif isinstance(side, ast.Call) and isinstance(side.func, (ast.Name, ast.Attribute)) and (getattr(side.func, "id", None) or side.func.attr) in widths:
                    yield node.lineno, ast.unparse(node)
        if (isinstance(node, ast.IfExp) and isinstance(node.body, ast.BinOp) and isinstance(node.body.op, ast.FloorDiv)
                and isinstance(node.orelse, ast.Constant) and node.orelse.value in (1, 2, 4, 8)
                and isinstance(node.test, ast.Compare) and isinstance(node.test.left, ast.BinOp) and isinstance(node.test.left.op, ast.Mod)):
            # a width read back off a tensor's bytes (`n // elements if n % elements == 0 else 4`) to multiply elsewhere
            yield node.lineno, ast.unparse(node)
        if isinstance(node, ast.Call) and (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) == "dtype_bytes":
            if node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == 1:
                yield node.lineno, ast.unparse(node)


def test_no_width_product_outside_the_recipe():
    offenders, used = [], set()
    for path, tree in _module_sources():
        where = path.relative_to(PACKAGE).as_posix()
        if where.startswith("recipe/"):
            continue
        for line, text in _width_products(tree):
            if where in WIDTH_PRODUCT_EXCEPTIONS:
                used.add(where)
            else:
                offenders.append(f"{where}:{line} {text}")
    assert not offenders, "\n".join(offenders)
    assert used == WIDTH_PRODUCT_EXCEPTIONS, f"fixed, drop: {WIDTH_PRODUCT_EXCEPTIONS - used}"
    sample = ("per = states * width.bytes\nb = n * _width(d)\nw = dtype_bytes(1, 'bf16')\nok = dtype_bytes(n, 'bf16')\n"
              "width = logits // (b * s) if logits % (b * s) == 0 else 4\n")
    assert [line for line, _ in _width_products(ast.parse(sample))] == [1, 2, 3, 5]

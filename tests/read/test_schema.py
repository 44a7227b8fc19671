"""The JSON Schema: well-formed, documented, shipped in the wheel, usable by other tools."""

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import pytest

from memfit.recipe.dtypes import DTYPES
from memfit.read.schema import schema

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = ROOT / "schemas" / "memfit.schema.json"


def walk_properties(node, path=()):
    if isinstance(node, dict):
        for name, sub in node.get("properties", {}).items():
            yield path + (name,), sub
        for key, sub in node.items():
            yield from walk_properties(sub, path + (key,))
    elif isinstance(node, list):
        for i, sub in enumerate(node):
            yield from walk_properties(sub, path + (i,))


def test_schema_is_draft_2020_12_and_valid():
    data = json.loads(SCHEMA_PATH.read_text())
    assert data["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert data["$id"] and data["title"] and data["description"] and data["examples"]
    jsonschema.Draft202012Validator.check_schema(data)
    assert data == schema()  # the package reads the same file


def test_every_property_has_a_title_and_description():
    missing = [p for p, sub in walk_properties(schema()) if not (sub.get("description") and (sub.get("title") or "$ref" in sub))]
    assert missing == []


def test_typos_cannot_pass_silently():
    def objects(node):
        # an `if` predicate and the layer discriminator that holds them select a branch, they
        # do not describe a shape: the selected branch ($defs/layer_<Type>) is closed instead
        if isinstance(node, dict):
            if "properties" in node and "then" not in node:
                yield node
            for key, sub in node.items():
                if key != "if":
                    yield from objects(sub)
        elif isinstance(node, list):
            for sub in node:
                yield from objects(sub)

    # every object is closed but the inline transformer config, which is read as hf_config reads a
    # config.json (issue 19): its typos are `ignored-key` notes at the key (tests/models/test_transformers_check.py)
    opened = [o.get("title") for o in objects(schema()) if o.get("additionalProperties") is not False]
    assert opened == ["Transformer config"], opened


def test_only_local_refs_so_validation_never_fetches():
    text = SCHEMA_PATH.read_text()
    refs = [part.split('"')[0] for part in text.split('"$ref": "')[1:]]
    assert refs and all(ref.startswith("#") for ref in refs)


def test_dtype_enum_is_the_dtype_table():
    assert schema()["$defs"]["dtype"]["anyOf"][0]["enum"] == list(DTYPES)
    from memfit.recipe.optim import OPTIMIZERS

    assert sorted(schema()["properties"]["optimizer"]["examples"]) == sorted(OPTIMIZERS)


def test_check_jsonschema_validates_the_examples_with_this_schema():
    exe = shutil.which("check-jsonschema")
    assert exe, "check-jsonschema is in the test extra"
    examples = [p for p in sorted((ROOT / "examples").rglob("*.yaml"))]
    result = subprocess.run([exe, "--schemafile", str(SCHEMA_PATH), *map(str, examples)], check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_jsonschema_rejects_a_typo():
    exe = shutil.which("check-jsonschema")
    assert exe
    result = subprocess.run(
        [exe, "--schemafile", str(SCHEMA_PATH), "-"],
        input="memfit: 1\noptimiser: adam\n",
        check=False, capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1


def test_examples_carry_the_yaml_language_server_modeline():
    for path in sorted((ROOT / "examples").rglob("*.yaml")):
        first = path.read_text().splitlines()[0]
        assert first.startswith("# yaml-language-server: $schema="), path
        target = (path.parent / first.split("$schema=", 1)[1]).resolve()
        assert target == SCHEMA_PATH.resolve(), path


@pytest.mark.slow
def test_the_wheel_contains_the_schema(tmp_path):
    import os

    import wheelhouse

    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=False, capture_output=True,
        text=True,
        timeout=600,
        env=wheelhouse.offline(dict(os.environ)),  # the build backend from the local wheels, no index
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = tmp_path.glob("memfit-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = json.loads(archive.read("memfit/memfit.schema.json"))
        assert shipped == schema()
        assert any(name.endswith("entry_points.txt") and b"memfit = memfit.cli.main:main" in archive.read(name) for name in archive.namelist())

"""The names users know (issue 22): the frameworks' names of memfit keys get "did you mean" with the full
memfit key, wherever in the file they are written; enum values match without regard to case."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "src" / "memfit" / "memfit.schema.json").read_text(encoding="utf-8"))
MODEL = ROOT / "examples" / "models" / "llama-3-8b.json"


def memfit(*args):
    return subprocess.run([sys.executable, "-m", "memfit", *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def _resolve(node):
    while "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[1]]
    return node


def _property(path: str):
    """The schema of a dot-separated key path, read from the shipped schema file (None: no such key)."""
    node = SCHEMA
    for part in path.split("."):
        node = _resolve(node).get("properties", {}).get(part)
        if node is None:
            return None
    return node


def test_every_hint_names_a_key_and_a_value_the_schema_accepts():
    from memfit.read.names import FRAMEWORK_NAMES

    for name, target in FRAMEWORK_NAMES.items():
        node = _property(target.key)
        assert node is not None, f"{name} -> {target.key}: no such key in the schema"
        if target.value is not None:
            jsonschema.Draft202012Validator({"$defs": SCHEMA["$defs"], **node}).validate(target.value)
        # a framework name that is itself a memfit key where it is written is no hint's business: the hint
        # is for unknown keys, so a name must not be a top-level key of memfit's own
        assert name not in SCHEMA["properties"], name


ISSUE_NAMES = {
    "per_device_train_batch_size": "training.micro_batch",
    "gradient_accumulation_steps": "training.gradient_accumulation",
    "max_seq_length": "training.seq_len",
    "load_in_4bit": "quantization.method",
    "bnb_4bit_quant_type": "quantization.method",
    "world_size": "parallel.data",
    "zero_stage": "parallel.zero",
    "offload_optimizer": "parallel.offload.optimizer",
    "fsdp": "parallel.fsdp",
}


@pytest.mark.parametrize("where", ["top", "training", "parallel"])
def test_the_issue_names_get_the_memfit_key_wherever_they_are(tmp_path, where):
    """Each name, planted at the top level or inside a section that exists, is reported on its key with the
    memfit key path; every independent problem in one run."""
    body = {"top": "", "training": "", "parallel": ""}
    values = {"load_in_4bit": "true", "bnb_4bit_quant_type": "nf4", "fsdp": "full_shard", "offload_optimizer": "cpu"}
    indent = "" if where == "top" else "  "
    names = {n: k for n, k in ISSUE_NAMES.items() if not (where == "parallel" and n == "fsdp")}  # parallel.fsdp is memfit's own
    for name in names:
        body[where] += f"{indent}{name}: {values.get(name, '4')}\n"
    text = (
        f"memfit: 1\ndevice: {{preset: H100-80GB}}\noptimizer: adamw\nmodel:\n  hf_config: {MODEL}\n"
        f"training:\n  micro_batch: 1\n  seq_len: 1024\n{body['training']}parallel:\n  data: 2\n{body['parallel']}{body['top']}"
    )
    path = tmp_path / "names.yaml"
    path.write_text(text, encoding="utf-8")
    done = memfit("check", str(path))
    lines = text.splitlines()
    out = done.stdout.splitlines()
    for name, key in names.items():
        number = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{name}:")) + 1
        column = lines[number - 1].index(name) + 1
        (line,) = [x for x in out if f"unknown key '{name}'" in x]
        assert line.startswith(f"{path}:{number}:{column}: error[schema]"), line
        assert f"did you mean {key}" in line, line


def test_enum_values_ignore_case(tmp_path):
    def config(fsdp, attention, offload):
        return (
            f"memfit: 1\ndevice: {{preset: H100-80GB}}\noptimizer: adamw\nmodel:\n  hf_config: {MODEL}\n"
            f"training: {{micro_batch: 1, seq_len: 1024, attention: {attention}, checkpointing: FULL}}\n"
            f"parallel: {{data: 8, fsdp: {fsdp}, offload: {{parameters: {offload}, optimizer: {offload}}}}}\n"
        )

    results = []
    for args in (("FULL_SHARD", "SDPA", "CPU"), ("full_shard", "sdpa", "cpu")):
        path = tmp_path / f"{args[0]}.yaml"
        path.write_text(config(*args).replace("FULL}", "FULL}" if args[0].isupper() else "full}"), encoding="utf-8")
        done = memfit("check", "--format", "json", str(path))
        assert done.returncode == 0, done.stdout
        (entry,) = json.loads(done.stdout)["files"]
        results.append((entry["footprint"], entry["peak"]))
    assert results[0] == results[1]
    # two values differing only in case would be ambiguous: none of the schema's enums has such a pair
    from memfit.read.names import _folded

    def enums(node):
        if isinstance(node, dict):
            if isinstance(node.get("enum"), list):
                yield node["enum"]
            for value in node.values():
                yield from enums(value)
        elif isinstance(node, list):
            for value in node:
                yield from enums(value)

    for enum in enums(SCHEMA):
        strings = [v for v in enum if isinstance(v, str)]
        assert len(_folded(tuple(strings))) == len(strings), enum


def test_a_keras_merge_layer_without_inputs_is_told_to_name_them(tmp_path):
    """`{type: Add}` merges the tensors its `inputs` name (a graph): without them, the schema asks for the key."""
    path = tmp_path / "add.yaml"
    path.write_text("memfit: 1\ndevice: {memory: 1 GiB}\noptimizer: adam\nmodel:\n  input_shape: [4]\n  batch_size: 2\n  layers:\n    - {type: Dense, units: 3}\n    - {type: Add}\n", encoding="utf-8")
    done = memfit("check", str(path))
    (line,) = [x for x in done.stdout.splitlines() if "error[" in x]
    assert line.startswith(f"{path}:9:7: error[schema]")
    assert "model.layers[1] is missing the required key 'inputs'" in line and "nearest first" not in line


def _recased(value, flip):
    """The value with each string's case changed by `flip` (a function of the string)."""
    if isinstance(value, str):
        return flip(value)
    if isinstance(value, dict):
        return {k: _recased(v, flip) for k, v in value.items()}
    if isinstance(value, list):
        return [_recased(v, flip) for v in value]
    return value


def test_the_shortcut_respells_what_the_schema_walk_respells():
    """canonical skips its schema walk when no string could be respelled: on every example and native test file, as
    written and with every string upper-cased, lower-cased, title-cased and swapped, it gives what the walk gives."""
    import yaml

    from memfit.read.names import _walked, canonical
    from memfit.read.schema import schema

    root = schema()
    files = sorted((ROOT / "examples").rglob("*.yaml")) + sorted((ROOT / "examples").rglob("*.yml"))
    documents = [yaml.safe_load(p.read_text()) for p in files]
    documents = [d for d in documents if isinstance(d, dict) and "memfit" in d]
    assert len(documents) >= 10
    changed = 0
    for document in documents:
        assert canonical(document, root) is document  # as written, nothing to respell: the walk is skipped
        for flip in (lambda s: s, str.upper, str.lower, str.title, str.swapcase):
            given = _recased(document, flip)
            ours, walked = canonical(given, root), _walked(given, root)
            assert ours == walked
            changed += ours is not given
    assert changed > 0  # the recased copies do get respelled (the shortcut is not always taken)

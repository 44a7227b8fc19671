"""The `model` section: shapes, weights and saved activations of a declared layer stack.

Pure and fast (no frameworks): expectations are the textbook formulas written out by hand;
tests/models/test_frameworks.py checks the same rules against real Keras and PyTorch.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from memfit.check.pipeline import check
from memfit.models.keras import ACTIVATIONS, RULES, snake
from memfit.read.schema import schema

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SEED_LAYERS = [
    {"type": "Conv2D", "filters": 32, "kernel_size": [8, 8], "strides": [4, 4], "padding": "same"},
    {"type": "Activation", "activation": "relu"},
    {"type": "Conv2D", "filters": 64, "kernel_size": 4, "strides": 2, "padding": "same"},
    {"type": "ReLU"},
    {"type": "Conv2D", "filters": 64, "kernel_size": 3, "padding": "same"},
    {"type": "ReLU"},
    {"type": "Flatten"},
    {"type": "Dense", "units": 512},
    {"type": "ReLU"},
    {"type": "Dense", "units": 2},
]


def config_text(input_shape, layers, batch=4, **top) -> str:
    doc = {"memfit": 1, "optimizer": "adam", "device": {"memory": "1 TiB"}, **top, "model": {"input_shape": input_shape, "batch_size": batch, "layers": layers}}
    return yaml.safe_dump(doc, sort_keys=False)


def derived(input_shape, layers, batch=4, **top):
    result = check(config_text(input_shape, layers, batch, **top))
    assert not result.failed, result.diagnostics
    return result.config


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "memfit", *args], check=False, capture_output=True, text=True, cwd=cwd, timeout=60)


# --- shapes and parameter counts, one layer at a time (batch 4) ---------------------------
# (input shape, layer, output shape without batch, parameter count): formulas by hand
ONE_LAYER = [
    ([5, 7], {"type": "Dense", "units": 3}, [5, 3], 7 * 3 + 3),
    ([7], {"type": "Dense", "units": 3, "use_bias": False}, [3], 21),
    ([17, 4], {"type": "Conv1D", "filters": 6, "kernel_size": 3}, [15, 6], 3 * 4 * 6 + 6),
    ([10, 2], {"type": "Conv1D", "filters": 2, "kernel_size": 3, "dilation_rate": 2}, [6, 2], 3 * 2 * 2 + 2),  # floor((10-2*2-1)/1)+1
    ([10, 4], {"type": "Conv1D", "filters": 6, "kernel_size": 3, "groups": 2, "strides": 3}, [3, 6], 3 * 2 * 6 + 6),
    ([80, 80, 4], {"type": "Conv2D", "filters": 32, "kernel_size": 8, "strides": 4, "padding": "same"}, [20, 20, 32], 8 * 8 * 4 * 32 + 32),
    ([9, 8, 3], {"type": "Conv2D", "filters": 5, "kernel_size": [3, 2], "strides": [2, 3]}, [4, 3, 5], 3 * 2 * 3 * 5 + 5),
    ([7, 7, 3], {"type": "Conv2D", "filters": 5, "kernel_size": 2, "strides": 2, "padding": "same"}, [4, 4, 5], 2 * 2 * 3 * 5 + 5),  # ceil(7/2)
    ([6, 7, 5, 2], {"type": "Conv3D", "filters": 3, "kernel_size": 2}, [5, 6, 4, 3], 2 * 2 * 2 * 2 * 3 + 3),
    ([6, 5, 6], {"type": "DepthwiseConv2D", "kernel_size": 3, "depth_multiplier": 2}, [4, 3, 12], 3 * 3 * 6 * 2 + 12),
    ([6, 5, 12], {"type": "SeparableConv2D", "filters": 5, "kernel_size": 2}, [5, 4, 5], 2 * 2 * 12 + 12 * 5 + 5),
    ([5, 5, 3], {"type": "MaxPooling2D"}, [2, 2, 3], 0),
    ([5, 5, 3], {"type": "MaxPooling2D", "padding": "same"}, [3, 3, 3], 0),
    ([7, 2], {"type": "AveragePooling1D", "pool_size": 3, "strides": 1}, [5, 2], 0),
    ([7, 2], {"type": "MaxPooling1D", "padding": "same"}, [4, 2], 0),
    ([7, 6, 2], {"type": "AveragePooling2D", "pool_size": [3, 2]}, [2, 3, 2], 0),
    ([9, 3], {"type": "GlobalMaxPooling1D"}, [3], 0),
    ([9, 4, 3], {"type": "GlobalAveragePooling2D"}, [3], 0),
    ([2, 9, 4, 3], {"type": "GlobalMaxPooling3D"}, [3], 0),
    ([4, 6, 8, 2], {"type": "MaxPooling3D", "pool_size": [1, 2, 3]}, [4, 3, 2, 2], 0),
    ([4, 6, 8, 2], {"type": "AveragePooling3D", "pool_size": 2, "strides": [1, 2, 3]}, [3, 3, 3, 2], 0),
    ([9, 3], {"type": "GlobalAveragePooling1D"}, [3], 0),
    ([9, 4, 3], {"type": "GlobalMaxPooling2D"}, [3], 0),
    ([2, 9, 4, 3], {"type": "GlobalAveragePooling3D"}, [3], 0),
    ([2, 3, 4], {"type": "Flatten"}, [24], 0),
    ([6, 4], {"type": "Reshape", "target_shape": [3, -1]}, [3, 8], 0),
    ([6, 4], {"type": "Reshape", "target_shape": [2, 2, 6]}, [2, 2, 6], 0),
    ([6, 4], {"type": "Dropout", "rate": 0.3}, [6, 4], 0),
    ([6, 4], {"type": "Activation", "activation": "gelu"}, [6, 4], 0),
    ([6, 4], {"type": "ReLU"}, [6, 4], 0),
    ([5, 3], {"type": "BatchNormalization"}, [5, 3], 4 * 3),
    ([5, 3], {"type": "LayerNormalization", "center": False}, [5, 3], 3),
    ([9], {"type": "Embedding", "input_dim": 50, "output_dim": 8}, [9, 8], 400),
    ([5, 7], {"type": "SimpleRNN", "units": 4}, [4], 7 * 4 + 4 * 4 + 4),
    ([5, 7], {"type": "SimpleRNN", "units": 4, "return_sequences": True}, [5, 4], 48),
    ([5, 7], {"type": "LSTM", "units": 3}, [3], 4 * 3 * (7 + 3 + 1)),
    ([5, 7], {"type": "GRU", "units": 5, "return_sequences": True}, [5, 5], 3 * 5 * (7 + 5) + 2 * 3 * 5),  # reset_after: 2 bias rows
    ([5, 7], {"type": "GRU", "units": 5, "reset_after": False}, [5], 3 * 5 * (7 + 5) + 3 * 5),
    ([9, 8], {"type": "MultiHeadAttention", "num_heads": 2, "key_dim": 4}, [9, 8], 4 * (8 * 2 * 4) + 3 * (2 * 4) + 8),
    ([9, 8], {"type": "MultiHeadAttention", "num_heads": 2, "key_dim": 3, "value_dim": 5, "use_bias": False}, [9, 8], 2 * (8 * 2 * 3) + 8 * 2 * 5 + 2 * 5 * 8),
    ([5, 6, 2], {"type": "ZeroPadding2D"}, [7, 8, 2], 0),
    ([5, 6, 2], {"type": "ZeroPadding2D", "padding": [[1, 0], [3, 2]]}, [6, 11, 2], 0),
]


def test_every_layer_type_has_a_case():
    # merge layers take several inputs: tests/test_keras_graphs.py has their cases
    assert {layer["type"] for _, layer, _, _ in ONE_LAYER} == {kind for kind, rule in RULES.items() if not rule.merge}


@pytest.mark.parametrize("input_shape, layer, out, params", ONE_LAYER, ids=lambda v: v["type"] if isinstance(v, dict) else None)
def test_one_layer_shape_and_params(input_shape, layer, out, params):
    config = derived(input_shape, [layer])
    (row,) = config.layers
    assert row.output_shape == [4, *out]
    assert row.params == params
    assert row.params == sum(math.prod(s) for _, s in row.trainable + row.non_trainable)
    assert row.path == ("model", "layers", 0)
    assert config.footprint["parameters"] == 4 * params


def test_output_size_formulas_valid_and_same():
    # valid = floor((n - d(k-1) - 1)/s) + 1 ; same = ceil(n/s), for a grid of sizes
    for n in range(5, 14):
        for k in (1, 2, 3):
            for s in (1, 2, 3):
                valid = derived([n, 1], [{"type": "Conv1D", "filters": 1, "kernel_size": k, "strides": s}]).layers[0].output_shape[1]
                same = derived([n, 1], [{"type": "Conv1D", "filters": 1, "kernel_size": k, "strides": s, "padding": "same"}]).layers[0].output_shape[1]
                assert valid == (n - (k - 1) - 1) // s + 1
                assert same == -(-n // s)


def test_keras_names_and_weight_names():
    config = derived([8, 8, 3], [{"type": "Conv2D", "filters": 2, "kernel_size": 3}, {"type": "BatchNormalization"}, {"type": "ReLU"}, {"type": "Conv2D", "filters": 2, "kernel_size": 3, "name": "head"}, {"type": "Conv2D", "filters": 2, "kernel_size": 1}])
    assert [r.name for r in config.layers] == ["conv2d", "batch_normalization", "re_lu", "head", "conv2d_1"]
    bn = config.layers[1]
    assert bn.trainable == [("batch_normalization/gamma", [2]), ("batch_normalization/beta", [2])]
    assert bn.non_trainable == [("batch_normalization/moving_mean", [2]), ("batch_normalization/moving_variance", [2])]
    assert snake("MultiHeadAttention") == "multi_head_attention" and snake("GlobalMaxPooling2D") == "global_max_pooling2d"


def test_moving_statistics_have_no_gradient_and_no_optimizer_state():
    fp = derived([5, 3], [{"type": "BatchNormalization"}]).footprint
    assert fp["parameters"] == 4 * 3 * 4  # gamma, beta, moving mean, moving variance
    assert fp["gradients"] == 2 * 3 * 4  # gamma, beta only
    assert fp["optimizer_state"] == 2 * 2 * 3 * 4  # adam: 2 states, trainable only


# --- saved activations ----------------------------------------------------------------------
def test_relu_output_is_the_next_dense_input_counted_once():
    layers = [{"type": "Dense", "units": 16}, {"type": "ReLU"}, {"type": "Dense", "units": 8}, {"type": "ReLU"}, {"type": "Dense", "units": 3}]
    config = derived([12], layers, batch=4)
    # input (kept by Dense), relu outputs (kept by ReLU and the next Dense: one tensor), the final output
    assert config.footprint["activations"] == 4 * (12 + 16 + 8 + 3) * 4
    assert [r.saved_bytes for r in config.layers] == [4 * 12 * 4, 4 * 16 * 4, 0, 4 * 8 * 4, 4 * 3 * 4]


def test_seed_model_saved_bytes():
    config = derived([80, 80, 4], SEED_LAYERS, batch=32)
    # conv input + three ReLU outputs (the Flatten is a view) + the Dense's ReLU + the final output
    assert config.footprint["activations"] == 32 * 4 * (80 * 80 * 4 + 20 * 20 * 32 + 10 * 10 * 64 * 2 + 512 + 2) == 6_619_392


def test_saved_tensors_have_their_own_dtypes():
    layers = [
        {"type": "MaxPooling2D"},  # input + int64 indices
        {"type": "BatchNormalization"},  # input + two float32 statistics
        {"type": "Dropout", "rate": 0.5},  # one-byte mask
    ]
    b, acts = 2, {"activations": "bfloat16"}
    config = derived([4, 4, 3], layers, batch=b, dtypes=acts)
    pool, bn, drop = config.layers
    out = b * 2 * 2 * 3
    assert pool.saved_bytes == b * 4 * 4 * 3 * 2 + out * 8
    assert bn.saved_bytes == out * 2 + 2 * 3 * 4
    assert drop.saved_bytes == out * 1 + out * 2  # mask, then the final output (kept by the loss)
    assert ("indices", [b, 2, 2, 3], "int64") in pool.saved


def test_embedding_keeps_int64_ids():
    config = derived([9], [{"type": "Embedding", "input_dim": 50, "output_dim": 8}], batch=3, dtypes={"activations": "float16"})
    assert config.layers[0].saved == [("ids", [3, 9], "int64"), ("output (kept by the loss)", [3, 9, 8], None)]
    assert config.footprint["activations"] == 3 * 9 * 8 + 3 * 9 * 8 * 2


def test_dense_activation_keeps_the_pre_activation_for_gelu_not_relu():
    gelu = derived([6], [{"type": "Dense", "units": 5, "activation": "gelu"}], batch=2).footprint["activations"]
    relu = derived([6], [{"type": "Dense", "units": 5, "activation": "relu"}], batch=2).footprint["activations"]
    assert gelu == 2 * 4 * (6 + 5 + 5)  # input, pre-activation (GELU keeps its input), output
    assert relu == 2 * 4 * (6 + 5)  # input, output (ReLU keeps its output; the loss keeps the same tensor)


def test_every_activation_has_a_rule_and_a_schema_name():
    assert schema()["$defs"]["activation_function"]["enum"] == list(ACTIVATIONS)


def test_explicit_tensors_and_model_add_up():
    text = config_text([4], [{"type": "Dense", "units": 2}], batch=1, parameters=[[10, 10]])
    fp = check(text).config.footprint
    assert fp["parameters"] == (100 + 4 * 2 + 2) * 4


# --- diagnostics through the real CLI, on files ------------------------------------------
def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


HEAD = "memfit: 1\noptimizer: adam\ndevice: {memory: 1 GiB}\nmodel:\n  input_shape: [3, 3, 1]\n  batch_size: 8\n  layers:\n"


@pytest.mark.parametrize(
    "layers, line, words",
    [
        ("    - {type: Dense, units: 4}\n    - type: Conv2D\n      filters: 4\n      kernel_size: 5\n", 9, ["(8, 3, 3, 4)", "kernel 5 is larger than axis 1 (3)", "'valid'"]),
        ("    - {type: Conv2D, filters: 4, kernel_size: 2, dilation_rate: 3}\n", 8, ["dilated to 4", "larger than axis 1 (3)"]),
        ("    - {type: Flatten}\n    - {type: Reshape, target_shape: [5, -1]}\n", 9, ["(8, 9)", "9 is not a multiple of 5"]),
        ("    - {type: Flatten}\n    - {type: Reshape, target_shape: [2, 5]}\n", 9, ["holds 10 elements per sample, the input has 9"]),
        ("    - {type: Flatten}\n    - {type: Conv2D, filters: 2, kernel_size: 1}\n", 9, ["(8, 9)", "rank-4", "not rank 2"]),
        ("    - {type: Conv2D, filters: 4, kernel_size: 1, groups: 3}\n", 8, ["1 input channels are not divisible by groups=3"]),
        ("    - {type: GlobalAveragePooling2D}\n    - {type: LSTM, units: 2}\n", 9, ["(8, 1)", "rank-3", "(batch, timesteps, features)"]),
    ],
)
def test_shape_mismatch_on_the_layer_line(tmp_path, layers, line, words):
    path = write(tmp_path, "model.yaml", HEAD + layers)
    done = run("check", path)
    assert done.returncode == 1
    (first,) = [x for x in done.stdout.splitlines() if "error[" in x]
    assert first.startswith(f"{path}:{line}:")
    assert "error[shape-mismatch]" in first
    for word in words:
        assert word in first, first


def test_keras_accepts_dense_on_rank_3(tmp_path):
    path = write(tmp_path, "ok.yaml", HEAD.replace("[3, 3, 1]", "[5, 7]") + "    - {type: Dense, units: 4}\n")
    done = run("check", "--format", "json", path)
    assert done.returncode == 0, done.stdout
    assert json.loads(done.stdout)["files"][0]["footprint"]["parameters"] == (7 * 4 + 4) * 4


def test_unknown_layer_type_lists_known_types_nearest_first(tmp_path):
    path = write(tmp_path, "typo.yaml", HEAD + "    - {type: Conv2d, filters: 4, kernel_size: 2}\n")
    done = run("check", path)
    assert done.returncode == 1
    line = done.stdout.splitlines()[0]
    assert line.startswith(f"{path}:8:14: error[schema]")
    listed = line.split("nearest first: ")[1].split(", ")
    assert listed[0] == "Conv2D" and sorted(listed) == sorted(RULES)


def test_unknown_layer_argument_is_named(tmp_path):
    path = write(tmp_path, "arg.yaml", HEAD + "    - {type: Dense, unit: 4}\n")
    out = run("check", path).stdout
    assert "unknown key 'unit' in model.layers[0]; did you mean 'units'?" in out


def test_no_traceback_on_odd_layer_items(tmp_path):
    path = write(tmp_path, "odd.yaml", HEAD + "    - 7\n    - {filters: 3}\n    - {type: MaxPooling2D, pool_size: [2, 2, 2]}\n")
    done = run("check", path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "model.layers[2].pool_size has 3 items; it must have at most 2 items" in done.stdout


# --- the seed, explain and the examples ----------------------------------------------------
def test_explain_shows_keras_summary_numbers_for_the_seed():
    import re

    done = run("explain", "--color", "never", str(EXAMPLES / "atari-cnn.yaml"))
    assert done.returncode == 0, done.stdout
    rows = re.findall(r"^(\S+) \((\w+)\)\s+\(([^)]*)\)\s+([\d,]+)", done.stdout, re.MULTILINE)
    assert [count for _, _, _, count in rows if count != "0"] == ["8,224", "32,832", "36,928", "3,277,312", "1,026"]
    assert [shape for name, _, shape, _ in rows if name.startswith("conv2d")] == ["32, 20, 20, 32", "32, 10, 10, 64", "32, 10, 10, 64"]
    assert ("flatten", "Flatten", "32, 6400", "0") in rows
    assert "Total params: 3,356,322" in done.stdout
    assert "Saved for backward: 6,619,392 B" in done.stdout
    assert "kept for backward" in done.stdout


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_examples_pass_check(example):
    done = run("check", str(EXAMPLES / example))
    assert done.returncode == 0, done.stdout


def test_examples_include_the_seed_and_a_second_model():
    for name in ("atari-cnn.yaml", "text-encoder.yaml"):
        assert yaml.safe_load((EXAMPLES / name).read_text())["model"]["layers"], name


# --- the schema ----------------------------------------------------------------------------
def _properties(node, where=""):
    if isinstance(node, dict):
        for key, value in node.get("properties", {}).items():
            yield f"{where}.{key}", value
        for key, value in node.items():
            if isinstance(value, (dict, list)):
                yield from _properties(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _properties(value, f"{where}[{i}]")


def test_model_schema_properties_are_documented():
    doc = schema()
    layer_defs = {k: v for k, v in doc["$defs"].items() if k.startswith("layer_") and k != "layer_type"}
    assert set(layer_defs) == {f"layer_{kind}" for kind in RULES}
    assert doc["$defs"]["layer_type"]["enum"] == list(RULES)
    for name, spec in layer_defs.items():
        assert spec["additionalProperties"] is False, name
    for where, prop in _properties({"model": doc["properties"]["model"], **layer_defs}):
        assert prop.get("title") and prop.get("description"), where


def test_layer_items_are_discriminated_by_type_not_tried_against_every_type():
    layer = schema()["$defs"]["layer"]
    assert "oneOf" not in layer and "anyOf" not in layer
    branches = layer["then"]["allOf"]
    assert len(branches) == len(RULES) and all(set(branch) == {"if", "then"} for branch in branches)


def test_a_big_model_checks_in_work_linear_in_its_layers():
    from work import calls

    def text(n):
        return config_text([64], [{"type": "Dense", "units": 64}, {"type": "ReLU"}, {"type": "Dropout", "rate": 0.1}] * n, batch=8)

    result = check(text(700))
    assert not result.failed and len(result.config.layers) == 2100
    check(text(100))  # imports and caches warmed
    small, large = calls(check, text(100))[1], calls(check, text(300))[1]
    assert large <= 3.3 * small, (small, large)  # three times the layers, at most 3.3 times the calls: no quadratic step


def test_schema_command_includes_the_model(tmp_path):
    done = run("schema")
    model = json.loads(done.stdout)["properties"]["model"]["properties"]
    assert {"input_shape", "batch_size", "layers", "hf_config", "transformer"} <= set(model)
    assert os.path.samefile(ROOT / "schemas" / "memfit.schema.json", ROOT / "src" / "memfit" / "memfit.schema.json")


def test_schema_is_valid_and_the_examples_validate_with_check_jsonschema():
    schema_file = str(ROOT / "schemas" / "memfit.schema.json")
    meta = subprocess.run([sys.executable, "-m", "check_jsonschema", "--check-metaschema", schema_file], check=False, capture_output=True, text=True, timeout=120)
    assert meta.returncode == 0, meta.stdout + meta.stderr
    examples = [str(p) for p in sorted(EXAMPLES.glob("*.yaml"))]
    done = subprocess.run([sys.executable, "-m", "check_jsonschema", "--schemafile", schema_file, *examples], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_duplicate_layer_names_are_refused_as_keras_does(tmp_path):
    body = HEAD + "    - {type: Dense, units: 4, name: head}\n    - {type: Dense, units: 2, name: head}\n"
    done = run("check", write(tmp_path, "dup.yaml", body))
    assert done.returncode == 1
    line = body.splitlines().index("    - {type: Dense, units: 2, name: head}") + 1
    col = body.splitlines()[line - 1].index("head") + 1
    assert f"dup.yaml:{line}:{col}: error[duplicate-layer] layer name 'head' is already used by model.layers[" in done.stdout

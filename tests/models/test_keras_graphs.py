"""Keras graphs: layers that name their `inputs` (Keras's functional API), through the front door.

- examples/resnet50.yaml against keras.applications.ResNet50(weights=None) (Keras 3, torch
  backend, CPU, no weights): `memfit check --format json` gives 4 bytes x count_params(), and
  `memfit explain` lists every layer with Keras's output shape and parameter count, in
  model.layers order.
- An Inception-style block (parallel branches joined by Concatenate) written as a user would,
  against the same block built by hand with keras.layers.
- Saved activations: exactly what plain PyTorch autograd keeps for the same graph (the
  reference of tests/support/keras_reference.py, graph-aware), through the CLI.
- The graph's diagnostics (unknown, later or own name; shapes that do not merge; counts), each
  on the offending node, and the editor offering the merge layers.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import needs
import pytest
import yaml

os.environ.setdefault("KERAS_BACKEND", "torch")
torch = needs.module("torch")
keras = needs.module("keras")

from memfit.check.pipeline import check  # noqa: E402
from memfit.models.keras import RULES  # noqa: E402
from keras_reference import CASES, saved_by_autograd  # noqa: E402  (plain PyTorch, graph-aware)

pytestmark = pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")
ROOT = Path(__file__).resolve().parents[2]
RESNET = ROOT / "examples" / "resnet50.yaml"


def memfit(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "memfit", *args], check=False, capture_output=True, text=True, cwd=cwd, timeout=300, env=env)


def footprint(path) -> dict:
    done = memfit("check", "--format", "json", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["files"][0]["footprint"]


def explained_rows(path) -> list[tuple]:
    """(label, output shape, parameters) of each layer as `memfit explain` prints them: the
    label "name (Type)" in a 31-character column (a longer one ends in an ellipsis)."""
    done = memfit("explain", "--color", "never", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    start = lines.index(next(x for x in lines if x.startswith("Layer (type)"))) + 2
    rows = []
    for line in lines[start:]:
        if line.startswith("---"):
            return rows
        label, rest = line[:31].rstrip(), line[32:]
        shape, count = re.match(r"\(([^)]*)\)\s+([\d,]+)\s", rest).groups()
        rows.append((label, tuple(int(d) for d in shape.split(", ")), int(count.replace(",", ""))))
    raise AssertionError("no end of the layer table")


def keras_rows(model, batch: int) -> list[tuple]:
    return [(f"{layer.name} ({type(layer).__name__})", (batch, *layer.output.shape[1:]), layer.count_params()) for layer in model.layers if type(layer).__name__ != "InputLayer"]


def same_row(mine: tuple, keras_row: tuple) -> bool:
    label, shape, params = mine
    # explain shortens a long "name (Type)" with an ellipsis: the readable part must be Keras's
    readable = label == keras_row[0] or (label.endswith("…") and keras_row[0].startswith(label[:-1]))
    return readable and (shape, params) == keras_row[1:]


def same_rows(ours: list[tuple], theirs: list[tuple]) -> None:
    assert len(ours) == len(theirs)
    for mine, keras_row in zip(ours, theirs):
        assert same_row(mine, keras_row), (mine, keras_row)


def trainable_count(model) -> int:
    return sum(int(torch.tensor(w.shape).prod()) for w in model.trainable_weights)


# --- ResNet-50 --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def resnet50():
    keras.backend.clear_session()
    return keras.applications.ResNet50(weights=None)


def test_resnet50_example_parameters_are_keras_count_params(resnet50):
    doc = yaml.safe_load(RESNET.read_text())
    assert doc["optimizer"] == "sgd_momentum" and doc["precision"] == "32-true" and doc["model"]["input_shape"] == [224, 224, 3]
    fp = footprint(RESNET)
    total, trainable = resnet50.count_params(), trainable_count(resnet50)
    assert total == 25_636_712 and trainable == 25_583_592  # Keras's own figures (BN moving statistics: 53,120)
    assert fp["parameters"] == 4 * total
    assert fp["gradients"] == 4 * trainable  # the moving statistics have no gradient
    assert fp["optimizer_state"] == 4 * trainable  # SGD momentum: one buffer per trained weight


def test_resnet50_example_layers_are_keras_layers(resnet50):
    batch = yaml.safe_load(RESNET.read_text())["model"]["batch_size"]
    ours = explained_rows(RESNET)
    assert len(ours) == 176
    same_rows(ours, keras_rows(resnet50, batch))


def test_resnet50_saved_activations_are_what_autograd_keeps(tmp_path):
    """The example at batch 2 through the CLI, against plain PyTorch autograd on the same graph."""
    small = tmp_path / "resnet50-batch2.yaml"
    small.write_text(RESNET.read_text().replace("  batch_size: 32\n", "  batch_size: 2\n"))
    doc = yaml.safe_load(small.read_text())
    assert doc["model"]["batch_size"] == 2
    saved = saved_by_autograd(doc["model"]["input_shape"], doc["model"]["layers"], batch=2)
    assert footprint(small)["activations"] == saved == 170_329_248


# --- an Inception-style block: parallel branches joined by Concatenate ------------------------
INCEPTION = """\
memfit: 1
optimizer: adam
device: {memory: 1 GiB}
model:
  input_shape: [28, 28, 3]
  batch_size: 4
  layers:
    - {type: Conv2D, name: stem, filters: 16, kernel_size: 3, padding: same, activation: relu}
    - {type: MaxPooling2D, name: stem_pool}
    # four branches from stem_pool, as GoogLeNet's inception module (3a, scaled down)
    - {type: Conv2D, name: b1x1, filters: 8, kernel_size: 1, activation: relu}
    - {type: Conv2D, name: b3x3_reduce, filters: 6, kernel_size: 1, activation: relu, inputs: [stem_pool]}
    - {type: Conv2D, name: b3x3, filters: 12, kernel_size: 3, padding: same, activation: relu}
    - {type: Conv2D, name: b5x5_reduce, filters: 2, kernel_size: 1, activation: relu, inputs: [stem_pool]}
    - {type: Conv2D, name: b5x5, filters: 4, kernel_size: 5, padding: same, activation: relu}
    - {type: MaxPooling2D, name: bpool, pool_size: 3, strides: 1, padding: same, inputs: [stem_pool]}
    - {type: Conv2D, name: bpool_proj, filters: 4, kernel_size: 1, activation: relu}
    - {type: Concatenate, name: mixed, inputs: [b1x1, b3x3, b5x5, bpool_proj]}
    - {type: GlobalAveragePooling2D}
    - {type: Dense, units: 10, activation: softmax}
"""


def inception_by_hand():
    """The same block written with keras.layers, independently of the YAML."""
    L = keras.layers
    keras.backend.clear_session()
    x = keras.Input((28, 28, 3), batch_size=4)
    stem = L.MaxPooling2D(name="stem_pool")(L.Conv2D(16, 3, padding="same", activation="relu", name="stem")(x))
    b1 = L.Conv2D(8, 1, activation="relu", name="b1x1")(stem)
    b3 = L.Conv2D(12, 3, padding="same", activation="relu", name="b3x3")(L.Conv2D(6, 1, activation="relu", name="b3x3_reduce")(stem))
    b5 = L.Conv2D(4, 5, padding="same", activation="relu", name="b5x5")(L.Conv2D(2, 1, activation="relu", name="b5x5_reduce")(stem))
    bp = L.Conv2D(4, 1, activation="relu", name="bpool_proj")(L.MaxPooling2D(3, strides=1, padding="same", name="bpool")(stem))
    mixed = L.Concatenate(name="mixed")([b1, b3, b5, bp])
    return keras.Model(x, L.Dense(10, activation="softmax")(L.GlobalAveragePooling2D()(mixed)))


def test_inception_block_is_exact_against_keras_and_autograd(tmp_path):
    path = tmp_path / "inception.yaml"
    path.write_text(INCEPTION)
    model = inception_by_hand()
    fp = footprint(path)
    assert fp["parameters"] == 4 * model.count_params()
    ours = explained_rows(path)
    assert ("mixed (Concatenate)", (4, 14, 14, 28), 0) in ours
    # Keras orders a functional model's layers by its graph walk; memfit keeps the declared order
    theirs = keras_rows(model, 4)
    assert len(ours) == len(theirs)
    for row in ours:
        assert sum(same_row(row, keras_row) for keras_row in theirs) == 1, row
    doc = yaml.safe_load(INCEPTION)
    assert fp["activations"] == saved_by_autograd(doc["model"]["input_shape"], doc["model"]["layers"], batch=4)


# --- what a graph keeps: each tensor once, however many layers take it ------------------------
def _config(layers, input_shape=(6,), batch=2, **model):
    doc = {"memfit": 1, "optimizer": "sgd", "device": {"memory": "1 GiB"}, "model": {"input_shape": list(input_shape), "batch_size": batch, **model, "layers": layers}}
    return yaml.safe_dump(doc, sort_keys=False)


def test_a_tensor_taken_by_several_layers_is_kept_once():
    layers = [
        {"type": "Dense", "units": 5, "name": "h"},
        {"type": "ReLU", "name": "r"},
        {"type": "Dense", "units": 3, "name": "a"},
        {"type": "Dense", "units": 3, "name": "b", "inputs": ["r"]},
        {"type": "Dense", "units": 3, "name": "c", "inputs": ["r"]},
        {"type": "Concatenate", "inputs": ["a", "b", "c"]},
    ]
    result = check(_config(layers))
    assert not result.failed, result.diagnostics
    # the input (h keeps it), r's output (r, a, b and c keep it: once), the concatenation (the loss)
    assert result.config.footprint["activations"] == 4 * 2 * (6 + 5 + 9)
    rows = {r.name: r.saved_bytes for r in result.config.layers}
    assert rows == {"h": 48, "r": 40, "a": 0, "b": 0, "c": 0, "concatenate": 72}


# merge layers, one case each: (input shapes without batch, layer, output shape without batch, extra saved elements)
MERGES = [
    ([[4, 3], [4, 3]], {"type": "Add"}, [4, 3], 0),
    ([[4, 3], [1, 3]], {"type": "Add"}, [4, 3], 0),  # broadcast, as Keras's Merge allows
    ([[4, 3], [4, 3]], {"type": "Subtract"}, [4, 3], 0),
    ([[4, 3], [4, 3], [4, 3]], {"type": "Average"}, [4, 3], 0),
    ([[4, 3], [4, 3], [4, 3]], {"type": "Multiply"}, [4, 3], 12),  # + the partial product
    ([[4, 3], [4, 3]], {"type": "Maximum"}, [4, 3], 0),
    ([[4, 3], [4, 3], [4, 3]], {"type": "Minimum"}, [4, 3], 12),
    ([[4, 3], [4, 5]], {"type": "Concatenate"}, [4, 8], 0),
    ([[4, 3], [2, 3]], {"type": "Concatenate", "axis": 1}, [6, 3], 0),
]


def test_every_merge_layer_has_a_case():
    assert {layer["type"] for _, layer, _, _ in MERGES} == {kind for kind, rule in RULES.items() if rule.merge}


@pytest.mark.parametrize("shapes, layer, out, extra", MERGES, ids=lambda v: v["type"] if isinstance(v, dict) else None)
def test_merge_shapes_and_what_they_keep(shapes, layer, out, extra):
    # each input a Reshape (a view) of its own slice of the flat input: Dense(n) then Reshape
    sizes = [int(torch.tensor(s).prod()) for s in shapes]
    layers = []
    for k, (shape, size) in enumerate(zip(shapes, sizes)):
        layers.append({"type": "Dense", "units": size, "name": f"d{k}", "inputs": ["input_layer"]})
        layers.append({"type": "Reshape", "target_shape": shape, "name": f"x{k}"})
    layers.append({**layer, "inputs": [f"x{k}" for k in range(len(shapes))]})
    result = check(_config(layers))
    assert not result.failed, result.diagnostics
    row = result.config.layers[-1]
    assert row.output_shape == [2, *out] and row.params == 0
    keeps_inputs = layer["type"] in ("Multiply", "Maximum", "Minimum")  # torch's mul / maximum / minimum backward needs both operands
    # input (6, kept by every Dense once); each Dense's output (its reshape is a view) only when the merge keeps it
    expected = 6 + (sum(sizes) if keeps_inputs else 0) + extra + int(torch.tensor(out).prod())
    assert result.config.footprint["activations"] == 4 * 2 * expected


def test_the_graph_input_can_be_renamed():
    layers = [{"type": "Dense", "units": 3, "name": "a"}, {"type": "Dense", "units": 3, "inputs": ["pixels"]}, {"type": "Add", "inputs": ["a", "dense"]}]
    assert not check(_config(layers, input_name="pixels")).failed
    bad = check(_config(layers))
    assert bad.failed and "'pixels' is no earlier layer's name" in bad.diagnostics[0].message


# --- diagnostics, through the CLI, on the node that is wrong ----------------------------------
HEAD = "memfit: 1\noptimizer: adam\ndevice: {memory: 1 GiB}\nmodel:\n  input_shape: [8, 8, 3]\n  batch_size: 2\n  layers:\n"
BODY = "    - {type: Conv2D, name: stem, filters: 4, kernel_size: 3, padding: same}\n    - {type: ReLU, name: stem_relu}\n    - {type: Conv2D, filters: 4, kernel_size: 3, padding: same}\n"


@pytest.mark.parametrize(
    "last, token, code, words",
    [
        ("{type: Add, inputs: [stem_rleu, conv2d]}", "stem_rleu", "bad-layer-input", ["'stem_rleu' is no earlier layer's name; did you mean 'stem_relu'?"]),
        ("{type: Add, inputs: [stem_relu, head]}\n    - {type: Dense, units: 2, name: head}", "head", "bad-layer-input", ["model.layers[4], which comes later", "a cycle has no order"]),
        ("{type: ReLU, name: loop, inputs: [loop]}", "loop]", "bad-layer-input", ["ReLU cannot take its own output ('loop')"]),
        ("{type: Concatenate, axis: 2, inputs: [stem, input_layer]}", "[stem", "shape-mismatch", ["(2, 8, 8, 4) from 'stem' and (2, 8, 8, 3) from 'input_layer'", "axis 3 is 4 in one and 3 in another"]),
        ("{type: Multiply, inputs: [stem, input_layer]}", "[stem", "shape-mismatch", ["Multiply cannot take the shapes (2, 8, 8, 4) from 'stem' and (2, 8, 8, 3) from 'input_layer'"]),
        ("{type: Subtract, inputs: [stem, conv2d, stem_relu]}", "[stem", "schema", ["model.layers[3].inputs has 3 items; it must have at most 2 items"]),
        ("{type: Dense, units: 2, inputs: [stem, conv2d]}", "[stem", "schema", ["model.layers[3].inputs has 2 items; it must have at most 1 item"]),
        ("{type: Add}", "{type: Add}", "schema", ["model.layers[3] is missing the required key 'inputs'"]),
    ],
)
def test_graph_mistakes_are_positioned(tmp_path, last, token, code, words):
    text = HEAD + BODY + f"    - {last}\n"
    path = tmp_path / "graph.yaml"
    path.write_text(text)
    done = memfit("check", str(path))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (first,) = [x for x in done.stdout.splitlines() if "error[" in x]
    line = 11
    column = text.splitlines()[line - 1].index(token) + 1
    if code == "schema" and token.startswith("{"):
        column = 7  # a missing key: the item itself
    assert first.startswith(f"{path}:{line}:{column}: error[{code}]"), first
    for word in words:
        assert word in first, first


def test_the_editor_offers_the_merge_layers():
    from memfit.editor.editor import choices, completion_context

    lines = ["    - {type: Ad"]
    vocabulary, _ = completion_context(lines, 0, len(lines[0]))
    offered = [c.label for c in choices(vocabulary)]
    assert {"Add", "Concatenate", "Multiply", "ZeroPadding2D"} <= set(offered) and sorted(offered) == sorted(RULES)


# --- the gated peak of a graph, against PyTorch's MemTracker on the same graph -----------------
def _bottleneck(name, source, filters, stride, project):
    """keras.applications.resnet's block1 (v1: the stride on the first 1x1), scaled down."""
    out = [
        {"type": "Conv2D", "name": f"{name}_1_conv", "filters": filters, "kernel_size": 1, "strides": stride, "inputs": [source]},
        {"type": "BatchNormalization", "name": f"{name}_1_bn"},
        {"type": "Activation", "name": f"{name}_1_relu", "activation": "relu"},
        {"type": "Conv2D", "name": f"{name}_2_conv", "filters": filters, "kernel_size": 3, "padding": "same"},
        {"type": "BatchNormalization", "name": f"{name}_2_bn"},
        {"type": "Activation", "name": f"{name}_2_relu", "activation": "relu"},
        {"type": "Conv2D", "name": f"{name}_3_conv", "filters": 4 * filters, "kernel_size": 1},
        {"type": "BatchNormalization", "name": f"{name}_3_bn"},
    ]
    shortcut = source
    if project:
        out += [
            {"type": "Conv2D", "name": f"{name}_0_conv", "filters": 4 * filters, "kernel_size": 1, "strides": stride, "inputs": [source]},
            {"type": "BatchNormalization", "name": f"{name}_0_bn"},
        ]
        shortcut = f"{name}_0_bn"
    return out + [
        {"type": "Add", "name": f"{name}_add", "inputs": [shortcut, f"{name}_3_bn"]},
        {"type": "Activation", "name": f"{name}_out", "activation": "relu"},
    ]


RESNET_STAGE = (
    [12, 12, 8],
    [
        {"type": "Conv2D", "name": "stem", "filters": 8, "kernel_size": 3, "padding": "same"},
        {"type": "Activation", "name": "stem_relu", "activation": "relu"},
        *_bottleneck("b1", "stem_relu", 4, 2, True),
        *_bottleneck("b2", "b1_out", 4, 1, False),
        {"type": "GlobalAveragePooling2D"},
        {"type": "Dense", "units": 5},
    ],
)
BAND = 0.05  # as tests/ledger/test_peak.py's Keras-form peaks


def memfit_peak(input_shape, layers, batch, optimizer, impl):
    """The gated peak of the run as a config says it (a training section names the implementation)."""
    text = yaml.safe_dump({"memfit": 1, "optimizer": optimizer, "device": {"memory": "1 TiB"}, "training": {"optimizer_impl": impl},
                           "model": {"input_shape": input_shape, "batch_size": batch, "layers": layers}})
    result = check(text)
    assert not result.failed, result.diagnostics
    return result.config.peak


PEAK_GRAPHS = {
    "resnet-stage": (*RESNET_STAGE, 8),
    "inception": ("graph-inception-block", 8),
    "merges": ("graph-merges", 16),
}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("graph", sorted(PEAK_GRAPHS))
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_graph_peak_within_the_band_of_memtracker(graph, optimizer):
    import peak_reference as ref

    case = PEAK_GRAPHS[graph]
    (input_shape, layers), batch = (CASES[case[0]], case[1]) if len(case) == 2 else (case[:2], case[2])
    theirs = ref.measure_keras(input_shape, layers, batch, optimizer, "foreach")
    ours = memfit_peak(input_shape, layers, batch, optimizer, "foreach")
    assert ours["live"]["parameters"] == theirs["parameters"]
    assert abs(ours["bytes"] - theirs["bytes"]) <= BAND * theirs["bytes"], (ours["bytes"], theirs["bytes"], ours["phase"], theirs["phase"])
    assert ours["phase"] == theirs["phase"]


def test_a_layer_cannot_take_the_name_of_the_graph_input():
    layers = [{"type": "Dense", "units": 3, "name": "input_layer"}, {"type": "Dense", "units": 3, "inputs": ["input_layer"]}]
    result = check(_config(layers))
    assert result.failed
    (problem,) = [d for d in result.diagnostics if d.code == "duplicate-layer"]
    assert "'input_layer' is the model's input (model.input_name)" in problem.message


def test_a_dead_branch_is_a_warning_and_still_counted(tmp_path):
    """Keras's Model(inputs, outputs) leaves out a layer no path to the output goes through; memfit
    counts what is written and says so on that layer."""
    path = tmp_path / "dead.yaml"
    path.write_text(HEAD + BODY + "    - {type: Dense, units: 5, name: probe, inputs: [stem]}\n    - {type: Add, inputs: [stem_relu, conv2d]}\n")
    done = memfit("check", "--format", "json", str(path))
    assert done.returncode == 0, done.stdout
    entry = json.loads(done.stdout)["files"][0]
    (warning,) = entry["diagnostics"]
    assert warning["code"] == "unused-layer" and warning["severity"] == "warning" and "'probe'" in warning["message"]
    assert warning["range"]["start"]["line"] == 10  # 0-based: the probe's line, at its name
    conv = 3 * 3 * 3 * 4 + 4 + 3 * 3 * 4 * 4 + 4
    assert entry["footprint"]["parameters"] == 4 * (conv + 4 * 5 + 5)

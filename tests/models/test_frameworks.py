"""memfit's layer rules against the real frameworks (the `frameworks` extra; CI installs it).

- Keras 3 (PyTorch backend, CPU): for every layer type and a few whole models, each layer's
  output shape, each weight's name, shape (Keras layout) and trainable flag, and the defaults.
- Plain PyTorch: the bytes autograd keeps for backward in training, recorded with
  torch.autograd.graph.saved_tensors_hooks, distinct storages counted once, parameters and
  buffers excluded, plus the model's output (the loss keeps it) — compared exactly with
  memfit's activations. Keras on the torch backend adds layout copies of its own, so the
  reference is plain PyTorch on the same channels-last tensors (permuted views, no copies).
- torch.optim: the per-parameter state tensors each optimizer keeps, against OPTIMIZER_STATES.
"""

from __future__ import annotations

import os
from pathlib import Path

import needs
import pytest
import yaml

os.environ.setdefault("KERAS_BACKEND", "torch")
torch = needs.module("torch")
keras = needs.module("keras")
F = torch.nn.functional

from memfit.recipe.calculator import OPTIMIZER_STATES
from memfit.check.pipeline import check
from memfit.models.keras import RULES, defaults

# toggling oneDNN off around each reference run makes torch warn about TF32 on Intel GPUs
pytestmark = pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")
from keras_reference import ACT_FN, ACTS, B, CASES, KERAS_ONLY, SEED, Reference, saved_by_autograd  # noqa: E402,F401
from peak_reference import TORCH_OPTIMIZERS as OPTIMIZERS  # noqa: E402

def test_every_layer_type_is_cross_checked():
    used = {layer["type"] for _, layers in CASES.values() for layer in layers}
    assert used == set(RULES)
    assert {layer["activation"] for _, layers in CASES.values() for layer in layers if layer["type"] == "Activation"} == set(ACTS)


def memfit(input_shape, layers, batch=B):
    text = yaml.safe_dump({"memfit": 1, "optimizer": "sgd", "device": {"memory": "1 TiB"}, "model": {"input_shape": input_shape, "batch_size": batch, "layers": layers}})
    result = check(text)
    assert not result.failed, result.diagnostics
    return result.config


# --- Keras ------------------------------------------------------------------------------
def keras_model(input_shape, layers):
    keras.backend.clear_session()  # automatic names restart at conv2d, conv2d_1, ...
    ids = layers[0]["type"] == "Embedding"
    x = inputs = keras.Input(tuple(input_shape), batch_size=B, dtype="int32" if ids else "float32")
    made = {inputs._keras_history[0].name: inputs}  # layer name -> its output, for `inputs`
    built = []
    for spec in layers:
        args = {k: v for k, v in spec.items() if k not in ("type", "inputs")}
        if "kernel_size" in args and isinstance(args["kernel_size"], list):
            args["kernel_size"] = tuple(args["kernel_size"])
        if spec["type"] == "ZeroPadding2D" and isinstance(args.get("padding"), list):
            args["padding"] = tuple(tuple(v) if isinstance(v, list) else v for v in args["padding"])
        layer = getattr(keras.layers, spec["type"])(**args)
        given = [made[name] for name in spec["inputs"]] if "inputs" in spec else [x]
        if RULES[spec["type"]].merge:
            x = layer(given)
        else:
            x = layer(given[0], given[0]) if spec["type"] == "MultiHeadAttention" else layer(given[0])
        made[layer.name] = x
        built.append((layer, tuple(x.shape)))
    return keras.Model(inputs, x), built


@pytest.mark.parametrize("case", sorted({**CASES, **KERAS_ONLY}))
def test_shapes_and_weights_match_keras(case):
    input_shape, layers = {**CASES, **KERAS_ONLY}[case]
    config = memfit(input_shape, layers)
    model, built = keras_model(input_shape, layers)
    assert len(config.layers) == len(built)
    for row, (layer, shape) in zip(config.layers, built):
        assert row.name == layer.name
        assert tuple(row.output_shape) == shape, (row.name, row.output_shape, shape)
        ours = [(n, tuple(s), True) for n, s in row.trainable] + [(n, tuple(s), False) for n, s in row.non_trainable]
        theirs = [(w.path.split("/", 1)[1] if w.path.startswith(model.name + "/") else w.path, tuple(w.shape), w.trainable) for w in layer.weights]
        assert sorted(ours) == sorted(theirs), row.name
        assert row.params == layer.count_params()
    assert sum(r.params for r in config.layers) == model.count_params()


def test_seed_model_matches_keras_summary():
    config = memfit(*SEED)
    model, built = keras_model(*SEED)
    keras_params = [layer.count_params() for layer, _ in built if layer.count_params()]
    assert keras_params == [8224, 32832, 36928, 3277312, 1026] == [r.params for r in config.layers if r.params]
    assert model.count_params() == 3356322


def _keras_default(value):
    if isinstance(value, (tuple, list)):
        value = tuple(_keras_default(v) for v in value)
        if len(set(value)) == 1:
            return value[0]
    return value


NULL_MEANS = {"strides": "pool_size", "value_dim": "key_dim"}
REQUIRED = {
    "units": 3, "filters": 2, "kernel_size": 2, "rate": 0.5, "activation": "relu", "target_shape": [4],
    "input_dim": 5, "output_dim": 2, "num_heads": 2, "key_dim": 2, "pool_size": 3,
}


@pytest.mark.parametrize("kind", sorted(RULES))
def test_defaults_are_keras_defaults(kind):
    from memfit.read.schema import schema

    spec = schema()["$defs"][f"layer_{kind}"]
    args = {k: REQUIRED[k] for k in spec["required"] if k not in ("type", "inputs")}
    got = getattr(keras.layers, kind)(**args).get_config()
    for key, ours in defaults()[kind].items():
        theirs = _keras_default(got[key] if key in got else getattr(getattr(keras.layers, kind)(**args), key))
        if ours is None:  # null stands for another argument's value, which Keras fills in
            ours = _keras_default(got[NULL_MEANS[key]])
        if key == "activation" and kind != "Activation":
            theirs = theirs or "linear"
        assert ours == theirs, (kind, key, ours, theirs)


@pytest.mark.parametrize("case", sorted(CASES))
def test_saved_activations_match_pytorch_autograd(case):
    input_shape, layers = CASES[case]
    config = memfit(input_shape, layers)
    assert config.footprint["activations"] == saved_by_autograd(input_shape, layers)


def test_seed_saved_activations_at_batch_32():
    config = memfit(*SEED, batch=32)
    assert config.footprint["activations"] == saved_by_autograd(*SEED, batch=32) == 6_619_392


# --- torch.optim state (peak_reference.TORCH_OPTIMIZERS: each memfit optimizer as torch.optim builds it) --------


def test_every_optimizer_but_lion_is_cross_checked():
    assert set(OPTIMIZER_STATES) - set(OPTIMIZERS) == {"lion"}
    assert not hasattr(torch.optim, "Lion")  # Lion's 1 state follows the reference implementations


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_states_match_torch_optim(name):
    weight = torch.nn.Parameter(torch.randn(3, 5))
    optimizer = OPTIMIZERS[name]([weight])
    (weight**2).sum().backward()
    optimizer.step()
    state = optimizer.state[weight]
    full = [v for v in state.values() if torch.is_tensor(v) and v.shape == weight.shape]
    assert len(full) == OPTIMIZER_STATES[name]


MODEL_EXAMPLES = sorted(p.name for p in (Path(__file__).resolve().parents[2] / "examples").glob("*.yaml") if "layers" in yaml.safe_load(p.read_text()).get("model", {}))


@pytest.mark.parametrize("example", MODEL_EXAMPLES)
def test_example_models_match_keras_and_autograd(example):
    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / example).read_text())
    input_shape, layers = doc["model"]["input_shape"], doc["model"]["layers"]
    config = memfit(input_shape, layers)
    model, built = keras_model(input_shape, layers)
    assert [tuple(r.output_shape) for r in config.layers] == [shape for _, shape in built]
    assert [r.params for r in config.layers] == [layer.count_params() for layer, _ in built]
    assert sum(r.params for r in config.layers) == model.count_params()
    assert config.footprint["activations"] == saved_by_autograd(input_shape, layers)

"""Which model derivation a document's `model` section asks for (keras.py: a Keras-style layer
stack; hf.py: a transformer from a Hugging Face config.json), after the rules that tie the model
to `training`: one form, one batch size."""

from __future__ import annotations

from importlib import import_module

KERAS_KEYS = ("input_shape", "batch_size", "layers", "input_name")
TRANSFORMER_KEYS = ("hf_config", "transformer")


def derive(data: dict, config, path: str = "<text>") -> tuple:
    """What the document's model section emits (config.build.Emitted: its tensors priced by the config's recipe,
    the Keras form's layer rows, the transformer's Model) and the problems found. The config is only read."""
    from memfit.config.build import Emitted

    out = Emitted(config.recipe)
    return out, _derive(data, out, path)


def _derive(data: dict, out, path: str) -> list:
    from memfit.diagnostics import codes
    from memfit.diagnostics.diagnostic import Problem

    model = data["model"]
    keys = list(model)
    transformer = [k for k in keys if k in TRANSFORMER_KEYS]
    keras_keys = [k for k in keys if k in KERAS_KEYS]
    if len(transformer) > 1:
        return [Problem(("model", transformer[1]), codes.SCHEMA, "model takes hf_config or transformer, not both", on_key=True)]
    if transformer and keras_keys:
        second = max(transformer[0], keras_keys[0], key=keys.index)
        return [
            Problem(
                ("model", second),
                codes.SCHEMA,
                "model is either a transformer (hf_config / transformer) or a Keras layer stack (input_shape, batch_size, layers), not both",
                on_key=True,
            )
        ]
    if transformer:
        from memfit.models import hf

        problems = hf.derive(data, out, path, tails={block: _tail(name) for block, name in TAILS.items()})
        if any(p.code == codes.UNSUPPORTED_MODEL for p in problems):
            from memfit.models import traced  # no family: with memfit[trace], transformers builds it on the meta device

            return traced.derive(data, out, path, problems)
        if out.model is not None:
            _add_buffers(out, ("model", transformer[0]))
        return problems

    missing = [k for k in ("input_shape", "layers") if k not in model]
    if missing:
        return [Problem(("model",), codes.SCHEMA, f"model needs {' and '.join(missing)} (a Keras layer stack), or hf_config / transformer", on_key=True)]
    training = data.get("training", {})
    batch = model.get("batch_size")
    if "micro_batch" in training:
        if batch is not None and batch != training["micro_batch"]:
            # the second of the two in the document is the one that disagrees
            second = ("training", "micro_batch") if list(data).index("training") > list(data).index("model") else ("model", "batch_size")
            return [Problem(second, codes.SCHEMA, f"model.batch_size {batch} and training.micro_batch {training['micro_batch']} disagree: they are the same batch axis")]
        batch = training["micro_batch"]
    if batch is None:
        return [Problem(("model",), codes.SCHEMA, "model needs a batch size: training.micro_batch (or model.batch_size)", on_key=True)]
    from memfit.models import keras

    tensors, problems = keras.derive({**model, "batch_size": batch}, out)
    out.tensors.extend(tensors)
    return problems


# The families whose step is a module of its own, handed to hf.derive as its tail: Whisper's (models/whisper.py), DeBERTa-v2's
# and ModernBERT's (models/deberta.py, models/modernbert.py, over models/encoders.py), by the family's block
TAILS = {"whisper": "whisper", "deberta_v2": "deberta", "modernbert": "modernbert"}


def _tail(name: str):
    """A family's step (models/<name>.derive), its module loaded by name when a config of that family is derived: a
    check of another family imports none of them."""
    return lambda *args: import_module(f"memfit.models.{name}").derive(*args)


def _add_buffers(out, where: tuple) -> None:
    """The model's registered buffers (models/buffers.py) as non-trainable parameter tensors, before the first
    layer's parameters (the step's walk holds them with the embeddings; a layer's own, DeepSeek-V3's router bias,
    with that layer): on the device for the whole step, no gradient, no optimizer state."""
    from memfit.config.build import make_tensor
    from memfit.models import hf, hf_activations as acts
    from memfit.models.buffers import buffers
    from memfit.recipe.costs import width

    model = out.model
    sizes = acts.layer_sizes(model.cfg, model.training["micro_batch"], model.training["seq_len"])
    cast = acts.role_dtypes(model.recipe.get("precision", "32-true"), model.dtypes)["act"]
    made = [make_tensor("parameters", where, b.name, list(b.shape), 1, False, width(b.dtype or cast), out)
            for b in buffers(model.cfg, sizes["rot"])]
    for t in made:
        t.buffer = True
    prefix = hf.layer_prefix(model.cfg)
    at = next((i for i, t in enumerate(out.tensors) if t.category == "parameters" and t.name.split("base_model.model.")[-1].startswith(prefix)),
              len(out.tensors))
    out.tensors[at:at] = made


def transformer_config(data: dict, path: str) -> dict | None:
    """The normalized config of a transformer model section (`transformer` inline or `hf_config`
    beside the checked file); None when there is none or it cannot be read (the model derivation
    reports that)."""
    import os

    model = data.get("model")
    if not isinstance(model, dict) or not ({"transformer", "hf_config"} & set(model)):
        return None
    from memfit.models.hf_config import LoadError, load, model_view, normalize, validate

    raw = model.get("transformer")
    if raw is None:
        base = os.path.dirname(path) if path and not path.startswith("<") else "."
        try:
            raw = load(os.path.normpath(os.path.join(base, os.path.expanduser(str(model["hf_config"]))))).raw
        except LoadError:
            return None
    if not isinstance(raw, dict) or validate(raw):
        return None
    return model_view(normalize(raw))


def stage_activations(config) -> list | None:
    """A transformer's saved activations per pipeline stage on its most-loaded rank, as Megatron
    splits them (models.hf_sharded), under the recipe the footprint uses; None for other models."""
    model = getattr(config, "model", None)  # models.hf.Model: the training keys in force
    if model is None or not hasattr(model, "cfg"):
        return None
    if config.parallel.tensor == 1 and config.parallel.pipeline == 1:
        # every data rank runs the whole model on its own micro-batch: its activations are the
        # model's own rows, as the footprint and the step count them (LoRA, QLoRA and the recipe
        # included; Megatron's per-rank split has nothing to split)
        return None
    from memfit.models.hf_sharded import activations_per_stage

    t = model.training
    recipe = getattr(model, "recipe", None) or {}
    precision = recipe.get("precision", "32-true")  # as the footprint's
    try:
        return activations_per_stage(
            model.cfg, config.parallel, micro_batch=t["micro_batch"], seq_len=t["seq_len"],
            attention=t["attention"], checkpointing=t["checkpointing"], dtypes=model.dtypes, precision=precision,
            moe=recipe.get("moe"),
        )
    except (ValueError, KeyError):  # a model hf_activations does not cover: its rows, as derived
        return None


def layout_dims(cfg: dict | None) -> dict:
    """Heads, KV heads, layers and routed experts, for the layout checks."""
    if cfg is None:
        return {}
    from memfit.models.families import EXPERTS_KEY, own_name

    def value(key: str):   # under the family's own name (GPT-2's n_head, n_layer)
        return cfg.get(own_name(cfg.get("model_type"), key))

    heads = value("num_attention_heads")
    out = {"heads": heads, "kv_heads": value("num_key_value_heads") or heads, "layers": value("num_hidden_layers")}
    if cfg.get("model_type") in EXPERTS_KEY:  # the routed experts parallel.expert divides
        out["experts"] = cfg.get(EXPERTS_KEY[cfg["model_type"]])
    elif cfg.get("model_type") == "llama4_text":   # experts that take every token (models.hf refuses parallel.expert)
        out["experts"] = cfg.get("num_local_experts")
    return out

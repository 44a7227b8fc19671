"""Which model derivation a document's `model` section asks for (keras.py: a Keras-style layer
stack; hf.py: a transformer from a Hugging Face config.json), after the rules that tie the model
to `training`: one form, one batch size."""

from __future__ import annotations

KERAS_KEYS = ("input_shape", "batch_size", "layers")
TRANSFORMER_KEYS = ("hf_config", "transformer")


def derive(data: dict, config, path: str = "<text>") -> list:
    """Tensors of the document's model section appended to config.tensors; the problems found."""
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

        return hf.derive(data, config, path)

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

    tensors, problems = keras.derive({**model, "batch_size": batch}, config)
    config.tensors.extend(tensors)
    return problems

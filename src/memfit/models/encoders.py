"""The step of a family whose saved tensors are computed here, without torch (DeBERTa-v2: models/deberta.py,
ModernBERT: models/modernbert.py), handed to the machinery the `[trace]` fallback prices a measured step with
(models/traced.py: a Traced model and a Measured step), as models/whisper.py does for Whisper.

A family module gives:
- `parameters(cfg)`: named_parameters() of the class transformers builds, in order (tied weights once);
- `linears(cfg)`: (module name, in, out, bias) of every nn.Linear;
- `buffers(cfg)`: (name, shape, dtype) of named_buffers();
- `layer_prefix(cfg)`: the name prefix of the layer list ("deberta.encoder.layer.");
- `why_not(cfg, training, precision, adapted)`: why these settings are outside what the module computes ("" inside);
- `step(cfg, micro_batch, seq_len, attention, recomputed=False)`: what autograd keeps: (embeddings, [each layer's],
  [each layer's checkpoint boundary], head, loss), each a list of (label, shape, dtype); `recomputed`: each layer as
  full checkpointing's backward recomputes it alone (what layers share counted in each); `overlap(cfg, b, s)`: what a layer
  keeps that is its checkpoint boundary (its input, counted once while the backward recomputes it);
- `summary(cfg)`: the hover line; `sizes(cfg)`: the generic rule's sizes (models/traced.Traced.sizes).
"""

from __future__ import annotations

F32, I64, BOOL = "float32", "int64", "bool"


def elements(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def size(kept) -> int:
    from memfit.recipe.costs import dtype_bytes

    return sum(dtype_bytes(elements(shape), dtype) for _, shape, dtype in kept)


def norm(tag: str, b: int, s: int, h: int) -> list:
    """A LayerNorm: its input and the (.., 1) mean and reciprocal standard deviation."""
    return [(f"{tag}: input", (b, s, h), F32), (f"{tag}: mean", (b, s, 1), F32), (f"{tag}: rstd", (b, s, 1), F32)]


def cross_entropy(rows: int, classes: int) -> list:
    """CrossEntropyLoss (mean): the log-softmax of the logits, the targets and the total weight."""
    return [("log-softmax of the logits", (rows, classes), F32), ("targets (the labels)", (rows,), I64), ("total weight", (), F32)]


def _grouped(layers: list) -> list:
    out: list = []
    for kept in layers:
        if out and out[-1][2] == tuple(kept):
            out[-1] = ("layer", out[-1][1] + 1, out[-1][2])
        else:
            out.append(("layer", 1, tuple(kept)))
    return out


def measured(module, cfg: dict, micro_batch: int, seq_len: int, attention: str, checkpointing: str):
    """The step as models/traced.Measured: blocks (embeddings, the layers in order, head, loss), the peak of live saved
    bytes (full checkpointing; else every saved byte) and each layer's recomputation. Under full checkpointing the
    peak is the largest of the end of the forward and each layer's recomputation in the backward (once the head, the
    loss and the layers after it have released what they kept: the layers before it keep their boundaries)."""
    from memfit.models.traced import Measured

    embeddings, layers, boundaries, head, loss = module.step(cfg, micro_batch, seq_len, attention)
    run = (micro_batch, seq_len, attention, checkpointing, "32-true", "")
    if checkpointing != "full":
        blocks = [("embeddings", 1, tuple(embeddings)), *_grouped(layers), ("head", 1, tuple(head)), ("loss", 1, tuple(loss))]
        return Measured(run, tuple(blocks), sum(count * size(kept) for _, count, kept in blocks), (), len(layers), len(layers))
    blocks = [("embeddings", 1, tuple(embeddings)), *_grouped(boundaries), ("head", 1, tuple(head)), ("loss", 1, tuple(loss))]
    layers = module.step(cfg, micro_batch, seq_len, attention, recomputed=True)[1]   # what several layers share (a
    # rotary cos/sin) is saved again by each recomputation: the backward recomputes one layer at a time
    moments = [sum(count * size(kept) for _, count, kept in blocks)]
    overlap = size(module.overlap(cfg, micro_batch, seq_len))
    held = size(embeddings)
    for i, kept in enumerate(layers):
        held += size(boundaries[i])
        moments.append(held + size(kept) - overlap)
    return Measured(run, tuple(blocks), max(moments), tuple(tuple(k) for k in layers), len(layers), len(layers))


def traced_model(module, cfg: dict):
    """The model as models/traced.Traced describes a model transformers built (the fallback's machinery prices it)."""
    from memfit.models.traced import Traced

    return Traced(cfg["model_type"], architecture_name(module, cfg), "", module.parameters(cfg), frozenset(),
                  module.linears(cfg), module.layer_prefix(cfg), cfg["num_hidden_layers"], module.sizes(cfg))


def architecture_name(module, cfg: dict) -> str:
    from memfit.models.families import FAMILIES

    return (cfg.get("architectures") or [FAMILIES[cfg["model_type"]].default_architecture])[0]


def _add_buffers(module, cfg: dict, out, where: tuple) -> None:
    """The model's registered buffers as non-trainable parameter tensors before the first layer's parameters (as
    models/dispatch adds a family's): on the device all step, no gradient, no optimizer state."""
    from memfit.config.build import make_tensor
    from memfit.recipe.costs import width

    made = [make_tensor("parameters", where, name, list(shape), 1, False, width(dtype), out) for name, shape, dtype in module.buffers(cfg)]
    for t in made:
        t.buffer = True
    prefix = module.layer_prefix(cfg)
    at = next((i for i, t in enumerate(out.tensors) if t.category == "parameters" and t.name.split("base_model.model.")[-1].startswith(prefix)),
              len(out.tensors))
    out.tensors[at:at] = made


def derive(module, cfg: dict, raw: dict, out, where, file, data: dict, at_architecture, hints: list | None = None) -> list:
    """models/hf.derive's tail for a computed family: the step `module` computes, priced by the fallback's machinery
    (models/traced._tensors); settings it does not compute run the `[trace]` fallback's fake-tensor step where
    memfit[trace] is installed, else are refused with the reason."""

    from memfit.diagnostics import codes
    from memfit.diagnostics.diagnostic import Problem
    from memfit.models import traced
    from memfit.models.hf import _recipe_arguments

    hints = list(hints or [])
    training = data.get("training") or {}
    missing = [key for key in ("micro_batch", "seq_len") if key not in training]
    if missing:
        at = ("training",) if "training" in data else ("model",)
        need = " and ".join(f"training.{key}" for key in missing)
        return [Problem(at, codes.SCHEMA, f"a transformer model needs {need}: the batch axis and the tokens per sequence", on_key=True)]
    name = architecture_name(module, cfg)
    parallel = data.get("parallel") if isinstance(data.get("parallel"), dict) else {}
    for key in ("tensor", "pipeline"):
        if isinstance(parallel.get(key), int) and not isinstance(parallel[key], bool) and parallel[key] > 1:
            message = (f"parallel.{key} {parallel[key]}: memfit does not split {name}'s layers across {key}-parallel "
                       "ranks; data-parallel layouts (ZeRO, FSDP) are modeled")
            return [Problem(("parallel", key), codes.BAD_PARALLEL, message, on_key=True)]
    if "target_len" in training:
        message = f"training.target_len is the decoder's tokens of an encoder-decoder model; {name} has one stack: ignored (seq_len counts its tokens)"
        hints.append(Problem(("training", "target_len"), codes.IGNORED_KEY, message, on_key=True))
    seq_len = training["seq_len"]
    limit = module.max_positions(cfg)
    if limit is not None and isinstance(seq_len, int) and seq_len > limit:
        message = (f"training.seq_len {seq_len} is longer than {name}'s positions (max_position_embeddings {limit}): "
                   "its position embeddings have no row for the later tokens; train at most that many tokens")
        return [Problem(("training", "seq_len"), codes.SCHEMA, message, on_key=True)]
    base = out.widths["parameters"].name
    recipe = _recipe_arguments(data, base if isinstance(base, str) else "float32")
    adapted = "lora" in data or "quantization" in data
    why = module.why_not(cfg, training, recipe.get("precision", "32-true"), adapted)
    if why:
        reason = (f"{name}: memfit's {cfg['model_type']} family computes the step at fp32, eager or sdpa attention, "
                  f"checkpointing none or full, no adapters; not {why}")
        return hints + traced.fallback(reason, raw, out, where, file, training, data, at_architecture)
    hints += module.notes(cfg, training)
    step = measured(module, cfg, training["micro_batch"], seq_len, training.get("attention", "sdpa"), training.get("checkpointing", "none"))
    problems, _, _ = traced._tensors(traced_model(module, cfg), out, where, file, training, data, None, given=step)
    if out.model is not None:
        _add_buffers(module, cfg, out, where)
        out.model = out.model._replace(summary=module.summary(cfg))
    return hints + problems

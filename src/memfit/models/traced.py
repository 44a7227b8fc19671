"""Any other transformers architecture: exact parameters from a meta-device build, activations by a generic rule.

A config.json whose model_type no family in models/families/ describes is, with the optional extra
`memfit[trace]` (torch and transformers) installed, built with transformers on the meta device: no weights,
no network, never remote code (`AutoConfig.for_model(model_type, **config)`, then the class `architectures[0]`
names when transformers has it, else `AutoModelForCausalLM.from_config`). Its `named_parameters()` are the
parameters (names, shapes; a tied weight once, at its first name; a parameter with `requires_grad` False gets
no gradient and no optimizer state), exactly as transformers builds them.

What autograd keeps is not read off the model: the **generic rule** is one of memfit's exact per-layer rules
(models/hf_activations.py) evaluated at sizes read off the built model: the hidden size, heads and head size from
the (text) config, the vocabulary from the output layer, the layer count from the repeated layer list, and the
MLP from the actual Linear shapes of each layer. Which layer stands in follows the MLP's structure: gated (the
projections that read the hidden state are twice as wide as those that write it) -> Llama's (Qwen 3's with a
q/k norm) at half their summed width, since a Llama layer keeps four tensors of its width per token (gate and up
outputs, the activation, their product); plain -> GPT-NeoX's sequential layer at its width; experts -> Mixtral's
routed layer, routed experts at their share of the tokens (experts per token / experts), shared experts in full.
The rule is measured against autograd on the families memfit models (treated as unknown) and on architectures it
has no family for (tests/models/test_traced_band.py); the warning each traced model gets quotes that band (BAND below,
docs/transformers.md).

Nothing here imports torch or transformers at import time: only `trace()` does, and only for a model_type no
family describes (tests/models/test_traced_cli.py checks that a known family's check never imports torch).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from memfit.models.unknown import available

# The generic rule's measured ratio to autograd's saved bytes (rule / measured, lowest and highest): eager and
# sdpa, with and without full checkpointing, fp32, batch 2 x 32 tokens, tiny configs; the ten families (treated
# as unknown) and eleven architectures without a family. tests/models/test_traced_band.py measures it again and fails
# when a ratio falls outside, or when the band is wider than the measurement needs.
BAND = (0.77, 1.25)
_EXPERTS_PER_TOKEN = ("num_experts_per_tok", "moe_topk", "top_k", "num_selected_experts", "moe_k", "experts_per_token")
_EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts")
_EXPERT_ITEM = re.compile(r"(?:^|\.)experts\.\d+\.")
_DOWN = re.compile(r"down|fc_?2|fc_out|w2|c_proj|4h_to_h|wo$|out_proj|^dense$|output")


def band_text() -> str:
    low, high = BAND
    return f"{(low - 1) * 100:+.0f}% to {(high - 1) * 100:+.0f}%"


# ------------------------------------------------------------------------------------------------------------
# With the extra: the meta-device build


class TraceError(Exception):
    """transformers could not build this config; `key` is the config.json key it is about."""

    def __init__(self, message: str, key: tuple = ("model_type",)):
        super().__init__(message)
        self.message, self.key = message, key


class Traced(NamedTuple):
    model_type: str
    architecture: str  # the class built
    note: str  # how the class was chosen, when architectures[0] could not be used ("" otherwise)
    params: list  # models.hf.Param, named_parameters() order, tied weights once
    frozen: frozenset  # names of parameters with requires_grad False
    linears: list  # (module name, in, out, bias) of every nn.Linear / Conv1D
    layer_prefix: str | None  # "model.layers." (the repeated layer list), None when there is none
    layers: int
    sizes: dict  # the generic rule's sizes: hidden, intermediate (the rule's width), heads, kv_heads, head_dim, vocab


def _get(config, name: str):
    """An attribute of a transformers config, None when it has none (or refuses one global value: per-layer configs)."""
    try:
        return getattr(config, name, None)
    except Exception:
        return None


def _attr(config, *names, default=None):
    for name in names:
        value = _get(config, name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


def trace(raw: dict) -> Traced:
    """Build `raw` (a config.json dict) with transformers on the meta device and read its structure."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    from memfit.models.hf import CONV1D, EMBEDDING, LINEAR, LINEAR_BIAS, NORM, OTHER, Param

    transformers.logging.set_verbosity_error()
    model_type = raw["model_type"]
    fields = {k: v for k, v in raw.items() if k not in ("model_type", "transformers_version", "auto_map")}
    try:
        config = AutoConfig.for_model(model_type, **fields)
    except Exception as error:  # transformers' own refusal, quoted
        raise TraceError(f"transformers {transformers.__version__} cannot read this config: {_short(error)}") from None
    note = ""
    cls = None
    names = raw.get("architectures") or []
    if names and isinstance(names[0], str):
        found = getattr(transformers, names[0], None)
        if isinstance(found, type) and issubclass(found, transformers.PreTrainedModel):
            cls = found
        else:
            note = f"architecture {names[0]!r} is not a transformers class (remote code is never run): AutoModelForCausalLM built instead"
    try:
        with torch.device("meta"):
            model = cls._from_config(config) if cls is not None else AutoModelForCausalLM.from_config(config)
    except Exception as error:
        key = ("architectures", 0) if cls is not None else ("model_type",)
        raise TraceError(f"transformers {transformers.__version__} cannot build {names[0] if cls is not None else model_type}: {_short(error)}", key) from None

    modules = dict(model.named_modules())
    conv1d = getattr(getattr(transformers, "pytorch_utils", None), "Conv1D", None)
    params, frozen = [], set()
    for name, p in model.named_parameters():  # each parameter once: a tied weight at its first name
        owner = modules.get(name.rpartition(".")[0])
        leaf = name.rpartition(".")[2]
        if isinstance(owner, torch.nn.Linear):
            kind = LINEAR if leaf == "weight" else LINEAR_BIAS
        elif conv1d is not None and isinstance(owner, conv1d):
            kind = CONV1D if leaf == "weight" else LINEAR_BIAS
        elif isinstance(owner, torch.nn.Embedding):
            kind = EMBEDDING
        elif owner is not None and "norm" in type(owner).__name__.lower():
            kind = NORM
        else:
            kind = OTHER
        params.append(Param(name, tuple(int(d) for d in p.shape), kind))
        if not p.requires_grad:
            frozen.add(name)
    linears = []
    for name, m in modules.items():
        if isinstance(m, torch.nn.Linear):
            linears.append((name, int(m.in_features), int(m.out_features), m.bias is not None))
        elif conv1d is not None and isinstance(m, conv1d):
            linears.append((name, int(m.weight.shape[0]), int(m.weight.shape[1]), m.bias is not None))

    prefix, layer_list = _layer_list(model, torch)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    hidden = _attr(text, "hidden_size", "d_model", "n_embd", "dim", "embed_dim")
    if hidden is None and isinstance(embedding, torch.nn.Embedding):
        hidden = int(embedding.embedding_dim)
    hidden = hidden or 1
    vocab = _attr(text, "vocab_size")
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(output, torch.nn.Linear):
        vocab = int(output.out_features)
    elif vocab is None and isinstance(embedding, torch.nn.Embedding):
        vocab = int(embedding.num_embeddings)
    heads = _attr(text, "num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads", default=1)
    kv_heads = _attr(text, "num_key_value_heads", "num_kv_heads", "n_kv_heads", default=heads)
    head_dim = _attr(text, "head_dim", "kv_channels", default=max(hidden // heads, 1))
    layers = len(layer_list) if layer_list is not None else (_attr(text, "num_hidden_layers", "num_layers", "n_layer") or 1)
    mlp = _mlp_shape(text, prefix, layer_list, linears, params, hidden, layers)
    qk_norm = any(n.endswith(("q_norm", "k_norm", "q_layernorm", "k_layernorm")) for n in modules if prefix and n.startswith(prefix))
    act = next((_get(text, k) for k in ("hidden_act", "activation_function", "hidden_activation") if isinstance(_get(text, k), str)), None)
    sizes = {"hidden": hidden, "heads": heads, "kv_heads": kv_heads if heads % kv_heads == 0 else heads,
             "head_dim": head_dim, "vocab": vocab or 1, **_rule(mlp, qk_norm, act)}
    architecture = type(model).__name__
    return Traced(model_type, architecture, note, params, frozenset(frozen), linears, prefix, layers, sizes)


def _short(error: Exception, limit: int = 160) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _layer_list(model, torch) -> tuple[str | None, list | None]:
    """The repeated layer list: the longest nn.ModuleList whose items hold parameters (the decoder's layers; in
    an encoder-decoder, the longer stack, the decoder on a tie)."""
    best, where = None, None
    for name, m in model.named_modules():
        if not isinstance(m, torch.nn.ModuleList) or len(m) == 0 or not name:
            continue
        if "expert" in name.rpartition(".")[2]:
            continue  # a mixture of experts' list, inside a layer
        items = list(m)
        if not all(any(True for _ in item.parameters()) for item in items):
            continue
        if best is None or len(items) > len(best) or (len(items) == len(best) and name.count(".") <= where.count(".")):
            best, where = items, name
    return (where + ".", best) if best is not None else (None, None)


def _mlp_shape(text, prefix, layer_list, linears, params, hidden: int, layers: int) -> dict:
    """What the generic rule reads off each layer's MLP, averaged over the layers: the summed output width of
    the projections that read the hidden state (`up`: routed experts at their share of the tokens), the summed
    input width of those that write it (`down`), whether it is gated (up = 2 x down: gate and up, or one fused
    gate_up) and whether it has experts (E, k)."""
    experts = _attr(text, *_EXPERTS)
    per_token = _attr(text, *_EXPERTS_PER_TOKEN, default=1)
    share = min(per_token / experts, 1.0) if experts else 1.0
    up = down = 0.0
    routed = False
    for name, fan_in, fan_out, _ in linears if prefix else ():
        if not name.startswith(prefix) or _attention(name[len(prefix):]):
            continue
        last = name.rpartition(".")[2]
        if last.endswith("gate"):
            continue  # a router or a shared expert's gate (a few outputs per token)
        scale = share if _EXPERT_ITEM.search(name) else 1.0
        routed = routed or scale != 1.0
        if _DOWN.search(last) and fan_out == hidden:
            down += fan_in * scale
        elif fan_in == hidden:
            up += fan_out * scale
        elif fan_out == hidden:
            down += fan_in * scale
    for p in params if prefix else ():  # stacked experts (transformers 5's grouped matmul): (experts, out, in)
        if p.name.startswith(prefix) and len(p.shape) == 3 and hidden in p.shape[1:]:
            # (experts, out, in) or (experts, in, out): the side that is not the hidden size is the width
            inner = p.shape[1] if p.shape[2] == hidden else p.shape[2]
            if "down" in p.name.rpartition(".")[2] or "w2" in p.name.rpartition(".")[2]:
                down += p.shape[0] * inner * share
            else:
                up += p.shape[0] * inner * share
            routed = True
    n = max(layers, 1)
    if up == 0:
        inner = _attr(text, "intermediate_size", "ffn_dim", "n_inner", "d_ff", default=4 * hidden)
        return {"up": inner, "down": inner, "gated": False, "experts": 0, "per_token": 0}
    up, down = up / n, (down or up) / n
    gated = up >= 1.5 * down
    return {"up": up, "down": down, "gated": gated, "experts": experts if routed and experts else 0, "per_token": per_token}


def _rule(mlp: dict, qk_norm: bool, act: str | None) -> dict:
    """The family whose layer rule stands in (models/hf_activations), and its MLP width and activation:
    experts -> mixtral's routed rule (width per routed token: the active width over experts per token, shared
    experts included); a gated MLP -> llama's (qwen3's with a q/k norm); a plain one -> gpt_neox's (sequential)."""
    from memfit.models.hf_activations import ACTIVATIONS

    act = act if act in ACTIVATIONS else None
    if mlp["experts"]:
        k = max(mlp["per_token"], 1)
        width = mlp["up"] / k / 2 if mlp["gated"] else mlp["up"] / k
        return {"rule": "mixtral", "intermediate": max(int(round(width)), 1), "experts": mlp["experts"], "per_token": k, "act": act or "silu"}
    if mlp["gated"]:
        return {"rule": "qwen3" if qk_norm else "llama", "intermediate": max(int(round(mlp["up"] / 2)), 1), "act": act or "silu"}
    return {"rule": "gpt_neox", "intermediate": max(int(round(mlp["up"])), 1), "act": act or "gelu"}


def _attention(name: str) -> bool:
    """A projection of the attention (q, k, v, o) or of a router, by its name inside a layer."""
    parts = name.split(".")
    return any(("attn" in p or "attention" in p or p in ("gate", "router", "wq", "wk", "wv", "q_proj", "k_proj", "v_proj")) for p in parts)


def surrogate(traced: Traced) -> dict:
    """The config of the family whose per-layer rule is the generic rule at the traced sizes (models/hf_activations)."""
    s = traced.sizes
    cfg = {
        "model_type": s["rule"],
        "hidden_size": s["hidden"],
        "intermediate_size": s["intermediate"],
        "num_hidden_layers": traced.layers,
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"],
        "head_dim": s["head_dim"],
        "vocab_size": s["vocab"],
        "hidden_act": s["act"],
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
        "use_cache": True,
        "tie_word_embeddings": False,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default", "partial_rotary_factor": 1.0},
        "traced_model_type": traced.model_type,
    }
    if s["rule"] == "mixtral":
        cfg.update(num_local_experts=s["experts"], num_experts_per_tok=s["per_token"])
    if s["rule"] == "gpt_neox":
        cfg["use_parallel_residual"] = False
    return cfg


def summary(traced: Traced) -> str:
    s = traced.sizes
    count = sum(_elements(p.shape) for p in traced.params)
    return (
        f"{traced.architecture} (traced on the meta device): {count:,} parameters; {traced.layers} layers, hidden {s['hidden']}, "
        f"{s['heads']} heads of {s['head_dim']}; activations by the generic rule ({s['rule']}'s layer, MLP width {s['intermediate']})"
    )


def _elements(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# ------------------------------------------------------------------------------------------------------------
# The pipeline's seam (models/dispatch.derive, for a model_type no family describes)


def _unknown(data: dict, path: str):
    """(raw, where, file, place) when the model section's config has a model_type no family describes and no
    other problem; None otherwise. `place(key, code, message)` makes a Problem at a key of that config."""
    import os

    from memfit.diagnostics.diagnostic import Problem
    from memfit.models.hf_config import UNSUPPORTED_MODEL, LoadError, load, validate

    model = data["model"]
    if "hf_config" in model:
        where = ("model", "hf_config")
        base = os.path.dirname(path) if path and not path.startswith("<") else "."
        file = os.path.normpath(os.path.join(base, os.path.expanduser(model["hf_config"])))
        if os.path.isdir(file) and os.path.isfile(os.path.join(file, "config.json")):
            file = os.path.join(file, "config.json")
        try:
            loaded = load(file)
        except LoadError:
            return None
        raw = loaded.raw

        def place(key, code, message):
            return Problem(where, code, message, file=file, at=loaded.positions.range(key))
    else:
        where, file, raw = ("model", "transformer"), None, model["transformer"]

        def place(key, code, message):
            return Problem(where + key, code, message)
    found = validate(raw)
    if len(found) != 1 or found[0].code != UNSUPPORTED_MODEL or found[0].path != ("model_type",):
        return None
    return raw, where, file, place


def derive(data: dict, out, path: str, problems: list) -> list:
    """models/hf.derive's `problems` for a model_type no family describes become, with memfit[trace] installed,
    the traced model's tensors (emitted into `out`, config.build.Emitted, as models/hf._tensors emits a family's) and the
    generic rule's warning; anything else is returned as it was."""
    from memfit.diagnostics import codes
    from memfit.diagnostics.diagnostic import Problem

    if not available():
        return problems
    unknown = _unknown(data, path)
    if unknown is None:
        return problems
    raw, where, file, place = unknown
    training = data.get("training", {})
    missing = [key for key in ("micro_batch", "seq_len") if key not in training]
    if missing:
        at = ("training",) if "training" in data else ("model",)
        need = " and ".join(f"training.{key}" for key in missing)
        return [Problem(at, codes.SCHEMA, f"a transformer model needs {need}: the batch axis and the tokens per sequence", on_key=True)]
    from memfit.models.hf_config import excerpt
    from memfit.models.unknown import unknown_message

    shown = excerpt(raw["model_type"])
    try:
        traced = trace(raw)
    except TraceError as error:
        # transformers' reason, with the model_type as the excerpt memfit quotes of a referenced file
        reason = error.message.replace(raw["model_type"], shown) if raw["model_type"] else error.message
        return [place(error.key, codes.UNSUPPORTED_MODEL, f"{unknown_message(raw, shown)}; {reason}")]
    warning = place(
        ("model_type",),
        codes.APPROXIMATE_ACTIVATIONS,
        f"model_type {shown} has no memfit family: parameters are exact ({traced.architecture} built by transformers "
        f"on the meta device), activations come from the generic rule ({traced.sizes['rule']}'s layer at this model's sizes), "
        f"measured at {band_text()} of autograd's saved bytes (docs/transformers.md)"
        + (f"; {traced.note}" if traced.note else ""),
    )
    return [warning] + _tensors(traced, out, where, file, training, data)


def _tensors(traced: Traced, out, where, file, training: dict, data: dict) -> list:
    from memfit.config.build import make_tensor
    from memfit.models.hf import BlockRow, Model, _recipe_arguments, forced_activations, saved_rows
    from memfit.models.hf_activations import peak_saved, saved as saved_by, total as total_of
    from memfit.recipe.costs import width

    micro_batch, seq_len = training["micro_batch"], training["seq_len"]
    attention = training.get("attention", "sdpa")
    checkpointing = training.get("checkpointing", "none")
    dtypes, problem = forced_activations(data.get("dtypes", {}))
    if problem is not None:
        return [problem]
    base_name = out.widths["parameters"].name
    recipe = _recipe_arguments(data, base_name if isinstance(base_name, str) else "float32")
    cfg = surrogate(traced)
    adapted = "lora" in data or "quantization" in data
    if adapted:
        from memfit.recipe import adapters
        from memfit.recipe.dtypes import DTYPES

        if adapters.problems(data):
            return []
        base = base_name if base_name in DTYPES else "float32"
        param_rows, problems = adapters.transformer_rows({"model_type": traced.model_type}, data, base, traced.params, traced.linears, "causal-lm")
        if problems:
            return problems
    arguments = dict(micro_batch=micro_batch, seq_len=seq_len, attention=attention, checkpointing=checkpointing, dtypes=dtypes, **recipe)
    try:
        saved = saved_by(cfg, **arguments)
    except ValueError as error:  # an attention kernel / precision the rule does not take
        from memfit.diagnostics import codes
        from memfit.diagnostics.diagnostic import Problem

        return [Problem(("training",), codes.SCHEMA, str(error))]
    by_block: dict = {}
    for b in saved:
        by_block.setdefault(b.name, []).append(b)
    groups = _groups(traced)
    rows = []
    for name, count, params in groups:
        elements = 0
        for p in params:
            elements += _elements(p.shape)
            if not adapted:
                tensor = make_tensor("parameters", where, p.name, list(p.shape), 1, p.name not in traced.frozen, None, out)
                out.tensors.append(tensor)
        rows += saved_rows(out, where, name, by_block.get(name) or [None], count, elements // max(count, 1))
    rows += saved_rows(out, where, "loss", (by_block.get("loss") or [])[:1], 1, 0)
    total = total_of(saved)
    if checkpointing == "full":
        peak = peak_saved(cfg, **arguments)
        if peak > total:
            extra = peak - total
            label = "recomputation: one layer's saved tensors in the backward, beyond the head and loss"
            out.tensors.append(make_tensor("activations", where, label, [extra], 1, True, width("uint8"), out))
            rows.append(BlockRow("recomputed layer", 1, 0, extra, []))
        total = max(peak, total)
    if adapted:
        for row in param_rows:
            own = None if row.dtype == base else width(row.dtype)
            trainable = row.trainable and row.name not in traced.frozen
            out.tensors.append(make_tensor("parameters", where, row.name, list(row.shape), 1, trainable, own, out))
    run = {"micro_batch": micro_batch, "seq_len": seq_len, "attention": attention, "checkpointing": checkpointing}
    out.model = Model(cfg, file, summary(traced), rows, total, run, dtypes, recipe)
    return []


def _groups(traced: Traced) -> list:
    """(block, layers, params): the parameters before the layer list, in it, and after it (named_parameters order)."""
    before, inside, after = [], [], []
    for p in traced.params:
        if traced.layer_prefix and p.name.startswith(traced.layer_prefix):
            inside.append(p)
        elif inside:
            after.append(p)
        else:
            before.append(p)
    return [("embeddings", 1, before), ("layer", traced.layers, inside), ("head", 1, after)]

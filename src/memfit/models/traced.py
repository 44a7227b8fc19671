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
import weakref
from typing import NamedTuple

from memfit.config.presets import device_type
from memfit.models.unknown import available
from memfit.recipe.autocast import AUTOCAST_FP32_OPS
from memfit.recipe.costs import dtype_bytes, dtype_elements
from memfit.recipe.dtypes import DTYPES

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


def _offline() -> None:
    """huggingface_hub's offline mode (constants.HF_HUB_OFFLINE, which its is_offline_mode and every request through
    its session read): a plain check never contacts the Hub; --online fetches through its own bounded client."""
    import os

    os.environ["HF_HUB_OFFLINE"] = "1"  # for a huggingface_hub imported later (read when its constants load)
    try:
        import huggingface_hub.constants as hub
    except ImportError:
        return
    hub.HF_HUB_OFFLINE = True


def _quiet_import() -> None:
    """Import torch and transformers' modeling code with stderr silenced: their import prints torchao's optional
    kernels that do not load and torch's pytree deprecations, which are not memfit's output (a docs page or a CI
    log showing `memfit check` would carry them). Building a model from its config.json never reaches the network:
    huggingface_hub's offline mode is set, so a config naming a hub checkpoint inside it (DETR's `backbone`, a
    composite model's sub-config) is refused by transformers, not fetched (issue 33)."""
    import sys

    _offline()
    if "transformers.modeling_utils" in sys.modules:
        return
    import contextlib
    import io
    import logging
    import os
    import warnings

    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                logging.disable(logging.WARNING)
                try:
                    import torch  # noqa: F401
                    import transformers.modeling_utils  # noqa: F401
                finally:
                    logging.disable(logging.NOTSET)
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def trace(raw: dict) -> Traced:
    """Build `raw` (a config.json dict) with transformers on the meta device and read its structure."""
    _quiet_import()
    import torch
    import transformers
    from transformers import AutoConfig

    from memfit.models.hf import CONV1D, EMBEDDING, LINEAR, LINEAR_BIAS, NORM, OTHER, Param

    transformers.logging.set_verbosity_error()
    model_type = raw["model_type"]
    try:
        # read as transformers reads a config.json: {"__float__": "Infinity"} decoded (mamba2's time_step_limit...)
        config = AutoConfig.for_model(model_type, **_decoded(raw))
    except Exception as error:  # transformers' own refusal, quoted
        raise TraceError(f"transformers {transformers.__version__} cannot read this config: {_short(error)}") from None
    names = raw.get("architectures") or []
    # architectures[0] when transformers has it; an encoder-decoder's own class (Whisper: its encoder counted); a
    # composite config's text part for its causal-LM class (qwen3_5...)
    cls, config, note = _model_class(raw, config)
    named = bool(names) and cls.__name__ == names[0]
    try:
        with torch.device("meta"):
            model = _build(cls, config)
    except Exception as error:
        key = ("architectures", 0) if named else ("model_type",)
        raise TraceError(f"transformers {transformers.__version__} cannot build {names[0] if named else model_type}: {_short(error)}", key) from None

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


def summary(traced: Traced, measured=None) -> str:
    s = traced.sizes
    count = sum(_elements(p.shape) for p in traced.params)
    how = (f"activations measured on fake tensors ({measured.ran} of {measured.layers} layers run)" if measured is not None
           else f"activations by the generic rule ({s['rule']}'s layer, MLP width {s['intermediate']})")
    layers = measured.layers if measured is not None else traced.layers
    return (
        f"{traced.architecture} (traced on the meta device): {count:,} parameters; {layers} layers, hidden {s['hidden']}, "
        f"{s['heads']} heads of {s['head_dim']}; {how}"
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
    problems, measured, why = _tensors(traced, out, where, file, training, data, raw)
    if measured is not None:
        extrapolated = (f"; {measured.ran} of its {measured.layers} layers ran, each later one keeps what a measured layer "
                        f"of the same place in a period of {MEASURED_LAYERS - 1} keeps" if measured.ran < measured.layers else "")
        message = (f"model_type {shown} has no memfit family: parameters are exact ({traced.architecture} built by "
                   f"transformers on the meta device), activations measured: one forward and backward of it on fake tensors "
                   f"(no memory, no weights) at this batch, length, precision and checkpointing, what autograd saved"
                   f"{extrapolated}")
        if measured.note:
            message += f"; {measured.note}"
        if _hybrid(raw):
            message += ("; a state-space layer runs transformers' slow PyTorch path on CPU (the CUDA kernels of mamba_ssm and "
                        "causal_conv1d keep other tensors)")
        code = codes.MEASURED_ACTIVATIONS
    else:
        message = (f"model_type {shown} has no memfit family: parameters are exact ({traced.architecture} built by transformers "
                   f"on the meta device), activations come from the generic rule ({traced.sizes['rule']}'s layer at this model's sizes), "
                   f"measured at {band_text()} of autograd's saved bytes (docs/transformers.md)"
                   + (f"; not measured on fake tensors: {why}" if why else ""))
        code = codes.APPROXIMATE_ACTIVATIONS
    warning = place(("model_type",), code, message + (f"; {traced.note}" if traced.note else ""))
    return [warning] + problems


def _hybrid(raw: dict) -> bool:
    """A config with state-space (Mamba) layers: its keys name them."""
    return any(isinstance(k, str) and ("mamba" in k or k in ("ssm_state_size", "state_size", "conv_kernel", "d_state"))
               for k in raw) or "mamba" in str(raw.get("model_type"))


def _measure_for(raw: dict, training: dict, recipe: dict, adapted: bool, dtypes, device: str = "cuda") -> tuple:
    """(Measured or None, why not); `device`: whose autocast the step runs under (config/presets.device_type)."""
    if adapted == "quantization":
        return None, "a quantized base is not run on fake tensors (bitsandbytes packs real weights)"
    from memfit.models.hf_activations import TRUE_DTYPE

    if dtypes and dtypes.get("activations") != TRUE_DTYPE.get(recipe.get("precision", "32-true")):
        return None, "dtypes.activations forces a dtype the step does not run every activation in"
    checkpointing = training.get("checkpointing", "none")
    if checkpointing not in ("none", "full"):
        return None, f"checkpointing {checkpointing} is Megatron's recomputation, not a transformers step"
    try:
        return measure(raw, micro_batch=training["micro_batch"], seq_len=training["seq_len"],
                       attention=training.get("attention", "sdpa"), checkpointing=checkpointing,
                       precision=recipe.get("precision", "32-true"), target_len=training.get("target_len"),
                       lora=recipe.get("lora"), device=device), ""
    except MeasureError as error:
        return None, str(error)


def fallback(reason: str, raw: dict, out, where, file, training: dict, data: dict, at_architecture) -> list:
    """A family that computes its own step without torch hands a step it does not compute to this fallback: the
    step measured on fake tensors (or the generic rule where it cannot run), `reason` said at the architecture."""
    import dataclasses

    from memfit.diagnostics import codes

    if not available():
        return at_architecture(reason + ": install memfit[trace] to measure it on fake tensors")
    try:
        model = trace(raw)
    except TraceError as error:
        return at_architecture(f"{reason}; the fallback: {error.message}")
    problems, ran, _ = _tensors(model, out, where, file, training, data, raw)
    code = codes.MEASURED_ACTIVATIONS if ran is not None else codes.APPROXIMATE_ACTIVATIONS
    how = ("activations measured by the [trace] fallback: one forward and backward on fake tensors" if ran is not None
           else "activations from the [trace] fallback's generic rule")
    return problems + [dataclasses.replace(p, code=code) for p in at_architecture(f"{reason}; {how}")]


def _tensors(traced: Traced, out, where, file, training: dict, data: dict, raw: dict | None = None, given=None) -> tuple:
    """`given`: a step a family computed (models/whisper.measured), priced as a measured one."""
    from memfit.config.build import make_tensor
    from memfit.models.hf import BlockRow, Model, _recipe_arguments, forced_activations, saved_rows
    from memfit.models.hf_activations import peak_saved, saved as saved_by, total as total_of
    from memfit.recipe.costs import width

    micro_batch, seq_len = training["micro_batch"], training["seq_len"]
    attention = training.get("attention", "sdpa")
    checkpointing = training.get("checkpointing", "none")
    dtypes, problem = forced_activations(data.get("dtypes", {}))
    if problem is not None:
        return [problem], None, ""
    base_name = out.widths["parameters"].name
    recipe = _recipe_arguments(data, base_name if isinstance(base_name, str) else "float32")
    cfg = surrogate(traced)
    adapted = "lora" in data or "quantization" in data
    kind = "quantization" if "quantization" in data else ("lora" if adapted else "")
    device = device_type(data.get("device"))
    measured, why = _measure_for(raw, training, recipe, kind, dtypes, device) if raw is not None else (None, "")
    if given is not None:
        measured, why = given, ""
    if measured is not None:   # hf_activations answers with what the step saved (every stack's layers in order)
        cfg.update(traced_measured=measured, num_hidden_layers=measured.layers)
    if adapted:
        from memfit.recipe import adapters

        if adapters.problems(data):
            return [], None, why
        base = base_name if base_name in DTYPES else "float32"
        param_rows, problems = adapters.transformer_rows({"model_type": traced.model_type}, data, base, traced.params, traced.linears, "causal-lm")
        if problems:
            return problems, None, why
    arguments = dict(micro_batch=micro_batch, seq_len=seq_len, attention=attention, checkpointing=checkpointing, dtypes=dtypes, **recipe)
    try:
        saved = saved_by(cfg, **arguments)
    except ValueError as error:  # an attention kernel / precision the rule does not take
        from memfit.diagnostics import codes
        from memfit.diagnostics.diagnostic import Problem

        return [Problem(("training",), codes.SCHEMA, str(error))], None, why
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
    out.model = Model(cfg, file, summary(traced, measured), rows, total, run, dtypes, recipe)
    return [], measured, why


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


# ------------------------------------------------------------------------------------------------------------
# Measured activations (issue 34): one training step on fake tensors
#
# The class trace() builds is built again under torch's FakeTensorMode (tensors with shapes, dtypes and storages but
# no memory: no weights, no network, a 70B costs what a tiny model costs) and runs one forward with labels and its
# backward at the config's micro_batch, seq_len, precision, attention and checkpointing. Every tensor autograd saves
# passes a saved_tensors_hooks pack hook; each distinct storage counts once at its full size, parameters and buffers
# left out (the measurement tests/support/hf_measure.py makes on a real CPU step, where the figures agree). Each
# saved storage is attributed to the block that first saves it (module hooks on each stack's layers: embeddings,
# layer i, head, loss). Under full checkpointing the layers' recomputation in the backward is tracked too, with the
# live bytes of what stays saved, and the peak is the largest live total.
#
# A stack of more than MEASURED_LAYERS layers runs its first MEASURED_LAYERS (the module list is cut; the config is
# not changed): layer i beyond them keeps what measured layer 1 + (i - 1) % (MEASURED_LAYERS - 1) keeps, so a pattern
# of period MEASURED_LAYERS - 1 (every fourth layer full attention, a hybrid's interleave of four) repeats exactly.
# Dropout runs as CUDA's fused kernel (torch.native_dropout: a 1-byte mask), as in every family's rules. What cannot
# run on fake tensors (data-dependent shapes, a kernel without a fake implementation) falls back to the generic rule,
# and the warning says so. State-space and hybrid models run their slow PyTorch path (no CUDA kernels on CPU): their
# figures are that path's saved tensors, which the fused CUDA kernels (mamba_ssm, causal_conv1d) do not keep alike.
MEASURED_LAYERS = 5
TIME_LIMIT_S = 120.0


class MeasureError(Exception):
    """The step could not run on fake tensors; the message says why (transformers' or torch's words)."""


class Measured(NamedTuple):
    run: tuple  # (micro_batch, seq_len, attention, checkpointing, precision): what was measured
    blocks: tuple  # (name, count, kept): embeddings, the layers in order, head, loss; kept = ((label, shape, dtype), ...)
    peak: int  # the peak of live saved bytes (full checkpointing), else the distinct saved bytes
    recomputed: tuple  # under full checkpointing, each layer's saved tensors while its backward recomputes it
    layers: int  # layers of every stack
    ran: int  # layers that ran
    note: str = ""  # how the step differs from the one asked for (a cache transformers refused)


def _decoded(raw: dict) -> dict:
    """config.json as transformers reads it: {"__float__": "Infinity"} and its kin decoded (PreTrainedConfig.
    _decode_special_floats), the keys from_pretrained never passes dropped."""
    from transformers import PreTrainedConfig

    fields = {k: v for k, v in raw.items() if k not in ("model_type", "transformers_version", "auto_map")}
    return PreTrainedConfig._decode_special_floats(fields)


def _model_class(raw: dict, config):
    """(the class to build, the config to build it with, a note): architectures[0] when transformers has it; else an
    encoder-decoder's sequence-to-sequence class (Whisper: AutoModelForSpeechSeq2Seq, its encoder counted), else
    AutoModelForCausalLM. A composite config whose causal-LM class takes the text part gets that part (from_pretrained
    does the same)."""
    import transformers

    names = raw.get("architectures") or []
    note = ""
    if names and isinstance(names[0], str):
        found = getattr(transformers, names[0], None)
        if isinstance(found, type) and issubclass(found, transformers.PreTrainedModel):
            return found, _config_for(found, config), ""
        note = f"architecture {names[0]!r} is not a transformers class (remote code is never run): a transformers Auto class built instead"
    autos = []
    if getattr(config, "is_encoder_decoder", False):
        autos = [transformers.AutoModelForSpeechSeq2Seq, transformers.AutoModelForSeq2SeqLM]
    autos.append(transformers.AutoModelForCausalLM)
    for auto in autos:
        cls = auto._model_mapping[type(config)] if type(config) in auto._model_mapping else None
        if cls is not None:
            return cls, _config_for(cls, config), note
    return transformers.AutoModelForCausalLM, config, note


def _config_for(cls, config):
    wanted = getattr(cls, "config_class", None)
    if wanted is None or isinstance(config, wanted) or not hasattr(config, "get_text_config"):
        return config
    try:
        text = config.get_text_config()
    except ValueError:   # several text parts (musicgen's text encoder and decoder): none is the one
        return config
    return text if isinstance(text, wanted) else config


def _build(cls, config, **kwargs):
    if cls.__name__.startswith("Auto"):
        return cls.from_config(config, **kwargs)
    return cls._from_config(config, **kwargs)


def _stacks(model, torch) -> list:
    """Every repeated layer list (the longest ModuleList of a stack whose items hold parameters), outermost first:
    (its parent module, attribute name, its path)."""
    out = []
    for name, m in model.named_modules():
        if not isinstance(m, torch.nn.ModuleList) or len(m) < 2 or not name:
            continue
        if "expert" in name.rpartition(".")[2]:
            continue
        if any(name.startswith(path + ".") for _, _, path in out):
            continue  # a list inside a layer of a stack already found
        items = list(m)
        if len({type(i) for i in items}) > 2 or not all(any(True for _ in i.parameters()) for i in items):
            continue
        parent_name, _, attr = name.rpartition(".")
        out.append((model.get_submodule(parent_name) if parent_name else model, attr, name))
    return out


class _FakeGroupedMm:
    """torch.nn.functional.grouped_mm on fake tensors: torch's meta check asks bf16 where the CPU kernel takes any
    float (transformers' grouped experts on CPU). Same output shape, same saved tensors (input, weight, offsets)."""

    @staticmethod
    def make(torch):
        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, a, b, offs):
                ctx.save_for_backward(a, b, offs)
                return a.new_empty((a.shape[0], b.shape[-1]))

            @staticmethod
            def backward(ctx, grad):
                a, b, _ = ctx.saved_tensors
                return torch.empty_like(a), torch.empty_like(b), None

        def grouped_mm(a, b, offs=None, **_):
            return Fn.apply(a, b, offs)

        return grouped_mm


def _inputs(model, config, micro_batch: int, seq_len: int, torch, target_len: int | None = None) -> dict:
    """Token ids and the labels the class's loss takes (a classifier's one per sequence or per token; an
    encoder-decoder's decoder tokens; Whisper's log-mel frames, 2 x max_source_positions long)."""
    name = type(model).__name__
    b, s = micro_batch, seq_len
    ids = torch.zeros((b, s), dtype=torch.long)
    if name.endswith("ForSequenceClassification") or name.endswith("ForTokenClassification"):
        labels_n = int(getattr(config, "num_labels", 2) or 2)
        shape = (b,) if name.endswith("ForSequenceClassification") else (b, s)
        multi = getattr(config, "problem_type", None) == "multi_label_classification"
        labels = torch.zeros(shape + ((labels_n,) if multi else ()), dtype=torch.float if labels_n == 1 or multi else torch.long)
        return {"input_ids": ids, "labels": labels}
    main = getattr(model, "main_input_name", "input_ids")
    if main == "input_features":
        frames = 2 * int(getattr(config, "max_source_positions", 1500))
        mels = int(getattr(config, "num_mel_bins", 80))
        return {"input_features": torch.zeros((b, mels, frames), dtype=model.dtype),
                "labels": torch.zeros((b, target_len or s), dtype=torch.long)}
    if main != "input_ids":
        raise MeasureError(f"{name} takes {main}, not token ids: memfit measures text, speech and classification steps")
    if getattr(config, "is_encoder_decoder", False):
        return {"input_ids": ids, "labels": torch.zeros((b, target_len or s), dtype=torch.long)}
    return {"input_ids": ids, "labels": ids.clone()}


def measure(raw: dict, **settings) -> Measured:
    """One training step of `raw`'s class on fake tensors: what autograd saves (see above). Raises MeasureError.

    The step runs in a forked child process where the platform forks (torch and transformers are imported first, so
    the fork costs milliseconds): a model whose code leaves fake tensors in a module-level cache, or crashes the
    interpreter, cannot harm the next config of the same run; the child is killed at the time limit."""
    import os
    import pickle
    import signal
    import time

    _quiet_import()
    if not hasattr(os, "fork"):
        return _measure_now(raw, **settings)
    import torch  # noqa: F401  (imported before the fork)
    import transformers  # noqa: F401

    limit = settings.get("time_limit", TIME_LIMIT_S)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: measure, send the result (or the error) back, exit without cleanup
        os.close(read)
        try:
            try:
                result = ("ok", _measure_now(raw, **settings))
            except MeasureError as error:
                result = ("error", str(error))
            except BaseException as error:  # noqa: BLE001  (anything: reported, never raised in the parent)
                result = ("error", f"{type(error).__name__}: {_short(error)}")
            data = pickle.dumps(result)
            with os.fdopen(write, "wb") as out:
                out.write(data)
        finally:
            os._exit(0)
    os.close(write)
    chunks = []
    deadline = time.monotonic() + limit + 10
    import select

    with os.fdopen(read, "rb") as source:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([source], [], [], max(left, 0))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise MeasureError(f"the fake-tensor step ran past memfit's {limit:.0f} s limit")
            chunk = source.read1(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        code = os.waitstatus_to_exitcode(status)
        raise MeasureError(f"the fake-tensor step ended the process ({'signal ' + str(-code) if code < 0 else 'exit ' + str(code)})")
    kind, value = pickle.loads(b"".join(chunks))
    if kind == "error":
        raise MeasureError(value)
    return value


class _Holder:
    """What a saved-tensor hook hands autograd: the tensor, and a weak reference's target for its release."""

    __slots__ = ("__weakref__", "t")

    def __init__(self, t):
        self.t = t


class _Recorder:
    """Every storage autograd saves in one step: its bytes, shape and dtype, the block that first saved it, what the
    backward saves again while it recomputes a block, and the peak of the saved bytes alive at once (a storage is
    alive while a holder autograd keeps refers to it)."""

    def __init__(self, torch):
        self.torch = torch
        self.state = {"block": "embeddings", "seen_layer": False}
        self.first: dict = {}  # storage -> block that first saved it
        self.sizes: dict = {}
        self.shapes: dict = {}
        self.refs: dict = {}
        self.live = [0, 0]  # live, peak
        self.keep: list = []  # every storage packed, alive to the end (ids are never reused)
        # storage id -> the storage of a parameter or buffer, held to the end: a storage id is its StorageImpl's
        # address, which a freed storage gives back (a cut layer's parameters are freed when its stack is cut), and a
        # storage the step saves could take it and be missed; held, an excluded id is never reused
        self.excluded: dict = {}
        self.recomputing: dict = {}  # block -> storages saved while the backward recomputes it
        self.forward_order: list = []   # the layers as the forward ran them; the backward recomputes them in reverse
        self.frames: dict = {}

    def note(self, t, owner=None, recomputed=False):
        if not isinstance(t, self.torch.Tensor):
            return
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self.excluded or storage.nbytes() == 0:
            return
        self.keep.append(storage)
        if key not in self.sizes:
            self.sizes[key] = storage.nbytes()
            self.shapes[key] = (tuple(int(d) for d in t.shape), str(t.dtype).replace("torch.", ""))
            if not recomputed:
                self.first[key] = self.state["block"]
        if recomputed:
            self.recomputing.setdefault(self.state["block"], {})[key] = storage.nbytes()
        if owner is not None:
            count = self.refs.get(key, 0)
            self.refs[key] = count + 1
            if count == 0:
                self.live[0] += self.sizes[key]
                self.live[1] = max(self.live[1], self.live[0])
            weakref.finalize(owner, self.drop, key)

    def drop(self, key):
        self.refs[key] -= 1
        if self.refs[key] == 0:
            self.live[0] -= self.sizes[key]

    def pack(self, t):
        holder = _Holder(t)
        self.note(t, holder)
        return holder

    @staticmethod
    def unpack(holder):
        return holder.t

    def counting(self, original_hook, policy):
        """torch.utils.checkpoint's recomputation hook, noting what the backward saves while it recomputes a layer;
        `policy()` the device's autocast casts, entered around each recomputation (the hook's context wraps it: a
        function mode entered around the forward is not in force in the backward's recomputation)."""
        recorder = self

        class Counting(original_hook):
            def __enter__(self):
                self.policy = policy()
                self.policy.__enter__()
                return super().__enter__()

            def __exit__(self, *exc):
                try:
                    return super().__exit__(*exc)
                finally:
                    self.policy.__exit__(*exc)

            def __init__(self, target_frame_ref, gid):
                super().__init__(target_frame_ref, gid)
                inner = self.pack_hook
                frame = target_frame_ref()
                frames, forward_order = recorder.frames, recorder.forward_order
                if id(frame) not in frames:
                    index = len(frames) + 1
                    frames[id(frame)] = forward_order[-index] if index <= len(forward_order) else "backward"
                name = frames[id(frame)]

                def pack_hook(x):
                    frame = target_frame_ref()
                    index = frame.recomp_counter[gid]
                    try:
                        return inner(x)
                    finally:
                        holder = frame.weak_holders[index]() if index < len(frame.weak_holders) else None
                        handle = holder.handles.get(gid) if holder is not None else None
                        recorder.state["block"], was = name, recorder.state["block"]
                        recorder.note(x, handle, recomputed=True)
                        recorder.state["block"] = was

                self.pack_hook = pack_hook

        return Counting


def _step_model(cls, config, *, attention: str, low, lora: dict | None, layers_cap: int, checkpointing: str, torch,
                recorder: _Recorder, check_time, no_init_weights):
    """The model built on fake tensors for one training step, its layer lists cut to `layers_cap` and hooked so the
    recorder knows which block runs; with the stacks as (path, layers, layers run)."""
    state = recorder.state
    stacks_info = []
    concrete = cls._model_mapping[type(config)] if cls.__name__.startswith("Auto") else cls
    impl = attention
    if attention == "sdpa" and not getattr(concrete, "_supports_sdpa", False):
        impl = None   # transformers refuses sdpa for it (state-space models...): its default, what runs
    with no_init_weights():   # (a fake parameter refuses .to(): a 16-bit model is built in its dtype)
        model = _build(cls, config, attn_implementation=impl, **({"dtype": low} if low is not None else {}))
    if lora:
        model = _with_lora(model, lora)
    for tensor in (*model.parameters(), *model.buffers()):
        storage = tensor.untyped_storage()
        recorder.excluded[storage._cdata] = storage
    for parent, attr, path in _stacks(model, torch):
        items = list(getattr(parent, attr))
        total = len(items)
        if total > layers_cap:
            setattr(parent, attr, torch.nn.ModuleList(items[:layers_cap]))
        ran = min(total, layers_cap)
        stacks_info.append((path, total, ran))
        for i, layer in enumerate(items[:ran]):
            def pre(module, args, kwargs=None, _name=f"{path}.{i}"):
                check_time()
                if state["block"] != "backward":
                    recorder.forward_order.append(_name)
                state["block"] = _name
            def post(module, args, output, _next=f"{path}.{i + 1}" if i + 1 < ran else "head"):
                state["block"] = _next   # (the next layer's checkpoint keeps its input before its hooks run)
            layer.register_forward_pre_hook(pre)
            layer.register_forward_hook(post)
    if not stacks_info:
        raise MeasureError(f"{type(model).__name__} has no repeated layer list to measure")
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(output, torch.nn.Module):
        output.register_forward_hook(lambda *a: state.update(block="loss"))
    model.train()
    if checkpointing == "full":
        model.activation_checkpointing_enable()
    return model, stacks_info


def _measure_now(raw: dict, *, micro_batch: int, seq_len: int, attention: str = "sdpa", checkpointing: str = "none",
                 precision: str = "32-true", target_len: int | None = None, layers_cap: int = MEASURED_LAYERS,
                 time_limit: float = TIME_LIMIT_S, lora: dict | None = None, device: str = "cuda",
                 _no_cache: bool = False) -> Measured:
    import contextlib
    import time

    import torch
    import torch.nn.functional as F
    import torch.utils.checkpoint as checkpoint_module
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode

    transformers.logging.set_verbosity_error()
    if attention not in ("eager", "sdpa"):
        raise MeasureError(f"attention {attention} has no CPU kernel to run on fake tensors (eager and sdpa do)")
    started = time.monotonic()
    try:
        config = transformers.AutoConfig.for_model(raw["model_type"], **_decoded(raw))
    except Exception as error:
        raise MeasureError(_short(error)) from None
    cls, config, _ = _model_class(raw, config)
    low = {"bf16-true": torch.bfloat16, "16-true": torch.float16}.get(precision)
    mixed = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    from transformers.initialization import no_init_weights

    recorder = _Recorder(torch)
    original_hook = checkpoint_module._recomputation_hook

    def native_dropout(input, p=0.5, training=True, inplace=False):
        if not training or p == 0.0:
            return input
        out, _ = torch.native_dropout(input, p, True)
        return input.copy_(out) if inplace else out

    def check_time():
        if time.monotonic() - started > time_limit:
            raise MeasureError(f"the fake-tensor step ran past memfit's {time_limit:.0f} s limit")

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    mode.cache_enabled = False   # one step: hashing each op for the cache costs more than it saves (a third of the time)
    # transformers treats a fake tensor as a traced graph: it would not look whether the position ids pack several
    # sequences in a row and would build an explicit causal mask for sdpa; the step memfit measures has one sequence
    # per row (what find_packed_sequence_indices finds in a real step: None)
    import transformers.masking_utils as masking

    original_packed = getattr(masking, "find_packed_sequence_indices", None)
    original_dropout, original_grouped = F.dropout, getattr(F, "grouped_mm", None)
    try:
        with mode:
            model, stacks_info = _step_model(cls, config, attention=attention, low=low, lora=lora, layers_cap=layers_cap,
                                             checkpointing=checkpointing, torch=torch, recorder=recorder, check_time=check_time,
                                             no_init_weights=no_init_weights)
            batch = _inputs(model, config, micro_batch, seq_len, torch, target_len)
            if _no_cache:
                batch["use_cache"] = False
            autocast = torch.autocast("cpu", dtype=mixed) if mixed is not None else contextlib.nullcontext()
            def policy():
                return _device_policy(torch, device) if mixed is not None else contextlib.nullcontext()
            F.dropout = native_dropout
            if original_grouped is not None:
                F.grouped_mm = _FakeGroupedMm.make(torch)
            checkpoint_module._recomputation_hook = recorder.counting(original_hook, policy)
            if original_packed is not None:
                masking.find_packed_sequence_indices = lambda position_ids: None
            with torch.autograd.graph.saved_tensors_hooks(recorder.pack, recorder.unpack):
                with autocast, policy():
                    loss = model(**batch).loss
                recorder.state["block"] = "backward"
                loss.backward()
    except MeasureError:
        raise
    except Exception as error:
        failure = MeasureError(f"{type(error).__name__}: {_short(error)}")
    else:
        failure = None
    finally:
        F.dropout = original_dropout
        if original_grouped is not None:
            F.grouped_mm = original_grouped
        checkpoint_module._recomputation_hook = original_hook
        if original_packed is not None:
            masking.find_packed_sequence_indices = original_packed
    if failure is not None:
        if _no_cache or "cache" not in str(failure).lower() or time.monotonic() - started > time_limit:
            raise failure
        # a step with transformers' key/value cache that it cannot build for this config: the step without one
        again = _measure_now(raw, micro_batch=micro_batch, seq_len=seq_len, attention=attention, checkpointing=checkpointing,
                        precision=precision, target_len=target_len, layers_cap=layers_cap,
                        time_limit=time_limit - (time.monotonic() - started), lora=lora, device=device, _no_cache=True)
        return again._replace(note=f"run with use_cache false: with the cache transformers stops ({failure})")
    from memfit.models.hf_activations import lora_key

    return _measured((micro_batch, seq_len, attention, checkpointing, precision, lora_key(lora)), stacks_info, recorder.first,
                     recorder.sizes, recorder.shapes, recorder.recomputing,
                     recorder.live[1] if checkpointing == "full" else sum(recorder.sizes.values()))


def _device_policy(torch, device: str):
    """The step's autocast as `device` runs it: the fake tensors are on the CPU device, under CPU autocast, and where
    `device`'s autocast runs an op in float32 that CPU's does not (recipe/autocast.py's table: CUDA's softmax without
    a dtype, pow, layer_norm) its floating inputs are cast to float32 above autograd, as autocast casts them (a
    softmax gets dtype float32: fp32_set_opt_dtype). Only while autocast is on (a region that turns it off, a rotary
    embedding's, runs as written). The CUDA key's own kernels run on fake "cuda" tensors in a forward only (autograd
    on them needs CUDA's device guard), so the step casts as that key does instead (docs/accuracy.md, "CPU and CUDA
    autocast")."""
    import contextlib

    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    ops = AUTOCAST_FP32_OPS.get(device, frozenset())
    if not ops:
        return contextlib.nullcontext()
    low = (torch.bfloat16, torch.float16)
    set_opt = {torch.softmax, F.softmax, torch.Tensor.softmax} if "softmax" in ops else set()
    fp32 = set()
    if "pow" in ops:
        fp32 |= {torch.pow, torch.Tensor.pow, torch.Tensor.__pow__, torch.Tensor.__rpow__}
    if "layer_norm" in ops:
        fp32 |= {F.layer_norm, torch.layer_norm}

    class Policy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if (func in set_opt or func in fp32) and torch.is_autocast_enabled("cpu"):
                if func in set_opt:
                    at = 3 if func is F.softmax else 2   # (F.softmax's third argument is _stacklevel)
                    stated = kwargs.get("dtype") is not None or (len(args) > at and args[at] is not None)
                    if not stated and isinstance(args[0], torch.Tensor) and args[0].dtype in low:
                        kwargs["dtype"] = torch.float32
                else:
                    args = tuple(a.float() if isinstance(a, torch.Tensor) and a.dtype in low else a for a in args)
                    kwargs = {k: v.float() if isinstance(v, torch.Tensor) and v.dtype in low else v for k, v in kwargs.items()}
            return func(*args, **kwargs)

    return Policy()


def _with_lora(model, lora: dict):
    """peft's LoRA on the fake model, as get_peft_model makes it; peft moves each new adapter to its base layer's
    device and dtype with .to(), which a fake parameter refuses: the adapters stay as created (fp32 on the CPU device,
    peft's autocast_adapter_dtype for a 16-bit base and the base's own dtype in fp32)."""
    import peft
    from peft.tuners.tuners_utils import BaseTunerLayer

    config = peft.LoraConfig(r=lora.get("r", 8), lora_alpha=lora.get("alpha", 8), lora_dropout=lora.get("dropout", 0.0),
                             target_modules=lora.get("target_modules"), modules_to_save=lora.get("modules_to_save") or None)
    import torch

    original, original_to = BaseTunerLayer._move_adapter_to_device_of_base_layer, torch.nn.Module.to

    def to(self, *args, **kwargs):   # a move to the device every fake tensor here is on: nothing to do
        targets = [a for a in args if isinstance(a, (torch.device, str))] + [kwargs.get("device")]
        if all(t is None or torch.device(t).type == "cpu" for t in targets) and "dtype" not in kwargs and not any(
                isinstance(a, torch.dtype) for a in args):
            return self
        return original_to(self, *args, **kwargs)

    BaseTunerLayer._move_adapter_to_device_of_base_layer = lambda self, adapter_name, device=None: None
    torch.nn.Module.to = to
    try:
        return peft.get_peft_model(model, config)
    finally:
        BaseTunerLayer._move_adapter_to_device_of_base_layer = original
        torch.nn.Module.to = original_to


def _measured(run, stacks_info, first, sizes, shapes, recomputing, peak) -> Measured:
    """The blocks of a measurement, unmeasured layers extrapolated from the measured ones."""
    def kept(keys) -> tuple:
        out = []
        for key in keys:
            shape, dtype = shapes[key]
            if dtype not in DTYPES:   # (complex64, an 8-bit float...): its storage's bytes
                shape, dtype = (sizes[key],), "uint8"
            elements = 1
            for d in shape:
                elements *= d
            if dtype_bytes(elements, dtype) != sizes[key]:   # a view: its storage, as a flat run of its dtype
                shape = (dtype_elements(sizes[key], dtype),)
            out.append((f"saved storage {len(out) + 1}", shape, dtype))
        return tuple(out)

    by_block: dict = {}
    for key, block in first.items():
        by_block.setdefault(block, []).append(key)
    blocks = [("embeddings", 1, kept(by_block.get("embeddings", [])))]
    recomputed = []
    extra = 0
    layers_total = 0
    ran_total = 0
    for path, total, ran in stacks_info:
        layers_total += total
        ran_total += ran
        measured = [kept(by_block.get(f"{path}.{i}", [])) for i in range(ran)]
        again = [kept(recomputing.get(f"{path}.{i}", {})) for i in range(ran)]
        for i in range(total):
            j = i if i < ran else 1 + (i - 1) % max(ran - 1, 1)
            j = min(j, ran - 1)
            if blocks[-1][0] == "layer" and blocks[-1][2] == measured[j] and len(blocks) > 1:
                blocks[-1] = ("layer", blocks[-1][1] + 1, blocks[-1][2])
            else:
                blocks.append(("layer", 1, measured[j]))
            recomputed.append(again[j])
            if i >= ran:
                extra += sum(sizes_of(measured[j]))
    blocks.append(("head", 1, kept(by_block.get("head", []))))
    blocks.append(("loss", 1, kept(by_block.get("loss", []) + by_block.get("backward", []))))
    return Measured(run, tuple(blocks), peak + extra, tuple(recomputed), layers_total, ran_total)


def sizes_of(kept) -> list:
    return [dtype_bytes(_elements(shape), dtype) for _, shape, dtype in kept]

"""LoRA as peft makes it: the parameters `peft.get_peft_model(model, LoraConfig(...))`
leaves on a transformers model, with peft's names, shapes, dtypes and trainable flags.

What peft 0.21 does (tuners/lora/layer.py, tuners_utils.py, utils/other.py):
- a targeted linear `m` becomes a LoRA layer: its weight and bias move under
  `m.base_layer.` (frozen), then `m.lora_A.default.weight` (r, in) and
  `m.lora_B.default.weight` (out, r) follow, trainable. The adapters are fp32:
  peft creates them in fp32 and, with autocast_adapter_dtype=True (its default),
  casts fp16/bf16 adapters back to fp32 after moving them to the base layer.
- targets: a list matches a module whose name equals an entry or ends with
  ".entry"; a string other than "all-linear" is a regex that must match the whole
  name; "all-linear" is every linear (and GPT-2 Conv1D) except the output head.
  Modules in modules_to_save are never targeted.
- modules_to_save: every module whose name ends with an entry is wrapped: its own
  parameters stay as `s.original_module.*` (frozen) and a trainable copy, in the
  same dtype, follows as `s.modules_to_save.default.*`.
- everything else is frozen; all names gain the "base_model.model." prefix.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

# what peft does per model type (its default targets, the MoE families it retargets for transformers 5, the
# modules it wraps but fails on, DoRA where memfit does not model it): data in models/, the families' place
from memfit.models.adapter_tables import DEFAULT_TARGETS, DORA_UNMODELLED, MOE_RETARGETED, PEFT_FAILS  # noqa: F401

PREFIX = "base_model.model."
ADAPTER = "default"
ALL_LINEAR = "all-linear"

# Heads (models/families/ names) -> the module get_output_embeddings() returns,
# which "all-linear" leaves out; a classification head has none, so peft adapts it.
OUTPUT_HEADS: dict[str, str | None] = {
    "causal-lm": "lm_head",
    "masked-lm": "cls.predictions.decoder",
    "sequence-classification": None,
    "seq2seq-lm": "lm_head",
}

class LoraError(ValueError):
    """Bad LoRA input; `field` is the config key it is about."""

    def __init__(self, message: str, field: str, suggestions=None):
        super().__init__(message)
        self.field = field
        self.suggestions = suggestions or []


@dataclass(frozen=True, slots=True)
class PeftParam:
    name: str  # as peft_model.named_parameters() gives it
    shape: tuple
    dtype: str | None  # None: the base model's dtype for this parameter
    trainable: bool
    role: str  # "adapter" | "base" | "saved_copy" | "original" | "frozen"
    source: str  # the transformers parameter it comes from ("" for adapters)


@dataclass(frozen=True, slots=True)
class LoraSpec:
    r: int
    alpha: float
    dropout: float
    target_modules: object  # list of suffixes, a regex string, or "all-linear"
    modules_to_save: tuple
    use_dora: bool = False


# lora.dtype: the adapters' dtype. "peft": peft's default (autocast_adapter_dtype=True: fp32 on a 16-bit base);
# "model": the base layer's dtype (peft's autocast_adapter_dtype=False; torchtune's and LitGPT's adapters, built in
# the model's dtype); or a float dtype named outright.
ADAPTER_DTYPES = ("peft", "model", "float32", "bfloat16", "float16")
_UPCAST = ("bfloat16", "float16")  # cast_adapter_dtype's dtypes_to_convert_to_fp32 (and fp8, which no base here is)


def adapter_dtype(section: dict | None, base_dtype: str, quantization: dict | None = None) -> str:
    """The dtype peft (or the framework `lora.dtype` names) keeps the adapters in, on a base kept in `base_dtype`.

    The base layer's dtype is `base_dtype`, or under a bitsandbytes 4-bit quantization its compute_dtype (peft's
    _get_base_layer_device_and_dtype reads Linear4bit.compute_dtype; an int8 weight is no float: the adapters stay
    in torch's default fp32)."""
    section = section or {}
    choice = section.get("dtype")
    if choice is None:
        choice = "model" if section.get("autocast_adapter_dtype") is False else "peft"
    if choice not in ("peft", "model"):
        return choice
    layer = base_dtype
    if quantization:
        from memfit.recipe import quant

        if quant.bnb_4bit(quantization):  # BitsAndBytesConfig's bnb_4bit_compute_dtype defaults to fp32
            from memfit.recipe.dtypes import DTYPES

            layer = quantization.get("compute_dtype") or "float32"
            meaning = DTYPES.get(layer, (0, ""))[1]
            layer = meaning[len("alias of "):] if meaning.startswith("alias of ") else layer
        elif quant.method(quantization.get("method", "nf4")).name == "int8":
            layer = "float32"
    if choice == "model":
        return layer
    return "float32" if layer in _UPCAST else layer


def spec(config: dict, *, model_type: str | None = None) -> LoraSpec:
    """A LoraConfig-like dict (memfit's names, or peft's lora_alpha/lora_dropout) -> LoraSpec."""
    r = config.get("r", 8)
    if isinstance(r, bool) or not isinstance(r, int) or r <= 0:
        raise LoraError(f"lora.r is {r!r}: the rank must be a positive integer (peft refuses r <= 0)", "lora.r")
    alpha = config.get("alpha", config.get("lora_alpha", 8))
    dropout = config.get("dropout", config.get("lora_dropout", 0.0))
    targets = config.get("target_modules")
    if targets is None and model_type in MOE_RETARGETED:
        raise LoraError(
            f"lora.target_modules is not given: on {model_type}, peft 0.21 refuses a LoraConfig without targets "
            "(its transformers-5 MoE conversion finds none); list the modules, e.g. [q_proj, v_proj]",
            "lora.target_modules",
        )
    if targets is None:
        if model_type not in DEFAULT_TARGETS:
            raise LoraError(
                f"lora.target_modules is not given and peft has no default targets for model_type {model_type!r}: list the module names",
                "lora.target_modules",
            )
        targets = DEFAULT_TARGETS[model_type]
    if isinstance(targets, str):
        targets = ALL_LINEAR if targets.lower() == ALL_LINEAR else targets
    else:
        targets = list(targets)
    # all-linear is resolved as peft 0.21 resolves it (_resolve_string_target_modules: the nn.Linear modules, plus the
    # router and the fused experts as target_parameters: peft_parameters); a regex or a list naming the mapped
    # modules goes through the same remap with rank patterns memfit does not model
    retargeted = targets != ALL_LINEAR and (isinstance(targets, str) or set(targets) & set(MOE_RETARGETED.get(model_type, ())))
    if model_type in MOE_RETARGETED and retargeted:
        raise LoraError(
            f"lora.target_modules {targets!r} on {model_type}: peft retargets the router and experts of transformers 5's fused "
            "MoE layers (target_parameters), which memfit does not model; list the attention projections instead "
            "(e.g. [q_proj, k_proj, v_proj, o_proj])",
            "lora.target_modules",
        )
    if model_type in PEFT_FAILS and (isinstance(targets, str) or set(targets) & set(PEFT_FAILS[model_type])):
        raise LoraError(
            f"lora.target_modules {targets!r} on {model_type}: peft 0.21 wraps its {', '.join(PEFT_FAILS[model_type])} "
            "(an nn.Linear returning a tuple) and the forward fails; list the attention projections instead "
            "(e.g. [q_proj, k_proj, v_proj, o_proj])",
            "lora.target_modules",
        )
    if config.get("use_dora") is True and model_type in DORA_UNMODELLED:
        raise LoraError(f"lora.use_dora on {model_type}: {DORA_UNMODELLED[model_type]}", "lora.use_dora")
    saved = tuple(config.get("modules_to_save") or ())
    return LoraSpec(r, alpha, dropout, targets, saved, config.get("use_dora") is True)


def _saved_match(name: str, saved) -> bool:
    return any(re.match(rf"(^|.*\.){m}($|\..*)", name) for m in saved)


def targeted(linears, lora: LoraSpec, *, output_head: str | None = "lm_head", model_type: str | None = None) -> list[str]:
    """Names of the linear modules peft puts adapters on, in the model's order.

    `linears`: (module_name, in_features, out_features, has_bias) rows."""
    names = [row[0] for row in linears]
    if lora.target_modules == ALL_LINEAR:
        chosen = [n for n in names if n != output_head]
        if model_type in MOE_RETARGETED:
            # peft's transformers-5 remap moves the mapped names (the experts' projections, the router) from the
            # modules to target_parameters: a dense layer's or a shared expert's gate_proj / up_proj / down_proj then
            # gets no adapter (their parameters are `.weight`, not the experts' fused `gate_up_proj` / `down_proj`)
            chosen = [n for n in chosen if n.rsplit(".", 1)[-1] not in MOE_RETARGETED[model_type]]
    elif isinstance(lora.target_modules, str):
        chosen = [n for n in names if re.fullmatch(lora.target_modules, n)]
    else:
        wanted = lora.target_modules
        chosen = [n for n in names if n in wanted or any(n.endswith(f".{t}") for t in wanted)]
    chosen = [n for n in chosen if not _saved_match(n, lora.modules_to_save)]
    if not chosen:
        suffixes = sorted({n.rsplit(".", 1)[-1] for n in names})
        raise LoraError(
            f"lora.target_modules {lora.target_modules!r} match no linear module of the model; its linear modules: {', '.join(suffixes)}",
            "lora.target_modules",
            difflib.get_close_matches(str(lora.target_modules if isinstance(lora.target_modules, str) else (lora.target_modules or [""])[0]), suffixes, n=3, cutoff=0.4),
        )
    return chosen


def _modules_of(params) -> list[str]:
    seen, out = set(), []
    for name, *_ in params:
        parts = name.split(".")[:-1]
        for i in range(1, len(parts) + 1):
            module = ".".join(parts[:i])
            if module not in seen:
                seen.add(module)
                out.append(module)
    return out


def saved_modules(params, lora: LoraSpec, linears=()) -> list[str]:
    """Outermost modules that modules_to_save wraps (peft: name.endswith(entry)). A tied output head has no
    parameter of its own in named_parameters() (it is the embedding's), but it is a module peft wraps: `linears`
    names it."""
    if not lora.modules_to_save:
        return []
    modules = _modules_of(params)
    modules += [row[0] for row in linears if row[0] not in modules]
    hits = [m for m in modules if any(m.endswith(t) for t in lora.modules_to_save)]
    outer = [m for m in hits if not any(m.startswith(h + ".") for h in hits if h != m)]
    missing = [t for t in lora.modules_to_save if not any(m.endswith(t) for m in outer)]
    if missing:
        raise LoraError(f"lora.modules_to_save {missing!r} match no module of the model", "lora.modules_to_save")
    return outer


def peft_parameters(params, linears, config, *, output_head: str | None = "lm_head", adapter_dtype: str = "float32", model_type: str | None = None) -> list[PeftParam]:
    """Every parameter of the peft model, in named_parameters() order.

    `params`: the transformers model's (name, shape, ...) rows in named_parameters()
    order (models.hf.parameters gives them); `linears`: its linear modules."""
    lora = config if isinstance(config, LoraSpec) else spec(config, model_type=model_type)
    rows = {row[0]: row for row in linears}
    targets = set(targeted(linears, lora, output_head=output_head, model_type=model_type))
    saved = saved_modules(params, lora, linears)
    moe = lora.target_modules == ALL_LINEAR and model_type in MOE_RETARGETED
    out: list[PeftParam] = []
    pending_adapter: str | None = None
    pending_copies: list[PeftParam] = []
    current_saved: str | None = None

    def flush_adapter():
        nonlocal pending_adapter
        if pending_adapter is not None:
            _, fan_in, fan_out, _ = rows[pending_adapter]
            stem = PREFIX + pending_adapter
            out.append(PeftParam(f"{stem}.lora_A.{ADAPTER}.weight", (lora.r, fan_in), adapter_dtype, True, "adapter", ""))
            out.append(PeftParam(f"{stem}.lora_B.{ADAPTER}.weight", (fan_out, lora.r), adapter_dtype, True, "adapter", ""))
            if lora.use_dora:  # DoraLinearLayer.update_layer: the weight's norm per output row, a trainable Parameter
                out.append(PeftParam(f"{stem}.lora_magnitude_vector.{ADAPTER}.weight", (fan_out,), adapter_dtype, True, "adapter", ""))
            pending_adapter = None

    def flush_copies():
        nonlocal current_saved
        out.extend(pending_copies)
        pending_copies.clear()
        current_saved = None

    for name, shape, *_ in params:
        module, leaf = name.rsplit(".", 1) if "." in name else ("", name)
        owner = next((s for s in saved if name.startswith(s + ".")), None)
        if owner != current_saved:
            flush_copies()
        if module != pending_adapter:
            flush_adapter()
        if owner is not None:
            current_saved = owner
            rest = name[len(owner) + 1 :]
            out.append(PeftParam(f"{PREFIX}{owner}.original_module.{rest}", tuple(shape), None, False, "original", name))
            pending_copies.append(PeftParam(f"{PREFIX}{owner}.modules_to_save.{ADAPTER}.{rest}", tuple(shape), None, True, "saved_copy", name))
        elif module in targets:
            pending_adapter = module
            out.append(PeftParam(f"{PREFIX}{module}.base_layer.{leaf}", tuple(shape), None, False, "base", name))
        else:
            out.append(PeftParam(PREFIX + name, tuple(shape), None, False, "frozen", name))
            if moe:
                out.extend(_moe_adapters(name, tuple(shape), lora.r, adapter_dtype))
    flush_adapter()
    flush_copies()
    # a tied head in modules_to_save (Llama-3.2-1B's lm_head): peft wraps the module, whose original weight is the
    # embedding's (listed once, under the embedding's name), and trains a copy of it of its own
    owned = {name.rsplit(".", 1)[0] for name, *_ in params}
    for owner in saved:
        if owner in rows and owner not in owned and not any(o.startswith(owner + ".") for o in owned):
            _, fan_in, fan_out, bias = rows[owner]
            out.append(PeftParam(f"{PREFIX}{owner}.modules_to_save.{ADAPTER}.weight", (fan_out, fan_in), None, True, "saved_copy", f"{owner}.weight"))
            if bias:
                out.append(PeftParam(f"{PREFIX}{owner}.modules_to_save.{ADAPTER}.bias", (fan_out,), None, True, "saved_copy", f"{owner}.bias"))
    return out


def _moe_adapters(name: str, shape: tuple, r: int, dtype: str) -> list[PeftParam]:
    """peft 0.21's LoRA on a mixture of experts' target_parameters (tuners/lora/layer.py ParamWrapper), measured on
    tiny Mixtral and DeepSeek-V3 models: the router's weight (E, hidden) gets A (r, hidden) and B (E, r); the fused
    gate_up_proj (E, 2I, hidden) rank 2r per expert (rank_pattern: gate and up fused): A (2r·E, hidden), B (2I, 2r·E);
    down_proj (E, hidden, I): A (r·E, I), B (hidden, r·E)."""
    module, leaf = name.rsplit(".", 1) if "." in name else ("", name)
    if leaf == "weight" and module.endswith("mlp.gate") and len(shape) == 2:
        experts, hidden = shape
        return [PeftParam(f"{PREFIX}{module}.lora_A.{ADAPTER}.weight", (r, hidden), dtype, True, "adapter", ""),
                PeftParam(f"{PREFIX}{module}.lora_B.{ADAPTER}.weight", (experts, r), dtype, True, "adapter", "")]
    if module.endswith("mlp.experts") and len(shape) == 3 and leaf in ("gate_up_proj", "down_proj"):
        experts, out_features, in_features = shape
        rank = (2 * r if leaf == "gate_up_proj" else r) * experts
        stem = f"{PREFIX}{module}{'.base_layer' if leaf == 'gate_up_proj' else ''}"
        return [PeftParam(f"{stem}.lora_A.{ADAPTER}.weight", (rank, in_features), dtype, True, "adapter", ""),
                PeftParam(f"{stem}.lora_B.{ADAPTER}.weight", (out_features, rank), dtype, True, "adapter", "")]
    return []


def adapter_count(linears, config, *, output_head: str | None = "lm_head", model_type: str | None = None) -> int:
    """Trainable adapter elements: r * (in + out) per targeted linear (and DoRA's out)."""
    lora = config if isinstance(config, LoraSpec) else spec(config, model_type=model_type)
    rows = {row[0]: row for row in linears}
    return sum(lora.r * (rows[m][1] + rows[m][2]) + (rows[m][2] if lora.use_dora else 0)
               for m in targeted(linears, lora, output_head=output_head, model_type=model_type))


@dataclass(frozen=True, slots=True)
class Row:
    """One tensor of the (peft-wrapped, quantized) transformer: what it is and how it is kept."""

    name: str
    shape: tuple
    dtype: str
    trainable: bool
    role: str  # "adapter" | "base" | "saved_copy" | "original" | "frozen" | "weight" | "quant_state"


def training_parameters(params, linears, *, base_dtype: str, lora_config=None, quantization=None, output_head: str | None = "lm_head", tied=(), model_type: str | None = None, keep_in_fp32=()) -> list[Row]:
    """Every parameter (and bitsandbytes quantization constant) of a transformers model
    loaded in `base_dtype`, quantized as `quantization` says ({method, double_quant,
    skip_modules}) and wrapped by peft as `lora_config` says, in named_parameters() order,
    each quantized weight followed by its QuantState tensors; `keep_in_fp32` (the class's
    _keep_in_fp32_modules) stay unquantized."""
    from memfit.recipe import quant

    rows_by_module = {row[0]: row for row in linears}
    quantized: set = set()
    method = double = None
    if quantization is not None:
        method = quant.method(quantization.get("method", "nf4")).name
        double = bool(quantization.get("double_quant", False))
        quantized = set(quant.quantized_modules(linears, skip_modules=quantization.get("skip_modules"), output_head=output_head, params=params, tied=tied,
                                                    keep_in_fp32=keep_in_fp32))
    if lora_config is not None:
        adapters = adapter_dtype(lora_config if isinstance(lora_config, dict) else None, base_dtype, quantization)
        wrapped = peft_parameters(params, linears, lora_config, output_head=output_head, adapter_dtype=adapters, model_type=model_type)
        source_rows = [(p.name, p.shape, p.dtype or base_dtype, p.trainable, p.role, p.source) for p in wrapped]
    else:
        source_rows = [(name, tuple(shape), base_dtype, True, "weight", name) for name, shape, *_ in params]
    out: list[Row] = []
    for name, shape, dtype, trainable, role, source in source_rows:
        module, _, leaf = source.rpartition(".")
        if source and leaf == "weight" and module in quantized and role not in ("saved_copy",):
            _, fan_in, fan_out, _ = rows_by_module[module]
            stem = name[: -len(".weight")]
            for label, qshape, qdtype in quant.weight_tensors(fan_in, fan_out, method, double_quant=double, base_dtype=base_dtype):
                full = f"{stem}.{label}" if label != "weight" else name
                out.append(Row(full, qshape, qdtype, False, "weight" if label == "weight" else "quant_state"))
            continue
        out.append(Row(name, tuple(shape), dtype, trainable, role))
    return out


def schema_property() -> dict:
    """JSON schema of the `lora` section (peft's LoraConfig names)."""
    return {
        "title": "LoRA",
        "description": "peft LoRA adapters on the transformer model's linear layers; the base is frozen.",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "r": {"title": "Rank", "description": "The adapters' rank (positive).", "type": "integer"},
            "alpha": {"title": "Alpha", "description": "lora_alpha: a scale, no memory effect.", "type": "number"},
            "dropout": {"title": "Dropout", "description": "lora_dropout: above 0, a dropout mask is kept per adapted input.", "type": "number", "minimum": 0, "maximum": 1},
            "target_modules": {
                "title": "Target modules",
                "description": "Module-name suffixes, a regex matched against the whole name, or 'all-linear' (every linear layer but the output head). Default: peft's targets for the family.",
                "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
                "examples": [["q_proj", "k_proj", "v_proj", "o_proj"], ALL_LINEAR],
            },
            "modules_to_save": {"title": "Modules to save", "description": "Modules trained in full: peft keeps a trainable copy of each.", "type": "array", "items": {"type": "string"}},
            "dtype": {
                "title": "Adapter dtype",
                "description": "The dtype the adapters (and their gradients) are kept in: 'peft' (default: fp32 on a 16-bit base, peft's autocast_adapter_dtype=True), 'model' (the base layer's dtype: torchtune, LitGPT, peft with autocast_adapter_dtype=False), or a float dtype.",
                "enum": list(ADAPTER_DTYPES),
            },
            "autocast_adapter_dtype": {"title": "Autocast adapter dtype", "description": "peft's get_peft_model argument: false keeps the adapters in the base layer's dtype (lora.dtype: model); true (default) upcasts 16-bit adapters to fp32. lora.dtype wins where both are given.", "type": "boolean"},
            "use_dora": {"title": "DoRA", "description": "peft's use_dora: a trainable magnitude vector per adapted layer (its output width, in the adapters' dtype) and the tensors DoRA's forward keeps for its gradient.", "type": "boolean"},
        },
        "examples": [{"r": 16, "alpha": 32, "dropout": 0.05, "target_modules": ["q_proj", "v_proj"]}],
    }

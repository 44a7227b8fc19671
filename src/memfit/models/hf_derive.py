"""Reading a transformers model in a memfit config (models/hf.py): `derive` loads and checks its config.json
(models/hf_config), reads the training keys into the recipe's arguments, and emits the model's tensors: its
parameters and the activations autograd keeps (models/hf_activations), with the notes on typos, vision inputs and
selective checkpointing."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

from memfit.models import hf_encdec
from memfit.models.families import QWEN_VL_BLOCKS, SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION
from memfit.models.llava import llava_vision_sizes, reaches_no_loss
from memfit.models.hf_layers import architecture, block_layers, family, head, num_layers
from memfit.models.hf_params import blocks, layer_prefix, linear_modules, parameters, summary
from memfit.models.hf_explain import attention_lines, routing_lines
from memfit.recipe import quant
from memfit.recipe.dtypes import canonical


# ---------------------------------------------------------------------------------------------
# The pipeline's seam: a schema-valid document's transformer model -> tensors (config.tensors)


class BlockRow(NamedTuple):
    """One block as explain and the language server show it: `count` copies of `params` elements
    and `saved_bytes` kept for backward (each), with what is kept: [(label, shape, dtype)]."""

    name: str
    count: int
    params: int
    saved_bytes: int
    kept: list


class Model(NamedTuple):
    """What the check derived, for explain / hover: the normalized config and the block rows."""

    cfg: dict
    file: str | None  # the config.json read, when hf_config names one
    summary: str
    blocks: list
    activations: int  # bytes of the activations figure (the peak of live saved bytes with checkpointing: full)
    training: dict  # micro_batch, seq_len, attention, checkpointing in force
    dtypes: dict | None  # the activation dtype the config forces, as hf_activations takes it
    recipe: dict = {}  # precision and lora as hf_activations takes them (the footprint's and the peak's)

    def explain_notes(self) -> list[str]:
        """What explain states about the model beside its table: a mixture of experts' routing, the attention kernel
        priced where transformers refuses the one asked for (models/hf_explain.py)."""
        return routing_lines(self) + attention_lines(self)

    def activations_with(self, **change) -> int:
        """The activations figure with some training keys changed (what-if, for hints)."""
        return activation_bytes(self.cfg, self.dtypes, **{**self.training, **change}, **self.recipe)


def activation_bytes(cfg: dict, dtypes: dict | None, micro_batch: int, seq_len: int, attention: str, checkpointing: str, **recipe) -> int:
    from memfit.models.hf_activations import peak_saved, saved, total

    if checkpointing == "full":
        return peak_saved(cfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention, checkpointing=checkpointing, dtypes=dtypes, **recipe)
    return total(saved(cfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention, checkpointing=checkpointing, dtypes=dtypes, **recipe))


def is_transformer(model: dict) -> bool:
    return "hf_config" in model or "transformer" in model


def derive(data: dict, out, path: str, tails: dict | None = None) -> list:
    """What `data["model"]` (the transformer form) emits into `out` (config.build.Emitted: its tensors, the Model);
    the problems.

    `path` is the checked file's: hf_config is relative to its directory."""
    import os

    from memfit.diagnostics import codes
    from memfit.diagnostics.diagnostic import Problem
    from memfit.models.hf_config import LoadError, load, model_view, normalize, validate

    model = data["model"]
    training = data.get("training", {})
    hints: list = []
    if "hf_config" in model:
        where = ("model", "hf_config")
        reference = model["hf_config"]
        base = os.path.dirname(path) if path and not path.startswith("<") else "."
        file = os.path.normpath(os.path.join(base, os.path.expanduser(reference)))
        if os.path.isdir(file) and os.path.isfile(os.path.join(file, "config.json")):
            file = os.path.join(file, "config.json")  # a downloaded model's directory
        try:
            loaded = load(file)
        except LoadError as error:
            if error.range is None:
                return [Problem(where, codes.IO, error.message)]
            return [Problem(where, error.code, error.message, file=file, at=error.range)]
        raw = loaded.raw
        found = validate(raw)
        problems = [Problem(where, p.code, p.message, file=file, at=loaded.positions.range(p.path, p.on_key)) for p in found]
    else:
        where, file = ("model", "transformer"), None
        raw = model["transformer"]
        problems = [Problem(where + p.path, p.code, p.message, on_key=p.on_key or not p.path) for p in validate(raw)]
        if not problems:  # read as hf_config reads the file; a likely typo gets a note, not a silent default
            hints = _typo_notes(raw, where)
    if problems:
        return problems
    cfg = model_view(normalize(raw))
    kind = head(cfg)
    fam = family(cfg)

    def at_architecture(message):
        if file is not None:
            return [Problem(where, codes.UNSUPPORTED_MODEL, message, file=file, at=loaded.positions.range(("architectures", 0)))]
        return [Problem(where + ("architectures", 0), codes.UNSUPPORTED_MODEL, message)]

    if fam.block in (tails or {}):  # a family's own tail (models/dispatch passes models/whisper.derive)
        return (hints + _rmsnorm_upcast(cfg, fam, training, False)[1] + _mean_saves_input(cfg, fam, training, False)[1]
                + _old_softmax(cfg, fam, training, None, False)[1] + tails[fam.block](cfg, raw, out, where, file, data, at_architecture))
    classifies = kind in (SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION) and not fam.stacked and fam.block != "llava"
    if kind != fam.architectures[fam.default_architecture] and not classifies:
        # hf_activations models the family's own language-model head (and its loss) and the classifiers
        heads = [name for name, k in fam.architectures.items() if name == fam.default_architecture
                 or (k in (SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION) and not fam.stacked and fam.block != "llava")]
        return at_architecture(f"{architecture(cfg)}: activations are modeled for {', '.join(heads)}, not for a {kind} "
                               f"head; name one of them in architectures[0] (the head's own parameters are then counted "
                               f"as transformers builds them)")
    if fam.block == "bert" and (cfg.get("is_decoder") or cfg.get("add_cross_attention")):
        # a BERT-style encoder run as a decoder (causal mask) or with cross-attention: not the encoder memfit models
        key = "is_decoder" if cfg.get("is_decoder") else "add_cross_attention"
        message = (f"{key}: true makes {architecture(cfg)} a decoder (a causal mask{', cross-attention' if key != 'is_decoder' else ''}); "
                   f"memfit's {fam.model_type} family models the bidirectional encoder and its masked-LM and classifier "
                   f"heads: set {key} to false for those")
        if file is not None:
            return [Problem(where, codes.UNSUPPORTED_MODEL, message, file=file, at=loaded.positions.range((key,), True))]
        return [Problem(where + (key,), codes.UNSUPPORTED_MODEL, message, on_key=True)]
    missing = [key for key in ("micro_batch", "seq_len") if key not in training]
    if missing:
        at = ("training",) if "training" in data else ("model",)
        need = " and ".join(f"training.{key}" for key in missing)
        return [Problem(at, codes.SCHEMA, f"a transformer model needs {need}: the batch axis and the tokens per sequence", on_key=True)]
    micro_batch, seq_len = training["micro_batch"], training["seq_len"]
    if (kind == SEQUENCE_CLASSIFICATION and fam.block != "bert" and cfg.get("pad_token_id") is None
            and isinstance(micro_batch, int) and micro_batch > 1):
        # GenericForSequenceClassification.forward: the last non-padding token is found by pad_token_id
        return at_architecture(f"{architecture(cfg)} with micro_batch {micro_batch}: transformers refuses it (\"Cannot handle "
                               "batch sizes > 1 if no padding token is defined.\"): set pad_token_id in the config.json "
                               "(the tokenizer's pad token, as TRL's reward trainer does) or train with micro_batch 1")
    attention = training.get("attention", "sdpa")
    checkpointing = training.get("checkpointing", "none")
    vision = _vision_training(cfg, training, seq_len, data.get("lora"), data)
    if vision:
        return vision
    parallel = data.get("parallel") if isinstance(data.get("parallel"), dict) else {}
    if fam.stacked:
        for key in ("tensor", "pipeline"):
            if isinstance(parallel.get(key), int) and not isinstance(parallel[key], bool) and parallel[key] > 1:
                message = (f"parallel.{key} {parallel[key]}: memfit does not split an encoder-decoder's two stacks across "
                           f"{key}-parallel ranks; data-parallel layouts (ZeRO, FSDP) are modeled")
                return [Problem(("parallel", key), codes.BAD_PARALLEL, message, on_key=True)]
    if fam.block == "llama4":
        expert = parallel.get("expert")
        if isinstance(expert, int) and not isinstance(expert, bool) and expert > 1:
            message = (f"parallel.expert {expert}: transformers' Llama 4 runs every token through every expert (each copy "
                       "scaled by its router score), so there is nothing to dispatch: Llama4TextConfig has no expert-parallel "
                       "plan and its experts shard with the tensor-parallel one; use parallel.tensor")
            return [Problem(("parallel", "expert"), codes.BAD_PARALLEL, message, on_key=True)]
        if "moe" in training:
            message = ("training.moe sets a routing assumption; Llama 4's experts take every token (E x tokens rows per "
                       "MoE layer, whatever the router picks): ignored")
            hints.append(Problem(("training", "moe"), codes.IGNORED_KEY, message, on_key=True))
    if "target_len" in training and not fam.stacked:
        message = f"training.target_len is the decoder's tokens of an encoder-decoder model; {fam.model_type} has one stack: ignored (seq_len counts its tokens)"
        hints.append(Problem(("training", "target_len"), codes.IGNORED_KEY, message, on_key=True))
    cfg, ignored = _rmsnorm_upcast(cfg, fam, training)
    cfg, unpriced = _mean_saves_input(cfg, fam, training)
    cfg, softmax = _old_softmax(cfg, fam, training, attention)
    cfg, liger = _liger_kernels(cfg, fam, training)
    return hints + ignored + unpriced + softmax + liger + _tensors(cfg, out, where, file, micro_batch, seq_len, attention, checkpointing, data)


def _rmsnorm_upcast(cfg: dict, fam, training: dict, read: bool = True) -> tuple[dict, list]:
    """training.rmsnorm_upcast: false (or fp32_weight): read into the model's cfg where its norm is the RMSNorm the
    key names (its rows read it: hf_act_ops._norm), else an ignored-key note: a LayerNorm, Gemma's, OLMo 2's, an
    encoder-decoder's (T5's rows come from hf_act_t5._t5_norm, which does not read it) and a family with a tail of its
    own (`read` false: models/whisper.derive's rows, DeBERTa's, ModernBERT's)."""
    from memfit.diagnostics import codes
    from memfit.diagnostics.diagnostic import Problem
    from memfit.models.hf_act_families import FAMILIES as ACT_FAMILIES
    from memfit.models.hf_act_ops import RMSNORM_FP32_WEIGHT, RMSNORM_UPCAST

    value = training.get("rmsnorm_upcast")
    if value is not False and value != "fp32_weight":
        return cfg, []
    if read and getattr(ACT_FAMILIES.get(cfg.get("model_type")), "norm", None) == "rms" and not fam.stacked:
        # its RMSNorm computes in its input's dtype, or multiplies by its weight in fp32 (hf_act_ops._norm): the
        # model's rows read it from its config
        return dict(cfg, **({RMSNORM_UPCAST: False} if value is False else {RMSNORM_FP32_WEIGHT: True})), []
    if value is False:
        message = (f"training.rmsnorm_upcast: false is an RMSNorm computed without its fp32 upcast (x * "
                   f"torch.rsqrt(...) as Lit-GPT wrote it before 6178c7cc); {fam.model_type}'s norm is not that "
                   f"RMSNorm: ignored")
    else:
        message = (f"training.rmsnorm_upcast: fp32_weight is an RMSNorm that multiplies by an fp32 copy of its weight "
                   f"((x_normed * weight.float()).to(dtype) as LitGPT writes it from 916a84ca on); {fam.model_type}'s "
                   f"norm is not that RMSNorm: ignored")
    return cfg, [Problem(("training", "rmsnorm_upcast"), codes.IGNORED_KEY, message, on_key=True)]


# training.liger_kernels' kernels memfit prices, each with the rules that read it (the family's norm kind, its MLP
# kind and activation) and the flag set in the model's cfg (hf_act_ops)
LIGER_PRICED = {"rms_norm": "RMSNorm", "swiglu": "SwiGLU MLP"}


def _liger_kernels(cfg: dict, fam, training: dict) -> tuple[dict, list]:
    """training.liger_kernels (ledger/techniques/liger_kernels.py): rms_norm and swiglu read into the model's cfg where
    its norm is the RMSNorm (hf_act_ops._norm "rms") and its MLP the gated one with silu (hf_act_layers._mlp), the
    modules Liger's monkey patches replace in Llama, Mistral, Qwen2, Qwen3 and their kin; else a note (information:
    the peak and the budget gate still run) that the key is not priced there (rope and layer_norm are not priced: the
    figures keep the eager ops')."""
    from memfit.diagnostics import codes
    from memfit.diagnostics.diagnostic import Problem
    from memfit.models.hf_act_families import FAMILIES as ACT_FAMILIES
    from memfit.models.hf_act_ops import LIGER_RMS_NORM, LIGER_SWIGLU

    kernels = training.get("liger_kernels")
    if not isinstance(kernels, list) or not kernels:
        return cfg, []
    rules = ACT_FAMILIES.get(cfg.get("model_type"))
    act = (cfg.get(rules.act_key) or "gelu") if rules is not None else None
    reads = {"rms_norm": rules is not None and rules.norm == "rms" and not fam.stacked,
             "swiglu": rules is not None and rules.mlp == "gated" and act in ("silu", "swish") and not fam.stacked}
    out, notes = dict(cfg), []
    for kernel in kernels:
        if reads.get(kernel):
            out[{"rms_norm": LIGER_RMS_NORM, "swiglu": LIGER_SWIGLU}[kernel]] = True
            continue
        why = (f"{fam.model_type} has no {LIGER_PRICED[kernel]} that Liger's patch replaces as memfit prices it"
               if kernel in LIGER_PRICED else "memfit does not price Liger's " + kernel)
        notes.append(Problem(("training", "liger_kernels"), codes.NOT_MODELLED,
                             f"training.liger_kernels {kernel}: {why}; the figures keep the eager modules' "
                             f"activations (for {kernel}, probably high)", severity=codes.INFORMATION, on_key=True))
    return out, notes


def _mean_saves_input(cfg: dict, fam, training: dict, read: bool = True) -> tuple[dict, list]:
    """training.mean_saves_input: true (torch before 2.2, whose torch.mean kept its input for backward): read into the
    model's cfg where its norm is the RMSNorm whose rows price it (hf_act_ops._norm: the squares its mean keeps), else
    a note that it is not priced there (a LayerNorm is one op with no mean; Gemma's, OLMo 2's, T5's, Whisper's,
    DeBERTa's and ModernBERT's norms do not read it)."""
    from memfit.diagnostics import codes
    from memfit.diagnostics.diagnostic import Problem
    from memfit.models.hf_act_families import FAMILIES as ACT_FAMILIES
    from memfit.models.hf_act_ops import MEAN_SAVES_INPUT

    if training.get("mean_saves_input") is not True:
        return cfg, []
    if read and getattr(ACT_FAMILIES.get(cfg.get("model_type")), "norm", None) == "rms" and not fam.stacked:
        return dict(cfg, **{MEAN_SAVES_INPUT: True}), []
    message = (f"training.mean_saves_input: true prices the squares an RMSNorm's torch.mean keeps under torch before "
               f"2.2; {fam.model_type}'s norm is not that RMSNorm: ignored")
    return cfg, [Problem(("training", "mean_saves_input"), codes.IGNORED_KEY, message, on_key=True)]


def _old_softmax(cfg: dict, fam, training: dict, attention: str | None, read: bool = True) -> tuple[dict, list]:
    """training.softmax_saves_input and training.attention_mask_fp32 (torch < 1.11's softmax, transformers 4.x's
    extended mask): read into the model's cfg, whose eager attention rows read them (hf_act_layers, hf_act_eval's
    `sm_input_*` conditions), else an ignored-key note: under sdpa or flash attention there is no softmax op to keep
    its input, and an encoder-decoder's, a family with a tail of its own (`read` false: Whisper) and gpt-oss's sink
    attention price their softmax in rows of their own, which do not read them."""
    from memfit.diagnostics import codes
    from memfit.diagnostics.diagnostic import Problem
    from memfit.models.hf_act_families import FAMILIES as ACT_FAMILIES
    from memfit.models.hf_act_ops import ATTENTION_MASK_FP32, SOFTMAX_SAVES_INPUT

    keys = {SOFTMAX_SAVES_INPUT: "softmax_saves_input", ATTENTION_MASK_FP32: "attention_mask_fp32"}
    on = [k for k, name in keys.items() if training.get(name) is True]
    if not on:
        return cfg, []
    act = ACT_FAMILIES.get(cfg.get("model_type"))
    if read and act is not None and not fam.stacked and not getattr(act, "sinks", False) and attention == "eager":
        return dict(cfg, **{k: True for k in on}), []
    own = not read or act is None or fam.stacked or getattr(act, "sinks", False)
    why = (f"{fam.model_type}'s attention is priced in rows of its own, which do not read it" if own
           else f"attention {attention} runs no softmax op of its own")
    return cfg, [Problem(("training", keys[k]), codes.IGNORED_KEY, f"training.{keys[k]}: true prices an eager "
                         f"attention's softmax; {why}: ignored", on_key=True) for k in on]


def _vision_training(cfg: dict, training: dict, seq_len: int, lora=None, data=None) -> list:
    """training.images_per_sample and freeze_vision_tower (and, for Qwen2-VL / Qwen2.5-VL, the images' size:
    image_size, image_min_pixels, image_max_pixels): read into the model's cfg (cfg["llava"], cfg["qwen_vl"]); problems
    where the model has no vision tower, or where the images' tokens do not fit the sequence or do not match the
    tower's patches."""
    from memfit.diagnostics import codes
    from memfit.diagnostics.diagnostic import Problem

    sized = ("image_size", "image_min_pixels", "image_max_pixels")
    keys = [key for key in ("images_per_sample", "freeze_vision_tower", *sized) if key in training]
    block = family(cfg).block
    if block in QWEN_VL_BLOCKS:
        return _qwen_vl_training(cfg, training, seq_len, lora)
    if block == "mllama":
        return _mllama_training(cfg, training, seq_len, lora, data or {})
    if not block == "llava":
        return [Problem(("training", key), codes.SCHEMA, f"training.{key} is for a vision-language model (llava, qwen2_vl, "
                        f"qwen2_5_vl, mllama); {cfg['model_type']} takes no images", on_key=True) for key in keys]
    if any(key in training for key in sized):
        key = next(key for key in sized if key in training)
        return [Problem(("training", key), codes.SCHEMA, f"training.{key} sizes the images of a dynamic-resolution model "
                        f"(qwen2_vl, qwen2_5_vl); llava's vision tower takes its config's image_size", on_key=True)]
    own = cfg["llava"]
    own["images"] = training.get("images_per_sample", 1)
    own["freeze_vision_tower"] = bool(training.get("freeze_vision_tower", False))
    z = llava_vision_sizes(cfg)
    per_image = z["P"] if z["cls"] else z["P"] + 1
    if own["images"] and own["image_seq_length"] != per_image:
        message = (f"image_seq_length {own['image_seq_length']} is not the {per_image} features the vision tower gives an "
                   f"image ({z['image']} px in {z['patch']} px patches{', without the CLS token' if z['cls'] else ''}): "
                   "transformers refuses the mismatch")
        return [Problem(("model",), codes.UNSUPPORTED_MODEL, message)]
    if own["images"] * own["image_seq_length"] > seq_len:
        message = (f"{own['images']} image(s) of {own['image_seq_length']} tokens each do not fit in seq_len {seq_len}: "
                   "the image tokens count in the text sequence")
        return [Problem(("training", "seq_len"), codes.SCHEMA, message)]
    return []


def _mllama_training(cfg: dict, training: dict, seq_len: int, lora, data: dict) -> list:
    """Llama 3.2 Vision: the images per sample (one <|image|> token each in the text; every image padded to
    max_num_tiles tiles of the config's image_size: models/mllama.py). The images' size is the config's, the vision
    tower always trains with the model (freeze_vision_tower is not modeled), and LoRA reaching the vision tower or the
    projector is refused. Measured in 32-true, bf16-true (and so 16-true): a *-mixed precision (CPU/CUDA autocast
    over the vision tower) and a quantized base are refused, not modeled."""
    from memfit.diagnostics import codes
    from memfit.diagnostics.diagnostic import Problem
    from memfit.models import mllama

    own = cfg["mllama"]
    own["images"] = training.get("images_per_sample", 1)
    own["seq_len"] = seq_len   # (the batch's cross-attention mask: mllama.batch_bytes)
    precision = data.get("precision")
    if isinstance(precision, str) and precision.endswith("-mixed"):
        return [Problem(("precision",), codes.UNSUPPORTED_MODEL, f"precision {precision} is not modeled for mllama (autocast "
                        "over its vision tower is not measured): memfit models it in 32-true, bf16-true and 16-true")]
    if training.get("checkpointing") == "selective":
        return [Problem(("training", "checkpointing"), codes.UNSUPPORTED_MODEL, "training.checkpointing selective is not "
                        "modeled for mllama (its cross-attention layers' attention core and its vision tower): none or full")]
    parallel = data.get("parallel") if isinstance(data.get("parallel"), dict) else {}
    for key in ("tensor", "pipeline"):
        if isinstance(parallel.get(key), int) and not isinstance(parallel[key], bool) and parallel[key] > 1:
            return [Problem(("parallel", key), codes.UNSUPPORTED_MODEL, f"parallel.{key} {parallel[key]}: memfit does not split "
                            f"mllama's vision tower and cross-attention layers across {key}-parallel ranks (not modeled); "
                            "data-parallel layouts (ZeRO, FSDP) are")]
    if data.get("quantization"):
        return [Problem(("quantization",), codes.UNSUPPORTED_MODEL, "a quantized base is not modeled for mllama (bitsandbytes "
                        "would quantize its vision tower's linears too): memfit models it unquantized", on_key=True)]
    for key in ("image_size", "image_min_pixels", "image_max_pixels", "freeze_vision_tower"):
        if key in training:
            why = ("mllama's processor cuts every image into max_num_tiles tiles of the config's image_size"
                   if key != "freeze_vision_tower" else "memfit models mllama with its vision tower training, or frozen by LoRA")
            return [Problem(("training", key), codes.SCHEMA, f"training.{key} is not modeled for mllama: {why}", on_key=True)]
    if isinstance(lora, dict) and own["images"]:
        reached = mllama.adapted_vision(cfg, lora)
        if reached:
            message = (f"lora.target_modules reach the vision tower or the projector ({reached}; peft matches a module by its "
                       "name's last part, and all-linear takes every linear but the head): memfit models LoRA on the text model "
                       "with the vision tower and projector frozen; name the text model's modules by a regular expression "
                       r"(e.g. .*language_model.*\.(q_proj|v_proj))")
            return [Problem(("lora", "target_modules"), codes.UNSUPPORTED_MODEL, message)]
    if own["images"] > seq_len:
        return [Problem(("training", "seq_len"), codes.SCHEMA, f"{own['images']} image tokens do not fit in seq_len {seq_len}")]
    return []


def _qwen_vl_training(cfg: dict, training: dict, seq_len: int, lora=None) -> list:
    """Qwen2-VL / Qwen2.5-VL: the images per sample, their size as the processor resizes them (image_size, else the
    largest max_pixels allows) and the image tokens each expands to, which must fit seq_len."""
    from memfit.diagnostics import codes
    from memfit.diagnostics.diagnostic import Problem
    from memfit.models import qwen_vl

    own = cfg["qwen_vl"]
    own["images"] = training.get("images_per_sample", 1)
    own["freeze_vision_tower"] = bool(training.get("freeze_vision_tower", False))
    own["min_pixels"] = training.get("image_min_pixels", qwen_vl.MIN_PIXELS)
    own["max_pixels"] = training.get("image_max_pixels", qwen_vl.MAX_PIXELS)
    if "image_size" in training:
        own["image_size"] = training["image_size"]
    if own["min_pixels"] > own["max_pixels"]:
        return [Problem(("training", "image_min_pixels"), codes.SCHEMA, f"training.image_min_pixels {own['min_pixels']:,} exceeds "
                        f"image_max_pixels {own['max_pixels']:,}", on_key=True)]
    try:
        tokens = qwen_vl.image_tokens(cfg)
    except ValueError as error:   # smart_resize refuses an aspect ratio over 200
        return [Problem(("training", "image_size"), codes.SCHEMA, f"training.image_size: the processor refuses it ({error})")]
    gh, gw = qwen_vl.image_grid(cfg)
    patch = own["vision"]["patch_size"]
    if isinstance(lora, dict) and own["images"]:
        reached = qwen_vl.adapted_vision(cfg, lora)
        if reached:
            message = (f"lora.target_modules reach the vision tower ({reached}; peft matches a module by its name's last "
                       "part, and all-linear takes every linear but the head): memfit models LoRA on the text model with the "
                       "vision tower and merger frozen; name the text model's modules only (q_proj, k_proj, v_proj, o_proj" +
                       (", which Qwen2.5-VL's vision blocks do not share" if cfg["model_type"] == "qwen2_5_vl" else
                        ", gate_proj, up_proj, down_proj") + ")")
            return [Problem(("lora", "target_modules"), codes.UNSUPPORTED_MODEL, message)]
    if own["images"] * tokens > seq_len:
        message = (f"{own['images']} image(s) of {tokens} tokens each ({gh * patch} x {gw * patch} px as the processor resizes "
                   f"them: {gh} x {gw} patches of {patch} px, merged {own['vision']['spatial_merge_size']} x "
                   f"{own['vision']['spatial_merge_size']}) do not fit in seq_len {seq_len}: the image tokens count in the text "
                   "sequence (set training.image_size or image_max_pixels for smaller images)")
        return [Problem(("training", "seq_len"), codes.SCHEMA, message)]
    return []


def _typo_notes(raw: dict, where: tuple) -> list:
    """Notes on keys no family reads that are close to a key one does (num_hiden_layers)."""
    from memfit.diagnostics import codes
    from memfit.diagnostics.diagnostic import Problem

    out = []
    for key in raw:
        near = _near_known_key(key) if isinstance(key, str) else None
        if near:
            message = f"{key!r} is read by no model family: ignored, as transformers ignores it; did you mean {near!r}?"
            out.append(Problem(where + (key,), codes.IGNORED_KEY, message, on_key=True))
    return out


@lru_cache(maxsize=1024)
def _near_known_key(key: str) -> str | None:
    """The key a family reads that `key` is a near miss of; None when a family reads `key` itself or none is near
    (remembered: `fit` derives the same config.json once per candidate, and difflib is the slow part)."""
    import difflib

    from memfit.models.family_keys import NAMED_KEYS as known  # every family's, without importing every family

    if key in known:
        return None
    near = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.9)
    return near[0] if near else None


def _recipe_arguments(data: dict, base: str = "float32") -> dict:
    """What hf_activations takes from the recipe keys: the precision (when a known one is
    given) and the LoRA config (what autograd keeps changes with adapters). `base`: the dtype
    the model's parameters are kept in (a quantized base's non-quantized modules)."""
    out = {}
    if isinstance(data.get("precision"), str):
        from memfit.recipe.precision import engine_precision  # only then: it is a cold-start cost for every transformer config

        precision = engine_precision(data)  # under ZeRO, *-mixed is DeepSpeed's 16-bit model: no autocast
        if precision is not None:
            out["precision"] = precision
    if isinstance(data.get("lora"), dict):
        out["lora"] = data["lora"]
    moe = (data.get("training") or {}).get("moe")
    expert = (data.get("parallel") or {}).get("expert") if isinstance(data.get("parallel"), dict) else None
    if isinstance(moe, dict) or isinstance(expert, int) and expert > 1:
        # a mixture of experts' routed rows per rank: the routing assumption, a capacity factor, the expert group
        out["moe"] = {**(moe if isinstance(moe, dict) else {}), **({"expert": expert} if isinstance(expert, int) else {})}
    quantization = data.get("quantization")
    if quant.bnb_4bit(quantization) and "precision" not in out:
        from memfit.models.hf_activations import qlora_precision

        # A 4-bit base linear keeps nothing for backward, and bitsandbytes casts its output back
        # to its input's dtype (Linear4bit.forward: out.to(inp_dtype)): the activations follow the
        # dtype the rest of the model is kept in, not bnb_4bit_compute_dtype (issue 19: an fp32
        # base measured 22% above the compute-dtype figure).
        try:
            out["precision"] = qlora_precision(base)
        except KeyError:
            pass
    return out


# --- hardening (issue 23): dtypes.activations on a transformer model -----------------------------
# hf_activations computes per tensor in the float dtypes autograd keeps (float32, bfloat16, float16); a config's
# dtypes.activations forces that dtype. An alias is its dtype; a numeric width is the float of that width; any
# other dtype (float64, int8, a 4-bit format, width 8...) is refused at the key, never replaced by the recipe's.
_ACTIVATION_FLOATS = ("float32", "bfloat16", "float16")


def forced_activations(declared) -> tuple:
    """(the dtypes argument hf_activations takes, or None; a Problem at dtypes.activations, or None)."""
    from memfit.diagnostics import codes
    from memfit.diagnostics.diagnostic import Problem
    from memfit.recipe.dtypes import DTYPES

    value = declared.get("activations") if isinstance(declared, dict) else None
    if value is None:
        return None, None
    name = None
    if isinstance(value, str) and value in DTYPES:
        meaning = DTYPES[value][1]
        name = meaning[len("alias of ") :] if meaning.startswith("alias of ") else value
        name = "float32" if name == "tf32" else name  # stored as 32 bits
    elif not isinstance(value, (str, bool)):
        name = {DTYPES[n][0]: n for n in ("float32", "float16")}.get(value)
    if name in _ACTIVATION_FLOATS:
        return {"activations": name}, None
    shown = value if isinstance(value, str) else f"{value} bytes per element"
    message = (
        f"dtypes.activations {shown}: a transformer model's activations are modeled per tensor in "
        f"{', '.join(_ACTIVATION_FLOATS)} (or a width of 4 or 2 bytes); this dtype is not"
    )
    return None, Problem(("dtypes", "activations"), codes.UNKNOWN_DTYPE, message)


def unmodelled_precision(recipe: dict):
    """A Problem at `precision` where the recipe is one the per-tensor activation rules do not cover (64-true: the
    rules give each op's kept dtype for 32-bit and 16-bit models; a float64 model's ops, its norms' fp32 casts and its
    loss's upcast were not measured), else None."""
    from memfit.diagnostics import codes
    from memfit.diagnostics.diagnostic import Problem
    from memfit.models.hf_act_ops import PRECISIONS

    precision = recipe.get("precision")
    if precision is None or precision in PRECISIONS:
        return None
    message = (f"precision {precision}: a transformer model's activations are modeled per tensor under "
               f"{', '.join(PRECISIONS)}; this precision's are not, so no figure is given for this model (use one of "
               f"those, or declare the tensors)")
    return Problem(("precision",), codes.UNSUPPORTED_MODEL, message)


def _tensors(cfg, out, where, file, micro_batch, seq_len, attention, checkpointing, data) -> list:
    from memfit.config.build import make_tensor
    from memfit.recipe.costs import width
    from memfit.models.hf_activations import peak_saved, saved as saved_by, total as total_of

    rows = []
    prefix = layer_prefix(cfg)
    dtypes, problem = forced_activations(data.get("dtypes", {}))
    if problem is not None:
        return [problem]
    base_name = out.widths["parameters"].name
    recipe = _recipe_arguments(data, base_name if isinstance(base_name, str) else "float32")
    problem = unmodelled_precision(recipe)
    if problem is not None:
        return [problem]
    adapted = "lora" in data or "quantization" in data
    if adapted:
        # peft's LoRA and bitsandbytes' storage: every parameter by its peft name (recipes, issue 12)
        from memfit.recipe import adapters
        from memfit.recipe.dtypes import DTYPES

        if adapters.problems(data):
            return []  # reported by check already; no footprint is shown
        base = out.widths["parameters"].name
        base = base if base in DTYPES else "float32"
        model_params, model_linears = parameters(cfg), linear_modules(cfg)
        param_rows, problems = adapters.transformer_rows(cfg, data, base, model_params, model_linears, head(cfg))
        if problems:
            return problems
        if isinstance(data.get("lora"), dict):  # the adapters' dtype (recipe.lora.adapter_dtype) for what autograd keeps
            from memfit.recipe.lora import adapter_dtype

            dtypes = {**(dtypes or {}), "adapter": adapter_dtype(data["lora"], base, data.get("quantization"))}
            if quant.bnb_4bit(data.get("quantization")):
                # bitsandbytes' 4-bit linears are not autocast ops: what they keep and the dtype of their outputs
                # differ from a dense base's under *-mixed (hf_activations._quantized_base)
                dtypes["quantized"] = "4bit"
                # the dtype the weights were quantized from (models/held.py): quantization.quantized_from, else the base's
                dtypes["quantized_from"] = canonical(data["quantization"].get("quantized_from") or base)
                # a 4-bit output head (skip_modules without it): dequantized in every forward and backward of it
                # (ledger/techniques/chunked_loss.py)
                dtypes["head_quantized"] = adapters.head_quantized(cfg, data, model_params, model_linears, head(cfg))
            if data["lora"].get("use_dora") is True and isinstance(data.get("quantization"), dict):
                # DoRA dequantizes a quantized base weight in every forward (peft dequantize_module_weight): the
                # dtype it comes out in is the 4-bit layer's (the adapters' dtype on the base layer, without autocast)
                dtypes["dequantized"] = adapter_dtype({"dtype": "model"}, base, data["quantization"])
    if str(recipe.get("precision", "")).endswith("-mixed"):
        # which autocast runs, from the device (config/presets.device_type): what softmax, pow and layer_norm keep
        from memfit.config.presets import device_type

        dtypes = {**(dtypes or {}), "autocast": device_type(data.get("device"))}
    stacked = hf_encdec.is_stacked(cfg)
    if stacked:  # the decoder's tokens: training.target_len, seq_len when not given
        recipe = {**recipe, "target_len": (data.get("training") or {}).get("target_len", seq_len)}
        if not adapted:  # every parameter by its own name (layer 0 of each stack owns the relative bias)
            for p in parameters(cfg):
                out.tensors.append(make_tensor("parameters", where, p.name, list(p.shape), 1, True, None, out))
    saved = saved_by(cfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention, checkpointing=checkpointing, dtypes=dtypes, **recipe)
    notes = _selective_notes(cfg, data, saved, micro_batch, seq_len, attention, checkpointing, dtypes, recipe)
    by_block: dict = {}
    for b in saved:  # under LoRA the first layer keeps less than the others: two "layer" blocks
        runs = by_block.setdefault(b.name, [])
        same = next((n for n, r in enumerate(runs) if r.kept == b.kept), None)
        if same is None:
            runs.append(b)
        else:  # layers that differ alternate: one row per kind and what it keeps
            runs[same] = runs[same]._replace(count=runs[same].count + b.count)
    covers = block_layers(cfg)
    if checkpointing == "full" and len(covers) > 1 and len(by_block.get("layer") or ()) == 1:
        # layers that differ (dense and sparse) keep one boundary each under full checkpointing: each kind's block
        # counts its own layers, as its parameters do (explain's parameter total reads count x params)
        boundary = by_block["layer"][0]
        by_block.update({name: [boundary._replace(name=name, count=len(layers))] for name, layers in covers.items()})
    for name, count, params in blocks(cfg):
        elements = 0
        for p in params:
            if adapted or stacked:
                elements += math.prod(p.shape)
                continue
            trains = not (cfg.get("llava", {}).get("freeze_vision_tower") and p.name.startswith("model.vision_tower."))
            if trains and "llava" in cfg and reaches_no_loss(cfg, p.name):
                trains = False   # a tower layer past the hidden state the projector reads, post_layernorm
            if cfg.get("qwen_vl", {}).get("freeze_vision_tower") and p.name.startswith(("model.visual.patch_embed.", "model.visual.blocks.")):
                trains = False   # (the merger, LLaMA-Factory's multi-modal projector, still trains)
            if name in covers and len(covers[name]) < num_layers(cfg):  # layers that differ: each layer by index
                for i in covers[name]:
                    out.tensors.append(make_tensor("parameters", where, f"{prefix}{i}.{p.name}", list(p.shape), 1, trains, None, out))
                elements += math.prod(p.shape)
                continue
            label = f"{prefix}*.{p.name}" if name in covers else p.name
            tensor = make_tensor("parameters", where, label, list(p.shape), count, trains, None, out)
            out.tensors.append(tensor)
            elements += tensor.elements
        rows += saved_rows(out, where, name, by_block.get(name) or [None], count, elements)
    rows += saved_rows(out, where, "loss", (by_block.get("loss") or [])[:1], 1, 0)
    total = total_of(saved)
    if checkpointing == "full":
        peak = peak_saved(cfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention, checkpointing=checkpointing, dtypes=dtypes, **recipe)
        if peak > total:
            # the backward recomputes one layer at a time: its saved tensors live beside the boundaries
            extra = peak - total
            label = "recomputation: one layer's saved tensors in the backward, beyond the head and loss"
            out.tensors.append(make_tensor("activations", where, label, [extra], 1, True, width("uint8"), out))
            rows.append(BlockRow("recomputed layer", 1, 0, extra, []))
        total = max(peak, total)
    if adapted:
        for row in param_rows:
            own = None if row.dtype == base else width(row.dtype)
            out.tensors.append(make_tensor("parameters", where, row.name, list(row.shape), 1, row.trainable, own, out))
    training = {"micro_batch": micro_batch, "seq_len": seq_len, "attention": attention, "checkpointing": checkpointing}
    out.model = Model(cfg, file, summary(cfg), rows, total, training, dtypes, recipe)
    return notes


def _selective_notes(cfg, data, saved, micro_batch, seq_len, attention, checkpointing, dtypes, recipe) -> list:
    """A note on `checkpointing: selective` where it keeps exactly what `none` keeps: selective
    recomputation (Korthikanti et al. 2022) drops the attention core (the b x heads x s x s scores, their
    softmax and dropout) that eager attention saves; a fused kernel (sdpa, flash) saves no such matrix, so
    nothing is recomputed and nothing saved. Compared, not assumed: the saved tensors of both settings. Under
    tensor or pipeline parallelism (Megatron's own split) no note is given."""
    if checkpointing != "selective":
        return []
    parallel = data.get("parallel") if isinstance(data.get("parallel"), dict) else {}
    if parallel.get("tensor", 1) != 1 or parallel.get("pipeline", 1) != 1:
        return []
    from memfit.models.hf_activations import saved as saved_by

    if saved_by(cfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention, checkpointing="none", dtypes=dtypes, **recipe) != saved:
        return []
    from memfit.diagnostics import codes
    from memfit.diagnostics.diagnostic import Problem

    message = (
        f"checkpointing: selective changes nothing with attention: {attention}: it recomputes the attention core "
        f"(the scores, their softmax and dropout: a heads x seq_len x seq_len matrix per sequence) that only eager "
        f"attention saves, and {attention}'s fused kernel saves no such matrix, so every layer keeps what "
        f"checkpointing: none keeps; checkpointing: full recomputes each layer from its input instead"
    )
    return [Problem(("training", "checkpointing"), codes.SELECTIVE_NOOP, message)]


def saved_rows(out, where, name: str, blocks: list, count: int, elements: int) -> list:
    """The activations a model's block keeps, as config tensors (priced by the recipe through make_tensor), and its
    BlockRow per saved-block (a None block: the block keeps nothing, `count` copies); models.traced emits the same."""
    from memfit.config.build import make_tensor
    from memfit.recipe.costs import width

    rows = []
    for block in blocks:
        copies = count if block is None else block.count
        kept = [] if block is None else block.kept
        saved_bytes = 0
        for k in kept:
            tensor = make_tensor("activations", where, f"{name}: {k.label}", list(k.shape), copies, True, width(k.dtype), out)
            out.tensors.append(tensor)
            saved_bytes += tensor.bytes["activations"] // copies
        rows.append(BlockRow(name, copies, elements, saved_bytes, [(k.label, k.shape, k.dtype) for k in kept]))
    return rows

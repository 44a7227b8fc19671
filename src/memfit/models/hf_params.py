"""A transformers model's parameters from its module tree (models/hf.py): `module_tree` (embeddings, the layers,
the head), `parameters` in named_parameters() order, the count, the LoRA-targetable linear modules, the blocks and
the one-line summary (the encoder-decoder stacks' too)."""

from __future__ import annotations

import math

from memfit.models import hf_encdec
from memfit.models.falcon import falcon_kv_heads
from memfit.models.families import EXPERTS_KEY, MASKED_LM, SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION
from memfit.models.hf_layers import (
    architecture, _base, _block_name, CONV1D, EMBEDDING, family, head, head_dim, _hidden, _layer, layer_kinds,
    LINEAR, LINEAR_BIAS, Module, NORM, num_layers, OTHER, Param, _templates,
)


def module_tree(cfg: dict) -> tuple[list[Module], str, list[Module], list[Module], set]:
    """(modules before the layers, layer prefix, one layer's modules, modules after, tied parameter names)."""
    fam = family(cfg)
    kind = head(cfg)
    h, vocab = _hidden(cfg, fam), cfg["vocab_size"]
    labels = len(cfg["id2label"]) if cfg.get("id2label") is not None else 2
    with_pooler = fam.block == "bert" and kind == SEQUENCE_CLASSIFICATION
    before, layers, after = _base(cfg, fam, with_pooler)
    prefix = fam.base + "."
    before = [Module(prefix + m.path, m.type, m.dims) for m in before]
    after = [Module(prefix + m.path, m.type, m.dims) for m in after]
    tied: set = set()
    tie = bool(cfg.get("tie_word_embeddings"))
    if fam.encoder_head == "roberta" and kind in (SEQUENCE_CLASSIFICATION, MASKED_LM):
        # RobertaClassificationHead (dense, tanh, out_proj) / RobertaLMHead (its bias first: a module's own parameters
        # come before its children's; the decoder's weight is the word embedding's and its bias lm_head.bias when tied)
        if kind == SEQUENCE_CLASSIFICATION:
            after += [Module("classifier.dense", "linear", (h, h, True)), Module("classifier.out_proj", "linear", (h, labels, True))]
        else:
            after += [Module("lm_head.bias", "param", (vocab,)), Module("lm_head.dense", "linear", (h, h, True)),
                      Module("lm_head.layer_norm", "layernorm", (h,)), Module("lm_head.decoder", "linear", (h, vocab, True))]
            if tie:
                tied = {"lm_head.decoder.weight", "lm_head.decoder.bias"}
    elif kind == SEQUENCE_CLASSIFICATION:
        if fam.block == "bert":
            after.append(Module("classifier", "linear", (h, labels, True)))
        else:
            after.append(Module("score", "linear", (h, labels, False)))
    elif kind == TOKEN_CLASSIFICATION:   # dropout, then the classifier (with a bias) at every position
        after.append(Module(fam.classifier, "linear", (h, labels, True)))
    elif fam.block == "bert":  # BertForMaskedLM and BertLMHeadModel share the MLM prediction head
        after += [
            Module("cls.predictions.bias", "param", (vocab,)),
            Module("cls.predictions.transform.dense", "linear", (h, h, True)),
            Module("cls.predictions.transform.LayerNorm", "layernorm", (h,)),
            Module("cls.predictions.decoder", "linear", (h, vocab, True)),
        ]
        if tie:
            tied = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    else:
        after.append(Module("lm_head", "linear", (h, vocab, bool(cfg.get("lm_head_bias")))))
        if tie:
            tied = {"lm_head.weight"}
    kinds = layer_kinds(cfg)
    return before, prefix + layers, _templates(cfg)[kinds[0]] if kinds else _layer(cfg, fam), after, tied


def _params(module: Module, name: str) -> list[Param]:
    kind, dims = module.type, module.dims
    if kind == "linear":
        fan_in, fan_out, bias = dims
        out = [Param(name + ".weight", (fan_out, fan_in), LINEAR)]
        return out + [Param(name + ".bias", (fan_out,), LINEAR_BIAS)] if bias else out
    if kind == "conv1d":  # GPT-2's Conv1D keeps its weight transposed: (in, out)
        fan_in, fan_out, bias = dims
        out = [Param(name + ".weight", (fan_in, fan_out), CONV1D)]
        return out + [Param(name + ".bias", (fan_out,), LINEAR_BIAS)] if bias else out
    if kind == "embedding":
        return [Param(name + ".weight", dims, EMBEDDING)]
    if kind == "rmsnorm":
        return [Param(name + ".weight", dims, NORM)]
    if kind == "layernorm":
        return [Param(name + ".weight", dims, NORM), Param(name + ".bias", dims, NORM)]
    return [Param(name, dims, OTHER)]


def tied_embedding(cfg: dict) -> str | None:
    """The input embedding's weight when the head shares it (tie_word_embeddings), else None: the one parameter
    whose gradient the head's backward starts (autograd sums the embedding's part into it later)."""
    if hf_encdec.is_stacked(cfg):
        return None
    before, _, _, _, tied = module_tree(cfg)
    # the word embedding: the embedding over the vocabulary (LLaVA's vision tower comes first with embeddings of its own)
    words = next((m for m in before if m.type == "embedding" and m.dims[0] == cfg["vocab_size"]), None)
    return words.path + ".weight" if tied and words is not None else None


def layer_parameters(cfg: dict) -> list[Param]:
    """The first layer's parameters, names relative to the layer (every layer is alike but where
    layer_kinds says they differ)."""
    return [p for m in module_tree(cfg)[2] for p in _params(m, m.path)]


def parameters(cfg: dict) -> list[Param]:
    """named_parameters() of the transformers class for this config, in order, tied weights once."""
    if cfg.get("model_type") == "whisper":  # models/hf_encdec.whisper_modules (proj_out tied: left out)
        return [p for m in hf_encdec.whisper_modules(cfg) for p in _params(m, m.path)]
    if hf_encdec.is_stacked(cfg):
        return _stacked_parameters(cfg)
    before, layers, layer, after, tied = module_tree(cfg)
    out = [p for m in before for p in _params(m, m.path)]
    templates = {kind: [p for m in modules for p in _params(m, m.path)] for kind, modules in _templates(cfg).items()}
    for index, kind in enumerate(layer_kinds(cfg)):
        prefix = f"{layers}.{index}."
        out += [Param(prefix + p.name, p.shape, p.kind) for p in templates[kind]]
    out += [p for m in after for p in _params(m, m.path) if p.name not in tied]
    return out


def parameter_count(cfg: dict) -> int:
    """Elements of all parameters (tied ones once), without listing each layer."""
    if cfg.get("model_type") == "whisper":  # models/hf_encdec.whisper_modules
        return sum(math.prod(p.shape) for m in hf_encdec.whisper_modules(cfg) for p in _params(m, m.path))
    if hf_encdec.is_stacked(cfg):
        return sum(math.prod(p.shape) for p in _stacked_parameters(cfg))
    before, _, layer, after, tied = module_tree(cfg)

    def elements(params) -> int:
        total = 0
        for p in params:
            n = 1
            for d in p.shape:
                n *= d
            total += n
        return total

    fixed = [p for m in before for p in _params(m, m.path)] + [p for m in after for p in _params(m, m.path) if p.name not in tied]
    kinds = layer_kinds(cfg)
    return elements(fixed) + sum(kinds.count(kind) * elements([p for m in modules for p in _params(m, m.path)])
                                 for kind, modules in _templates(cfg).items())


def linear_modules(cfg: dict) -> list[tuple[str, int, int, bool]]:
    """(module name, in_features, out_features, has_bias) of every nn.Linear and GPT-2 Conv1D, in module order."""
    if cfg.get("model_type") == "whisper":  # models/hf_encdec.whisper_modules, and proj_out (tied or not)
        linears = [(m.path, *m.dims) for m in hf_encdec.whisper_modules(cfg) if m.type == "linear"]
        tied = cfg.get("tie_word_embeddings", True)
        return linears + ([("proj_out", cfg["d_model"], cfg["vocab_size"], False)] if tied else [])
    if hf_encdec.is_stacked(cfg):
        return [(m.path, *m.dims) for _, modules in hf_encdec._segments(cfg) for m in modules if m.type == "linear"]
    before, layers, layer, after, _ = module_tree(cfg)
    out = [(m.path, *m.dims) for m in before if m.type in ("linear", "conv1d")]
    templates = {kind: [m for m in modules if m.type in ("linear", "conv1d")] for kind, modules in _templates(cfg).items()}
    for index, kind in enumerate(layer_kinds(cfg)):
        prefix = f"{layers}.{index}."
        out += [(prefix + m.path, *m.dims) for m in templates[kind]]
    out += [(m.path, *m.dims) for m in after if m.type in ("linear", "conv1d")]
    return out


def blocks(cfg: dict) -> list[tuple[str, int, list[Param]]]:
    """The parameters grouped as hf_activations groups what is saved: (block, count, params) for
    "embeddings", "layer" (one layer, names relative to it, `count` = the number of layers) and "head"
    (the final norm and the head), tied weights once. Concatenated with the layer repeated, this is
    parameters(). Where layers differ (layer_kinds) each kind is its own block ("layer" and "dense
    layer"), in the order a kind first appears; block_layers(cfg) says which layers each covers. An encoder-decoder
    has a layer block per stack ("encoder layer", "decoder layer")."""
    if hf_encdec.is_stacked(cfg):
        return _stacked_blocks(cfg)
    before, layers, layer, after, tied = module_tree(cfg)
    kinds = layer_kinds(cfg)
    middle = [(_block_name(kind, kinds), kinds.count(kind), [p for m in modules for p in _params(m, m.path)])
              for kind, modules in _templates(cfg).items()]
    return [
        ("embeddings", 1, [p for m in before for p in _params(m, m.path)]),
        *middle,
        ("head", 1, [p for m in after for p in _params(m, m.path) if p.name not in tied]),
    ]


def layer_prefix(cfg: dict) -> str:
    """The name prefix of layer i is layer_prefix(cfg) + f"{i}." (an encoder-decoder: its first stack's)."""
    if hf_encdec.is_stacked(cfg):
        return hf_encdec.stacks(cfg)[0][1]
    return module_tree(cfg)[1] + "."


def summary(cfg: dict) -> str:
    """One line for a hover: the class, its size and its shape."""
    fam = family(cfg)
    if fam.block == "whisper":
        return hf_encdec.whisper_summary(cfg)
    if fam.stacked:
        return _stacked_summary(cfg)
    heads = cfg["n_head"] if fam.model_type == "gpt2" else cfg["num_attention_heads"]
    kv = falcon_kv_heads(cfg) if fam.block == "falcon" else cfg.get("num_key_value_heads")
    attention = f"{heads} heads" + (f" ({kv} key/value)" if kv is not None and kv != heads else "") + f" of {head_dim(cfg)}"
    if fam.block == "deepseek_v3":   # latent attention: the heads' widths and the latents
        q = f"q_lora_rank {cfg['q_lora_rank']}, " if cfg.get("q_lora_rank") is not None else ""
        attention = (f"{heads} latent-attention heads (q/k {cfg['qk_nope_head_dim'] + cfg['qk_rope_head_dim']}, "
                     f"v {cfg['v_head_dim']}; {q}kv_lora_rank {cfg['kv_lora_rank']})")
    text = f"{architecture(cfg)}: {parameter_count(cfg):,} parameters; {num_layers(cfg)} layers, hidden {_hidden(cfg, fam)}, {attention}"
    if fam.block == "llama4":
        moe = sum(kind.startswith("moe") for kind in layer_kinds(cfg))
        nope = sum(not rope for rope in cfg["no_rope_layers"][: num_layers(cfg)])
        text += (f", {cfg['num_local_experts']} experts ({cfg['num_experts_per_tok']} scored per token, every token "
                 f"through every expert) and a shared expert in {moe} of {num_layers(cfg)} layers; {nope} NoPE layers")
    if fam.model_type in EXPERTS_KEY:
        text += f", {cfg[EXPERTS_KEY[fam.model_type]]} experts ({cfg['num_experts_per_tok']} per token)"
        if fam.block == "qwen2_moe":
            text += " and a shared expert"
        elif fam.block == "deepseek_v3" and cfg["n_shared_experts"]:
            text += f" and {cfg['n_shared_experts']} shared"
        dense = layer_kinds(cfg).count("dense")
        if dense:
            text += f"; {dense} dense layers"
    if cfg.get("tie_word_embeddings") and head(cfg) not in (SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION):
        text += ", embeddings tied to the head"
    return text


# ---------------------------------------------------------------------------------------------
# Encoder-decoder families (models/hf_encdec.py gives the module tree: both stacks, layer 0's relative bias)


def _stacked_parameters(cfg: dict) -> list[Param]:
    return [p for _, modules in hf_encdec._segments(cfg) for m in modules for p in _params(m, m.path) if p.name not in hf_encdec.TIED]


def _stacked_blocks(cfg: dict) -> list:
    """(block, count, one copy's params): the relative-bias tables and the encoder's final norm count with the
    embeddings (what they keep lives as long as the embeddings' tensors), a layer block's params are layer 0's
    without its bias table (relative names), the decoder's final norm with the head."""
    layer_blocks = {name: (prefix, count) for name, prefix, count in hf_encdec.stacks(cfg)}
    out: dict = {"embeddings": []}
    for name, modules in hf_encdec._segments(cfg):
        params = [p for m in modules for p in _params(m, m.path) if p.name not in hf_encdec.TIED]
        if name not in layer_blocks:
            out.setdefault(name, []).extend(params)
            continue
        prefix, _ = layer_blocks[name]
        first = params[0].name.startswith(prefix + "0.")
        for p in params:
            if p.name.endswith("relative_attention_bias.weight"):
                out["embeddings"].append(p)
            elif first:
                out.setdefault(name, []).append(Param(p.name[len(prefix) + 2 :], p.shape, p.kind))
    counts = {name: count for name, _, count in hf_encdec.stacks(cfg)}
    order = ["embeddings", *counts, "head"]
    return [(name, counts.get(name, 1), out.get(name, [])) for name in order]


def _stacked_summary(cfg: dict) -> str:
    n = hf_encdec.dims(cfg)
    count = sum(math.prod(p.shape) for p in _stacked_parameters(cfg))
    return (f"{architecture(cfg)}: {count:,} parameters; {n['Ne']} encoder + {n['Nd']} decoder layers, hidden {n['h']}, "
            f"{n['H']} heads of {n['d']}, feed-forward {n['i']} ({cfg['feed_forward_proj']}), embeddings tied to the head")

"""A transformers model's parameters, from its normalized config (models/hf_config.normalize).

`parameters(cfg)` lists what `named_parameters()` of the transformers 5.24 class yields for that
config (built on the meta device): the same names, shapes and order, a tied weight once (at its
first name, the input embedding), buffers left out (rotary inv_freq, BERT's position ids, Gemma's
embedding scale). `linear_modules(cfg)` lists the nn.Linear (and GPT-2 Conv1D) modules a LoRA
adapter can target. Both come from one description of the module tree per family, written once
per layer kind and repeated for the layers, so a 70B config derives as fast as a tiny one.

Module order follows each class's __init__ (named_parameters visits a module's own parameters,
then its children in registration order); tests/models/test_transformers_params.py builds every family
with transformers and compares.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

from memfit.models import hf_encdec
from memfit.models.families import EXPERTS_KEY, FAMILIES, MASKED_LM, QWEN_VL_BLOCKS, SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION, Family
from memfit.models.falcon import falcon_kv_heads, falcon_layout  # noqa: F401  (hf.falcon_layout for callers)
from memfit.models.llava import llava_vision_sizes

LINEAR, LINEAR_BIAS, CONV1D, EMBEDDING, NORM, OTHER = "linear", "linear_bias", "conv1d", "embedding", "norm", "other"
ATTENTIONS = ("eager", "sdpa", "flash")  # training.attention; sdpa is transformers' default
CHECKPOINTING = ("none", "full", "selective")  # training.checkpointing; selective recomputes the attention core (Korthikanti et al.)


class Param(NamedTuple):
    name: str
    shape: tuple
    kind: str  # linear | linear_bias | conv1d | embedding | norm | other


class Module(NamedTuple):
    """One module with parameters: `type` is linear, conv1d, embedding, rmsnorm, layernorm or param (a bare
    nn.Parameter named `path`); `dims` are (in, out, bias) for linear/conv1d, (rows, dim) for an embedding,
    (dim,) for a norm, the shape for a param."""

    path: str
    type: str
    dims: tuple


def family(cfg: dict) -> Family:
    return FAMILIES[cfg["model_type"]]


def architecture(cfg: dict) -> str:
    names = cfg.get("architectures")
    return names[0] if names else family(cfg).default_architecture


def head(cfg: dict) -> str:
    """causal-lm, masked-lm, sequence-classification or token-classification: what the architecture puts on the base
    model."""
    return family(cfg).architectures[architecture(cfg)]


def _hidden(cfg: dict, fam: Family) -> int:
    return cfg[fam.hidden_key]


def head_dim(cfg: dict) -> int:
    fam = family(cfg)
    if fam.stacked:
        return cfg["d_kv"]
    if fam.head_dim_key and cfg.get("head_dim"):
        return cfg["head_dim"]
    heads = cfg["n_head"] if fam.model_type == "gpt2" else cfg["num_attention_heads"]
    return _hidden(cfg, fam) // heads


def num_layers(cfg: dict) -> int:
    if hf_encdec.is_stacked(cfg):  # every stack's layers
        return sum(count for _, _, count in hf_encdec.stacks(cfg))
    return cfg["n_layer"] if cfg["model_type"] == "gpt2" else cfg["num_hidden_layers"]


def _flag(cfg: dict, rule) -> bool:
    return bool(cfg.get(rule)) if isinstance(rule, str) else rule


def _layer(cfg: dict, fam: Family) -> list[Module]:
    """One decoder (or encoder) layer's modules, paths relative to the layer."""
    h = _hidden(cfg, fam)
    block = fam.block
    if block == "gpt2":
        inner = cfg["n_inner"] if cfg["n_inner"] is not None else 4 * h
        return [
            Module("ln_1", "layernorm", (h,)),
            Module("attn.c_attn", "conv1d", (h, 3 * h, True)),
            Module("attn.c_proj", "conv1d", (h, h, True)),
            Module("ln_2", "layernorm", (h,)),
            Module("mlp.c_fc", "conv1d", (h, inner, True)),
            Module("mlp.c_proj", "conv1d", (inner, h, True)),
        ]
    if block == "bert":
        inner = cfg["intermediate_size"]
        size = cfg["num_attention_heads"] * (h // cfg["num_attention_heads"])
        return [
            Module("attention.self.query", "linear", (h, size, True)),
            Module("attention.self.key", "linear", (h, size, True)),
            Module("attention.self.value", "linear", (h, size, True)),
            Module("attention.output.dense", "linear", (h, h, True)),
            Module("attention.output.LayerNorm", "layernorm", (h,)),
            Module("intermediate.dense", "linear", (h, inner, True)),
            Module("output.dense", "linear", (inner, h, True)),
            Module("output.LayerNorm", "layernorm", (h,)),
        ]
    if block == "gpt_neox":
        inner = cfg["intermediate_size"]
        bias = _flag(cfg, fam.qkv_bias)
        return [
            Module("input_layernorm", "layernorm", (h,)),
            Module("post_attention_layernorm", "layernorm", (h,)),
            Module("attention.query_key_value", "linear", (h, 3 * h, bias)),
            Module("attention.dense", "linear", (h, h, _flag(cfg, fam.o_bias))),
            Module("mlp.dense_h_to_4h", "linear", (h, inner, True)),
            Module("mlp.dense_4h_to_h", "linear", (inner, h, True)),
        ]

    if block == "falcon":
        return _falcon_layer(cfg, h)

    if block == "llama4":
        return _llama4_layer(cfg, fam, layer_kinds(cfg)[0])
    # the Llama layout and its relatives: attention, MLP (or mixture of experts), two RMSNorms
    if block in MOE_LAYERS:
        return _moe_layer(cfg, fam, "moe")
    if block == "phimoe":
        return _phimoe_layer(cfg, fam)
    if block == "deepseek_v3":
        return _deepseek_layer(cfg, fam, "moe")
    if block == "gpt_oss":
        return _gpt_oss_layer(cfg, fam)
    heads, kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    inner = cfg["intermediate_size"]
    qkv_bias, o_bias = _flag(cfg, fam.qkv_bias), _flag(cfg, fam.o_bias)
    if block == "phi3":
        attention = [
            Module("self_attn.o_proj", "linear", (heads * d, h, False)),
            Module("self_attn.qkv_proj", "linear", (h, heads * d + 2 * kv * d, False)),
        ]
    else:
        attention = [
            Module("self_attn.q_proj", "linear", (h, heads * d, qkv_bias)),
            Module("self_attn.k_proj", "linear", (h, kv * d, qkv_bias)),
            Module("self_attn.v_proj", "linear", (h, kv * d, qkv_bias)),
            Module("self_attn.o_proj", "linear", (heads * d, h, o_bias)),
        ]
        if fam.qk_norm:
            q_width, k_width = (heads * d, kv * d) if fam.qk_norm_full else (d, d)
            attention += [Module("self_attn.q_norm", "rmsnorm", (q_width,)), Module("self_attn.k_norm", "rmsnorm", (k_width,))]
        elif fam.qk_norm_key and cfg.get(fam.qk_norm_key):   # Cohere's use_qk_norm: a weight per head and dim
            attention += [Module("self_attn.q_norm", "rmsnorm", (heads, d)), Module("self_attn.k_norm", "rmsnorm", (kv, d))]
    if block == "phi3":
        mlp = [
            Module("mlp.gate_up_proj", "linear", (h, 2 * inner, False)),
            Module("mlp.down_proj", "linear", (inner, h, False)),
        ]
    elif block == "mixtral":
        experts = cfg["num_local_experts"]
        # transformers 5.x: one router weight and the experts as two stacked tensors (grouped matmul)
        mlp = [
            Module("mlp.gate.weight", "param", (experts, h)),
            Module("mlp.experts.gate_up_proj", "param", (experts, 2 * inner, h)),
            Module("mlp.experts.down_proj", "param", (experts, h, inner)),
        ]
    elif fam.plain_mlp:   # Starcoder2: c_fc, activation, c_proj
        bias = _flag(cfg, fam.mlp_bias)
        mlp = [Module(fam.plain_mlp[0], "linear", (h, inner, bias)), Module(fam.plain_mlp[1], "linear", (inner, h, bias))]
    else:
        bias = _flag(cfg, fam.mlp_bias)
        mlp = [
            Module("mlp.gate_proj", "linear", (h, inner, bias)),
            Module("mlp.up_proj", "linear", (h, inner, bias)),
            Module("mlp.down_proj", "linear", (inner, h, bias)),
        ]
    norms = [Module(name, fam.norm_type, (h,)) for name in fam.layer_norms]
    return attention + mlp + norms


# --- mixtures of experts whose layers differ (issue 21) ----------------------------------------
MOE_LAYERS = ("qwen2_moe", "qwen3_moe")  # blocks whose layers are "moe" or "dense" by index (hf_activations.layer_kinds)




def layer_kinds(cfg: dict) -> list[str]:
    """Each layer's kind (hf_activations.layer_kinds: "moe" / "dense" where layers differ, else "")."""
    from memfit.models.hf_activations import layer_kinds as kinds  # on demand: only a transformer config needs it

    if cfg["model_type"] == "llama4_text":   # the parameters differ by the MLP only (rope / NoPE / chunked alike)
        return [kind.split(" ")[0] for kind in kinds(cfg)]
    return kinds(cfg)


def _block_name(kind: str, kinds: list) -> str:
    """A layer kind's block; layers all of one kind are "layer" (hf_activations.saved names them so: a DeepSeek-V3
    whose first_k_dense_replace covers every layer)."""
    from memfit.models.hf_activations import BLOCK_NAMES

    return BLOCK_NAMES[kind] if len(set(kinds)) > 1 else "layer"


def block_layers(cfg: dict) -> dict:
    """Block name -> the layer indices it covers ("layer", and "dense layer" where layers differ)."""
    out: dict = {}
    kinds = layer_kinds(cfg)
    for i, kind in enumerate(kinds):
        out.setdefault(_block_name(kind, kinds), []).append(i)
    return out


def _moe_layer(cfg: dict, fam: Family, kind: str) -> list[Module]:
    """Qwen2-MoE / Qwen3-MoE decoder layer: attention as Qwen2's (Qwen3's q/k norms), then the sparse block
    (router `gate`, experts as two stacked tensors; Qwen2-MoE's shared expert and its 1-wide gate) or a dense MLP."""
    h = _hidden(cfg, fam)
    heads, kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    qkv_bias, o_bias = _flag(cfg, fam.qkv_bias), _flag(cfg, fam.o_bias)
    attention = [
        Module("self_attn.q_proj", "linear", (h, heads * d, qkv_bias)),
        Module("self_attn.k_proj", "linear", (h, kv * d, qkv_bias)),
        Module("self_attn.v_proj", "linear", (h, kv * d, qkv_bias)),
        Module("self_attn.o_proj", "linear", (heads * d, h, o_bias)),
    ]
    if fam.qk_norm:
        attention += [Module("self_attn.q_norm", "rmsnorm", (d,)), Module("self_attn.k_norm", "rmsnorm", (d,))]
    if kind == "dense":
        inner = cfg["intermediate_size"]
        mlp = [
            Module("mlp.gate_proj", "linear", (h, inner, False)),
            Module("mlp.up_proj", "linear", (h, inner, False)),
            Module("mlp.down_proj", "linear", (inner, h, False)),
        ]
    else:
        experts, inner = cfg[EXPERTS_KEY[fam.model_type]], cfg["moe_intermediate_size"]
        router = [Module("mlp.gate.weight", "param", (experts, h))]
        stacked = [
            Module("mlp.experts.gate_up_proj", "param", (experts, 2 * inner, h)),
            Module("mlp.experts.down_proj", "param", (experts, h, inner)),
        ]
        if fam.block == "qwen3_moe":  # Qwen3MoeSparseMoeBlock registers the experts before the router
            mlp = stacked + router
        else:
            shared = cfg["shared_expert_intermediate_size"]
            mlp = router + stacked + [
                Module("mlp.shared_expert.gate_proj", "linear", (h, shared, False)),
                Module("mlp.shared_expert.up_proj", "linear", (h, shared, False)),
                Module("mlp.shared_expert.down_proj", "linear", (shared, h, False)),
                Module("mlp.shared_expert_gate", "linear", (h, 1, False)),
            ]
    norms = [Module("input_layernorm", "rmsnorm", (h,)), Module("post_attention_layernorm", "rmsnorm", (h,))]
    return attention + mlp + norms


def _deepseek_layer(cfg: dict, fam: Family, kind: str) -> list[Module]:
    """DeepseekV3DecoderLayer: multi-head latent attention (q_a_proj, q_a_layernorm, q_b_proj, or q_proj when
    q_lora_rank is null; kv_a_proj_with_mqa to kv_lora_rank + qk_rope_head_dim, kv_a_layernorm, kv_b_proj to every
    head's no-rope key and value; o_proj), then a dense MLP (layers below first_k_dense_replace) or the MoE block
    (experts as two stacked tensors, the router `gate` whose e_score_correction_bias is a buffer, the shared experts
    as one gated MLP n_shared_experts * moe_intermediate_size wide), two RMSNorms."""
    h = _hidden(cfg, fam)
    heads, bias = cfg["num_attention_heads"], _flag(cfg, fam.qkv_bias)
    nope, rope, dv, kvr = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    dqk, qr = nope + rope, cfg.get("q_lora_rank")
    if qr is None:
        attention = [Module("self_attn.q_proj", "linear", (h, heads * dqk, False))]
    else:
        attention = [Module("self_attn.q_a_proj", "linear", (h, qr, bias)), Module("self_attn.q_a_layernorm", "rmsnorm", (qr,)),
                     Module("self_attn.q_b_proj", "linear", (qr, heads * dqk, False))]
    attention += [
        Module("self_attn.kv_a_proj_with_mqa", "linear", (h, kvr + rope, bias)),
        Module("self_attn.kv_a_layernorm", "rmsnorm", (kvr,)),
        Module("self_attn.kv_b_proj", "linear", (kvr, heads * (nope + dv), False)),
        Module("self_attn.o_proj", "linear", (heads * dv, h, _flag(cfg, fam.o_bias))),
    ]
    if kind == "dense":
        inner, prefix = cfg["intermediate_size"], "mlp."
        mlp = []
    else:
        experts, ie = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
        inner, prefix = ie * cfg["n_shared_experts"], "mlp.shared_experts."
        mlp = [Module("mlp.experts.gate_up_proj", "param", (experts, 2 * ie, h)),
               Module("mlp.experts.down_proj", "param", (experts, h, ie)),
               Module("mlp.gate.weight", "param", (experts, h))]
    mlp += [Module(prefix + "gate_proj", "linear", (h, inner, False)), Module(prefix + "up_proj", "linear", (h, inner, False)),
            Module(prefix + "down_proj", "linear", (inner, h, False))]
    norms = [Module("input_layernorm", "rmsnorm", (h,)), Module("post_attention_layernorm", "rmsnorm", (h,))]
    return attention + mlp + norms


def _phimoe_layer(cfg: dict, fam: Family) -> list[Module]:
    """PhiMoE's decoder layer: biased attention (attention_bias), the router as an nn.Linear (`mlp.router`, no
    bias), the experts as two stacked tensors, two LayerNorms (weight and bias)."""
    h = _hidden(cfg, fam)
    heads, kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    bias = _flag(cfg, fam.qkv_bias)
    experts, inner = cfg["num_local_experts"], cfg["intermediate_size"]
    return [
        Module("self_attn.q_proj", "linear", (h, heads * d, bias)),
        Module("self_attn.k_proj", "linear", (h, kv * d, bias)),
        Module("self_attn.v_proj", "linear", (h, kv * d, bias)),
        Module("self_attn.o_proj", "linear", (heads * d, h, _flag(cfg, fam.o_bias))),
        Module("mlp.router", "linear", (h, experts, False)),
        Module("mlp.experts.gate_up_proj", "param", (experts, 2 * inner, h)),
        Module("mlp.experts.down_proj", "param", (experts, h, inner)),
        Module("input_layernorm", "layernorm", (h,)),
        Module("post_attention_layernorm", "layernorm", (h,)),
    ]


def _gpt_oss_layer(cfg: dict, fam: Family) -> list[Module]:
    """GptOssDecoderLayer (modeling_gpt_oss.py): the attention's own `sinks` (one logit per head, registered after its
    projections but listed first: named_parameters visits a module's parameters before its children), q/k/v/o with
    biases (attention_bias), the router's weight and bias (GptOssTopKRouter: bare parameters, F.linear), the experts'
    fused gate_up_proj (E, h, 2I) and down_proj (E, I, h) with their biases (transposed against Mixtral's), two RMSNorms."""
    h = _hidden(cfg, fam)
    heads, kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    bias = _flag(cfg, fam.qkv_bias)
    experts, inner = cfg["num_local_experts"], cfg["intermediate_size"]
    return [
        Module("self_attn.sinks", "param", (heads,)),
        Module("self_attn.q_proj", "linear", (h, heads * d, bias)),
        Module("self_attn.k_proj", "linear", (h, kv * d, bias)),
        Module("self_attn.v_proj", "linear", (h, kv * d, bias)),
        Module("self_attn.o_proj", "linear", (heads * d, h, _flag(cfg, fam.o_bias))),
        Module("mlp.router.weight", "param", (experts, h)),
        Module("mlp.router.bias", "param", (experts,)),
        Module("mlp.experts.gate_up_proj", "param", (experts, h, 2 * inner)),
        Module("mlp.experts.gate_up_proj_bias", "param", (experts, 2 * inner)),
        Module("mlp.experts.down_proj", "param", (experts, inner, h)),
        Module("mlp.experts.down_proj_bias", "param", (experts, h)),
        Module("input_layernorm", "rmsnorm", (h,)),
        Module("post_attention_layernorm", "rmsnorm", (h,)),
    ]


def _llama4_layer(cfg: dict, fam: Family, kind: str) -> list[Module]:
    """Llama4TextDecoderLayer: self_attn (q/k/v/o; the L2 qk_norm has no weight), feed_forward (a MoE layer:
    experts.gate_up_proj (E, h, 2·ie) and experts.down_proj (E, ie, h), the router (an nn.Linear, no bias), the
    shared expert (a gated MLP of intermediate_size); a dense layer: a gated MLP of intermediate_size_mlp), then
    input_layernorm and post_attention_layernorm."""
    h = _hidden(cfg, fam)
    heads, kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    bias = _flag(cfg, fam.qkv_bias)
    attention = [
        Module("self_attn.q_proj", "linear", (h, heads * d, bias)),
        Module("self_attn.k_proj", "linear", (h, kv * d, bias)),
        Module("self_attn.v_proj", "linear", (h, kv * d, bias)),
        Module("self_attn.o_proj", "linear", (heads * d, h, bias)),
    ]
    if kind.startswith("moe"):
        experts, inner = cfg["num_local_experts"], cfg["intermediate_size"]
        mlp = [
            Module("feed_forward.experts.gate_up_proj", "param", (experts, h, 2 * inner)),
            Module("feed_forward.experts.down_proj", "param", (experts, inner, h)),
            Module("feed_forward.router", "linear", (h, experts, False)),
            Module("feed_forward.shared_expert.gate_proj", "linear", (h, inner, False)),
            Module("feed_forward.shared_expert.up_proj", "linear", (h, inner, False)),
            Module("feed_forward.shared_expert.down_proj", "linear", (inner, h, False)),
        ]
    else:
        inner = cfg["intermediate_size_mlp"]
        mlp = [
            Module("feed_forward.gate_proj", "linear", (h, inner, False)),
            Module("feed_forward.up_proj", "linear", (h, inner, False)),
            Module("feed_forward.down_proj", "linear", (inner, h, False)),
        ]
    return attention + mlp + [Module("input_layernorm", "rmsnorm", (h,)), Module("post_attention_layernorm", "rmsnorm", (h,))]


def _templates(cfg: dict) -> dict:
    """Layer kind -> that kind's modules (one entry, "", where every layer is alike)."""
    fam = family(cfg)
    kinds = layer_kinds(cfg)
    if fam.block == "deepseek_v3":
        return {kind: _deepseek_layer(cfg, fam, kind) for kind in dict.fromkeys(kinds)}
    if fam.block == "llama4":
        return {kind: _llama4_layer(cfg, fam, kind) for kind in dict.fromkeys(kinds)}
    if fam.block not in MOE_LAYERS:
        return {"": _layer(cfg, fam)}
    return {kind: _moe_layer(cfg, fam, kind) for kind in dict.fromkeys(kinds)}


def _falcon_layer(cfg: dict, h: int) -> list[Module]:
    """FalconDecoderLayer: self_attention (query_key_value, dense), mlp, then the norms its __init__ registers."""
    heads = cfg["num_attention_heads"]
    d, bias, ffn = h // heads, bool(cfg.get("bias")), cfg["ffn_hidden_size"]
    modules = [
        Module("self_attention.query_key_value", "linear", (h, (heads + 2 * falcon_kv_heads(cfg)) * d, bias)),
        Module("self_attention.dense", "linear", (h, h, bias)),
        Module("mlp.dense_h_to_4h", "linear", (h, ffn, bias)),
        Module("mlp.dense_4h_to_h", "linear", (ffn, h, bias)),
    ]
    lns = cfg.get("num_ln_in_parallel_attn")
    if not cfg.get("parallel_attn"):
        names = ("post_attention_layernorm", "input_layernorm")
    elif (2 if lns is None and cfg.get("new_decoder_architecture") else lns) == 2:
        names = ("ln_attn", "ln_mlp")
    else:
        names = ("input_layernorm",)
    return modules + [Module(name, "layernorm", (h,)) for name in names]


def _base(cfg: dict, fam: Family, with_pooler: bool) -> tuple[list[Module], str, list[Module]]:
    """(modules before the layers, the layer list's path, modules after the layers), relative to the base model."""
    h, vocab = _hidden(cfg, fam), cfg["vocab_size"]
    if fam.block == "gpt2":
        return [Module("wte", "embedding", (vocab, h)), Module("wpe", "embedding", (cfg["n_positions"], h))], "h", [
            Module("ln_f", "layernorm", (h,))
        ]
    if fam.block == "bert" and fam.encoder_head == "roberta":   # RobertaEmbeddings registers position_embeddings last
        before = [
            Module("embeddings.word_embeddings", "embedding", (vocab, h)),
            Module("embeddings.token_type_embeddings", "embedding", (cfg["type_vocab_size"], h)),
            Module("embeddings.LayerNorm", "layernorm", (h,)),
            Module("embeddings.position_embeddings", "embedding", (cfg["max_position_embeddings"], h)),
        ]
        return before, "encoder.layer", []
    if fam.block == "bert":
        before = [
            Module("embeddings.word_embeddings", "embedding", (vocab, h)),
            Module("embeddings.position_embeddings", "embedding", (cfg["max_position_embeddings"], h)),
            Module("embeddings.token_type_embeddings", "embedding", (cfg["type_vocab_size"], h)),
            Module("embeddings.LayerNorm", "layernorm", (h,)),
        ]
        after = [Module("pooler.dense", "linear", (h, h, True))] if with_pooler else []
        return before, "encoder.layer", after
    if fam.block == "gpt_neox":
        return [Module("embed_in", "embedding", (vocab, h))], "layers", [Module("final_layer_norm", "layernorm", (h,))]
    if fam.block == "falcon":
        return [Module("word_embeddings", "embedding", (vocab, h))], "h", [Module("ln_f", "layernorm", (h,))]
    if fam.block == "llava":   # LlavaModel: vision_tower, multi_modal_projector, language_model (a Llama)
        before = _llava_vision(cfg) + [Module("language_model.embed_tokens", "embedding", (vocab, h))]
        return before, "language_model.layers", [Module("language_model.norm", "rmsnorm", (h,))]
    if fam.block in QWEN_VL_BLOCKS:   # Qwen2VLModel: visual (the vision tower and merger), language_model (a Qwen2)
        from memfit.models.qwen_vl import vision_modules

        before = [Module(*m) for m in vision_modules(cfg)] + [Module("language_model.embed_tokens", "embedding", (vocab, h))]
        return before, "language_model.layers", [Module("language_model.norm", "rmsnorm", (h,))]
    norm = "layernorm" if fam.block == "phimoe" else fam.norm_type
    return [Module("embed_tokens", "embedding", (vocab, h))], "layers", [Module("norm", norm, (h,))]


def _llava_vision(cfg: dict) -> list[Module]:
    """CLIPVisionModel's modules (as LlavaModel builds it: AutoModel of clip_vision_model), then the projector."""
    z = llava_vision_sizes(cfg)
    hv, h, bias = z["hv"], cfg["hidden_size"], bool(cfg["llava"]["multimodal_projector_bias"])
    out = [
        Module("vision_tower.embeddings.class_embedding", "param", (hv,)),
        Module("vision_tower.embeddings.patch_embedding.weight", "param", (hv, z["C"], z["patch"], z["patch"])),
        Module("vision_tower.embeddings.position_embedding", "embedding", (z["P"] + 1, hv)),
        Module("vision_tower.pre_layrnorm", "layernorm", (hv,)),
    ]
    for i in range(z["layers"]):
        at = f"vision_tower.encoder.layers.{i}."
        out += [Module(at + "self_attn." + name, "linear", (hv, hv, True)) for name in ("k_proj", "v_proj", "q_proj", "out_proj")]
        out += [Module(at + "layer_norm1", "layernorm", (hv,)), Module(at + "mlp.fc1", "linear", (hv, z["iv"], True)),
                Module(at + "mlp.fc2", "linear", (z["iv"], hv, True)), Module(at + "layer_norm2", "layernorm", (hv,))]
    return out + [
        Module("vision_tower.post_layernorm", "layernorm", (hv,)),
        Module("multi_modal_projector.linear_1", "linear", (hv * z["features"], h, bias)),
        Module("multi_modal_projector.linear_2", "linear", (h, h, bias)),
    ]


def _tree(cfg: dict) -> tuple[list[Module], str, list[Module], list[Module], set]:
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
    before, _, _, _, tied = _tree(cfg)
    # the word embedding: the embedding over the vocabulary (LLaVA's vision tower comes first with embeddings of its own)
    words = next((m for m in before if m.type == "embedding" and m.dims[0] == cfg["vocab_size"]), None)
    return words.path + ".weight" if tied and words is not None else None


def layer_parameters(cfg: dict) -> list[Param]:
    """The first layer's parameters, names relative to the layer (every layer is alike but where
    layer_kinds says they differ)."""
    return [p for m in _tree(cfg)[2] for p in _params(m, m.path)]


def parameters(cfg: dict) -> list[Param]:
    """named_parameters() of the transformers class for this config, in order, tied weights once."""
    if cfg.get("model_type") == "whisper":  # models/hf_encdec.whisper_modules (proj_out tied: left out)
        return [p for m in hf_encdec.whisper_modules(cfg) for p in _params(m, m.path)]
    if hf_encdec.is_stacked(cfg):
        return _stacked_parameters(cfg)
    before, layers, layer, after, tied = _tree(cfg)
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
    before, _, layer, after, tied = _tree(cfg)

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
    before, layers, layer, after, _ = _tree(cfg)
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
    before, layers, layer, after, tied = _tree(cfg)
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
    return _tree(cfg)[1] + "."


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
        return hints + tails[fam.block](cfg, raw, out, where, file, data, at_architecture)
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
    vision = _vision_training(cfg, training, seq_len, data.get("lora"))
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
    return hints + _tensors(cfg, out, where, file, micro_batch, seq_len, attention, checkpointing, data)


def _vision_training(cfg: dict, training: dict, seq_len: int, lora=None) -> list:
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
    if not block == "llava":
        return [Problem(("training", key), codes.SCHEMA, f"training.{key} is for a vision-language model (llava, qwen2_vl, "
                        f"qwen2_5_vl); {cfg['model_type']} takes no images", on_key=True) for key in keys]
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
    if isinstance(quantization, dict) and quantization.get("method") in ("nf4", "fp4") and "precision" not in out:
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
    adapted = "lora" in data or "quantization" in data
    if adapted:
        # peft's LoRA and bitsandbytes' storage: every parameter by its peft name (recipes, issue 12)
        from memfit.recipe import adapters
        from memfit.recipe.dtypes import DTYPES

        if adapters.problems(data):
            return []  # reported by check already; no footprint is shown
        base = out.widths["parameters"].name
        base = base if base in DTYPES else "float32"
        param_rows, problems = adapters.transformer_rows(cfg, data, base, parameters(cfg), linear_modules(cfg), head(cfg))
        if problems:
            return problems
        if isinstance(data.get("lora"), dict):  # the adapters' dtype (recipe.lora.adapter_dtype) for what autograd keeps
            from memfit.recipe.lora import adapter_dtype

            dtypes = {**(dtypes or {}), "adapter": adapter_dtype(data["lora"], base, data.get("quantization"))}
            if isinstance(data.get("quantization"), dict) and data["quantization"].get("method") in ("nf4", "fp4"):
                # bitsandbytes' 4-bit linears are not autocast ops: what they keep and the dtype of their outputs
                # differ from a dense base's under *-mixed (hf_activations._quantized_base)
                dtypes["quantized"] = "4bit"
            if data["lora"].get("use_dora") is True and isinstance(data.get("quantization"), dict):
                # DoRA dequantizes a quantized base weight in every forward (peft dequantize_module_weight): the
                # dtype it comes out in is the 4-bit layer's (the adapters' dtype on the base layer, without autocast)
                dtypes["dequantized"] = adapter_dtype({"dtype": "model"}, base, data["quantization"])
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


def routing_lines(model: Model) -> list[str]:
    """A mixture of experts' routing assumption, as explain states it (training.moe changes it)."""
    from memfit.models.hf_activations import routed_rows

    fam = family(model.cfg)
    if fam.block == "llama4":
        tokens = model.training["micro_batch"] * model.training["seq_len"]
        experts = model.cfg["num_local_experts"]
        return [f"       routed rows per MoE layer: {experts * tokens:,} (every token through each of {experts} experts)",
                f"         Llama4TextMoe scales each copy by its sigmoid router score (0 off the top-{model.cfg['num_experts_per_tok']})"]
    if fam.model_type not in EXPERTS_KEY:
        return []
    moe = (model.recipe or {}).get("moe") or {}
    experts, k = model.cfg[EXPERTS_KEY[fam.model_type]], model.cfg["num_experts_per_tok"]
    tokens = model.training["micro_batch"] * model.training["seq_len"]
    rows = routed_rows(tokens, k, experts, moe)
    if moe.get("capacity_factor") is not None:
        how = f"capacity factor {moe['capacity_factor']}: {rows // experts:,} rows per expert, padded or cut"
    elif moe.get("routing") == "worst_case":
        how = f"worst case: the expert group's tokens all send their {k} choices here"
    else:
        how = f"uniform routing assumed: {tokens * k / experts:,.1f} rows per expert, dropless"
    return [f"       routed rows per MoE layer: {rows:,} (training.moe changes it)", f"         {how}"]


def attention_lines(model: Model) -> list[str]:
    """What `attention: sdpa` runs where transformers refuses sdpa (`_supports_sdpa = False`: Gemma 2's soft-capping,
    gpt-oss's attention sinks): from_pretrained without attn_implementation runs eager, and memfit prices that."""
    from memfit.models.hf_activations import FAMILIES as ROWS

    fam = ROWS.get(family(model.cfg).model_type)
    if model.training.get("attention", "sdpa") != "sdpa" or fam is None or fam.sdpa:
        return []
    return ["       attention: sdpa priced as eager, what transformers runs by default",
            f"         ({architecture(model.cfg)} refuses sdpa: {'attention sinks' if fam.sinks else 'soft-capping'})"]


def summary_lines(model: Model, width: int = 80, parameter_dtype: str | None = None) -> list[str]:
    """explain's transformer section: the class, then one row per block (embeddings, one layer x N,
    head, loss) with its parameters and the bytes it keeps for backward, then what each keeps."""
    from memfit.report.present import cut, shape_text
    from memfit.diagnostics.units import human

    head_text, _, rest = model.summary.partition("; ")
    out = [cut(f"model  {head_text}", width)]
    if rest:
        out.append(cut(f"       {rest}", width))
    if model.file is not None:
        out.append(cut(f"       from {model.file}", width))
    given = model.cfg.get("dtype")
    if parameter_dtype is not None and given and given != parameter_dtype:
        out.append(cut(f"       config.json says dtype {given}; training uses dtypes.parameters {parameter_dtype}", width))
    out += [cut(line, width) for line in routing_lines(model) + attention_lines(model)]
    out.append("")
    out.append(f"{'block':<18} {'count':>6} {'params (each)':>16} {'saved (each)':>14} {'saved (all)':>14}")
    out.append("=" * min(width, 72))
    for row in model.blocks:
        out.append(f"{cut(row.name, 18):<18} {row.count:>6,} {row.params:>16,} {human(row.saved_bytes):>14} {human(row.saved_bytes * row.count):>14}")
    out.append("-" * min(width, 72))
    out.append(f"activations, each kept storage once: {human(model.activations)}")
    out.append("")
    out.append("kept for backward, per block (what autograd saves in one training step):")
    for row in model.blocks:
        if not row.kept:
            continue
        out.append(cut(f"  {row.name}{' (x' + format(row.count, ',') + ')' if row.count > 1 else ''}:", width))
        for label, shape, dtype in row.kept:
            out.append(cut(f"    {shape_text(shape) + ' ' + dtype:<26} {label}", width))
    return out


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

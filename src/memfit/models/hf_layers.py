"""A transformers model's module tree, layer by layer (models/hf.py tells the whole story): the parameter kinds,
`Param` and `Module`, the family's sizes (hidden size, head size, layer count), one layer's modules per family (the
mixtures of experts', DeepSeek's, PhiMoE's, gpt-oss's, Llama 4's, Falcon's), the embeddings and head (`base`), and
LLaVA's vision tower."""

from __future__ import annotations

from typing import NamedTuple

from memfit.models import hf_encdec
from memfit.models.falcon import falcon_kv_heads
from memfit.models.families import EXPERTS_KEY, FAMILIES, Family, QWEN_VL_BLOCKS
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
    if fam.block == "mllama":   # the cross-attention layers' own modules (models/mllama.py)
        from memfit.models.mllama import cross_layer_modules

        return {"": _layer(cfg, fam), "cross": [Module(*m) for m in cross_layer_modules(cfg)]}
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
    if fam.block == "mllama":   # MllamaModel: vision_model, language_model (embeddings over vocab + 8), multi_modal_projector
        from memfit.models.mllama import vision_modules, vision_sizes

        before = [Module(*m) for m in vision_modules(cfg)] + [Module("language_model.embed_tokens", "embedding", (vocab + 8, h))]
        after = [Module("language_model.norm", "rmsnorm", (h,)),
                 Module("multi_modal_projector", "linear", (vision_sizes(cfg)["out"], h, True))]
        return before, "language_model.layers", after
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

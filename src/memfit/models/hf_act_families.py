"""Each transformers family's activation rules (models/hf_activations.py): `FAMILIES`, model_type -> `ActivationRules`
(its norm, module names, attention and MLP layouts; each key a models/families `Family`'s), the mixture-of-experts
kinds and default activations."""

from __future__ import annotations

from memfit.models import hf_encdec
from memfit.models.hf_act_ops import ActivationRules


LLAMA_NAMES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
               "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj", "lm_head": "lm_head"}
LLAMA = ActivationRules("rms", LLAMA_NAMES, "separate", "full", "gated", "hidden_act", True,
               dropout_keys=(("attn", "attention_dropout"),))
FAMILIES = {
    "llama": LLAMA,
    # Mistral and Mixtral attend through sliding_window in every layer when it is set (modeling_mistral.py:
    # create_sliding_window_causal_mask), Qwen2 and Qwen3 in their layer_types' sliding layers (use_sliding_window):
    # a window shorter than the sequence is a mask sdpa must take, as Starcoder2's (tests/ledger/test_peak_transformers
    # .py test_a_sliding_window_shorter_than_the_sequence_matches_memtracker: 0.947 -> 1.000 of MemTracker). So do
    # Qwen2-MoE (its layer_types), Qwen3-MoE, Phi-3 and PhiMoE (every layer once sliding_window is set) and SmolLM3
    # (its sliding layers, use_sliding_window): 2 x 64, window 24 or 64, 0.923-0.969 -> 0.999-1.003 of MemTracker
    "mistral": LLAMA._replace(window_layers=True),
    "qwen2": LLAMA._replace(window_layers=True),
    "qwen3": LLAMA._replace(qk_norm=True, window_layers=True),
    "gemma": LLAMA._replace(norm="gemma_rms"),
    "mixtral": LLAMA._replace(mlp="moe", window_layers=True),
    "phi3": LLAMA._replace(qkv="fused", rope="partial", mlp="gated_fused", lora_default=(),
                           names={"qkv": "self_attn.qkv_proj", "o": "self_attn.o_proj", "gate_up": "mlp.gate_up_proj",
                                  "down": "mlp.down_proj", "lm_head": "lm_head"},
                           dropout_keys=(("attn", "attention_dropout"), ("resid", "resid_pdrop"), ("embd", "embd_pdrop")),
                           window_layers=True),
    "gpt2": ActivationRules("layer", {"qkv": "attn.c_attn", "o": "attn.c_proj", "fc_in": "mlp.c_fc", "fc_out": "mlp.c_proj",
                             "lm_head": "lm_head", "norm1": "ln_1", "norm2": "ln_2", "final": "transformer.ln_f"},
                   "fused", None, "plain", "activation_function", True, embed_extra=("positions",),
                   dropout_keys=(("embd", "embd_pdrop"), ("attn", "attn_pdrop"), ("resid", "resid_pdrop")),
                   softmax_fp32=False, lora_default=("c_attn",)),
    "gpt_neox": ActivationRules("layer", {"qkv": "attention.query_key_value", "o": "attention.dense",
                                 "fc_in": "mlp.dense_h_to_4h", "fc_out": "mlp.dense_4h_to_h", "lm_head": "embed_out",
                                 "final": "gpt_neox.final_layer_norm"},
                       "fused", "partial", "plain", "hidden_act", True, parallel_key="use_parallel_residual",
                       dropout_keys=(("attn", "attention_dropout"), ("resid", "hidden_dropout"), ("embd", "hidden_dropout")),
                       lora_default=("query_key_value",)),
    "bert": ActivationRules("layer", {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
                             "o": "attention.output.dense", "fc_in": "intermediate.dense", "fc_out": "output.dense",
                             "transform": "cls.predictions.transform.dense", "lm_head": "cls.predictions.decoder"},
                   "separate", None, "plain", "hidden_act", False, embed_extra=("token_types",), post_norm=True,
                   head="mlm", softmax_fp32=False, softmax_role="softmax:lin", lora_default=("query", "value"),
                   dropout_keys=(("attn", "attention_probs_dropout_prob"), ("resid", "hidden_dropout_prob"),
                                 ("embd", "hidden_dropout_prob"))),
    # modeling_roberta.py: BERT's layer; position ids counted from the padding token per sequence and the token
    # types gathered by them, so both are (b, s) int64 the embeddings keep; the masked-LM head is BERT's (lm_head
    # .dense, gelu, lm_head.layer_norm, the decoder); the sequence classifier drops out the first token, then
    # classifier.dense, tanh, dropout, classifier.out_proj (no pooler)
    "roberta": ActivationRules("layer", {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
                                "o": "attention.output.dense", "fc_in": "intermediate.dense", "fc_out": "output.dense",
                                "transform": "lm_head.dense", "lm_head": "lm_head.decoder"},
                      "separate", None, "plain", "hidden_act", False, embed_extra=("batch_positions",), post_norm=True,
                      head="mlm", softmax_fp32=False, softmax_role="softmax:lin", lora_default=("query", "value"),
                      dropout_keys=(("attn", "attention_probs_dropout_prob"), ("resid", "hidden_dropout_prob"),
                                    ("embd", "hidden_dropout_prob"))),
    # encoder-decoder families: their rows are in models/hf_encdec.py; this entry names their modules (LoRA flags,
    # the ledger's layer parts) and their dropout key
    "t5": ActivationRules("rms", dict(hf_encdec.NAMES), "separate", None, "plain", "dense_act_fn", False,
                 dropout_keys=(("attn", "dropout_rate"), ("resid", "dropout_rate"), ("embd", "dropout_rate")),
                 head="seq2seq", softmax_fp32=False, lora_default=("q", "v")),
}
# issue 21: the dense decoders
FAMILIES.update({
    # modeling_gemma2.py: four RMSNorms (1 + weight) per layer, the attention and final logits soft-capped
    # (tanh(x / cap) * cap keeps the tanh's result), no sdpa (Gemma2PreTrainedModel._supports_sdpa = False)
    "gemma2": LLAMA._replace(norm="gemma_rms", act_key="hidden_activation", sandwich="pre_post", sdpa=False),
    # modeling_olmo2.py: no norm before attention or MLP, one after each (on the sublayer's output); q_norm / k_norm
    # over the whole projections; RMSNorm multiplies by the weight in fp32 before casting back
    "olmo2": LLAMA._replace(norm="olmo_rms", sandwich="post", qk_norm=True, qk_norm_full=True),
    # modeling_granite.py: Llama with four scalar multipliers (embeddings, residual branches, attention scale, logits);
    # a product or quotient by a Python number keeps nothing, so what autograd keeps is Llama's
    "granite": LLAMA,
    # modeling_cohere.py: CohereLayerNorm (no bias, written out in fp32), one per layer; attention and MLP in
    # parallel on its output; logits * logit_scale keeps nothing; use_qk_norm adds per-head LayerNorms on q and k
    # modeling_starcoder2.py: Llama's attention with biases, nn.LayerNorm, a plain c_fc / act / c_proj MLP, residual
    # and embedding dropouts; every layer attends through sliding_window when it is set
    "starcoder2": LLAMA._replace(norm="layer", mlp="plain", window_layers=True,
                                 names={**LLAMA_NAMES, "fc_in": "mlp.c_fc", "fc_out": "mlp.c_proj"},
                                 dropout_keys=(("attn", "attention_dropout"), ("resid", "residual_dropout"),
                                               ("embd", "embedding_dropout"))),
    # modeling_smollm3.py: Llama; every no_rope_layer_interval-th layer skips the rotary (NoPE). q and k then stay
    # views of the projections, which the fused kernel keeps in place of the rotated copies: the same bytes
    "smollm3": LLAMA._replace(window_layers=True),
    "cohere": LLAMA._replace(norm="cohere_ln", shared_input=True, qk_norm_key="use_qk_norm", rope_fp32=True),
    # modeling_gemma3.py: Gemma 2's layer (no soft-capping by default, so sdpa runs) with per-head q_norm / k_norm;
    # one rotary embedding per layer type present (global and sliding layers rotate with different bases)
    "gemma3_text": LLAMA._replace(norm="gemma_rms", act_key="hidden_activation", sandwich="pre_post", qk_norm=True,
                                  window_layers=True),
    # modeling_falcon.py: fused query_key_value, FalconLinear (x @ W.T, + bias), nn.LayerNorm, a plain MLP; the layer
    # layout follows parallel_attn / new_decoder_architecture / num_ln_in_parallel_attn (models/falcon.py); rotary or
    # ALiBi; its own attention code (_falcon_attention)
    # modeling_llava.py: the text model is a Llama (LlavaModel.language_model); the vision tower (CLIP) and the
    # projector run first and are kept with the embeddings (_llava_kept)
    "llava": LLAMA._replace(llava=True, lora_default=()),   # (peft has no default target_modules for llava)
    "falcon": ActivationRules("layer", {"qkv": "self_attention.query_key_value", "o": "self_attention.dense",
                               "fc_in": "mlp.dense_h_to_4h", "fc_out": "mlp.dense_4h_to_h", "lm_head": "lm_head",
                               "final": "transformer.ln_f"},
                     "fused", "full", "plain", "activation", True, parallel_key="parallel_attn",
                     dropout_keys=(("attn", "attention_dropout"), ("resid", "hidden_dropout")),
                     softmax_fp32=False, lora_default=("query_key_value",), falcon=True),
})
# --- mixtures of experts (issue 21) ---------------------------------------------------------------------------
# Qwen2-MoE / Qwen3-MoE (modeling_qwen2_moe.py, modeling_qwen3_moe.py): Mixtral's router and grouped experts, but
# the top-k weights are renormalized only with norm_topk_prob and cast back to the router logits' dtype; Qwen2-MoE
# adds a shared expert (a gated MLP over every token) scaled by sigmoid(shared_expert_gate(x)). Dense layers
# (mlp_only_layers, decoder_sparse_step) are Llama's gated MLP.
QWEN2_MOE_NAMES = {**LLAMA_NAMES, "sgate": "mlp.shared_expert.gate_proj", "sup": "mlp.shared_expert.up_proj",
                   "sdown": "mlp.shared_expert.down_proj", "sg": "mlp.shared_expert_gate"}
FAMILIES.update({
    # peft 0.21 maps the fused experts for the model types transformers converts from v4 (mixtral, qwen3_moe...), not
    # for qwen2_moe itself: its all-linear adapts the attention and the shared expert only
    "qwen2_moe": LLAMA._replace(mlp="moe_shared", names=QWEN2_MOE_NAMES, lora_default=(), routing_dtype="lin",
                                lora_experts=False, window_layers=True),
    "qwen3_moe": LLAMA._replace(mlp="moe", qk_norm=True, lora_default=(), routing_dtype="lin", window_layers=True),
})
# PhiMoE (modeling_phimoe.py): LayerNorms, the router an nn.Linear, sparsemixer's top-2 routing (two masked softmaxes,
# Gumbel sampling, PhimoeMultiplier), then the grouped experts; peft 0.21 maps no fused experts for phimoe
FAMILIES["phimoe"] = LLAMA._replace(norm="layer", mlp="moe_phi", names={**LLAMA_NAMES, "router": "mlp.router"},
                                    lora_default=(), routing_dtype="lin", lora_experts=False, window_layers=True)
# DeepSeek-V3 (modeling_deepseek_v3.py): multi-head latent attention (_mla_attention), Llama's dense MLP in the first
# first_k_dense_replace layers, then a sigmoid router with group-limited top-k over n_routed_experts grouped experts
# (the routing weights stay fp32: the router computes in fp32) beside the shared experts (one gated MLP over every
# token); peft 0.21 has no default targets for deepseek_v3 and converts its MoE targets as qwen2_moe's (recipe/lora.py)
DEEPSEEK_NAMES = {"q": "self_attn.q_proj", "qa": "self_attn.q_a_proj", "qb": "self_attn.q_b_proj",
                  "kva": "self_attn.kv_a_proj_with_mqa", "kvb": "self_attn.kv_b_proj", "o": "self_attn.o_proj",
                  "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj",
                  "sgate": "mlp.shared_experts.gate_proj", "sup": "mlp.shared_experts.up_proj",
                  "sdown": "mlp.shared_experts.down_proj", "router": "mlp.gate", "lm_head": "lm_head"}
FAMILIES["deepseek_v3"] = LLAMA._replace(mlp="moe_deepseek", names=DEEPSEEK_NAMES, mla=True, lora_default=())
# gpt-oss (modeling_gpt_oss.py): Llama's attention with biases and sinks (eager only: GptOssPreTrainedModel
# ._supports_sdpa = False, so `attention: sdpa` is the eager run transformers makes by default), GptOssRMSNorm multiplies
# by its weight in fp32 before casting back (OLMo 2's), a biased router (F.linear), top-k then a softmax over the k
# logits, and the grouped experts (integrations/moe.py grouped_mm_experts_forward, the default experts_implementation)
# with biases gathered per routed row and the clamped SwiGLU (_apply_gate); peft 0.21 has no default targets and no
# MoE conversion for gpt_oss: its all-linear adapts q/k/v/o only (the router and experts are not nn.Linear)
FAMILIES["gpt_oss"] = LLAMA._replace(norm="olmo_rms", mlp="moe_oss", sdpa=False, sinks=True, rope_half=True,
                                     lora_default=(), routing_dtype="lin", lora_experts=False)
# Llama 4 text (modeling_llama4.py): Llama's attention, rotated by a complex multiply (freqs_cis) on the rope layers,
# which L2-normalize q and k (use_qk_norm); NoPE layers scale q by attn_scales (attn_temperature_tuning); eager's
# softmax is not upcast; the rope layers attend in chunks (a mask under sdpa once the sequence is longer than a
# chunk). A MoE layer runs every token through every expert, each copy scaled by its sigmoid router score (zero off
# the top-k), plus the shared expert; dense layers run a gated MLP of intermediate_size_mlp
LLAMA4_NAMES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
                "gate": "feed_forward.gate_proj", "up": "feed_forward.up_proj", "down": "feed_forward.down_proj",
                "router": "feed_forward.router", "sgate": "feed_forward.shared_expert.gate_proj",
                "sup": "feed_forward.shared_expert.up_proj", "sdown": "feed_forward.shared_expert.down_proj",
                "lm_head": "lm_head"}
FAMILIES["llama4_text"] = LLAMA._replace(mlp="moe_llama4", names=LLAMA4_NAMES, softmax_fp32=False, lora_default=(),
                                         lora_experts=False)
# Qwen2-VL and Qwen2.5-VL (issue 34; modeling_qwen2_vl.py, modeling_qwen2_5_vl.py): the text model is Qwen2's layer,
# its sliding layers (use_sliding_window) Qwen2's too (tests/models/test_qwen_vl.py: 0.973 -> 0.997 of MemTracker);
# peft 0.21 has no default target_modules for either
FAMILIES["qwen2_vl"] = LLAMA._replace(qwen_vl=True, lora_default=(), window_layers=True)
FAMILIES["qwen2_5_vl"] = LLAMA._replace(qwen_vl=True, lora_default=(), window_layers=True)
# Llama 3.2 Vision (modeling_mllama.py): the text model's self-attention layers are Llama's; its cross-attention layers
# (kind "cross") and the vision tower are models/mllama.py's and hf_act_layers._cross_rows' (peft has no default targets)
FAMILIES["mllama"] = LLAMA._replace(mllama=True, lora_default=())
MOE = ("moe", "moe_shared", "moe_phi", "moe_deepseek", "moe_oss", "moe_llama4")
SUPPORTED = tuple(FAMILIES)
DEFAULT_ACT = {"gpt2": "gelu_new", "bert": "gelu", "gpt_neox": "gelu", "gemma": "gelu_pytorch_tanh",
               "gemma2": "gelu_pytorch_tanh", "gemma3_text": "gelu_pytorch_tanh", "falcon": "gelu"}

"""The tiny transformers configs each family's parameter test builds (one or two per family, plus one more head
where it is cheap), and how a test builds one on the meta device: shared by tests/models and tests/recipe, so kept
here rather than in a test module (a folder's tests then run alone)."""

from __future__ import annotations

import warnings

TINY = {"vocab_size": 96, "hidden_size": 64, "intermediate_size": 80, "num_hidden_layers": 2, "num_attention_heads": 4}
CONFIGS = {
    "llama": [
        {**TINY, "num_key_value_heads": 2},
        {**TINY, "num_key_value_heads": 1, "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True, "head_dim": 32},
    ],
    "mistral": [{**TINY, "num_key_value_heads": 2}, {**TINY, "num_key_value_heads": 4, "head_dim": 8, "tie_word_embeddings": True}],
    "qwen2": [{**TINY, "num_key_value_heads": 2}, {**TINY, "num_key_value_heads": 2, "tie_word_embeddings": True, "head_dim": 24}],
    "qwen3": [{**TINY, "num_key_value_heads": 2, "head_dim": 16}, {**TINY, "num_key_value_heads": 2, "head_dim": 8, "attention_bias": True}],
    "gemma": [{**TINY, "num_key_value_heads": 1, "head_dim": 16}, {**TINY, "num_key_value_heads": 2, "head_dim": 32, "tie_word_embeddings": False}],
    "phi3": [
        {**TINY, "num_key_value_heads": 2, "pad_token_id": 0, "eos_token_id": 1},
        {**TINY, "pad_token_id": 95, "eos_token_id": 1, "tie_word_embeddings": True},
    ],
    "gpt2": [
        {"vocab_size": 96, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 48, "bos_token_id": 0, "eos_token_id": 0},
        {"vocab_size": 96, "n_embd": 64, "n_layer": 3, "n_head": 2, "n_inner": 40, "n_positions": 32, "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 0},
    ],
    "bert": [
        {**TINY, "max_position_embeddings": 40},
        {**TINY, "max_position_embeddings": 40, "type_vocab_size": 1, "tie_word_embeddings": False},
    ],
    "gpt_neox": [
        {**TINY, "max_position_embeddings": 40, "bos_token_id": 0, "eos_token_id": 0},
        {**TINY, "max_position_embeddings": 40, "attention_bias": False, "tie_word_embeddings": True, "use_parallel_residual": False, "bos_token_id": 0, "eos_token_id": 0},
    ],
    "mixtral": [
        {**TINY, "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2},
        {**TINY, "num_key_value_heads": 4, "num_local_experts": 3, "num_experts_per_tok": 1, "head_dim": 8, "tie_word_embeddings": True},
    ],
    # issue 21's dense decoders
    "gemma2": [
        {**TINY, "num_key_value_heads": 2, "head_dim": 16},
        {**TINY, "num_key_value_heads": 1, "head_dim": 32, "attention_bias": True, "tie_word_embeddings": False},
    ],
    "gemma3_text": [
        {**TINY, "num_key_value_heads": 2, "head_dim": 16},
        {**TINY, "num_key_value_heads": 1, "head_dim": 32, "attention_bias": True, "tie_word_embeddings": False},
    ],
    "cohere": [
        {**TINY, "num_key_value_heads": 2, "eos_token_id": 2, "bos_token_id": 1},
        {**TINY, "use_qk_norm": True, "attention_bias": True, "tie_word_embeddings": False, "eos_token_id": 2, "bos_token_id": 1},
    ],
    "starcoder2": [
        {**TINY, "num_key_value_heads": 2, "eos_token_id": 2, "bos_token_id": 1},
        {**TINY, "use_bias": False, "tie_word_embeddings": False, "sliding_window": 8, "eos_token_id": 2, "bos_token_id": 1},
    ],
    "smollm3": [
        {**TINY, "num_key_value_heads": 2, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
        {**TINY, "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": False, "pad_token_id": 0, "bos_token_id": 1,
         "eos_token_id": 2},
    ],
    "olmo2": [{**TINY, "num_key_value_heads": 2}, {**TINY, "attention_bias": True, "tie_word_embeddings": True}],
    "granite": [
        {**TINY, "num_key_value_heads": 2, "residual_multiplier": 0.22},
        {**TINY, "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True},
    ],
    # mixtures of experts (issue 21)
    "qwen2_moe": [
        {**TINY, "num_key_value_heads": 2, "moe_intermediate_size": 24, "shared_expert_intermediate_size": 40, "num_experts": 4, "num_experts_per_tok": 2},
        {**TINY, "num_hidden_layers": 3, "num_key_value_heads": 4, "moe_intermediate_size": 24, "shared_expert_intermediate_size": 40, "num_experts": 3, "num_experts_per_tok": 1,
         "qkv_bias": False, "tie_word_embeddings": True},
    ],
    "qwen3_moe": [
        {**TINY, "num_key_value_heads": 2, "head_dim": 16, "moe_intermediate_size": 24, "num_experts": 4, "num_experts_per_tok": 2},
        {**TINY, "num_hidden_layers": 3, "num_key_value_heads": 4, "num_local_experts": 5, "num_experts_per_tok": 3,
         "attention_bias": True, "norm_topk_prob": True},
    ],
    "phimoe": [
        {**TINY, "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2},
        {**TINY, "num_key_value_heads": 4, "num_local_experts": 3, "num_experts_per_tok": 2, "attention_bias": True, "lm_head_bias": True,
         "tie_word_embeddings": True},
    ],
    # DeepSeek-V3: latent attention through q_lora_rank (or a plain q_proj), a dense first layer then MoE layers (the
    # router's e_score_correction_bias is a buffer), biases with attention_bias, two shared experts, every layer dense
    "deepseek_v3": [
        {**TINY, "num_key_value_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12,
         "moe_intermediate_size": 24, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
         "first_k_dense_replace": 1},
        {**TINY, "num_key_value_heads": 4, "num_hidden_layers": 3, "q_lora_rank": None, "kv_lora_rank": 12, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
         "v_head_dim": 16, "moe_intermediate_size": 20, "n_routed_experts": 6, "num_experts_per_tok": 3, "n_group": 3,
         "topk_group": 2, "n_shared_experts": 2, "first_k_dense_replace": 2, "attention_bias": True, "tie_word_embeddings": True},
        {**TINY, "num_key_value_heads": 4, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 16,
         "first_k_dense_replace": 2},
    ],
    # Falcon's switches: 7B (multi_query, parallel, one norm), 40B/180B (new_decoder_architecture: num_kv_heads, ln_attn
    # and ln_mlp), RW (alibi, biases, every head its own k and v, sequential), new_decoder with one norm (Falcon 2),
    # n_embed spelling, no tie
    "falcon": [
        {"vocab_size": 96, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4},
        {"vocab_size": 96, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "new_decoder_architecture": True,
         "num_kv_heads": 2, "ffn_hidden_size": 80},
        {"vocab_size": 96, "n_embed": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "alibi": True, "bias": True,
         "multi_query": False, "parallel_attn": False},
        {"vocab_size": 96, "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 8, "new_decoder_architecture": True,
         "num_kv_heads": 1, "num_ln_in_parallel_attn": 1, "tie_word_embeddings": False},
        {"vocab_size": 96, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "multi_query": False, "bias": True},
    ],
    # gpt-oss: grouped key/value heads, attention biases, sinks; then one key/value head per query head, no biases,
    # every expert chosen, tied embeddings
    "gpt_oss": [
        {**TINY, "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2},
        {**TINY, "num_hidden_layers": 3, "intermediate_size": 48, "num_key_value_heads": 4, "head_dim": 8, "num_local_experts": 3,
         "num_experts_per_tok": 3, "attention_bias": False, "tie_word_embeddings": True},
    ],
    # Llama 4 text: every layer alike here (MoE, rope; the shared checks want one layer block); top-2, biased attention,
    # tied. tests/models/test_families_llama4.py covers dense / MoE and rope / NoPE layers side by side
    "llama4_text": [
        {**TINY, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size_mlp": 112, "num_local_experts": 4,
         "no_rope_layers": [1, 1]},
        {**TINY, "num_hidden_layers": 3, "num_key_value_heads": 4, "head_dim": 32, "num_local_experts": 3, "num_experts_per_tok": 2, "intermediate_size_mlp": 40,
         "attention_bias": True, "tie_word_embeddings": True, "use_qk_norm": False, "no_rope_layers": [1, 1, 1]},
    ],
}
OTHER_ARCHITECTURES = {  # one more head per family where it is cheap
    "llama": "LlamaForSequenceClassification",
    "gpt2": "GPT2ForSequenceClassification",
    "bert": "BertForSequenceClassification",
    "gpt_neox": "GPTNeoXForSequenceClassification",
    "mixtral": "MixtralForSequenceClassification",
    "qwen3": "Qwen3ForSequenceClassification",
    "gemma2": "Gemma2ForSequenceClassification",
    "olmo2": "Olmo2ForSequenceClassification",
    "smollm3": "SmolLM3ForSequenceClassification",
    "starcoder2": "Starcoder2ForSequenceClassification",
    "gemma3_text": "Gemma3TextForSequenceClassification",
    "qwen2_moe": "Qwen2MoeForSequenceClassification",
    "phimoe": "PhimoeForSequenceClassification",
    "falcon": "FalconForSequenceClassification",
    "deepseek_v3": "DeepseekV3ForSequenceClassification",
    "gpt_oss": "GptOssForSequenceClassification",
}


def build(transformers, model_type: str, given: dict, architecture: str):
    import torch

    config = transformers.AutoConfig.for_model(model_type, **given)
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        return getattr(transformers, architecture)(config)

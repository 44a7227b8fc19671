"""deepseek_v3: transformers' DeepseekV3Config as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import Family, _arch

# DeepSeek-V3 (modeling_deepseek_v3.py): multi-head latent attention (q through a q_lora_rank bottleneck with its own
# RMSNorm, or a plain q_proj when q_lora_rank is null; k and v from one kv_lora_rank latent plus a shared rotary key),
# the first first_k_dense_replace layers a dense MLP of intermediate_size, the others a sigmoid router with a
# group-limited top-k (n_group, topk_group; an e_score_correction_bias buffer), n_routed_experts grouped experts of
# moe_intermediate_size and n_shared_experts shared ones (one gated MLP of n_shared_experts * moe_intermediate_size)
FAMILY = Family(
    'deepseek_v3',
    'DeepseekV3Config',
    fields={
        'vocab_size': (129280, 'int'),
        'hidden_size': (7168, 'int'),
        'intermediate_size': (18432, 'int'),
        'moe_intermediate_size': (2048, 'int'),
        'num_hidden_layers': (61, 'int'),
        'num_attention_heads': (128, 'int'),
        'num_key_value_heads': (128, 'int?'),
        'n_shared_experts': (1, 'int'),
        'n_routed_experts': (256, 'int'),
        'output_router_logits': (False, 'bool'),
        'routed_scaling_factor': (2.5, 'number'),
        'kv_lora_rank': (512, 'int'),
        'q_lora_rank': (1536, 'int?'),
        'qk_rope_head_dim': (64, 'int'),
        'v_head_dim': (128, 'int?'),
        'qk_nope_head_dim': (128, 'int'),
        'n_group': (8, 'int?'),
        'topk_group': (4, 'int?'),
        'num_experts_per_tok': (8, 'int?'),
        'first_k_dense_replace': (3, 'int?'),
        'norm_topk_prob': (True, 'bool?'),
        'hidden_act': ('silu', 'str'),
        'max_position_embeddings': (4096, 'int'),
        'initializer_range': (0.02, 'float'),
        'rms_norm_eps': (1e-06, 'float'),
        'use_cache': (True, 'bool'),
        'pad_token_id': (None, 'int?'),
        'bos_token_id': (0, 'int?'),
        'eos_token_id': (1, 'ids?'),
        'pretraining_tp': (1, 'int?'),
        'tie_word_embeddings': (False, 'bool'),
        'rope_parameters': (None, 'dict?'),
        'rope_interleave': (True, 'bool?'),
        'attention_bias': (False, 'bool'),
        'attention_dropout': (0.0, 'number?'),
        'num_mtp_layers': (1, 'int'),
    },
    architectures=_arch('DeepseekV3'),
    default_architecture='DeepseekV3ForCausalLM',
    # DeepseekV3Config: num_local_experts reads n_routed_experts; num_mtp_layers is stored as num_nextn_predict_layers
    attribute_map={'num_local_experts': 'n_routed_experts', 'num_mtp_layers': 'num_nextn_predict_layers'},
    kv_heads_default=True, post_init='deepseek_v3', block='deepseek_v3', qkv_bias='attention_bias',
    o_bias='attention_bias',
)

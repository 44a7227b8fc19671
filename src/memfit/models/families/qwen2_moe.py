"""qwen2_moe: transformers' Qwen2MoeConfig as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import Family, _QWEN_MOE_FIELDS, _arch

FAMILY = Family(
    'qwen2_moe',
    'Qwen2MoeConfig',
    fields={
        **_QWEN_MOE_FIELDS,
        'intermediate_size': (5632, 'int'),
        'num_hidden_layers': (24, 'int'),
        'num_attention_heads': (16, 'int'),
        'num_key_value_heads': (16, 'int?'),
        'hidden_act': ('silu', 'str'),
        'max_position_embeddings': (32768, 'int'),
        'initializer_range': (0.02, 'float'),
        'rms_norm_eps': (1e-06, 'float'),
        'use_cache': (True, 'bool'),
        'tie_word_embeddings': (False, 'bool'),
        'rope_parameters': (None, 'dict?'),
        'use_sliding_window': (False, 'bool'),
        'sliding_window': (4096, 'int?'),
        'max_window_layers': (28, 'int'),
        'attention_dropout': (0.0, 'number'),
        'decoder_sparse_step': (1, 'int'),
        'moe_intermediate_size': (1408, 'int'),
        'shared_expert_intermediate_size': (5632, 'int'),
        'num_experts_per_tok': (4, 'int'),
        'num_experts': (60, 'int'),
        'norm_topk_prob': (False, 'bool'),
        'output_router_logits': (False, 'bool'),
        'router_aux_loss_coef': (0.001, 'float'),
        'mlp_only_layers': (None, 'ints?'),
        'qkv_bias': (True, 'bool'),
        'layer_types': (None, 'strs?'),
        'pad_token_id': (None, 'int?'),
        'bos_token_id': (None, 'int?'),
        'eos_token_id': (None, 'ids?'),
    },
    architectures=_arch('Qwen2Moe'),
    default_architecture='Qwen2MoeForCausalLM',
    kv_heads_default=True, post_init='qwen2_moe', block='qwen2_moe', qkv_bias='qkv_bias',
)

"""qwen3_moe: transformers' Qwen3MoeConfig as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import Family, _QWEN_MOE_FIELDS, _arch

FAMILY = Family(
    'qwen3_moe',
    'Qwen3MoeConfig',
    fields={
        **_QWEN_MOE_FIELDS,
        'intermediate_size': (6144, 'int'),
        'num_hidden_layers': (24, 'int'),
        'num_attention_heads': (32, 'int'),
        'num_key_value_heads': (4, 'int'),
        'hidden_act': ('silu', 'str'),
        'max_position_embeddings': (32768, 'int'),
        'initializer_range': (0.02, 'float'),
        'rms_norm_eps': (1e-06, 'float'),
        'use_cache': (True, 'bool'),
        'tie_word_embeddings': (False, 'bool'),
        'rope_parameters': (None, 'dict?'),
        'attention_bias': (False, 'bool'),
        'use_sliding_window': (False, 'bool'),
        'sliding_window': (4096, 'int?'),
        'attention_dropout': (0.0, 'number'),
        'decoder_sparse_step': (1, 'int'),
        'moe_intermediate_size': (768, 'int'),
        'num_experts_per_tok': (8, 'int'),
        'num_experts': (128, 'int'),
        'norm_topk_prob': (False, 'bool'),
        'output_router_logits': (False, 'bool'),
        'router_aux_loss_coef': (0.001, 'float'),
        'mlp_only_layers': (None, 'ints?'),
        'pad_token_id': (None, 'int?'),
        'bos_token_id': (None, 'int?'),
        'eos_token_id': (None, 'ids?'),
    },
    architectures=_arch('Qwen3Moe'),
    default_architecture='Qwen3MoeForCausalLM',
    # Qwen3MoeConfig declares num_experts but maps that name to num_local_experts (to_dict writes the latter)
    attribute_map={'num_experts': 'num_local_experts'}, post_init='qwen3_moe', block='qwen3_moe',
    qkv_bias='attention_bias', o_bias='attention_bias', qk_norm=True,
)

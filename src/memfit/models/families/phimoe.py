"""phimoe: transformers' PhimoeConfig as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import Family, _arch

# Phi-3.5-MoE: Mixtral's layout with biased attention (attention_bias), LayerNorms (weight and bias), a router
# that is an nn.Linear (`mlp.router`), sparsemixer top-2 routing and an optional lm_head bias
FAMILY = Family(
    'phimoe',
    'PhimoeConfig',
    fields={
        'vocab_size': (32064, 'int'),
        'hidden_size': (4096, 'int'),
        'intermediate_size': (6400, 'int'),
        'num_hidden_layers': (32, 'int'),
        'num_attention_heads': (32, 'int'),
        'num_key_value_heads': (8, 'int'),
        'hidden_act': ('silu', 'str'),
        'max_position_embeddings': (131072, 'int'),
        'initializer_range': (0.02, 'float'),
        'rms_norm_eps': (1e-05, 'float'),
        'use_cache': (True, 'bool'),
        'pad_token_id': (None, 'int?'),
        'bos_token_id': (1, 'int?'),
        'eos_token_id': (2, 'ids?'),
        'tie_word_embeddings': (False, 'bool'),
        'rope_parameters': (None, 'dict?'),
        'sliding_window': (None, 'int?'),
        'attention_dropout': (0.0, 'number'),
        'num_experts_per_tok': (2, 'int'),
        'num_local_experts': (16, 'int'),
        'output_router_logits': (False, 'bool'),
        'router_aux_loss_coef': (0.001, 'float'),
        'router_jitter_noise': (0.01, 'float'),
        'input_jitter_noise': (0.0, 'float'),
        'attention_bias': (False, 'bool'),
        'lm_head_bias': (False, 'bool'),
    },
    architectures=_arch('Phimoe', token=False),
    default_architecture='PhimoeForCausalLM',
    kv_heads_default=True, rope_theta_default=1000000.0, block='phimoe', qkv_bias='attention_bias', o_bias='attention_bias',
)

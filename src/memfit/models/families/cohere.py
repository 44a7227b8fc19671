"""cohere: transformers' CohereConfig as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import CAUSAL_LM, Family

FAMILY = Family(
    'cohere',
    'CohereConfig',
    fields={
        'vocab_size': (256000, 'int'),
        'hidden_size': (8192, 'int'),
        'intermediate_size': (22528, 'int'),
        'logit_scale': (0.0625, 'number?'),
        'num_hidden_layers': (40, 'int'),
        'num_attention_heads': (64, 'int'),
        'num_key_value_heads': (None, 'int?'),
        'hidden_act': ('silu', 'str'),
        'max_position_embeddings': (8192, 'int'),
        'initializer_range': (0.02, 'float'),
        'layer_norm_eps': (1e-05, 'number?'),
        'use_cache': (True, 'bool'),
        'pad_token_id': (0, 'int?'),
        'bos_token_id': (5, 'int?'),
        'eos_token_id': (255001, 'ids?'),
        'tie_word_embeddings': (True, 'bool'),
        'rope_parameters': (None, 'dict?'),
        'attention_bias': (False, 'bool'),
        'attention_dropout': (0.0, 'number?'),
        'use_qk_norm': (False, 'bool?'),
    },
    architectures={'CohereForCausalLM': CAUSAL_LM},
    default_architecture='CohereForCausalLM',
    kv_heads_default=True, qkv_bias='attention_bias', o_bias='attention_bias', qk_norm_key='use_qk_norm',
    rope_theta_default=500000.0, layer_norms=("input_layernorm",),
)

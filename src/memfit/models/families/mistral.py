"""mistral: transformers' MistralConfig as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import Family, _arch

FAMILY = Family(
    'mistral',
    'MistralConfig',
    fields={
        'vocab_size': (32000, 'int'),
        'hidden_size': (4096, 'int'),
        'intermediate_size': (14336, 'int'),
        'num_hidden_layers': (32, 'int'),
        'num_attention_heads': (32, 'int'),
        'num_key_value_heads': (8, 'int'),
        'head_dim': (None, 'int?'),
        'hidden_act': ('silu', 'str'),
        'max_position_embeddings': (131072, 'int'),
        'initializer_range': (0.02, 'float'),
        'rms_norm_eps': (1e-06, 'float'),
        'use_cache': (True, 'bool'),
        'pad_token_id': (None, 'int?'),
        'bos_token_id': (1, 'int?'),
        'eos_token_id': (2, 'ids?'),
        'tie_word_embeddings': (False, 'bool'),
        'rope_parameters': (None, 'dict?'),
        'sliding_window': (4096, 'int?'),
        'attention_dropout': (0.0, 'number'),
    },
    architectures=_arch('Mistral'),
    default_architecture='MistralForCausalLM',
    kv_heads_default=True, head_dim_default=True,
)

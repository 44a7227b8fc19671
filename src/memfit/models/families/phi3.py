"""phi3: transformers' Phi3Config as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import Family, _arch

FAMILY = Family(
    'phi3',
    'Phi3Config',
    fields={
        'vocab_size': (32064, 'int'),
        'hidden_size': (3072, 'int'),
        'intermediate_size': (8192, 'int'),
        'num_hidden_layers': (32, 'int'),
        'num_attention_heads': (32, 'int'),
        'num_key_value_heads': (None, 'int?'),
        'resid_pdrop': (0.0, 'number'),
        'embd_pdrop': (0.0, 'number'),
        'attention_dropout': (0.0, 'number'),
        'hidden_act': ('silu', 'str'),
        'max_position_embeddings': (4096, 'int'),
        'original_max_position_embeddings': (4096, 'int'),
        'initializer_range': (0.02, 'float'),
        'rms_norm_eps': (1e-05, 'float'),
        'use_cache': (True, 'bool'),
        'tie_word_embeddings': (False, 'bool'),
        'rope_parameters': (None, 'dict?'),
        'bos_token_id': (1, 'int?'),
        'eos_token_id': (32000, 'ids?'),
        'pad_token_id': (32000, 'int?'),
        'sliding_window': (None, 'int?'),
    },
    architectures=_arch('Phi3'),
    default_architecture='Phi3ForCausalLM',
    kv_heads_default=True, rope_partial_default=1.0, rope_partial_kept=True, block='phi3',
)

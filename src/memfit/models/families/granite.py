"""granite: transformers' GraniteConfig as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import CAUSAL_LM, Family

FAMILY = Family(
    'granite',
    'GraniteConfig',
    fields={
        'vocab_size': (32000, 'int'),
        'hidden_size': (4096, 'int'),
        'intermediate_size': (11008, 'int'),
        'num_hidden_layers': (32, 'int'),
        'num_attention_heads': (32, 'int'),
        'num_key_value_heads': (None, 'int?'),
        'hidden_act': ('silu', 'str'),
        'max_position_embeddings': (2048, 'int'),
        'initializer_range': (0.02, 'float'),
        'rms_norm_eps': (1e-06, 'float'),
        'use_cache': (True, 'bool'),
        'pad_token_id': (None, 'int?'),
        'bos_token_id': (1, 'int?'),
        'eos_token_id': (2, 'ids?'),
        'tie_word_embeddings': (False, 'bool'),
        'rope_parameters': (None, 'dict?'),
        'attention_bias': (False, 'bool'),
        'attention_dropout': (0.0, 'number'),
        'mlp_bias': (False, 'bool'),
        'embedding_multiplier': (1.0, 'number'),
        'logits_scaling': (1.0, 'number'),
        'residual_multiplier': (1.0, 'number'),
        'attention_multiplier': (1.0, 'number'),
    },
    architectures={'GraniteForCausalLM': CAUSAL_LM},
    default_architecture='GraniteForCausalLM',
    kv_heads_default=True, qkv_bias='attention_bias', o_bias='attention_bias', mlp_bias='mlp_bias',
)

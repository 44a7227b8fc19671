"""smollm3: transformers' SmolLM3Config as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import Family, _arch

FAMILY = Family(
    'smollm3',
    'SmolLM3Config',
    fields={
        'vocab_size': (128256, 'int'),
        'hidden_size': (2048, 'int'),
        'intermediate_size': (11008, 'int'),
        'num_hidden_layers': (36, 'int'),
        'num_attention_heads': (16, 'int'),
        'num_key_value_heads': (4, 'int?'),
        'hidden_act': ('silu', 'str'),
        'max_position_embeddings': (32768, 'int'),
        'initializer_range': (0.02, 'float'),
        'rms_norm_eps': (1e-06, 'float'),
        'use_cache': (True, 'bool'),
        'pad_token_id': (128004, 'int?'),
        'bos_token_id': (128000, 'int?'),
        'eos_token_id': (128001, 'ids?'),
        'rope_parameters': (None, 'dict?'),
        'use_sliding_window': (False, 'bool'),
        'sliding_window': (None, 'int?'),
        'no_rope_layers': (None, 'ids?'),
        'no_rope_layer_interval': (4, 'int'),
        'layer_types': (None, 'strs?'),
        'attention_bias': (False, 'bool'),
        'attention_dropout': (0.0, 'number'),
        'mlp_bias': (False, 'bool'),
        'tie_word_embeddings': (True, 'bool'),
    },
    architectures=_arch('SmolLM3'),
    default_architecture='SmolLM3ForCausalLM',
    kv_heads_default=True, qkv_bias='attention_bias', o_bias='attention_bias', mlp_bias='mlp_bias', nope_layers=True,
    rope_theta_default=2000000.0,
)

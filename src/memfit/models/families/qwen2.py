"""qwen2: transformers' Qwen2Config as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import Family, _arch

FAMILY = Family(
    'qwen2',
    'Qwen2Config',
    fields={
        'vocab_size': (151936, 'int'),
        'hidden_size': (4096, 'int'),
        'intermediate_size': (22016, 'int'),
        'num_hidden_layers': (32, 'int'),
        'num_attention_heads': (32, 'int'),
        'num_key_value_heads': (32, 'int?'),
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
        'layer_types': (None, 'strs?'),
        'attention_dropout': (0.0, 'number'),
        'pad_token_id': (None, 'int?'),
        'bos_token_id': (None, 'int?'),
        'eos_token_id': (None, 'ids?'),
    },
    architectures=_arch('Qwen2'),
    default_architecture='Qwen2ForCausalLM',
    kv_heads_default=True, sliding_window_flag=True, layer_types_default=True, qkv_bias=True,
)

"""olmo2: transformers' Olmo2Config as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import Family, _arch

FAMILY = Family(
    'olmo2',
    'Olmo2Config',
    fields={
        'vocab_size': (50304, 'int'),
        'hidden_size': (4096, 'int'),
        'intermediate_size': (11008, 'int'),
        'num_hidden_layers': (32, 'int'),
        'num_attention_heads': (32, 'int'),
        'num_key_value_heads': (None, 'int?'),
        'hidden_act': ('silu', 'str'),
        'max_position_embeddings': (2048, 'int'),
        'initializer_range': (0.02, 'float'),
        'use_cache': (True, 'bool'),
        'pad_token_id': (1, 'int?'),
        'bos_token_id': (None, 'int?'),
        'eos_token_id': (50279, 'ids?'),
        'tie_word_embeddings': (False, 'bool'),
        'rope_parameters': (None, 'dict?'),
        'attention_bias': (False, 'bool'),
        'attention_dropout': (0.0, 'number'),
        'rms_norm_eps': (1e-05, 'float'),
    },
    architectures=_arch('Olmo2', token=False),
    default_architecture='Olmo2ForCausalLM',
    kv_heads_default=True, qkv_bias='attention_bias', o_bias='attention_bias', qk_norm=True, qk_norm_full=True,
    layer_norms=("post_attention_layernorm", "post_feedforward_layernorm"),
)

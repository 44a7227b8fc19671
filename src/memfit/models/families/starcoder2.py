"""starcoder2: transformers' Starcoder2Config as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import Family, _arch

FAMILY = Family(
    'starcoder2',
    'Starcoder2Config',
    fields={
        'vocab_size': (49152, 'int'),
        'hidden_size': (3072, 'int'),
        'intermediate_size': (12288, 'int'),
        'num_hidden_layers': (30, 'int'),
        'num_attention_heads': (24, 'int'),
        'num_key_value_heads': (2, 'int'),
        'hidden_act': ('gelu_pytorch_tanh', 'str'),
        'max_position_embeddings': (4096, 'int'),
        'initializer_range': (0.018042, 'float'),
        'norm_epsilon': (1e-05, 'float'),
        'use_cache': (True, 'bool'),
        'bos_token_id': (50256, 'int?'),
        'eos_token_id': (50256, 'ids?'),
        'pad_token_id': (None, 'int?'),
        'rope_parameters': (None, 'dict?'),
        'sliding_window': (None, 'int?'),
        'attention_dropout': (0.0, 'number'),
        'residual_dropout': (0.0, 'number'),
        'embedding_dropout': (0.0, 'number'),
        'use_bias': (True, 'bool'),
        'tie_word_embeddings': (True, 'bool'),
    },
    architectures=_arch('Starcoder2'),
    default_architecture='Starcoder2ForCausalLM',
    qkv_bias='use_bias', o_bias='use_bias', mlp_bias='use_bias', norm_type='layernorm', plain_mlp=('mlp.c_fc', 'mlp.c_proj'),
)

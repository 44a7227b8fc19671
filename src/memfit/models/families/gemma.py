"""gemma: transformers' GemmaConfig as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import Family, _arch

FAMILY = Family(
    'gemma',
    'GemmaConfig',
    fields={
        'vocab_size': (256000, 'int'),
        'hidden_size': (3072, 'int'),
        'intermediate_size': (24576, 'int'),
        'num_hidden_layers': (28, 'int'),
        'num_attention_heads': (16, 'int'),
        'num_key_value_heads': (16, 'int'),
        'head_dim': (256, 'int'),
        'hidden_act': ('gelu_pytorch_tanh', 'str'),
        'max_position_embeddings': (8192, 'int'),
        'initializer_range': (0.02, 'float'),
        'rms_norm_eps': (1e-06, 'float'),
        'use_cache': (True, 'bool'),
        'pad_token_id': (0, 'int?'),
        'eos_token_id': (1, 'ids?'),
        'bos_token_id': (2, 'int?'),
        'tie_word_embeddings': (True, 'bool'),
        'rope_parameters': (None, 'dict?'),
        'attention_bias': (False, 'bool'),
        'attention_dropout': (0.0, 'number'),
        'use_bidirectional_attention': (None, 'bool?'),
    },
    architectures=_arch('Gemma'),
    default_architecture='GemmaForCausalLM',
    gelu_means_tanh=True, qkv_bias='attention_bias', o_bias='attention_bias',
)

"""falcon: transformers' FalconConfig as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import Family, _arch

FAMILY = Family(
    'falcon',
    'FalconConfig',
    fields={
        'vocab_size': (65024, 'int'),
        'hidden_size': (4544, 'int'),
        'num_hidden_layers': (32, 'int'),
        'num_attention_heads': (71, 'int'),
        'num_ln_in_parallel_attn': (None, 'int?'),
        'layer_norm_epsilon': (1e-05, 'number?'),
        'initializer_range': (0.02, 'float'),
        'use_cache': (True, 'bool'),
        'hidden_dropout': (0.0, 'number?'),
        'attention_dropout': (0.0, 'number?'),
        'num_kv_heads': (None, 'int?'),
        'alibi': (False, 'bool?'),
        'new_decoder_architecture': (False, 'bool?'),
        'multi_query': (True, 'bool?'),
        'parallel_attn': (True, 'bool?'),
        'bias': (False, 'bool?'),
        'max_position_embeddings': (2048, 'int'),
        'rope_parameters': (None, 'dict?'),
        'bos_token_id': (11, 'int?'),
        'eos_token_id': (11, 'ids?'),
        'pad_token_id': (None, 'int?'),
        'ffn_hidden_size': (None, 'int?'),
        'activation': ('gelu', 'str?'),
        'tie_word_embeddings': (True, 'bool'),
    },
    architectures=_arch('Falcon'),
    default_architecture='FalconForCausalLM',
    kv_heads_default=True, kv_heads_key='num_kv_heads', init_aliases={'n_embed': 'hidden_size'}, ffn_default='ffn_hidden_size',
    block='falcon', base='transformer', qkv_bias='bias', o_bias='bias', mlp_bias='bias', norm_type='layernorm',
    padding_idx=False, head_dim_key=False, classifier='classifier',
)

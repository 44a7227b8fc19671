"""gpt_neox: transformers' GPTNeoXConfig as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import Family, _arch

FAMILY = Family(
    'gpt_neox',
    'GPTNeoXConfig',
    fields={
        'vocab_size': (50432, 'int'),
        'hidden_size': (6144, 'int'),
        'num_hidden_layers': (44, 'int'),
        'num_attention_heads': (64, 'int'),
        'intermediate_size': (24576, 'int'),
        'hidden_act': ('gelu', 'str'),
        'attention_dropout': (0.0, 'number'),
        'hidden_dropout': (0.0, 'number'),
        'classifier_dropout': (0.1, 'number'),
        'max_position_embeddings': (2048, 'int'),
        'initializer_range': (0.02, 'float'),
        'layer_norm_eps': (1e-05, 'float'),
        'use_cache': (True, 'bool'),
        'bos_token_id': (0, 'int?'),
        'eos_token_id': (2, 'ids?'),
        'pad_token_id': (None, 'int?'),
        'tie_word_embeddings': (False, 'bool'),
        'use_parallel_residual': (True, 'bool'),
        'rope_parameters': (None, 'dict?'),
        'attention_bias': (True, 'bool'),
        'is_decoder': (False, 'bool'),
    },
    architectures=_arch('GPTNeoX'),
    default_architecture='GPTNeoXForCausalLM',
    rope_legacy={'rotary_emb_base': 'rope_theta', 'rotary_pct': 'partial_rotary_factor'}, rope_partial_default=0.25, block='gpt_neox', base='gpt_neox', qkv_bias='attention_bias', o_bias='attention_bias', mlp_bias=True, padding_idx=False, head_dim_key=False, classifier='classifier', classifier_dropout=('classifier_dropout',),
)

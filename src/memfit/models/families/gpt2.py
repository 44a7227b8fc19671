"""gpt2: transformers' GPT2Config as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import Family, _arch

FAMILY = Family(
    'gpt2',
    'GPT2Config',
    fields={
        'vocab_size': (50257, 'int'),
        'n_positions': (1024, 'int'),
        'n_embd': (768, 'int'),
        'n_layer': (12, 'int'),
        'n_head': (12, 'int'),
        'n_inner': (None, 'int?'),
        'activation_function': ('gelu_new', 'str'),
        'resid_pdrop': (0.1, 'number'),
        'embd_pdrop': (0.1, 'number'),
        'attn_pdrop': (0.1, 'number'),
        'layer_norm_epsilon': (1e-05, 'float'),
        'initializer_range': (0.02, 'float'),
        'summary_type': ('cls_index', 'str'),
        'summary_use_proj': (True, 'bool'),
        'summary_activation': (None, 'str?'),
        'summary_proj_to_labels': (True, 'bool'),
        'summary_first_dropout': (0.1, 'number'),
        'scale_attn_weights': (True, 'bool'),
        'use_cache': (True, 'bool'),
        'bos_token_id': (50256, 'int?'),
        'eos_token_id': (50256, 'ids?'),
        'pad_token_id': (None, 'int?'),
        'scale_attn_by_inverse_layer_idx': (False, 'bool'),
        'reorder_and_upcast_attn': (False, 'bool'),
        'add_cross_attention': (False, 'bool'),
        'tie_word_embeddings': (True, 'bool'),
    },
    architectures=_arch('GPT2', 'LMHeadModel'),
    default_architecture='GPT2LMHeadModel',
    attribute_map={'hidden_size': 'n_embd', 'max_position_embeddings': 'n_positions', 'num_attention_heads': 'n_head', 'num_hidden_layers': 'n_layer'}, rope_theta_default=None, block='gpt2', base='transformer', qkv_bias=True, o_bias=True, mlp_bias=True, padding_idx=False, head_dim_key=False, classifier='classifier',
)

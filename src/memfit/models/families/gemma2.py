"""gemma2: transformers' Gemma2Config as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import Family, _arch

FAMILY = Family(
    'gemma2',
    'Gemma2Config',
    fields={
        'vocab_size': (256000, 'int'),
        'hidden_size': (2304, 'int'),
        'intermediate_size': (9216, 'int'),
        'num_hidden_layers': (26, 'int'),
        'num_attention_heads': (8, 'int'),
        'num_key_value_heads': (4, 'int'),
        'head_dim': (256, 'int'),
        'hidden_activation': ('gelu_pytorch_tanh', 'str'),
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
        'attention_dropout': (0.0, 'number?'),
        'query_pre_attn_scalar': (256, 'int'),
        'sliding_window': (4096, 'int?'),
        'layer_types': (None, 'strs?'),
        'final_logit_softcapping': (30.0, 'number?'),
        'attn_logit_softcapping': (50.0, 'number?'),
        'use_bidirectional_attention': (None, 'bool?'),
    },
    architectures=_arch('Gemma2'),
    default_architecture='Gemma2ForCausalLM',
    qkv_bias='attention_bias', o_bias='attention_bias', layer_pattern=2,
    layer_norms=("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"),
)

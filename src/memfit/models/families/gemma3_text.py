"""gemma3_text: transformers' Gemma3TextConfig as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import CAUSAL_LM, Family, SEQUENCE_CLASSIFICATION

FAMILY = Family(
    'gemma3_text',
    'Gemma3TextConfig',
    fields={
        'vocab_size': (262208, 'int'),
        'hidden_size': (2304, 'int'),
        'intermediate_size': (9216, 'int'),
        'num_hidden_layers': (26, 'int'),
        'num_attention_heads': (8, 'int'),
        'num_key_value_heads': (4, 'int'),
        'head_dim': (256, 'int'),
        'hidden_activation': ('gelu_pytorch_tanh', 'str'),
        'max_position_embeddings': (131072, 'int'),
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
        'final_logit_softcapping': (None, 'number?'),
        'attn_logit_softcapping': (None, 'number?'),
        'use_bidirectional_attention': (False, 'bool?'),
    },
    architectures={'Gemma3ForCausalLM': CAUSAL_LM, 'Gemma3TextForSequenceClassification': SEQUENCE_CLASSIFICATION},
    default_architecture='Gemma3ForCausalLM',
    qkv_bias='attention_bias', o_bias='attention_bias', qk_norm=True, layer_pattern=6,
    layer_pattern_key='sliding_window_pattern', rope_per_layer_type=True, rope_legacy={'rope_local_base_freq': 'rope_theta'},
    rope_theta_default={'global': 1000000.0, 'local': 10000.0},
    layer_norms=("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"),
)

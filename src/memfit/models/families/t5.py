"""t5: transformers' T5Config as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import Family, SEQ2SEQ_LM

FAMILY = Family(
    't5',
    'T5Config',
    fields={
        'vocab_size': (32128, 'int'),
        'd_model': (512, 'int'),
        'd_kv': (64, 'int'),
        'd_ff': (2048, 'int'),
        'num_layers': (6, 'int'),
        'num_decoder_layers': (None, 'int?'),
        'num_heads': (8, 'int'),
        'relative_attention_num_buckets': (32, 'int'),
        'relative_attention_max_distance': (128, 'int'),
        'dropout_rate': (0.1, 'number'),
        'layer_norm_epsilon': (1e-06, 'float'),
        'initializer_factor': (1.0, 'number'),
        'feed_forward_proj': ('relu', 'str'),
        'is_encoder_decoder': (True, 'bool'),
        'use_cache': (True, 'bool'),
        'pad_token_id': (0, 'int?'),
        'eos_token_id': (1, 'ids?'),
        'classifier_dropout': (0.0, 'number'),
        'is_decoder': (False, 'bool'),
    },
    architectures={'T5ForConditionalGeneration': SEQ2SEQ_LM},
    default_architecture='T5ForConditionalGeneration',
    attribute_map={'hidden_size': 'd_model', 'num_attention_heads': 'num_heads', 'num_hidden_layers': 'num_layers', 'head_dim': 'd_kv'},
    rope_theta_default=None, block='t5', base='', padding_idx=False, head_dim_key=False, post_init='t5',
)

"""bert: transformers' BertConfig as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import CAUSAL_LM, Family, MASKED_LM, SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION

FAMILY = Family(
    'bert',
    'BertConfig',
    fields={
        'vocab_size': (30522, 'int'),
        'hidden_size': (768, 'int'),
        'num_hidden_layers': (12, 'int'),
        'num_attention_heads': (12, 'int'),
        'intermediate_size': (3072, 'int'),
        'hidden_act': ('gelu', 'str'),
        'hidden_dropout_prob': (0.1, 'number'),
        'attention_probs_dropout_prob': (0.1, 'number'),
        'max_position_embeddings': (512, 'int'),
        'type_vocab_size': (2, 'int'),
        'initializer_range': (0.02, 'float'),
        'layer_norm_eps': (1e-12, 'float'),
        'pad_token_id': (0, 'int?'),
        'use_cache': (True, 'bool'),
        'classifier_dropout': (None, 'number?'),
        'is_decoder': (False, 'bool'),
        'add_cross_attention': (False, 'bool'),
        'bos_token_id': (None, 'int?'),
        'eos_token_id': (None, 'ids?'),
        'tie_word_embeddings': (True, 'bool'),
    },
    architectures={'BertForMaskedLM': MASKED_LM, 'BertLMHeadModel': CAUSAL_LM, 'BertForSequenceClassification': SEQUENCE_CLASSIFICATION,
                   'BertForTokenClassification': TOKEN_CLASSIFICATION},
    default_architecture='BertForMaskedLM',
    rope_theta_default=None, block='bert', base='bert', qkv_bias=True, o_bias=True, mlp_bias=True, head_dim_key=False,
    classifier='classifier', classifier_dropout=('classifier_dropout', 'hidden_dropout_prob'),
)

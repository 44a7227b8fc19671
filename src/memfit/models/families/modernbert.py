"""modernbert: transformers' ModernBertConfig as 5.24.0 defines it; models/modernbert.py has its structure and what a
step saves.

A pre-norm encoder (LayerNorm without bias by default; the first layer's attention norm is an identity) with rotary
positions, one fused Wqkv projection, a gated (GLU) MLP, and attention that alternates full and sliding-window layers
(layer_types; from the legacy global_attn_every_n_layers, 3, when absent: every third layer, the first included, is
global), each type with its own rotary base (global_rope_theta 160000, local_rope_theta 10000). The masked-LM head
(dense, activation, norm, decoder tied to the embeddings) and the classifiers (the same head over the [CLS] token or
the mean, dropout, classifier) are the model's own. Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import Family, MASKED_LM, SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION

FAMILY = Family(
    'modernbert',
    'ModernBertConfig',
    fields={
        'vocab_size': (50368, 'int'),
        'hidden_size': (768, 'int'),
        'intermediate_size': (1152, 'int'),
        'num_hidden_layers': (22, 'int'),
        'num_attention_heads': (12, 'int'),
        'hidden_activation': ('gelu', 'str'),
        'max_position_embeddings': (8192, 'int'),
        'initializer_range': (0.02, 'float'),
        'initializer_cutoff_factor': (2.0, 'number'),
        'norm_eps': (1e-05, 'float'),
        'norm_bias': (False, 'bool'),
        'pad_token_id': (50283, 'int?'),
        'eos_token_id': (50282, 'ids?'),
        'bos_token_id': (50281, 'int?'),
        'cls_token_id': (50281, 'int?'),
        'sep_token_id': (50282, 'int?'),
        'attention_bias': (False, 'bool'),
        'attention_dropout': (0.0, 'number'),
        'layer_types': (None, 'strs?'),
        'rope_parameters': (None, 'dict?'),
        'local_attention': (128, 'int'),
        'embedding_dropout': (0.0, 'number'),
        'mlp_bias': (False, 'bool'),
        'mlp_dropout': (0.0, 'number'),
        'decoder_bias': (True, 'bool'),
        'classifier_pooling': ('cls', 'str'),
        'classifier_dropout': (0.0, 'number'),
        'classifier_bias': (False, 'bool'),
        'classifier_activation': ('gelu', 'str'),
        'deterministic_flash_attn': (False, 'bool'),
        'sparse_prediction': (False, 'bool'),
        'sparse_pred_ignore_index': (-100, 'int'),
        'tie_word_embeddings': (True, 'bool'),
    },
    architectures={'ModernBertForMaskedLM': MASKED_LM, 'ModernBertForSequenceClassification': SEQUENCE_CLASSIFICATION,
                   'ModernBertForTokenClassification': TOKEN_CLASSIFICATION},
    default_architecture='ModernBertForMaskedLM',
    rope_theta_default=None, block='modernbert', base='model', head_dim_key=False, norm_type='layernorm',
    classifier='classifier', classifier_dropout=('classifier_dropout',), post_init='modernbert',
    getattr_keys={'global_attn_every_n_layers': (3, 'int'), 'global_rope_theta': (160000.0, 'number'),
                  'local_rope_theta': (10000.0, 'number'), 'reference_compile': (None, 'bool?')},
)

"""roberta: transformers' RobertaConfig as 5.24.0 defines it, and the structure models/hf.py reads.

BERT's encoder layer (block "bert") under `roberta.`; its own embeddings (position ids counted from the padding
token, registered after the LayerNorm), masked-LM head (`lm_head`: dense, gelu, layer_norm, the tied decoder and its
bias `lm_head.bias`) and sequence classifier (`classifier.dense`, tanh, `classifier.out_proj` over the first token,
no pooler). Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import CAUSAL_LM, Family, MASKED_LM, SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION

FAMILY = Family(
    'roberta',
    'RobertaConfig',
    fields={
        'vocab_size': (50265, 'int'),
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
        'pad_token_id': (1, 'int?'),
        'bos_token_id': (0, 'int?'),
        'eos_token_id': (2, 'ids?'),
        'use_cache': (True, 'bool'),
        'classifier_dropout': (None, 'number?'),
        'is_decoder': (False, 'bool'),
        'add_cross_attention': (False, 'bool'),
        'tie_word_embeddings': (True, 'bool'),
    },
    architectures={'RobertaForMaskedLM': MASKED_LM, 'RobertaForCausalLM': CAUSAL_LM,
                   'RobertaForSequenceClassification': SEQUENCE_CLASSIFICATION,
                   'RobertaForTokenClassification': TOKEN_CLASSIFICATION},
    default_architecture='RobertaForMaskedLM',
    rope_theta_default=None, block='bert', base='roberta', qkv_bias=True, o_bias=True, mlp_bias=True, head_dim_key=False,
    classifier='classifier', classifier_dropout=('classifier_dropout', 'hidden_dropout_prob'), encoder_head='roberta',
)

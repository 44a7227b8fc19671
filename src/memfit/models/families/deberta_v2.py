"""deberta-v2: transformers' DebertaV2Config as 5.24.0 defines it; models/deberta.py has its structure and what a step saves.

DeBERTa-v2 and v3 (model_type "deberta-v2": this module's name spells it with an underscore): a post-norm encoder
whose self-attention adds disentangled relative-position terms (content-to-position and position-to-content scores
over a shared table of relative-position embeddings), run by its own attention code whatever attn_implementation
says (no SDPA). Besides DebertaV2Config's fields, the modeling code reads optional keys with getattr, which the
published configs set (deberta-v3-base: relative_attention, position_buckets 256, norm_rel_ebd "layer_norm",
share_att_key, pos_att_type "p2c|c2p"); they are fields here with the getattr defaults. Data, loaded on demand
(models.families.FAMILIES).
"""

from memfit.models.families import Family, MASKED_LM, SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION

FAMILY = Family(
    'deberta-v2',
    'DebertaV2Config',
    fields={
        'vocab_size': (128100, 'int'),
        'hidden_size': (1536, 'int'),
        'num_hidden_layers': (24, 'int'),
        'num_attention_heads': (24, 'int'),
        'intermediate_size': (6144, 'int'),
        'hidden_act': ('gelu', 'str'),
        'hidden_dropout_prob': (0.1, 'number'),
        'attention_probs_dropout_prob': (0.1, 'number'),
        'max_position_embeddings': (512, 'int'),
        'type_vocab_size': (0, 'int'),
        'initializer_range': (0.02, 'float'),
        'layer_norm_eps': (1e-07, 'float'),
        'relative_attention': (False, 'bool'),
        'max_relative_positions': (-1, 'int'),
        'pad_token_id': (0, 'int?'),
        'bos_token_id': (None, 'int?'),
        'eos_token_id': (None, 'ids?'),
        'position_biased_input': (True, 'bool'),
        'pos_att_type': (None, 'strs|str?'),
        'pooler_dropout': (0.0, 'number'),
        'pooler_hidden_act': ('gelu', 'str'),
        'legacy': (True, 'bool'),
        'tie_word_embeddings': (True, 'bool'),
    },
    architectures={'DebertaV2ForMaskedLM': MASKED_LM, 'DebertaV2ForSequenceClassification': SEQUENCE_CLASSIFICATION,
                   'DebertaV2ForTokenClassification': TOKEN_CLASSIFICATION},
    default_architecture='DebertaV2ForMaskedLM',
    rope_theta_default=None, block='deberta_v2', base='deberta', qkv_bias=True, o_bias=True, mlp_bias=True,
    head_dim_key=False, classifier='classifier', classifier_dropout=('cls_dropout', 'hidden_dropout_prob'),
    post_init='deberta_v2', getattr_keys={   # read with getattr by the modeling code, with its defaults (models/deberta.py)
    'position_buckets': (-1, 'int'),
    'norm_rel_ebd': ('none', 'str'),
    'share_att_key': (False, 'bool'),
    'attention_head_size': (None, 'int?'),
    'embedding_size': (None, 'int?'),
    'conv_kernel_size': (0, 'int'),
    'cls_dropout': (None, 'number?'),
    'pooler_hidden_size': (None, 'int?'),
    },
)

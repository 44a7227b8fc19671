"""whisper: transformers' WhisperConfig as 5.24.0 defines it; models/whisper.py has its structure and what a step saves.

An encoder-decoder over speech: the encoder's two convolutions take 2 x max_source_positions log-mel frames of
num_mel_bins (the feature extractor pads every clip to 30 s), so the encoder always runs max_source_positions
positions; the decoder runs `training.seq_len` tokens. Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import CAUSAL_LM, Family, SEQ2SEQ_LM

FAMILY = Family(
    'whisper',
    'WhisperConfig',
    fields={
        'vocab_size': (51865, 'int'),
        'num_mel_bins': (80, 'int'),
        'encoder_layers': (4, 'int'),
        'encoder_attention_heads': (6, 'int'),
        'decoder_layers': (4, 'int'),
        'decoder_attention_heads': (6, 'int'),
        'decoder_ffn_dim': (1536, 'int'),
        'encoder_ffn_dim': (1536, 'int'),
        'encoder_layerdrop': (0.0, 'number'),
        'decoder_layerdrop': (0.0, 'number'),
        'decoder_start_token_id': (50257, 'int'),
        'use_cache': (True, 'bool'),
        'activation_function': ('gelu', 'str'),
        'd_model': (384, 'int'),
        'dropout': (0.0, 'number'),
        'attention_dropout': (0.0, 'number'),
        'activation_dropout': (0.0, 'number'),
        'init_std': (0.02, 'float'),
        'scale_embedding': (False, 'bool'),
        'max_source_positions': (1500, 'int'),
        'max_target_positions': (448, 'int'),
        'pad_token_id': (50256, 'int?'),
        'bos_token_id': (50256, 'int?'),
        'eos_token_id': (50256, 'ids?'),
        'suppress_tokens': (None, 'ints?'),
        'begin_suppress_tokens': ((220, 50256), 'ints?'),
        'use_weighted_layer_sum': (False, 'bool'),
        'classifier_proj_size': (256, 'int'),
        'apply_spec_augment': (False, 'bool'),
        'mask_time_prob': (0.05, 'number'),
        'mask_time_length': (10, 'int'),
        'mask_time_min_masks': (2, 'int'),
        'mask_feature_prob': (0.0, 'number'),
        'mask_feature_length': (10, 'int'),
        'mask_feature_min_masks': (0, 'int'),
        'median_filter_width': (7, 'int'),
        'tie_word_embeddings': (True, 'bool'),
        'is_encoder_decoder': (True, 'bool'),
    },
    architectures={'WhisperForConditionalGeneration': SEQ2SEQ_LM, 'WhisperForCausalLM': CAUSAL_LM},  # the decoder alone: the [trace] fallback
    default_architecture='WhisperForConditionalGeneration',
    attribute_map={'num_key_value_heads': 'encoder_attention_heads', 'num_attention_heads': 'encoder_attention_heads',
                   'hidden_size': 'd_model', 'num_hidden_layers': 'encoder_layers'},
    rope_theta_default=None, block='whisper', base='model', padding_idx=True, head_dim_key=False,
)

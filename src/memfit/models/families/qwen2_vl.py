"""qwen2_vl: transformers' Qwen2VLConfig as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES). Qwen2VLForConditionalGeneration: a vision transformer (Conv3d patch
embedding, 2D rotary, LayerNorm blocks attending within each image, a patch merger) and a Qwen2 text model rotated by
multimodal rotary positions (mrope). The structure fields describe the text model, which models/hf.py and
hf_activations.py see (models/qwen_vl.model_view flattens text_config to the top, the vision tower under "qwen_vl").
A config.json as Qwen publishes it is flat: Qwen2VLConfig.__post_init__ moves the text model's keys into text_config,
models/qwen_vl.py reads the text model's keys (TEXT_FIELDS) at either place.
"""

from memfit.models.families import CAUSAL_LM, Family

# Qwen2VLTextConfig (5.24.0)
TEXT_FIELDS = {
    'vocab_size': (152064, 'int'),
    'hidden_size': (8192, 'int'),
    'intermediate_size': (29568, 'int'),
    'num_hidden_layers': (80, 'int'),
    'num_attention_heads': (64, 'int'),
    'num_key_value_heads': (8, 'int?'),
    'hidden_act': ('silu', 'str'),
    'max_position_embeddings': (32768, 'int'),
    'initializer_range': (0.02, 'float'),
    'rms_norm_eps': (1e-05, 'float'),
    'use_cache': (True, 'bool'),
    'use_sliding_window': (False, 'bool?'),
    'sliding_window': (4096, 'int?'),
    'max_window_layers': (80, 'int?'),
    'layer_types': (None, 'strs?'),
    'attention_dropout': (0.0, 'number?'),
    'rope_parameters': (None, 'dict?'),
    'bos_token_id': (151643, 'int?'),
    'eos_token_id': (151645, 'ids?'),
    'pad_token_id': (None, 'int?'),
}
# Qwen2VLVisionConfig (5.24.0); attribute_map num_attention_heads -> num_heads, num_hidden_layers -> depth
VISION_FIELDS = {
    'depth': (32, 'int'),
    'embed_dim': (1280, 'int'),
    'hidden_size': (3584, 'int'),
    'hidden_act': ('quick_gelu', 'str'),
    'mlp_ratio': (4, 'number'),
    'num_heads': (16, 'int'),
    'in_channels': (3, 'int'),
    'patch_size': (14, 'int'),
    'spatial_merge_size': (2, 'int'),
    'temporal_patch_size': (2, 'int'),
    'initializer_range': (0.02, 'float'),
    'rope_parameters': (None, 'dict?'),
}

FAMILY = Family(
    'qwen2_vl',
    'Qwen2VLConfig',
    fields={
        'text_config': (None, 'dict?'),
        'vision_config': (None, 'dict?'),
        'image_token_id': (151655, 'int'),
        'video_token_id': (151656, 'int'),
        'vision_start_token_id': (151652, 'int'),
        'vision_end_token_id': (151653, 'int'),
        'tie_word_embeddings': (False, 'bool'),
    },
    architectures={'Qwen2VLForConditionalGeneration': CAUSAL_LM},
    default_architecture='Qwen2VLForConditionalGeneration',
    rope_theta_default=None, block='qwen2_vl', qkv_bias=True, head_dim_key=False,
)

"""qwen2_5_vl: transformers' Qwen2_5_VLConfig as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES). Qwen2_5_VLForConditionalGeneration is Qwen2-VL's model with its own
vision transformer: RMSNorm blocks, a gated SiLU MLP with biases, window attention (windows of window_size pixels) in
every block but fullatt_block_indexes, and an RMSNorm patch merger to out_hidden_size. The text model and its keys
are Qwen2-VL's (models/families/qwen2_vl.py TEXT_FIELDS; Qwen2_5_VLTextConfig has the same defaults).
"""

from memfit.models.families import CAUSAL_LM, Family
from memfit.models.families.qwen2_vl import TEXT_FIELDS  # noqa: F401  (the text model's keys: Qwen2-VL's)

# Qwen2_5_VLVisionConfig (5.24.0); attribute_map num_attention_heads -> num_heads, num_hidden_layers -> depth
VISION_FIELDS = {
    'depth': (32, 'int'),
    'hidden_size': (3584, 'int'),
    'hidden_act': ('silu', 'str'),
    'intermediate_size': (3420, 'int'),
    'num_heads': (16, 'int'),
    'in_channels': (3, 'int'),
    'patch_size': (14, 'int'),
    'spatial_merge_size': (2, 'int'),
    'temporal_patch_size': (2, 'int'),
    'tokens_per_second': (4, 'int'),
    'window_size': (112, 'int'),
    'out_hidden_size': (3584, 'int'),
    'fullatt_block_indexes': ([7, 15, 23, 31], 'ints?'),
    'initializer_range': (0.02, 'float'),
    'rope_parameters': (None, 'dict?'),
}

FAMILY = Family(
    'qwen2_5_vl',
    'Qwen2_5_VLConfig',
    fields={
        'text_config': (None, 'dict?'),
        'vision_config': (None, 'dict?'),
        'image_token_id': (151655, 'int'),
        'video_token_id': (151656, 'int'),
        'vision_start_token_id': (151652, 'int'),
        'vision_end_token_id': (151653, 'int'),
        'tie_word_embeddings': (False, 'bool'),
    },
    architectures={'Qwen2_5_VLForConditionalGeneration': CAUSAL_LM},
    default_architecture='Qwen2_5_VLForConditionalGeneration',
    rope_theta_default=None, block='qwen2_5_vl', qkv_bias=True, head_dim_key=False,
)

"""mllama: transformers' MllamaConfig as 5.24.0 defines it (Llama 3.2 Vision), and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES). MllamaForConditionalGeneration: a tiled vision transformer (Conv2d
patches per tile, gated positional and tile embeddings, a local transformer, then gated global layers, the features
of intermediate_layers_indices concatenated to the last), a multi-modal projector to the text width, and a Llama text
model whose cross_attention_layers attend to the projected image tokens (tanh-gated, q/k RMSNorm per head). The
structure fields describe the text model, which models/hf.py and hf_activations.py see (models/mllama.model_view
flattens text_config to the top, the vision tower under "mllama").
"""

from memfit.models.families import CAUSAL_LM, Family

# MllamaTextConfig (5.24.0)
TEXT_FIELDS = {
    'vocab_size': (128256, 'int'),
    'hidden_size': (4096, 'int'),
    'hidden_act': ('silu', 'str'),
    'num_hidden_layers': (40, 'int'),
    'num_attention_heads': (32, 'int'),
    'num_key_value_heads': (8, 'int'),
    'intermediate_size': (14336, 'int'),
    'rope_parameters': (None, 'dict?'),
    'rms_norm_eps': (1e-05, 'float'),
    'max_position_embeddings': (131072, 'int'),
    'initializer_range': (0.02, 'float'),
    'use_cache': (True, 'bool'),
    'tie_word_embeddings': (False, 'bool'),
    'cross_attention_layers': (None, 'ints?'),
    'dropout': (0.0, 'number'),
    'bos_token_id': (128000, 'int'),
    'eos_token_id': (128001, 'ids?'),
    'pad_token_id': (128004, 'int?'),
}
# MllamaVisionConfig (5.24.0); attribute_map num_attention_heads -> attention_heads
VISION_FIELDS = {
    'hidden_size': (1280, 'int'),
    'hidden_act': ('gelu', 'str'),
    'num_hidden_layers': (32, 'int'),
    'num_global_layers': (8, 'int'),
    'attention_heads': (16, 'int'),
    'num_channels': (3, 'int'),
    'intermediate_size': (5120, 'int'),
    'vision_output_dim': (7680, 'int'),
    'image_size': (448, 'int'),
    'patch_size': (14, 'int'),
    'norm_eps': (1e-05, 'float'),
    'max_num_tiles': (4, 'int'),
    'intermediate_layers_indices': (None, 'ints?'),
    'supported_aspect_ratios': (None, 'list?'),
    'initializer_range': (0.02, 'float'),
}

FAMILY = Family(
    'mllama',
    'MllamaConfig',
    fields={
        'vision_config': (None, 'dict?'),
        'text_config': (None, 'dict?'),
        'image_token_index': (128256, 'int'),
    },
    architectures={'MllamaForConditionalGeneration': CAUSAL_LM},
    default_architecture='MllamaForConditionalGeneration',
    attribute_map={'image_token_id': 'image_token_index'}, rope_theta_default=None, block='mllama', head_dim_key=False,
)

"""llava: transformers' LlavaConfig as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import CAUSAL_LM, Family

# LlavaForConditionalGeneration: a CLIP vision tower, a two-layer projector and a Llama text model. Its fields are
# LlavaConfig's; the structure fields below describe the text model, which models/hf.py and hf_activations.py see
# (hf_config.model_view flattens text_config to the top, the vision tower and projector under "llava")
FAMILY = Family(
    'llava',
    'LlavaConfig',
    fields={
        'vision_config': (None, 'dict?'),
        'text_config': (None, 'dict?'),
        'image_token_index': (32000, 'int'),
        'image_seq_length': (576, 'int'),
        'projector_hidden_act': ('gelu', 'str'),
        'vision_feature_select_strategy': ('default', 'str'),
        'vision_feature_layer': (-2, 'ids'),
        'multimodal_projector_bias': (True, 'bool'),
        'tie_word_embeddings': (False, 'bool'),
    },
    architectures={'LlavaForConditionalGeneration': CAUSAL_LM},
    default_architecture='LlavaForConditionalGeneration',
    attribute_map={'image_token_id': 'image_token_index'}, rope_theta_default=None, block='llava',
    qkv_bias='attention_bias', o_bias='attention_bias', mlp_bias='mlp_bias',
)

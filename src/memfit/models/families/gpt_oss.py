"""gpt_oss: transformers' GptOssConfig as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import Family, _arch

# gpt-oss (modeling_gpt_oss.py): Llama's attention with biases and a learned per-head `sinks` logit, layers alternating
# sliding (sliding_window) and full attention (layer_types, every second layer full), a biased router (`mlp.router`,
# weight and bias as bare parameters of GptOssTopKRouter), the experts as fused 3-D parameters with biases
# (gate_up_proj (E, h, 2I) interleaving gate and up columns, down_proj (E, I, h)), a clamped SwiGLU; yarn rope by
# default (GptOssConfig.__post_init__)
FAMILY = Family(
    'gpt_oss',
    'GptOssConfig',
    fields={
        'num_hidden_layers': (36, 'int'),
        'num_local_experts': (128, 'int'),
        'vocab_size': (201088, 'int'),
        'hidden_size': (2880, 'int'),
        'intermediate_size': (2880, 'int'),
        'head_dim': (64, 'int'),
        'num_attention_heads': (64, 'int'),
        'num_key_value_heads': (8, 'int'),
        'sliding_window': (128, 'int?'),
        'tie_word_embeddings': (False, 'bool'),
        'hidden_act': ('silu', 'str'),
        'initializer_range': (0.02, 'float'),
        'max_position_embeddings': (131072, 'int'),
        'rms_norm_eps': (1e-05, 'float'),
        'rope_parameters': (None, 'dict?'),
        'attention_dropout': (0.0, 'number'),
        'num_experts_per_tok': (4, 'int'),
        'swiglu_alpha': (1.702, 'number'),
        'swiglu_limit': (7.0, 'number'),
        'router_aux_loss_coef': (0.001, 'float'),
        'output_router_logits': (False, 'bool'),
        'use_cache': (True, 'bool'),
        'layer_types': (None, 'strs?'),
        'pad_token_id': (None, 'int?'),
        'bos_token_id': (None, 'int?'),
        'eos_token_id': (None, 'ids?'),
        'attention_bias': (True, 'bool'),
    },
    architectures=_arch('GptOss'),
    default_architecture='GptOssForCausalLM',
    attribute_map={'num_experts': 'num_local_experts'}, kv_heads_default=True, head_dim_default=True, layer_pattern=2,
    rope_theta_default=150000.0, post_init='gpt_oss', block='gpt_oss', qkv_bias='attention_bias', o_bias='attention_bias',
)

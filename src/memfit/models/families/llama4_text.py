"""llama4_text: transformers' Llama4TextConfig as 5.24.0 defines it, and the structure models/hf.py reads.

Data, loaded on demand (models.families.FAMILIES).
"""

from memfit.models.families import CAUSAL_LM, Family

# Llama4ForCausalLM (modeling_llama4.py): MoE layers (moe_layers, else every interleave_moe_layer_step-th) hold
# num_local_experts experts as two fused 3-D parameters, a router (nn.Linear, top-k then sigmoid) and a shared expert
# (a gated MLP of intermediate_size); the other layers a gated MLP of intermediate_size_mlp. no_rope_layers marks the
# rope layers (1) and the NoPE ones (0); rope layers attend in chunks of attention_chunk_size and L2-normalize q and k
# (use_qk_norm, no weight); NoPE layers scale q (attn_temperature_tuning)
FAMILY = Family(
    'llama4_text',
    'Llama4TextConfig',
    fields={
        'vocab_size': (202048, 'int'),
        'hidden_size': (5120, 'int'),
        'intermediate_size': (8192, 'int'),
        'intermediate_size_mlp': (16384, 'int'),
        'num_hidden_layers': (48, 'int'),
        'num_attention_heads': (40, 'int'),
        'num_key_value_heads': (8, 'int'),
        'head_dim': (128, 'int'),
        'hidden_act': ('silu', 'str'),
        'max_position_embeddings': (131072, 'int'),
        'initializer_range': (0.02, 'float'),
        'rms_norm_eps': (1e-05, 'float'),
        'use_cache': (True, 'bool'),
        'pad_token_id': (None, 'int?'),
        'bos_token_id': (1, 'int?'),
        'eos_token_id': (2, 'ids?'),
        'tie_word_embeddings': (False, 'bool'),
        'attention_dropout': (0.0, 'number'),
        'num_experts_per_tok': (1, 'int'),
        'num_local_experts': (16, 'int'),
        'moe_layers': (None, 'ints?'),
        'interleave_moe_layer_step': (1, 'int'),
        'use_qk_norm': (True, 'bool'),
        'output_router_logits': (False, 'bool'),
        'router_aux_loss_coef': (0.001, 'float'),
        'router_jitter_noise': (0.0, 'float'),
        'rope_parameters': (None, 'dict?'),
        'no_rope_layers': (None, 'ints?'),
        'no_rope_layer_interval': (4, 'int'),
        'attention_chunk_size': (8192, 'int?'),
        'layer_types': (None, 'strs?'),
        'attn_temperature_tuning': (True, 'bool'),
        'floor_scale': (8192, 'int'),
        'attn_scale': (0.1, 'number'),
        'attention_bias': (False, 'bool'),
    },
    architectures={'Llama4ForCausalLM': CAUSAL_LM},
    default_architecture='Llama4ForCausalLM',
    kv_heads_default=True, rope_theta_default=500000.0, post_init='llama4_text', block='llama4',
    qkv_bias='attention_bias', o_bias='attention_bias',
)

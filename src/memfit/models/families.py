"""The ten transformer families memfit derives from a Hugging Face config.json: data, no logic.

For each `model_type`: the fields of the transformers config class with their defaults and
accepted JSON types (transformers 5.24.0; tests/models/test_transformers_params.py compares every
default with the installed config class), its attribute aliases, the rules its __post_init__
applies, the architectures (`architectures[0]`) memfit models with the head each one has, and
the structure facts models/hf.py needs (module names, which projections carry a bias, how the
attention and MLP weights are laid out). memfit never imports transformers at run time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Field types as JSON gives them: "?" also accepts null; "number" is int or float;
# "ids" is an int or a list of ints; "ints" a list of ints; "strs" a list of strings.
TYPES = ("int", "int?", "float", "number", "number?", "bool", "bool?", "str", "str?", "ids?", "ints?", "strs?", "dict?")

# PreTrainedConfig's own fields, shared by every family.
BASE_FIELDS = {
    'transformers_version': (None, 'str?'),
    'architectures': (None, 'strs?'),
    'output_hidden_states': (False, 'bool?'),
    'return_dict': (True, 'bool?'),
    'dtype': (None, 'str?'),
    'chunk_size_feed_forward': (0, 'int'),
    'is_encoder_decoder': (False, 'bool'),
    'id2label': (None, 'dict?'),
    'label2id': (None, 'dict?'),
    'problem_type': (None, 'str?'),
}

# Keys transformers' PreTrainedConfig.__post_init__ drops from a config.json (GenerationConfig's
# parameters are popped unless the config class declares them; the rest are load-time options).
DROPPED_KEYS = frozenset(
    {
        "assistant_confidence_threshold", "assistant_lookbehind", "bad_words_ids", "begin_suppress_tokens",
        "diversity_penalty", "do_sample", "early_stopping", "encoder_no_repeat_ngram_size",
        "encoder_repetition_penalty", "epsilon_cutoff", "eta_cutoff", "exponential_decay_length_penalty",
        "forced_bos_token_id", "forced_eos_token_id", "length_penalty", "max_length", "min_length",
        "no_repeat_ngram_size", "num_assistant_tokens", "num_assistant_tokens_schedule", "num_beam_groups",
        "num_beams", "num_return_sequences", "output_scores", "remove_invalid_values", "repetition_penalty",
        "return_dict_in_generate", "suppress_tokens", "target_lookbehind", "temperature", "top_k", "top_p",
        "typical_p", "use_cache",
        "name_or_path", "_commit_hash", "attn_implementation", "experts_implementation",
        "_attn_implementation_internal", "_experts_implementation_internal", "per_layer_config",
    }
)

# The heads memfit models, by what the architecture's forward computes for training.
CAUSAL_LM = "causal-lm"  # next-token logits over the vocabulary, loss from shifted labels
MASKED_LM = "masked-lm"  # BERT's MLM head (transform + tied decoder), loss at every position
SEQUENCE_CLASSIFICATION = "sequence-classification"  # one score per sequence (num_labels)
SEQ2SEQ_LM = "seq2seq-lm"  # an encoder-decoder's decoder logits over the vocabulary, loss at every target position
HEADS = (CAUSAL_LM, MASKED_LM, SEQUENCE_CLASSIFICATION, SEQ2SEQ_LM)


@dataclass(frozen=True)
class Family:
    model_type: str
    config_class: str  # the transformers config class (tests compare defaults with it)
    fields: dict  # name -> (default, type)
    architectures: dict  # architectures[0] -> head
    default_architecture: str  # when config.json names none
    attribute_map: dict = field(default_factory=dict)  # alias -> field (GPT2Config's hidden_size -> n_embd)
    # __post_init__ rules, in the order the config class applies them
    kv_heads_default: bool = False  # num_key_value_heads None -> num_attention_heads
    head_dim_default: bool = False  # head_dim None -> hidden_size // num_attention_heads (stored)
    sliding_window_flag: bool = False  # sliding_window kept only when use_sliding_window (Qwen2/3)
    layer_types_default: bool = False  # layer_types filled per layer (Qwen2/3)
    gelu_means_tanh: bool = False  # Gemma: hidden_act "gelu" is read as "gelu_pytorch_tanh"
    rope_theta_default: float | None = 10000.0  # None: no rotary embedding (absolute positions)
    rope_legacy: dict = field(default_factory=dict)  # legacy top-level key -> rope_parameters key
    rope_partial_default: float | None = None  # partial_rotary_factor set when absent (GPT-NeoX, Phi-3)
    rope_partial_kept: bool = False  # Phi-3 also keeps a top-level partial_rotary_factor as an attribute
    # structure (models/hf.py)
    block: str = "llama"  # the decoder-layer layout: llama | phi3 | mixtral | gpt2 | bert | gpt_neox
    base: str = "model"  # the attribute that holds the base model in a head class
    qkv_bias: str | bool = False  # a bool, or the config key that decides it
    o_bias: str | bool = False
    mlp_bias: str | bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k
    padding_idx: bool = True  # the embedding takes pad_token_id as padding_idx (must lie in the vocabulary)
    head_dim_key: bool = True  # the attention reads config.head_dim when set
    post_init: str = ""  # a family's own __post_init__ rule set, by name (models/hf_config._POST_INIT): "t5", "qwen2_moe", ...
    # issue 21's dense decoders (appended; every default keeps the ten families as they were)
    layer_pattern: int | None = None  # layer_types None -> every `pattern`-th layer full, the rest sliding (Gemma 2/3)
    layer_pattern_key: str | None = None  # a config.json key that sets the pattern (Gemma 3's sliding_window_pattern)
    layer_norms: tuple = ("input_layernorm", "post_attention_layernorm")  # a layer's norms, in registration order
    qk_norm_full: bool = False  # OLMo 2: q_norm / k_norm over the whole projection (H*d, KV*d), not per head
    qk_norm_key: str | None = None  # Cohere: the config key that turns q_norm / k_norm on (use_qk_norm), weights (heads, d)
    norm_type: str = "rmsnorm"  # Starcoder2: nn.LayerNorm (weight and bias) for the layer and final norms
    plain_mlp: tuple | None = None  # Starcoder2: (fc_in, fc_out) of a plain MLP instead of the gated one
    nope_layers: bool = False  # SmolLM3: no_rope_layers filled from no_rope_layer_interval, then layer_types from them
    rope_per_layer_type: bool = False  # Gemma 3: rope_parameters per layer type (full: rope_theta, rope_scaling;
    # sliding: rope_local_base_freq), rope_theta_default then {"global": ..., "local": ...}
    kv_heads_key: str = "num_key_value_heads"  # Falcon: num_kv_heads (kv_heads_default fills it)
    init_aliases: dict = field(default_factory=dict)  # Falcon: n_embed -> hidden_size (popped by __post_init__, not attribute_map)
    ffn_default: str | None = None  # Falcon: ffn_hidden_size None -> 4 * hidden_size

    @property
    def hidden_key(self) -> str:
        return self.attribute_map.get("hidden_size", "hidden_size")

    @property
    def heads_key(self) -> str:
        return self.attribute_map.get("num_attention_heads", "num_attention_heads")

    @property
    def stacked(self) -> bool:
        """An encoder-decoder: more than one stack of layers (models/hf_encdec.py)."""
        return self.block in STACKED


# Blocks of encoder-decoder families: their structure is in models/hf_encdec.py.
STACKED = ("t5",)


def _arch(prefix: str, causal: str = "ForCausalLM") -> dict:
    return {f"{prefix}{causal}": CAUSAL_LM, f"{prefix}ForSequenceClassification": SEQUENCE_CLASSIFICATION}


FAMILIES: dict[str, Family] = {
    'llama': Family(
        'llama',
        'LlamaConfig',
        fields={
            'vocab_size': (32000, 'int'),
            'hidden_size': (4096, 'int'),
            'intermediate_size': (11008, 'int'),
            'num_hidden_layers': (32, 'int'),
            'num_attention_heads': (32, 'int'),
            'num_key_value_heads': (None, 'int?'),
            'hidden_act': ('silu', 'str'),
            'max_position_embeddings': (2048, 'int'),
            'initializer_range': (0.02, 'float'),
            'rms_norm_eps': (1e-06, 'float'),
            'use_cache': (True, 'bool'),
            'pad_token_id': (None, 'int?'),
            'bos_token_id': (1, 'int?'),
            'eos_token_id': (2, 'ids?'),
            'pretraining_tp': (1, 'int?'),
            'tie_word_embeddings': (False, 'bool'),
            'rope_parameters': (None, 'dict?'),
            'attention_bias': (False, 'bool'),
            'attention_dropout': (0.0, 'number?'),
            'mlp_bias': (False, 'bool'),
            'head_dim': (None, 'int?'),
        },
        architectures=_arch('Llama'),
        default_architecture='LlamaForCausalLM',
        kv_heads_default=True, head_dim_default=True, qkv_bias='attention_bias', o_bias='attention_bias', mlp_bias='mlp_bias',
    ),
    'mistral': Family(
        'mistral',
        'MistralConfig',
        fields={
            'vocab_size': (32000, 'int'),
            'hidden_size': (4096, 'int'),
            'intermediate_size': (14336, 'int'),
            'num_hidden_layers': (32, 'int'),
            'num_attention_heads': (32, 'int'),
            'num_key_value_heads': (8, 'int'),
            'head_dim': (None, 'int?'),
            'hidden_act': ('silu', 'str'),
            'max_position_embeddings': (131072, 'int'),
            'initializer_range': (0.02, 'float'),
            'rms_norm_eps': (1e-06, 'float'),
            'use_cache': (True, 'bool'),
            'pad_token_id': (None, 'int?'),
            'bos_token_id': (1, 'int?'),
            'eos_token_id': (2, 'ids?'),
            'tie_word_embeddings': (False, 'bool'),
            'rope_parameters': (None, 'dict?'),
            'sliding_window': (4096, 'int?'),
            'attention_dropout': (0.0, 'number'),
        },
        architectures=_arch('Mistral'),
        default_architecture='MistralForCausalLM',
        kv_heads_default=True, head_dim_default=True,
    ),
    'qwen2': Family(
        'qwen2',
        'Qwen2Config',
        fields={
            'vocab_size': (151936, 'int'),
            'hidden_size': (4096, 'int'),
            'intermediate_size': (22016, 'int'),
            'num_hidden_layers': (32, 'int'),
            'num_attention_heads': (32, 'int'),
            'num_key_value_heads': (32, 'int?'),
            'hidden_act': ('silu', 'str'),
            'max_position_embeddings': (32768, 'int'),
            'initializer_range': (0.02, 'float'),
            'rms_norm_eps': (1e-06, 'float'),
            'use_cache': (True, 'bool'),
            'tie_word_embeddings': (False, 'bool'),
            'rope_parameters': (None, 'dict?'),
            'use_sliding_window': (False, 'bool'),
            'sliding_window': (4096, 'int?'),
            'max_window_layers': (28, 'int'),
            'layer_types': (None, 'strs?'),
            'attention_dropout': (0.0, 'number'),
            'pad_token_id': (None, 'int?'),
            'bos_token_id': (None, 'int?'),
            'eos_token_id': (None, 'ids?'),
        },
        architectures=_arch('Qwen2'),
        default_architecture='Qwen2ForCausalLM',
        kv_heads_default=True, sliding_window_flag=True, layer_types_default=True, qkv_bias=True,
    ),
    'qwen3': Family(
        'qwen3',
        'Qwen3Config',
        fields={
            'vocab_size': (151936, 'int'),
            'hidden_size': (4096, 'int'),
            'intermediate_size': (22016, 'int'),
            'num_hidden_layers': (32, 'int'),
            'num_attention_heads': (32, 'int'),
            'num_key_value_heads': (32, 'int?'),
            'head_dim': (128, 'int'),
            'hidden_act': ('silu', 'str'),
            'max_position_embeddings': (32768, 'int'),
            'initializer_range': (0.02, 'float'),
            'rms_norm_eps': (1e-06, 'float'),
            'use_cache': (True, 'bool'),
            'tie_word_embeddings': (False, 'bool'),
            'rope_parameters': (None, 'dict?'),
            'attention_bias': (False, 'bool'),
            'use_sliding_window': (False, 'bool'),
            'sliding_window': (4096, 'int?'),
            'max_window_layers': (28, 'int'),
            'layer_types': (None, 'strs?'),
            'attention_dropout': (0.0, 'number'),
            'pad_token_id': (None, 'int?'),
            'bos_token_id': (None, 'int?'),
            'eos_token_id': (None, 'ids?'),
        },
        architectures=_arch('Qwen3'),
        default_architecture='Qwen3ForCausalLM',
        kv_heads_default=True, sliding_window_flag=True, layer_types_default=True, qkv_bias='attention_bias', o_bias='attention_bias', qk_norm=True,
    ),
    'gemma': Family(
        'gemma',
        'GemmaConfig',
        fields={
            'vocab_size': (256000, 'int'),
            'hidden_size': (3072, 'int'),
            'intermediate_size': (24576, 'int'),
            'num_hidden_layers': (28, 'int'),
            'num_attention_heads': (16, 'int'),
            'num_key_value_heads': (16, 'int'),
            'head_dim': (256, 'int'),
            'hidden_act': ('gelu_pytorch_tanh', 'str'),
            'max_position_embeddings': (8192, 'int'),
            'initializer_range': (0.02, 'float'),
            'rms_norm_eps': (1e-06, 'float'),
            'use_cache': (True, 'bool'),
            'pad_token_id': (0, 'int?'),
            'eos_token_id': (1, 'ids?'),
            'bos_token_id': (2, 'int?'),
            'tie_word_embeddings': (True, 'bool'),
            'rope_parameters': (None, 'dict?'),
            'attention_bias': (False, 'bool'),
            'attention_dropout': (0.0, 'number'),
            'use_bidirectional_attention': (None, 'bool?'),
        },
        architectures=_arch('Gemma'),
        default_architecture='GemmaForCausalLM',
        gelu_means_tanh=True, qkv_bias='attention_bias', o_bias='attention_bias',
    ),
    'phi3': Family(
        'phi3',
        'Phi3Config',
        fields={
            'vocab_size': (32064, 'int'),
            'hidden_size': (3072, 'int'),
            'intermediate_size': (8192, 'int'),
            'num_hidden_layers': (32, 'int'),
            'num_attention_heads': (32, 'int'),
            'num_key_value_heads': (None, 'int?'),
            'resid_pdrop': (0.0, 'number'),
            'embd_pdrop': (0.0, 'number'),
            'attention_dropout': (0.0, 'number'),
            'hidden_act': ('silu', 'str'),
            'max_position_embeddings': (4096, 'int'),
            'original_max_position_embeddings': (4096, 'int'),
            'initializer_range': (0.02, 'float'),
            'rms_norm_eps': (1e-05, 'float'),
            'use_cache': (True, 'bool'),
            'tie_word_embeddings': (False, 'bool'),
            'rope_parameters': (None, 'dict?'),
            'bos_token_id': (1, 'int?'),
            'eos_token_id': (32000, 'ids?'),
            'pad_token_id': (32000, 'int?'),
            'sliding_window': (None, 'int?'),
        },
        architectures=_arch('Phi3'),
        default_architecture='Phi3ForCausalLM',
        kv_heads_default=True, rope_partial_default=1.0, rope_partial_kept=True, block='phi3',
    ),
    'gpt2': Family(
        'gpt2',
        'GPT2Config',
        fields={
            'vocab_size': (50257, 'int'),
            'n_positions': (1024, 'int'),
            'n_embd': (768, 'int'),
            'n_layer': (12, 'int'),
            'n_head': (12, 'int'),
            'n_inner': (None, 'int?'),
            'activation_function': ('gelu_new', 'str'),
            'resid_pdrop': (0.1, 'number'),
            'embd_pdrop': (0.1, 'number'),
            'attn_pdrop': (0.1, 'number'),
            'layer_norm_epsilon': (1e-05, 'float'),
            'initializer_range': (0.02, 'float'),
            'summary_type': ('cls_index', 'str'),
            'summary_use_proj': (True, 'bool'),
            'summary_activation': (None, 'str?'),
            'summary_proj_to_labels': (True, 'bool'),
            'summary_first_dropout': (0.1, 'number'),
            'scale_attn_weights': (True, 'bool'),
            'use_cache': (True, 'bool'),
            'bos_token_id': (50256, 'int?'),
            'eos_token_id': (50256, 'ids?'),
            'pad_token_id': (None, 'int?'),
            'scale_attn_by_inverse_layer_idx': (False, 'bool'),
            'reorder_and_upcast_attn': (False, 'bool'),
            'add_cross_attention': (False, 'bool'),
            'tie_word_embeddings': (True, 'bool'),
        },
        architectures=_arch('GPT2', 'LMHeadModel'),
        default_architecture='GPT2LMHeadModel',
        attribute_map={'hidden_size': 'n_embd', 'max_position_embeddings': 'n_positions', 'num_attention_heads': 'n_head', 'num_hidden_layers': 'n_layer'}, rope_theta_default=None, block='gpt2', base='transformer', qkv_bias=True, o_bias=True, mlp_bias=True, padding_idx=False, head_dim_key=False,
    ),
    'bert': Family(
        'bert',
        'BertConfig',
        fields={
            'vocab_size': (30522, 'int'),
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
            'pad_token_id': (0, 'int?'),
            'use_cache': (True, 'bool'),
            'classifier_dropout': (None, 'number?'),
            'is_decoder': (False, 'bool'),
            'add_cross_attention': (False, 'bool'),
            'bos_token_id': (None, 'int?'),
            'eos_token_id': (None, 'ids?'),
            'tie_word_embeddings': (True, 'bool'),
        },
        architectures={'BertForMaskedLM': MASKED_LM, 'BertLMHeadModel': CAUSAL_LM, 'BertForSequenceClassification': SEQUENCE_CLASSIFICATION},
        default_architecture='BertForMaskedLM',
        rope_theta_default=None, block='bert', base='bert', qkv_bias=True, o_bias=True, mlp_bias=True, head_dim_key=False,
    ),
    'gpt_neox': Family(
        'gpt_neox',
        'GPTNeoXConfig',
        fields={
            'vocab_size': (50432, 'int'),
            'hidden_size': (6144, 'int'),
            'num_hidden_layers': (44, 'int'),
            'num_attention_heads': (64, 'int'),
            'intermediate_size': (24576, 'int'),
            'hidden_act': ('gelu', 'str'),
            'attention_dropout': (0.0, 'number'),
            'hidden_dropout': (0.0, 'number'),
            'classifier_dropout': (0.1, 'number'),
            'max_position_embeddings': (2048, 'int'),
            'initializer_range': (0.02, 'float'),
            'layer_norm_eps': (1e-05, 'float'),
            'use_cache': (True, 'bool'),
            'bos_token_id': (0, 'int?'),
            'eos_token_id': (2, 'ids?'),
            'pad_token_id': (None, 'int?'),
            'tie_word_embeddings': (False, 'bool'),
            'use_parallel_residual': (True, 'bool'),
            'rope_parameters': (None, 'dict?'),
            'attention_bias': (True, 'bool'),
            'is_decoder': (False, 'bool'),
        },
        architectures=_arch('GPTNeoX'),
        default_architecture='GPTNeoXForCausalLM',
        rope_legacy={'rotary_emb_base': 'rope_theta', 'rotary_pct': 'partial_rotary_factor'}, rope_partial_default=0.25, block='gpt_neox', base='gpt_neox', qkv_bias='attention_bias', o_bias='attention_bias', mlp_bias=True, padding_idx=False, head_dim_key=False,
    ),
    'mixtral': Family(
        'mixtral',
        'MixtralConfig',
        fields={
            'vocab_size': (32000, 'int'),
            'hidden_size': (4096, 'int'),
            'intermediate_size': (14336, 'int'),
            'num_hidden_layers': (32, 'int'),
            'num_attention_heads': (32, 'int'),
            'num_key_value_heads': (8, 'int'),
            'head_dim': (None, 'int?'),
            'hidden_act': ('silu', 'str'),
            'max_position_embeddings': (131072, 'int'),
            'initializer_range': (0.02, 'float'),
            'rms_norm_eps': (1e-05, 'float'),
            'use_cache': (True, 'bool'),
            'pad_token_id': (None, 'int?'),
            'bos_token_id': (1, 'int?'),
            'eos_token_id': (2, 'ids?'),
            'tie_word_embeddings': (False, 'bool'),
            'sliding_window': (None, 'int?'),
            'attention_dropout': (0.0, 'number'),
            'num_experts_per_tok': (2, 'int'),
            'num_local_experts': (8, 'int'),
            'output_router_logits': (False, 'bool'),
            'router_aux_loss_coef': (0.001, 'float'),
            'router_jitter_noise': (0.0, 'float'),
            'rope_parameters': (None, 'dict?'),
        },
        architectures=_arch('Mixtral'),
        default_architecture='MixtralForCausalLM',
        attribute_map={'num_experts': 'num_local_experts'}, kv_heads_default=True, rope_theta_default=1000000.0, block='mixtral',
    ),
    # --- encoder-decoder families (models/hf_encdec.py) -------------------------------------------
    't5': Family(
        't5',
        'T5Config',
        fields={
            'vocab_size': (32128, 'int'),
            'd_model': (512, 'int'),
            'd_kv': (64, 'int'),
            'd_ff': (2048, 'int'),
            'num_layers': (6, 'int'),
            'num_decoder_layers': (None, 'int?'),
            'num_heads': (8, 'int'),
            'relative_attention_num_buckets': (32, 'int'),
            'relative_attention_max_distance': (128, 'int'),
            'dropout_rate': (0.1, 'number'),
            'layer_norm_epsilon': (1e-06, 'float'),
            'initializer_factor': (1.0, 'number'),
            'feed_forward_proj': ('relu', 'str'),
            'is_encoder_decoder': (True, 'bool'),
            'use_cache': (True, 'bool'),
            'pad_token_id': (0, 'int?'),
            'eos_token_id': (1, 'ids?'),
            'classifier_dropout': (0.0, 'number'),
            'is_decoder': (False, 'bool'),
        },
        architectures={'T5ForConditionalGeneration': SEQ2SEQ_LM},
        default_architecture='T5ForConditionalGeneration',
        attribute_map={'hidden_size': 'd_model', 'num_attention_heads': 'num_heads', 'num_hidden_layers': 'num_layers', 'head_dim': 'd_kv'},
        rope_theta_default=None, block='t5', base='', padding_idx=False, head_dim_key=False, post_init='t5',
    ),
}


# ---------------------------------------------------------------------------------------------
# Issue 21: the dense decoders (gemma2, gemma3_text, olmo2, granite, cohere, starcoder2, falcon, smollm3)

FAMILIES.update({
    'gemma2': Family(
        'gemma2',
        'Gemma2Config',
        fields={
            'vocab_size': (256000, 'int'),
            'hidden_size': (2304, 'int'),
            'intermediate_size': (9216, 'int'),
            'num_hidden_layers': (26, 'int'),
            'num_attention_heads': (8, 'int'),
            'num_key_value_heads': (4, 'int'),
            'head_dim': (256, 'int'),
            'hidden_activation': ('gelu_pytorch_tanh', 'str'),
            'max_position_embeddings': (8192, 'int'),
            'initializer_range': (0.02, 'float'),
            'rms_norm_eps': (1e-06, 'float'),
            'use_cache': (True, 'bool'),
            'pad_token_id': (0, 'int?'),
            'eos_token_id': (1, 'ids?'),
            'bos_token_id': (2, 'int?'),
            'tie_word_embeddings': (True, 'bool'),
            'rope_parameters': (None, 'dict?'),
            'attention_bias': (False, 'bool'),
            'attention_dropout': (0.0, 'number?'),
            'query_pre_attn_scalar': (256, 'int'),
            'sliding_window': (4096, 'int?'),
            'layer_types': (None, 'strs?'),
            'final_logit_softcapping': (30.0, 'number?'),
            'attn_logit_softcapping': (50.0, 'number?'),
            'use_bidirectional_attention': (None, 'bool?'),
        },
        architectures=_arch('Gemma2'),
        default_architecture='Gemma2ForCausalLM',
        qkv_bias='attention_bias', o_bias='attention_bias', layer_pattern=2,
        layer_norms=("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"),
    ),
    'gemma3_text': Family(
        'gemma3_text',
        'Gemma3TextConfig',
        fields={
            'vocab_size': (262208, 'int'),
            'hidden_size': (2304, 'int'),
            'intermediate_size': (9216, 'int'),
            'num_hidden_layers': (26, 'int'),
            'num_attention_heads': (8, 'int'),
            'num_key_value_heads': (4, 'int'),
            'head_dim': (256, 'int'),
            'hidden_activation': ('gelu_pytorch_tanh', 'str'),
            'max_position_embeddings': (131072, 'int'),
            'initializer_range': (0.02, 'float'),
            'rms_norm_eps': (1e-06, 'float'),
            'use_cache': (True, 'bool'),
            'pad_token_id': (0, 'int?'),
            'eos_token_id': (1, 'ids?'),
            'bos_token_id': (2, 'int?'),
            'tie_word_embeddings': (True, 'bool'),
            'rope_parameters': (None, 'dict?'),
            'attention_bias': (False, 'bool'),
            'attention_dropout': (0.0, 'number?'),
            'query_pre_attn_scalar': (256, 'int'),
            'sliding_window': (4096, 'int?'),
            'layer_types': (None, 'strs?'),
            'final_logit_softcapping': (None, 'number?'),
            'attn_logit_softcapping': (None, 'number?'),
            'use_bidirectional_attention': (False, 'bool?'),
        },
        architectures={'Gemma3ForCausalLM': CAUSAL_LM, 'Gemma3TextForSequenceClassification': SEQUENCE_CLASSIFICATION},
        default_architecture='Gemma3ForCausalLM',
        qkv_bias='attention_bias', o_bias='attention_bias', qk_norm=True, layer_pattern=6,
        layer_pattern_key='sliding_window_pattern', rope_per_layer_type=True, rope_legacy={'rope_local_base_freq': 'rope_theta'},
        rope_theta_default={'global': 1000000.0, 'local': 10000.0},
        layer_norms=("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"),
    ),
    'cohere': Family(
        'cohere',
        'CohereConfig',
        fields={
            'vocab_size': (256000, 'int'),
            'hidden_size': (8192, 'int'),
            'intermediate_size': (22528, 'int'),
            'logit_scale': (0.0625, 'number?'),
            'num_hidden_layers': (40, 'int'),
            'num_attention_heads': (64, 'int'),
            'num_key_value_heads': (None, 'int?'),
            'hidden_act': ('silu', 'str'),
            'max_position_embeddings': (8192, 'int'),
            'initializer_range': (0.02, 'float'),
            'layer_norm_eps': (1e-05, 'number?'),
            'use_cache': (True, 'bool'),
            'pad_token_id': (0, 'int?'),
            'bos_token_id': (5, 'int?'),
            'eos_token_id': (255001, 'ids?'),
            'tie_word_embeddings': (True, 'bool'),
            'rope_parameters': (None, 'dict?'),
            'attention_bias': (False, 'bool'),
            'attention_dropout': (0.0, 'number?'),
            'use_qk_norm': (False, 'bool?'),
        },
        architectures={'CohereForCausalLM': CAUSAL_LM},
        default_architecture='CohereForCausalLM',
        kv_heads_default=True, qkv_bias='attention_bias', o_bias='attention_bias', qk_norm_key='use_qk_norm',
        rope_theta_default=500000.0, layer_norms=("input_layernorm",),
    ),
    'starcoder2': Family(
        'starcoder2',
        'Starcoder2Config',
        fields={
            'vocab_size': (49152, 'int'),
            'hidden_size': (3072, 'int'),
            'intermediate_size': (12288, 'int'),
            'num_hidden_layers': (30, 'int'),
            'num_attention_heads': (24, 'int'),
            'num_key_value_heads': (2, 'int'),
            'hidden_act': ('gelu_pytorch_tanh', 'str'),
            'max_position_embeddings': (4096, 'int'),
            'initializer_range': (0.018042, 'float'),
            'norm_epsilon': (1e-05, 'float'),
            'use_cache': (True, 'bool'),
            'bos_token_id': (50256, 'int?'),
            'eos_token_id': (50256, 'ids?'),
            'pad_token_id': (None, 'int?'),
            'rope_parameters': (None, 'dict?'),
            'sliding_window': (None, 'int?'),
            'attention_dropout': (0.0, 'number'),
            'residual_dropout': (0.0, 'number'),
            'embedding_dropout': (0.0, 'number'),
            'use_bias': (True, 'bool'),
            'tie_word_embeddings': (True, 'bool'),
        },
        architectures=_arch('Starcoder2'),
        default_architecture='Starcoder2ForCausalLM',
        qkv_bias='use_bias', o_bias='use_bias', mlp_bias='use_bias', norm_type='layernorm', plain_mlp=('mlp.c_fc', 'mlp.c_proj'),
    ),
    'smollm3': Family(
        'smollm3',
        'SmolLM3Config',
        fields={
            'vocab_size': (128256, 'int'),
            'hidden_size': (2048, 'int'),
            'intermediate_size': (11008, 'int'),
            'num_hidden_layers': (36, 'int'),
            'num_attention_heads': (16, 'int'),
            'num_key_value_heads': (4, 'int?'),
            'hidden_act': ('silu', 'str'),
            'max_position_embeddings': (32768, 'int'),
            'initializer_range': (0.02, 'float'),
            'rms_norm_eps': (1e-06, 'float'),
            'use_cache': (True, 'bool'),
            'pad_token_id': (128004, 'int?'),
            'bos_token_id': (128000, 'int?'),
            'eos_token_id': (128001, 'ids?'),
            'rope_parameters': (None, 'dict?'),
            'use_sliding_window': (False, 'bool'),
            'sliding_window': (None, 'int?'),
            'no_rope_layers': (None, 'ids?'),
            'no_rope_layer_interval': (4, 'int'),
            'layer_types': (None, 'strs?'),
            'attention_bias': (False, 'bool'),
            'attention_dropout': (0.0, 'number'),
            'mlp_bias': (False, 'bool'),
            'tie_word_embeddings': (True, 'bool'),
        },
        architectures=_arch('SmolLM3'),
        default_architecture='SmolLM3ForCausalLM',
        kv_heads_default=True, qkv_bias='attention_bias', o_bias='attention_bias', mlp_bias='mlp_bias', nope_layers=True,
        rope_theta_default=2000000.0,
    ),
    'olmo2': Family(
        'olmo2',
        'Olmo2Config',
        fields={
            'vocab_size': (50304, 'int'),
            'hidden_size': (4096, 'int'),
            'intermediate_size': (11008, 'int'),
            'num_hidden_layers': (32, 'int'),
            'num_attention_heads': (32, 'int'),
            'num_key_value_heads': (None, 'int?'),
            'hidden_act': ('silu', 'str'),
            'max_position_embeddings': (2048, 'int'),
            'initializer_range': (0.02, 'float'),
            'use_cache': (True, 'bool'),
            'pad_token_id': (1, 'int?'),
            'bos_token_id': (None, 'int?'),
            'eos_token_id': (50279, 'ids?'),
            'tie_word_embeddings': (False, 'bool'),
            'rope_parameters': (None, 'dict?'),
            'attention_bias': (False, 'bool'),
            'attention_dropout': (0.0, 'number'),
            'rms_norm_eps': (1e-05, 'float'),
        },
        architectures=_arch('Olmo2'),
        default_architecture='Olmo2ForCausalLM',
        kv_heads_default=True, qkv_bias='attention_bias', o_bias='attention_bias', qk_norm=True, qk_norm_full=True,
        layer_norms=("post_attention_layernorm", "post_feedforward_layernorm"),
    ),
    'granite': Family(
        'granite',
        'GraniteConfig',
        fields={
            'vocab_size': (32000, 'int'),
            'hidden_size': (4096, 'int'),
            'intermediate_size': (11008, 'int'),
            'num_hidden_layers': (32, 'int'),
            'num_attention_heads': (32, 'int'),
            'num_key_value_heads': (None, 'int?'),
            'hidden_act': ('silu', 'str'),
            'max_position_embeddings': (2048, 'int'),
            'initializer_range': (0.02, 'float'),
            'rms_norm_eps': (1e-06, 'float'),
            'use_cache': (True, 'bool'),
            'pad_token_id': (None, 'int?'),
            'bos_token_id': (1, 'int?'),
            'eos_token_id': (2, 'ids?'),
            'tie_word_embeddings': (False, 'bool'),
            'rope_parameters': (None, 'dict?'),
            'attention_bias': (False, 'bool'),
            'attention_dropout': (0.0, 'number'),
            'mlp_bias': (False, 'bool'),
            'embedding_multiplier': (1.0, 'number'),
            'logits_scaling': (1.0, 'number'),
            'residual_multiplier': (1.0, 'number'),
            'attention_multiplier': (1.0, 'number'),
        },
        architectures={'GraniteForCausalLM': CAUSAL_LM},
        default_architecture='GraniteForCausalLM',
        kv_heads_default=True, qkv_bias='attention_bias', o_bias='attention_bias', mlp_bias='mlp_bias',
    ),
    'falcon': Family(
        'falcon',
        'FalconConfig',
        fields={
            'vocab_size': (65024, 'int'),
            'hidden_size': (4544, 'int'),
            'num_hidden_layers': (32, 'int'),
            'num_attention_heads': (71, 'int'),
            'num_ln_in_parallel_attn': (None, 'int?'),
            'layer_norm_epsilon': (1e-05, 'number?'),
            'initializer_range': (0.02, 'float'),
            'use_cache': (True, 'bool'),
            'hidden_dropout': (0.0, 'number?'),
            'attention_dropout': (0.0, 'number?'),
            'num_kv_heads': (None, 'int?'),
            'alibi': (False, 'bool?'),
            'new_decoder_architecture': (False, 'bool?'),
            'multi_query': (True, 'bool?'),
            'parallel_attn': (True, 'bool?'),
            'bias': (False, 'bool?'),
            'max_position_embeddings': (2048, 'int'),
            'rope_parameters': (None, 'dict?'),
            'bos_token_id': (11, 'int?'),
            'eos_token_id': (11, 'ids?'),
            'pad_token_id': (None, 'int?'),
            'ffn_hidden_size': (None, 'int?'),
            'activation': ('gelu', 'str?'),
            'tie_word_embeddings': (True, 'bool'),
        },
        architectures=_arch('Falcon'),
        default_architecture='FalconForCausalLM',
        kv_heads_default=True, kv_heads_key='num_kv_heads', init_aliases={'n_embed': 'hidden_size'}, ffn_default='ffn_hidden_size',
        block='falcon', base='transformer', qkv_bias='bias', o_bias='bias', mlp_bias='bias', norm_type='layernorm',
        padding_idx=False, head_dim_key=False,
    ),
    # LlavaForConditionalGeneration: a CLIP vision tower, a two-layer projector and a Llama text model. Its fields are
    # LlavaConfig's; the structure fields below describe the text model, which models/hf.py and hf_activations.py see
    # (hf_config.model_view flattens text_config to the top, the vision tower and projector under "llava")
    'llava': Family(
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
    ),
})

# --- mixtures of experts (issue 21) -----------------------------------------------------------
# Qwen2-MoE and Qwen3-MoE: a layer is a sparse MoE block unless it is in mlp_only_layers or (i + 1) is not a
# multiple of decoder_sparse_step (then a dense MLP of intermediate_size). Qwen2-MoE adds a shared expert (a dense
# MLP of shared_expert_intermediate_size) scaled by sigmoid(shared_expert_gate(x)).
_QWEN_MOE_FIELDS = {
    'vocab_size': (151936, 'int'),
    'hidden_size': (2048, 'int'),
}
FAMILIES.update({
    'qwen2_moe': Family(
        'qwen2_moe',
        'Qwen2MoeConfig',
        fields={
            **_QWEN_MOE_FIELDS,
            'intermediate_size': (5632, 'int'),
            'num_hidden_layers': (24, 'int'),
            'num_attention_heads': (16, 'int'),
            'num_key_value_heads': (16, 'int?'),
            'hidden_act': ('silu', 'str'),
            'max_position_embeddings': (32768, 'int'),
            'initializer_range': (0.02, 'float'),
            'rms_norm_eps': (1e-06, 'float'),
            'use_cache': (True, 'bool'),
            'tie_word_embeddings': (False, 'bool'),
            'rope_parameters': (None, 'dict?'),
            'use_sliding_window': (False, 'bool'),
            'sliding_window': (4096, 'int?'),
            'max_window_layers': (28, 'int'),
            'attention_dropout': (0.0, 'number'),
            'decoder_sparse_step': (1, 'int'),
            'moe_intermediate_size': (1408, 'int'),
            'shared_expert_intermediate_size': (5632, 'int'),
            'num_experts_per_tok': (4, 'int'),
            'num_experts': (60, 'int'),
            'norm_topk_prob': (False, 'bool'),
            'output_router_logits': (False, 'bool'),
            'router_aux_loss_coef': (0.001, 'float'),
            'mlp_only_layers': (None, 'ints?'),
            'qkv_bias': (True, 'bool'),
            'layer_types': (None, 'strs?'),
            'pad_token_id': (None, 'int?'),
            'bos_token_id': (None, 'int?'),
            'eos_token_id': (None, 'ids?'),
        },
        architectures=_arch('Qwen2Moe'),
        default_architecture='Qwen2MoeForCausalLM',
        kv_heads_default=True, post_init='qwen2_moe', block='qwen2_moe', qkv_bias='qkv_bias',
    ),
    'qwen3_moe': Family(
        'qwen3_moe',
        'Qwen3MoeConfig',
        fields={
            **_QWEN_MOE_FIELDS,
            'intermediate_size': (6144, 'int'),
            'num_hidden_layers': (24, 'int'),
            'num_attention_heads': (32, 'int'),
            'num_key_value_heads': (4, 'int'),
            'hidden_act': ('silu', 'str'),
            'max_position_embeddings': (32768, 'int'),
            'initializer_range': (0.02, 'float'),
            'rms_norm_eps': (1e-06, 'float'),
            'use_cache': (True, 'bool'),
            'tie_word_embeddings': (False, 'bool'),
            'rope_parameters': (None, 'dict?'),
            'attention_bias': (False, 'bool'),
            'use_sliding_window': (False, 'bool'),
            'sliding_window': (4096, 'int?'),
            'attention_dropout': (0.0, 'number'),
            'decoder_sparse_step': (1, 'int'),
            'moe_intermediate_size': (768, 'int'),
            'num_experts_per_tok': (8, 'int'),
            'num_experts': (128, 'int'),
            'norm_topk_prob': (False, 'bool'),
            'output_router_logits': (False, 'bool'),
            'router_aux_loss_coef': (0.001, 'float'),
            'mlp_only_layers': (None, 'ints?'),
            'pad_token_id': (None, 'int?'),
            'bos_token_id': (None, 'int?'),
            'eos_token_id': (None, 'ids?'),
        },
        architectures=_arch('Qwen3Moe'),
        default_architecture='Qwen3MoeForCausalLM',
        # Qwen3MoeConfig declares num_experts but maps that name to num_local_experts (to_dict writes the latter)
        attribute_map={'num_experts': 'num_local_experts'}, post_init='qwen3_moe', block='qwen3_moe',
        qkv_bias='attention_bias', o_bias='attention_bias', qk_norm=True,
    ),
    # Phi-3.5-MoE: Mixtral's layout with biased attention (attention_bias), LayerNorms (weight and bias), a router
    # that is an nn.Linear (`mlp.router`), sparsemixer top-2 routing and an optional lm_head bias
    'phimoe': Family(
        'phimoe',
        'PhimoeConfig',
        fields={
            'vocab_size': (32064, 'int'),
            'hidden_size': (4096, 'int'),
            'intermediate_size': (6400, 'int'),
            'num_hidden_layers': (32, 'int'),
            'num_attention_heads': (32, 'int'),
            'num_key_value_heads': (8, 'int'),
            'hidden_act': ('silu', 'str'),
            'max_position_embeddings': (131072, 'int'),
            'initializer_range': (0.02, 'float'),
            'rms_norm_eps': (1e-05, 'float'),
            'use_cache': (True, 'bool'),
            'pad_token_id': (None, 'int?'),
            'bos_token_id': (1, 'int?'),
            'eos_token_id': (2, 'ids?'),
            'tie_word_embeddings': (False, 'bool'),
            'rope_parameters': (None, 'dict?'),
            'sliding_window': (None, 'int?'),
            'attention_dropout': (0.0, 'number'),
            'num_experts_per_tok': (2, 'int'),
            'num_local_experts': (16, 'int'),
            'output_router_logits': (False, 'bool'),
            'router_aux_loss_coef': (0.001, 'float'),
            'router_jitter_noise': (0.01, 'float'),
            'input_jitter_noise': (0.0, 'float'),
            'attention_bias': (False, 'bool'),
            'lm_head_bias': (False, 'bool'),
        },
        architectures=_arch('Phimoe'),
        default_architecture='PhimoeForCausalLM',
        kv_heads_default=True, rope_theta_default=1000000.0, block='phimoe', qkv_bias='attention_bias', o_bias='attention_bias',
    ),
})

# DeepSeek-V3 (modeling_deepseek_v3.py): multi-head latent attention (q through a q_lora_rank bottleneck with its own
# RMSNorm, or a plain q_proj when q_lora_rank is null; k and v from one kv_lora_rank latent plus a shared rotary key),
# the first first_k_dense_replace layers a dense MLP of intermediate_size, the others a sigmoid router with a
# group-limited top-k (n_group, topk_group; an e_score_correction_bias buffer), n_routed_experts grouped experts of
# moe_intermediate_size and n_shared_experts shared ones (one gated MLP of n_shared_experts * moe_intermediate_size)
FAMILIES['deepseek_v3'] = Family(
    'deepseek_v3',
    'DeepseekV3Config',
    fields={
        'vocab_size': (129280, 'int'),
        'hidden_size': (7168, 'int'),
        'intermediate_size': (18432, 'int'),
        'moe_intermediate_size': (2048, 'int'),
        'num_hidden_layers': (61, 'int'),
        'num_attention_heads': (128, 'int'),
        'num_key_value_heads': (128, 'int?'),
        'n_shared_experts': (1, 'int'),
        'n_routed_experts': (256, 'int'),
        'output_router_logits': (False, 'bool'),
        'routed_scaling_factor': (2.5, 'number'),
        'kv_lora_rank': (512, 'int'),
        'q_lora_rank': (1536, 'int?'),
        'qk_rope_head_dim': (64, 'int'),
        'v_head_dim': (128, 'int?'),
        'qk_nope_head_dim': (128, 'int'),
        'n_group': (8, 'int?'),
        'topk_group': (4, 'int?'),
        'num_experts_per_tok': (8, 'int?'),
        'first_k_dense_replace': (3, 'int?'),
        'norm_topk_prob': (True, 'bool?'),
        'hidden_act': ('silu', 'str'),
        'max_position_embeddings': (4096, 'int'),
        'initializer_range': (0.02, 'float'),
        'rms_norm_eps': (1e-06, 'float'),
        'use_cache': (True, 'bool'),
        'pad_token_id': (None, 'int?'),
        'bos_token_id': (0, 'int?'),
        'eos_token_id': (1, 'ids?'),
        'pretraining_tp': (1, 'int?'),
        'tie_word_embeddings': (False, 'bool'),
        'rope_parameters': (None, 'dict?'),
        'rope_interleave': (True, 'bool?'),
        'attention_bias': (False, 'bool'),
        'attention_dropout': (0.0, 'number?'),
        'num_mtp_layers': (1, 'int'),
    },
    architectures=_arch('DeepseekV3'),
    default_architecture='DeepseekV3ForCausalLM',
    # DeepseekV3Config: num_local_experts reads n_routed_experts; num_mtp_layers is stored as num_nextn_predict_layers
    attribute_map={'num_local_experts': 'n_routed_experts', 'num_mtp_layers': 'num_nextn_predict_layers'},
    kv_heads_default=True, post_init='deepseek_v3', block='deepseek_v3', qkv_bias='attention_bias',
    o_bias='attention_bias',
)

# gpt-oss (modeling_gpt_oss.py): Llama's attention with biases and a learned per-head `sinks` logit, layers alternating
# sliding (sliding_window) and full attention (layer_types, every second layer full), a biased router (`mlp.router`,
# weight and bias as bare parameters of GptOssTopKRouter), the experts as fused 3-D parameters with biases
# (gate_up_proj (E, h, 2I) interleaving gate and up columns, down_proj (E, I, h)), a clamped SwiGLU; yarn rope by
# default (GptOssConfig.__post_init__)
FAMILIES["gpt_oss"] = Family(
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

# The sparse-MoE families and where each keeps its expert count after normalization.
EXPERTS_KEY = {'mixtral': 'num_local_experts', 'qwen2_moe': 'num_experts', 'qwen3_moe': 'num_local_experts',
               'phimoe': 'num_local_experts', 'deepseek_v3': 'n_routed_experts', 'gpt_oss': 'num_local_experts'}

SUPPORTED = tuple(FAMILIES)

# LLaVA's sub-configs (transformers 5.24): the text model's families and CLIPVisionConfig's fields (the vision
# tower), with the values LlavaConfig gives a vision_config it is not handed (SubConfigSpec init_kwargs: CLIP ViT-L/14
# at 336 px, LLaVA-1.5's)
LLAVA_TEXT_FAMILIES = ("llama",)
CLIP_VISION_FIELDS = {
    'hidden_size': (768, 'int'),
    'intermediate_size': (3072, 'int'),
    'projection_dim': (512, 'int'),
    'num_hidden_layers': (12, 'int'),
    'num_attention_heads': (12, 'int'),
    'num_channels': (3, 'int'),
    'image_size': (224, 'int'),
    'patch_size': (32, 'int'),
    'hidden_act': ('quick_gelu', 'str'),
    'layer_norm_eps': (1e-05, 'float'),
    'attention_dropout': (0.0, 'number'),
    'initializer_range': (0.02, 'float'),
    'initializer_factor': (1.0, 'number'),
}
LLAVA_VISION_DEFAULTS = {'intermediate_size': 4096, 'hidden_size': 1024, 'patch_size': 14, 'image_size': 336,
                         'num_hidden_layers': 24, 'num_attention_heads': 16, 'vocab_size': 32000, 'projection_dim': 768}

# --- Llama 4 text (issue 21) ------------------------------------------------------------------
# Llama4ForCausalLM (modeling_llama4.py): MoE layers (moe_layers, else every interleave_moe_layer_step-th) hold
# num_local_experts experts as two fused 3-D parameters, a router (nn.Linear, top-k then sigmoid) and a shared expert
# (a gated MLP of intermediate_size); the other layers a gated MLP of intermediate_size_mlp. no_rope_layers marks the
# rope layers (1) and the NoPE ones (0); rope layers attend in chunks of attention_chunk_size and L2-normalize q and k
# (use_qk_norm, no weight); NoPE layers scale q (attn_temperature_tuning)
FAMILIES['llama4_text'] = Family(
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

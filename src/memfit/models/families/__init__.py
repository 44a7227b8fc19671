"""The transformer families memfit derives from a Hugging Face config.json: data, no logic.

One module per family (`models/families/<model_type>.py`, its `FAMILY`), imported the first time a config names
it: a family added costs nothing at start-up for configs of the others. For each `model_type`: the fields of the transformers config class with their defaults and
accepted JSON types (transformers 5.24.0; tests/models/test_transformers_params.py compares every
default with the installed config class), its attribute aliases, the rules its __post_init__
applies, the architectures (`architectures[0]`) memfit models with the head each one has, and
the structure facts models/hf.py needs (module names, which projections carry a bias, how the
attention and MLP weights are laid out). memfit never imports transformers at run time.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import field

from memfit.diagnostics.records import record

# Field types as JSON gives them: "?" also accepts null; "number" is int or float;
# "ids" is an int or a list of ints; "ints" a list of ints; "strs" a list of strings.
TYPES = ("int", "int?", "float", "number", "number?", "bool", "bool?", "str", "str?", "ids?", "ints?", "strs?", "dict?",
         "strs|str?")  # strs|str: a list of strings or one string (DeBERTa-v2's pos_att_type "p2c|c2p")

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
TOKEN_CLASSIFICATION = "token-classification"  # num_labels logits at every position (dropout, classifier), loss on (b, s) labels
HEADS = (CAUSAL_LM, MASKED_LM, SEQUENCE_CLASSIFICATION, SEQ2SEQ_LM, TOKEN_CLASSIFICATION)
# What the classification heads compute (modeling_layers.py GenericForSequenceClassification / GenericForTokenClassification,
# and each family's own class where it has one; issue 34): a decoder's sequence classifier scores every position with
# `score` (no bias) and takes the last non-padding token's row (pad_token_id; without one transformers refuses a batch
# above 1); BERT's pools the first token through `bert.pooler` (dense, tanh), dropout, then `classifier`. A token
# classifier applies dropout then its linear (with a bias) at every position. The loss is config.problem_type's
# (regression when num_labels is 1, single-label cross-entropy otherwise, multi_label_classification when named).


@record(frozen=True)
class Family:
    """One transformers model_type: its config class's fields and rules, its architectures and its structure."""

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
    # issue 34's classification heads (appended)
    classifier: str = "score"  # the token classifier's module (GPT-2, GPT-NeoX, Falcon, BERT: "classifier")
    classifier_dropout: tuple = ("classifier_dropout", "hidden_dropout")  # the token classifier's dropout: the first of
    # these config keys that is set, else 0.1 (GenericForTokenClassification; BERT: hidden_dropout_prob, always set)
    # issue 34's encoders (appended)
    encoder_head: str = "bert"   # a post-norm encoder's heads: "bert" (cls.predictions; the pooler, then `classifier`)
    # | "roberta" (lm_head with its own bias; classifier.dense, tanh, classifier.out_proj on the first token; no pooler)
    # issue 34's DeBERTa-v2 and ModernBERT (appended): config.json keys the model reads that are not fields of its config
    # class (DeBERTa-v2's modeling code reads position_buckets, share_att_key... with getattr; ModernBertConfig's
    # __post_init__ reads global_attn_every_n_layers): name -> (default, type), validated, kept as given
    getattr_keys: dict = field(default_factory=dict)

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


def _arch(prefix: str, causal: str = "ForCausalLM", token: bool = True) -> dict:
    """The causal LM and the classifiers transformers has for a decoder family (`token`: a ForTokenClassification)."""
    out = {f"{prefix}{causal}": CAUSAL_LM, f"{prefix}ForSequenceClassification": SEQUENCE_CLASSIFICATION}
    return {**out, f"{prefix}ForTokenClassification": TOKEN_CLASSIFICATION} if token else out


# Every family, in the order the schema and the docs list them: the module models/families/<model_type>.py holds it.
SUPPORTED = (
    'llama',
    'mistral',
    'qwen2',
    'qwen3',
    'gemma',
    'phi3',
    'gpt2',
    'bert',
    'gpt_neox',
    'mixtral',
    't5',
    'gemma2',
    'gemma3_text',
    'cohere',
    'starcoder2',
    'smollm3',
    'olmo2',
    'granite',
    'falcon',
    'llava',
    'qwen2_moe',
    'qwen3_moe',
    'phimoe',
    'deepseek_v3',
    'gpt_oss',
    'llama4_text',
    'qwen2_vl',
    'qwen2_5_vl',
    'roberta',
    'whisper',
    'deberta-v2',
    'modernbert',
    'mllama',
)


class Families(Mapping):
    """model_type -> Family, a family's module imported when it is first asked for (Python keeps it in sys.modules).
    Going through all of them (the schema, the docs, the nearest family of an unknown one) imports every one."""

    def __getitem__(self, model_type: str) -> Family:
        if not self.__contains__(model_type):
            raise KeyError(model_type)
        return importlib.import_module(f"{__name__}.{model_type.replace('-', '_')}").FAMILY   # deberta-v2: deberta_v2.py

    def __contains__(self, model_type) -> bool:
        return isinstance(model_type, str) and model_type in SUPPORTED

    def __iter__(self):
        return iter(SUPPORTED)

    def __len__(self) -> int:
        return len(SUPPORTED)


FAMILIES = Families()


def own_name(model_type, key: str) -> str:
    """The name a family's config (and memfit's normalized view of it) gives a general key: GPT-2's n_layer for
    num_hidden_layers (its class's attribute_map). An encoder-decoder's layers and heads are its stacks' (hf_encdec),
    which have no one count: the general name, as for a type no family describes."""
    family = FAMILIES.get(model_type) if model_type not in STACKED else None
    return family.attribute_map.get(key, key) if family is not None else key




# ---------------------------------------------------------------------------------------------
# Issue 21: the dense decoders (gemma2, gemma3_text, olmo2, granite, cohere, starcoder2, falcon, smollm3)


# --- mixtures of experts (issue 21) -----------------------------------------------------------
# Qwen2-MoE and Qwen3-MoE: a layer is a sparse MoE block unless it is in mlp_only_layers or (i + 1) is not a
# multiple of decoder_sparse_step (then a dense MLP of intermediate_size). Qwen2-MoE adds a shared expert (a dense
# MLP of shared_expert_intermediate_size) scaled by sigmoid(shared_expert_gate(x)).
_QWEN_MOE_FIELDS = {
    'vocab_size': (151936, 'int'),
    'hidden_size': (2048, 'int'),
}



# The sparse-MoE families and where each keeps its expert count after normalization.
EXPERTS_KEY = {'mixtral': 'num_local_experts', 'qwen2_moe': 'num_experts', 'qwen3_moe': 'num_local_experts',
               'phimoe': 'num_local_experts', 'deepseek_v3': 'n_routed_experts', 'gpt_oss': 'num_local_experts'}


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



# Qwen2-VL and Qwen2.5-VL (issue 34): vision-language families whose vision tower models/qwen_vl.py describes
QWEN_VL_BLOCKS = ("qwen2_vl", "qwen2_5_vl")


def copied(value):
    """A default's own copy (dicts and lists copied all the way down), so a normalized config shares nothing with the
    tables."""
    if isinstance(value, dict):
        return {k: copied(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [copied(v) for v in value]
    return value


def part_base(dtype=None) -> dict:
    """PretrainedConfig's base fields as a composite model's part (text_config, vision_config) writes them in its
    to_dict(): the defaults, its dtype, and the two labels every config starts with."""
    out = {key: copied(default) for key, (default, _) in BASE_FIELDS.items() if key != "transformers_version"}
    out["dtype"] = dtype
    out["id2label"] = {0: "LABEL_0", 1: "LABEL_1"}
    out["label2id"] = {"LABEL_0": 0, "LABEL_1": 1}
    return out

"""What peft and bitsandbytes do to each model family, as data: the name tables recipe/lora.py and
recipe/quant.py read (the only place outside models/families/ that names a model type for them); and which
family a torchtune model is, with the modules its LoRA adapts there (read/native/torchtune.py).
A data module: it imports nothing, so every stage may read it (tests/project/test_arch.py BOTTOM)."""

from __future__ import annotations

# peft's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING: the targets peft picks
# when a LoraConfig gives none (utils/constants.py), for the list-valued families.
DEFAULT_TARGETS: dict[str, list[str]] = {
    "t5": ["q", "v"],
    "mt5": ["q", "v"],
    "bart": ["q_proj", "v_proj"],
    "gpt2": ["c_attn"],
    "bloom": ["query_key_value"],
    "opt": ["q_proj", "v_proj"],
    "gptj": ["q_proj", "v_proj"],
    "gpt_neox": ["query_key_value"],
    "gpt_neo": ["q_proj", "v_proj"],
    "bert": ["query", "value"],
    "roberta": ["query", "value"],
    "deberta-v2": ["query_proj", "value_proj"],
    "llama": ["q_proj", "v_proj"],
    "gpt_bigcode": ["c_attn"],
    "falcon": ["query_key_value"],
    "mistral": ["q_proj", "v_proj"],
    "mixtral": ["q_proj", "v_proj"],
    "stablelm": ["q_proj", "v_proj"],
    "phi": ["q_proj", "v_proj", "fc1", "fc2"],
    "gemma": ["q_proj", "v_proj"],
    "gemma2": ["q_proj", "v_proj"],
    "gemma3_text": ["q_proj", "v_proj"],
    "qwen2": ["q_proj", "v_proj"],
    "qwen3": ["q_proj", "v_proj"],
}


# peft 0.21 rewrites these families' targets for transformers 5's fused MoE layers
# (utils/transformers_weight_conversion.py, _MOE_TARGET_MODULE_MAPPING): a string
# target is resolved to include the router and experts, which then get LoRA as
# target_parameters. memfit does not model that conversion.
MOE_RETARGETED: dict[str, tuple] = {
    "mixtral": ("gate", "w1", "w3", "w2"),
    # peft 0.21 converts the model types transformers maps to the qwen2_moe pattern (qwen3_moe, deepseek_v3, ...),
    # not qwen2_moe itself: there all-linear adapts the nn.Linear modules only (measured: issue 21)
    "qwen3_moe": ("gate", "gate_proj", "up_proj", "down_proj"),
    # transformers' conversion_mapping maps deepseek_v3 to the qwen2_moe pattern too (its dense layers' gate_proj /
    # up_proj / down_proj share the names peft retargets)
    "deepseek_v3": ("gate", "gate_proj", "up_proj", "down_proj"),
}


# Modules peft 0.21 wraps but whose wrapped forward fails: PhiMoE's router is an nn.Linear subclass returning a tuple
# (logits, weights, experts), which peft's Linear.forward reads as a tensor (AttributeError: 'tuple' ... 'dtype'):
# all-linear, or naming the router, cannot train (measured, issue 21)
# Llama 4's Llama4Router likewise returns (scores, logits) (measured, issue 21: all-linear fails the same way)
PEFT_FAILS: dict[str, tuple] = {"phimoe": ("router",), "llama4_text": ("router",)}


# DoRA on a fan_in_fan_out layer (GPT-2's Conv1D): peft's utils.other.transpose wraps the transposed base weight in
# a new nn.Parameter (requires_grad=True), so DoRA's weight-norm graph keeps tensors for a gradient nobody reads;
# measured on a tiny GPT-2 (peft 0.21.2): saved activations 25-35% above what memfit's DoRA rows give. Refused, not
# guessed low.
DORA_UNMODELLED: dict[str, str] = {
    "gpt2": "peft's DoRA on GPT-2's Conv1D layers (fan_in_fan_out) keeps more for backward than memfit models "
            "(measured 25-35% above); not modelled",
}


# Model types whose quantized base cannot run: transformers' bitsandbytes integration replaces every nn.Linear
# (subclasses included) but the output head, and these models read more than a tensor from one of them.
REFUSED_MODELS = {
    "phimoe": "bitsandbytes replaces PhiMoE's router (an nn.Linear subclass returning routing weights and experts) "
              "by a quantized linear returning one tensor, and the MoE block fails (ValueError: too many values to "
              "unpack; transformers 5.24.0, measured)",
}


# A class's _keep_in_fp32_modules: transformers' bitsandbytes quantizer leaves them unquantized whatever the skip list
# (quantizers/quantizer_bnb_4bit.py _process_model_before_weight_loading passes model._keep_in_fp32_modules to
# get_modules_to_not_convert, quantizers/base.py `modules_to_not_convert.extend(keep_in_fp32_modules)`); they stay
# nn.Linear in the model's dtype (fp32 only when it loads in fp16: modeling_utils._get_dtype_plan).
# T5PreTrainedModel, MT5PreTrainedModel, UMT5PreTrainedModel: ["wo"] (models/t5/modeling_t5.py:542)
KEEP_IN_FP32 = {"t5": ("wo",), "mt5": ("wo",), "umt5": ("wo",)}


# a masked LM's output layer where its family names it apart from BERT's `cls.predictions.decoder` (peft's all-linear
# leaves the output layer alone): RobertaForMaskedLM's lm_head.decoder
MLM_OUTPUT_LAYER = {"roberta": "lm_head.decoder"}


# torchtune's component builders (torchtune/models/<name>/_component_builders.py) -> the transformers family
# (model_type) memfit derives the model as
TORCHTUNE_FAMILIES = {"llama2": "llama", "llama3": "llama", "llama3_1": "llama", "llama3_2": "llama", "mistral": "mistral",
                      "qwen2": "qwen2", "qwen3": "qwen3", "gemma": "gemma", "gemma2": "gemma2", "phi3": "phi3"}

# Families whose transformers modules fuse projections torchtune's model keeps apart, each with its own lora_a
# (torchtune/models/phi3/_component_builders.py: q_proj, k_proj, v_proj; w1, w3): torchtune's attention module
# names -> the fused module memfit's LoRA targets, the MLP's modules apply_lora_to_mlp adapts, and the warning
# the reader gives (the adapters counted on the fused modules have fewer elements than torchtune builds).
FUSED_PROJECTIONS: dict[str, dict] = {
    "phi3": {
        "attention": {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj"},
        "mlp": ("gate_up_proj", "down_proj"),
        "note": "phi3 (Phi-3, Phi-4): torchtune adapts q, k and v (and gate, up) separately, each with its own lora_a; "
                "memfit's Phi-3 has the fused qkv_proj (and gate_up_proj), so the adapters are counted on them, one lora_a "
                "each: fewer adapter elements than torchtune builds (lora_phi4_14b, q, v, output and MLP at rank 8: "
                "27,852,800 against 30,720,000)",
    },
}

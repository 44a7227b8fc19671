"""LLaMA-Factory YAML (hiyouga/LLaMA-Factory, src/llamafactory/hparams/: ModelArguments,
DataArguments, FinetuningArguments, and the Trainer's TrainingArguments). The table KEYS says
what memfit reads from each key and where its default is; docs/native-llama-factory.md cites each.
"""

from __future__ import annotations

from memfit.diagnostics import codes
from memfit.read.native import hf, vision
from memfit.read.native.axolotl import optimizer
from memfit.read.native.base import COMPILED, Reader

KEYS = {
    "model_name_or_path": (None, "model.hf_config", "hparams/model_args.py BaseModelArguments.model_name_or_path"),
    "stage": ("sft", "pt, sft: as read; rm, ppo, dpo, kto: extra models warned about", "hparams/finetuning_args.py FinetuningArguments.stage"),
    "finetuning_type": ("lora", "lora: lora section; full: no adapters", "hparams/finetuning_args.py finetuning_type"),
    "upcast_lmhead_output": (False, "no bytes of its own: the lm_head's output upcast to float32 (a forward hook) is the float32 copy transformers' causal-LM loss makes anyway (MemTracker: the same peak)", "hparams/model_args.py upcast_lmhead_output; model/model_utils/checkpointing.py _fp32_forward_post_hook"),
    "lora_rank": (8, "lora.r", "hparams/finetuning_args.py LoraArguments.lora_rank"),
    "lora_alpha": ("lora_rank * 2", "lora.alpha", "hparams/finetuning_args.py lora_alpha, __post_init__"),
    "lora_dropout": (0.0, "lora.dropout", "hparams/finetuning_args.py lora_dropout"),
    "lora_target": ("all", "lora.target_modules (all -> all-linear; a comma list)", "hparams/finetuning_args.py lora_target; model/adapter.py _setup_lora_tuning"),
    "additional_target": (None, "lora.modules_to_save (a comma list)", "hparams/finetuning_args.py additional_target"),
    "use_dora": (False, "lora.use_dora", "hparams/finetuning_args.py LoraArguments.use_dora; model/adapter.py _setup_lora_tuning"),
    "quantization_bit": (None, "quantization: 4 -> nf4/fp4, 8 -> int8", "hparams/model_args.py QuantizationArguments.quantization_bit; model/model_utils/quantization.py configure_quantization"),
    "quantization_method": ("bnb", "bnb only (others warned)", "hparams/model_args.py quantization_method"),
    "double_quantization": (True, "quantization.double_quant", "hparams/model_args.py double_quantization"),
    "quantization_type": ("nf4", "quantization.method", "hparams/model_args.py quantization_type"),
    "per_device_train_batch_size": (8, "training.micro_batch", "transformers TrainingArguments.per_device_train_batch_size"),
    "gradient_accumulation_steps": (1, "training.gradient_accumulation", "transformers TrainingArguments.gradient_accumulation_steps"),
    "cutoff_len": (2048, "training.seq_len", "hparams/data_args.py DataArguments.cutoff_len"),
    "bf16": (False, "precision (compute dtype bf16)", "hparams/parser.py get_train_args: compute_dtype"),
    "fp16": (False, "precision (compute dtype fp16)", "hparams/parser.py get_train_args"),
    "pure_bf16": (False, "precision bf16-true (no fp32 upcast of trainable parameters)", "hparams/finetuning_args.py pure_bf16; model/adapter.py init_adapter"),
    "optim": ("adamw_torch_fused", "optimizer, training.optimizer_impl", "transformers TrainingArguments.optim (5.x default)"),
    "deepspeed": (None, "a DeepSpeed JSON", "transformers TrainingArguments.deepspeed"),
    "flash_attn": ("auto", "training.attention: auto, sdpa -> sdpa; disabled -> eager; fa2, fa3 -> flash", "hparams/model_args.py flash_attn; model/model_utils/attention.py configure_attn_implementation"),
    "disable_gradient_checkpointing": (False, "training.checkpointing full unless true", "hparams/model_args.py; model/model_utils/checkpointing.py prepare_model_for_training"),
    "image_max_pixels": (768 * 768, "training.image_max_pixels (Qwen2-VL, Qwen2.5-VL)", "hparams/model_args.py ProcessorArguments.image_max_pixels; data/mm_plugin.py _preprocess_image"),
    "image_min_pixels": (32 * 32, "training.image_min_pixels (Qwen2-VL, Qwen2.5-VL)", "hparams/model_args.py ProcessorArguments.image_min_pixels"),
    "enable_liger_kernel": (False, "training.fused_loss liger in the pt and sft stages (apply_liger_kernel's fused_linear_cross_entropy = not require_logits); training.liger_kernels rope, rms_norm, swiglu (apply_liger_kernel_to_<model type>'s defaults, which it passes unchanged: the RoPE kernel is warned about, not priced)", "hparams/model_args.py enable_liger_kernel; model/model_utils/liger_kernel.py apply_liger_kernel; model/loader.py load_model"),
    "freeze_vision_tower": (True, "training.freeze_vision_tower (Qwen2-VL, Qwen2.5-VL, LLaVA)", "hparams/finetuning_args.py FinetuningArguments.freeze_vision_tower; model/adapter.py"),
}

# keys read for what they mean, not for bytes: packing fills every sequence to cutoff_len, the length memfit prices
# anyway (without it, cutoff_len is the longest a batch can be)
NO_MEMORY = ("packing",)

UNMODELLED = {
    "use_unsloth_gc": ((False,), "Unsloth's gradient checkpointing offloads the checkpoints to host memory: the figures are high, on the safe side"),
    "use_galore": ((False,), "GaLore keeps optimizer state in a low-rank projection: the figures are high, on the safe side"),
    "use_apollo": ((False,), "APOLLO keeps optimizer state in a low-rank projection: the figures are high, on the safe side"),
    "use_badam": ((False,), "BAdam trains one block at a time: the figures are high, on the safe side (fewer gradients and less optimizer state)"),
    "use_unsloth": ((False,), "Unsloth's kernels and checkpointing: the figures are high, on the safe side"),
    "pissa_init": ((False,), "PiSSA initialization: the figures are low while the model loads (the initialisation's SVD temporaries); the step's are the same"),
    "torch_compile": ((False,), COMPILED),
    "freeze_multi_modal_projector": ((False,), "the multi-modal projector (Qwen2-VL's merger, LLaVA's projector) frozen: memfit trains it beside the text model; the figures are high by its gradients and optimizer state"),
    "fsdp": ((None, "", False), "FSDP from TrainingArguments (use an accelerate config via --launch): the figures are high, on the safe side (counted unsharded)"),
    "neat_packing": ((False,), "packing without cross-attention: unless the attention is flash_attention_2 the collator builds a (batch, 1, cutoff_len, cutoff_len) attention mask in the compute dtype (data/collator.py prepare_4d_attention_mask), batch x cutoff_len^2 x 2 bytes more than memfit counts: the figures are low"),
    "upcast_layernorm": ((False,), "the layer norms' weights are upcast to float32 (more bytes per norm weight than memfit counts): the figures are low, slightly"),
}
CONDITIONAL = {
    "do_eval": "whether the run evaluates (with eval_strategy, val_size): per_device_eval_batch_size is warned about then",
    "per_device_eval_batch_size": "training.eval_batch when larger than the training micro-batch and the run evaluates (TrainingArguments default 8): the evaluation pass (no_grad forward at that batch beside the weights and optimizer state); under a parallel layout: warned",
}
STAGE_EXTRA = {
    "ppo": "PPO holds a reward model and a value head besides the policy",
    "dpo": "DPO holds a reference model (with LoRA: the base with adapters off, no extra memory) and computes two forward passes",
    "kto": "KTO holds a reference model and computes two forward passes",
    "rm": "a reward model adds a value head",
}


# LLaMA-Factory's v1 format (USE_V1=1; src/llamafactory/v1/config/: ModelArguments `model`, `model_class`, the plugin
# configs `peft_config`, `kernel_config`, `quant_config`, TrainingArguments `dist_config`; examples/v1/): a hub name or
# path under `model` and these keys, no model_name_or_path: read by read/native/llamafactory_v1.py
V1_KEYS = ("model_class", "peft_config", "dist_config", "kernel_config", "quant_config")


def v1_key(data: dict) -> str | None:
    """The key that makes `data` a LLaMA-Factory v1 config, else None."""
    if "model_name_or_path" in data or not isinstance(data.get("model"), str):
        return None
    return next((k for k in V1_KEYS if k in data), None)


# the model types LLaMA-Factory's apply_liger_kernel patches (model/model_utils/liger_kernel.py at ff6d4d12e; gpt_oss
# only with a fork of liger-kernel installed); for any other it warns "Current model does not support liger kernel"
# and returns
LIGER_MODEL_TYPES = frozenset({
    "gemma", "gemma2", "gemma3", "gemma3_text", "glm", "glm4", "glm4v", "granite", "llama", "llava", "mistral", "mixtral",
    "mllama", "olmo2", "paligemma", "phi3", "qwen2", "qwen2_vl", "qwen2_5_vl", "qwen3", "qwen3_moe", "qwen3_next",
    "qwen3_5", "qwen3_5_moe", "gpt_oss"})


def read(r: Reader, ctx) -> dict:
    data = r.data
    r.native.root = r.at("model_name_or_path", on_key=True)
    model_type = (ctx.model(r.get("model_name_or_path", (str,)), r.at("model_name_or_path")) or {}).get("model_type")
    stage = r.get("stage", (str,), "sft", choices=("pt", "sft", "rm", "ppo", "dpo", "kto"))
    if stage in STAGE_EXTRA:
        r.warn(r.at("stage"), f"stage {stage}: {STAGE_EXTRA[stage]}; memfit counts one model's training step")
    kind = r.get("finetuning_type", (str,), "lora", choices=("lora", "oft", "freeze", "full"))

    bf16 = r.get("bf16", (bool,), False)
    fp16 = r.get("fp16", (bool,), False)
    pure_bf16 = r.get("pure_bf16", (bool,), False)
    if bf16 and fp16:
        r.error(r.at("fp16"), codes.NATIVE_CONFIG, "bf16 and fp16 are both true: the Trainer refuses both (TrainingArguments: at most one of fp16 and bf16)")
    # hparams/parser.py: compute_dtype bf16 (bf16 or pure_bf16), fp16, else the checkpoint's dtype
    # (model/patcher.py patch_config -> infer_optim_dtype: bf16 if the checkpoint is bf16 and the device has it, fp16 if it is fp16, else fp32)
    if bf16 or pure_bf16:
        compute = "bfloat16"
    elif fp16:
        compute = "float16"
    else:
        from memfit.read.native.settings import bf16_capable

        stored = (ctx.model_config or {}).get("torch_dtype", (ctx.model_config or {}).get("dtype"))
        compute = "bfloat16" if stored == "bfloat16" and bf16_capable(ctx.conf) else "float16" if stored in ("float16", "bfloat16") else "float32"
    precision_at = r.at(next((k for k in ("pure_bf16", "bf16", "fp16") if data.get(k)), "bf16")) if any(data.get(k) for k in ("pure_bf16", "bf16", "fp16")) else None
    quant_bits = r.get("quantization_bit", (int,), None)
    # model/adapter.py init_adapter: trainable parameters are cast to fp32 unless pure_bf16 (or BAdam), or
    # ZeRO-3 without quantization (DeepSpeed keeps fp32 masters itself)
    if kind == "full":
        if pure_bf16:
            precision = "bf16-true"
        elif compute == "float32":
            precision = "32-true"
        else:
            precision = "bf16-mixed" if compute == "bfloat16" else "16-mixed"
    else:
        precision = {"bfloat16": "bf16-true", "float16": "16-true", "float32": "32-true"}[compute]
        if pure_bf16 and kind in ("lora", "oft"):
            r.warn(r.at("pure_bf16"), "pure_bf16 with LoRA: the adapters stay in bf16; memfit counts them in fp32 (peft's default on a 16-bit base)")
    r.set(("precision",), precision, precision_at)

    micro = r.get("per_device_train_batch_size", (int,), 8)
    accum = r.get("gradient_accumulation_steps", (int,), 1)
    r.set(("training", "micro_batch"), micro, r.at("per_device_train_batch_size") if "per_device_train_batch_size" in data else None)
    r.set(("training", "seq_len"), r.get("cutoff_len", (int,), 2048), r.at("cutoff_len") if "cutoff_len" in data else None)
    if accum != 1 or "gradient_accumulation_steps" in data:
        r.set(("training", "gradient_accumulation"), accum, r.at("gradient_accumulation_steps") if "gradient_accumulation_steps" in data else None)
    disabled = r.get("disable_gradient_checkpointing", (bool,), False)
    r.set(("training", "checkpointing"), "none" if disabled else "full", r.at("disable_gradient_checkpointing") if "disable_gradient_checkpointing" in data else None)

    attention = r.get("flash_attn", (str,), "auto", choices=("auto", "disabled", "sdpa", "fa2", "fa3"))
    r.set(("training", "attention"), {"auto": hf.DEFAULT_ATTENTION, "disabled": "eager", "sdpa": "sdpa", "fa2": "flash", "fa3": "flash"}[attention], r.at("flash_attn") if "flash_attn" in data else None)

    optimizer(r, r.get("optim", (str,), "adamw_torch_fused"), r.at("optim") if "optim" in data else None)
    vision.llamafactory(r, ctx)   # (issue 34) a vision-language model's image settings

    if kind in ("lora", "oft"):
        if kind == "oft":
            r.warn(r.at("finetuning_type"), "finetuning_type oft: memfit models LoRA adapters; counted as LoRA of the same rank")
        rank = r.get("lora_rank", (int,), 8)
        lora = {"r": rank, "alpha": r.get("lora_alpha", (int, float), None) or rank * 2, "dropout": r.get("lora_dropout", (int, float), 0.0)}
        target = r.get("lora_target", (str, list), "all")
        names = [t.strip() for t in target.split(",")] if isinstance(target, str) else target
        lora["target_modules"] = "all-linear" if names == ["all"] else names
        extra = r.get("additional_target", (str, list), None)
        if extra:
            lora["modules_to_save"] = [t.strip() for t in extra.split(",")] if isinstance(extra, str) else extra
        if kind == "lora" and r.get("use_dora", (bool,), False):
            lora["use_dora"] = True
        r.set(("lora",), lora, r.at("finetuning_type") if "finetuning_type" in data else None)
        for key, memfit in (("lora_rank", "r"), ("lora_alpha", "alpha"), ("lora_dropout", "dropout"), ("lora_target", "target_modules"), ("additional_target", "modules_to_save"), ("use_dora", "use_dora")):
            if key in data and memfit in lora:
                r.origin(("lora", memfit), r.at(key))
    elif kind == "freeze":
        r.warn(r.at("finetuning_type"), "finetuning_type freeze: only the last freeze_trainable_layers layers train; memfit counts a full fine-tune")
    if quant_bits is not None:
        method = r.get("quantization_method", (str,), "bnb")
        if method != "bnb":
            r.warn(r.at("quantization_method"), f"quantization_method {method}: memfit models bitsandbytes; counted as bitsandbytes {quant_bits}-bit")
        if kind not in ("lora", "oft"):
            r.error(r.at("quantization_bit"), codes.NATIVE_CONFIG, "a quantized model trains only with LoRA or OFT (LLaMA-Factory's init_adapter refuses it)")
        elif quant_bits == 4:
            quant_type = r.get("quantization_type", (str,), "nf4", choices=("nf4", "fp4"))
            r.set(("quantization",), {"method": quant_type, "double_quant": r.get("double_quantization", (bool,), True), "compute_dtype": compute}, r.at("quantization_bit"))
        elif quant_bits == 8:
            r.set(("quantization",), {"method": "int8"}, r.at("quantization_bit"))
        else:
            r.error(r.at("quantization_bit"), codes.NATIVE_CONFIG, f"quantization_bit {quant_bits}: bitsandbytes takes 4 or 8")
    # upcast_lmhead_output: the float32 logits transformers' ForCausalLMLoss makes anyway (logits.float()), made by the
    # lm_head's hook instead; the 16-bit output it replaces is saved by nobody: the step's bytes are the same
    r.get("upcast_lmhead_output", (bool,), False)
    if r.get("do_eval", (bool,), False) or data.get("eval_strategy", data.get("evaluation_strategy", "no")) not in ("no", None) or "val_size" in data:
        r.eval_batch("per_device_eval_batch_size", micro, 8, conf=ctx.conf)
    trainer = {
        "micro_batch": (micro, r.at("per_device_train_batch_size") if "per_device_train_batch_size" in data else None),
        "grad_accum": (accum, r.at("gradient_accumulation_steps") if "gradient_accumulation_steps" in data else None),
        "bf16": (bool(bf16 or pure_bf16), precision_at),
        "fp16": (bool(fp16), r.at("fp16") if "fp16" in data else None),
    }
    if r.has("deepspeed"):
        ctx.deepspeed(data["deepspeed"], r.at("deepspeed"), trainer)
    # the launch config's FSDP is the layout memfit reads (--launch, the settings' launch): TrainingArguments' fsdp
    # key then says nothing memfit leaves out
    r.unmodelled({k: v for k, v in UNMODELLED.items() if not (k == "fsdp" and "fsdp" in ctx.launch)})
    if r.get("enable_liger_kernel", (bool,), False) and isinstance(model_type, str) and model_type not in LIGER_MODEL_TYPES:
        r.warn(r.at("enable_liger_kernel"), f"enable_liger_kernel: LLaMA-Factory applies no Liger kernel to a {model_type} model "
                                            "(apply_liger_kernel: 'Current model does not support liger kernel'): memfit prices the model's own")
    elif r.get("enable_liger_kernel", (bool,), False):
        # model/loader.py: apply_liger_kernel(..., require_logits=(finetuning_args.stage not in ["pt", "sft"]))
        if stage in ("pt", "sft"):
            r.set(("training", "fused_loss"), "liger", r.at("enable_liger_kernel"))
        # model/model_utils/liger_kernel.py apply_liger_kernel: `apply_liger_kernel(**kwargs)` with kwargs empty (or
        # only the loss's): the model type's defaults, rope, rms_norm and swiglu on
        r.set(("training", "liger_kernels"), ["rope", "rms_norm", "swiglu"], r.at("enable_liger_kernel"))
        if stage not in ("pt", "sft"):
            r.warn(r.at("enable_liger_kernel"), f"enable_liger_kernel: stage {stage} keeps the logits (no fused cross-entropy)")
    return trainer

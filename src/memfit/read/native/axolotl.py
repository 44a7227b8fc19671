"""Axolotl YAML (axolotl-ai-cloud/axolotl, src/axolotl/utils/schemas/). Each key, its default and
what memfit reads from it is the table KEYS; UNMODELLED lists the keys that change memory and are
not modelled (a positioned warning each). docs/native-axolotl.md cites each source.
"""

from __future__ import annotations

from memfit.diagnostics import codes
from memfit.read.native import hf
from memfit.read.native.base import COMPILED, Reader

# native key -> (default, memfit key, source in axolotl)
KEYS = {
    "base_model": (None, "model.hf_config (its config.json)", "schemas/model.py ModelInputConfig.base_model"),
    "base_model_config": (None, "model.hf_config, when the weights' repo has no config.json", "schemas/model.py base_model_config"),
    "micro_batch_size": (1, "training.micro_batch", "schemas/training.py HyperparametersConfig.micro_batch_size"),
    "gradient_accumulation_steps": (1, "training.gradient_accumulation", "schemas/training.py gradient_accumulation_steps"),
    "sequence_len": (512, "training.seq_len", "schemas/config.py AxolotlInputConfig.sequence_len"),
    "image_size": (None, "training.image_size (Qwen2-VL, Qwen2.5-VL; (width, height) read as [height, width])", "utils/schemas/multimodal.py MultiModalConfig.image_size"),
    "optimizer": ("adamw_torch_fused", "optimizer, training.optimizer_impl (the Trainer's optim names)", "schemas/training.py optimizer"),
    "bf16": ("auto", "precision (resolve_dtype: bf16 -> torch_dtype bfloat16: bf16-true)", "schemas/config.py bf16; utils/config/__init__.py resolve_dtype"),
    "fp16": (None, "precision 16-true", "schemas/config.py fp16; resolve_dtype"),
    "bfloat16": (None, "precision bf16-true (no AMP)", "schemas/config.py bfloat16"),
    "float16": (None, "precision 16-true (no AMP)", "schemas/config.py float16"),
    "gradient_checkpointing": (False, "training.checkpointing full (true, offload, offload_disk); offload, offload_disk: training.activation_offloading (the checkpoints leave the GPU)", "schemas/config.py gradient_checkpointing"),
    "activation_offloading": (False, "training.activation_offloading (torchtune's OffloadActivations, as TRL's port of it runs)", "schemas/config.py activation_offloading"),
    "gradient_checkpointing_kwargs": (None, "every_n_layers -> training.checkpoint_every (the Trainer's activation_checkpointing_kwargs, transformers 5)", "schemas/config.py gradient_checkpointing_kwargs; core/builders passes it to TrainingArguments"),
    "attn_implementation": (None, "training.attention (eager, sdpa, flash_attention_2/3 -> flash)", "schemas/config.py attn_implementation; loaders/model.py _set_attention_config"),
    "flash_attention": (None, "training.attention flash (deprecated spelling)", "schemas/config.py flash_attention"),
    "sdp_attention": (None, "training.attention sdpa (deprecated spelling)", "schemas/config.py sdp_attention"),
    "eager_attention": (None, "training.attention eager (deprecated spelling)", "schemas/config.py eager_attention"),
    "adapter": (None, "lora (lora, qlora); none: a full fine-tune", "schemas/peft.py LoraConfig.adapter"),
    "lora_r": (None, "lora.r (peft's default 8 when unset)", "schemas/peft.py lora_r"),
    "lora_alpha": (None, "lora.alpha", "schemas/peft.py lora_alpha"),
    "lora_dropout": (0.0, "lora.dropout", "schemas/peft.py lora_dropout"),
    "lora_target_modules": (None, "lora.target_modules", "schemas/peft.py lora_target_modules"),
    "lora_target_linear": (None, "lora.target_modules all-linear", "schemas/peft.py lora_target_linear"),
    "lora_modules_to_save": (None, "lora.modules_to_save", "schemas/peft.py lora_modules_to_save"),
    "peft_use_dora": (None, "lora.use_dora", "schemas/peft.py LoraConfig.peft_use_dora; loaders/adapter.py load_lora"),
    "peft_autocast_adapter_dtype": (None, "lora.autocast_adapter_dtype (peft's default true when unset)", "schemas/peft.py LoraConfig.peft_autocast_adapter_dtype; loaders/adapter.py load_lora"),
    "load_in_4bit": (False, "quantization nf4, double quant, compute dtype = torch_dtype (with adapter qlora)", "schemas/peft.py load_in_4bit; loaders/model.py ModelLoader._set_quantization_config"),
    "load_in_8bit": (False, "quantization int8 (with adapter lora)", "schemas/peft.py load_in_8bit; _set_quantization_config"),
    "deepspeed": (None, "parallel.zero, offload, buckets, precision (a DeepSpeed JSON)", "schemas/config.py deepspeed"),
    "fsdp_config": (None, "parallel.fsdp, parallel.offload, training.checkpointing", "schemas/fsdp.py FSDPConfig"),
    "fsdp": (None, "parallel.fsdp (deprecated list form: full_shard, shard_grad_op, offload)", "schemas/config.py fsdp"),
    "fsdp_version": (None, "parallel.fsdp_version: 2 when 2; 1 or unset: 1 (FSDP1: axolotl's check_fsdp_version_in_fsdp_config pins an unversioned fsdp_config to 1; also read from fsdp_config)", "schemas/fsdp.py FSDPConfig.fsdp_version"),
    "liger_fused_linear_cross_entropy": (None, "training.fused_loss liger, with the Liger plugin listed (axolotl.integrations.liger.LigerPlugin)", "integrations/liger/args.py LigerArgs.liger_fused_linear_cross_entropy"),
    "liger_rms_norm": (None, "training.liger_kernels rms_norm, with the Liger plugin listed (its pre_model_load passes rms_norm=cfg.liger_rms_norm to the model type's apply_liger_kernel_to_*)", "integrations/liger/args.py LigerArgs.liger_rms_norm; integrations/liger/plugin.py LigerPlugin.pre_model_load"),
    "liger_glu_activation": (None, "training.liger_kernels swiglu, with the Liger plugin listed (swiglu=cfg.liger_glu_activation)", "integrations/liger/args.py LigerArgs.liger_glu_activation; plugin.py LigerPlugin.pre_model_load"),
    "liger_swiglu": (None, "training.liger_kernels swiglu (liger_glu_activation's deprecated spelling)", "integrations/liger/args.py LigerArgs (liger_swiglu -> liger_glu_activation)"),
    "cut_cross_entropy": (True, "training.fused_loss cut_cross_entropy, with the Cut Cross-Entropy plugin listed (axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin): on by default once the plugin is listed, off with false", "integrations/cut_cross_entropy/args.py CutCrossEntropyArgs.cut_cross_entropy"),
    "overrides_of_model_config": (None, "model.transformer: the config.json's keys with these set over them (setattr on the model config)", "schemas/model.py ModelInputConfig.overrides_of_model_config; loaders/model.py ModelLoader._apply_model_config_overrides"),
}

# keys read for what they mean, not for bytes: packing fills every sequence to sequence_len, the length memfit prices
# anyway (without it, sequence_len is the longest a batch can be)
NO_MEMORY = ("sample_packing",)

# keys warned about when their value makes the figures off (which way: the message says)
CONDITIONAL = {
    "xformers_attention": "training.attention sdpa, with a warning that memfit models eager, sdpa and flash attention (loaders/model.py _set_attention_config)",
    "flex_attention": "training.attention sdpa, with a warning that memfit models eager, sdpa and flash attention (loaders/model.py _set_attention_config)",
    "plugins": "the Cut Cross-Entropy plugin alone switches cut_cross_entropy on (its default); a Liger plugin without its enable keys (liger_*) is warned about: its kernels save less than memfit counts",
    "liger_use_token_scaling": "without liger_fused_linear_cross_entropy: Axolotl refuses the config (integrations/liger/args.py LigerArgs.check_liger_use_token_scaling_flce); with it, the fused loss's per-token scaling holds nothing more",
    "tiled_mlp_use_original_mlp": "with tiled_mlp and liger_glu_activation both true: Axolotl refuses the config unless it is true (integrations/liger/args.py LigerArgs.check_tiled_mlp_conflict)",
    "eval_batch_size": "training.eval_batch when larger than the training micro-batch and the run evaluates (default: micro_batch_size): the evaluation pass (no_grad forward at that batch beside the weights and optimizer state); under a parallel layout: warned",
}

# keys that change memory and are not modelled -> (no-effect values, what they do)
UNMODELLED = {
    "liger_layer_norm": ((False,), "Liger's LayerNorm kernel saves less for backward: the figures are high, on the safe side"),
    "liger_cross_entropy": ((False,), "Liger's cross-entropy computes the logits' gradient in place: the figures are high, on the safe side"),
    "chunked_cross_entropy": ((False,), "Axolotl's chunked cross-entropy (monkeypatch/loss/chunked.py, torchtune's CEWithChunkedOutputLoss under torch.compile) upcasts one chunk of the logits to fp32 at a time where memfit counts the whole logits upcast: the figures are high, on the safe side"),
    "tiled_mlp": ((False,), "tiled MLP computes the MLP in chunks: the figures are high, on the safe side"),
    "unfrozen_parameters": ((), "only the parameters matching these patterns are trained: the figures are high, on the safe side (fewer gradients and less optimizer state)"),
    "peft_layers_to_transform": ((), "LoRA on some layers only: the figures are high, on the safe side (fewer adapters)"),
    "lora_target_parameters": ((), "LoRA on parameters (MoE experts) rather than modules: the figures are low by those adapters"),
    "context_parallel_size": ((1,), "context parallelism splits the sequence across GPUs: the figures are high, on the safe side (each GPU holds its share of the sequence's activations)"),
    "tensor_parallel_size": ((1,), "tensor parallelism (memfit's parallel.tensor; not read from Axolotl yet): the figures are high, on the safe side (each GPU holds its share)"),
    "fp8": ((False,), "fp8 training: the figures may be low or high (fp8 copies of the weights are added, the saved activations are smaller)"),
    "relora": ((False,), "ReLoRA merges and resets adapters: the figures are low by the merges' temporaries"),
    "rl": ((), "preference and RL training (dpo, ipo, orpo, kto, simpo, grpo) runs chosen and rejected sequences (and, for a full fine-tune, a reference model): the figures are low (two sequences per sample, and a reference model where one is loaded)"),
    "lisa_n_layers": ((), "LISA trains a few layers at a time: the figures are high, on the safe side (fewer gradients and less optimizer state)"),
    "torch_compile": ((False,), COMPILED),
    "lora_rank_pattern": ((), "per-module LoRA ranks: the figures may be low or high (low where a pattern's rank is above lora_r, high where below)"),
    "bnb_config_kwargs": ((), "bitsandbytes quantization overrides: the figures may be low or high"),
}

PRECISION = {"bfloat16": "bf16-true", "float16": "16-true", "float32": "32-true"}


def _adapter(r: Reader, torch_dtype: str, load_in_4bit: bool, load_in_8bit: bool) -> None:
    """adapter: lora / qlora with their keys, and the quantization Axolotl's _set_quantization_config applies."""
    data = r.data
    adapter = r.get("adapter", (str,), None)
    if adapter in ("lora", "qlora"):
        lora = {}
        if r.has("lora_r"):
            lora["r"] = r.get("lora_r", (int,), 8)
        else:
            lora["r"] = 8  # peft LoraConfig.r default
        if r.has("lora_alpha"):
            lora["alpha"] = r.get("lora_alpha", (int, float), 8)
        lora["dropout"] = r.get("lora_dropout", (int, float), 0.0)
        targets = r.get("lora_target_modules", (list, str), None)
        if r.get("lora_target_linear", (bool,), None):
            lora["target_modules"] = "all-linear"
            target_at = r.at("lora_target_linear")
        elif targets is not None:
            lora["target_modules"] = targets
            target_at = r.at("lora_target_modules")
        else:
            target_at = None
        save = r.get("lora_modules_to_save", (list,), None)
        if save:
            lora["modules_to_save"] = save
        if r.get("peft_use_dora", (bool,), None):
            lora["use_dora"] = True
        if r.get("peft_autocast_adapter_dtype", (bool,), None) is not None:  # passed to get_peft_model when set
            lora["autocast_adapter_dtype"] = r.get("peft_autocast_adapter_dtype", (bool,), None)
        r.set(("lora",), lora, r.at("adapter"))
        for key, memfit in (("lora_r", "r"), ("lora_alpha", "alpha"), ("lora_dropout", "dropout"), ("lora_modules_to_save", "modules_to_save"), ("peft_use_dora", "use_dora"), ("peft_autocast_adapter_dtype", "autocast_adapter_dtype")):
            if key in data and memfit in lora:
                r.origin(("lora", memfit), r.at(key))
        if target_at is not None:
            r.origin(("lora", "target_modules"), target_at)
        if adapter == "qlora" and load_in_4bit:
            r.set(("quantization",), {"method": "nf4", "double_quant": True, "compute_dtype": torch_dtype}, r.at("load_in_4bit"))
        elif adapter == "lora" and load_in_8bit:
            r.set(("quantization",), {"method": "int8"}, r.at("load_in_8bit"))
        elif load_in_4bit or load_in_8bit:
            key = "load_in_4bit" if load_in_4bit else "load_in_8bit"
            r.warn(r.at(key), f"{key} with adapter {adapter}: Axolotl's _set_quantization_config quantizes only qlora + load_in_4bit or lora + load_in_8bit; memfit counts the base unquantized")
    elif adapter is not None:
        r.warn(r.at("adapter"), f"adapter {adapter}: memfit models lora and qlora; counted as a full fine-tune")
    elif load_in_4bit or load_in_8bit:
        key = "load_in_4bit" if load_in_4bit else "load_in_8bit"
        r.warn(r.at(key), f"{key} without an adapter: memfit counts a full fine-tune of the unquantized model")


def read(r: Reader, ctx) -> dict:
    data = r.data
    r.native.root = r.at("base_model", on_key=True) if "base_model" in data else r.at()
    config_key = "base_model_config" if r.has("base_model_config") else "base_model"
    raw = ctx.model(r.get(config_key, (str,)), r.at(config_key))
    overrides = r.get("overrides_of_model_config", (dict,), None)
    if overrides and raw is not None:
        # loaders/model.py: each key is set on the loaded config (setattr), so the model is built with it
        r.set(("model",), {"transformer": {**raw, **overrides}}, r.at("overrides_of_model_config", on_key=True))

    # precision: utils/config/__init__.py resolve_dtype, line for line (no mps, no ray)
    bf16 = r.get("bf16", (bool, "auto", "full"), "auto")
    fp16 = r.get("fp16", (bool,), None)
    float16 = r.get("float16", (bool,), None)
    bfloat16 = r.get("bfloat16", (bool,), None)
    load_in_8bit = r.get("load_in_8bit", (bool,), False)
    load_in_4bit = r.get("load_in_4bit", (bool,), False)
    if bf16 in (True, "full") and fp16 is True:
        r.error(r.at("fp16"), codes.NATIVE_CONFIG, "bf16 and fp16 are both true: say which one you mean (Axolotl's resolve_dtype would silently drop fp16)")
    if not fp16 and bf16 == "auto":
        from memfit.read.native.settings import bf16_capable

        bf16 = bf16_capable(ctx.conf)
        if not bf16 and fp16 is None and not float16:
            fp16 = True
    if fp16 and bf16 == "auto":
        bf16 = False
    if bf16:
        fp16 = False
    torch_dtype = "bfloat16" if bf16 or bfloat16 else "float16" if load_in_8bit or fp16 or float16 else "float32"
    where = next((k for k in ("bfloat16", "float16", "bf16", "fp16") if k in data), None)
    r.set(("precision",), PRECISION[torch_dtype], r.at(where) if where else None)

    from memfit.read.native import vision

    vision.axolotl(r, ctx)   # (issue 34) a vision-language model's image size
    micro = r.get("micro_batch_size", (int,), 1)
    accum = r.get("gradient_accumulation_steps", (int,), 1)
    seq = r.get("sequence_len", (int,), 512)
    r.set(("training", "micro_batch"), micro, r.at("micro_batch_size") if "micro_batch_size" in data else None)
    r.set(("training", "seq_len"), seq, r.at("sequence_len") if "sequence_len" in data else None)
    if accum != 1 or "gradient_accumulation_steps" in data:
        r.set(("training", "gradient_accumulation"), accum, r.at("gradient_accumulation_steps") if "gradient_accumulation_steps" in data else None)

    checkpointing = r.get("gradient_checkpointing", (bool, "offload", "offload_disk"), False)
    if checkpointing:
        r.set(("training", "checkpointing"), "full", r.at("gradient_checkpointing"))
        if checkpointing in ("offload", "offload_disk"):
            # the checkpoints (each layer's input) leave the GPU: activation offloading over full checkpointing
            r.set(("training", "activation_offloading"), True, r.at("gradient_checkpointing"))
    else:
        r.set(("training", "checkpointing"), "none")
    hf.every_n_layers(r, "gradient_checkpointing_kwargs", checkpointing)
    if r.get("activation_offloading", (bool, "legacy", "disk"), False):
        r.set(("training", "activation_offloading"), True, r.at("activation_offloading"))

    attention = _attention(r)
    r.set(("training", "attention"), attention[0], attention[1])

    optimizer(r, r.get("optimizer", (str,), "adamw_torch_fused"), r.at("optimizer") if "optimizer" in data else None)

    _adapter(r, torch_dtype, load_in_4bit, load_in_8bit)

    if data.get("val_set_size") or data.get("test_datasets"):  # Axolotl evaluates only with a validation split (val_set_size default 0)
        r.eval_batch("eval_batch_size", micro, conf=ctx.conf)
    trainer = {
        "micro_batch": (micro, r.at("micro_batch_size") if "micro_batch_size" in data else None),
        "grad_accum": (accum, r.at("gradient_accumulation_steps") if "gradient_accumulation_steps" in data else None),
        "bf16": (bool(bf16), r.at("bf16") if "bf16" in data else None),
        "fp16": (bool(fp16), r.at("fp16") if "fp16" in data else None),
    }
    if r.has("deepspeed"):
        ctx.deepspeed(data["deepspeed"], r.at("deepspeed"), trainer)
    _fsdp(r)
    r.unmodelled(UNMODELLED)
    plugins = r.get("plugins", (list,), []) or []
    _fused_loss(r, plugins)
    _liger_kernels(r, plugins)
    for i, plugin in enumerate(plugins):
        if isinstance(plugin, str) and "liger" in plugin.lower() and not any(k.startswith("liger_") for k in data):
            r.warn(r.at("plugins", i), f"plugin {plugin.rsplit('.', 1)[-1]}: its kernels save less memory than memfit counts (enable keys: liger_*)")
    return trainer


# Axolotl's cross-entropy patches, in the order its check_cross_entropy_conflicts (utils/schemas/validation.py
# OptimizationValidationMixin, run on every config) lists them: more than one of them true is its ValueError
CROSS_ENTROPY = ("cut_cross_entropy", "chunked_cross_entropy", "liger_cross_entropy", "liger_fused_linear_cross_entropy")


def _refused(r: Reader, key: str, where: str, message: str) -> None:
    """Axolotl's own validation refuses the config: its message, cited, at the key."""
    r.error(r.at(key, on_key=True), codes.NATIVE_CONFIG, f"{key}: Axolotl refuses this config ({where}: \"{message}\")")


def _loss_refused(r: Reader, cce_plugin: int | None) -> bool:
    """Axolotl's validation of its cross-entropy keys (axolotl 067b021, mode="before" validators on the raw keys):
    check_cross_entropy_conflicts first (the base config's), then, with the Cut Cross-Entropy plugin listed, its
    CutCrossEntropyArgs (integrations/cut_cross_entropy/args.py): chunked_cross_entropy true, whatever
    cut_cross_entropy says, then cut_cross_entropy true without bf16 or fp16 set. True when one refuses the config."""
    enabled = [k for k in CROSS_ENTROPY if r.data.get(k)]  # truthy, as the validators read the raw keys
    if len(enabled) > 1:
        _refused(r, enabled[1], "utils/schemas/validation.py check_cross_entropy_conflicts", "Only one cross entropy optimization can be enabled at a time. "
                 f"Found {len(enabled)} enabled: {', '.join(enabled)}. Please disable all but one.")
        return True
    if cce_plugin is None:
        return False
    where = "integrations/cut_cross_entropy/args.py CutCrossEntropyArgs"
    if enabled == ["chunked_cross_entropy"]:
        _refused(r, "chunked_cross_entropy", f"{where}.check_chunked_cross_entropy_not_set, the plugin listed", "Cut Cross Entropy does not support chunked "
                 "cross entropy. Please set `chunked_cross_entropy` to `False` or disable Cut Cross Entropy.")
        return True
    if enabled == ["cut_cross_entropy"] and not (r.data.get("bf16") or r.data.get("fp16")):
        _refused(r, "cut_cross_entropy", f"{where}.check_dtype_is_half", "Cut Cross Entropy requires fp16/bf16 training for backward pass. "
                 "Please set `bf16` or `fp16` to `True`.")
        return True
    return False


def _fused_loss(r: Reader, plugins: list) -> None:
    """training.fused_loss from the key that switches it on, when the plugin that applies it is listed
    (integrations/liger, integrations/cut_cross_entropy: the key is that plugin's argument)."""
    cce_plugin = next((i for i, p in enumerate(plugins) if isinstance(p, str) and "cut_cross_entropy" in p.lower()), None)
    if _loss_refused(r, cce_plugin):
        return
    on = [k for k in ("liger_fused_linear_cross_entropy", "cut_cross_entropy") if r.get(k, (bool,), None)]
    if cce_plugin is not None and "cut_cross_entropy" not in r.data:
        # CutCrossEntropyArgs.cut_cross_entropy defaults to True (53dbf97d8, "make cce default to true when using the
        # plugin"): listing the plugin switches it on
        if on:
            r.warn(r.at("plugins", cce_plugin), f"plugin CutCrossEntropyPlugin turns cut_cross_entropy on by default, beside {on[0]}: "
                                                "both patch the model's forward; memfit counts " + on[0] + " (set cut_cross_entropy: false)")
        else:
            r.set(("training", "fused_loss"), "cut_cross_entropy", r.at("plugins", cce_plugin))
    for key in on:
        kind, plugin = ("liger", "liger") if key == "liger_fused_linear_cross_entropy" else ("cut_cross_entropy", "cut_cross_entropy")
        if not any(isinstance(p, str) and plugin in p.lower() for p in plugins):
            r.warn(r.at(key), f"{key}: Axolotl applies it through its plugin (plugins: axolotl.integrations.{plugin}...), "
                              f"which is not listed; memfit counts the whole logits")
            continue
        r.set(("training", "fused_loss"), kind, r.at(key))


def _liger_kernels(r: Reader, plugins: list) -> None:
    """training.liger_kernels from the Liger plugin's keys (integrations/liger/plugin.py LigerPlugin.pre_model_load:
    `kwargs["rms_norm"] = cfg.liger_rms_norm`, `kwargs["swiglu"] = cfg.liger_glu_activation`, handed to the model
    type's apply_liger_kernel_to_*), when the plugin is listed."""
    listed = any(isinstance(p, str) and "liger" in p.lower() for p in plugins)
    if listed and r.data.get("liger_swiglu") is not None and r.data.get("liger_glu_activation") is not None:
        # LigerArgs.check_deprecated_swiglu: the deprecated spelling beside the new one, whatever their values
        _refused(r, "liger_swiglu", "integrations/liger/args.py LigerArgs.check_deprecated_swiglu, the Liger plugin listed",
                 "You cannot have both `liger_swiglu` and `liger_glu_activation` set.")
        return
    if listed and _liger_refused(r):
        return
    on = [(key, kernel) for key, kernel in (("liger_rms_norm", "rms_norm"), ("liger_glu_activation", "swiglu"),
                                            ("liger_swiglu", "swiglu")) if r.get(key, (bool,), None)]
    if not on:
        return
    if not listed:
        for key, _ in on:
            r.warn(r.at(key), f"{key}: Axolotl applies it through its plugin (plugins: axolotl.integrations.liger...), "
                              f"which is not listed; memfit counts the model's own modules")
        return
    kernels = list(dict.fromkeys(kernel for _, kernel in on))
    r.set(("training", "liger_kernels"), kernels, r.at(on[0][0]))


def _liger_refused(r: Reader) -> bool:
    """LigerArgs' other validators at axolotl 067b021 (integrations/liger/args.py, the plugin listed): the GLU kernel
    beside tiled_mlp without its original-MLP switch; token scaling without the fused loss; the RMSNorm kernel, or
    Liger's fused loss, under tensor parallelism."""
    data = r.data
    tensor = data.get("tensor_parallel_size")
    parallel = isinstance(tensor, int) and not isinstance(tensor, bool) and tensor > 1
    if data.get("liger_glu_activation") is True and data.get("tiled_mlp") is True and not data.get("tiled_mlp_use_original_mlp"):
        _refused(r, "tiled_mlp", "integrations/liger/args.py LigerArgs.check_tiled_mlp_conflict, the Liger plugin listed",
                 "You cannot have both `liger_glu_activation` and `tiled_mlp` set without `tiled_mlp_use_original_mlp: true`.")
        return True
    if data.get("liger_use_token_scaling") and not data.get("liger_fused_linear_cross_entropy"):
        _refused(r, "liger_use_token_scaling", "integrations/liger/args.py LigerArgs.check_liger_use_token_scaling_flce, the Liger plugin listed",
                 "`liger_use_token_scaling: true` requires `liger_fused_linear_cross_entropy` enabled.")
        return True
    if data.get("liger_rms_norm") and parallel:
        _refused(r, "liger_rms_norm", "integrations/liger/args.py LigerArgs.check_liger_rms_norm_tensor_parallel, the Liger plugin listed",
                 "`liger_rms_norm` is incompatible with tensor parallelism, see https://github.com/linkedin/Liger-Kernel/issues/826")
        return True
    if data.get("liger_fused_linear_cross_entropy") and parallel:
        _refused(r, "liger_fused_linear_cross_entropy", "integrations/liger/args.py "
                 "LigerArgs.check_tensor_parallel_size_liger_fused_linear_cross_entropy, the Liger plugin listed",
                 "Tensor parallelism is not compatible with liger losses.")
        return True
    return False


def _attention(r: Reader):
    data = r.data
    impl = r.get("attn_implementation", (str,), None)
    if impl is not None:
        mapped = hf.ATTENTION.get(impl)
        if mapped is None:
            r.warn(r.at("attn_implementation"), f"attn_implementation {impl}: memfit models eager, sdpa and flash attention; counted as sdpa")
            return "sdpa", r.at("attn_implementation")
        return mapped, r.at("attn_implementation")
    for key, value in (("flash_attention", "flash"), ("sdp_attention", "sdpa"), ("eager_attention", "eager")):
        if r.get(key, (bool,), False):
            return value, r.at(key)
    if r.get("xformers_attention", (bool,), False) or r.get("flex_attention", (bool,), False):
        key = "xformers_attention" if data.get("xformers_attention") else "flex_attention"
        r.warn(r.at(key), f"{key}: memfit models eager, sdpa and flash attention; counted as sdpa")
        return "sdpa", r.at(key)
    return hf.DEFAULT_ATTENTION, None


def optimizer(r: Reader, name: str, at) -> None:
    """The Trainer's optim name -> optimizer, optimizer_impl and the state dtype."""
    found = hf.optim(name)
    if found is None:
        r.set(("optimizer",), "adamw", at)
        r.warn(at or r.native.root, f"optimizer {name}: memfit does not model its state; counted as AdamW")
        return
    optimizer_name, impl, state = found
    r.set(("optimizer",), optimizer_name, at)
    if impl is not None:
        r.set(("training", "optimizer_impl"), impl, at)
    if state is not None:
        r.set(("dtypes", "optimizer_state"), state, at)
    if state == "float32" and "paged" in name.strip().lower():  # trainer_optimizer.py: is_paged = "paged" in optim
        r.set(("training", "paged_optimizer"), True, at)  # bitsandbytes' 32-bit paged state (ledger/techniques/paged_optimizer.py)


def _fsdp(r: Reader) -> None:
    data = r.data
    config = r.get("fsdp_config", (dict,), None)
    legacy = r.get("fsdp", (list, str), None)
    if config is None and not legacy:
        return
    if r.has("deepspeed"):
        r.error(r.at("fsdp_config" if config is not None else "fsdp", on_key=True), codes.NATIVE_CONFIG, "deepspeed and FSDP together: Axolotl runs one of them")
        return
    config = config or {}

    def opt(*names, default=None):
        for name in names:
            if name in config:
                return r.get(name, (bool, str, int), default, data=config, prefix=("fsdp_config",)), r.at("fsdp_config", name)
        return default, None

    strategy, strategy_at = "full_shard", r.at("fsdp_config" if "fsdp_config" in data else "fsdp", on_key=True)
    reshard, reshard_at = opt("reshard_after_forward", "fsdp_reshard_after_forward")
    sharding, sharding_at = opt("sharding_strategy", "fsdp_sharding_strategy")
    if reshard is False:
        strategy, strategy_at = "shard_grad_op", reshard_at
    elif sharding is not None:
        from memfit.read.native.accelerate import FSDP_STRATEGY

        strategy = FSDP_STRATEGY.get(str(sharding).upper()) or "full_shard"
        strategy_at = sharding_at
    elif isinstance(legacy, (list, str)) and "shard_grad_op" in (legacy if isinstance(legacy, list) else legacy.split()):
        strategy = "shard_grad_op"
    r.set(("parallel", "fsdp"), strategy, strategy_at)
    # fsdp_version (top level, or in fsdp_config, where axolotl moves it from): 2 is FSDP2; 1 and unset FSDP1
    # (schemas/validation.py check_fsdp_version_in_fsdp_config pins an unversioned fsdp_config to 1, since
    # transformers >= 5.10 would default it to 2)
    version, version_at = (r.get("fsdp_version", (int,), None), r.at("fsdp_version")) if "fsdp_version" in data else opt("fsdp_version", "version")
    if str(version) != "2":
        r.set(("parallel", "fsdp_version"), 1, version_at or strategy_at)
    offload, offload_at = opt("offload_params", "fsdp_offload_params", default=False)
    if not offload and isinstance(legacy, (list, str)) and "offload" in (legacy if isinstance(legacy, list) else legacy.split()):
        offload, offload_at = True, r.at("fsdp")
    if offload:
        r.set(("parallel", "offload", "optimizer"), "cpu", offload_at)
        r.set(("parallel", "offload", "parameters"), "cpu", offload_at)
    checkpoint, checkpoint_at = opt("activation_checkpointing", "fsdp_activation_checkpointing", default=False)
    if checkpoint:
        r.set(("training", "checkpointing"), "full", checkpoint_at)

"""LLaMA-Factory's v1 format (USE_V1=1; hiyouga/LLaMA-Factory src/llamafactory/v1/, examples/v1/): a `model` name
with plugin configs (`peft_config`, `quant_config`, `kernel_config`, `dist_config`, `init_config`, `optim_config`)
and v1's own TrainingArguments (`micro_batch_size`, `cutoff_len`, `batching_strategy`, ...). The table KEYS says what
memfit reads from each key, its default and the code that decides it (paths under src/llamafactory/v1/);
docs/native-llama-factory.md ("The v1 format") cites each.

What runs (v1 at ff6d4d1): core/model_engine.py ModelEngine._init_model loads the checkpoint with dtype="auto" (the
config.json's dtype); without peft_config the whole model is cast to float32 (`model.to(torch.float32)`), with LoRA
peft keeps the base in the checkpoint's dtype and the adapters in float32. No autocast anywhere: on one GPU
(llamafactory-cli runs torchrun only with more than one device, launcher.py; accelerator/helper.py is_distributed:
RANK set) there is no mesh and fsdp2 wraps nothing (fsdp2.py prepare_model: "No FSDP Mesh available"), so the step
runs in the loaded dtypes; on more GPUs FSDP2's MixedPrecisionPolicy computes in bfloat16 when `bf16` (fsdp2.py
get_mp_policy) over float32 shards. core/base_trainer.py: torch.optim.AdamW over the trainable parameters (foreach),
gradient checkpointing on (enable_activation_checkpointing), one step of global_batch_size // (dp x micro_batch_size)
micro-batches; SFTTrainer.compute_loss -> compute_log_probs: the model's own loss (the labels are passed), then the
trainer's per-token log-probs from the logits (training.second_loss log_probs).
"""

from __future__ import annotations

from memfit.diagnostics import codes
from memfit.read.native import hf
from memfit.read.native.base import At, Found, Reader

V1 = "src/llamafactory/v1/"
KEYS = {
    "model": ("Qwen/Qwen3-4B-Instruct-2507", "model.hf_config", "config/model_args.py ModelArguments.model"),
    "model_class": ("llm", "llm: the causal LM (AutoModelForCausalLM, AutoModelForImageTextToText) as read; cls, other: warned", "config/model_args.py model_class; core/model_engine.py _init_model"),
    "flash_attn": ("sdpa", "training.attention: eager, sdpa; flash_attention_2 -> flash", "config/model_args.py flash_attn (utils/types.py AttentionFunction)"),
    "peft_config": (None, "none: a full fine-tune (float32 weights); lora: the lora section; freeze: warned", "config/model_args.py peft_config; plugins/model_plugins/peft.py"),
    "peft_config.r": (8, "lora.r", "plugins/model_plugins/peft.py LoraParams.r"),
    "peft_config.lora_alpha": (16, "lora.alpha", "plugins/model_plugins/peft.py LoraParams.lora_alpha"),
    "peft_config.lora_dropout": (0.05, "lora.dropout", "plugins/model_plugins/peft.py LoraParams.lora_dropout"),
    "peft_config.target_modules": ("all", "lora.target_modules (all -> all-linear: every Linear but lm_head, output, score, classifier)", "plugins/model_plugins/peft.py get_lora_model, _find_all_linear_modules"),
    "peft_config.use_dora": (False, "lora.use_dora", "plugins/model_plugins/peft.py LoraParams.use_dora"),
    "peft_config.modules_to_save": (None, "lora.modules_to_save", "plugins/model_plugins/peft.py LoraParams.modules_to_save"),
    "quant_config": (None, "none: no quantization; bnb, auto: bitsandbytes", "config/model_args.py quant_config; plugins/model_plugins/quantization.py"),
    "quant_config.quantization_bit": (None, "4 -> quantization nf4/fp4 (bnb: none -> 4, with LLaMA-Factory's warning); 8 in training: refused", "plugins/model_plugins/quantization.py BnbParams, quantization_with_bnb"),
    "quant_config.quantization_type": ("nf4", "quantization.method", "plugins/model_plugins/quantization.py BnbParams.quantization_type"),
    "quant_config.double_quantization": (True, "quantization.double_quant", "plugins/model_plugins/quantization.py BnbParams.double_quantization"),
    "quant_config.compute_dtype": ("float16", "quantization.compute_dtype", "plugins/model_plugins/quantization.py BnbParams.compute_dtype"),
    "kernel_config": (None, "auto: nothing on CUDA (the NPU kernels only); liger_kernel: training.liger_kernels (apply_liger_kernel_to_<model type>'s defaults, the model types v1 patches), Liger's cross-entropy warned; the others: warned", "plugins/model_plugins/kernels/interface.py apply_kernels, _AUTO_KERNELS; kernels/liger_kernel_ops.py LigerKernel._apply"),
    "dist_config": (None, "none: one GPU, DDP on more; fsdp2: parallel.fsdp full_shard, fsdp_version 2; deepspeed: its config_file", "config/training_args.py dist_config; plugins/trainer_plugins/distributed/interface.py"),
    "dist_config.reshard_after_forward": (True, "parallel.fsdp: true full_shard, false shard_grad_op", "plugins/trainer_plugins/distributed/fsdp2.py FSDP2Engine.__init__"),
    "dist_config.offload_params": (False, "parallel.offload parameters and optimizer: cpu (CPUOffloadPolicy)", "plugins/trainer_plugins/distributed/fsdp2.py prepare_model"),
    "dist_config.config_file": (None, "the DeepSpeed JSON (bf16 \"auto\" -> on)", "plugins/trainer_plugins/distributed/deepspeed.py DeepSpeedEngine; plugins/model_plugins/deepspeed_utils.py infer_deepspeed_mixed_precision"),
    "bf16": (True, "precision bf16-mixed for a full fine-tune under fsdp2 on more than one GPU (MixedPrecisionPolicy param_dtype bfloat16); no effect on one GPU", "config/training_args.py bf16; plugins/trainer_plugins/distributed/fsdp2.py get_mp_policy"),
    "micro_batch_size": (1, "training.micro_batch (1 under padding_free)", "config/training_args.py micro_batch_size"),
    "global_batch_size": (None, "training.gradient_accumulation = global_batch_size / (dp x micro_batch_size)", "config/training_args.py global_batch_size; core/utils/batching.py BatchGenerator"),
    "cutoff_len": (2048, "training.seq_len (micro_batch_size x cutoff_len under padding_free)", "config/training_args.py cutoff_len; core/utils/collation.py pad_and_truncate"),
    "batching_strategy": ("normal", "normal, dynamic_batching: micro_batch_size rows of up to cutoff_len; padding_free, dynamic_padding_free: one row of micro_batch_size x cutoff_len", "config/arg_utils.py BatchingStrategy; plugins/trainer_plugins/batching.py"),
    "enable_activation_checkpointing": (True, "training.checkpointing full unless false", "config/training_args.py; core/base_trainer.py gradient_checkpointing_enable"),
    "optim_config": (None, "none: torch.optim.AdamW (foreach); muon: warned", "core/base_trainer.py _init_optimizer; plugins/trainer_plugins/optimizers/"),
    "cp_size": (1, "data ranks = GPUs / cp_size (above 1: warned)", "config/training_args.py cp_size; accelerator/interface.py DistributedStrategy"),
    "dp_size": (None, "data ranks (GPUs / cp_size)", "accelerator/interface.py DistributedStrategy"),
    "init_config": (None, "how the weights load (init_on_default, init_on_rank0, init_on_meta): no step memory; init_on_meta with LoRA or quant_config refused", "plugins/model_plugins/initialization.py; core/model_engine.py _init_model"),
}

# keys read for what they mean, not for bytes
NO_MEMORY = (
    "train_dataset", "eval_dataset", "output_dir", "learning_rate", "num_train_epochs", "max_steps", "max_grad_norm", "seed",
    "trust_remote_code", "custom_chat_template", "lr_scheduler_config", "batching_workers", "dist_timeout", "full_determinism",
    "resume_from_checkpoint", "save_steps", "save_epochs", "save_total_limit", "logging_steps", "sample_backend",
    "max_new_tokens", "cp_mode",
)

UNMODELLED = {
    "mp_replicate_size": ((1,), "FSDP2 over a (replicate, shard) mesh shards each parameter over mp_shard_size ranks only, where memfit shards over every rank: the figures are low"),
    "mp_shard_size": ((None,), "FSDP2 shards each parameter over mp_shard_size ranks; memfit shards over every rank: the figures are low when it is fewer"),
    "save_ckpt_as_hf": ((False,), "saving Hugging Face checkpoints gathers the full state dict while saving (LLaMA-Factory: \"doubles memory usage\"); memfit prices the step: the figures are low while saving"),
    "pref_loss": (("sigmoid",), "a preference loss (llamafactory-cli dpo): DPO computes the policy's and a reference's log-probs on chosen and rejected sequences; memfit counts one SFT step: the figures are low"),
    "pref_beta": ((0.1,), "a DPO setting (llamafactory-cli dpo): memfit counts one SFT step, the DPO step's two passes are left out: the figures are low"),
    "pref_ftx": ((0.0,), "a DPO setting (llamafactory-cli dpo): memfit counts one SFT step: the figures are low"),
}

# kernel_config names (plugins/model_plugins/kernels/: KernelPlugin(...).register()) -> what memfit says
KERNELS = {
    "auto": None,  # interface.py _AUTO_KERNELS: NPU kernels only; nothing on CUDA
    "liger_kernel": "training.liger_kernels: apply_liger_kernel_to_<model type>'s default kernels (RMSNorm and SwiGLU priced, RoPE a note), for the model types v1 patches; in training (require_logits) Liger's cross-entropy in place of its fused one, which keeps the logits' gradient in place of its input where memfit counts the eager loss's log-softmax: the figures are high, on the safe side",
    "flash-linear-attention": "flash-linear-attention's gated delta-rule kernels (Qwen3.5's linear attention): memfit does not model them, the figure may be high or low",
    "cuda_fused_moe": "a fused MoE kernel: memfit counts transformers' expert loop, the figure may be high or low",
    "npu_fused_moe": "an Ascend NPU kernel (it refuses a CUDA device): memfit prices the unfused model",
    "npu_fused_swiglu": "an Ascend NPU kernel (it refuses a CUDA device): memfit prices the unfused model",
    "npu_fused_rmsnorm": "an Ascend NPU kernel (it refuses a CUDA device): memfit prices the unfused model",
    "npu_fused_rope": "an Ascend NPU kernel (it refuses a CUDA device): memfit prices the unfused model",
}
LIGER_MODEL_TYPES = ("qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")  # liger_kernel_ops.py
# what LigerKernel._apply turns on (liger_kernel_ops.py): apply_kernels passes no use_kernels, so "auto", each
# apply_liger_kernel_to_<model type> called with its signature's defaults: rope, rms_norm, swiglu for qwen3 and qwen3_moe
# (liger-kernel 0.6.4 transformers/monkey_patch.py), rms_norm and swiglu (rope=False) for qwen3_next (0.6.4) and qwen3_5,
# qwen3_5_moe (added in 0.8.0; the same at ead96b61). The losses are not here: in training require_logits turns the fused
# linear cross-entropy off and Liger's cross_entropy on. liger-kernel defines no apply_liger_kernel_to_qwen3_5_text nor
# _moe_text (to ead96b61), the names v1 looks up for those two types: its getattr raises AttributeError
# (as the other readers, a list of names: the model types whose function liger-kernel defines, those whose default rope is True)
LIGER_DEFINED = ("qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe")
LIGER_ROPE = ("qwen3", "qwen3_moe")
ATTENTION = {"eager": "eager", "sdpa": "sdpa", "flash_attention_2": "flash"}
STRATEGIES = ("normal", "padding_free", "dynamic_batching", "dynamic_padding_free")

def not_training(data: dict) -> str | None:
    """examples/v1/train_lora/export_lora.yaml: peft_config.export_dir with no train_dataset merges an adapter."""
    peft = data.get("peft_config")
    if isinstance(peft, dict) and peft.get("export_dir") and "train_dataset" not in data:
        return "peft_config"
    return None


def read(r: Reader, ctx) -> dict:
    data = r.data
    r.native.root = r.at("model", on_key=True)
    ctx.model(r.get("model", (str,)), r.at("model"))
    gpus = ctx.conf.get("gpus") or 1
    model_class = r.get("model_class", (str,), "llm", choices=("llm", "cls", "other"))
    if model_class != "llm":
        r.warn(r.at("model_class"), f"model_class {model_class}: {'a token-classification head (one label)' if model_class == 'cls' else 'the bare AutoModel, no head'}; "
                                    "memfit counts the causal LM's head and its logits: the figures are high")
    attention = r.get("flash_attn", (str,), "sdpa", choices=tuple(ATTENTION))
    r.set(("training", "attention"), ATTENTION[attention], r.at("flash_attn") if "flash_attn" in data else None)

    peft = _plugin(r, "peft_config", ("lora", "freeze"))
    quant = _plugin(r, "quant_config", ("bnb", "auto"))
    dist = _plugin(r, "dist_config", ("fsdp2", "deepspeed", "fsdpturbo"))
    init = _plugin(r, "init_config", ("init_on_default", "init_on_rank0", "init_on_meta"))
    kind = peft.get("name") if peft else None
    if init and init.get("name") == "init_on_meta" and (kind == "lora" or quant):
        r.error(r.at("init_config", "name"), codes.NATIVE_CONFIG, "init_on_meta with " + ("LoRA" if kind == "lora" else "quant_config")
                + ": LLaMA-Factory refuses it (core/model_engine.py _init_model: lora and quantization load real weights)")

    # the dtypes: ModelEngine loads with dtype="auto" (the checkpoint's); a full fine-tune is cast to float32
    stored = (ctx.model_config or {}).get("torch_dtype", (ctx.model_config or {}).get("dtype"))
    loaded = stored if stored in ("bfloat16", "float16", "float32") else "float32"
    bf16 = r.get("bf16", (bool,), True)
    fsdp = bool(dist) and dist.get("name") == "fsdp2" and gpus > 1
    if kind == "lora":
        precision = {"bfloat16": "bf16-true", "float16": "16-true", "float32": "32-true"}[loaded]
        precision_at = r.at("peft_config", "name")
    else:
        precision = "bf16-mixed" if fsdp and bf16 else "32-true"
        precision_at = r.at("bf16") if fsdp and "bf16" in data else None
        if kind == "freeze":
            r.warn(r.at("peft_config", "name"), "peft_config freeze: only the last freeze_trainable_layers layers train (cast to float32), "
                                                "the rest stay frozen in the checkpoint's dtype; memfit counts a full fine-tune in float32: the figures are high")
    r.set(("precision",), precision, precision_at)
    if kind == "lora":
        _lora(r, peft)
    if quant:
        _quant(r, quant, kind)

    micro = r.get("micro_batch_size", (int,), 1)
    cutoff = r.get("cutoff_len", (int,), 2048)
    strategy = r.get("batching_strategy", (str,), "normal", choices=STRATEGIES)
    if strategy == "padding_free" and attention != "flash_attention_2":
        r.error(r.at("batching_strategy"), codes.NATIVE_CONFIG, "batching_strategy padding_free needs flash_attn: flash_attention_2 (core/base_trainer.py _create_batch_generator refuses it)")
    if strategy == "dynamic_batching" and not (isinstance(data.get("max_steps"), int) and data["max_steps"] > 0):
        r.error(r.at("batching_strategy"), codes.NATIVE_CONFIG, "batching_strategy dynamic_batching needs max_steps (config/training_args.py: it is step-driven)")
    strategy_at = r.at("batching_strategy") if "batching_strategy" in data else None
    if strategy in ("padding_free", "dynamic_padding_free"):
        # plugins/trainer_plugins/batching.py: the micro-batch's samples packed into one row (dynamic: up to a budget of
        # cutoff_len x micro_batch_size tokens)
        # (no origin: a fix's edit of training.micro_batch is micro_batch_size's, read/native/edits.py)
        r.set(("training", "micro_batch"), 1)
        r.set(("training", "seq_len"), micro * cutoff)
    else:
        # normal pads to the batch's longest (at most cutoff_len); dynamic_batching keeps rows x padded length within
        # micro_batch_size x cutoff_len, the most at cutoff_len long rows
        r.set(("training", "micro_batch"), micro, r.at("micro_batch_size") if "micro_batch_size" in data else None)
        r.set(("training", "seq_len"), cutoff, r.at("cutoff_len") if "cutoff_len" in data else None)
    checkpointing = r.get("enable_activation_checkpointing", (bool,), True)
    r.set(("training", "checkpointing"), "full" if checkpointing else "none", r.at("enable_activation_checkpointing") if "enable_activation_checkpointing" in data else None)

    accum = _world(r, micro, gpus, attention, dist)
    _optimizer(r)
    _kernels(r, ctx)
    r.unmodelled(UNMODELLED)
    # core/base_trainer.py compute_log_probs: the batch's tensors (labels among them) go to the model, which computes
    # its own loss, and the trainer then upcasts the logits, copies their shifted view and takes
    # cross_entropy(reduction="none"): the two losses' tensors at once (ledger/techniques/second_loss.py)
    r.set(("training", "second_loss"), "log_probs")
    trainer = {
        "micro_batch": (micro, r.at("micro_batch_size") if "micro_batch_size" in data else None),
        "grad_accum": (accum, r.at("global_batch_size") if "global_batch_size" in data else None),
        "bf16": (True, None),
        "fp16": (False, None),
    }
    if dist and dist.get("name") == "fsdp2" and gpus > 1:
        reshard = r.get("reshard_after_forward", (bool,), True, data=dist, prefix=("dist_config",))
        r.set(("parallel", "fsdp"), "full_shard" if reshard else "shard_grad_op", r.at("dist_config", "reshard_after_forward") if "reshard_after_forward" in dist else r.at("dist_config", "name"))
        r.set(("parallel", "fsdp_version"), 2, r.at("dist_config", "name"))
        if r.get("offload_params", (bool,), False, data=dist, prefix=("dist_config",)):
            for target in ("parameters", "optimizer"):
                r.set(("parallel", "offload", target), "cpu", r.at("dist_config", "offload_params"))
    elif dist and dist.get("name") == "deepspeed":
        _deepspeed(r, ctx, dist, trainer)
    elif dist and dist.get("name") == "fsdpturbo":
        r.error(r.at("dist_config", "name"), codes.NATIVE_CONFIG, "dist_config fsdpturbo: FSDP with expert parallelism (ep_size); memfit does not model "
                "expert parallelism, so nothing is checked: write the run with fsdp2 or as a memfit config")
    return trainer


def _plugin(r: Reader, key: str, names: tuple) -> dict | None:
    """A plugin config (config/arg_utils.py get_plugin_config): a mapping with a `name`; None when absent."""
    value = r.get(key, (dict,), None)
    if value is None:
        return None
    name = value.get("name")
    if not isinstance(name, str):
        r.error(r.at(key, on_key=True), codes.NATIVE_CONFIG, f"{key} has no name (config/arg_utils.py get_plugin_config: \"Plugin configuration must have a 'name' field\")")
        return None
    if key != "kernel_config" and name not in names:
        r.error(r.at(key, "name"), codes.NATIVE_CONFIG, f"{key}.name is {name!r}: one of {', '.join(map(repr, names))}")
        return None
    return value


def _lora(r: Reader, peft: dict) -> None:
    def get(key, kinds, default):
        return r.get(key, kinds, default, data=peft, prefix=("peft_config",))

    lora = {"r": get("r", (int,), 8), "alpha": get("lora_alpha", (int, float), 16), "dropout": get("lora_dropout", (int, float), 0.05)}
    target = get("target_modules", (str, list), "all")
    lora["target_modules"] = "all-linear" if target == "all" else [target] if isinstance(target, str) else target
    extra = get("modules_to_save", (list, str), None)
    if extra:
        lora["modules_to_save"] = [extra] if isinstance(extra, str) else extra
    if get("use_dora", (bool,), False):
        lora["use_dora"] = True
    r.set(("lora",), lora, r.at("peft_config", "name"))
    for key, memfit in (("r", "r"), ("lora_alpha", "alpha"), ("lora_dropout", "dropout"), ("target_modules", "target_modules"), ("modules_to_save", "modules_to_save"), ("use_dora", "use_dora")):
        if key in peft and memfit in lora:
            r.origin(("lora", memfit), r.at("peft_config", key))
    if peft.get("adapter_name_or_path"):
        r.warn(r.at("peft_config", "adapter_name_or_path"), "training resumes the adapter at adapter_name_or_path with its own rank and targets "
               "(peft.py load_adapter: the peft_config's are ignored); memfit counts the peft_config's: the figures may be high or low")


def _quant(r: Reader, quant: dict, kind: str | None) -> None:
    def get(key, kinds, default, choices=None):
        return r.get(key, kinds, default, data=quant, prefix=("quant_config",), choices=choices)

    bits = get("quantization_bit", (int,), None)
    at = r.at("quant_config", "quantization_bit") if "quantization_bit" in quant else r.at("quant_config", "name")
    if bits is None:
        if quant.get("name") == "auto":  # quantization_auto: "No quantization method applied."
            return
        bits = 4  # quantization_with_bnb: "quantization_bit is not specified, default to 4-bit quantization."
    if kind != "lora":
        r.error(at, codes.NATIVE_CONFIG, "a quantized model trains only with LoRA: a full fine-tune casts the model to float32 "
                "(core/model_engine.py), which transformers refuses for a bitsandbytes model; freeze casts its layers the same way")
        return
    if bits == 8:
        r.error(at, codes.NATIVE_CONFIG, "quantization_bit 8 in training: LLaMA-Factory refuses it (quantization_with_bnb: \"Only 4-bit quantized model can use fsdp+qlora\")")
        return
    if bits != 4:
        r.error(at, codes.NATIVE_CONFIG, f"quantization_bit {bits}: bitsandbytes takes 4 or 8")
        return
    compute = get("compute_dtype", (str,), "float16", choices=("float16", "bfloat16", "float32"))
    r.set(("quantization",), {"method": get("quantization_type", (str,), "nf4", choices=("nf4", "fp4")), "double_quant": get("double_quantization", (bool,), True),
                              "compute_dtype": compute}, at)


def _world(r: Reader, micro: int, gpus: int, attention: str, dist: dict | None) -> int:
    """accelerator/interface.py DistributedStrategy: dp = world / cp; the step's micro-batches (core/utils/batching.py)."""
    data = r.data
    cp = r.get("cp_size", (int,), 1)
    if cp > 1:
        if attention != "flash_attention_2":
            r.error(r.at("cp_size"), codes.NATIVE_CONFIG, "cp_size above 1 needs flash_attn: flash_attention_2 (core/base_trainer.py: sequence parallelism requires flash attention)")
        if dist and dist.get("name") == "deepspeed":
            r.error(r.at("cp_size"), codes.NATIVE_CONFIG, "cp_size above 1 with deepspeed: LLaMA-Factory refuses it (context parallelism requires dist_config fsdp2)")
        r.warn(r.at("cp_size"), f"cp_size {cp}: Ulysses sequence parallelism splits each sequence over {cp} GPUs; memfit counts whole sequences on each GPU: the figures are high")
    if gpus % cp:
        r.error(r.at("cp_size"), codes.NATIVE_CONFIG, f"{gpus} GPU(s) (--gpus) do not divide by cp_size {cp} (accelerator/interface.py: world_size must be divisible by cp_size)")
        cp = 1
    dp = r.get("dp_size", (int,), None) or gpus // cp
    if dp * cp != gpus:
        r.error(r.at("dp_size"), codes.NATIVE_CONFIG, f"dp_size {dp} x cp_size {cp} is not the {gpus} GPU(s) (--gpus; accelerator/interface.py: dp_size * cp_size must equal world_size)")
    total = r.get("global_batch_size", (int,), None)
    if total is None:
        return 1
    if micro <= 0 or total % (dp * micro):
        r.error(r.at("global_batch_size"), codes.NATIVE_CONFIG, f"global_batch_size {total} is not {dp} data rank(s) x micro_batch_size {micro} x a number of micro-batches (core/utils/batching.py refuses it)")
        return 1
    accum = total // dp // micro
    r.set(("training", "gradient_accumulation"), accum)  # no origin: a fix never writes the accumulation into global_batch_size
    return accum if "global_batch_size" in data else 1


def _optimizer(r: Reader) -> None:
    optim = _plugin(r, "optim_config", ("muon",))
    name, impl, _ = hf.optim("adamw_torch")  # core/base_trainer.py: torch.optim.AdamW(trainable, lr=...)
    at = r.at("optim_config", "name") if optim else None
    r.set(("optimizer",), name, at)
    r.set(("training", "optimizer_impl"), impl, at)
    if optim:
        r.warn(at, "optim_config muon: Muon keeps one momentum buffer for each 2-D weight and AdamW's two moments for the rest "
                   "(muon_optimizer.py); memfit counts AdamW's two for every parameter: the figures are high")


def _kernels(r: Reader, ctx) -> None:
    kernel = _plugin(r, "kernel_config", ())
    if not kernel:
        return
    names = [n.strip() for n in kernel["name"].split(",") if n.strip()]
    if not names:
        r.error(r.at("kernel_config", "name"), codes.NATIVE_CONFIG, "kernel_config.name names no kernel (kernels/interface.py apply_kernels refuses it)")
    model_type = (ctx.model_config or {}).get("model_type")
    for name in names:
        if name not in KERNELS:
            r.error(r.at("kernel_config", "name"), codes.NATIVE_CONFIG, f"kernel_config.name {name!r}: one of {', '.join(map(repr, KERNELS))}")
        elif name == "liger_kernel" and model_type not in LIGER_MODEL_TYPES:
            r.note(r.at("kernel_config", "name"), f"liger_kernel: LLaMA-Factory v1 patches {', '.join(LIGER_MODEL_TYPES)} only; model type {model_type!r} runs unpatched, as memfit counts it")
        elif name == "liger_kernel":
            _liger(r, kernel, model_type)
        elif KERNELS[name]:
            r.warn(r.at("kernel_config", "name"), f"kernel_config {name}: {KERNELS[name]}")


def _liger(r: Reader, kernel: dict, model_type: str) -> None:
    """kernel_config liger_kernel on a model type v1 patches (liger_kernel_ops.py LigerKernel._apply): its default kernels
    are training.liger_kernels, as the Trainer's use_liger_kernel; model_engine.py applies it with require_logits=is_train
    (kernel_config.require_logits overrides it), so training runs Liger's cross-entropy, not its fused one."""
    at = r.at("kernel_config", "name")
    if model_type not in LIGER_DEFINED:
        r.warn(at, f"kernel_config liger_kernel: v1 calls liger_kernel.transformers.apply_liger_kernel_to_{model_type}, which liger-kernel does not define "
                   "(its getattr raises AttributeError at model load); memfit prices the model's own modules")
        return
    if not kernel.get("require_logits", True):
        r.error(r.at("kernel_config", "require_logits"), codes.NATIVE_CONFIG, "kernel_config.require_logits false: Liger's fused linear cross-entropy "
                "returns no logits in training when the labels reach the model (lce_forward: skip_logits), and v1's trainer passes them and reads "
                "outputs.logits (core/base_trainer.py compute_log_probs: outputs.logits.float()): the step fails")
        return
    r.set(("training", "liger_kernels"), ["rope", "rms_norm", "swiglu"] if model_type in LIGER_ROPE else ["rms_norm", "swiglu"], at)
    r.warn(at, "kernel_config liger_kernel: in training (require_logits) v1 turns Liger's fused linear cross-entropy off and its cross_entropy on "
               "(liger_cross_entropy in place of torch.nn.functional.cross_entropy, which the model's loss and compute_log_probs call): it keeps the "
               "logits' gradient in place of its input where memfit counts the eager loss's log-softmax: the figures are high, on the safe side")


def _deepspeed(r: Reader, ctx, dist: dict, trainer: dict) -> None:
    """dist_config deepspeed: its config_file (deepspeed.py DeepSpeedEngine); "auto" bf16 and fp16 -> bf16
    (deepspeed_utils.py infer_deepspeed_mixed_precision), fp16 enabled refused."""
    from memfit.read.native import deepspeed

    ref = dist.get("config_file")
    if not isinstance(ref, str) or not ref:
        r.error(r.at("dist_config", "name"), codes.NATIVE_CONFIG, "dist_config deepspeed needs config_file (deepspeed.py: \"DeepSpeed config_file is required in dist_config\")")
        return
    at = r.at("dist_config", "config_file")
    found, file = ctx.load_json(ref, at, "the DeepSpeed config")
    if found is None:
        return
    def enabled(section):
        block = found.get(section)
        value = block.get("enabled", "auto") if isinstance(block, dict) else "auto"
        return value if value == "auto" else value in (True, "true", "True")
    if enabled("fp16") is True:
        r.error(at, codes.NATIVE_CONFIG, "fp16 enabled in the DeepSpeed config: LLaMA-Factory v1 refuses it (deepspeed_utils.py: only bf16 or no mixed precision)")
    bf16 = enabled("bf16") is not False and not (enabled("bf16") == "auto" and enabled("fp16") is False)
    trainer["bf16"] = (bf16, at)
    deepspeed.apply(r, found, file, trainer, ctx.hidden_size)


def refuse_idle(r: Reader, key: str) -> None:
    """An adapter merge and export (peft_config.export_dir, no train_dataset): recognised, no training figure."""
    r.native.root = r.at(key, on_key=True)
    r.native.checkable, r.native.training = False, False
    r.native.found.append(Found(At((key, "export_dir"), None, True), codes.NOT_TRAINING, "peft_config.export_dir: an adapter merge and export (LLaMA-Factory v1's merge), "
                                "which trains nothing; memfit prices training steps, so it gives no figure (check the training config that made the adapter)"))

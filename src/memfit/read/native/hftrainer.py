"""The Hugging Face Trainer's argument file: the JSON (or YAML) that HfArgumentParser
(`parse_json_file` / `parse_yaml_file`) reads for the example scripts (examples/pytorch/
language-modeling/run_clm.py and friends): ModelArguments, DataTrainingArguments and
TrainingArguments (transformers 5.24.0 training_args.py) in one mapping.
"""

from __future__ import annotations

from memfit.diagnostics import codes
from memfit.read.native import hf
from memfit.read.native.accelerate import FORWARD_PREFETCH
from memfit.read.native.axolotl import optimizer
from memfit.read.native.base import COMPILED, Reader, model_value

KEYS = {
    "model_name_or_path": (None, "model.hf_config", "run_clm.py ModelArguments.model_name_or_path"),
    "config_name": (None, "model.hf_config, when given", "run_clm.py ModelArguments.config_name"),
    "dtype": (None, "the weights' dtype, transformers 5's spelling of torch_dtype", "run_clm.py ModelArguments.dtype"),
    "torch_dtype": (None, "the weights' dtype: bfloat16 / float16 -> *-true; auto -> the config.json's; none -> float32", "run_clm.py ModelArguments.torch_dtype"),
    "block_size": ("min(model_max_length, 1024)", "training.seq_len", "run_clm.py DataTrainingArguments.block_size"),
    "max_length": (1024, "training.seq_len (TRL's SFTConfig; null: no truncation, left to the data: the setting data_seq_len, default 2,048, with the longest length that fits)", "trl/trainer/sft_config.py SFTConfig.max_length"),
    "max_seq_length": (None, "training.seq_len (run_mlm, run_sft)", "run_mlm.py DataTrainingArguments.max_seq_length"),
    "per_device_train_batch_size": (8, "training.micro_batch", "training_args.py TrainingArguments.per_device_train_batch_size"),
    "gradient_accumulation_steps": (1, "training.gradient_accumulation", "TrainingArguments.gradient_accumulation_steps"),
    "gradient_checkpointing": (False, "training.checkpointing full", "TrainingArguments.gradient_checkpointing (transformers 5: activation_checkpointing's deprecated alias)"),
    "activation_checkpointing": (None, "training.checkpointing full (wins over gradient_checkpointing)", "TrainingArguments.activation_checkpointing; __post_init__ takes gradient_checkpointing only when it is unset"),
    "bf16": (False, "precision bf16-mixed (bf16-true with torch_dtype bfloat16)", "TrainingArguments.bf16"),
    "fp16": (False, "precision 16-mixed", "TrainingArguments.fp16"),
    "optim": ("adamw_torch_fused", "optimizer, training.optimizer_impl", "TrainingArguments.optim; trainer_optimizer.py _OPTIMIZER_HANDLERS"),
    "deepspeed": (None, "a DeepSpeed JSON (or inline dict)", "TrainingArguments.deepspeed"),
    "fsdp": (None, "parallel.fsdp: full_shard, shard_grad_op, hybrid_shard, no_shard; offload", "TrainingArguments.fsdp (FSDPOption)"),
    "fsdp_config": (None, "activation_checkpointing -> training.checkpointing full; version 1 -> parallel.fsdp_version 1 (default 2); forward_prefetch under version 1: a not-modelled warning (low by up to one unit)", "TrainingArguments.fsdp_config"),
    "attn_implementation": (None, "training.attention", "ModelArguments (run_sft); the model's default is sdpa"),
    "activation_checkpointing_kwargs": (None, "every_n_layers -> training.checkpoint_every (layers 0, N, 2N, ...)", "TrainingArguments.activation_checkpointing_kwargs; trainer.py pops every_n_layers for activation_checkpointing_enable; modeling_utils.py _set_gradient_checkpointing `layer_index % every_n_layers == 0`"),
    "gradient_checkpointing_kwargs": (None, "as activation_checkpointing_kwargs (its deprecated alias)", "TrainingArguments.__post_init__"),
    "use_liger_kernel": (False, "training.liger_kernels rope, rms_norm, swiglu and training.fused_loss liger (_apply_liger_kernel_to_instance's defaults for the model type; the RoPE kernel is warned about, not priced)", "TrainingArguments.use_liger_kernel; integrations/liger.py apply_liger_kernel: _apply_liger_kernel_to_instance(model=base_model, **kernel_config)"),
    "liger_kernel_config": (None, "with use_liger_kernel: rope, rms_norm, swiglu false leave that kernel out; fused_linear_cross_entropy false (or cross_entropy true) keeps the loss over the whole logits", "TrainingArguments.liger_kernel_config (the keyword arguments of apply_liger_kernel_to_<model type>)"),
}
UNMODELLED = {
    "torch_compile": ((False,), COMPILED),
    "optim_target_modules": ((), "GaLore/APOLLO target modules: the figures are high, on the safe side (GaLore/APOLLO keep a projected optimizer state)"),
    "torch_compile_mode": ((None,), "a torch.compile mode turns torch_compile on (TrainingArguments.__post_init__): " + COMPILED),
    "torch_compile_backend": ((None,), "a torch.compile backend turns torch_compile on (TrainingArguments.__post_init__): " + COMPILED),
    "auto_find_batch_size": ((False,), "the Trainer halves the batch after an out-of-memory error: the batch that runs may be smaller than written (the figures are for the written one): the figures are high, on the safe side if it halves the batch"),
    "label_smoothing_factor": ((0, 0.0), "the Trainer's LabelSmoother takes a log-softmax over the logits besides the model's loss: the figures may be low by a logits-sized tensor"),
    "use_cache": ((False, None), "the forward returns a key/value cache during training: the figures may be low by the cache's bytes"),
    "use_cpu": ((False,), "the run trains on the CPU: no GPU memory is used, and the figures are the host's"),
    "parallelism_config": ((None,), "accelerate's ParallelismConfig (tensor, context and data shard sizes) is not read: the figures assume a data-parallel world of --gpus: the figures may be low or high"),
    "optim_args": ((None, ""), "optimizer arguments are not read: the state layout of optim's default arguments is assumed: the figures may be low or high"),
}
CONDITIONAL = {
    "per_device_eval_batch_size": "training.eval_batch when larger than the training micro-batch and the run evaluates (TrainingArguments default 8): the evaluation pass (no_grad forward at that batch beside the weights and optimizer state); under a parallel layout: warned",
}
# TrainingArguments fields that do not change the training step's GPU memory (schedules, logging, saving, the hub,
# data loading on the host, evaluation's own bookkeeping, determinism, launch details); tests/read/test_native_keys.py
# fails on a field of the installed transformers that is in none of KEYS, UNMODELLED, CONDITIONAL and this
NO_MEMORY = (
    "output_dir", "num_train_epochs", "max_steps", "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps",
    "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "average_tokens_across_devices", "max_grad_norm", "bf16_full_eval", "fp16_full_eval",
    "tf32", "neftune_noise_alpha", "torch_empty_cache_steps",
    "logging_strategy", "logging_steps", "logging_first_step", "log_on_each_node", "logging_nan_inf_filter", "include_num_input_tokens_seen",
    "log_level", "log_level_replica", "disable_tqdm", "report_to", "run_name", "project", "trackio_space_id", "trackio_bucket_id",
    "trackio_static_space_id", "eval_strategy", "eval_steps", "eval_delay", "prediction_loss_only", "eval_on_start", "eval_do_concat_batches",
    "eval_use_gather_object", "eval_accumulation_steps", "include_for_metrics", "batch_eval_metrics", "save_only_model", "save_strategy",
    "save_steps", "save_on_each_node", "save_total_limit", "enable_jit_checkpoint", "push_to_hub", "hub_token", "hub_private_repo",
    "hub_model_id", "hub_strategy", "hub_always_push", "hub_revision", "load_best_model_at_end", "metric_for_best_model", "greater_is_better",
    "ignore_data_skip", "restore_callback_states_from_checkpoint", "full_determinism", "seed", "data_seed", "accelerator_config",
    "dataloader_drop_last", "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers", "dataloader_prefetch_factor",
    "dataloader_multiprocessing_context", "dataloader_in_order", "remove_unused_columns", "label_names", "train_sampling_strategy",
    "length_column_name", "ddp_find_unused_parameters", "ddp_broadcast_buffers", "ddp_static_graph", "ddp_backend", "ddp_timeout", "debug",
    "skip_memory_metrics", "do_train", "do_eval", "do_predict", "resume_from_checkpoint", "local_rank",
    # DDP's buckets hold every trainable gradient whatever the cap (it only groups them): counted under a data-parallel
    # layout without ZeRO or FSDP (placement/sharding.py rank_bytes)
    "ddp_bucket_cap_mb",
)
FSDP_OPTIONS = {"full_shard": "full_shard", "shard_grad_op": "shard_grad_op", "hybrid_shard": "hybrid_shard", "no_shard": "no_shard", "hybrid_shard_zero2": "hybrid_shard"}


def read(r: Reader, ctx) -> dict:
    data = r.data
    r.native.root = r.at("model_name_or_path", on_key=True)
    key = "config_name" if r.has("config_name") else "model_name_or_path"
    cfg = ctx.model(r.get(key, (str,)), r.at(key)) or {}
    bf16 = r.get("bf16", (bool,), False)
    fp16 = r.get("fp16", (bool,), False)
    if bf16 and fp16:
        r.error(r.at("fp16"), codes.NATIVE_CONFIG, "bf16 and fp16 are both true: TrainingArguments refuses both (at most one of fp16 and bf16)")
    dtype = r.get("torch_dtype", (str,), None) or r.get("dtype", (str,), None)
    if dtype == "auto":
        dtype = cfg.get("torch_dtype", cfg.get("dtype", "float32"))
    if dtype in ("bfloat16", "float16"):
        precision = "bf16-true" if dtype == "bfloat16" else "16-true"
    elif bf16 or fp16:
        precision = "bf16-mixed" if bf16 else "16-mixed"
    else:
        precision = "32-true"
    where = next((k for k in ("torch_dtype", "dtype", "bf16", "fp16") if data.get(k)), None)
    r.set(("precision",), precision, r.at(where) if where else None)

    micro = r.get("per_device_train_batch_size", (int,), 8)
    accum = r.get("gradient_accumulation_steps", (int,), 1)
    r.set(("training", "micro_batch"), micro, r.at("per_device_train_batch_size") if "per_device_train_batch_size" in data else None)
    seq_key = next((k for k in ("block_size", "max_seq_length", "max_length") if r.has(k)), None)
    positions = model_value(cfg, "max_position_embeddings")  # the model's positions (under its family's name)
    if seq_key is not None:
        seq, seq_at = r.get(seq_key, (int,), 1024), r.at(seq_key)
    elif "max_length" in data and data["max_length"] is None:  # TRL's SFTConfig: None, no truncation
        seq, seq_at = r.seq_left_to_data(r.at("max_length"), ctx.conf, positions if isinstance(positions, int) else 0, "max_length is null: TRL's SFTTrainer does not truncate"), None
    else:  # run_clm: min(tokenizer.model_max_length, 1024); the tokenizer's limit is the model's positions
        seq, seq_at = min(positions if isinstance(positions, int) else 1024, 1024), None
    r.set(("training", "seq_len"), seq, seq_at)
    if accum != 1 or "gradient_accumulation_steps" in data:
        r.set(("training", "gradient_accumulation"), accum, r.at("gradient_accumulation_steps") if "gradient_accumulation_steps" in data else None)
    # transformers 5's name; gradient_checkpointing is its deprecated alias, read only where the new name is unset
    checkpoint_key = "activation_checkpointing" if isinstance(data.get("activation_checkpointing"), bool) else "gradient_checkpointing"
    checkpointing = r.get(checkpoint_key, (bool,), False)
    impl = r.get("attn_implementation", (str,), None)
    attention = hf.ATTENTION.get(impl) if impl else hf.DEFAULT_ATTENTION
    if impl and attention is None:
        r.warn(r.at("attn_implementation"), f"attn_implementation {impl}: memfit models eager, sdpa and flash attention; counted as sdpa")
    r.set(("training", "attention"), attention or "sdpa", r.at("attn_implementation") if impl else None)
    optimizer(r, r.get("optim", (str,), "adamw_torch_fused"), r.at("optim") if "optim" in data else None)

    fsdp = r.get("fsdp", (str, list, bool), None)
    config = r.get("fsdp_config", (dict, str), None)
    if fsdp:
        options = fsdp.split() if isinstance(fsdp, str) else fsdp if isinstance(fsdp, list) else ["full_shard"]
        strategy = next((FSDP_OPTIONS[o] for o in options if o in FSDP_OPTIONS), "full_shard")
        r.set(("parallel", "fsdp"), strategy, r.at("fsdp"))
        if "offload" in options:
            r.set(("parallel", "offload", "optimizer"), "cpu", r.at("fsdp"))
            r.set(("parallel", "offload", "parameters"), "cpu", r.at("fsdp"))
        # transformers 5 (training_args.py): fsdp_config's version (its fsdp_ prefix dropped), default 2 (FSDP2)
        key = next((k for k in ("version", "fsdp_version") if isinstance(config, dict) and k in config), None)
        if key is not None and str(config[key]) == "1":
            r.set(("parallel", "fsdp_version"), 1, r.at("fsdp_config", key))
            prefetch = next((k for k in ("forward_prefetch", "fsdp_forward_prefetch") if config.get(k) is True), None)
            if prefetch is not None:
                r.warn(r.at("fsdp_config", prefetch), FORWARD_PREFETCH.format(key=prefetch))
        if isinstance(config, dict) and (config.get("activation_checkpointing") or config.get("fsdp_activation_checkpointing")):
            checkpointing = True
            r.origin(("training", "checkpointing"), r.at("fsdp_config"))
    r.set(("training", "checkpointing"), "full" if checkpointing else "none", r.at(checkpoint_key) if checkpoint_key in data else None)
    kwargs_key = "activation_checkpointing_kwargs" if isinstance(data.get("activation_checkpointing_kwargs"), dict) else "gradient_checkpointing_kwargs"
    hf.every_n_layers(r, kwargs_key, checkpointing)
    if r.get("do_eval", (bool,), False) or data.get("eval_strategy", data.get("evaluation_strategy", "no")) not in ("no", None):
        r.eval_batch("per_device_eval_batch_size", micro, 8, conf=ctx.conf)
    trainer = {
        "micro_batch": (micro, r.at("per_device_train_batch_size") if "per_device_train_batch_size" in data else None),
        "grad_accum": (accum, r.at("gradient_accumulation_steps") if "gradient_accumulation_steps" in data else None),
        "bf16": (bool(bf16), r.at("bf16") if "bf16" in data else None),
        "fp16": (bool(fp16), r.at("fp16") if "fp16" in data else None),
    }
    if r.has("deepspeed"):
        if fsdp:
            r.error(r.at("deepspeed", on_key=True), codes.NATIVE_CONFIG, "deepspeed and fsdp together: the Trainer runs one of them")
        else:
            ctx.deepspeed(data["deepspeed"], r.at("deepspeed"), trainer)
    r.unmodelled(UNMODELLED)
    _liger(r, cfg.get("model_type"))
    return trainer


# the model types Liger patches an instance of: liger-kernel 0.6.4 transformers/monkey_patch.py
# MODEL_TYPE_TO_APPLY_LIGER_FN; `_apply_liger_kernel_to_instance` returns, patching nothing, for any other
LIGER_MODEL_TYPES = frozenset({
    "gemma", "gemma2", "gemma3_text", "gemma3", "glm4", "glm4v", "glm4v_moe", "internvl", "llama", "llama4_text", "llama4",
    "llava", "granite", "mllama", "mllama_text_model", "mistral", "mixtral", "olmo2", "olmo3", "qwen2", "qwen3",
    "qwen3_moe", "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text", "qwen3_next", "qwen3_vl", "qwen3_vl_text",
    "qwen3_vl_moe", "qwen3_vl_moe_text", "smollm3", "phi3", "paligemma", "falcon_h1", "smolvlm", "hunyuan_v1_dense",
    "hunyuan_v1_moe"})


def _liger(r: Reader, model_type) -> None:
    """use_liger_kernel: transformers' integrations/liger.py apply_liger_kernel hands liger_kernel_config to Liger's
    _apply_liger_kernel_to_instance, whose apply_liger_kernel_to_<model type> defaults rope, rms_norm, swiglu and
    fused_linear_cross_entropy on (cross_entropy off): each one the config does not turn off is read."""
    if not r.get("use_liger_kernel", (bool,), False):
        return
    config = r.get("liger_kernel_config", (dict,), None) or {}
    at = r.at("use_liger_kernel")
    if isinstance(model_type, str) and model_type not in LIGER_MODEL_TYPES:
        r.warn(at, f"use_liger_kernel: Liger patches no {model_type} model (liger-kernel's MODEL_TYPE_TO_APPLY_LIGER_FN "
                   "has no entry for it), so the run is the model's own: memfit prices it so")
        return
    kernels = [k for k in ("rope", "rms_norm", "swiglu") if config.get(k, True) is not False]
    if kernels:
        r.set(("training", "liger_kernels"), kernels, at)
    if config.get("fused_linear_cross_entropy", True) is not False and not config.get("cross_entropy"):
        r.set(("training", "fused_loss"), "liger", at)

"""The Hugging Face Trainer's argument file: the JSON (or YAML) that HfArgumentParser
(`parse_json_file` / `parse_yaml_file`) reads for the example scripts (examples/pytorch/
language-modeling/run_clm.py and friends): ModelArguments, DataTrainingArguments and
TrainingArguments (transformers 5.24.0 training_args.py) in one mapping.
"""

from __future__ import annotations

from memfit.diagnostics import codes
from memfit.read.native import hf
from memfit.read.native.axolotl import optimizer
from memfit.read.native.base import Reader

KEYS = {
    "model_name_or_path": (None, "model.hf_config", "run_clm.py ModelArguments.model_name_or_path"),
    "config_name": (None, "model.hf_config, when given", "run_clm.py ModelArguments.config_name"),
    "torch_dtype": (None, "the weights' dtype: bfloat16 / float16 -> *-true; auto -> the config.json's; none -> float32", "run_clm.py ModelArguments.torch_dtype"),
    "block_size": ("min(model_max_length, 1024)", "training.seq_len", "run_clm.py DataTrainingArguments.block_size"),
    "max_seq_length": (None, "training.seq_len (run_mlm, run_sft)", "run_mlm.py DataTrainingArguments.max_seq_length"),
    "per_device_train_batch_size": (8, "training.micro_batch", "training_args.py TrainingArguments.per_device_train_batch_size"),
    "gradient_accumulation_steps": (1, "training.gradient_accumulation", "TrainingArguments.gradient_accumulation_steps"),
    "gradient_checkpointing": (False, "training.checkpointing full", "TrainingArguments.gradient_checkpointing"),
    "bf16": (False, "precision bf16-mixed (bf16-true with torch_dtype bfloat16)", "TrainingArguments.bf16"),
    "fp16": (False, "precision 16-mixed", "TrainingArguments.fp16"),
    "optim": ("adamw_torch_fused", "optimizer, training.optimizer_impl", "TrainingArguments.optim; trainer_optimizer.py _OPTIMIZER_HANDLERS"),
    "deepspeed": (None, "a DeepSpeed JSON (or inline dict)", "TrainingArguments.deepspeed"),
    "fsdp": (None, "parallel.fsdp: full_shard, shard_grad_op, hybrid_shard, no_shard; offload", "TrainingArguments.fsdp (FSDPOption)"),
    "fsdp_config": (None, "activation_checkpointing -> training.checkpointing full", "TrainingArguments.fsdp_config"),
    "attn_implementation": (None, "training.attention", "ModelArguments (run_sft); the model's default is sdpa"),
}
UNMODELLED = {
    "torch_compile": ((False,), "torch.compile fuses kernels and changes what is saved for backward"),
    "use_liger_kernel": ((False,), "Liger kernels save less for backward and never materialize the logits"),
    "optim_target_modules": ((), "GaLore/APOLLO target modules"),
}
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
    if seq_key is not None:
        seq, seq_at = r.get(seq_key, (int,), 1024), r.at(seq_key)
    else:  # run_clm: min(tokenizer.model_max_length, 1024); the tokenizer's limit is the model's positions
        positions = cfg.get("max_position_embeddings", cfg.get("n_positions", 1024))
        seq, seq_at = min(positions if isinstance(positions, int) else 1024, 1024), None
    r.set(("training", "seq_len"), seq, seq_at)
    if accum != 1 or "gradient_accumulation_steps" in data:
        r.set(("training", "gradient_accumulation"), accum, r.at("gradient_accumulation_steps") if "gradient_accumulation_steps" in data else None)
    checkpointing = r.get("gradient_checkpointing", (bool,), False)
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
        if isinstance(config, dict) and (config.get("activation_checkpointing") or config.get("fsdp_activation_checkpointing")):
            checkpointing = True
            r.origin(("training", "checkpointing"), r.at("fsdp_config"))
    r.set(("training", "checkpointing"), "full" if checkpointing else "none", r.at("gradient_checkpointing") if "gradient_checkpointing" in data else None)
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
    return trainer

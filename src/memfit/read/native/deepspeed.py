"""DeepSpeed JSON, alone or referenced (`deepspeed: ds.json` in Axolotl, LLaMA-Factory or the
Trainer's arguments). `"auto"` values are resolved as the Trainer integration resolves them
(transformers/integrations/deepspeed.py, HfTrainerDeepSpeedConfig.trainer_config_process and
trainer_config_finalize): the micro-batch and accumulation from the Trainer's arguments, fp16/bf16
from its `fp16`/`bf16`, `reduce_bucket_size` from the model's hidden_size squared. A value that is
not "auto" and differs from the Trainer's is the mismatch the Trainer raises on.

What each key means (deepspeed 0.19.8): runtime/zero/config.py (DeepSpeedZeroConfig: `stage`
default 0, `reduce_bucket_size` default 5e8, `allgather_bucket_size` default 5e8,
`offload_optimizer`, `offload_param`), runtime/zero/offload_config.py (`device`: none, cpu,
nvme), runtime/precision_config.py (`fp16.enabled`, `bf16.enabled`, default false: fp32),
runtime/config.py (`train_micro_batch_size_per_gpu`, `gradient_accumulation_steps`,
`data_types.grad_accum_dtype`). With 16-bit training DeepSpeed keeps 16-bit parameters and
gradients, an fp32 master copy and an fp32 gradient partition, and the optimizer's state in fp32
(runtime/zero/stage_1_and_2.py single_partition_of_fp32_groups; stage3.py fp32_partitioned_groups_flat;
runtime/bf16_optimizer.py): memfit's `precision: *-true`, `master_weights: float32`,
`training.grad_accum_dtype: float32` (docs/parallel.md compares it with DeepSpeed's estimators);
ZeRO stage 1 with bf16 and `data_types.grad_accum_dtype: fp32` (no optimizer offload) is the
BF16_Optimizer: `parallel.bf16_optimizer: true`.
"""

from __future__ import annotations

from memfit.diagnostics import codes
from memfit.read.native.base import At, Reader, model_value

# keys of zero_optimization that change memory and are not modelled -> (no-effect values, why)
ZERO_UNMODELLED = {
    "stage3_prefetch_bucket_size": ((), "ZeRO-3 prefetches parameters up to this many elements ahead: the figures are low"),
    "stage3_max_live_parameters": ((), "ZeRO-3 keeps up to this many gathered parameters resident: the figures are low"),
    "stage3_max_reuse_distance": ((), "ZeRO-3 keeps gathered parameters reused within this distance: the figures are low"),
    "stage3_param_persistence_threshold": ((), "ZeRO-3 leaves parameters smaller than this unpartitioned on every GPU: the figures are low"),
    "zero_quantized_weights": ((False,), "ZeRO++ quantizes the gathered weights: the figures are high, on the safe side"),
    "zero_hpz_partition_size": ((1,), "ZeRO++ keeps a secondary partition of the weights per node: the figures are low"),
    "zero_quantized_gradients": ((False,), "ZeRO++ quantizes the gradients: the figures are high, on the safe side"),
    "overlap_comm": ((None, False), "overlapping the gradients' reduction with backward keeps a second reduce bucket: the figures are low by up to one reduce bucket"),
    "contiguous_gradients": ((True,), "without contiguous gradients ZeRO does not copy each gradient into one buffer as it is produced (the allocator's fragmentation is not modelled): the figures are low"),
    "reduce_scatter": ((True,), "without reduce-scatter ZeRO all-reduces whole gradient buckets (a bucket's full size rather than its share, for a moment): the figures are low"),
    "sub_group_size": ((1000000000, 1e9), "ZeRO-3's optimizer step runs over sub-groups of this many elements, each with its own float32 temporaries: the figures may be low or high"),
    "stage3_model_persistence_threshold": ((), "ZeRO-3 leaves up to this many elements of small parameters unpartitioned on every GPU: the figures are low"),
    "stage3_module_granularity_threshold": ((0,), "ZeRO-3 fetches modules below this granularity whole, as leaf modules: the figures are low"),
    "zero_quantized_nontrainable_weights": ((False,), "ZeRO++ keeps the frozen weights quantized (less memory than memfit counts): the figures are high, on the safe side"),
    "memory_efficient_linear": ((True,), "without ZeRO-3's memory-efficient linear, autograd keeps the gathered weight for backward: the figures are low"),
    "zenflow": ((None,), "ZenFlow offloads and updates the gradients selectively: the figures are high, on the safe side"),
    "leaf_module": ((), "ZeRO-3 fetches these modules whole, as leaf modules: the figures are low"),
    "cpu_offload": ((None, False), "the deprecated spelling of offload_optimizer.device cpu: memfit reads offload_optimizer (without it, the figures count no offload): the figures are high, on the safe side"),
    "cpu_offload_param": ((None, False), "the deprecated spelling of offload_param.device cpu: memfit reads offload_param (without it, the figures count no offload): the figures are high, on the safe side"),
}
# fields of DeepSpeed's DeepSpeedZeroConfig (runtime/zero/config.py, by the key a JSON writes) that do not change the
# training step's GPU memory (communication patterns, checkpoint saving and loading, checks, host-side pinning);
# tests/read/test_native_keys.py fails on a field of the installed DeepSpeed that is in none of the tables
ZERO_NO_MEMORY = (
    "use_multi_rank_bucket_allreduce", "allgather_partitions", "compute_grad_norm", "load_from_fp32_weights", "elastic_checkpoint",
    "cpu_offload_use_pin_memory", "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
    "stage3_use_all_reduce_for_fetch_params", "stage3_allgather_sequential", "ignore_unused_parameters", "legacy_stage1",
    "round_robin_gradients", "parameter_alignment", "pipeline_loading_checkpoint", "override_module_apply",
    "log_trace_cache_warnings", "enable_sanity_checks", "save_muon_momentum_buffer_in_memory",
)
# the zero_optimization keys apply() reads (the memfit keys they set: docs/native-deepspeed.md)
ZERO_MODELLED = ("stage", "offload_param", "offload_optimizer", "reduce_bucket_size", "allgather_bucket_size", "mics_shard_size")
TOP_UNMODELLED = {
    "activation_checkpointing": ((), "DeepSpeed's activation checkpointing (partition_activations, cpu_checkpointing) applies to models that call deepspeed.checkpointing"),
    "compression_training": ((), "compression changes the weights' storage"),
}
GRAD_ACCUM_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
# engine.py _do_optimizer_sanity_check: bf16, grad_accum_dtype fp32, ZeRO stage 1 without optimizer offload is
# runtime/bf16_optimizer.py's BF16_Optimizer, not stage_1_and_2.py: memfit's parallel.bf16_optimizer (its whole fp32
# gradient buffer, ledger/ranks.py; measured: tests/placement/test_zero12_gradients.py)


def apply(r: Reader, ds: dict, file: str | None, trainer: dict, hidden_size: int | None) -> None:
    """Set the memfit keys a DeepSpeed config decides; `file` is its path (None: the checked file),
    `trainer` the Trainer's values and their native nodes: {name: (value, At|None)} for
    micro_batch, grad_accum, bf16, fp16."""
    at = lambda *keys: At(tuple(keys), file)  # noqa: E731

    def resolved(key: str, name: str, kinds=(int,)):
        value = r.get(key, (*kinds, "auto"), data=ds, file=file)
        hf_value, hf_at = trainer.get(name, (None, None))
        if value == "auto" or value is None:
            return hf_value, hf_at if value is None else at(key)
        if hf_value is not None and hf_at is not None and value != hf_value:
            r.error(at(key), codes.NATIVE_CONFIG, f"{key} is {value} but the Trainer's {name.replace('_', ' ')} is {hf_value}: the Trainer refuses the mismatch (write \"auto\")")
        return value, at(key)

    micro, micro_at = resolved("train_micro_batch_size_per_gpu", "micro_batch")
    if micro is not None:
        r.set(("training", "micro_batch"), micro, micro_at)
    accum, accum_at = resolved("gradient_accumulation_steps", "grad_accum")
    if accum is not None:
        r.set(("training", "gradient_accumulation"), accum, accum_at)

    def enabled(section: str, name: str):
        block = r.get(section, (dict,), {}, data=ds, file=file)
        flag = r.get("enabled", (bool, "auto"), None, data=block, prefix=(section,), file=file)
        hf_value, hf_at = trainer.get(name, (False, None))
        if flag == "auto":
            return bool(hf_value), at(section, "enabled")
        return bool(flag), at(section, "enabled") if flag is not None else None

    bf16, bf16_at = enabled("bf16", "bf16")
    if not bf16:  # DeepSpeed spells bf16 "bfloat16" too (precision_config.py alias)
        bf16, bf16_at = enabled("bfloat16", "bf16") if "bfloat16" in ds else (bf16, bf16_at)
    fp16, fp16_at = enabled("fp16", "fp16")
    if bf16 and fp16:
        r.error(fp16_at or at("fp16"), codes.NATIVE_CONFIG, "fp16.enabled and bf16.enabled are both true: DeepSpeed refuses both (pick one)")
    if bf16 or fp16:
        r.set(("precision",), "bf16-true" if bf16 else "16-true", bf16_at if bf16 else fp16_at)
        r.set(("master_weights",), "float32", bf16_at if bf16 else fp16_at)
        r.set(("training", "grad_accum_dtype"), "float32", bf16_at if bf16 else fp16_at)
    else:
        r.set(("precision",), "32-true", None)
    types = r.get("data_types", (dict,), {}, data=ds, file=file)
    accum_dtype = r.get("grad_accum_dtype", (str,), None, data=types, prefix=("data_types",), file=file, choices=tuple(GRAD_ACCUM_DTYPES))
    if accum_dtype is not None and (bf16 or fp16):
        r.set(("training", "grad_accum_dtype"), GRAD_ACCUM_DTYPES[accum_dtype], at("data_types", "grad_accum_dtype"))

    zero = r.get("zero_optimization", (dict,), {}, data=ds, file=file)
    stage = r.get("stage", (int,), 0, data=zero, prefix=("zero_optimization",), file=file)
    if stage not in (0, 1, 2, 3):
        r.error(at("zero_optimization", "stage"), codes.NATIVE_CONFIG, f"zero_optimization.stage is {stage}: 0, 1, 2 or 3")
        stage = 0
    r.set(("parallel", "zero"), stage, at("zero_optimization", "stage") if "stage" in zero else at("zero_optimization") if zero else None)
    for key, target in (("offload_optimizer", "optimizer"), ("offload_param", "parameters")):
        block = r.get(key, (dict,), None, data=zero, prefix=("zero_optimization",), file=file)
        if not block:
            continue
        device = r.get("device", (str,), "none", data=block, prefix=("zero_optimization", key), file=file, choices=("none", "cpu", "nvme"))
        if device == "nvme":
            r.warn(at("zero_optimization", key, "device"), f"zero_optimization.{key}.device nvme: memfit counts it as CPU offload (the GPU side is the same; host memory is not)")
        if device in ("cpu", "nvme"):
            r.set(("parallel", "offload", target), "cpu", at("zero_optimization", key))
    offloaded = (zero.get("offload_optimizer") or {}).get("device") in ("cpu", "nvme") if isinstance(zero.get("offload_optimizer"), dict) else False
    if accum_dtype == "fp32" and bf16 and stage == 1 and not offloaded:
        r.set(("parallel", "bf16_optimizer"), True, at("data_types", "grad_accum_dtype"))
    for key, target in (("reduce_bucket_size", "reduce"), ("allgather_bucket_size", "allgather")):
        if key not in zero or (target == "allgather" and stage == 3):
            continue
        raw = zero[key]
        if isinstance(raw, str) and raw != "auto":
            try:  # 5e8 in a YAML file is a string to PyYAML; DeepSpeed's config (pp_int) takes the number
                raw = float(raw)
                zero = {**zero, key: raw}
            except ValueError:
                pass
        value = r.get(key, (int, float, "auto"), None, data=zero, prefix=("zero_optimization",), file=file)
        if value == "auto":
            if hidden_size is None:
                continue
            value = hidden_size * hidden_size  # trainer_config_finalize: hidden_size * hidden_size
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, int) and value >= 1:
            r.set(("parallel", "buckets", target), value, at("zero_optimization", key))
    mics = r.get("mics_shard_size", (int,), -1, data=zero, prefix=("zero_optimization",), file=file) if "mics_shard_size" in zero else -1
    if isinstance(mics, int) and not isinstance(mics, bool) and mics > 0:
        if stage == 3:  # MiCS (DeepSpeed 0.9-0.18 runtime/zero/mics.py): ZeRO-3 within groups of mics_shard_size ranks
            r.set(("parallel", "zero_shard_size"), mics, at("zero_optimization", "mics_shard_size"))
        r.note(at("zero_optimization", "mics_shard_size"),
               "zero_optimization.mics_shard_size: " + ("MiCS shards the parameters, gradients and optimizer state over groups of "
               f"{mics} GPUs (each keeps 1/{mics}), counted; " if stage == 3 else "MiCS applies to ZeRO stage 3 only, the key has no effect here; ")
               + "DeepSpeed 0.19 removed MiCS and refuses the key at launch")
    r.unmodelled(ZERO_UNMODELLED, data=zero, prefix=("zero_optimization",), file=file)
    r.unmodelled(TOP_UNMODELLED, data=ds, file=file)

    optimizer = r.get("optimizer", (dict,), None, data=ds, file=file)
    if optimizer:
        kind = r.get("type", (str,), "", data=optimizer, prefix=("optimizer",), file=file)
        if kind.lower() in ("adam", "adamw", "fusedadam", "cpuadam", "deepspeedcpuadam"):
            r.set(("optimizer",), "adamw", at("optimizer", "type"))
            r.set(("training", "optimizer_impl"), "fused", at("optimizer", "type"))  # FusedAdam / DeepSpeedCPUAdam: one kernel
        else:
            r.set(("optimizer",), "adamw", at("optimizer", "type"))
            r.warn(at("optimizer", "type"), f"optimizer.type {kind}: memfit does not model DeepSpeed's {kind}; counted as AdamW")


def read(r: Reader, ctx) -> dict:
    """A DeepSpeed JSON checked alone: the model from the settings' `model` or --model; it has no
    sequence length, so memfit takes the model's longest (a warning says so)."""
    data = r.data
    r.native.root = r.at(next(iter(data)), on_key=True) if data else r.at()
    name = ctx.conf.get("model")
    if name:
        ctx.model(name, r.native.root)
    else:  # nothing to check without a model: an error when named, skipped by the hook
        r.native.checkable = False
        r.native.uncheckable = "no model: a DeepSpeed config names none; give one with --model NAME or the settings' `model` (or check the training config that references this file)"
    # "auto" is the Trainer integration's to fill in (integrations/deepspeed.py trainer_config_process): alone, the
    # Trainer's defaults, said at the key (the training config that references the file decides)
    trainer = {}
    for key, name, default in (("train_micro_batch_size_per_gpu", "micro_batch", 8), ("gradient_accumulation_steps", "grad_accum", 1)):
        if data.get(key) == "auto":
            trainer[name] = (default, None)
            r.warn(
                r.at(key),
                f"{key} is \"auto\": alone, memfit takes the Trainer's default {default} (TrainingArguments); the training config "
                "that references this file decides it (check that one for the real figure, higher or lower)",
            )
    for section in ("bf16", "fp16"):
        block = data.get(section)
        if isinstance(block, dict) and block.get("enabled") == "auto":
            r.warn(
                r.at(section, "enabled"),
                f"{section}.enabled is \"auto\": alone, memfit takes the Trainer's default (off: float32 weights); the training "
                "config that references this file decides it (with it on, the figures are lower)",
            )
    apply(r, data, None, trainer, ctx.hidden_size)
    training = r.native.doc.setdefault("training", {})
    if "micro_batch" not in training:
        # runtime/config.py _set_batch_related_parameters: train_batch_size = micro x accumulation x world size
        total = r.get("train_batch_size", (int,), None)
        world = ctx.conf.get("gpus") or 1
        accum = training.get("gradient_accumulation", 1)
        if isinstance(total, int) and total >= accum * world and total % (accum * world) == 0:
            r.set(("training", "micro_batch"), total // (accum * world), r.at("train_batch_size"))
        elif total is not None:
            r.error(r.at("train_batch_size"), codes.NATIVE_CONFIG, f"train_batch_size {total} is not gradient_accumulation_steps {accum} x {world} GPU(s) x a micro-batch: DeepSpeed refuses it")
        else:
            r.set(("training", "micro_batch"), 1)
    positions = model_value(ctx.model_config or {}, "max_position_embeddings")
    if isinstance(positions, int) and not isinstance(positions, bool):
        r.set(("training", "seq_len"), positions)
        r.warn(r.native.root, f"a DeepSpeed config has no sequence length: memfit assumes the model's max_position_embeddings, {positions:,} tokens (check the training config that uses this file for the real one)")
    if "optimizer" not in r.native.doc:
        r.set(("optimizer",), "adamw", None)  # DeepSpeed's usual Adam; the Trainer's default is AdamW
    return {}

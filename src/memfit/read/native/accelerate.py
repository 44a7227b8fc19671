"""accelerate launch configs (`accelerate config` writes them; `--launch FILE` or the settings'
`launch` names one): where a run's world size, sharding and precision come from.

Keys (accelerate, commands/config/config_args.py ClusterConfig; utils/constants.py):
`distributed_type` (NO, MULTI_GPU, DEEPSPEED, FSDP, ...), `num_processes` (the world size, all
machines; default -1 = decided at launch), `num_machines` (default 1), `mixed_precision` (no, fp16,
bf16, fp8), `deepspeed_config` ({zero_stage, offload_optimizer_device, offload_param_device,
deepspeed_config_file, gradient_accumulation_steps}), `fsdp_config` ({fsdp_sharding_strategy:
FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2 or their numbers 1-5;
fsdp_version (1, the default: FSDP1; 2: FSDP2, parallel.fsdp_version) with fsdp_reshard_after_forward true/false;
fsdp_offload_params;
fsdp_activation_checkpointing}).
"""

from __future__ import annotations

from memfit.diagnostics import codes
from memfit.read.native.base import At, Reader

# FSDP1's forward_prefetch (torch/distributed/fsdp/fully_sharded_data_parallel.py): the next unit's all-gather is
# issued before the current unit's forward runs, so two units are gathered at once in forward
FORWARD_PREFETCH = ("{key}: FSDP1 all-gathers the next unit before the current one's forward runs, so two units' "
                    "parameters are gathered at once in forward: the figures are low by up to one unit; memfit does "
                    "not model it, the figures leave it out")

# FSDP sharding strategy (name or accelerate's number) -> parallel.fsdp
FSDP_STRATEGY = {
    "FULL_SHARD": "full_shard", "1": "full_shard",
    "SHARD_GRAD_OP": "shard_grad_op", "2": "shard_grad_op",
    "NO_SHARD": "no_shard", "3": "no_shard",
    "HYBRID_SHARD": "hybrid_shard", "4": "hybrid_shard",
    "HYBRID_SHARD_ZERO2": None, "5": None,  # not modelled: a warning
}
MIXED = {"no": None, "fp16": "fp16", "bf16": "bf16", "fp8": None}


def launch(r: Reader, data: dict, file: str | None) -> dict:
    """What the launch config decides: {gpus, gpus_per_node, mixed_precision, zero, offload,
    fsdp, fsdp_version, ds_file, checkpointing}, each (value, At). Keys that change memory and are not
    modelled are warnings."""
    at = lambda *keys: At(tuple(keys), file)  # noqa: E731
    out: dict = {}
    kind = r.get("distributed_type", (str,), "NO", data=data, file=file)
    processes = r.get("num_processes", (int,), -1, data=data, file=file)
    machines = r.get("num_machines", (int,), 1, data=data, file=file)
    if processes and processes >= 1:
        out["gpus"] = (processes, at("num_processes"))
        if machines and machines >= 1 and processes % machines == 0:
            out["gpus_per_node"] = (processes // machines, at("num_machines") if "num_machines" in data else at("num_processes"))
    mixed = r.get("mixed_precision", (str,), "no", data=data, file=file)
    if mixed == "fp8":
        r.warn(at("mixed_precision"), "mixed_precision fp8: memfit does not model fp8 training (counted as bf16)")
        mixed = "bf16"
    if mixed in ("fp16", "bf16"):
        out["mixed_precision"] = (mixed, at("mixed_precision"))
    if kind == "DEEPSPEED":
        ds = r.get("deepspeed_config", (dict,), {}, data=data, file=file)
        if "deepspeed_config_file" in ds:
            out["ds_file"] = (r.get("deepspeed_config_file", (str,), None, data=ds, prefix=("deepspeed_config",), file=file), at("deepspeed_config", "deepspeed_config_file"))
        stage = r.get("zero_stage", (int,), None, data=ds, prefix=("deepspeed_config",), file=file)
        if stage is not None:
            out["zero"] = (stage, at("deepspeed_config", "zero_stage"))
        for key, target in (("offload_optimizer_device", "optimizer"), ("offload_param_device", "parameters")):
            device = r.get(key, (str,), "none", data=ds, prefix=("deepspeed_config",), file=file)
            if device in ("cpu", "nvme"):
                out.setdefault("offload", {})[target] = ("cpu", at("deepspeed_config", key))
    elif kind == "FSDP":
        fsdp = r.get("fsdp_config", (dict,), {}, data=data, file=file)
        version = r.get("fsdp_version", (int,), 1, data=fsdp, prefix=("fsdp_config",), file=file)
        if version in (1, 2):  # accelerate's FullyShardedDataParallelPlugin: FSDP_VERSION, default 1 (FSDP1)
            out["fsdp_version"] = (version, at("fsdp_config", "fsdp_version") if "fsdp_version" in fsdp else at("distributed_type"))
        if version == 1 and fsdp.get("fsdp_forward_prefetch") is True:
            r.warn(at("fsdp_config", "fsdp_forward_prefetch"), FORWARD_PREFETCH.format(key="fsdp_forward_prefetch"))
        if version == 2 and "fsdp_reshard_after_forward" in fsdp:
            reshard = r.get("fsdp_reshard_after_forward", (bool, str), True, data=fsdp, prefix=("fsdp_config",), file=file)
            strategy = "full_shard" if reshard in (True, "FULL_SHARD") else "shard_grad_op"
            out["fsdp"] = (strategy, at("fsdp_config", "fsdp_reshard_after_forward"))
        else:
            raw = fsdp.get("fsdp_sharding_strategy", "FULL_SHARD")
            strategy = FSDP_STRATEGY.get(str(raw).upper(), "?")
            if strategy == "?":
                r.error(at("fsdp_config", "fsdp_sharding_strategy"), codes.NATIVE_CONFIG, f"fsdp_sharding_strategy {raw!r}: one of FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2")
            elif strategy is None:
                r.warn(at("fsdp_config", "fsdp_sharding_strategy"), f"fsdp_sharding_strategy {raw}: memfit does not model HYBRID_SHARD_ZERO2; counted as HYBRID_SHARD")
                out["fsdp"] = ("hybrid_shard", at("fsdp_config", "fsdp_sharding_strategy"))
            else:
                out["fsdp"] = (strategy, at("fsdp_config", "fsdp_sharding_strategy") if "fsdp_sharding_strategy" in fsdp else at("distributed_type"))
        if r.get("fsdp_offload_params", (bool,), False, data=fsdp, prefix=("fsdp_config",), file=file):
            out["offload"] = {"optimizer": ("cpu", at("fsdp_config", "fsdp_offload_params")), "parameters": ("cpu", at("fsdp_config", "fsdp_offload_params"))}
        if r.get("fsdp_activation_checkpointing", (bool,), False, data=fsdp, prefix=("fsdp_config",), file=file):
            out["checkpointing"] = ("full", at("fsdp_config", "fsdp_activation_checkpointing"))
    elif kind not in ("NO", "MULTI_GPU", "MULTI_CPU"):
        r.warn(at("distributed_type"), f"distributed_type {kind}: memfit models NO, MULTI_GPU, DEEPSPEED and FSDP launches; counted as MULTI_GPU (data parallel)")
    return out


def read(r: Reader, ctx) -> dict:
    """An accelerate config alone: what it decides, read (memfit convert prints it), but no model
    or batch to check; `--launch FILE` puts it under a training config."""
    data = r.data
    r.native.root = r.at("distributed_type", on_key=True)
    out = launch(r, data, None)
    r.native.checkable = False
    r.native.uncheckable = "an accelerate config alone names no model or batch: check the training config that it launches, with --launch FILE (or the settings' `launch`)"
    ctx.launch = out
    if "ds_file" in out and out["ds_file"][0]:
        ctx.ds_from_launch = (out["ds_file"][0], out["ds_file"][1], ctx.base)
    if "mixed_precision" in out:
        value, at = out["mixed_precision"]
        r.set(("precision",), "bf16-mixed" if value == "bf16" else "16-mixed", at)
    return {}

"""The memfit config of a run that is about to start, from its live objects: the model (its `config`, a peft model's
LoRA config, a bitsandbytes quantization config), the Trainer's `TrainingArguments`, the world size and the sequence
length. Nothing here imports transformers, peft or torch: the objects are read by their attributes.

The arguments go through the reader of the Hugging Face Trainer's argument files (read/native/hftrainer.py, its
KEYS are TrainingArguments' own names), as `memfit check` reads such a file; what a TrainingArguments file cannot say
(the adapters and the quantization, which live on the model) is added in memfit's form, whose `lora` section takes
peft's LoraConfig names. The result is one memfit config with the model inline (`model.transformer`): `memfit check`
of it needs no other file and gives the callback's figures.
"""

from __future__ import annotations

import json
import os
import tempfile

# peft LoraConfig attribute -> memfit `lora` key (recipe/lora.py's schema takes peft's names)
PEFT_LORA = {"r": "r", "lora_alpha": "alpha", "lora_dropout": "dropout", "target_modules": "target_modules", "modules_to_save": "modules_to_save",
             "use_dora": "use_dora"}
# peft LoraConfig attributes that change memory and memfit does not model -> (their no-effect values, what they do)
PEFT_UNMODELLED = {
    "layers_to_transform": ((None, []), "LoRA on some layers only"),
    "rank_pattern": ((None, {}), "per-module ranks"),
    "target_parameters": ((None, []), "LoRA on parameters (MoE experts) rather than modules"),
    "bias": (("none", None), "trained biases"),
}
# TRL's trainers whose step is not the supervised step memfit models (their config classes' names) -> what they add
TRL_UNMODELLED = {
    "DPOConfig": "DPO runs chosen and rejected sequences (twice the batch) and, without peft, a reference model",
    "CPOConfig": "CPO runs chosen and rejected sequences (twice the batch)",
    "ORPOConfig": "ORPO runs chosen and rejected sequences (twice the batch)",
    "KTOConfig": "KTO runs a reference model and its KL batch",
    "GRPOConfig": "GRPO generates completions and runs a reference model",
    "RLOOConfig": "RLOO generates completions and runs a reference model",
    "PPOConfig": "PPO runs a policy, a value model, a reward model and a reference model",
    "RewardConfig": "reward modelling runs chosen and rejected sequences (twice the batch)",
}


class LiveError(ValueError):
    """The live objects say something memfit cannot turn into a config (an unknown adapter, a model with no config)."""


def _plain(value):
    """A value as plain data (JSON's types), or the value's str() where it has no plain form."""
    return json.loads(json.dumps(value, default=lambda v: v.value if hasattr(v, "value") else sorted(v) if isinstance(v, (set, frozenset)) else str(v)))


def model_config(model) -> dict:
    """The model's config.json keys (a peft model's base model's)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        raise LiveError(f"{type(model).__name__} has no transformers config (model.config): memfit needs its shapes")
    return _plain(config.to_dict())


def _dtype_name(dtype) -> str | None:
    return str(dtype).removeprefix("torch.") if dtype is not None else None


def weights_dtype(model) -> str | None:
    """The dtype the trained model's weights are held in (the floating-point parameters that are not adapters)."""
    counts: dict = {}
    for name, parameter in model.named_parameters():
        if "lora_" in name or not parameter.is_floating_point():
            continue
        key = _dtype_name(parameter.dtype)
        counts[key] = counts.get(key, 0) + parameter.numel()
    return max(counts, key=counts.get) if counts else None


def trainer_arguments(args, model, seq_len: int, config_dir: str) -> tuple[dict, list]:
    """The Hugging Face Trainer argument mapping (hf-trainer's keys) that `args` and `model` mean, and notes on what
    it leaves out."""
    from memfit.read.native.hftrainer import KEYS, UNMODELLED

    values = args.to_dict()
    out = {key: _plain(values[key]) for key in (*KEYS, *UNMODELLED) if key in values and values[key] not in (None, "", [])}
    for key in ("block_size", "max_seq_length", "max_length", "config_name", "torch_dtype", "dtype"):
        out.pop(key, None)  # the model's and the run's own, below
    for key in ("use_cpu", "no_cuda"):
        # where the run trains is what the callback sees in the process (args.device): memfit_config's device.type says
        # it, not the hf-trainer reader's not-modelled use_cpu
        out.pop(key, None)
    out["model_name_or_path"] = config_dir
    out["max_seq_length"] = seq_len
    dtype = weights_dtype(model)
    if dtype in ("bfloat16", "float16"):
        out["torch_dtype"] = dtype
    enabled = getattr(model, "is_activation_checkpointing", None)  # transformers 5; is_gradient_checkpointing before
    if enabled if enabled is not None else getattr(model, "is_gradient_checkpointing", False):  # on the model, not by the arguments
        out["gradient_checkpointing"] = True
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if isinstance(impl, str):
        out["attn_implementation"] = impl
    notes = []
    for kind in type(args).__mro__:
        if kind.__name__ in TRL_UNMODELLED:
            notes.append(f"{kind.__name__}: {TRL_UNMODELLED[kind.__name__]}; memfit models the supervised step, the figures leave the rest out")
            break
    kwargs = values.get("activation_checkpointing_kwargs", values.get("gradient_checkpointing_kwargs"))
    if out.get("gradient_checkpointing") and isinstance(kwargs, dict) and kwargs.get("every_n_layers") not in (None, 1):
        notes.append(f"activation_checkpointing_kwargs every_n_layers={kwargs['every_n_layers']}: memfit counts every layer checkpointed")
    return out, notes


def lora_section(model) -> tuple[dict | None, list[str]]:
    """A peft model's active LoRA adapter as memfit's `lora` section, and what it leaves out."""
    configs = getattr(model, "peft_config", None)
    if not isinstance(configs, dict) or not configs:
        return None, []
    active = getattr(model, "active_adapter", None)
    active = active[0] if isinstance(active, (list, tuple)) and active else active
    config = configs.get(active) if active in configs else next(iter(configs.values()))
    kind = str(getattr(getattr(config, "peft_type", None), "value", getattr(config, "peft_type", "")))
    if kind.upper() != "LORA":
        raise LiveError(f"peft adapter {kind or type(config).__name__}: memfit models LoRA adapters only")
    section, notes = {}, []
    for peft_key, key in PEFT_LORA.items():
        value = getattr(config, peft_key, None)
        if value is None or value == []:
            continue
        section[key] = sorted(value) if isinstance(value, (set, frozenset)) else _plain(value)
    for peft_key, (inert, why) in PEFT_UNMODELLED.items():
        value = getattr(config, peft_key, None)
        if value not in inert:
            notes.append(f"peft {peft_key}={value!r}: {why}; memfit does not model it, the figures leave it out")
    if section.get("use_dora") is not True:
        section.pop("use_dora", None)
    # the adapters' dtype as the live model keeps them (fp32 is peft's default; autocast_adapter_dtype=False keeps
    # the base layer's)
    adapter = next((p for n, p in model.named_parameters() if ".lora_A." in n), None) if hasattr(model, "named_parameters") else None
    dtype = str(getattr(adapter, "dtype", "")).replace("torch.", "")
    if dtype in ("bfloat16", "float16"):
        section["dtype"] = dtype
    if len(configs) > 1:
        notes.append(f"the peft model has {len(configs)} adapters: memfit counts the active one ({active})")
    return section, notes


def quantization_section(model) -> tuple[dict | None, list[str]]:
    """A model loaded with bitsandbytes quantization as memfit's `quantization` section."""
    config = getattr(getattr(model, "config", None), "quantization_config", None)
    if config is None:
        return None, []
    values = config.to_dict() if hasattr(config, "to_dict") else dict(config) if isinstance(config, dict) else {}
    method = values.get("quant_method", getattr(config, "quant_method", ""))
    method = str(getattr(method, "value", method))  # transformers' QuantizationMethod enum: its value
    if "bitsandbytes" not in method:
        return None, [f"quantization {method}: memfit models bitsandbytes 4-bit and 8-bit; the base is counted unquantized"]
    if values.get("load_in_4bit"):
        kind = str(values.get("bnb_4bit_quant_type", "fp4"))
        # bitsandbytes' bnb_4bit_quant_type is memfit's quantization.method as spelled (recipe/quant.BNB_4BIT)
        section = {"method": kind, "double_quant": bool(values.get("bnb_4bit_use_double_quant", False))}
        compute = values.get("bnb_4bit_compute_dtype")
        if compute:
            section["compute_dtype"] = str(compute).removeprefix("torch.")
        return section, []
    if values.get("load_in_8bit"):
        return {"method": "int8"}, []
    return None, []


def memfit_config(args, model, seq_len: int, *, device: str | None = None, budget=None, world_size: int | None = None) -> tuple[dict, list[str]]:
    """The self-contained memfit config of the run (the model inline) and notes on what memfit leaves out of it.

    The TrainingArguments go through read/native's hf-trainer reader (its DeepSpeed and FSDP handling included) with
    the model's config.json written to a temporary directory for it; the config then names the model inline."""
    from memfit.api.checking import options
    from memfit.read.native import formats

    raw = model_config(model)
    world = world_size if world_size is not None else max(int(getattr(args, "world_size", 1) or 1), 1)
    with tempfile.TemporaryDirectory(prefix="memfit-") as tmp:
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as out:
            json.dump(raw, out)
        native, notes = trainer_arguments(args, model, seq_len, tmp)
        chosen = options(device=device, gpus=world if world > 1 else None, settings=False)
        read = formats.read(native, os.path.join(tmp, "<trainer>"), chosen, forced="hf-trainer")
        notes += [found.message for found in read.found if found.level != "information"]
        doc = json.loads(json.dumps(read.doc))
    notes += _fsdp_left_out(native, doc)
    doc["model"] = {"transformer": raw}
    lora, more = lora_section(model)
    notes += more
    if lora is not None:
        doc["lora"] = lora
    quantization, more = quantization_section(model)
    notes += more
    if quantization is not None:
        doc["quantization"] = quantization
    if budget is not None:
        device_section = dict(doc.get("device") or {})
        device_section["memory"] = budget if isinstance(budget, (int, str)) else int(budget)
        doc["device"] = device_section
    doc["device"] = {**(doc.get("device") or {}), "type": device_type(args)}
    return _ordered(doc), notes


def device_type(args) -> str:
    """The torch device the Trainer runs the step on, as memfit's `device.type` says it: `cpu` for a run on the CPU
    (`args.device.type == "cpu"`, which `use_cpu` makes it; its `*-mixed` activations are CPU autocast's), `cuda`
    otherwise (a GPU: CUDA's autocast, ROCm's too)."""
    device = getattr(args, "device", None)
    on_cpu = getattr(device, "type", None) == "cpu" if device is not None else bool(getattr(args, "use_cpu", False))
    return "cpu" if on_cpu else "cuda"


def _fsdp_left_out(native: dict, doc: dict) -> list[str]:
    """transformers 5's FSDP settings (`fsdp=True`, the rest in fsdp_config) that the reader did not turn into the
    layout: said, so that a figure without them is not taken for one with them."""
    config = native.get("fsdp_config")
    if not native.get("fsdp") or not isinstance(config, dict):
        return []
    parallel = doc.get("parallel") or {}
    notes = []
    if config.get("cpu_offload") and "offload" not in parallel:
        notes.append("fsdp_config cpu_offload: parameters and gradients offloaded to the CPU; memfit's hf-trainer reader does not read it, the figures keep them on the GPU")
    if config.get("reshard_after_forward") is False and parallel.get("fsdp") == "full_shard":
        notes.append("fsdp_config reshard_after_forward false: parameters stay gathered between forward and backward; memfit's hf-trainer reader counts full_shard")
    return notes


ORDER = ("memfit", "device", "model", "precision", "optimizer", "dtypes", "training", "lora", "quantization", "parallel", "host")


def _ordered(doc: dict) -> dict:
    """The sections in the order the docs write them (a config a person reads)."""
    return {**{k: doc[k] for k in ORDER if k in doc}, **{k: v for k, v in doc.items() if k not in ORDER}}

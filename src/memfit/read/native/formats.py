"""Which format a file is (DETECT, by its keys), and the entry points the pipeline calls."""

from __future__ import annotations

import os
import re

from memfit.diagnostics import codes
from memfit.read.native.base import FORMATS, At, Found, Native, Reader

__all__ = ["FORMATS", "Native", "detect", "read", "sniff"]

# format -> (keys that must all be present, keys of which one must be present); first match wins
DETECT: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("axolotl", ("base_model",), ("micro_batch_size", "sequence_len", "adapter", "datasets", "load_in_4bit", "load_in_8bit", "num_epochs", "lora_r", "optimizer")),
    ("llama-factory", ("model_name_or_path",), ("stage", "finetuning_type", "cutoff_len", "template", "lora_rank", "quantization_bit", "lora_target")),
    ("hf-trainer", ("model_name_or_path",), ("per_device_train_batch_size", "output_dir", "block_size", "max_seq_length", "gradient_accumulation_steps", "do_train")),
    ("torchtune", ("model",), ("tokenizer", "optimizer", "batch_size", "epochs", "checkpointer", "dtype")),
    ("deepspeed", (), ("zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size", "zero_allow_untested_optimizer")),
    ("accelerate", ("distributed_type",), ("num_processes", "compute_environment", "mixed_precision", "num_machines")),
)

# the same keys at column 0 of a YAML text: a cheap test before parsing (the hook, --skip-unrecognized)
_KEYS = r"(base_model|model_name_or_path|zero_optimization|train_micro_batch_size_per_gpu|train_batch_size|distributed_type|model)"
_SNIFF = re.compile(rf'^{_KEYS}\s*:|"{_KEYS}"\s*:|^\s+_component_\s*:\s*torchtune\.', re.M)


def detect(data) -> str | None:
    if not isinstance(data, dict):
        return None
    if any(isinstance(v, dict) and str(v.get("_component_", "")).startswith("torchtune.") for v in data.values()):
        return "torchtune"  # a recipe config: its components are torchtune's
    for fmt, required, any_of in DETECT:
        if all(k in data for k in required) and any(k in data for k in any_of):
            if fmt == "torchtune" and not (isinstance(data["model"], dict) and "_component_" in data["model"]):
                continue
            return fmt
    return None


def sniff(text: str) -> bool:
    return _SNIFF.search(text) is not None


def read(data, path: str, options, forced: str | None = None) -> Native | None:
    """The memfit document a native file means, or None when it is not one (`forced`: the
    --input-format name, which reads the file as that format whatever its keys)."""
    from memfit.read.native import run, settings

    fmt = forced or detect(data)
    if fmt is None or fmt == "memfit":
        return None
    conf = settings.effective(path, options)
    if not isinstance(data, dict):
        r = Reader(fmt, {}, path)
        r.error(At(()), codes.NATIVE_CONFIG, f"a {fmt} config is a mapping of keys; this file's top level is not")
        return r.native
    return run.read(fmt, data, path, conf)

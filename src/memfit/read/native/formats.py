"""Which format a file is (DETECT, by its keys), and the entry points the pipeline calls."""

from __future__ import annotations

from memfit.diagnostics import codes
from memfit.read.native.base import FORMATS, At, Native, Reader

__all__ = ["FORMATS", "Native", "detect", "read", "sniff"]

# format -> (keys that must all be present, keys of which one must be present); first match wins
DETECT: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("axolotl", ("base_model",), ("micro_batch_size", "sequence_len", "adapter", "datasets", "load_in_4bit", "load_in_8bit", "num_epochs", "lora_r", "optimizer")),
    ("llama-factory", ("model_name_or_path",), ("stage", "finetuning_type", "cutoff_len", "template", "lora_rank", "quantization_bit", "lora_target")),
    ("hf-trainer", ("model_name_or_path",), ("per_device_train_batch_size", "output_dir", "block_size", "max_seq_length", "gradient_accumulation_steps", "do_train")),
    ("torchtune", ("model",), ("tokenizer", "optimizer", "batch_size", "epochs", "checkpointer", "dtype")),
    ("deepspeed", (), ("zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size", "zero_allow_untested_optimizer")),
    ("accelerate", ("distributed_type",), ("num_processes", "compute_environment", "mixed_precision", "num_machines")),
    ("litgpt", ("checkpoint_dir",), ("train", "precision", "devices", "quantize", "lora_r", "out_dir", "eval")),
    ("litgpt", ("model_name",), ("model_config", "initial_checkpoint_dir", "tokenizer_dir")),   # `litgpt pretrain`
)

# A cheap test before parsing (the hook, --skip-unrecognized): could the text spell any key DETECT
# reads, however YAML or JSON lets it be written (flow mapping, indented, quoted, an escape)? A
# text with none of these substrings cannot; anything else is parsed and DETECT decides on the
# parsed document, never on the text's layout.
_MAY_SPELL = ("model", "zero_", "train_", "distributed_type", "_component_", "checkpoint_dir", "\\")


def detect(data) -> str | None:
    if not isinstance(data, dict):
        return None
    if any(isinstance(v, dict) and str(v.get("_component_", "")).startswith("torchtune.") for v in data.values()):
        return "torchtune"  # a recipe config: its components are torchtune's
    from memfit.read.native.llamafactory import v1_key

    if v1_key(data) is not None:
        return "llama-factory"  # its v1 format: read by read/native/llamafactory_v1.py (run.read)
    for fmt, required, any_of in DETECT:
        if all(k in data for k in required) and any(k in data for k in any_of):
            if fmt == "torchtune" and not (isinstance(data["model"], dict) and "_component_" in data["model"]):
                continue
            return fmt
    return None


def sniff(text: str) -> bool:
    """Whether the text may be a native config (its parsed document then decides: detect)."""
    return any(word in text for word in _MAY_SPELL)


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

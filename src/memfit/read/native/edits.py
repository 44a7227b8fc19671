"""A fix (whatif/fixes.py) in a native config's own keys: the memfit key a remedy changes, spelt as each format
spells it. A change with no spelling here (ZeRO, FSDP, offload: the DeepSpeed JSON's or the launch config's)
gets no edit; the fix then says so."""

from __future__ import annotations

# format -> memfit key path -> (native key, memfit value -> native value; None: the number as it is)
SPELLING: dict[str, dict[tuple, tuple[str, dict | None]]] = {
    "axolotl": {
        ("training", "micro_batch"): ("micro_batch_size", None),
        ("training", "eval_batch"): ("eval_batch_size", None),
        ("training", "gradient_accumulation"): ("gradient_accumulation_steps", None),
        ("training", "checkpointing"): ("gradient_checkpointing", {"full": True, "none": False}),
        ("optimizer",): ("optimizer", {"adamw8bit": "adamw_bnb_8bit"}),
    },
    "llama-factory": {
        ("training", "micro_batch"): ("per_device_train_batch_size", None),
        ("training", "eval_batch"): ("per_device_eval_batch_size", None),
        ("training", "gradient_accumulation"): ("gradient_accumulation_steps", None),
        ("training", "checkpointing"): ("disable_gradient_checkpointing", {"full": False, "none": True}),
        ("optimizer",): ("optim", {"adamw8bit": "adamw_bnb_8bit"}),
    },
    # LLaMA-Factory's v1 format (read/native/llamafactory_v1.py): micro_batch_size and enable_activation_checkpointing;
    # the accumulation is derived from global_batch_size (a micro-batch fix leaves it as it is), no 8-bit optimizer
    "llama-factory-v1": {
        ("training", "micro_batch"): ("micro_batch_size", None),
        ("training", "checkpointing"): ("enable_activation_checkpointing", {"full": True, "none": False}),
    },
    "torchtune": {
        ("training", "micro_batch"): ("batch_size", None),
        ("training", "gradient_accumulation"): ("gradient_accumulation_steps", None),
        ("training", "checkpointing"): ("enable_activation_checkpointing", {"full": True, "none": False}),
    },
    # LitGPT: train.micro_batch_size is nested (edited in place through its origin, native_edits); the accumulation is
    # derived from train.global_batch_size, which a micro-batch fix leaves as it is; no key checkpoints one device
    "litgpt": {},
    "hf-trainer": {
        ("training", "micro_batch"): ("per_device_train_batch_size", None),
        ("training", "eval_batch"): ("per_device_eval_batch_size", None),
        ("training", "gradient_accumulation"): ("gradient_accumulation_steps", None),
        ("training", "checkpointing"): ("gradient_checkpointing", {"full": True, "none": False}),
        ("optimizer",): ("optim", {"adamw8bit": "adamw_bnb_8bit"}),
    },
}


def spelt(fmt: str | None, path: tuple, value):
    """(native key, native value) for a memfit change, or None when the format has no spelling of it."""
    found = SPELLING.get(fmt or "", {}).get(path)
    if found is None:
        return None
    key, values = found
    if values is None:
        return (key, value) if isinstance(value, int) and not isinstance(value, bool) else None
    return (key, values[value]) if value in values else None

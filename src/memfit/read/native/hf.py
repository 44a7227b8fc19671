"""The Hugging Face Trainer's names, shared by the formats built on it (Axolotl, LLaMA-Factory,
the Trainer's own argument files): `TrainingArguments.optim` and the attention implementations.
One table each; the formats' modules read them, nothing else spells them.

Sources (transformers 5.24.0): `training_args.OptimizerNames`; `trainer_optimizer.py`
`_OPTIMIZER_HANDLERS` (which class each name builds), `_get_adamw_torch` (`fused=True` for
adamw_torch_fused), `_get_bitsandbytes_optimizer` (`optim_bits = 8 if "8bit" in name else 32`,
`is_paged = "paged" in name`); bitsandbytes `Optimizer2State.init_state` keeps 32-bit state in
float32 whatever the parameter's dtype.
"""

from __future__ import annotations

# optim name -> (memfit optimizer, training.optimizer_impl or None, dtypes.optimizer_state or None)
OPTIM: dict[str, tuple[str, str | None, str | None]] = {
    "adamw_torch": ("adamw", "foreach", None),  # torch.optim.AdamW, foreach by default on GPU
    "adamw_torch_fused": ("adamw", "fused", None),  # AdamW(fused=True)
    "adamw_hf": ("adamw", "foreach", None),  # transformers < 5: an alias of torch's AdamW in later 4.x
    "adamw_apex_fused": ("adamw", "fused", None),  # apex FusedAdam: one fused kernel
    "adafactor": ("adafactor", None, None),  # transformers.optimization.Adafactor: factored second moment
    "sgd": ("sgd", None, None),  # torch.optim.SGD, momentum 0 unless optim_args say otherwise
    "adagrad": ("adagrad", None, None),
    "rmsprop": ("rmsprop", None, None),
    "adamw_bnb_8bit": ("adamw8bit", None, None),  # bitsandbytes AdamW, optim_bits=8
    "adamw_8bit": ("adamw8bit", None, None),
    "paged_adamw_8bit": ("paged_adamw8bit", None, None),
    "paged_adamw_32bit": ("adamw", "for_loop", "float32"),  # bitsandbytes AdamW, optim_bits=32: fp32 state
    "paged_adamw": ("adamw", "for_loop", "float32"),
    "lion_8bit": ("lion8bit", None, None),
    "paged_lion_8bit": ("paged_lion8bit", None, None),
    "lion_32bit": ("lion", "for_loop", "float32"),
    "paged_lion_32bit": ("lion", "for_loop", "float32"),
    # Axolotl's own names (axolotl/utils/schemas/enums.py CustomSupportedOptimizers) with a torch.optim layout
    "optimi_adamw": ("adamw", "foreach", None),
}

# optim names that change memory in ways memfit does not model (counted as AdamW, with a warning)
OPTIM_UNMODELLED = (
    "galore", "apollo", "lomo", "adalomo", "grokadamw", "schedule_free", "ademamix", "adamw_torch_4bit",
    "adamw_torch_8bit", "adamw_anyprecision", "stable_adamw", "rmsprop_bnb", "muon", "came", "adopt", "ao_adamw",
)


def optim(name: str):
    """(optimizer, impl, state dtype) or None when memfit does not model it."""
    return OPTIM.get(name.strip().lower())


# attn_implementation (transformers' names) -> training.attention
ATTENTION = {
    "eager": "eager",
    "sdpa": "sdpa",
    "flash_attention_2": "flash",
    "flash_attention_3": "flash",
    "flash": "flash",
    "fa2": "flash",
    "fa3": "flash",
    "flex_attention": None,
    "xformers": None,
}

# the attention transformers picks when a config does not say: SDPA
# (modeling_utils.PreTrainedModel._check_and_adjust_attn_implementation: sdpa when available)
DEFAULT_ATTENTION = "sdpa"


def every_n_layers(r, key: str, checkpointing) -> None:
    """`{key: {every_n_layers: N, offload: true}}` (transformers 5's Trainer pops them for activation_checkpointing_enable):
    only the layers 0, N, 2N, ... are checkpointed -> training.checkpoint_every N; offload -> training.activation_offloading."""
    kwargs = r.get(key, (dict,), None)
    if not checkpointing or not isinstance(kwargs, dict):
        return
    if "every_n_layers" in kwargs:
        every = r.get("every_n_layers", (int,), 1, data=kwargs, prefix=(key,))
        if isinstance(every, int) and every > 1:
            r.set(("training", "checkpoint_every"), every, r.at(key, "every_n_layers"))
    # `offload: true`: each checkpoint runs under save_on_cpu (modeling_utils.py _activation_checkpointing_enable): the
    # checkpoints leave the GPU
    if r.get("offload", (bool,), False, data=kwargs, prefix=(key,)):
        r.set(("training", "activation_offloading"), True, r.at(key, "offload"))


"""The techniques a config switches on, applied to the step's program in one place.

Every program the ledger builds (ledger.training.build for one device, ledger.ranks for each tensor- or
pipeline-parallel rank) passes through `rewrite`; the schema's `training` keys of the techniques come from
`schema_properties`, their refusals from `problems`. Adding a technique: its module in ledger/techniques/
and its name in TECHNIQUES (docs/architecture.md, "Extending memfit").
"""

from __future__ import annotations

from importlib import import_module

# in the order they rewrite the program, each with the `training` keys that switch it on (its module's KEYS; a test
# keeps the two the same): a technique none of whose keys a config writes is off, and its module is not loaded (a check
# of a plain config imports none of them), unless it is on by default
TECHNIQUES = {
    "partial_checkpointing": ("checkpoint_every", "checkpoint_offset"),  # first: it builds the transformer's program again, layer by layer
    "keep_gradients": ("keep_gradients",),
    "quantized_saves_input": ("quantized_saves_input",),
    "litgpt_qkv": ("litgpt_qkv",),
    "chunked_loss": ("loss",),
    "fused_loss": ("fused_loss",),
    "liger_kernels": ("liger_kernels",),  # read by the model's rules (models/hf_derive): the program is built with them
    "outputs_dtype": ("outputs_dtype",),  # after the losses: the default loss re-priced on the converted logits
    "second_loss": ("second_loss",),  # on the logits as the loop receives them (after outputs_dtype)
    "optimizer_in_backward": ("optimizer_in_backward",),
    "activation_offloading": ("activation_offloading",),
    "paged_optimizer": ("paged_optimizer",),
    "previous_outputs_held": ("previous_outputs_held",),  # last: the logits as the loss's rewrite leaves them
}
# on where a config leaves their keys out: bitsandbytes' paged optimizers page their state unless told not to
ON_BY_DEFAULT = ("paged_optimizer",)


def modules(training: dict | None = None) -> list:
    """The techniques' modules, in order; given a `training` section, only those it may switch on."""
    return [import_module(f"memfit.ledger.techniques.{name}") for name, keys in TECHNIQUES.items()
            if training is None or name in ON_BY_DEFAULT or any(key in training for key in keys)]


def schema_properties() -> dict:
    out: dict = {}
    for module in modules():
        out.update(module.KEYS)
    return out


def problems(config, training: dict) -> list:
    """Problems (memfit.diagnostics Problem) of the techniques a config switches on: a refusal is an error at its key."""
    out = []
    for module in modules(training):
        if module.applies(training):
            out += module.problems(config, training)
    return out


def rewrite(step, config, training: dict, rebuild=None):
    """`rebuild(checkpointed=...)`: the builder's program built again (a technique's module with REBUILDS gets it:
    partial checkpointing's chosen layers), so no technique imports the builder."""
    for module in modules(training):
        if module.applies(training):
            if getattr(module, "REBUILDS", False):
                step = module.rewrite(step, config, training, rebuild)
            else:
                step = module.rewrite(step, config, training)
    if step.accumulating and not step.kept_gradients:
        # a later micro-batch adds its gradients into those the earlier ones made, as into kept ones
        step = import_module("memfit.ledger.techniques.keep_gradients").accumulated(step, config)
    return step

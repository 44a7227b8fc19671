"""The techniques a config switches on, applied to the step's program in one place.

Every program the ledger builds (ledger.training.build for one device, ledger.ranks for each tensor- or
pipeline-parallel rank) passes through `rewrite`; the schema's `training` keys of the techniques come from
`schema_properties`, their refusals from `problems`. Adding a technique: its module in ledger/techniques/
and its name in TECHNIQUES (docs/architecture.md, "Extending memfit").
"""

from __future__ import annotations

from importlib import import_module

# in the order they rewrite the program
TECHNIQUES = (
    "partial_checkpointing",  # first: it builds the transformer's program again, layer by layer
    "keep_gradients",
    "quantized_saves_input",
    "litgpt_qkv",
    "chunked_loss",
    "fused_loss",
    "optimizer_in_backward",
    "activation_offloading",
    "paged_optimizer",
    "previous_outputs_held",  # last: the logits as the loss's rewrite leaves them
)


def modules() -> list:
    return [import_module(f"memfit.ledger.techniques.{name}") for name in TECHNIQUES]


def schema_properties() -> dict:
    out: dict = {}
    for module in modules():
        out.update(module.KEYS)
    return out


def problems(config, training: dict) -> list:
    """Problems (memfit.diagnostics Problem) of the techniques a config switches on: a refusal is an error at its key."""
    out = []
    for module in modules():
        if module.applies(training):
            out += module.problems(config, training)
    return out


def rewrite(step, config, training: dict, rebuild=None):
    """`rebuild(checkpointed=...)`: the builder's program built again (a technique's module with REBUILDS gets it:
    partial checkpointing's chosen layers), so no technique imports the builder."""
    for module in modules():
        if module.applies(training):
            if getattr(module, "REBUILDS", False):
                step = module.rewrite(step, config, training, rebuild)
            else:
                step = module.rewrite(step, config, training)
    return step

"""The optimizer in backward: each parameter has an optimizer of its own, stepped by a hook as soon as its gradient
is accumulated, which then frees the gradient (torchtune's `optimizer_in_bwd: true`: recipes/full_finetune_single_device.py
`_setup_optimizer` makes `{p: config.instantiate(cfg_optimizer, [p])}` and training/memory.py
`register_optim_in_bwd_hooks` registers `p.register_post_accumulate_grad_hook(optim_step)`, whose `optim_step` runs
`optim_dict[param].step(); optim_dict[param].zero_grad()`). The optimizer state stays allocated; the gradients never
accumulate over the backward: one parameter's gradient and its own step's temporaries exist at a time, and the
optimizer step after the backward has nothing to do. torchtune refuses it with gradient accumulation (the gradient is
gone before the next micro-batch adds to it) and with gradient clipping (the norm needs every gradient at once):
memfit refuses the first at its key.
"""

from __future__ import annotations

from dataclasses import replace

from memfit.diagnostics import codes
from memfit.diagnostics.diagnostic import Problem

NAME = "optimizer_in_backward"

KEYS = {
    "optimizer_in_backward": {
        "title": "Optimizer in backward",
        "description": "true: each parameter is updated by an optimizer of its own as soon as its gradient is made, "
                       "and that gradient is freed (torchtune's optimizer_in_bwd, a register_post_accumulate_grad_hook "
                       "step): the gradients never accumulate, the optimizer state stays. Not with gradient_accumulation "
                       "above 1 (torchtune refuses it). Default false.",
        "type": "boolean",
        "default": False,
    },
}


def applies(training: dict) -> bool:
    return training.get("optimizer_in_backward") is True


def problems(config, training: dict) -> list:
    accumulation = training.get("gradient_accumulation")
    if isinstance(accumulation, int) and accumulation > 1:
        return [Problem(("training", "optimizer_in_backward"), codes.OPTIMIZER_IMPL,
                        f"the optimizer in backward frees each gradient as soon as its parameter is stepped, so "
                        f"gradient_accumulation {accumulation} has nothing to accumulate into (torchtune refuses it: "
                        f"\"Gradient accumulation is not supported with optimizer in bwd\"); set gradient_accumulation 1 "
                        f"or optimizer_in_backward false")]
    return []


def rewrite(step, config, training: dict):
    return replace(step, step_in_backward=True)

"""Gradients kept between steps: `optimizer.zero_grad(set_to_none=False)` zeroes the gradients in place instead
of freeing them, so every gradient is allocated from the first instant of the next step's forward (PyTorch's
default has been `set_to_none=True` since 2.0; transformers' Trainer before 4.31 and many hand-written loops
zeroed in place). The step then runs as a later micro-batch of gradient accumulation does: the walk holds
every gradient through forward and backward.

A kept gradient is accumulated in place (AccumulateGrad: `variable.grad += new_grad` where .grad exists), so each
parameter's new gradient is made first, a temporary beside the kept one, and freed once it is added: at a row's
worst backward moment its largest parameter's new gradient is in flight with the gradients flowing through it.
Measured (a dispatch-mode trace at MemTracker's peak, GPT-NeoX bf16-true under full checkpointing, zero_grad(
set_to_none=False)): the down projection's MmBackward holds its new weight gradient (h, i) beside its input's
gradient (T, i) and the layer output's; MemTracker's Temp is exactly those three.

A later micro-batch of gradient accumulation adds into the .grad the earlier ones made in the same way, without the
key (`accumulated`, applied by ledger.rewrites to every `accumulating` step without kept gradients; measured in
tests/ledger/test_tied_gradient.py).
"""

from __future__ import annotations

from dataclasses import replace

NAME = "keep_gradients"

KEYS = {
    "keep_gradients": {
        "title": "Gradients kept between steps",
        "description": "true: the gradients stay allocated between optimizer steps (zero_grad(set_to_none=False), the "
                       "old Trainer default), so they are on the device through the whole forward and backward. "
                       "Default false: PyTorch frees them (set_to_none=True).",
        "type": "boolean",
        "default": False,
    },
}


def applies(training: dict) -> bool:
    return training.get("keep_gradients") is True


def problems(config, training: dict) -> list:
    return []


def rewrite(step, config, training: dict):
    p = getattr(config, "parallel", None)
    if p is not None and p.zero:
        # DeepSpeed frees every gradient itself, whatever zero_grad does: ZeRO-1/2 in its optimizer step
        # (runtime/zero/stage_1_and_2.py step: `free_grad_in_param_list`), ZeRO-3 each 16-bit .grad once reduced
        # into its partition (stage3.py `partition_grads`: `param.grad = None`): nothing is kept into the next step
        return step
    if p is not None and p.fsdp is not None:
        # FSDP reduces each new gradient into the rank's own shard (placement holds the shards), the parameters'
        # .grad, which zero_grad(set_to_none=False) keeps; no unsharded .grad is kept for the new one to be added into
        return replace(step, accumulating=True, kept_gradients=True)
    return replace(added_into_grads(step), accumulating=True, kept_gradients=True)


def accumulated(step, config):
    """A later micro-batch of gradient accumulation (ledger.rewrites, where the step is `accumulating` without kept
    gradients): its .grad exist, made by the earlier micro-batches, and each new gradient is added into them as into
    kept ones (tests/ledger/test_tied_gradient.py: MemTracker, accumulation 2). DeepSpeed and FSDP as in `rewrite`."""
    p = getattr(config, "parallel", None)
    if p is not None and (p.zero or p.fsdp is not None):
        return step
    return added_into_grads(step)


def added_into_grads(step):
    """The step whose new gradients are added into existing .grad: each row's largest a temporary beside them
    (fresh_gradient), and a weight two rows use (a head tied to the input embedding) has the head's part of its
    gradient wait in autograd's input buffer for the embedding's, apart from the .grad it is then added into
    (Step.grad_buffered)."""
    return replace(step, rows=[fresh_gradient(row) for row in step.rows], grad_buffered=True)


def fresh_gradient(row):
    """The row with its largest parameter's new gradient among its backward's transients (a temporary until it is
    added into the kept .grad). A row whose worst moment comes before its parameters' gradients are made (a MoE
    layer's unsort, a dense MLP's activation backward: `flight_first`) has none there: its parameters' own backward
    after it does (ledger.step: the after-flight moment's extra bytes; a MoE layer's unsort has no such moment)."""
    if not row.grads or (row.flight_first and row.after_flight is None):
        return row
    new = max(row.grads)
    if row.flight_first:
        return replace(row, backward_extra=row.backward_extra + new)
    if row.backward_flight is not None:
        return replace(row, backward_flight=row.backward_flight + new)
    return replace(row, backward_extra=row.backward_extra + new)

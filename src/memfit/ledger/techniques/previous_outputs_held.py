"""A training loop that keeps the previous micro-batch's outputs bound through the next forward.

LitGPT's fine-tuning loops (litgpt/finetune/lora.py at 3ba6da40, `fit`: `logits = model(input_ids,
lm_head_chunk_size=128)` each iteration, `loss` rebound to a float by the logging branch) rebind `logits` only when
the next micro-batch's forward has returned: until then the previous logits are alive, and so is the autograd graph
they hang from. The backward has freed that graph's saved tensors (retain_graph False), but not what a custom autograd
Function's node holds as a plain attribute: bitsandbytes before 0.43.2 keeps each 4-bit matmul's input that way
(MatMul4Bit.forward `ctx.tensors = (A, B)`; training.quantized_saves_input), and autograd's release of a node's saved
variables leaves its attributes alone. So the next forward runs beside
- the previous logits (the head's output, as the model returns it: in fp32 where a wrapper converts it,
  training.outputs_dtype), and
- with training.quantized_saves_input on a 4-bit model, every 4-bit linear's input of the previous micro-batch: each
  part's, including those another op kept too in that micro-batch's own forward (those ops' saved copies are gone,
  the node's attribute is not); none for the first layer's attention behind a frozen embedding (that matmul kept
  nothing).
They are freed when the forward returns (the loop rebinds `logits`), before the loss runs; the new logits are held
from then on, through the loss's backward (where memfit's loss otherwise lets them go), the backward and the optimizer
step (measured: LitGPT's step on litgpt_port's tiny Llama, docs/accuracy.md). Measured on the CPU with the
0.43.1 line put back into the installed bitsandbytes' MatMul4Bit (tests/ledger/test_previous_outputs_held.py).

`longest_first`: the same loop whose first micro-batch is its longest and every later one shorter (Lit-GPT 8641822's
finetune/lora.py puts the dataset's longest sample into the first batch, `get_batch(..., longest_seq_ix if iter_num
== 0 else None)`, and pads each batch to its own longest): the outputs are held through their own loss, backward and
optimizer step as with true, but the next forward beside them is a shorter micro-batch's, not one of seq_len, and is
not priced (memfit prices every micro-batch at seq_len: true would put a forward of that length beside them).
"""

from __future__ import annotations

from dataclasses import replace

from memfit.diagnostics import codes
from memfit.diagnostics.diagnostic import Problem
from memfit.ledger.techniques import outputs_dtype, quantized_saves_input

NAME = "previous_outputs_held"

KEYS = {
    "previous_outputs_held": {
        "title": "The loop holds the previous micro-batch's outputs through the next forward",
        "description": "true: the training loop keeps each micro-batch's model outputs bound until the next "
                       "forward returns (LitGPT's `logits = model(...)`): the logits through the loss, the backward "
                       "and the optimizer step, then beside the next forward with, under "
                       "training.quantized_saves_input on a 4-bit model, every 4-bit matmul input their autograd "
                       "graph still holds (bitsandbytes < 0.43.2 keeps it on the node, not as a saved tensor). "
                       "longest_first: that loop with its longest micro-batch first and every later one shorter "
                       "(Lit-GPT 8641822 forces the longest sample into the first batch): the outputs held through "
                       "their own loss, backward and optimizer step, the next (shorter) forward beside them not "
                       "priced (the held outputs are priced at seq_len: under gradient accumulation the optimizer "
                       "step holds the last, shorter micro-batch's, so the figure is on the safe side). Default false (the loop lets the outputs go with the loss, as transformers' Trainer "
                       "does).",
        "anyOf": [{"type": "boolean"}, {"const": "longest_first"}],
        "default": False,
    },
}


def applies(training: dict) -> bool:
    return training.get("previous_outputs_held") in (True, "longest_first")


def problems(config, training: dict) -> list:
    model = getattr(config, "model", None)
    if model is None or not hasattr(model, "cfg"):
        return [Problem(("training", "previous_outputs_held"), codes.NEEDS_TRANSFORMER,
                        "training.previous_outputs_held: the outputs held are a transformer's logits; declare the "
                        "model as a transformer (hf_config)")]
    p = getattr(config, "parallel", None)
    if p is not None and p.pipeline > 1:
        return [Problem(("training", "previous_outputs_held"), codes.NOT_MODELLED,
                        "training.previous_outputs_held under pipeline parallelism: each stage's program leaves the "
                        "previous micro-batch's outputs out (the figure is low)")]
    return []


def held_inputs(step, config, training: dict) -> int:
    """Bytes of the previous micro-batch's 4-bit matmul inputs its graph's nodes still hold (0 without them)."""
    model = config.model
    if not quantized_saves_input.applies(training) or (getattr(model, "dtypes", None) or {}).get("quantized") != "4bit":
        return 0
    every = quantized_saves_input.extra_inputs(config, every=True)
    no_grad_in = bool(step.rows) and step.rows[0].name == "embeddings" and not step.rows[0].output_grad
    total = 0
    for row in step.rows:
        if not row.name.startswith("layer "):
            continue
        part = row.name.rsplit(" ", 1)[-1]
        if part == "attention" and no_grad_in and row.name == "layer 0 attention":
            continue
        total += every.get(part, 0)
    return total


def rewrite(step, config, training: dict):
    model = getattr(config, "model", None)
    if model is None or not hasattr(model, "cfg") or not step.rows or step.rows[-1].output is None:
        return step
    logits = outputs_dtype.received(step, config, training)  # fp32 where a wrapper converts them (training.outputs_dtype)
    # longest_first: the next forward beside them is a shorter micro-batch's, not priced
    beside = logits + held_inputs(step, config, training) if training.get("previous_outputs_held") is True else 0
    return replace(step, forward_held=step.forward_held + beside, outputs_held=step.outputs_held + logits)

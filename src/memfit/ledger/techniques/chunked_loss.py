"""A chunked cross-entropy: torchtune's `CEWithChunkedOutputLoss` (modules/loss/ce_chunked_output_loss.py, 0.6.1)
with the model's output projection run a chunk of the sequence at a time (modules/transformer.py
`TransformerDecoder.chunked_output`: `[self.output(chunk) for chunk in last_hidden_state.chunk(num_output_chunks, dim=1)]`,
switched on by `set_num_output_chunks`, which the recipes call when the loss is this class).

What it allocates, from that code and measured (MemTracker around torchtune's own step on the CPU,
tests/ledger/test_chunked_loss.py):
- forward: the logits, as a list of chunks in the model's dtype, all of them alive (the model returns them before
  the loss runs); `compute_cross_entropy` upcasts one chunk at a time (`logits.float()`: a chunk's fp32 copy, not the
  whole logits'), and each chunk's log-softmax (fp32) is kept for backward as the unchunked loss keeps it;
- backward: autograd runs every chunk's loss backward first (the loss's nodes are newer than every chunk's output
  projection): at a chunk, the gradient of its log-softmax output and of its input, fp32 chunk-sized (not
  logits-sized); the chunks' gradients, cast back to the model's dtype, make the whole logits' gradient again by the
  time the output projection's backward runs; that weight's gradient comes from each chunk's matmul and is summed by
  autograd's input buffer out of place (`add.Tensor`): the sum so far, the chunk's and their sum (three of it) at
  once, beside the logits' gradient and the hidden states'.
"""

from __future__ import annotations

from dataclasses import replace

from memfit.diagnostics import codes
from memfit.diagnostics.diagnostic import Problem
from memfit.recipe.costs import dtype_bytes

NAME = "chunked_loss"

KINDS = ("chunked",)

KEYS = {
    "loss": {
        "title": "The loss's implementation",
        "description": "How the cross-entropy over the logits runs. kind chunked: torchtune's CEWithChunkedOutputLoss "
                       "with the output projection chunked (num_output_chunks = chunks, default 8): the logits exist as "
                       "chunks in the model's dtype, each upcast to fp32 inside the loss one at a time. Absent: "
                       "transformers' loss over the whole logits.",
        "type": "object",
        "properties": {
            "kind": {"enum": list(KINDS), "description": "chunked: torchtune's CEWithChunkedOutputLoss"},
            "chunks": {"type": "integer", "minimum": 1, "default": 8, "description": "the number of chunks of the sequence"},
        },
        "required": ["kind"],
        "additionalProperties": False,
    },
}


def applies(training: dict) -> bool:
    loss = training.get("loss")
    return isinstance(loss, dict) and loss.get("kind") in KINDS


def problems(config, training: dict) -> list:
    model = getattr(config, "model", None)
    if model is None or not hasattr(model, "cfg"):
        return [Problem(("training", "loss"), codes.NEEDS_TRANSFORMER,
                        "training.loss: a chunked loss chunks a transformer's output projection; declare the model as a transformer (hf_config)")]
    return []


def rewrite(step, config, training: dict):
    model = getattr(config, "model", None)
    if model is None or not hasattr(model, "cfg") or not step.rows or step.rows[-1].name != "head":
        return step
    chunks = int(training["loss"].get("chunks") or 8)
    run, cfg = model.training, model.cfg
    b, s, vocab = run["micro_batch"], run["seq_len"], cfg.get("vocab_size")
    head = step.rows[-1]
    logits = step.tensors[head.output]
    if not vocab or not b or not s:
        return step
    per_chunk = b * -(-s // chunks) * vocab  # torch.chunk: ceil(s / chunks) tokens of each sequence per chunk
    chunk32 = dtype_bytes(per_chunk, "float32")
    upcast = chunk32 if logits < dtype_bytes(b * s * vocab, "float32") else 0  # an fp32 model's .float() copies nothing
    loss = replace(step.loss, forward=(logits, *([upcast] if upcast else [])), backward=(chunk32, chunk32))
    flight = head.backward_flight
    if chunks > 1 and head.grads:
        # the output projection's weight gradient summed out of place over the chunks: the walk counts one (the
        # row's gradient), two more are in flight beside the logits' gradient and the hidden states'
        hidden = step.tensors.get(head.input, 0)
        flight = logits + hidden + 2 * max(head.grads)
    rows = step.rows[:-1] + [replace(head, backward_flight=flight)]
    return replace(step, rows=rows, loss=loss)

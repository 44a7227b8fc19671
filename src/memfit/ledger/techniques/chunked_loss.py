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
from memfit.ledger.techniques import outputs_dtype
from memfit.models import held, hf_activations as acts
from memfit.recipe.costs import dtype_bytes

NAME = "chunked_loss"

KINDS = ("chunked", "chunked_head")

KEYS = {
    "loss": {
        "title": "The loss's implementation",
        "description": "How the cross-entropy over the logits runs. kind chunked: torchtune's CEWithChunkedOutputLoss "
                       "with the output projection chunked (num_output_chunks = chunks, default 8): the logits exist as "
                       "chunks in the model's dtype, each upcast to fp32 inside the loss one at a time. kind "
                       "chunked_head: LitGPT's fine-tuning loss (model(input_ids, lm_head_chunk_size=chunk_size), "
                       "chunked_cross_entropy): chunks of chunk_size tokens (default 128), the cross-entropy in the "
                       "logits' own dtype, no fp32 copy. Absent: "
                       "transformers' loss over the whole logits.",
        "type": "object",
        "properties": {
            "kind": {"title": "Which chunked loss", "enum": list(KINDS), "description": "chunked: torchtune's CEWithChunkedOutputLoss (each chunk upcast "
                                                         "to fp32); chunked_head: LitGPT's lm_head_chunk_size with "
                                                         "chunked_cross_entropy (each chunk in the logits' dtype)"},
            "chunks": {"title": "Chunks", "type": "integer", "minimum": 1, "default": 8, "description": "kind chunked: the number of chunks of the sequence"},
            "chunk_size": {"title": "Tokens per chunk", "type": "integer", "minimum": 1, "default": 128, "description": "kind chunked_head: the tokens of each sequence per chunk"},
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
    run, cfg = model.training, model.cfg
    b, s, vocab = run["micro_batch"], run["seq_len"], cfg.get("vocab_size")
    head = step.rows[-1]
    logits = step.tensors[head.output]
    if not vocab or not b or not s:
        return step
    whole32 = dtype_bytes(b * s * vocab, "float32")
    tensors = step.tensors
    # the logits as the loss reads them: fp32 where a wrapper converts the model's outputs (training.outputs_dtype,
    # Lightning Fabric's convert_output: every LitGPT run), else the head's own
    seen = outputs_dtype.received(step, config, training)
    if training["loss"]["kind"] == "chunked_head":
        # LitGPT (litgpt/model.py GPT.forward: `[self.lm_head(x_i) for x_i in x.split(lm_head_chunk_size, dim=1)]`;
        # litgpt/utils.py chunked_cross_entropy: `F.cross_entropy(logit_chunk, target_chunk, reduction="none")` per
        # chunk, no .float()): each chunk's log-softmax is kept in the logits' dtype, and the loss's gradients in
        # flight are a chunk's, in that dtype
        # (under *-mixed autocast runs cross_entropy in fp32, on CPU and CUDA alike: the log-softmax and the
        # gradients are fp32 as the whole loss's; measured, saved_tensors_hooks around its code under CPU autocast)
        size = int(training["loss"].get("chunk_size") or 128)
        chunks = -(-s // size)
        made = outputs_dtype.logits_dtype(model)   # the head's output
        read = made if seen == logits else "float32"   # the loss's input: the fp32 copy where converted
        mixed = run_precision(model).endswith("-mixed")
        chunk = dtype_bytes(b * min(size, s) * vocab, "float32" if mixed else read)
        # litgpt/finetune/lora.py `logits[-1] = logits[-1][..., :-1, :]`: with more than one sequence the last chunk's
        # `reshape(-1, vocab)` copies it (it is not contiguous), beside the whole logits
        last = dtype_bytes(b * (s - (chunks - 1) * size - 1) * vocab, read) if b > 1 else 0
        tensors = {t: (n * seen // whole32 if t in step.loss_kept and n == whole32 and not mixed else n) for t, n in step.tensors.items()}
        loss = replace(step.loss, forward=(seen, *([last] if last else [])), backward=(chunk, chunk))
        # the gradient chunks that reach the head: cast back to its dtype where the loss read a converted copy
        head_chunk = chunk if seen == logits else dtype_bytes(b * min(size, s) * vocab, made)
    else:
        asked = int(training["loss"].get("chunks") or 8)
        per_chunk = b * -(-s // asked) * vocab  # torch.chunk: ceil(s / chunks) tokens of each sequence per chunk
        chunks = -(-s // -(-s // asked))  # (and as many chunks as those fill)
        chunk32 = dtype_bytes(per_chunk, "float32")
        upcast = chunk32 if seen < whole32 else 0  # an fp32 model's (or converted logits') .float() copies nothing
        loss = replace(step.loss, forward=(seen, *([upcast] if upcast else [])), backward=(chunk32, chunk32))
    # the head's input (the final norm's output) stays referenced through the loss where the head keeps no copy of it
    # (models/held.py; the transformers model's cache is dropped with its output before the chunks' loss runs)
    unsaved = step.tensors.get(head.input, 0) if head.input is not None and head.input not in head.kept else 0
    if unsaved:
        loss = replace(loss, forward=(*loss.forward, unsaved))
    kept, tensors = list(head.kept), dict(tensors)
    forward_flight, backward_extra = head.forward_flight, head.backward_extra
    dequantized = _head_dequantized(model) if training["loss"]["kind"] == "chunked_head" else 0
    if dequantized:
        # a 4-bit head (bitsandbytes 0.42.0 MatMul4Bit.forward: `F.dequantize_4bit(B, quant_state).to(A.dtype)`, and
        # its backward again with grad_output's dtype): each chunk's matmul dequantizes the whole weight, in the dtype
        # it was quantized from, and casts it; at the last chunk every earlier chunk's logits are alive (the cast
        # copy beside the chunk's output, or the dequantized weight beside its cast before the output exists)
        sizes = acts.layer_sizes(model.cfg, b, s)
        low = dtype_bytes(sizes["V"] * sizes["h"], _cast_dtype(model))
        last_chunk = dtype_bytes(b * (s - (chunks - 1) * size) * vocab, outputs_dtype.logits_dtype(model))
        saved = {t for row in step.rows for t in row.kept}
        moving = sum(step.tensors[t] for t in (head.input, head.output) if t is not None and t not in saved)
        base = moving + head.inner if forward_flight is None else forward_flight
        forward_flight = base + max(dequantized - last_chunk, low)
        # a frozen head's backward moment; an adapted head's is its weight-gradient sum below (backward_flight), which
        # the walk takes instead: the dequantize in its base matmul's backward is not priced there (open, measured
        # only frozen: docs/accuracy.md)
        backward_extra += dequantized
    cast = _weight_cast(model, b, s, bool(head.grads))
    for _ in range(chunks - 1 if cast else 0):   # every further chunk's own copy of the frozen head's weight
        tensors[max(tensors) + 1] = cast
        kept.append(max(tensors))
    flight = head.backward_flight
    if chunks > 1 and head.grads:
        # the output projection's weight gradient summed out of place over the chunks, first at the second chunk's
        # matmul: the walk counts one (the row's gradient), two more are in flight beside the hidden states' gradient
        # and the logits' gradient: torchtune's whole (measured: MemTracker's peak at that add.Tensor is the whole
        # logits' gradient + three weight gradients), LitGPT's less the two chunks whose matmuls have run (measured:
        # each chunk's gradient is freed by its matmul's backward)
        hidden = step.tensors.get(head.input, 0)
        left = logits if training["loss"]["kind"] == "chunked" else max(logits - 2 * head_chunk, 0)
        flight = left + hidden + 2 * max(head.grads)
    rows = step.rows[:-1] + [replace(head, backward_flight=flight, kept=kept, forward_flight=forward_flight,
                                     backward_extra=backward_extra)]
    out = replace(step, rows=rows, loss=loss, tensors=tensors)
    # the footprint's saved activations, rewritten here with the program: the log-softmax in the logits' dtype
    # (chunked_head), each further chunk's copy of the head's weight. Under full checkpointing the footprint is the
    # larger of the end of the forward and a layer's recomputation in the backward (models/hf_act_saved.peak_saved),
    # which the head's and the loss's tensors do not reach: less kept there is not taken off (the footprint stays on
    # the safe side, by at most the change), more is added
    change = saved_bytes(out) - saved_bytes(step)
    if run.get("checkpointing") == "full" and change < 0:
        change = 0
    return replace(out, saved_rewritten=step.saved_rewritten + change)


def saved_bytes(step) -> int:
    """Bytes of every tensor the step keeps for backward (each id once): the rows' and the loss's."""
    ids = {t for row in step.rows for t in row.kept} | set(step.loss_kept)
    return sum(step.tensors[t] for t in ids)


def run_precision(model) -> str:
    """The run's precision (recipe), 32-true when none is given."""
    return (getattr(model, "recipe", None) or {}).get("precision", "32-true")


def _head_dequantized(model) -> int:
    """Bytes of a 4-bit head's dequantized weight and its cast copy, alive in each chunk's forward and backward
    (models/held.dequantized_weight); 0 for a head left unquantized."""
    dtypes = getattr(model, "dtypes", None) or {}
    if not dtypes.get("head_quantized") or not dtypes.get("quantized_from"):
        return 0
    sizes = acts.layer_sizes(model.cfg, 1, 1)
    return held.dequantized_weight(sizes["V"] * sizes["h"], dtypes["quantized_from"], _cast_dtype(model))


def _cast_dtype(model) -> str:
    """The dtype a 4-bit head's dequantized weight is cast to: its input's in forward, its output gradient's in
    backward (models/held.projection_dtype)."""
    precision = run_precision(model)
    return held.projection_dtype(acts.role_dtypes(precision, model.dtypes), True, precision.endswith("-mixed"))


def _weight_cast(model, micro_batch: int, seq_len: int, head_trains: bool) -> int:
    """Bytes of the autocast copy of the head's weight each chunk keeps anew (models/held.chunk_weight_casts)."""
    precision = run_precision(model)
    sizes = acts.layer_sizes(model.cfg, micro_batch, seq_len)
    return held.chunk_weight_casts(sizes["V"] * sizes["h"], acts.role_dtypes(precision, model.dtypes),
                                   precision.endswith("-mixed"), head_trains)

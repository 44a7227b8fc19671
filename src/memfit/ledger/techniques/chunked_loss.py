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

Kind chunked_head is LitGPT's (rewrite, below); kind linear torchtune's LinearCrossEntropyLoss, the output projection
inside the loss (_linear, measured against the class's code in the same test file); kind chunked_rows LitGPT's
finetune/full.py loss, chunked_cross_entropy over the whole logits (_rows, measured against litgpt 0.5.13's own step:
tests/ledger/test_litgpt_head.py).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import accumulate

from memfit.diagnostics import codes
from memfit.diagnostics.diagnostic import Problem
from memfit.ledger.techniques import outputs_dtype
from memfit.models import held, hf_activations as acts
from memfit.recipe.costs import dtype_bytes

NAME = "chunked_loss"

KINDS = ("chunked", "chunked_head", "linear", "chunked_rows")

KEYS = {
    "loss": {
        "title": "The loss's implementation",
        "description": "How the cross-entropy over the logits runs. kind chunked: torchtune's CEWithChunkedOutputLoss "
                       "with the output projection chunked (num_output_chunks = chunks, default 8): the logits exist as "
                       "chunks in the model's dtype, each upcast to fp32 inside the loss one at a time. kind "
                       "chunked_head: LitGPT's fine-tuning loss (model(input_ids, lm_head_chunk_size=chunk_size), "
                       "chunked_cross_entropy): chunks of chunk_size tokens (default 128), the cross-entropy in the "
                       "logits' own dtype, no fp32 copy. kind linear: torchtune's LinearCrossEntropyLoss (the model "
                       "returns its final norm's output; the loss copies the rows of the tokens whose label is not "
                       "ignored, splits them into chunks (num_output_chunks = chunks, default 8) and runs the output "
                       "projection and an fp32 cross-entropy a chunk at a time: the whole logits never exist). memfit "
                       "does not know the labels: every token counts as one whose label is kept, an upper bound. kind "
                       "chunked_rows: LitGPT's finetune/full.py loss (the whole logits, model(input_ids); "
                       "chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:]) flattens each sequence's first "
                       "seq_len - 1 positions, a copy where micro_batch > 1, and runs the cross-entropy chunk_size rows "
                       "at a time, default 128, in the logits' own dtype). Absent: transformers' loss over the whole "
                       "logits.",
        "type": "object",
        "properties": {
            "kind": {"title": "Which chunked loss", "enum": list(KINDS), "description": "chunked: torchtune's CEWithChunkedOutputLoss (each chunk upcast "
                                                         "to fp32); chunked_head: LitGPT's lm_head_chunk_size with "
                                                         "chunked_cross_entropy (each chunk in the logits' dtype); "
                                                         "linear: torchtune's LinearCrossEntropyLoss (the output "
                                                         "projection inside the loss, a chunk of the tokens at a time; "
                                                         "every token counted as labelled: an upper bound); "
                                                         "chunked_rows: LitGPT's full.py chunked_cross_entropy over the "
                                                         "whole logits (chunk_size rows of the flattened batch at a time)"},
            "chunks": {"title": "Chunks", "type": "integer", "minimum": 1, "default": 8, "description": "kind chunked: the number of chunks of the sequence; "
                                                                                                       "kind linear: the number of chunks of the batch's tokens (num_output_chunks)"},
            "chunk_size": {"title": "Tokens per chunk", "type": "integer", "minimum": 1, "default": 128, "description": "kind chunked_head: the tokens of each sequence per chunk; kind chunked_rows: the rows of the flattened batch (micro_batch x (seq_len - 1) tokens) per chunk"},
            "shift": {"title": "Shifted in the loss", "type": "boolean", "default": True, "description": "kind chunked_rows: true, finetune/full.py's chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:]) (the slice: a copy where micro_batch > 1, and slice_backward's whole-logits gradient); false, pretrain.py's chunked_cross_entropy(logits, targets) on targets shifted by the data (micro_batch x seq_len rows, views only)"},
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
    if training["loss"].get("kind") == "linear" and training.get("teacher"):
        # torchtune main's KD recipes call the loss on the student's logits without set_model_output: the class's
        # forward raises ("forward called before update_model"); its other branch refuses linear losses for KD
        return [Problem(("training", "loss"), codes.SCHEMA,
                        "training.loss kind linear with training.teacher: the forward-KL loss reads the student's whole "
                        "logits, which LinearCrossEntropyLoss never makes (torchtune's KD recipes do not support linear "
                        "losses); use kind chunked (CEWithChunkedOutputLoss)")]
    if training["loss"].get("kind") == "linear":
        # (a note: the figure is the bound, nothing is wrong)
        return [Problem(("training", "loss"), codes.NOT_MODELLED,
                        "training.loss kind linear: memfit does not read the labels, so every token counts as one whose "
                        "label is kept (LinearCrossEntropyLoss projects only those): the figure is an upper bound where "
                        "the data masks tokens (a prompt, padding)", severity=codes.INFORMATION, on_key=True)]
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
    if training["loss"]["kind"] == "linear":
        return _linear(step, model, b * s, vocab, int(training["loss"].get("chunks") or 8))
    if training["loss"]["kind"] == "chunked_rows":
        return _rows(step, config, training, b, s, vocab, int(training["loss"].get("chunk_size") or 128),
                     training["loss"].get("shift", True) is not False)
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


def _rows(step, config, training: dict, b: int, s: int, vocab: int, size: int, shift: bool = True):
    """LitGPT's finetune/full.py loss (litgpt 0.5.13 and 3ba6da40 alike): `logits = model(input_ids)`, the whole
    logits (fp32 through Fabric: training.outputs_dtype, `received`), held by fit's `logits` through the step
    (training.previous_outputs_held); `chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])` (litgpt/utils.py,
    "lm_head wasn't chunked"): `logits.reshape(-1, vocab)`, a copy of the slice where there is more than one sequence
    (it is not contiguous) and a view of it where there is one; `logits.split(chunk_size)` over the b x (s - 1) rows;
    per chunk `F.cross_entropy(reduction="none")`: its log-softmax (in the logits' dtype; fp32 under *-mixed autocast)
    kept, with its total weight (a scalar of that dtype) and the targets' rows (`targets.reshape(-1)`: a copy where
    there is more than one sequence, else a view of the loop's targets). Measured (litgpt 0.5.13's step, a dispatch
    trace of every storage alive at each op; tests/ledger/test_litgpt_head.py):
    - forward, at the last chunk's log-softmax: the logits, the reshaped copy (b > 1) and every chunk's log-softmax;
      the copy is freed when the function returns (each chunk's log-softmax saves its output, not its input);
    - backward, a chunk at a time, the last first: at a chunk's log-softmax backward, the log-softmax of it and of every
      chunk before it, its nll_loss gradient and its own gradient (two chunks), the gradients of the chunks after it
      (one log-softmax's worth each) waiting for the split's backward: every log-softmax's bytes and two chunks';
    - then the split's backward concatenates the chunks' gradients (b x (s - 1) rows beside them), the slice's
      backward copies that into a zero gradient of the whole logits (`slice_backward`: the b x s rows beside the
      concatenation), and the conversion's backward casts it to the head's dtype (the fp32 whole and the head's
      output-sized gradient): the head's moments before its matmul's backward (Row.early_flight), the loss's
      tensors freed, the logits still held.
    Unshifted (`shift` false: litgpt/pretrain.py fit, `chunked_cross_entropy(logits, targets)` with the targets shifted
    by the data: tests/ledger/test_litgpt_pretrain.py) the b x s rows are views of the logits and the targets, and the
    split's backward is the logits' whole gradient: no copy, no slice_backward."""
    model = config.model
    head = step.rows[-1]
    logits, seen = step.tensors[head.output], outputs_dtype.received(step, config, training)
    made = outputs_dtype.logits_dtype(model)
    read = made if seen == logits else "float32"   # the logits the loss reads: the fp32 copy where converted
    mixed = run_precision(model).endswith("-mixed")
    comp = "float32" if mixed else read   # autocast runs cross_entropy in fp32
    rows = b * (s - 1) if shift else b * s
    sliced = shift and b > 1   # the slice of more than one sequence is not contiguous: reshape copies it
    if rows < 1:
        return step
    first = min(size, rows)   # the first chunk, the largest (split: every chunk of `size` rows but the last)
    lsm, chunk = dtype_bytes(rows * vocab, comp), dtype_bytes(first * vocab, comp)
    copy = dtype_bytes(rows * vocab, read) if sliced else 0
    # under *-mixed on logits not converted, autocast's fp32 copy of a chunk is alive at its log-softmax
    upcast = dtype_bytes(first * vocab, "float32") if comp != read else 0
    tensors = dict(step.tensors)
    kept = []
    for nbytes in (lsm, dtype_bytes(rows, "int64") if sliced else 0, dtype_bytes(-(-rows // size), comp)):
        tensors[max(tensors) + 1] = nbytes
        kept.append(max(tensors))
    # the head's input (the final norm's output) stays referenced through the loss where the head keeps no copy of it
    # (LitGPT's GPT keeps no cache in training: nothing else of the forward is held unsaved)
    unsaved = step.tensors.get(head.input, 0) if head.input is not None and head.input not in head.kept else 0
    forward = (seen, *([copy] if copy else []), *([upcast] if upcast else []), *([unsaved] if unsaved else []))
    loss = replace(step.loss, forward=forward, backward=(chunk, chunk), upcast=0, held=(unsaved,) if unsaved else ())
    whole = dtype_bytes(b * s * vocab, read) if shift else 0   # slice_backward's zero gradient of the whole logits
    shifted = dtype_bytes(rows * vocab, read)   # the split's concatenated gradient
    cast = logits if read != made else 0   # the conversion's backward: the gradient in the head's dtype
    early = max(2 * shifted, shifted + whole, whole + cast) if shift else max(2 * shifted, shifted + cast)
    rows_out = step.rows[:-1] + [replace(head, early_flight=max(head.early_flight or 0, early))]
    out = replace(step, rows=rows_out, loss=loss, tensors=tensors, loss_kept=kept)
    change = saved_bytes(out) - saved_bytes(step)
    if model.training.get("checkpointing") == "full" and change < 0:
        change = 0
    return replace(out, saved_rewritten=step.saved_rewritten + change)


def _split(tokens: int, chunks: int) -> list:
    """The tokens of each chunk, as `tensor_split(chunks, dim=0)` makes them: the first `tokens % chunks` one larger
    (empty chunks, where there are more chunks than tokens, make nothing and are left out)."""
    small, larger = divmod(tokens, chunks)
    return [n for n in [small + 1] * larger + [small] * (chunks - larger) if n]


def _linear(step, model, tokens: int, vocab: int, asked: int):
    """torchtune's LinearCrossEntropyLoss (torchtune main, modules/loss/cross_entropy_loss.py; module docstring of
    the kind in docs/peak.md): `set_model_output` makes the model return its final norm's output (the head's input,
    held by the recipe's `outputs` until the loss returns); the loss `index_select`s the rows of the tokens whose
    label is kept (every token here: memfit does not know the labels, an upper bound), `tensor_split`s them over the
    tokens and per chunk runs the output projection, `.float()` and `F.cross_entropy(reduction="sum")`."""
    head = step.rows[-1]
    made = outputs_dtype.logits_dtype(model)
    parts = _split(tokens, asked)
    tensors = dict(step.tensors)
    hidden = tensors.get(head.input, 0) if head.input is not None else 0
    # what the head keeps of the logits' size is made after the projection, on the model's logits (Gemma 2's final
    # soft-capping as transformers models it): the loss runs `model.output` alone, so none of it is made
    whole = step.tensors.get(head.output, 0)
    kept = [t for t in head.kept if t != head.input and step.tensors[t] != whole]
    # the index_select's copy of the hidden rows: what the projection (or its adapter) saves where the head kept its
    # input, else alive through the loss beside the model's output; index_select keeps its int64 indices
    copy_kept = head.input is not None and head.input in head.kept
    for nbytes in ([hidden] if copy_kept else []) + ([dtype_bytes(tokens, "int64")] if head.grad_input else []):
        tensors[max(tensors) + 1] = nbytes
        kept.append(max(tensors))
    # the head's output is one chunk's logits at a time; the last chunk's (the smallest) is alive at the loss's last
    # moment in forward: its logits in the head's dtype and their fp32 copy beside every chunk's log-softmax (fp32,
    # loss_kept, as the whole loss's)
    last = parts[-1]
    tensors[head.output] = dtype_bytes(last * vocab, made)
    upcast = dtype_bytes(last * vocab, "float32") if made != "float32" else 0
    chunk = tensors[head.output]
    # an adapted head (LoRA's `F.linear(x, weight) + (alpha / rank) * lora_b(lora_a(x))`): the base output, the
    # adapter's scaled output and their sum, three chunks in the head's dtype, before the chunk's log-softmax exists;
    # where that moment is the larger, what it has beyond the chunk's logits and their copy
    adapted = max(3 * chunk - dtype_bytes(last * vocab, "float32") - chunk - upcast, 0) if head.frozen and head.grads else 0
    forward = (chunk, *([upcast] if upcast else []), *([adapted] if adapted else []), hidden, *([] if copy_kept else [hidden]))
    # backward runs chunk by chunk, last first (a chunk's nodes are all newer than the one before's): the last
    # chunk's loss gradients (two fp32 chunks) beside every log-softmax; then the head's moments (_linear_backward)
    loss = replace(step.loss, forward=forward, backward=(dtype_bytes(last * vocab, "float32"),) * 2)
    flight = _linear_backward(head, parts, vocab, made, hidden, tokens)
    kept_cast = list(kept)
    cast = _weight_cast(model, 1, tokens, bool(head.grads))
    for _ in range(len(parts) - 1 if cast else 0):   # every further chunk's own autocast copy of a frozen head's weight
        tensors[max(tensors) + 1] = cast
        kept_cast.append(max(tensors))
    rows = step.rows[:-1] + [replace(head, kept=kept_cast, backward_flight=flight)]
    out = replace(step, rows=rows, loss=loss, tensors=tensors)
    change = saved_bytes(out) - saved_bytes(step)
    if model.training.get("checkpointing") == "full" and change < 0:
        change = 0
    return replace(out, saved_rewritten=step.saved_rewritten + change)


def _linear_backward(head, parts: list, vocab: int, made: str, hidden: int, tokens: int) -> int:
    """The head's worst backward moment under LinearCrossEntropyLoss, beyond the tensors the rows keep and its own
    gradients: the chunks run backward last first, each through its cross-entropy (its log-softmax freed by its
    node), its cast and the projection's matmul; the log-softmax of the chunks still to come stays. Per chunk: at
    its log-softmax's backward two fp32 chunk gradients; at its matmul the logits' gradient in the head's dtype, the
    hidden rows' gradient, and each trained weight's gradient beside the sum of the earlier chunks' (autograd's input
    buffer sums them out of place: three of the largest at once). The chunks' hidden-row gradients wait for the
    tensor_split's backward; then the scatter into a zero (tokens, hidden) gradient, the summed rows' beside it."""
    lsm = [dtype_bytes(n * vocab, "float32") for n in parts]
    before = [0, *accumulate(lsm)]   # before[k]: the log-softmax of the chunks ahead of chunk k, still kept at it
    rows = [hidden * n // tokens for n in parts]
    grads, largest = sum(head.grads), max(head.grads, default=0)
    worst, waiting = 0, 0
    for k in range(len(parts) - 1, -1, -1):
        summed = grads if k < len(parts) - 1 else 0   # the weight gradients of the chunks already run, summed
        if summed:   # (the last chunk's log-softmax backward is the loss's moment: nothing summed yet)
            worst = max(worst, before[k + 1] + 2 * lsm[k] + summed + waiting)
        matmul = before[k] + dtype_bytes(parts[k] * vocab, made) + rows[k] + waiting + summed + grads
        adding = before[k] + rows[k] + waiting + summed + 2 * largest if summed else 0
        worst = max(worst, matmul, adding)
        waiting += rows[k]
    tail = grads + waiting + 2 * hidden
    return max(worst, tail) - grads

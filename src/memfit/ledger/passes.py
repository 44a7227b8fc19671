"""Forward passes a run makes beside its training step: the evaluation pass and a distillation teacher's forward.

- `training.eval_batch`: the run evaluates (transformers' Trainer `evaluate()` in its training loop, as Axolotl and
  LLaMA-Factory run it) with that many sequences per device: `prediction_step` runs the model with the labels under
  `torch.no_grad()` (nothing is kept for a backward), between two optimizer steps: the weights and the optimizer
  state are resident, the gradients only where the loop keeps them (`training.keep_gradients`; the Trainer's
  `model.zero_grad()` frees them otherwise). Its worst moment (`forward_only`) is the larger of each row's own tensors
  at once (its input, its output, what it would keep for backward, an intermediate) and the loss (the logits, the
  loss's copies of them, the hidden states the model's forward still holds). The run's peak is the larger of the
  training step's and this pass's.
- `training.teacher`: knowledge distillation (torchtune's recipes/knowledge_distillation_single_device.py, 0.6.1:
  `_setup_teacher_model` builds the teacher under `set_default_dtype(dtype)` and `eval()`s it; the optimizer never
  sees its parameters). The teacher's weights, in the recipe's dtype, are resident through the whole step, without
  gradients or optimizer state. `_loss_step` runs the student's forward, then `with torch.no_grad(): teacher_logits
  = self._teacher_model(...)` (the student's saved activations and logits alive beside the teacher's forward, its
  own transients as `forward_only` counts them), then the KD loss (ForwardKLLoss / ForwardKLWithChunkedOutputLoss,
  modules/loss/kd_losses.py: per chunk `F.softmax(teacher, dtype=float32)`, `torch.isinf(student)`,
  `F.log_softmax(student, dtype=float32)`, `masked_fill(teacher_prob * student_logprob, inf_mask, 0)`: the fp32
  probabilities, the fp32 log-probabilities and the bool mask are kept for backward, the product and its masked
  copy are in flight), then the class loss; `del teacher_logits` after both. With a chunked loss
  (`training.loss: {kind: chunked}`) the teacher's output is chunked too (`set_num_output_chunks`), so its KD
  loss runs a chunk at a time as the class loss does.

Measured: tests/ledger/test_passes.py (MemTracker around torchtune 0.6.1's KD step and around a transformers
model's training step then its evaluation pass).
"""

from __future__ import annotations

from dataclasses import field, replace

from memfit.diagnostics.records import record
from memfit.ledger.step import LIVE, Loss, Row, Step, _up
from memfit.recipe.costs import dtype_bytes

TEACHER = "teacher"  # the row of the teacher's weights and forward (with_teacher)

KEYS = {
    "eval_batch": {
        "title": "Evaluation batch",
        "description": "The run evaluates between optimizer steps with this many sequences per device (the Trainer's "
                       "per_device_eval_batch_size, Axolotl's eval_batch_size): a forward with the labels under "
                       "no_grad beside the weights, the optimizer state (and the gradients where keep_gradients). "
                       "The run's peak is the larger of the training step's and this pass's. A transformer on one "
                       "device; absent: the run does not evaluate, or not with more sequences than it trains on.",
        "type": "integer",
        "minimum": 1,
        "examples": [16],
    },
    "teacher": {
        "title": "Distillation teacher",
        "description": "Knowledge distillation (torchtune's knowledge_distillation recipes): a frozen teacher model "
                       "whose weights (in the precision's dtype, no gradients, no optimizer state) are resident "
                       "beside the student's, and whose forward runs under no_grad after the student's, making its "
                       "logits for the forward-KL loss (chunked as training.loss chunks). The teacher as the model "
                       "section writes a transformer: hf_config or transformer. A transformer student on one device.",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "hf_config": {"title": "Teacher's config.json", "description": "Path of the teacher's config.json, relative to this file (as model.hf_config).",
                          "$ref": "#/properties/model/properties/hf_config"},
            "transformer": {"title": "Teacher's transformer config", "description": "The keys of the teacher's config.json, inline (as model.transformer).",
                            "$ref": "#/properties/model/properties/transformer"},
        },
        "minProperties": 1,
        "maxProperties": 1,
    },
}


def _weights(step: Step) -> int:
    return sum(sum(r.params) + sum(r.frozen) for r in step.rows)


def _row_transient(row: Row, size: dict, batch: set, held: tuple = (), extra: int = 0) -> int:
    """The bytes of a row's own tensors at once when nothing is kept for backward: what it would keep, its input and
    output, and its intermediate (or its own worst transient, where the row knows it); with `held`, the ids of the
    step's tensors the forward's code still references there (each once), and `extra` bytes beside (a no-grad
    forward's, NoGrad)."""
    own = {t for t in row.kept if t not in batch}
    extra += sum(size[t] for t in set(held) if t not in batch and t not in own and t not in (row.input, row.output))
    moving = {t for t in (row.input, row.output if not row.view else None) if t is not None and t not in batch and t not in own}
    kept = sum(size[t] for t in own)
    # (a moment before its output exists, its kept tensors made: a mixture of experts' unsort, Row.forward_early)
    early = kept + row.forward_early if row.forward_early is not None else 0
    early += extra if row.forward_early is not None else 0
    if row.forward_flight is not None:
        return max(kept + row.forward_flight + extra, early)
    return max(kept + sum(size[t] for t in moving) + (0 if row.inner_kept else row.inner) + extra, early)


@record(slots=True)
class NoGrad:
    """What a no-grad forward holds beyond the rows' own tensors (models.hf_nograd.nograd_held): eager's masks at
    every row of the decoder, each layer's key/value cache copies (alive from that layer's attention on, through the
    loss), eager attention's extra scores at an attention row, each part's own worst moment's difference; and by
    id, the embeddings' output (bound to `inputs_embeds` all through the decoder's forward) and a layer's input (the
    model's loop holds it while the layer runs)."""

    masks: int = 0
    cache: list = field(default_factory=list)
    own_cache: list = field(default_factory=list)
    attention: int = 0
    parts: list = field(default_factory=list)   # per layer, {part: bytes its no-grad moment differs by}
    # per layer, {part: bytes of autocast's cached weight casts its rows keep}: alive from that part on to the loss
    casts: list = field(default_factory=list)
    head_cast: int = 0   # autocast's cached cast of a trained head's weight: alive from the head's call through the loss
    # an encoder-decoder's whole forward instead (models.hf_nograd_t5): its moments, each (where, ((bytes, count),
    # ...)) the live tensors beyond the weights and the batch; the pass's worst is the largest (the rows unused)
    moments: list | None = None


def _held_ids(step: Step) -> list:
    """Per row: the ids of the step's tensors a no-grad forward's code still references there (the embeddings'
    output; a layer's input, beside the layer's parts)."""
    embedded = next((r.output for r in step.rows if r.name == "embeddings"), None)
    first: dict = {}
    out = []
    for row in step.rows:
        # (the head and the loss run in the causal LM's forward, after the decoder's has returned: its locals freed)
        ids = [embedded] if embedded is not None and row.name != "head" else []
        parts = row.name.split(" ", 2)
        if len(parts) == 3 and parts[0] == "layer" and parts[1].isdigit():
            first.setdefault(parts[1], row.input)
            ids.append(first[parts[1]])
        out.append([t for t in ids if t is not None])
    return out


def _nograd_extra(row: Row, nograd: NoGrad | None) -> int:
    if nograd is None:
        return 0
    parts = row.name.split(" ", 2)
    if len(parts) < 3 or parts[0] != "layer" or not parts[1].isdigit():
        return (nograd.masks if row.name == "final norm" else 0) + (_casts(nograd) if row.name in ("final norm", "head") else 0)
    layer, part = int(parts[1]), parts[2]
    cache = sum(nograd.cache[: layer + 1]) - (nograd.own_cache[layer] if part == "attention" and layer < len(nograd.own_cache) else 0)
    delta = nograd.parts[layer].get(part, 0) if layer < len(nograd.parts) else 0
    return nograd.masks + max(0, cache) + (nograd.attention if part == "attention" else 0) + delta + _casts(nograd, layer, part)


def _casts(nograd: NoGrad, layer: int | None = None, part: str = "") -> int:
    """Autocast's cached weight casts alive at a layer's part beyond its own (the earlier layers' and parts'), or
    after the decoder (layer None): every layer's."""
    out = 0
    for n, casts in enumerate(nograd.casts):
        for name, nbytes in casts.items():
            if layer is None or n < layer:
                out += nbytes
            elif n == layer:
                if name == part:
                    break
                out += nbytes
    return out


def nograd_loss(nograd: NoGrad | None) -> int:
    """The bytes a no-grad forward holds at its loss beyond the step's tensors: every layer's cache (the model's
    output holds it; the decoder's masks and its `inputs_embeds` went with its forward's return)."""
    return 0 if nograd is None else sum(nograd.cache) + _casts(nograd) + nograd.head_cast


def _worst_moment(moments: list, granule: int = 0) -> tuple[int, str]:
    """The largest of a forward's moments (NoGrad.moments), each tensor rounded up to the allocator's `granule`."""
    best, at = 0, ""
    for where, sizes in moments:
        here = sum((_up(nbytes, granule) if granule else nbytes) * count for nbytes, count in sizes)
        if here > best:
            best, at = here, where
    return best, at


def forward_worst(step: Step, loss: bool = True, nograd: NoGrad | None = None, granule: int = 0) -> tuple[int, str]:
    """The largest transient bytes of the step's forward run under no_grad, and where: a row's own tensors at once
    (`_row_transient`), or the loss: the logits, the loss's copies and what it makes (its kept tensors, here only in
    flight), the hidden states the model's forward holds while its loss runs. With `nograd` (a transformer's
    evaluation pass), what the forward's code holds beside them (NoGrad); where it describes the whole forward's
    moments, their worst (`granule`: the allocator's rounding of each tensor, 0 for none)."""
    if nograd is not None and nograd.moments is not None:
        return _worst_moment(nograd.moments, granule)
    size, batch = step.tensors, set(step.batch)
    held = _held_ids(step) if nograd is not None else [()] * len(step.rows)
    best, at = 0, ""
    for row, ids in zip(step.rows, held):
        if not row.name:
            continue
        here = _row_transient(row, size, batch, ids, _nograd_extra(row, nograd))
        if here > best:
            best, at = here, row.name
    if loss and step.rows:
        head = step.rows[-1]
        hidden = size.get(head.input, 0) if head.input is not None and head.input not in batch else 0
        if nograd is not None and head.input not in head.kept and step.loss.held:
            hidden = 0   # (a head that does not save its input: the loss's held bytes count it already)
        here = sum(step.loss.forward) + sum(size[t] for t in step.loss_kept) + hidden
        if nograd is not None:
            here += nograd_loss(nograd)
        if here > best:
            best, at = here, "loss"
    return best, at


def evaluation_pass(step: Step, keep_gradients: bool, nograd: NoGrad | None = None, granule: int = 0) -> dict:
    """{"bytes", "live", "at"}: the evaluation pass's worst moment, `step` built at the evaluation batch (its rows'
    tensors; its weights and optimizer state are the training step's); `nograd`: what the model's no-grad forward
    holds beside them (NoGrad); `granule`: `step`'s rounding (ledger.step.rounded), applied to NoGrad.moments."""
    transient, at = forward_worst(step, nograd=nograd, granule=granule)
    batch = sum(step.tensors[t] for t in step.batch)
    grads = sum(sum(r.grads) for r in step.rows) if keep_gradients else 0
    live = dict(zip(LIVE, (_weights(step), grads, batch, sum(step.optimizer_state), transient, step.overhead)))
    return {"bytes": sum(live.values()), "live": live, "at": at}


def with_evaluation(peak: dict, evaluation: dict) -> dict:
    """The run's peak: the training step's, or the evaluation pass's where it is larger (phase "evaluation")."""
    phases = {**peak["phases"], "evaluation": evaluation}
    if evaluation["bytes"] <= peak["bytes"]:
        return {**peak, "phases": phases}
    return {"bytes": evaluation["bytes"], "phase": "evaluation", "live": dict(evaluation["live"]), "phases": phases}


def teacher_weights(step: Step) -> int:
    """The teacher's resident weights in a step with_teacher made (its row's frozen bytes; 0 without a teacher): the
    footprint counts them under `parameters`, as the peak does, every instant."""
    return sum(sum(r.frozen) for r in step.rows if r.name == TEACHER)


def with_teacher(step: Step, teacher: Step, b: int, s: int, vocab: int, chunks: int) -> Step:
    """The student's step with the teacher's: its weights resident (a row of frozen weights after the student's
    head, whose forward is the teacher's no_grad forward beside the student's logits), its logits and the KD loss's
    tensors beside the class loss. `teacher` is the teacher's own step at the same batch (its rows' weights and
    tensors); b, s, vocab the logits' shape; `chunks` the loss's chunks (1: the whole logits)."""
    if not step.rows or not teacher.rows:
        return step
    size = dict(step.tensors)
    student_logits = size.get(step.rows[-1].output, 0)
    teacher_forward, _ = forward_worst(teacher, loss=False)
    teacher_logits = teacher.tensors.get(teacher.rows[-1].output, 0)
    # the teacher's rows (weights) and its forward: at its worst row the student's logits are alive beside it
    row = Row(TEACHER, frozen=[_weights(teacher)], output_grad=False, grad_input=False, forward_flight=student_logits + teacher_forward)
    # the KD loss a chunk at a time (torch.chunk: ceil(s / chunks) tokens of each sequence per chunk); what it keeps
    # for backward over all the chunks: softmax(teacher) and log_softmax(student) in fp32, isinf(student) as bool
    chunk32 = dtype_bytes(b * -(-s // chunks) * vocab, "float32")
    kd_kept = [dtype_bytes(b * s * vocab, "float32"), dtype_bytes(b * s * vocab, "float32"), dtype_bytes(b * s * vocab, "bool")]
    ids = []
    for nbytes in kd_kept:
        ids.append(max(size, default=0) + 1)
        size[ids[-1]] = nbytes
    # in forward: the teacher's logits until both losses ran; the KD loss's product and its masked copy in flight
    # (a chunk each) where the class loss's own transients are smaller; in backward a third fp32 chunk (the product's
    # gradient through teacher_prob) beside the class loss's two
    rest = step.loss.forward[1:]
    loss = Loss(forward=(*step.loss.forward[:1], teacher_logits, max(sum(rest), 2 * chunk32)),
                backward=(*step.loss.backward, chunk32))
    return replace(step, rows=[*step.rows, row], tensors=size, loss=loss, loss_kept=[*step.loss_kept, *ids])

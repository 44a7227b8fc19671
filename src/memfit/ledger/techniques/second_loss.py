"""A loop that computes its own loss from the logits after the model computed one: LLaMA-Factory v1's SFT step
(hiyouga/LLaMA-Factory ff6d4d12e, src/llamafactory/v1/core/base_trainer.py `compute_log_probs`, lines 226-243, called
by trainers/sft_trainer.py `SFTTrainer.compute_loss`). Every tensor of the batch goes to the model, the labels among
them, so `outputs = model(**model_inputs)` computes transformers' causal-LM loss (its own `logits.float()` copy, freed
when the loss function returns, and a log-softmax its graph keeps while `outputs` is alive); then
`logits = outputs.logits.float()`, `shift_logits = logits[..., :-1, :].contiguous()` and
`F.cross_entropy(shift_logits, shift_labels, reduction="none")`, the loss the step backpropagates.

What it allocates, from that code and measured (MemTracker around a port of the step, tests/support/
llamafactory_v1_step.py, on a tiny Llama, full fine-tune in fp32 and LoRA on a bf16 base:
tests/ledger/test_second_loss.py):
- forward: at the trainer's log-softmax, beside the logits as the model returned them, the model's loss's
  log-softmax (fp32, every position: kept by the model's loss graph until compute_log_probs returns), the logits'
  fp32 copy (none where the logits are fp32 already: `.float()` returns them), the shifted contiguous copy (fp32,
  one position less per sequence; none for a micro-batch of one sequence, whose slice is contiguous already) and the
  trainer's own log-softmax (fp32, what the loss keeps for backward). What
  the model's forward held unsaved at its own loss is gone by then (its locals; a cache the outputs return stays).
- backward: the model's loss graph is gone with `outputs`; the trainer's loss backward is the one loss memfit
  prices (its log-softmax and the two gradients; then the slice's and the cast's gradients, no larger).
"""

from __future__ import annotations

from dataclasses import replace

from memfit.diagnostics import codes
from memfit.diagnostics.diagnostic import Problem
from memfit.ledger.techniques import outputs_dtype
from memfit.models import hf_encdec
from memfit.recipe.costs import dtype_bytes

NAME = "second_loss"

KEYS = {
    "second_loss": {
        "title": "A loss the loop computes from the logits after the model's own",
        "description": "log_probs: the training loop passes the labels to the model (transformers' causal-LM loss, "
                       "whose log-softmax the returned outputs keep alive) and then computes per-token log-probs "
                       "from the logits itself, the loss it backpropagates (LLaMA-Factory v1's compute_log_probs: "
                       "logits.float(), a shifted contiguous copy, cross_entropy with reduction none; the LLaMA-Factory "
                       "reader sets it for v1 files): at that log-softmax the logits, their fp32 copy (none where "
                       "they are fp32), the model's loss's log-softmax, the shifted copy and the new log-softmax are "
                       "alive at once. Default none: the model's loss is the step's only one.",
        "enum": ["none", "log_probs"],
        "default": "none",
    },
}


def applies(training: dict) -> bool:
    return training.get("second_loss") == "log_probs"


def problems(config, training: dict) -> list:
    model = getattr(config, "model", None)
    if model is None or not hasattr(model, "cfg"):
        return [Problem(("training", "second_loss"), codes.NEEDS_TRANSFORMER,
                        "training.second_loss: the loss is computed on a transformer's logits; declare the model as a "
                        "transformer (hf_config)")]
    if hf_encdec.is_stacked(model.cfg):
        return [Problem(("training", "second_loss"), codes.NOT_MODELLED,
                        "training.second_loss on an encoder-decoder: its logits' copies are not modelled (the figure "
                        "leaves them out: it is low)")]
    if training.get("fused_loss") or isinstance(training.get("loss"), dict):
        return [Problem(("training", "second_loss"), codes.SCHEMA,
                        "training.second_loss with training.fused_loss or training.loss: log-probs computed from the "
                        "whole logits need the model to return them; a fused or chunked loss never makes them")]
    return []


def rewrite(step, config, training: dict):
    model = getattr(config, "model", None)
    if model is None or not hasattr(model, "cfg") or not step.rows or step.rows[-1].name != "head":
        return step
    run, vocab = model.training, model.cfg.get("vocab_size")
    b, s = run.get("micro_batch"), run.get("seq_len")
    if not vocab or not b or not s or not step.loss.forward:
        return step
    logits = outputs_dtype.received(step, config, training)   # the logits as the loop receives them
    whole32 = dtype_bytes(b * s * vocab, "float32")
    # `logits[..., :-1, :].contiguous()`: one sequence's slice is contiguous already (a size-1 batch dimension's
    # stride does not count), so it copies only with more than one sequence
    shifted32 = dtype_bytes(b * (s - 1) * vocab, "float32") if b > 1 else 0
    upcast = whole32 if logits < whole32 else 0   # `outputs.logits.float()`: no copy of fp32 logits
    # at the trainer's log-softmax (Step.loss_kept, the loss's kept tensor, now this one): the logits, the model's
    # loss's log-softmax (fp32: ForCausalLMLoss upcasts) held by `outputs`, the fp32 copy, the shifted copy
    second = (logits, whole32, *([upcast] if upcast else []), *([shifted32] if shifted32 else []))
    first = step.loss.forward   # the model's own loss's moment, where it is the larger (it never is for a causal LM)
    forward = second if sum(second) >= sum(first) else first
    return replace(step, loss=replace(step.loss, forward=forward))

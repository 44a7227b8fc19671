"""Fused linear cross-entropy: the output projection and the loss in one autograd function, so the whole logits never
exist. Two implementations, each as its own code allocates (both are Triton kernels: memfit's measurement on the CPU
runs a pure-torch port of the same allocations, tests/support/fused_loss_reference.py, cited line by line there):

- `liger`: Liger-Kernel's LigerFusedLinearCrossEntropyFunction (src/liger_kernel/ops/fused_linear_cross_entropy.py,
  commit 00eba634; switched on by Axolotl's `liger_fused_linear_cross_entropy`, LLaMA-Factory's `enable_liger_kernel`
  for the pt and sft stages; transformers/model/loss_utils.py LigerForCausalLMLoss hands it the final hidden states,
  (b*s, h), and the labels padded by one and shifted). Its forward computes the gradients as well:
  `grad_input = torch.zeros_like(_input)` (the hidden states' gradient) and, when the projection is trained,
  `grad_weight = torch.zeros_like(weight)`, both saved for backward (`ctx.save_for_backward(grad_input.detach(),
  grad_weight.detach(), ...)`) and handed to autograd as the gradients by its backward; the hidden states themselves
  are not saved. The logits live a chunk of rows at a time: `inc_factor = cdiv(V, H)`, `chunk_size =
  min(next_power_of_2(cdiv(BT, inc_factor)), BT)` (about BT x H elements: the logits of a chunk are no bigger than the
  hidden states), in one buffer of the input's dtype (`logits_storage = torch.empty((chunk_size, V))`, CUDA's mm-out
  path); the cross-entropy kernel writes the chunk's gradient over its logits; the chunk's input and weight gradients
  are written in place (`torch.mm(..., out=grad_input[...])`, `torch.addmm(grad_weight, ..., out=grad_weight)` for a
  16-bit weight on sm80+), except an fp32 weight's gradient, summed through a weight-sized fp32 product per chunk
  (`grad_weight += torch.mm(grad_logits_chunk.t(), _input_chunk).float()`: that branch's own comment says so).
  Beside them: the fp32 per-row loss (`loss_1d`), the ignore mask, and LigerForCausalLMLoss' padded and shifted
  int64 labels.
- `cut_cross_entropy`: Apple's Cut Cross-Entropy (apple/ml-cross-entropy, cut_cross_entropy/cce.py
  LinearCrossEntropyFunction, as Axolotl's `cut_cross_entropy` plugin calls it: transformers/utils.py apply_lce,
  `shift=True`): the forward computes each row's log-sum-exp in fp32 (cce_lse_forward.py: `lse =
  e.new_full((B,), -inf, dtype=torch.float32)`) and the per-vocabulary logit average (`filter_eps="auto"`:
  `logit_avg`, fp32 (V,)), and saves the hidden states, the weight, lse, the targets, the valid rows (utils.py
  _build_flat_valids: int32, one per row with a target) and logit_avg; no logits. Its backward argsorts logit_avg
  (int64, then int32) and allocates the hidden states' gradient and the weight's (cce_backward.py: `de =
  torch.zeros_like(e)`, `dc = torch.zeros_like(c) if c.requires_grad`), in their own dtypes. The backward asserts a
  16-bit hidden state and weight ("Backwards requires embeddings to be bf16 or fp16"): memfit refuses it with fp32
  weights.
"""

from __future__ import annotations

from dataclasses import replace

from memfit.diagnostics import codes
from memfit.diagnostics.diagnostic import Problem
from memfit.recipe.costs import dtype_bytes

NAME = "fused_loss"

KINDS = ("liger", "cut_cross_entropy")

KEYS = {
    "fused_loss": {
        "title": "Fused linear cross-entropy",
        "description": "The output projection and the cross-entropy run as one function that never makes the whole "
                       "logits. liger: Liger-Kernel's fused linear cross-entropy (Axolotl liger_fused_linear_cross_entropy, "
                       "LLaMA-Factory enable_liger_kernel): the logits a chunk of about batch x sequence x hidden "
                       "elements at a time, the hidden states' and the output weight's gradients made in the forward "
                       "and kept until the backward. cut_cross_entropy: Apple's Cut Cross-Entropy (Axolotl "
                       "cut_cross_entropy): no logits at all, an fp32 log-sum-exp per token kept; 16-bit weights only. "
                       "Not with training.loss (a chunked loss). Absent: transformers' loss over the whole logits.",
        "enum": list(KINDS),
    },
}


def applies(training: dict) -> bool:
    return training.get("fused_loss") in KINDS


def _precision(config) -> str:
    model = getattr(config, "model", None)
    return (getattr(model, "recipe", None) or {}).get("precision", "32-true")


def problems(config, training: dict) -> list:
    model = getattr(config, "model", None)
    if model is None or not hasattr(model, "cfg"):
        return [Problem(("training", "fused_loss"), codes.NEEDS_TRANSFORMER,
                        "training.fused_loss: a fused linear cross-entropy replaces a transformer's output projection "
                        "and loss; declare the model as a transformer (hf_config)")]
    out = []
    if isinstance(training.get("loss"), dict):
        out.append(Problem(("training", "fused_loss"), codes.SCHEMA,
                           "training.fused_loss and training.loss both replace the loss over the logits; keep one"))
    if training["fused_loss"] == "cut_cross_entropy" and _precision(config) in ("32-true", "bf16-mixed", "16-mixed"):
        out.append(Problem(("training", "fused_loss"), codes.SCHEMA,
                           f"Cut Cross-Entropy's backward needs 16-bit hidden states and output weight "
                           f"(cut_cross_entropy/cce_backward.py: \"Backwards requires embeddings to be bf16 or fp16\"); "
                           f"precision {_precision(config)} keeps them in fp32: use bf16-true or 16-true"))
    return out


def _next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else 1


def liger_chunk(rows: int, hidden: int, vocab: int) -> int:
    """Liger's chunk of rows (fused_linear_cross_entropy_forward, chunk_mem_const 1)."""
    inc_factor = -(-vocab // hidden)
    return min(_next_power_of_2(-(-rows // inc_factor)), rows)


def rewrite(step, config, training: dict):
    model = getattr(config, "model", None)
    if model is None or not hasattr(model, "cfg") or not step.rows or step.rows[-1].name != "head":
        return step
    run, cfg = model.training, model.cfg
    b, s = run["micro_batch"], run["seq_len"]
    head = step.rows[-1]
    tensors = dict(step.tensors)
    rows_n = b * s
    hidden = tensors.get(head.input, 0)
    logits = tensors.get(head.output, 0)
    from memfit.models.families import FAMILIES as SPECS

    spec = SPECS.get(cfg.get("model_type"))
    h = cfg.get(spec.hidden_key if spec is not None else "hidden_size")
    vocab = cfg.get("vocab_size")
    if not rows_n or not hidden or not logits or not h or not vocab:
        return step
    weight_grad = sum(head.grads)
    tensors[head.output] = 0   # the whole logits never exist
    labels64 = dtype_bytes(rows_n, "int64")
    if training["fused_loss"] == "liger":
        chunk = liger_chunk(rows_n, h, vocab)
        fresh = max(tensors) + 1
        kept = [fresh]
        tensors[fresh] = hidden                        # grad_input: the hidden states' gradient, in their dtype
        if weight_grad:
            tensors[fresh + 1] = weight_grad           # grad_weight: the output weight's, in its dtype
            kept.append(fresh + 1)
        forward = (hidden,                               # the hidden states, an input (not saved)
                   logits * chunk // rows_n,                  # logits_storage: one chunk's logits, then its gradient
                   dtype_bytes(rows_n, "float32"),            # loss_1d
                   dtype_bytes(rows_n, "bool"),               # target_mask
                   dtype_bytes(b * (s + 1), "int64"), labels64)  # the padded labels and the shifted copy
        if weight_grad == dtype_bytes(h * vocab, "float32"):
            # an fp32 weight: the legacy branch's weight-sized product per chunk
            forward = (*forward, weight_grad)
        loss = replace(step.loss, forward=forward, backward=())
        # the head keeps nothing (the hidden states are not saved); its backward hands over what the forward made
        rows = step.rows[:-1] + [replace(head, kept=[], kept_ops=[], backward_flight=None)]
        return replace(step, rows=rows, loss=loss, tensors=tensors, loss_kept=kept)
    # cut_cross_entropy
    valid = b * max(s - 1, 0)
    fresh = max(tensors) + 1
    tensors[fresh] = dtype_bytes(valid, "float32")       # lse
    tensors[fresh + 1] = dtype_bytes(valid, "int32")     # valids
    tensors[fresh + 2] = dtype_bytes(vocab, "float32")   # logit_avg
    kept = [fresh, fresh + 1, fresh + 2]
    # forward: _build_flat_valids' mask, nonzero (int64, two columns) and its int32 copy, beside the lse
    forward = (dtype_bytes(valid, "bool"), dtype_bytes(2 * valid, "int64"), dtype_bytes(2 * valid, "int32"),
               dtype_bytes(valid, "float32"))            # neg_dot (then the per-token loss, in place)
    # backward: argsort(logit_avg) (int64, then int32), then de and dc beside the int32 ordering
    order = max(dtype_bytes(vocab, "int64") + dtype_bytes(vocab, "int32"),
                dtype_bytes(vocab, "int32") + hidden + weight_grad)
    loss = replace(step.loss, forward=forward, backward=(order,))
    rows = step.rows[:-1] + [replace(head, backward_flight=None)]
    return replace(step, rows=rows, loss=loss, tensors=tensors, loss_kept=kept)

"""A wrapper that converts the model's outputs to fp32 after the forward: Lightning Fabric's `_FabricModule.forward`
(lightning/fabric/wrappers.py 51ad6bb8:145 `output = precision.convert_output(output)`; HalfPrecision, MixedPrecision,
BitsandbytesPrecision and FSDPPrecision all `apply_to_collection(data, function=_convert_fp_tensor, dtype=Tensor,
dst_type=torch.get_default_dtype())`, plugins/precision/half.py 51ad6bb8:61-62, bitsandbytes.py :155-156;
`_convert_fp_tensor` is `tensor.to(dst_type)`, utils.py :20-21; the same lines at 71aed751, the Lightning that Lit-GPT
8641822 pins: wrappers.py :123). Every LitGPT fine-tuning run goes through it (`fabric.setup_module(model)`), so the
logits LitGPT's loss reads are fp32 where the model made them in 16 bits.

What it allocates, from that code and measured (tests/ledger/test_outputs_dtype.py: LitGPT's step, tests/support/
litgpt_port.py, through Fabric's conversion; the real Fabric gave the same bytes, tests/support/litgpt_fabric_measure.py):
- forward: each output's fp32 copy, one after another while every 16-bit output is alive (apply_to_collection builds
  the new list before the old one is dropped): at the last one the whole logits in their dtype and in fp32 at once,
  beside what the loop still holds of the previous micro-batch; then the 16-bit logits are freed (`.to()`'s backward,
  ToCopyBackward, saves no tensor, and the head's matmul keeps its input, not its output);
- the loss runs on the fp32 logits: no upcast copy of its own (transformers' `logits.float()` returns them as they
  are), its log-softmax and its gradients in fp32 (LitGPT's chunked_cross_entropy: fp32 chunks), and the loop holds
  fp32 logits (training.previous_outputs_held);
- backward: the casts' backward turns each fp32 gradient back into the logits' dtype after the loss's backward; no new
  worst moment: at the loss's backward the logits-sized fp32 log-softmax and two gradients are alive, at the casts the
  logits-sized fp32 gradient with at most a chunk more (LitGPT's `logits[-1][..., :-1, :]` slice's backward, a chunk
  of zeros) and a 16-bit chunk.
An output already in fp32 is returned as it is (`.to()` of the same dtype copies nothing): no change.
"""

from __future__ import annotations

from dataclasses import replace

from memfit.diagnostics import codes
from memfit.diagnostics.diagnostic import Problem
from memfit.models import hf_activations as acts, hf_encdec
from memfit.recipe.costs import dtype_bytes, dtype_elements

NAME = "outputs_dtype"

KEYS = {
    "outputs_dtype": {
        "title": "The dtype the training loop receives the model's outputs in",
        "description": "float32: a wrapper converts the model's floating outputs to fp32 after its forward (Lightning "
                       "Fabric's _FabricModule: precision.convert_output, to torch.get_default_dtype(); every LitGPT "
                       "run): the whole logits in their dtype and in fp32 at once at the conversion, the loss on fp32 "
                       "logits (its log-softmax and gradients fp32, no upcast copy of its own), the logits a loop "
                       "holds (training.previous_outputs_held) fp32. No change where the logits are fp32 already or "
                       "under training.fused_loss (no logits). Default model: the outputs as the model made them.",
        "enum": ["model", "float32"],
        "default": "model",
    },
}


def applies(training: dict) -> bool:
    return training.get("outputs_dtype") == "float32"


def problems(config, training: dict) -> list:
    model = getattr(config, "model", None)
    if model is None or not hasattr(model, "cfg"):
        return [Problem(("training", "outputs_dtype"), codes.NEEDS_TRANSFORMER,
                        "training.outputs_dtype: the outputs converted are a transformer's logits; declare the model as "
                        "a transformer (hf_config)")]
    if hf_encdec.is_stacked(model.cfg):
        return [Problem(("training", "outputs_dtype"), codes.NOT_MODELLED,
                        "training.outputs_dtype on an encoder-decoder: the logits' fp32 copy and its loss on them are "
                        "not modelled (the figure leaves them out: it is low)")]
    elements = acts.layer_sizes(model.cfg, 1, 1)["V"]   # a token's logits
    if dtype_bytes(elements, logits_dtype(model)) > dtype_bytes(elements, "float32"):
        return [Problem(("training", "outputs_dtype"), codes.NOT_MODELLED,
                        f"training.outputs_dtype float32 with {logits_dtype(model)} logits: a conversion down to fp32 "
                        "is not modelled")]
    return []


def logits_dtype(model) -> str:
    """The dtype the model's head makes the logits in (the builder's: the recipe's `lin` role)."""
    precision = (getattr(model, "recipe", None) or {}).get("precision", "32-true")
    return acts.role_dtypes(precision, model.dtypes)["lin"]


def received(step, config, training: dict) -> int:
    """Bytes of the last row's output as the training loop receives it: its fp32 copy's where a wrapper converts
    logits narrower than fp32 (training.outputs_dtype float32), else its own."""
    logits = step.tensors.get(step.rows[-1].output, 0) if step.rows and step.rows[-1].output is not None else 0
    model = getattr(config, "model", None)
    if not applies(training) or model is None or not hasattr(model, "cfg") or training.get("fused_loss"):
        return logits
    if hf_encdec.is_stacked(model.cfg):   # not modelled (problems): the step as the model makes it
        return logits
    return max(logits, dtype_bytes(dtype_elements(logits, logits_dtype(model)), "float32"))


def rewrite(step, config, training: dict):
    if not step.rows or step.rows[-1].output is None:
        return step
    head = step.rows[-1]
    size = step.tensors
    logits, logits32 = size[head.output], received(step, config, training)
    if logits32 == logits:   # not converted (fp32 already, or not modelled: an encoder-decoder's)
        return step
    # the conversion's moment, after the head's forward: its output (and its input, where nothing keeps it) in the
    # model's dtype beside the fp32 copy; the head's own worst moment where larger (a 4-bit head's dequantized weight)
    saved = {t for row in step.rows for t in row.kept} | set(step.batch)
    moving = sum(size[t] for t in (head.input, head.output) if t is not None and t not in saved)
    own = head.forward_flight if head.forward_flight is not None else moving + (0 if head.inner_kept else head.inner)
    rows = step.rows[:-1] + [replace(head, forward_flight=max(own, moving + logits32))]
    loss, tensors = step.loss, size
    if not (isinstance(training.get("loss"), dict) and training["loss"].get("kind")):
        # the default loss (ledger/training._loss) reads the fp32 logits: no copy of its own (Loss.upcast), beside
        # what the model's forward holds unsaved (Loss.held); one that computed on the logits as they are (a 16-bit
        # log-softmax) computes in fp32 now: its gradients and what it keeps (Step.loss_kept) fp32
        loss = replace(step.loss, forward=(logits32, *step.loss.held), upcast=0)
        if not step.loss.upcast:
            dtype = logits_dtype(config.model)
            loss = replace(loss, backward=(logits32, logits32))
            tensors = {**size, **{t: dtype_bytes(dtype_elements(size[t], dtype), "float32") for t in step.loss_kept}}
    # (a chunked loss priced itself on the fp32 logits: ledger/techniques/chunked_loss.py reads `received`)
    kept_more = sum(tensors[t] - size[t] for t in set(step.loss_kept))  # the footprint's saved activations too
    return replace(step, rows=rows, loss=loss, tensors=tensors, saved_rewritten=step.saved_rewritten + kept_more)

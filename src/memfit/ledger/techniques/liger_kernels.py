"""Liger-Kernel's non-loss kernels (training.liger_kernels): its RMSNorm and SwiGLU autograd functions in place of a
transformers model's own modules, as Liger's monkey patches swap them (transformers/monkey_patch.py,
apply_liger_kernel_to_llama and its kin: `modeling_llama.LlamaRMSNorm = LigerRMSNorm`, `modeling_llama.LlamaMLP =
LigerSwiGLUMLP`; Axolotl's liger_rms_norm / liger_glu_activation, LLaMA-Factory's enable_liger_kernel, the Trainer's
use_liger_kernel). Their kernels are Triton; what each function saves and allocates is read off liger-kernel 0.6.4
(src/liger_kernel/ops/rms_norm.py, swiglu.py) and measured through a pure-torch port of the same allocations
(tests/support/liger_reference.py, cited line by line there; tests/ledger/test_liger_kernels.py):

- rms_norm: LigerRMSNormFunction saves the input itself, the weight and an fp32 1/rms per row (`RSTD`), where the
  eager RMSNorm keeps an fp32 copy of its input, the fp32 1/rms and the normalized tensor cast back (the weight's
  gradient's factor); its backward writes the input's gradient over the output's (`in_place=True`) and sums the
  weight's in an fp32 (sm_count, hidden) buffer;
- swiglu: LigerSiLUMulFunction saves gate's and up's outputs and recomputes silu in its backward, where the eager MLP
  keeps gate's output, silu(gate) and up's output; its backward stores the two gradients over the saved tensors.

The per-op rules live with the model's (models/hf_act_ops._norm, hf_act_layers._mlp: the `rms_liger` and
`swiglu_liger` conditions, read from the model's config, where models/hf_derive puts this key): the program, the
footprint's saved activations and every rank's program are built from them, so this rewrite has nothing left to
change. A family whose norm or MLP is not the one Liger's patch replaces gets a note, its figure the eager modules';
rope and layer_norm are accepted and not priced (a note: the figures keep the eager ops').
"""

from __future__ import annotations

from memfit.diagnostics import codes
from memfit.diagnostics.diagnostic import Problem

NAME = "liger_kernels"

KINDS = ("rms_norm", "swiglu", "rope", "layer_norm")

KEYS = {
    "liger_kernels": {
        "title": "Liger-Kernel's non-loss kernels",
        "description": "The Liger-Kernel functions that replace a transformers model's own modules (Axolotl "
                       "liger_rms_norm, liger_glu_activation, liger_rope, liger_layer_norm; LLaMA-Factory "
                       "enable_liger_kernel; the Trainer's use_liger_kernel). rms_norm: LigerRMSNorm keeps its input "
                       "and an fp32 1/rms per token instead of an fp32 copy of the input and the normalized tensor. "
                       "swiglu: LigerSwiGLUMLP keeps gate's and up's outputs, not silu(gate). rope and layer_norm are "
                       "accepted and not priced (a note). Its fused linear cross-entropy is training.fused_loss: "
                       "liger. Absent: the model's own modules.",
        "type": "array",
        "items": {"enum": list(KINDS)},
    },
}


def applies(training: dict) -> bool:
    return isinstance(training.get("liger_kernels"), list) and bool(training["liger_kernels"])


def problems(config, training: dict) -> list:
    model = getattr(config, "model", None)
    if model is None or not hasattr(model, "cfg"):
        return [Problem(("training", "liger_kernels"), codes.NEEDS_TRANSFORMER,
                        "training.liger_kernels: Liger's kernels replace a transformer's norms and MLPs; declare the "
                        "model as a transformer (hf_config)")]
    return []


def rewrite(step, config, training: dict):
    """The model's rows already keep what Liger's functions keep (models/hf_derive read this key into the model's
    config): the step as it is."""
    return step

"""What autograd saves for backward in one training step of a transformers model: closed form per layer kind.

Each block lists the distinct storages autograd keeps (each once, under the first op that keeps it) with its shape
and dtype; `saved()` evaluates the symbolic tables (models/hf_act_*.py) for one config. Nothing is per element: a
70B config costs the same as a tiny one. The rules were read off transformers 5.24, torch 2.13 and peft 0.21 and are checked against
a real step on CPU (tests/models/test_transformers_activations.py; docs/transformer-activations.md prints the tables).

A table row (`K`) says: this op keeps this tensor, of this symbolic shape, in this dtype *role*, under this static
condition (`when`: attention kernel, dropout on, cache, autocast...), provided one of the listed gradient flags is
set (`needs`: autograd only keeps what some gradient needs; a frozen weight's op keeps no input for it). A row that
names a `source` is that source's storage when both resolve to the same dtype (no cast happened), a copy otherwise.

Dtype roles, resolved per precision recipe by `_roles`:
  act    the model's dtype: the residual stream, norms' in/outputs (fp32 under *-mixed: autocast leaves them)
  lin    what a matmul produces (the low dtype under *-true and *-mixed)
  soft   eager attention's softmax result where the model does not upcast it (fp32 under autocast, where GPT-2's
         fp32 causal mask promotes the scores; BERT's unmasked softmax stays low: it uses `lin`)
  low    a copy autocast makes for a matmul (the low dtype under *-mixed; act otherwise)
  ada    a LoRA adapter's dtype (fp32: peft upcasts adapters on a 16-bit base); ada_low: what the adapter's matmul
         keeps (the autocast copy under *-mixed, else ada)
  f32, i64, i32, bool   fixed: statistics and upcasts, indices, offsets, dropout masks (1 byte, as CUDA keeps them)
"""

from __future__ import annotations

from memfit.models import hf_encdec
from memfit.models.hf_act_ops import (
    ACTIVATIONS, ATTENTIONS, Block, CHECKPOINTING, Conditions, ActivationRules, K, Kept, LOW, PRECISIONS, ROLE, TRUE_DTYPE,
)
from memfit.models.hf_act_families import (
    DEEPSEEK_NAMES, DEFAULT_ACT, FAMILIES, LLAMA, LLAMA4_NAMES, LLAMA_NAMES, MOE, QWEN2_MOE_NAMES, SUPPORTED,
)
from memfit.models.hf_act_layers import (
    BLOCK_NAMES, classifier, CLASSIFIER_LOSS_ROWS, count_layers, _embedding_rows, _head_rows, layer_kinds,
    layer_rows, LOSS_ROWS,
)
from memfit.models.hf_act_eval import (
    _act, _boundary, check, dropout_on, _grads, layer_conditions, layer_sizes, _parallel, _quantized_base, _resolve,
    role_dtypes, _roles, routed_rows, ROUTINGS, _shape, _t5_sizes, trainable_flags,
)
from memfit.models.hf_act_t5 import (
    LOSS_ROWS_T5_NAMES, _t5_conditions, _t5_flags, t5_cache_copies, t5_layer_rows, t5_loss, T5_NAMES, T5_ROLES,
    t5_score_kernels,
)
from memfit.models.hf_act_saved import (
    BUCKETS, CLIP_VISION, ENCODER_INPUTS, _evaluate, lora_key, nbytes, peak_saved, qlora_precision, recomputed,
    saved, SHARED_BIAS, stacked_peak_saved, stacked_saved, total, batch_pixel_bytes, t5_later_kept, views_the_pixels,
)


# What the rest of memfit imports from here. The rules live in the modules above: hf_act_ops (the op rules and
# `ActivationRules`), hf_act_families (FAMILIES), hf_act_layers (a layer's rows per family), hf_act_eval (sizes, conditions,
# dtype roles, resolving rows), hf_act_t5 (encoder-decoder stacks), hf_act_saved (saved, peak_saved, recomputed).
__all__ = [
    "ACTIVATIONS", "ATTENTIONS", "Block", "CHECKPOINTING", "Conditions", "ActivationRules", "K", "Kept", "LOW", "PRECISIONS",
    "ROLE", "TRUE_DTYPE", "DEEPSEEK_NAMES", "DEFAULT_ACT", "FAMILIES", "LLAMA", "LLAMA4_NAMES", "LLAMA_NAMES",
    "MOE", "QWEN2_MOE_NAMES", "SUPPORTED", "BLOCK_NAMES", "classifier", "CLASSIFIER_LOSS_ROWS", "count_layers",
    "_embedding_rows", "_head_rows", "layer_kinds", "layer_rows", "LOSS_ROWS", "_act", "_boundary", "check",
    "dropout_on", "layer_conditions", "layer_sizes", "_parallel", "_quantized_base", "_resolve", "role_dtypes",
    "routed_rows", "ROUTINGS", "_shape", "trainable_flags", "LOSS_ROWS_T5_NAMES", "t5_layer_rows", "T5_NAMES",
    "T5_ROLES", "t5_score_kernels", "t5_cache_copies", "t5_loss", "t5_later_kept", "batch_pixel_bytes", "views_the_pixels", "BUCKETS", "CLIP_VISION", "ENCODER_INPUTS", "_evaluate", "lora_key", "nbytes",
    "peak_saved", "qlora_precision", "recomputed", "saved", "SHARED_BIAS", "stacked_peak_saved", "stacked_saved",
    "total", "SHORT", "TABLE_PRECISIONS", "layer_table", "markdown_table",
]


# ----------------------------------------------------------------------------------------- documentation

SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int64": "i64", "int32": "i32", "bool": "bool"}
TABLE_PRECISIONS = ("32-true", "bf16-true", "bf16-mixed")


def layer_table(cfg: dict) -> list:
    """One layer's rows for the docs, full training: (op, keeps, shape, eager, sdpa), where the eager and sdpa cells
    give the dtype kept under 32-true · bf16-true · bf16-mixed ("—": not kept; one shared storage is listed once)."""
    fam = FAMILIES[cfg["model_type"]]
    w = trainable_flags(fam, None)
    if hf_encdec.is_stacked(cfg):  # the decoder's block (self-attention, cross-attention, feed-forward)
        rows = t5_layer_rows(cfg, True)
        flags = {**w, **_t5_flags(w, True, True, True)}
        conditions = lambda a, p: _t5_conditions(cfg, a, "none", 2, p, None)  # noqa: E731
        sizes = _t5_sizes(cfg, 2, 16, None)
    else:
        rows = layer_rows(cfg["model_type"], _act(cfg), _parallel(cfg))
        flags = {**w, **_grads(fam, w, True, _parallel(cfg))}
        conditions = lambda a, p: layer_conditions(cfg, fam, a, "none", 2, p, None)  # noqa: E731
        sizes = layer_sizes(cfg, 2, 16)
    symbolic = {r.label: "(" + ", ".join(str(x) for x in r.shape) + ")" for r in rows}
    seen: dict = {}
    for attention in ("eager", "sdpa"):
        for precision in TABLE_PRECISIONS:
            cond = conditions(attention, precision)
            for k in _resolve(rows, cond, _roles(precision, None, "float32"), sizes, flags):
                seen.setdefault(k.label, {})[(attention, precision)] = SHORT[k.dtype]
    out = []
    for r in rows:
        if r.label not in seen or any(o[0] == r.op and o[1] == r.what for o in out):
            continue
        cells = [" · ".join(seen[r.label].get((a, p), "—") for p in TABLE_PRECISIONS) for a in ("eager", "sdpa")]
        out.append((r.op, r.what, symbolic[r.label], *cells))
    return out


def markdown_table(cfg: dict) -> str:
    lines = ["| op | keeps | shape | eager (32-true · bf16-true · bf16-mixed) | sdpa |", "|---|---|---|---|---|"]
    lines += [f"| {op} | {what} | {shape} | {e} | {s} |" for op, what, shape, e, s in layer_table(cfg)]
    return "\n".join(lines)

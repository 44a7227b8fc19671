"""LitGPT's attention: one fused qkv projection, and LoRA on it as LoRAQKVLinear.

memfit's transformer rows are transformers' modules. LitGPT's GPT (Lightning-AI/litgpt `litgpt/model.py`, before
2024-03 `lit_gpt/model.py`) and its LoRA (`litgpt/lora.py`, `lit_gpt/lora.py`) keep more in each layer's attention,
by their own code (cited at 8641822, Oct 2023, and 3ba6da40, Mar 2024; the lines are the same code at both):
- `CausalSelfAttention.forward` (model.py 8641822:196-215, 3ba6da40:197-217): `qkv = self.attn(x)` is viewed as
  (B, T, n_query_groups, q_per_kv + 2, head_size), permuted and split into q, k, v. With as many query groups as heads
  (multi-head attention) `k.expand` is skipped and `v.reshape(B, -1, T, hs)` is a view: the attention kernel keeps
  `v`, and with it the whole fused qkv storage, where transformers' separate v projection keeps v alone (T x kv width
  more per layer: q and k widths). With fewer groups (grouped-query) k and v are expanded to every head and reshaped
  into copies: the kernel keeps k (roped) and v at the query width, where transformers' sdpa keeps them at the
  key/value width (2 x T x (q - kv) more). One group (multi-query) is expanded too at 3ba6da40 (`n_query_groups !=
  n_head`); at 8641822 (`n_query_groups != 1`) it was not, and v was a view as with many heads (no such row here).
- `LoRAQKVLinear.zero_pad` (lora.py 8641822:290-296, 3ba6da40:335-341), where LoRA adapts some but not all of q, k and
  v (`lora_query`, `lora_key`, `lora_value`): `result.index_copy(1, torch.tensor(self.lora_ind), x.reshape(...))`
  keeps its source for backward (derivatives.yaml `index_copy`: `source: grad.index_select(dim, index)
  .expand_as(source)`), the adapter's output for the adapted parts (T x their widths, in the adapters' dtype), and
  its int64 index (their widths, once per layer). Adapting all three returns the adapter's output unpadded.
- `LoRAQKVLinear.forward` (lora.py 8641822:375, 3ba6da40:422): `after_A = F.linear(self.lora_dropout(x), self.lora_A)`,
  one dropout and one matmul for every adapted part (lora_A stacks their r rows): with lora dropout one mask and one
  dropped-out input are kept for the fused qkv, where transformers' (peft's) separate q, k and v projections keep one
  each. The second and third parts' are taken off (lora_A's output, what lora_B's conv1d keeps, is the same bytes
  either way).
Measured with saved_tensors_hooks on LitGPT's own code at both commits (tests/ledger/test_litgpt_qkv.py).
- At 26857050 (PyPI 0.5.13) a model with `sliding_window_size` (Phi-3) builds `sliding_window_mask`, (T, T) in q's
  dtype viewed (1, 1, T, T), in each layer's `CausalSelfAttention.forward` and passes it to SDPA as attn_mask, which
  keeps it for backward: `window_mask: true`, one s x s tensor a layer (tests/ledger/test_litgpt_head.py's Phi-3 cases).
"""

from __future__ import annotations

from dataclasses import replace

from memfit.diagnostics import codes
from memfit.diagnostics.diagnostic import Problem
from memfit.ledger.techniques.quantized_saves_input import _dims
from memfit.models import hf_activations as acts
from memfit.models.families import FAMILIES as SPECS
from memfit.recipe.costs import dtype_bytes

NAME = "litgpt_qkv"

PARTS = ("query", "key", "value")

KEYS = {
    "litgpt_qkv": {
        "title": "LitGPT's fused-qkv attention and LoRAQKVLinear",
        "description": "The model runs LitGPT's attention (litgpt/model.py CausalSelfAttention: one fused qkv "
                       "projection, viewed and split): with as many query groups as heads the attention keeps the "
                       "whole qkv output (v is a view of it), with fewer it keeps k and v expanded to every head. "
                       "LoRA on the fused qkv is LoRAQKVLinear: where it adapts some but not all of query, key and "
                       "value its zero_pad keeps the adapter's output and an int64 index. true: the adapted parts are "
                       "lora.target_modules' q, k and v projections; {lora: [query, value]}: LitGPT's lora_query, "
                       "lora_key, lora_value as the run sets them (a family whose own projection is fused names no "
                       "parts). Default: transformers' attention.",
        "anyOf": [
            {"type": "boolean"},
            {"type": "object", "additionalProperties": False,
             "properties": {"lora": {"title": "LoRA's parts of the fused qkv",
                                     "description": "The parts LoRAQKVLinear adapts (LitGPT's lora_query, lora_key, "
                                                    "lora_value that are true).",
                                     "type": "array", "items": {"enum": list(PARTS)}},
                            "window_mask": {"title": "LitGPT's sliding-window mask",
                                            "description": "true: the model sets sliding_window_size (LitGPT's "
                                                           "Phi-3 from 26857050 on), so each layer builds a (1, 1, s, s) "
                                                           "mask in the compute dtype and passes it to SDPA, which "
                                                           "keeps it for backward. Default false.",
                                            "type": "boolean"}}},
        ],
    },
}


def applies(training: dict) -> bool:
    value = training.get("litgpt_qkv")
    return value is True or isinstance(value, dict)


def _transformer(config) -> bool:
    model = getattr(config, "model", None)
    return model is not None and hasattr(model, "cfg")


def problems(config, training: dict) -> list:
    if not _transformer(config):
        return [Problem(("training", "litgpt_qkv"), codes.IGNORED_KEY,
                        "training.litgpt_qkv: LitGPT's attention is priced on a transformer (hf_config); this model "
                        "has none", severity=codes.WARNING)]
    return []




def _adapted(config, value) -> tuple:
    """The parts LoRAQKVLinear adapts: the key's own list, else lora.target_modules' q, k and v projections."""
    recipe = dict(getattr(config.model, "recipe", None) or {})
    lora = recipe.get("lora")
    if not lora:
        return ()
    if isinstance(value, dict) and "lora" in value:
        return tuple(p for p in PARTS if p in value["lora"])
    fam = acts.FAMILIES.get(config.model.cfg.get("model_type"))
    targets = lora.get("target_modules")
    if fam is None:
        return ()
    if targets == "all-linear":
        return PARTS
    targets = [targets] if isinstance(targets, str) else list(targets or fam.lora_default)
    out = []
    for part, role in zip(PARTS, ("q", "k", "v")):
        name = fam.names.get(role)
        if name and any(name == t or name.endswith("." + t) for t in targets):
            out.append(part)
    return tuple(out)


def extra_kept(config, value) -> list:
    """The bytes each layer's attention keeps beyond transformers' (a list of tensors' bytes), from the model's dims."""
    model = config.model
    cfg, run = model.cfg, model.training
    tokens = run["micro_batch"] * run["seq_len"]
    dims = _dims(cfg, tokens)
    if not dims:
        return []
    spec = SPECS.get(cfg.get("model_type"))
    n_head = cfg.get(spec.heads_key)
    n_groups = cfg.get(spec.kv_heads_key) or n_head
    q_width = dims["q"]
    kv_width = q_width // n_head * n_groups
    recipe = dict(getattr(model, "recipe", None) or {})
    # the qkv projection's output: a linear's output role (under autocast, its low dtype)
    act = acts.role_dtypes(recipe.get("precision", "32-true"), model.dtypes)["lin"]
    out = []
    if n_groups == n_head:
        out.append(dtype_bytes(tokens * (q_width + kv_width), act))   # the whole qkv beside transformers' v
    else:
        out.append(dtype_bytes(2 * tokens * (q_width - kv_width), act))   # k and v at every head's width
    if isinstance(value, dict) and value.get("window_mask") is True:
        # model.py 26857050 CausalSelfAttention.forward: sliding_window_mask (T, T) in q's dtype, viewed (1, 1, T, T)
        # and passed to F.scaled_dot_product_attention as attn_mask, which its backward keeps (one per layer)
        out.append(dtype_bytes(run["seq_len"] * run["seq_len"], act))
    adapted = _adapted(config, value)
    if adapted and len(adapted) < len(PARTS):
        width = sum(q_width if p == "query" else kv_width for p in adapted)
        adapter = (model.dtypes or {}).get("adapter") or "float32"
        out.append(dtype_bytes(tokens * width, adapter))   # zero_pad's index_copy source
        out.append(dtype_bytes(width, "int64"))   # its index, torch.tensor(self.lora_ind)
    return out


def shared_dropout_ops(config, value) -> set:
    """The ops (kept_ops' names) whose tensors LoRAQKVLinear's one dropout does not make: the lora dropout's mask and
    lora_A's dropped-out input of every adapted q, k, v projection after the first; none without lora dropout."""
    lora = dict(getattr(config.model, "recipe", None) or {}).get("lora") or {}
    fam = acts.FAMILIES.get(config.model.cfg.get("model_type"))
    if fam is None or not lora.get("dropout"):
        return set()
    names = [fam.names.get(role) for part, role in zip(PARTS, ("q", "k", "v")) if part in _adapted(config, value)]
    # (a row's ops are named by the projection's own name, its module path's last part)
    return {f"{name.rsplit('.', 1)[-1]}.{op}" for name in names[1:] if name for op in ("lora_dropout", "lora_A")}


def rewrite(step, config, training: dict):
    if not _transformer(config):
        return step
    extra = extra_kept(config, training.get("litgpt_qkv"))
    shared = shared_dropout_ops(config, training.get("litgpt_qkv"))
    if not extra and not shared:
        return step
    tensors = dict(step.tensors)
    fresh = max(tensors) + 1
    rows = []
    for row in step.rows:
        if row.name.startswith("layer ") and row.name.rsplit(" ", 1)[-1] == "attention":
            kept, ops = list(row.kept), list(row.kept_ops)
            if shared and ops:   # (a checkpointed layer keeps only its input: its recomputation is left as it is)
                pairs = [(t, op) for t, op in zip(kept, ops) if op not in shared]
                kept, ops = [t for t, _ in pairs], [op for _, op in pairs]
            ids = list(range(fresh, fresh + len(extra)))
            tensors.update(zip(ids, extra))
            fresh += len(extra)
            ops = ops + ["litgpt attention"] * len(ids) if ops else []
            row = replace(row, kept=[*kept, *ids], kept_ops=ops)
        rows.append(row)
    return replace(step, rows=rows, tensors=tensors)

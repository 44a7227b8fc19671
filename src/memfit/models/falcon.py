"""Falcon's config switches as the structure they select (modeling_falcon.py, transformers 5.24): read by models/hf.py
(parameters), models/hf_activations.py (what autograd keeps) and models/hf_config.py (the combinations it refuses)."""

from __future__ import annotations


def falcon_layout(cfg: dict) -> str:
    """FalconDecoderLayer's layout (modeling_falcon.py): "sequential" (parallel_attn false: input_layernorm, attention,
    post_attention_layernorm, MLP), "shared" (one input_layernorm whose output both attention and the MLP read: Falcon-7B,
    or new_decoder_architecture with num_ln_in_parallel_attn 1) or "two_norms" (new_decoder_architecture: ln_attn and
    ln_mlp both on the layer input, Falcon-40B/180B). num_ln_in_parallel_attn None means 2 under the new architecture."""
    new = bool(cfg.get("new_decoder_architecture"))
    lns = cfg.get("num_ln_in_parallel_attn")
    lns = 2 if lns is None and new else lns
    if not cfg.get("parallel_attn") and not new:
        return "sequential"
    return "two_norms" if new and lns == 2 else "shared"


def falcon_kv_heads(cfg: dict) -> int:
    """The key/value heads query_key_value projects to: num_kv_heads under the new architecture, one with
    multi_query, else every head."""
    if cfg.get("new_decoder_architecture"):
        return cfg["num_kv_heads"]
    return 1 if cfg.get("multi_query") else cfg["num_attention_heads"]

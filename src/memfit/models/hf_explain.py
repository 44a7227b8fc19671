"""What `explain` states about a transformer beyond its table (models/hf.py): the MoE routing and the attention kernel
priced, as lines of a models.hf_derive.Model (its `explain_notes`, which imports these; report/model_tables.
transformer_lines renders the table around them)."""

from __future__ import annotations

from memfit.models.families import EXPERTS_KEY
from memfit.models.hf_layers import architecture, family


def routing_lines(model) -> list[str]:
    """A mixture of experts' routing assumption, as explain states it (training.moe changes it)."""
    from memfit.models.hf_activations import routed_rows

    fam = family(model.cfg)
    if fam.block == "llama4":
        tokens = model.training["micro_batch"] * model.training["seq_len"]
        experts = model.cfg["num_local_experts"]
        return [f"       routed rows per MoE layer: {experts * tokens:,} (every token through each of {experts} experts)",
                f"         Llama4TextMoe scales each copy by its sigmoid router score (0 off the top-{model.cfg['num_experts_per_tok']})"]
    if fam.model_type not in EXPERTS_KEY:
        return []
    moe = (model.recipe or {}).get("moe") or {}
    experts, k = model.cfg[EXPERTS_KEY[fam.model_type]], model.cfg["num_experts_per_tok"]
    tokens = model.training["micro_batch"] * model.training["seq_len"]
    rows = routed_rows(tokens, k, experts, moe)
    if moe.get("capacity_factor") is not None:
        how = f"capacity factor {moe['capacity_factor']}: {rows // experts:,} rows per expert, padded or cut"
    elif moe.get("routing") == "worst_case":
        how = f"worst case: the expert group's tokens all send their {k} choices here"
    else:
        how = f"uniform routing assumed: {tokens * k / experts:,.1f} rows per expert, dropless"
    return [f"       routed rows per MoE layer: {rows:,} (training.moe changes it)", f"         {how}"]


def attention_lines(model) -> list[str]:
    """What `attention: sdpa` runs where transformers refuses sdpa (`_supports_sdpa = False`: Gemma 2's soft-capping,
    gpt-oss's attention sinks): from_pretrained without attn_implementation runs eager, and memfit prices that."""
    from memfit.models.hf_activations import FAMILIES as ROWS

    fam = ROWS.get(family(model.cfg).model_type)
    if model.training.get("attention", "sdpa") != "sdpa" or fam is None or fam.sdpa:
        return []
    return ["       attention: sdpa priced as eager, what transformers runs by default",
            f"         ({architecture(model.cfg)} refuses sdpa: {'attention sinks' if fam.sinks else 'soft-capping'})"]

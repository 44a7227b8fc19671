"""The transformer table `explain` prints (models/hf.py): the routing and attention lines and `summary_lines`."""

from __future__ import annotations

from memfit.models.families import EXPERTS_KEY
from memfit.models.hf_layers import architecture, family
from memfit.models.hf_derive import Model


def routing_lines(model: Model) -> list[str]:
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


def attention_lines(model: Model) -> list[str]:
    """What `attention: sdpa` runs where transformers refuses sdpa (`_supports_sdpa = False`: Gemma 2's soft-capping,
    gpt-oss's attention sinks): from_pretrained without attn_implementation runs eager, and memfit prices that."""
    from memfit.models.hf_activations import FAMILIES as ROWS

    fam = ROWS.get(family(model.cfg).model_type)
    if model.training.get("attention", "sdpa") != "sdpa" or fam is None or fam.sdpa:
        return []
    return ["       attention: sdpa priced as eager, what transformers runs by default",
            f"         ({architecture(model.cfg)} refuses sdpa: {'attention sinks' if fam.sinks else 'soft-capping'})"]


def summary_lines(model: Model, width: int = 80, parameter_dtype: str | None = None) -> list[str]:
    """explain's transformer section: the class, then one row per block (embeddings, one layer x N,
    head, loss) with its parameters and the bytes it keeps for backward, then what each keeps."""
    from memfit.report.present import cut, shape_text
    from memfit.diagnostics.units import human

    head_text, _, rest = model.summary.partition("; ")
    out = [cut(f"model  {head_text}", width)]
    if rest:
        out.append(cut(f"       {rest}", width))
    if model.file is not None:
        out.append(cut(f"       from {model.file}", width))
    given = model.cfg.get("dtype")
    if parameter_dtype is not None and given and given != parameter_dtype:
        out.append(cut(f"       config.json says dtype {given}; training uses dtypes.parameters {parameter_dtype}", width))
    out += [cut(line, width) for line in routing_lines(model) + attention_lines(model)]
    out.append("")
    out.append(f"{'block':<18} {'count':>6} {'params (each)':>16} {'saved (each)':>14} {'saved (all)':>14}")
    out.append("=" * min(width, 72))
    for row in model.blocks:
        out.append(f"{cut(row.name, 18):<18} {row.count:>6,} {row.params:>16,} {human(row.saved_bytes):>14} {human(row.saved_bytes * row.count):>14}")
    out.append("-" * min(width, 72))
    out.append(f"activations, each kept storage once: {human(model.activations)}")
    out.append("")
    out.append("kept for backward, per block (what autograd saves in one training step):")
    for row in model.blocks:
        if not row.kept:
            continue
        out.append(cut(f"  {row.name}{' (x' + format(row.count, ',') + ')' if row.count > 1 else ''}:", width))
        for label, shape, dtype in row.kept:
            out.append(cut(f"    {shape_text(shape) + ' ' + dtype:<26} {label}", width))
    return out

"""explain's tables of a model: a Keras-style stack's layers (models.keras.LayerRow rows) with the bytes
each keeps for backward, and a transformer's blocks (models.hf_derive.Model's rows)."""

from __future__ import annotations

import math

from memfit.diagnostics.units import human, with_bytes
from memfit.report.present import cut, shape_text


def keras_lines(rows: list, width: int = 80) -> list[str]:
    """A Keras model.summary()-like table with the batch axis and the bytes kept for backward."""
    name_w, shape_w, param_w = 31, 20, 12
    saved_w = max(10, width - name_w - shape_w - param_w - 3)
    rule = "-" * min(width, name_w + shape_w + param_w + saved_w + 3)
    out = [f"{'Layer (type)':<{name_w}} {'Output Shape':<{shape_w}} {'Param #':>{param_w}} {'Saved':>{saved_w}}", "=" * len(rule)]
    for r in rows:
        label = f"{r.name} ({r.type})"
        label = cut(label, name_w)
        shape = cut(shape_text(r.output_shape, "()"), shape_w)
        out.append(f"{label:<{name_w}} {shape:<{shape_w}} {r.params:>{param_w},} {human(r.saved_bytes) if r.saved_bytes else '0':>{saved_w}}")
    out.append(rule)
    total = sum(r.params for r in rows)
    frozen = sum(math.prod(s) for r in rows for _, s in r.non_trainable)
    saved = sum(r.saved_bytes for r in rows)
    out.append(f"Total params: {total:,}")
    out.append(f"Trainable params: {total - frozen:,}")
    out.append(f"Non-trainable params: {frozen:,}")
    out.append(f"Saved for backward: {with_bytes(saved)}, each kept tensor counted once")
    out.append("")
    out.append("kept for backward, by layer (what PyTorch's autograd saves in training):")
    for r in rows:
        if r.saved:
            what = ", ".join(f"{label} {shape_text(shape, '()')}" + (f" {dtype}" if dtype else "") for label, shape, dtype in r.saved)
            line = f"  {r.name}: {what}"
            out.append(cut(line, width))
    return out


def transformer_lines(model, width: int = 80, parameter_dtype: str | None = None) -> list[str]:
    """explain's transformer section: the class, then one row per block (embeddings, one layer x N,
    head, loss) with its parameters and the bytes it keeps for backward, then what each keeps. `model`: the check's
    models.hf_derive.Model (its rows, and the lines it states about itself: `explain_notes`)."""
    head_text, _, rest = model.summary.partition("; ")
    out = [cut(f"model  {head_text}", width)]
    if rest:
        out.append(cut(f"       {rest}", width))
    if model.file is not None:
        out.append(cut(f"       from {model.file}", width))
    given = model.cfg.get("dtype")
    if parameter_dtype is not None and given and given != parameter_dtype:
        out.append(cut(f"       config.json says dtype {given}; training uses dtypes.parameters {parameter_dtype}", width))
    out += [cut(line, width) for line in model.explain_notes()]
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

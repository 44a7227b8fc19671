"""explain's tables of a model: a Keras-style stack's layers (models.keras.LayerRow rows) with the bytes
each keeps for backward. (The transformer's table, models.hf.summary_lines, joins it when hf.py is split.)"""

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

"""The config seam of `lora` and `quantization`: what can be said about them before the
model is derived (they need the transformer form of `model`; r > 0; a known method)."""

from __future__ import annotations

from . import codes
from .diagnostics import Problem

TRANSFORMER_KEYS = ("hf_config", "transformer")


def has_transformer(data: dict) -> bool:
    model = data.get("model")
    return isinstance(model, dict) and any(k in model for k in TRANSFORMER_KEYS)


def problems(data: dict) -> list[Problem]:
    from . import quant

    out = []
    for key in ("lora", "quantization"):
        if key in data and not has_transformer(data):
            out.append(
                Problem(
                    (key,),
                    codes.NEEDS_TRANSFORMER,
                    f"{key} applies to a transformer model (model: {{hf_config: config.json}} or model: {{transformer: ...}}); this config declares none",
                    on_key=True,
                )
            )
    section = data.get("lora")
    if isinstance(section, dict) and "r" in section:
        r = section["r"]
        if isinstance(r, bool) or not isinstance(r, int) or r <= 0:
            out.append(Problem(("lora", "r"), codes.BAD_LORA, f"lora.r is {r!r}: the rank must be a positive integer (peft refuses r <= 0)"))
    section = data.get("quantization")
    if isinstance(section, dict) and "method" in section:
        try:
            quant.method(section["method"])
        except quant.QuantError as error:
            hint = f"; did you mean {error.suggestions[0]!r}?" if error.suggestions else ""
            out.append(Problem(("quantization", "method"), codes.UNKNOWN_QUANTIZATION, f"quantization.method is {section['method']!r}: unknown method{hint} (known: {', '.join(quant.METHODS)})"))
    return out

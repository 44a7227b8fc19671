"""The config seam of `lora` and `quantization`: what can be said about them before the
model is derived (they need the transformer form of `model`; r > 0; a known method)."""

from __future__ import annotations

from memfit.diagnostics import codes
from memfit.diagnostics.diagnostic import Problem
from memfit.models import adapter_tables
from memfit.recipe import lora as lora_rules
from memfit.recipe import quant

TRANSFORMER_KEYS = ("hf_config", "transformer")


def has_transformer(data: dict) -> bool:
    model = data.get("model")
    return isinstance(model, dict) and any(k in model for k in TRANSFORMER_KEYS)


def problems(data: dict) -> list[Problem]:
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


def transformer_rows(cfg: dict, data: dict, base_dtype: str, params, linears, head: str) -> tuple[list, list[Problem]]:
    """The parameters of a transformer under `lora` / `quantization`, as lora.Row (peft's
    names, adapters in their own dtype, bitsandbytes' storage as frozen rows), and the
    problems. `cfg` is the normalized transformer config; `params`, `linears` and `head` (the
    head kind) are models.hf's for it, which turns the rows into config tensors."""
    head = output_layer(cfg, head)
    section = data.get("lora") or {}
    refused = quant.REFUSED_MODELS.get(cfg.get("model_type"))
    if data.get("quantization") and refused:
        return [], [Problem(("quantization",), codes.BAD_QUANTIZATION, f"{cfg['model_type']} cannot be trained on a quantized base: {refused}", on_key=True)]
    try:
        rows = lora_rules.training_parameters(
            params,
            linears,
            base_dtype=base_dtype,
            lora_config=data.get("lora"),
            quantization=data.get("quantization"),
            output_head=head,
            model_type=cfg.get("model_type"),
            keep_in_fp32=adapter_tables.KEEP_IN_FP32.get(cfg.get("model_type"), ()),
        )
    except lora_rules.LoraError as error:
        code = codes.LORA_NO_MATCH if "match no" in str(error) else codes.BAD_LORA
        key = error.field.split(".")[-1]
        hint = f"; did you mean {error.suggestions[0]!r}?" if error.suggestions else ""
        path = ("lora", key) if key in section else ("lora",)
        return [], [Problem(path, code, f"{error}{hint}", on_key=path == ("lora",))]
    return rows, []


def output_layer(cfg: dict, head: str) -> str | None:
    """The module the family's output layer is, by peft's and bitsandbytes' name: recipe.lora.OUTPUT_HEADS by the
    head kind (models.hf_layers.head), a masked LM's by its family's own name (adapter_tables.MLM_OUTPUT_LAYER);
    None for a head with no output layer of the vocabulary."""
    name = lora_rules.OUTPUT_HEADS.get(head)
    if name == "cls.predictions.decoder":
        name = adapter_tables.MLM_OUTPUT_LAYER.get(cfg.get("model_type"), name)
    return name


def head_quantized(cfg: dict, data: dict, params, linears, head: str) -> bool:
    """Whether the output layer the forward runs is a bitsandbytes 4-bit linear (ledger/techniques/chunked_loss.py
    prices its dequantized weight): the family's output layer (output_layer) among the linears the quantization
    converts (quant.quantized_modules on its skip list, else transformers' defaults, as transformer_rows stores them),
    with a weight of its own (a tied head's is the input embedding's) and not stood in for by a
    lora.modules_to_save copy (peft's ModulesToSaveWrapper runs the copy, kept in the base's dtype)."""
    section = data.get("quantization")
    layer = output_layer(cfg, head)
    if not layer or not quant.bnb_4bit(section) or f"{layer}.weight" not in {row[0] for row in params}:
        return False
    lora = data.get("lora")
    try:   # the modules peft wraps (lora.saved_modules); a bad lora section is reported where it is read
        saved = lora_rules.saved_modules(params, lora_rules.spec(lora, model_type=cfg.get("model_type")), linears) if isinstance(lora, dict) else []
    except lora_rules.LoraError:
        saved = []
    if any(layer == module or layer.startswith(module + ".") for module in saved):
        return False
    return layer in quant.quantized_modules(linears, skip_modules=section.get("skip_modules"), output_head=layer, params=params,
                                            keep_in_fp32=adapter_tables.KEEP_IN_FP32.get(cfg.get("model_type"), ()))

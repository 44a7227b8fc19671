"""bitsandbytes weight quantization (transformers' BitsAndBytesConfig): what a
quantized linear layer stores, exactly as bitsandbytes 0.50 stores it.

4-bit (nf4/fp4, functional.quantize_4bit, blocksize 64):
  weight    Params4bit, uint8 of shape ((n+1)//2, 1): two 4-bit codes per byte
  absmax    one fp32 scale per block of 64 weights
  code      the 16-value fp32 code table, one copy per weight's QuantState
with double quantization (bnb_4bit_use_double_quant; quantize_blockwise, blocksize 256):
  absmax    the scales themselves quantized to uint8
  offset    their fp32 mean (a 0-dim tensor)
  state2.absmax  one fp32 scale per 256 scales
  state2.code    the 256-value fp32 dynamic map, copied per weight (code.to(copy=True))
int8 (LLM.int8(), Int8Params): weight int8 (out, in) plus SCB, one fp32 scale per output row.

The bias, when the layer has one, stays an ordinary tensor in the model's dtype.
Which modules are quantized follows transformers' quantizer: every nn.Linear
(and GPT-2's Conv1D) except the skipped ones; with no skip list given, the
output head (get_keys_to_not_convert); a given list replaces that default.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from memfit.models.adapter_tables import REFUSED_MODELS  # noqa: F401  (model types whose quantized base cannot run: data in models/)

BLOCKSIZE_4BIT = 64  # quantize_4bit's default (BitsAndBytesConfig has no knob for it)
NESTED_BLOCKSIZE = 256  # quantize_4bit(compress_statistics=True) -> quantize_blockwise(blocksize=256)
CODE_4BIT = 16  # get_4bit_type(): 16 fp32 values
CODE_8BIT = 256  # create_dynamic_map(): 256 fp32 values


@dataclass(frozen=True, slots=True)
class Method:
    name: str
    bits: int
    summary: str


# bitsandbytes' 4-bit methods (Linear4bit; BitsAndBytesConfig's bnb_4bit_quant_type)
BNB_4BIT = ("nf4", "fp4")
# the dtype a 4-bit weight is packed in, two codes per byte (bitsandbytes' Params4bit, torchao's quantized_data)
PACKED_4BIT = "uint8"

# what a weight may be quantized from (bitsandbytes' QuantState.dtype: the floating dtype it had)
QUANTIZED_FROM = ("float32", "float16", "bfloat16")

METHODS: dict[str, Method] = {
    "nf4": Method("nf4", 4, "4-bit NormalFloat (QLoRA), blockwise absmax scales"),
    "fp4": Method("fp4", 4, "4-bit float (E2M1), blockwise absmax scales"),
    "int8": Method("int8", 8, "LLM.int8(): int8 weights with one fp32 scale per output row"),
    "nf4-torchao": Method("nf4-torchao", 4, "torchao's NF4Tensor (torchtune's QLoRA): int8 block scalers, a per-256-scaler factor in the model's dtype"),
}
# torchao dtypes/nf4tensor.py to_nf4(block_size=64, scaler_block_size=256): NF4Tensor.from_tensor keeps
# quantized_data (uint8, two codes per byte), quantized_scalers (int8, one per 64-block),
# quantization_factor (one per 256 scalers) and scaler_mean (0-dim) in the input's dtype, and the
# 16-value nf4 table in the input's dtype
TORCHAO_SCALER_BLOCKSIZE = 256


class QuantError(ValueError):
    def __init__(self, message: str, field: str, suggestions=None):
        super().__init__(message)
        self.field = field
        self.suggestions = suggestions or []


def method(name) -> Method:
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in METHODS:
        import difflib

        close = difflib.get_close_matches(str(name).lower(), list(METHODS), n=3, cutoff=0.3)
        raise QuantError(f"quantization.method is {name!r}: unknown method; known: {', '.join(METHODS)}", "quantization.method", close)
    return METHODS[key]


def bnb_4bit(section) -> bool:
    """Whether a `quantization` section makes the base's linears bitsandbytes' 4-bit ones (Linear4bit, Params4bit:
    nf4 and fp4, by `method`'s spelling as method() reads it; not torchao's NF4Tensor, not LLM.int8()). The one
    decision of it: recipe.lora's adapter dtype, models.hf_derive's QLoRA precision and dtypes read it."""
    if not isinstance(section, dict):
        return False
    try:
        return method(section.get("method", "nf4")).name in BNB_4BIT
    except (QuantError, TypeError):
        return False


def weight_tensors(in_features: int, out_features: int, method_name: str, *, double_quant: bool = False, blocksize: int = BLOCKSIZE_4BIT, base_dtype: str = "bfloat16") -> list[tuple[str, tuple, str]]:
    """(bitsandbytes' name, shape, dtype) of everything a quantized weight keeps."""
    m = method(method_name)
    n = in_features * out_features
    if m.name == "nf4-torchao":
        blocks = n // blocksize
        return [
            ("weight", (n // 2,), PACKED_4BIT),
            ("quantized_scalers", (blocks,), "int8"),
            ("quantization_factor", (blocks // TORCHAO_SCALER_BLOCKSIZE,), base_dtype),
            ("scaler_mean", (), base_dtype),
            ("nf4", (CODE_4BIT,), base_dtype),
        ]
    if m.bits == 8:
        return [("weight", (out_features, in_features), "int8"), ("weight.SCB", (out_features,), "float32")]
    blocks = -(-n // blocksize)
    out = [("weight", ((n + 1) // 2, 1), PACKED_4BIT)]
    if not double_quant:
        out.append(("quant_state.absmax", (blocks,), "float32"))
        out.append(("quant_state.code", (CODE_4BIT,), "float32"))
        return out
    out.append(("quant_state.absmax", (blocks,), "uint8"))
    out.append(("quant_state.code", (CODE_4BIT,), "float32"))
    out.append(("quant_state.offset", (), "float32"))
    out.append(("quant_state.state2.absmax", (-(-blocks // NESTED_BLOCKSIZE),), "float32"))
    out.append(("quant_state.state2.code", (CODE_8BIT,), "float32"))
    return out


def weight_bytes(in_features: int, out_features: int, method_name: str, *, double_quant: bool = False) -> int:
    from memfit.recipe.costs import dtype_bytes

    return sum(dtype_bytes(math.prod(shape), dtype) for _, shape, dtype in weight_tensors(in_features, out_features, method_name, double_quant=double_quant))


def skipped(module_name: str, patterns) -> bool:
    """transformers' quantizers_utils.should_convert_module, negated: a pattern skips a
    module when it matches from the start up to a module boundary (as a regex) or
    is a plain suffix of the name."""
    boundary = r"(?:(?<=\.)|(?=\.|$))"
    return any(re.match(rf"(?:{key}){boundary}", module_name) or module_name.endswith(key) for key in patterns)


def default_skip_patterns(params, output_head: str | None, tied=()) -> list[str]:
    """transformers' get_keys_to_not_convert: the tied parameters (both ends), the
    last parameter and the output-embedding module, each without a ".weight" suffix.

    `params`: the model's (name, ...) rows in named_parameters() order; `tied`: the
    names of tied parameters, both ends (lm_head.weight, model.embed_tokens.weight)."""
    keys = set(tied)
    if params:
        keys.add(params[-1][0])
    if output_head:
        keys.add(output_head)
    return sorted({k.removesuffix(".weight") for k in keys})


def quantized_modules(linears, *, skip_modules=None, output_head: str | None = "lm_head", keep_in_fp32=(), params=None, tied=()) -> list[str]:
    """Names of the linear modules transformers replaces by bitsandbytes layers.

    `linears`: (module_name, in_features, out_features, has_bias) rows. With no
    `skip_modules` transformers' defaults apply (default_skip_patterns; the output
    head when `params` is not given); a given list replaces them, as transformers
    does; `keep_in_fp32` (a model class's _keep_in_fp32_modules) is always added."""
    if skip_modules is not None:
        patterns = list(skip_modules)
    elif params is not None:
        patterns = default_skip_patterns(params, output_head, tied)
    else:
        patterns = [output_head] if output_head else []
    patterns += list(keep_in_fp32)
    return [row[0] for row in linears if not skipped(row[0], patterns)]


def schema_property() -> dict:
    """JSON schema of the `quantization` section, generated from METHODS."""
    return {
        "title": "Quantization",
        "description": "bitsandbytes weight quantization of the frozen base (transformers' BitsAndBytesConfig); needs a transformer model.",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "method": {"title": "Method", "description": "; ".join(f"{m.name}: {m.summary}" for m in METHODS.values()), "type": "string", "examples": list(METHODS)},
            "double_quant": {"title": "Double quantization", "description": "bnb_4bit_use_double_quant: quantize the 4-bit block scales to 8 bits.", "type": "boolean"},
            "compute_dtype": {"$ref": "#/$defs/dtype", "title": "Compute dtype", "description": "bnb_4bit_compute_dtype: the dtype matmuls run in (no storage effect)."},
            "quantized_from": {"enum": list(QUANTIZED_FROM), "title": "Quantized from",
                               "description": "The dtype each weight had when it was quantized (QuantState.dtype: what "
                                              "dequantize_4bit returns, before the matmul's cast to the input's dtype). "
                                              "Default: the parameters' dtype (transformers quantizes the loaded "
                                              "weights); Lightning's BitsandbytesPrecision quantizes from float16."},
            "skip_modules": {
                "title": "Skip modules",
                "description": "llm_int8_skip_modules: modules kept unquantized (replaces transformers' default, the output head).",
                "type": "array",
                "items": {"type": "string"},
            },
        },
        "required": ["method"],
        "examples": [{"method": "nf4", "double_quant": True, "compute_dtype": "bfloat16", "skip_modules": ["lm_head"]}],
    }

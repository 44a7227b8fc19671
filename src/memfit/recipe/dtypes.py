"""dtype names -> bytes per element (a Fraction for packed 4-bit formats); the precisions' recipes (RECIPES: each
`precision`'s dtype per category), which every stage reads, the native readers too."""

from __future__ import annotations

import difflib
from fractions import Fraction

from memfit.diagnostics.records import record

HALF = Fraction(1, 2)

# name -> (bytes per element, what it is). Aliases point at the same width.
DTYPES: dict[str, tuple[int | Fraction, str]] = {
    "float64": (8, "IEEE double"),
    "double": (8, "alias of float64"),
    "fp64": (8, "alias of float64"),
    "float32": (4, "IEEE single"),
    "float": (4, "alias of float32"),
    "fp32": (4, "alias of float32"),
    "tf32": (4, "TensorFloat-32: computes with 19 bits, stored as 32"),
    "bfloat16": (2, "brain float, 8-bit exponent"),
    "bf16": (2, "alias of bfloat16"),
    "float16": (2, "IEEE half"),
    "half": (2, "alias of float16"),
    "fp16": (2, "alias of float16"),
    "float8": (1, "8-bit float (any variant)"),
    "fp8": (1, "alias of float8"),
    "float8_e4m3": (1, "FP8 E4M3"),
    "float8_e4m3fn": (1, "FP8 E4M3, finite (torch.float8_e4m3fn)"),
    "float8_e4m3fnuz": (1, "FP8 E4M3, finite, unsigned zero"),
    "float8_e5m2": (1, "FP8 E5M2"),
    "float8_e5m2fnuz": (1, "FP8 E5M2, finite, unsigned zero"),
    "int64": (8, "64-bit integer"),
    "long": (8, "alias of int64"),
    "int32": (4, "32-bit integer"),
    "int": (4, "alias of int32"),
    "int16": (2, "16-bit integer"),
    "int8": (1, "8-bit integer"),
    "uint8": (1, "8-bit unsigned integer"),
    "bool": (1, "one byte per element, as PyTorch stores it"),
    "int4": (HALF, "4-bit integer, two per byte, each tensor padded to a whole byte"),
    "uint4": (HALF, "4-bit unsigned integer, packed"),
    "nf4": (HALF, "4-bit NormalFloat (QLoRA), packed; quantization scales not included"),
    "fp4": (HALF, "4-bit float (E2M1), packed; block scales not included"),
}


def canonical(name: str) -> str:
    """The dtype an alias names (bf16 -> bfloat16); any other name as it is."""
    what = DTYPES.get(name, (None, ""))[1]
    return what[len("alias of "):] if what.startswith("alias of ") else name


def nearest(name: str, vocabulary=DTYPES) -> list[str]:
    """Known names nearest to a misspelt one, best first."""
    folded = name.strip().lower()
    if folded in vocabulary:
        return [folded]
    return difflib.get_close_matches(folded, list(vocabulary), n=3, cutoff=0.5)


def describe(width: int | Fraction) -> str:
    if isinstance(width, Fraction) and width.denominator != 1:
        return f"{width.numerator}/{width.denominator} byte per element"
    return f"{width} byte{'s' if width != 1 else ''} per element"


@record(frozen=True, slots=True)
class PrecisionRecipe:
    """A `precision`'s dtype per category (recipe/precision.py resolves a config's with it)."""

    parameters: str
    gradients: str
    optimizer_state: str
    activations: str  # the dtype a layer's output is kept in (autocast's low dtype for *-mixed)
    autocast: str | None  # torch.autocast dtype, None when no autocast runs
    summary: str


# Lightning (lightning.fabric/pytorch `precision=`): *-true casts the model, so
# torch.optim keeps state in that dtype too (zeros_like(param)); *-mixed keeps an
# fp32 model and runs matmuls under torch.autocast.
RECIPES: dict[str, PrecisionRecipe] = {
    "64-true": PrecisionRecipe("float64", "float64", "float64", "float64", None, "model in float64"),
    "32-true": PrecisionRecipe("float32", "float32", "float32", "float32", None, "model in float32 (the default)"),
    "bf16-true": PrecisionRecipe("bfloat16", "bfloat16", "bfloat16", "bfloat16", None, "model cast to bfloat16: weights, gradients and optimizer state"),
    "16-true": PrecisionRecipe("float16", "float16", "float16", "float16", None, "model cast to float16: weights, gradients and optimizer state"),
    "bf16-mixed": PrecisionRecipe("float32", "float32", "float32", "bfloat16", "bfloat16", "fp32 model, torch.autocast(bfloat16)"),
    "16-mixed": PrecisionRecipe("float32", "float32", "float32", "float16", "float16", "fp32 model, torch.autocast(float16) with a GradScaler"),
}

"""dtype names -> bytes per element (a Fraction for packed 4-bit formats)."""

from __future__ import annotations

import difflib
from fractions import Fraction

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

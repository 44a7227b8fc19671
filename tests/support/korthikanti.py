"""Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"), Table 2: the bytes of
activations one transformer layer keeps for its backward, per tensor-parallel rank, with 16-bit activations, by
recomputation (none, selective, full) and sequence parallelism: the paper's formulas, the oracle the Korthikanti
tests compare memfit with."""

from __future__ import annotations

from fractions import Fraction


def table2(s: int, b: int, h: int, a: int, t: int) -> dict:
    """{(recomputation, sequence parallel): bytes} for sequence length s, micro-batch b, hidden size h, a heads and
    t tensor-parallel ranks (Table 2's rows; full recomputation keeps the layer input, 2sbh, split t ways under
    sequence parallelism as Megatron keeps it)."""
    sbh = s * b * h
    return {
        ("none", False): sbh * (10 + Fraction(24, t) + Fraction(5 * a * s, h * t)),
        ("none", True): sbh * (Fraction(34, t) + Fraction(5 * a * s, h * t)),
        ("selective", False): sbh * (10 + Fraction(24, t)),
        ("selective", True): sbh * Fraction(34, t),
        ("full", False): 2 * sbh,
        ("full", True): Fraction(2 * sbh, t),
    }

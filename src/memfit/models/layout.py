"""How Megatron-LM lays a transformer over ranks, as integer arithmetic: the padded vocabulary a
vocabulary-parallel embedding and head split, each pipeline stage's layers, and the micro-batches a
stage holds in flight under its schedule.

Models (hf_sharded: a rank's share of the saved activations) and placement (sharding: a rank's
parameters, its stages) both use them; they live here, below placement in the stage order, once.
"""

from __future__ import annotations

# Megatron's make-vocab-size-divisible-by default.
VOCAB_DIVISIBLE_BY = 128


def padded_vocab(vocab: int, tensor: int, divisible_by: int = VOCAB_DIVISIBLE_BY) -> int:
    """Megatron's _vocab_size_with_padding: up to a multiple of divisible_by * tensor."""
    multiple = divisible_by * tensor
    return -(-vocab // multiple) * multiple


def stage_layers(layers: int, pipeline: int) -> list:
    """[first, last) layers of every stage: contiguous, equal runs; a remainder goes to the first stages."""
    base, extra = divmod(layers, pipeline)
    out, start = [], 0
    for s in range(pipeline):
        n = base + (1 if s < extra else 0)
        out.append((start, start + n))
        start += n
    return out


def in_flight(stage: int, pipeline: int, gradient_accumulation: int, schedule: str = "1f1b") -> int:
    """Micro-batches whose activations stage `stage` holds at once: under 1F1B the first stage
    runs `pipeline` forwards before its first backward; under GPipe every stage runs all of them."""
    if schedule == "gpipe" and pipeline > 1:
        return max(1, gradient_accumulation)
    return max(1, min(pipeline - stage, gradient_accumulation))

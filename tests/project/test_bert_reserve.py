"""tests/support/bert_reserve.py on a small BERT (bert-large-uncased's config at 2 layers, hidden 256, a 1,024-token
vocabulary, 128 tokens): the recorded allocation stream is the one MemTracker sees, and its replay through the caching
allocator's rules keeps the invariants a reserve has. The full-size replay of the published rows is the script's (docs/accuracy.md)."""

from __future__ import annotations

import bert_reserve
import caching_allocator
import pytest

SMALL = {"layers": 2, "hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 4, "vocab_size": 1024}


@pytest.mark.parametrize("micro_batch, accumulation, checkpointing, fp16, optimizer", [
    (2, 1, False, False, "adamw_hf"),
    (1, 2, True, True, "adafactor"),
])
def test_small_bert_stream_matches_memtracker_and_replays(micro_batch, accumulation, checkpointing, fp16, optimizer):
    config = bert_reserve.model_config(**SMALL)
    marks: list = []
    events, tracked = bert_reserve.record(config, micro_batch, accumulation, checkpointing, fp16, optimizer, steps=3,
                                          seq_len=128, marks=marks)
    r = caching_allocator.replay(events)
    # the stream's own peak (storage nbytes) is MemTracker's peak over the same steps, to the byte
    assert r.peak_requested == tracked
    # the reserve: at least the allocated peak, which is at least the requested one; whole segments (2 MiB steps)
    assert r.peak_requested <= r.peak_allocated <= r.peak_reserved
    assert r.peak_reserved % caching_allocator.K_ROUND_LARGE == 0
    # nothing is released without an OOM, and the third step reserves nothing the second did not
    by_step = [caching_allocator.replay(events[:i]).peak_reserved for _, i in marks]
    assert by_step[1] == by_step[2] == r.peak_reserved == r.reserved_at_end


def test_torch_110_softmax_keeps_one_scores_tensor_more_per_layer():
    """The 2022 stream (transformers 4.15's fp32 additive mask, torch 1.10's softmax saving its input) holds one fp32
    scores tensor (batch x heads x seq x seq x 4 B) more per layer than today's at the peak (the end of the forward,
    where every layer's saved tensors live; the second step: gradients and optimizer state already there)."""
    config = bert_reserve.model_config(**SMALL)
    peaks = []
    for softmax_2022 in (False, True):
        events, _ = bert_reserve.record(config, 2, 1, False, False, "adamw_hf", steps=2, seq_len=128, track=False,
                                        softmax_2022=softmax_2022)
        peaks.append(caching_allocator.replay(events).peak_requested)
    assert peaks[1] - peaks[0] == SMALL["layers"] * 2 * SMALL["num_attention_heads"] * 128 * 128 * 4

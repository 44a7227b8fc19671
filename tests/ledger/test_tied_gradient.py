"""A head tied to the input embedding (GPT-2's and SmolLM3's default tie_word_embeddings) and gradient accumulation:
MemTracker around a real CPU step of tiny transformers models (vocabulary 4,096, hidden 64, 1 x 8 tokens, fp32: the
(V, h) weight's gradient parts are 1 MiB each, the largest tensors of the backward), against `memfit check` on the
config a user writes.

- The embedding's backward makes its part of the tied weight's gradient and autograd's input buffer sums it with the
  head's out of place (torch/csrc/autograd/input_buffer.cpp `accumulate`: torch.profiler, no dispatch mode, shows an
  aten::add of two (4096, 64) parts allocating 1,048,576 B): both parts and the sum at once (ledger/training.py, the
  embeddings row). memfit counted one part fewer: 0.793 of MemTracker (GPT-2, SGD fused), now 1.0005.
- Under gradient accumulation (2 micro-batches, no training.keep_gradients) the second micro-batch adds each new
  gradient into the .grad the first made, as kept gradients are (ledger/techniques/keep_gradients.py `accumulated`):
  each new gradient is a temporary beside its .grad, and the tied weight's head part waits in the input buffer apart
  from its .grad (Row.grad_started / grad_completed, Step.grad_buffered). memfit had neither: 0.817 (GPT-2, tied,
  AdamW), 0.783 (SmolLM3, tied, AdamW), 0.876 (GPT-2, untied, SGD fused) of MemTracker; now 1.004, 1.0004, 1.0000."""

from __future__ import annotations

import needs
import pytest

needs.module("torch")
needs.module("transformers")

import hf_measure  # noqa: E402
import peak_reference as ref  # noqa: E402
from test_peak_transformers import BAND, hf_run_peak  # noqa: E402

SHAPE = (1, 8)


def measured(cfg: dict, optimizer: str, impl: str, accumulation: int) -> dict:
    """One warm optimizer step over `accumulation` micro-batches (forward, backward each), gradients set to None after
    it; MemTracker without its module hooks (they refuse a module run twice in one step) counts every byte all the same."""
    model = hf_measure.build(cfg)
    data = hf_measure.inputs(cfg, *SHAPE)
    x, y = data["input_ids"], data["labels"]
    opt = ref.OPTIMIZERS[optimizer](model.parameters(), **ref.IMPLS[impl])

    tracker = ref.warm_step(model, opt, x, y, accumulation, modules=False)
    return {"bytes": tracker.get_tracker_snapshot("peak")[ref.CPU]["Total"], "phase": tracker.peak_phase}


def _compare(family, tie, optimizer, impl, accumulation, tmp_path):
    cfg = hf_measure.without_attention_dropout(hf_measure.tiny(family, vocab_size=4096, tie_word_embeddings=tie))
    theirs = measured(cfg, optimizer, impl, accumulation)
    mine = hf_run_peak(cfg, tmp_path, optimizer=optimizer, optimizer_impl=impl, micro_batch=SHAPE[0], seq_len=SHAPE[1],
                       checkpointing="none", attention="sdpa", gradient_accumulation=accumulation)["peak"]
    assert abs(mine["bytes"] - theirs["bytes"]) <= BAND * theirs["bytes"], (mine["bytes"], theirs["bytes"])
    assert mine["phase"] == theirs["phase"] == "backward", (mine["phase"], theirs["phase"])


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("family", ["gpt2", "smollm3"])
def test_a_tied_weights_gradient_parts_and_their_sum(family, tmp_path):
    _compare(family, True, "sgd", "fused", 1, tmp_path)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("family,tie,optimizer,impl", [("gpt2", True, "adamw", "foreach"), ("smollm3", True, "adamw", "foreach"),
                                                       ("gpt2", False, "sgd", "fused")])
def test_a_later_micro_batch_adds_into_the_earlier_gradients(family, tie, optimizer, impl, tmp_path):
    _compare(family, tie, optimizer, impl, 2, tmp_path)

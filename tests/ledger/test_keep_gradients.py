"""`training.keep_gradients`: a loop that zeroes its gradients in place (`zero_grad(set_to_none=False)`) holds them
through the next step's forward and backward. Measured: MemTracker around a real CPU step of tiny transformers
models whose loop zeroes in place, against `memfit check` on the config a user writes."""

from __future__ import annotations

import needs
import pytest

needs.module("torch")
needs.module("transformers")

import hf_measure  # noqa: E402
import peak_reference as ref  # noqa: E402
from test_peak_transformers import BAND, hf_run_peak, hf_tiny  # noqa: E402


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("family,checkpointing", [("llama", "none"), ("llama", "full"), ("gpt2", "none")])
def test_gradients_kept_between_steps_match_memtracker(family, checkpointing, tmp_path):
    cfg = hf_tiny(family)
    run = dict(micro_batch=2, seq_len=64, checkpointing=checkpointing, optimizer_impl="foreach", attention="sdpa")
    theirs = ref.measure_hf(cfg, optimizer="adamw", impl="foreach", set_to_none=False, **{k: run[k] for k in ("micro_batch", "seq_len", "checkpointing")})
    freed = ref.measure_hf(cfg, optimizer="adamw", impl="foreach", **{k: run[k] for k in ("micro_batch", "seq_len", "checkpointing")})
    kept = hf_run_peak(cfg, tmp_path, optimizer="adamw", keep_gradients=True, **run)["peak"]
    default = hf_run_peak(cfg, tmp_path, optimizer="adamw", **run)["peak"]
    assert abs(kept["bytes"] - theirs["bytes"]) <= BAND * theirs["bytes"], (kept["bytes"], theirs["bytes"])
    # the measured difference is real (the gradients are a large share here), and memfit moves the same way
    assert theirs["bytes"] > freed["bytes"] and kept["bytes"] > default["bytes"]
    assert kept["phase"] == theirs["phase"], (kept["phase"], theirs["phase"])


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("precision", ["32-true", "bf16-true"])
@pytest.mark.parametrize("family,tie", [("cohere", True), ("smollm3", True), ("smollm3", False)])
def test_a_tied_heads_gradient_waits_beside_the_kept_one(family, tie, precision, tmp_path):
    """A head tied to the input embedding (Cohere's and SmolLM3's default, tie_word_embeddings) under kept gradients:
    autograd sums the shared weight's two parts in its input buffer and adds the sum into the kept .grad only after
    the embedding's backward, so the head's (V, h) part is a tensor of its own beside the kept .grad through every
    layer's backward (step.Row.grad_started / grad_completed). transformers 5.24: CohereConfig and SmolLM3Config
    default tie_word_embeddings True (configuration_cohere.py:81, configuration_smollm3.py:94), both classes tie
    lm_head.weight to model.embed_tokens.weight (_tied_weights_keys, modeling_cohere.py:437, modeling_smollm3.py:430);
    traced at MemTracker's peak, a Temp of (V, h) made by the head's weight-gradient mm. Measured under full checkpointing, where the peak falls
    in a layer's recomputation: without it memfit was 0.924 (Cohere) and 0.940 (SmolLM3) of MemTracker in fp32 at a
    256-token vocabulary; the untied model has no such buffer."""
    cfg = hf_measure.without_attention_dropout(hf_measure.tiny(family, vocab_size=256, tie_word_embeddings=tie))
    run = dict(micro_batch=2, seq_len=32, checkpointing="full")
    theirs = ref.measure_hf(cfg, optimizer="sgd", impl="fused", precision=precision, set_to_none=False, **run)
    kept = hf_run_peak(cfg, tmp_path, optimizer="sgd", optimizer_impl="fused", precision=precision, attention="sdpa",
                       keep_gradients=True, **run)["peak"]
    assert abs(kept["bytes"] - theirs["bytes"]) <= BAND * theirs["bytes"], (kept["bytes"], theirs["bytes"])
    assert kept["phase"] == theirs["phase"] == "backward"

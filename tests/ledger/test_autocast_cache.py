"""Autocast's cast cache under checkpointing, measured: a checkpointed layer's saved tensors are dropped in the forward,
but autocast caches the low-precision cast of every trained weight (a leaf fp32 tensor that requires grad:
aten/src/ATen/autocast_mode.cpp `cached_cast`, `can_try_cache`) until the autocast context exits, so the casts of
every layer run so far are alive at the forward's end (ledger/step.py, Row.cast_cached). A frozen weight (LoRA's base)
is cast anew by each call and not cached. The backward runs outside autocast; torch.utils.checkpoint re-enters
autocast around each recomputation (`_get_autocast_kwargs`: the forward's cache_enabled), and its exit clears the
cache, so the recomputed casts live only as the recomputed matmuls' saved tensors.

The reference: MemTracker around a warm step of the real tiny model (full fine-tune, fp32 weights, bf16-mixed CPU
autocast, every layer checkpointed as transformers' gradient checkpointing does), one micro-batch and two (the second
runs with every gradient allocated, so the forward's end can be the peak), against `memfit check` on the config file.
"""

from __future__ import annotations

import family_check
import needs
import pytest

torch = needs.module("torch")
needs.module("transformers")

import hf_measure  # noqa: E402
import peak_reference as ref  # noqa: E402

BAND = 0.05
MICRO_BATCH, SEQ_LEN, LAYERS = 2, 32, 4


def _cfg(model_type: str) -> dict:
    return hf_measure.without_attention_dropout(hf_measure.tiny(model_type, num_hidden_layers=LAYERS))


def measure(model_type: str, accumulation: int, peft: dict | None = None, every: int = 1) -> dict:
    """MemTracker's peak of a warm optimizer step of `accumulation` micro-batches (labels in the batch: the loss in
    the model's forward, under autocast, as the Trainer runs it; each backward outside it), as
    peak_reference.measure takes it (its PhaseTracker), the module stats reset between micro-batches (MemTracker
    refuses a module called twice otherwise; the peak it keeps is the device's)."""
    cfg = _cfg(model_type)
    model = hf_measure.build(cfg, "sdpa", "32-true", peft)
    base = model if hasattr(model, "activation_checkpointing_enable") else model.get_base_model()
    base.activation_checkpointing_enable()
    if every > 1:   # transformers' every_n_layers: layers 0, every, 2 x every ... checkpointed (test_combinations)
        from transformers.modeling_layers import GradientCheckpointingLayer

        layers = [m for m in base.modules() if isinstance(m, GradientCheckpointingLayer)]
        for i, layer in enumerate(layers):
            layer.gradient_checkpointing = i % every == 0
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(trainable, lr=1e-4, foreach=False)
    batch = hf_measure.inputs(cfg, MICRO_BATCH, SEQ_LEN)
    x, y = batch["input_ids"], batch["labels"]

    tracker = ref.warm_step(model, opt, x, y, accumulation, lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    return {"bytes": tracker.get_tracker_snapshot("peak")[ref.CPU]["Total"], "phase": tracker.peak_phase}


def memfit(model_type: str, accumulation: int, tmp_path, lora: dict | None = None, every: int = 1) -> dict:
    """`memfit check` on the run as a config file."""
    training = {"attention": "sdpa", "checkpointing": "full", "gradient_accumulation": accumulation,
                "optimizer_impl": "for_loop", **({"checkpoint_every": every} if every > 1 else {})}
    sections = {"optimizer": "sgd", **({"lora": lora} if lora is not None else {})}
    return family_check.run_check(tmp_path, _cfg(model_type), precision="bf16-mixed", sections=sections,
                                  micro_batch=MICRO_BATCH, seq_len=SEQ_LEN, **training)["peak"]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("model_type", ["llama", "bert"])
@pytest.mark.parametrize("accumulation", [1, 2])
def test_the_cast_cache_at_the_forward_end_matches_memtracker(model_type, accumulation, tmp_path):
    ours = memfit(model_type, accumulation, tmp_path)
    theirs = measure(model_type, accumulation)
    print(f"{model_type} accumulation {accumulation}: memfit {ours['bytes']:,} ({ours['phase']}) / MemTracker "
          f"{theirs['bytes']:,} ({theirs['phase']}) = {ours['bytes'] / theirs['bytes']:.3f}")
    assert abs(ours["bytes"] - theirs["bytes"]) <= BAND * theirs["bytes"], \
        f"peak {ours['bytes']:,} / MemTracker {theirs['bytes']:,} = {ours['bytes'] / theirs['bytes']:.3f} ({ours['phase']} / {theirs['phase']})"
    assert ours["phase"] == theirs["phase"]



@pytest.mark.filterwarnings("ignore")
def test_partial_checkpointing_caches_only_the_checkpointed_layers_casts(tmp_path):
    """Every second layer checkpointed: the others save their casts (counted among their saved tensors already); the
    cache holds the checkpointed layers' beyond them."""
    ours = memfit("llama", 2, tmp_path, every=2)
    theirs = measure("llama", 2, every=2)
    print(f"llama every 2, accumulation 2: memfit {ours['bytes']:,} ({ours['phase']}) / MemTracker {theirs['bytes']:,} "
          f"({theirs['phase']}) = {ours['bytes'] / theirs['bytes']:.3f}")
    assert abs(ours["bytes"] - theirs["bytes"]) <= BAND * theirs["bytes"], \
        f"peak {ours['bytes']:,} / MemTracker {theirs['bytes']:,} = {ours['bytes'] / theirs['bytes']:.3f} ({ours['phase']} / {theirs['phase']})"
    assert ours["phase"] == theirs["phase"]

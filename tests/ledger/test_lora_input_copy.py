"""LoRA under autocast with full checkpointing, measured: peft's Linear.forward casts its input to the adapter's
dtype first (`x = self._cast_input_dtype(x, lora_A.weight.dtype)`), so where the input comes out of a matmul (o_proj's
from the attention, down_proj's from the MLP's product: the low dtype under autocast) it makes an fp32 copy that no op
saves (autocast's lora_A saves its own low cast of it) and the local holds through lora_A, lora_B and the sum
(models/held.py lora_linear_flight). And transformers' activation_checkpointing_enable makes the embeddings' output
require a gradient (enable_input_require_grads), so the first layer's recomputation saves its norm's input and the
weight casts of q, k and v that the un-checkpointed first layer does not (ledger/training.py _every_layer).

The reference: MemTracker around a warm optimizer step of the real tiny model (4 layers, all-linear LoRA, bf16-mixed
CPU autocast, every layer checkpointed as transformers' gradient checkpointing does), SGD and AdamW, one micro-batch
and two; a dispatch-mode trace of the live storages at its peak (Llama, SGD) finds layer 0's recomputation stopped at
down_proj's lora_B (torch's non-reentrant checkpoint stops at the last saved tensor) with down_proj's fp32 (T, i)
input copy alive. Against `memfit check` on the config file (before: 0.951 with SGD, one micro-batch).

MemTracker runs without its module tracker (peak_reference.NoModules; tests/ledger/test_reference_tracker.py): the
embeddings' output is a leaf that requires a gradient, and ModTracker's pre-forward hook on the first layer
(register_multi_grad_hook, "all" mode) keeps that leaf's AccumulateGrad in a closure it registers on the leaf itself,
a cycle through the autograd node that Python's collector cannot see: micro-batch 1's leaf and its .grad (2 x 16,384 B)
stayed alive through micro-batch 2 (and past the step), where a loop without the tracker has freed them (measured with
a weakref on the embeddings' output, with and without torch's ModTracker alone). With it the two-micro-batch
references were 32,768 B higher: memfit 0.964 (SGD) and 0.969 (AdamW) of 1,301,832 and 1,551,912 (Llama), now 0.988
and 0.990 of 1,269,064 and 1,519,144, as one micro-batch is (where the leaf dies after the peak: equal either way).
"""

from __future__ import annotations

import family_check
import needs
import pytest

torch = needs.module("torch")
needs.module("transformers")
needs.module("peft")

import hf_measure  # noqa: E402
import peak_reference as ref  # noqa: E402

BAND = 0.05
MICRO_BATCH, SEQ_LEN, LAYERS = 2, 32, 4
LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}


def _cfg(model_type: str) -> dict:
    return hf_measure.without_attention_dropout(hf_measure.tiny(model_type, num_hidden_layers=LAYERS))


def measure(model_type: str, optimizer: str, accumulation: int) -> dict:
    """MemTracker's peak of a warm optimizer step of `accumulation` micro-batches (the loss in the model's forward,
    under autocast; each backward outside it), without its module tracker (its hook keeps each micro-batch's
    embeddings output and gradient alive)."""
    cfg = _cfg(model_type)
    model = hf_measure.build(cfg, "sdpa", "32-true", LORA)
    model.get_base_model().activation_checkpointing_enable()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = ref.OPTIMIZERS[optimizer](trainable, **ref.IMPLS["for_loop"])
    batch = hf_measure.inputs(cfg, MICRO_BATCH, SEQ_LEN)
    x, y = batch["input_ids"], batch["labels"]

    tracker = ref.warm_step(model, opt, x, y, accumulation, lambda: torch.autocast("cpu", dtype=torch.bfloat16), modules=False)
    return {"bytes": tracker.get_tracker_snapshot("peak")[ref.CPU]["Total"], "phase": tracker.peak_phase}


def memfit(model_type: str, optimizer: str, accumulation: int, tmp_path) -> dict:
    """`memfit check` on the run as a config file."""
    return family_check.run_check(tmp_path, _cfg(model_type), precision="bf16-mixed",
                                  sections={"optimizer": optimizer, "lora": dict(LORA)}, micro_batch=MICRO_BATCH,
                                  seq_len=SEQ_LEN, attention="sdpa", checkpointing="full",
                                  gradient_accumulation=accumulation, optimizer_impl="for_loop")["peak"]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("accumulation", [1, 2])
def test_lora_under_autocast_with_full_checkpointing_matches_memtracker(model_type, optimizer, accumulation, tmp_path):
    ours = memfit(model_type, optimizer, accumulation, tmp_path)
    theirs = measure(model_type, optimizer, accumulation)
    ratio = ours["bytes"] / theirs["bytes"]
    print(f"{model_type} {optimizer} accumulation {accumulation}: memfit {ours['bytes']:,} ({ours['phase']}) / "
          f"MemTracker {theirs['bytes']:,} ({theirs['phase']}) = {ratio:.3f}")
    assert abs(ours["bytes"] - theirs["bytes"]) <= BAND * theirs["bytes"], \
        f"peak {ours['bytes']:,} / MemTracker {theirs['bytes']:,} = {ratio:.3f} ({ours['phase']} / {theirs['phase']})"
    assert ours["phase"] == theirs["phase"]

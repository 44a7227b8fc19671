"""`training.checkpoint_every` / `checkpoint_offset`: under full checkpointing only every N-th layer is recomputed,
the others keep their activations. Measured: MemTracker around a real CPU step of a tiny 4-layer transformers model
whose checkpointed layers are chosen as transformers 5 chooses them (`every_n_layers`: layers 0, 2) and as
torchtitan/torchtune choose them (`_count % ac_freq == 0` from 1: layers 1, 3), against `memfit check` on the config
a user writes."""

from __future__ import annotations

import needs
import pytest

needs.module("torch")
needs.module("transformers")

import hf_measure  # noqa: E402
import peak_reference as ref  # noqa: E402
from test_peak_transformers import BAND, hf_run_peak, hf_tiny  # noqa: E402


def _measure(cfg: dict, micro_batch: int, seq_len: int, checkpointed, precision: str = "32-true") -> dict:
    """One warm AdamW (foreach) step with torch.utils.checkpoint (non-reentrant, transformers' default) on the layers
    in `checkpointed` (None: no checkpointing)."""
    model = hf_measure.build(cfg, precision=precision)
    if checkpointed is not None:
        model.gradient_checkpointing_enable()
        for i, layer in enumerate(model.model.layers):
            layer.gradient_checkpointing = i in checkpointed
    batch = hf_measure.inputs(cfg, micro_batch, seq_len)
    opt = ref.OPTIMIZERS["adamw"](model.parameters(), **ref.IMPLS["foreach"])
    with hf_measure.cuda_dropout():
        return ref.measure(model, (batch["input_ids"], batch["labels"]), lambda m, x, y: m(input_ids=x, labels=y).loss, opt)


@pytest.mark.filterwarnings("ignore")
# measured (memfit / MemTracker): offset 0: 1.0173 fp32, 1.0002 bf16; offset 1: 1.0155 fp32, 1.0060 bf16
@pytest.mark.parametrize("offset,layers,precision", [(0, {0, 2}, "32-true"), (1, {1, 3}, "bf16-true")])
def test_every_second_layer_checkpointed_matches_memtracker(offset, layers, precision, tmp_path):
    cfg = hf_tiny("llama")
    cfg["num_hidden_layers"] = 4
    b, s = 2, 64
    theirs = _measure(cfg, b, s, layers, precision)
    every = _measure(cfg, b, s, {0, 1, 2, 3}, precision)
    none = _measure(cfg, b, s, None, precision)
    run = dict(optimizer="adamw", precision=precision, micro_batch=b, seq_len=s, checkpointing="full", optimizer_impl="foreach",
               attention="sdpa")
    ours = hf_run_peak(cfg, tmp_path, checkpoint_every=2, checkpoint_offset=offset, **run)["peak"]
    full = hf_run_peak(cfg, tmp_path, **run)["peak"]
    print(f"offset {offset} {precision}: memfit {ours['bytes']} MemTracker {theirs['bytes']} ratio {ours['bytes'] / theirs['bytes']:.4f}"
          f" (full {every['bytes']}, none {none['bytes']})")
    assert abs(ours["bytes"] - theirs["bytes"]) <= BAND * theirs["bytes"], (ours["bytes"], theirs["bytes"])
    # the measured run lies between full and no checkpointing, and memfit's moves off the full figure with it
    assert every["bytes"] < theirs["bytes"] < none["bytes"]
    assert ours["bytes"] > full["bytes"]

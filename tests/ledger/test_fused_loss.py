"""Liger's fused linear cross-entropy and Cut Cross-Entropy (`training.fused_loss`, ledger/techniques/fused_loss.py),
measured on a transformers Llama whose forward ends in the function, as the Liger and CCE patches make it: their
kernels are Triton, so the step runs tests/support/fused_loss_reference.py, a pure-torch port of what that code
allocates (its lines cited there), under MemTracker (the peak) and saved_tensors_hooks (the saved bytes), against
`memfit check` on the config that says so (and on the Axolotl and LLaMA-Factory files that switch it on)."""

from __future__ import annotations

import json
import subprocess
import sys

import needs
import pytest
import yaml

BAND = 0.05
SHAPE = (4, 128)   # micro-batch, sequence: the loss is the peak (the whole logits, or the fused function)
# the logits dominate (vocab 4096 over a 64-wide model): what the loss does with them is what the peak measures
# (docs/peak.md also prints Cut Cross-Entropy under LoRA, measured once: 1.016; left out here to keep the suite short)
RUNS = [("liger", "32-true", None), ("liger", "bf16-true", None), ("liger", "bf16-true", {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}),
        ("cut_cross_entropy", "bf16-true", None)]


def measured(cfg: dict, kind: str, precision: str, lora: dict | None, batch: int, seq: int) -> dict:
    import torch

    import fused_loss_reference as fused
    import hf_measure
    import peak_reference as ref

    model = fused.Fused(hf_measure.build(cfg, precision=precision, lora=lora), kind)
    data = hf_measure.inputs(cfg, batch, seq)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = ref.OPTIMIZERS["adamw"](trainable, **ref.IMPLS["foreach"])
    peak = ref.measure(model, (data["input_ids"], data["labels"]), lambda m, i, y: m(i, y), opt)
    excluded = {p.untyped_storage().data_ptr() for p in model.parameters()}
    excluded |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    tracker = hf_measure.Tracker(excluded)

    def pack(t):
        holder = hf_measure._Holder(t)
        tracker.add(holder, t)
        return holder

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda holder: holder.t):
        model(data["input_ids"], data["labels"]).backward()
    return {"bytes": peak["bytes"], "saved": tracker.total}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("kind, precision, lora", RUNS)
def test_fused_loss_matches_its_code(tmp_path, kind, precision, lora):
    needs.module("torch")
    needs.module("transformers")
    if lora:
        needs.module("peft")
    from test_peak_transformers import hf_tiny

    cfg = {**hf_tiny("llama"), "vocab_size": 4096}
    theirs = measured(cfg, kind, precision, lora, *SHAPE)
    ours = explained(tmp_path, cfg, precision, lora, kind)
    whole = explained(tmp_path, cfg, precision, lora, None)
    peak = ours["peak"]
    assert abs(peak["bytes"] - theirs["bytes"]) <= BAND * theirs["bytes"], (peak["bytes"], theirs["bytes"])
    # the saved activations: what the walk holds at the loss (every row's, and the loss's own)
    saved = next(m["live"]["activations"] for m in ours["timeline"] if m["phase"] == "loss")
    assert abs(saved - theirs["saved"]) <= BAND * theirs["saved"], (saved, theirs["saved"])
    assert peak["bytes"] < whole["peak"]["bytes"]
    assert not ours["diagnostics"], ours["diagnostics"]


def explained(tmp_path, cfg: dict, precision: str, lora: dict | None, kind: str | None) -> dict:
    """`memfit explain --format json` on the config a user writes: the model's config.json beside it."""
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    training = {"micro_batch": SHAPE[0], "seq_len": SHAPE[1], "checkpointing": "none", "optimizer_impl": "foreach", "attention": "sdpa"}
    if kind:
        training["fused_loss"] = kind
    doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "optimizer": "adamw", "model": {"hf_config": "config.json"},
           "precision": precision, **({"lora": lora} if lora else {}), "training": training}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "explain", "--format", "json", str(path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["files"][0]

"""Liger-Kernel's RMSNorm and SwiGLU (`training.liger_kernels`, ledger/techniques/liger_kernels.py), measured on tiny
transformers models whose norms and gated MLPs run them, as Liger's patches make them: the kernels are Triton, so the
step runs tests/support/liger_reference.py, a pure-torch port of what that code allocates and saves (its lines cited
there), under MemTracker (the peak of a warm step) and saved_tensors_hooks (the saved bytes, their peak), against
`memfit check` on the config that says so."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys

import needs
import pytest
import yaml

BAND = 0.05
SHAPE = (2, 64)   # micro-batch, sequence
LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
KERNELS = ["rms_norm", "swiglu"]
# (family, precision, checkpointing, lora)
RUNS = [(f, p, c, lora) for f in ("llama",) for p in ("bf16-true", "bf16-mixed") for c in ("none", "full")
        for lora in (None, LORA)] + [("qwen3", "bf16-true", "none", None), ("qwen3", "bf16-mixed", "full", LORA)]


def measured(cfg: dict, precision: str, checkpointing: str, lora: dict | None, kernels) -> dict:
    """MemTracker's peak of a warm step, and the saved activations' peak (saved_tensors_hooks), of the patched model."""
    import torch

    import hf_measure
    import liger_reference
    import peak_reference as ref

    def built():
        model = hf_measure.build(cfg, "sdpa", precision, lora)
        if kernels:
            liger_reference.patch(model, kernels)
        if checkpointing == "full":
            model.gradient_checkpointing_enable()
        return model

    saved = hf_measure.measure(cfg, micro_batch=SHAPE[0], seq_len=SHAPE[1], precision=precision, model=built())
    model = built()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = ref.OPTIMIZERS["adamw"](trainable, **ref.IMPLS["foreach"])
    batch = hf_measure.inputs(cfg, *SHAPE)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16-mixed" else contextlib.nullcontext()

    def loss(m, x, y):
        with autocast:
            return m(input_ids=x, labels=y).loss

    with hf_measure.cuda_dropout():
        peak = ref.measure(model, (batch["input_ids"], batch["labels"]), loss, opt)
    return {"bytes": peak["bytes"], "phase": peak["phase"], "saved": saved["peak"], "total": saved["total"]}


def checked(tmp_path, cfg: dict, precision: str, checkpointing: str, lora: dict | None, kernels) -> dict:
    """`memfit check --format json` on the config a user writes: the model's config.json beside it."""
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    training = {"micro_batch": SHAPE[0], "seq_len": SHAPE[1], "checkpointing": checkpointing, "optimizer_impl": "foreach",
                "attention": "sdpa"}
    if kernels:
        training["liger_kernels"] = list(kernels)
    doc = {"memfit": 1, "device": {"memory": "1 TiB", "type": "cpu"}, "optimizer": "adamw",
           "model": {"hf_config": "config.json"}, "precision": precision, **({"lora": lora} if lora else {}),
           "training": training}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["files"][0]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("family, precision, checkpointing, lora", RUNS)
def test_liger_kernels_match_their_code(tmp_path, family, precision, checkpointing, lora):
    needs.module("torch")
    needs.module("transformers")
    if lora:
        needs.module("peft")
    from test_peak_transformers import hf_tiny

    cfg = hf_tiny(family)
    theirs = measured(cfg, precision, checkpointing, lora, KERNELS)
    ours = checked(tmp_path, cfg, precision, checkpointing, lora, KERNELS)
    peak = ours["peak"]
    assert abs(peak["bytes"] - theirs["bytes"]) <= BAND * theirs["bytes"], (peak["bytes"], theirs["bytes"])
    if checkpointing == "none":   # every saved tensor lives to the backward: the walk's saved activations at its peak
        saved = peak["live"]["activations"]
        assert abs(saved - theirs["saved"]) <= BAND * theirs["saved"], (saved, theirs["saved"])
    assert not [d for d in ours["diagnostics"] if d["severity"] != "information"], ours["diagnostics"]
    eager = checked(tmp_path, cfg, precision, checkpointing, lora, None)
    assert peak["bytes"] < eager["peak"]["bytes"]
    assert ours["footprint"]["activations"] < eager["footprint"]["activations"]

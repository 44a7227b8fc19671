"""DoRA's forward moment (issue 32): peft's DoraLinearLayer.forward computes the weight norm from (out, in) temporaries
in every forward of an adapted linear (ledger/training._dora_flights). The gated peak of `memfit check` against
MemTracker around a real step on CPU (peft 0.21.2).

MemTracker's own peak for a DoRA step depends on when Python's cyclic garbage collector runs (the same step measured
1,689,320 / 1,716,728 / 1,783,296 bytes in three processes): DoRA's forward leaves garbage in reference cycles that
holds tensors until a collection. With the collector off through the step the measurement is deterministic and is the
upper bound; that is the reference here, and memfit does not reach it yet (docs/accuracy.md)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import needs
import pytest
import yaml

torch = needs.module("torch")
needs.module("transformers")
needs.module("peft")

import hf_measure  # noqa: E402
import peak_reference as ref  # noqa: E402

BAND = 0.05
LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear", "use_dora": True}
TINY = hf_measure.without_attention_dropout(hf_measure.tiny("llama"))


@pytest.fixture(scope="module")
def collector_off():
    """MemTracker's peak of one DoRA step with Python's cyclic collector off through it (deterministic)."""
    model = hf_measure.build(TINY, "sdpa", "32-true", LORA)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=True)
    batch = hf_measure.inputs(TINY, 2, 32)
    gc.collect()
    gc.disable()
    try:
        return ref.measure(model, (batch["input_ids"], batch["labels"]), lambda m, x, y: m(input_ids=x, labels=y).loss, opt)
    finally:
        gc.enable()


def memfit_peak(tmp_path) -> dict:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "optimizer": "adamw", "precision": "32-true",
           "model": {"hf_config": "config.json"}, "lora": LORA,
           "training": {"micro_batch": 2, "seq_len": 32, "attention": "sdpa", "checkpointing": "none", "optimizer_impl": "foreach"}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)
    return json.loads(done.stdout)["files"][0]["peak"]


@pytest.mark.filterwarnings("ignore")
def test_the_collector_off_step_is_what_docs_accuracy_prints(collector_off):
    """docs/accuracy.md: "peaks in the backward at 1,929,712 bytes" (the reference the open xfail below compares with)."""
    assert (collector_off["bytes"], collector_off["phase"]) == (1_929_712, "backward"), collector_off


@pytest.mark.filterwarnings("ignore")
@pytest.mark.xfail(strict=True, raises=AssertionError, reason="open: with the collector off, DoRA's cyclic garbage (1,929,712 B, the peak in "
                   "backward) is 14% above memfit's 1,690,176 B; with it on, 1.69-1.78 MB (0.95-1.00)")
def test_the_gated_peak_under_dora_matches_memtracker_without_the_collector(collector_off, tmp_path):
    peak, theirs = memfit_peak(tmp_path), collector_off
    assert abs(peak["bytes"] - theirs["bytes"]) <= BAND * theirs["bytes"], (peak["bytes"], theirs["bytes"])

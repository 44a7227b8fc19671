"""DoRA's forward moment (issue 32): peft's DoraLinearLayer.forward computes the weight norm from (out, in) temporaries
in every forward of an adapted linear (ledger/training._dora_flights). Where the weights are large beside the tokens
it is the step's peak: the gated peak of `memfit check` against MemTracker around a real step on CPU (peft 0.21.2)."""

from __future__ import annotations

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
# wide weights, few tokens: the norm's (out, in) temporaries outweigh the saved activations
WIDE = dict(TINY, hidden_size=512, intermediate_size=2048, num_attention_heads=8, num_key_value_heads=4)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("cfg, precision, micro_batch, seq_len", [
    pytest.param(TINY, "32-true", 2, 32, id="tiny-32-true"),
    pytest.param(WIDE, "32-true", 1, 16, id="wide-32-true"),
    pytest.param(WIDE, "bf16-true", 1, 16, id="wide-bf16-true"),
])
def test_the_gated_peak_under_dora_matches_memtracker(cfg, precision, micro_batch, seq_len, tmp_path):
    model = hf_measure.build(cfg, "sdpa", precision, LORA)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=True)
    batch = hf_measure.inputs(cfg, micro_batch, seq_len)
    theirs = ref.measure(model, (batch["input_ids"], batch["labels"]), lambda m, x, y: m(input_ids=x, labels=y).loss, opt)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "optimizer": "adamw", "precision": precision,
           "model": {"hf_config": "config.json"}, "lora": LORA,
           "training": {"micro_batch": micro_batch, "seq_len": seq_len, "attention": "sdpa", "checkpointing": "none",
                        "optimizer_impl": "foreach"}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)
    peak = json.loads(done.stdout)["files"][0]["peak"]
    assert theirs["phase"] == "forward"  # DoRA's norm, not the backward, is the step's peak here
    assert abs(peak["bytes"] - theirs["bytes"]) <= BAND * theirs["bytes"], (peak["bytes"], theirs["bytes"])

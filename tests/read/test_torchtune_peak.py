"""torchtune's own eager LoRA and QLoRA step against `memfit check` on the same torchtune config (issue 32): the setup
of the published Llama 3.1 8B rows on one RTX 4090 (docs/accuracy.md: q and v at rank 8 with fused AdamW; q, k, v,
output and the MLP over a 4-bit NF4 base; activation checkpointing, CEWithChunkedOutputLoss, a packed dataset, bf16)
at tiny widths with a vocabulary large enough that, as at 8B, the chunked loss's logits make the peak. torchtune
0.6.1 runs in an interpreter of its own (MEMFIT_TORCHTUNE_PYTHON, as tests/read/test_torchtune_built.py);
tests/support/torchtune_peak.py is what it runs (MemTracker around one step). `compile` stays off on both sides:
memfit does not model it, so the published rows' remaining distance is what compile saves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import needs
import pytest
import yaml

SUPPORT = Path(__file__).resolve().parents[1] / "support"
BAND = 0.05
TINY = {"vocab_size": 32768, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 256,
        "intermediate_dim": 1024, "max_seq_len": 256}
BATCH, SEQ = 2, 128


def torchtune_python() -> str:
    python = os.environ.get("MEMFIT_TORCHTUNE_PYTHON")
    if not python:
        needs.unavailable("MEMFIT_TORCHTUNE_PYTHON is not set (an interpreter with torchtune 0.6.1 and torchao 0.10.0)")
    return python


@pytest.mark.parametrize("component, modules, mlp", [
    ("lora_llama3", ["q_proj", "v_proj"], False),                                  # 8B_lora_single_device
    ("qlora_llama3", ["q_proj", "k_proj", "v_proj", "output_proj"], True),         # 8B_qlora_single_device
])
def test_torchtunes_eager_step_is_memfits_peak(tmp_path, component, modules, mlp):
    python = torchtune_python()
    builder = {"lora_attn_modules": modules, "apply_lora_to_mlp": mlp, "apply_lora_to_output": False, "lora_rank": 8,
               "lora_alpha": 16, **TINY}
    spec = {"quantize_base": component == "qlora_llama3", "ac": True, "batch": BATCH, "seq": SEQ, "builder": builder}
    done = subprocess.run([python, str(SUPPORT / "torchtune_peak.py"), json.dumps(spec)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    config = {"model": {"_component_": f"torchtune.models.llama3.{component}", **builder},
              "tokenizer": {"_component_": "torchtune.models.llama3.llama3_tokenizer", "path": "/tmp/tokenizer.model",
                            "max_seq_len": SEQ},
              "dataset": {"_component_": "torchtune.datasets.alpaca_cleaned_dataset", "packed": True},
              "batch_size": BATCH, "gradient_accumulation_steps": 1,
              "optimizer": {"_component_": "torch.optim.AdamW", "fused": True, "lr": 1e-4},
              "loss": {"_component_": "torchtune.modules.loss.CEWithChunkedOutputLoss"},
              "enable_activation_checkpointing": True, "compile": False, "dtype": "bf16"}
    path = tmp_path / "lora_single_device.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    out = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", "--budget", "1GiB", str(path)],
                         capture_output=True, text=True, timeout=120, check=False)
    ours = json.loads(out.stdout)["files"][0]["peak"]
    assert abs(ours["bytes"] - theirs["bytes"]) <= BAND * theirs["bytes"], (ours["bytes"], theirs["bytes"])
    assert ours["phase"] == theirs["phase"] == "forward"   # at the chunked loss, as at 8B

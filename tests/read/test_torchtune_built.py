"""torchtune's own build against `memfit check` on the same torchtune config (issue 32): the LoRA (and DoRA) adapters
torchtune 0.6.1 makes, in the model's dtype, are memfit's gradients, and a real AdamW step's moments its optimizer
state. torchtune 0.6.1 needs torchao 0.10.0, not the torchao the peft tests pin, so it runs in an interpreter of its
own: MEMFIT_TORCHTUNE_PYTHON names it (a venv with torch 2.13.0, torchtune==0.6.1, torchao==0.10.0 and torchtune's
requirements; docs/accuracy.md). tests/support/torchtune_build.py is what it runs."""

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
TINY = {"vocab_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 64, "intermediate_dim": 112,
        "max_seq_len": 256}


LABELS = {("q_proj", "v_proj"): "q, v", ("q_proj", "k_proj", "v_proj", "output_proj"): "q, k, v, output, MLP, lm_head",
          ("q_proj", "v_proj", "output_proj"): "q, v, output, MLP, DoRA"}


def documented(modules: list[str], dtype: str) -> tuple[int, int]:
    """docs/accuracy.md's torchtune rows for this build: (gradients, optimizer state), the bytes the page prints."""
    lines = (SUPPORT.parents[1] / "docs" / "accuracy.md").read_text(encoding="utf-8").splitlines()
    setup = f"| torchtune `lora_llama3` (tiny), {LABELS[tuple(modules)]}, `dtype: {dtype}` | gradients |"
    at = [i for i, line in enumerate(lines) if line.startswith(setup)]
    assert len(at) == 1, f"docs/accuracy.md has no single row {setup!r}"
    grads, state = (line.strip().strip("|").split("|") for line in lines[at[0]:at[0] + 2])
    assert state[0].strip() == "same" and state[1].strip() == "optimizer state", state
    return int(grads[3].replace(",", "")), int(state[3].replace(",", ""))


def torchtune_python() -> str:
    python = os.environ.get("MEMFIT_TORCHTUNE_PYTHON")
    if not python:
        needs.unavailable("MEMFIT_TORCHTUNE_PYTHON is not set (an interpreter with torchtune 0.6.1 and torchao 0.10.0)")
    return python


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("modules, mlp, output, dora", [
    (["q_proj", "v_proj"], False, False, False),
    (["q_proj", "k_proj", "v_proj", "output_proj"], True, True, False),
    (["q_proj", "v_proj", "output_proj"], True, False, True),
])
def test_torchtunes_adapters_are_memfits_gradients_and_state(tmp_path, dtype, modules, mlp, output, dora):
    python = torchtune_python()
    builder = {"lora_attn_modules": modules, "apply_lora_to_mlp": mlp, "apply_lora_to_output": output, "lora_rank": 8,
               "lora_alpha": 16, "use_dora": dora, **TINY}
    done = subprocess.run([python, str(SUPPORT / "torchtune_build.py"), json.dumps({"dtype": dtype, "builder": builder})],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert {d for _, _, d in theirs["trainable"]} == {"bfloat16" if dtype == "bf16" else "float32"}
    config = {"model": {"_component_": "torchtune.models.llama3.lora_llama3", **builder},
              "tokenizer": {"_component_": "torchtune.models.llama3.llama3_tokenizer", "path": "/tmp/tokenizer.model", "max_seq_len": 32},
              "batch_size": 2, "optimizer": {"_component_": "torch.optim.AdamW", "fused": True}, "dtype": dtype}
    path = tmp_path / "lora_single_device.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    out = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", "--budget", "1GiB", str(path)],
                         capture_output=True, text=True, timeout=120, check=False)
    ours = json.loads(out.stdout)["files"][0]["footprint"]
    assert ours["gradients"] == theirs["trainable_bytes"]
    assert ours["optimizer_state"] == theirs["adamw_moments"]
    assert documented(modules, dtype) == (theirs["trainable_bytes"], theirs["adamw_moments"])  # the page's bytes

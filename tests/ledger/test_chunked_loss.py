"""torchtune's chunked cross-entropy (`loss: CEWithChunkedOutputLoss`, `num_output_chunks`) and its optimizer in
backward (`optimizer_in_bwd: true`), measured on torchtune 0.6.1's own step (MemTracker and saved_tensors_hooks
around tests/support/torchtune_step.py, in torchtune's own interpreter: MEMFIT_TORCHTUNE_PYTHON, as
tests/read/test_torchtune_built.py) against `memfit check` on the torchtune config that runs it."""

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
# the logits dominate (vocab 4096 over a 64-wide model): the loss's chunking is what the peak measures
WIDE_VOCAB = {"vocab_size": 4096, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 64, "intermediate_dim": 112, "max_seq_len": 256}
# a short sequence over more layers: the gradients and the optimizer step are what the peak measures
DEEP = {"vocab_size": 256, "num_layers": 6, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 128, "intermediate_dim": 256, "max_seq_len": 256}
LORA = {"lora_attn_modules": ["q_proj", "v_proj"], "apply_lora_to_mlp": False, "apply_lora_to_output": False, "lora_rank": 8, "lora_alpha": 16}


def torchtune_python() -> str:
    python = os.environ.get("MEMFIT_TORCHTUNE_PYTHON")
    if not python:
        needs.unavailable("MEMFIT_TORCHTUNE_PYTHON is not set (an interpreter with torchtune 0.6.1 and torchao 0.10.0)")
    return python


def theirs(dtype: str, lora: bool, chunks: int, in_bwd: bool, builder: dict, batch: int, seq: int) -> dict:
    spec = {"dtype": dtype, "lora": lora, "chunks": chunks, "in_bwd": in_bwd, "batch_size": batch, "seq_len": seq,
            "builder": {**builder, **(LORA if lora else {})}}
    done = subprocess.run([torchtune_python(), str(SUPPORT / "torchtune_step.py"), json.dumps(spec)], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def ours(tmp_path, dtype: str, lora: bool, chunks: int, in_bwd: bool, builder: dict, batch: int, seq: int) -> dict:
    model = {"_component_": f"torchtune.models.llama3.{'lora_llama3' if lora else 'llama3'}", **builder, **(LORA if lora else {})}
    config = {"model": model,
              "tokenizer": {"_component_": "torchtune.models.llama3.llama3_tokenizer", "path": "/tmp/tokenizer.model", "max_seq_len": seq},
              "batch_size": batch, "optimizer": {"_component_": "torch.optim.AdamW", "fused": True}, "dtype": dtype,
              "optimizer_in_bwd": in_bwd}
    if chunks:
        config["loss"] = {"_component_": "torchtune.modules.loss.CEWithChunkedOutputLoss", "num_output_chunks": chunks}
    else:
        config["loss"] = {"_component_": "torch.nn.CrossEntropyLoss"}
    path = tmp_path / ("lora_single_device.yaml" if lora else "full_single_device.yaml")
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    out = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", "--budget", "1GiB", str(path)],
                         capture_output=True, text=True, timeout=120, check=False)
    return json.loads(out.stdout)["files"][0]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("dtype, lora, chunks", [("bf16", False, 8), ("fp32", False, 8), ("bf16", True, 8), ("bf16", False, 0)])
def test_chunked_loss_matches_torchtunes_step(tmp_path, dtype, lora, chunks):
    measured = theirs(dtype, lora, chunks, False, WIDE_VOCAB, 2, 64)
    file = ours(tmp_path, dtype, lora, chunks, False, WIDE_VOCAB, 2, 64)
    peak = file["peak"]
    assert abs(peak["bytes"] - measured["bytes"]) <= BAND * measured["bytes"], (peak["bytes"], measured["bytes"])
    saved = file["footprint"]["activations"]
    assert abs(saved - measured["saved"]) <= BAND * measured["saved"], (saved, measured["saved"])
    assert not [d for d in file.get("diagnostics", []) if d["code"] == "not-modelled" and "loss" in d["message"]]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("dtype, lora", [("fp32", False), ("bf16", False), ("fp32", True)])
def test_optimizer_in_backward_matches_torchtunes_step(tmp_path, dtype, lora):
    measured = theirs(dtype, lora, 0, True, DEEP, 1, 16)
    plain = theirs(dtype, lora, 0, False, DEEP, 1, 16)
    file = ours(tmp_path, dtype, lora, 0, True, DEEP, 1, 16)
    peak = file["peak"]
    assert abs(peak["bytes"] - measured["bytes"]) <= BAND * measured["bytes"], (peak["bytes"], measured["bytes"])
    if not lora:  # the gradients are a large share of a full fine-tune's step: the measured saving is real, and memfit's
        assert plain["bytes"] > measured["bytes"] * (1 + BAND)
        assert ours(tmp_path, dtype, lora, 0, False, DEEP, 1, 16)["peak"]["bytes"] > peak["bytes"]


def test_optimizer_in_backward_with_gradient_accumulation_is_refused(tmp_path):
    path = tmp_path / "full_single_device.yaml"
    path.write_text("model:\n  _component_: torchtune.models.llama3.llama3\n" + "".join(f"  {k}: {v}\n" for k, v in DEEP.items())
                    + "tokenizer:\n  max_seq_len: 16\noptimizer_in_bwd: true\ngradient_accumulation_steps: 4\n")
    out = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", "--budget", "1GiB", str(path)],
                         capture_output=True, text=True, timeout=120, check=False)
    diagnostics = json.loads(out.stdout)["files"][0]["diagnostics"]
    refused = [d for d in diagnostics if d["code"] == "optimizer-impl" and d["severity"] == "error"]
    assert refused and "gradient_accumulation" in refused[0]["message"], diagnostics
    assert refused[0]["range"]["start"]["line"] == 11, refused[0]

"""Korthikanti et al. 2022 (Table 2) through configs a user writes (issue 19): the per-layer saved
activations `memfit check --format json` reports for a GPT-style model (a GPT-2 config.json with
the paper's sizes, 16-bit activations, eager attention, dropout on), as the difference between an
(n+1)-layer and an n-layer model, on one GPU and on a tensor-parallel rank (2, 4 and 8), within 5% of the
paper's per-layer formulas — no recomputation, selective recomputation and full recomputation."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction

import pytest
import yaml


def activations(tmp_path, layers: int, s: int, b: int, h: int, a: int, checkpointing: str, tensor: int, sp: bool, command: str = "check") -> dict:
    cfg = {"model_type": "gpt2", "n_embd": h, "n_head": a, "n_layer": layers, "n_positions": s, "vocab_size": 50257,
           "activation_function": "gelu", "use_cache": False, "attn_pdrop": 0.1, "resid_pdrop": 0.1, "embd_pdrop": 0.1}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    doc = {"memfit": 1, "device": {"memory": "100 TiB"}, "optimizer": "adamw", "dtypes": {"activations": "bfloat16"},
           "model": {"hf_config": "config.json"},
           "training": {"micro_batch": b, "seq_len": s, "attention": "eager", "checkpointing": checkpointing}}
    if tensor > 1:
        doc["parallel"] = {"tensor": tensor, "sequence_parallel": sp, "gpus_per_node": 8}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", command, "--format", "json", str(path)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    entry = json.loads(done.stdout)["files"][0]
    return entry if command == "explain" else entry["footprint"]["activations"]


TENSOR = [(1, False), (2, False), (2, True), (4, False), (4, True), (8, False), (8, True)]


def table2(s: int, b: int, h: int, a: int, t: int, sp: bool, checkpointing: str) -> Fraction:
    sbh = s * b * h
    table = {
        ("none", False): sbh * (10 + Fraction(24, t) + Fraction(5 * a * s, h * t)),
        ("none", True): sbh * (Fraction(34, t) + Fraction(5 * a * s, h * t)),
        ("selective", False): sbh * (10 + Fraction(24, t)),
        ("selective", True): sbh * Fraction(34, t),
        ("full", False): 2 * sbh,
        ("full", True): Fraction(2 * sbh, t),
    }
    return table[(checkpointing, sp)]


@pytest.mark.parametrize("s, b, h, a", [(2048, 4, 4096, 32), (1024, 2, 2048, 16)])
@pytest.mark.parametrize("t, sp", TENSOR)
@pytest.mark.parametrize("checkpointing", ["none", "selective", "full"])
def test_korthikanti_per_layer_through_a_config(tmp_path, s, b, h, a, t, sp, checkpointing):
    expected = table2(s, b, h, a, t, sp, checkpointing)
    per_layer = activations(tmp_path, 3, s, b, h, a, checkpointing, t, sp) - activations(tmp_path, 2, s, b, h, a, checkpointing, t, sp)
    assert abs(per_layer - expected) <= Fraction(5, 100) * expected, (per_layer, float(expected), per_layer / float(expected))


@pytest.mark.parametrize("t, sp", TENSOR)
@pytest.mark.parametrize("checkpointing", ["none", "selective", "full"])
def test_korthikanti_per_layer_in_the_ranks_program(tmp_path, t, sp, checkpointing):
    """`explain --format json`'s rows are the program the binding rank walks (ledger.ranks under tensor parallelism):
    what one of its layers keeps for backward (its rows' saved bytes: the layer's input included) is the rank's
    share of Table 2."""
    s, b, h, a = 1024, 2, 2048, 16
    expected = table2(s, b, h, a, t, sp, checkpointing)
    rows = activations(tmp_path, 3, s, b, h, a, checkpointing, t, sp, command="explain")["rows"]
    per_layer = sum(r["saved"] for r in rows if r["row"].startswith("layer 1 "))
    assert abs(per_layer - expected) <= Fraction(5, 100) * expected, (per_layer, float(expected), per_layer / float(expected))

"""Mixtures of experts through the CLI (shared by tests/models/test_moe_routing.py, tests/placement/test_expert_parallel.py
and tests/ledger/test_expert_all_to_all.py): a tiny Qwen3-MoE, the published Qwen3-30B-A3B config, `memfit check
--format json` on a config a user could write, and the closed forms the figures are compared with (written here from
the model's dimensions, not with memfit's own functions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QWEN3 = json.loads((ROOT / "examples" / "models" / "qwen3-30b-a3b.json").read_text())
TINY = {"model_type": "qwen3_moe", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "moe_intermediate_size": 24, "num_experts": 4,
        "num_experts_per_tok": 2}


def check(tmp_path, model: dict, training: str, parallel: str = "", precision: str = "32-true") -> dict:
    (tmp_path / "config.json").write_text(json.dumps(model))
    (tmp_path / "run.yaml").write_text(
        f"memfit: 1\ndevice: {{memory: 10 TiB}}\nprecision: {precision}\noptimizer: adamw\nmodel: {{hf_config: config.json}}\n"
        f"training: {{{training}}}\n{parallel}")
    out = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(tmp_path / "run.yaml")],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.stdout, out.stderr
    return json.loads(out.stdout)["files"][0]


def row_bytes(model: dict, width: int = 4) -> int:
    """What one routed (token, expert) row keeps in a Qwen3-MoE layer at fp32: the gathered token (h), gate_up
    (2·ie), act (ie), the down input (ie), the expert output (h), its routing weight, and three int64 indices
    (gather, permutation, inverse permutation)."""
    h, ie = model["hidden_size"], model["moe_intermediate_size"]
    return width * (h + 2 * ie + ie + ie + h + 1) + 3 * 8


def activations(entry: dict) -> int:
    assert not entry["diagnostics"], entry["diagnostics"]
    return entry["footprint"]["activations"]

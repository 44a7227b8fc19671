"""Every problem at once: a config with schema errors still gets the semantic diagnostics its valid parts
allow (unknown optimizer, unknown preset, bad layout), in one run, each at its node."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "examples" / "models" / "llama-3-8b.json"

# five independent problems, two the schema finds and three it cannot
FIVE = f"""memfit: 1
device:
  preset: A100
  reserve: 1 GiB
optimizer: adamw_torch_fused
dtypes: {{parameters: bfloat16, gradients: bfloat16, activations: bfloat16, optimizer_state: float32}}
model:
  hf_config: {MODEL}
training:
  micro_batch: eight
  seq_len: 4096
parallel:
  data: 8
  zero: 3
  fsdp: full_shard
gradient_checkpointing: true
"""


def memfit(*args):
    return subprocess.run([sys.executable, "-m", "memfit", *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def test_five_planted_problems_come_in_one_run(tmp_path):
    path = tmp_path / "five.yaml"
    path.write_text(FIVE, encoding="utf-8")
    done = memfit("check", "--format", "json", str(path))
    assert done.returncode == 1
    (entry,) = json.loads(done.stdout)["files"]
    found = [(d["code"], d["range"]["start"]["line"] + 1, d["range"]["start"]["character"] + 1) for d in entry["diagnostics"]]
    lines = FIVE.splitlines()

    def at(text: str, after: str | None = None) -> tuple[int, int]:
        """1-based line and column of `after` (or the text itself) on the line that has `text`."""
        number = next(i for i, line in enumerate(lines) if text in line)
        return number + 1, lines[number].index(after or text) + 1

    assert found == [
        ("unknown-preset", *at("preset: A100", "A100")),  # ambiguous: 40 or 80 GB
        ("unknown-optimizer", *at("optimizer: adamw_torch_fused", "adamw_torch_fused")),
        ("schema", *at("micro_batch: eight", "eight")),
        ("bad-parallel", *at("fsdp: full_shard")),  # zero and fsdp both set: on fsdp
        ("schema", *at("gradient_checkpointing")),
    ], found
    assert entry["footprint"] is None  # nothing about the footprint for a config the schema rejects


def test_a_problem_under_a_cut_node_is_not_reported_twice(tmp_path):
    """The layer list has a schema error: the model is cut out, and nothing is said about what was cut."""
    text = "memfit: 1\ndevice: {memory: 1 GiB}\noptimizer: adamz\nmodel:\n  input_shape: [4]\n  batch_size: 2\n  layers:\n    - {type: Dense, unit: 3}\n"
    path = tmp_path / "layers.yaml"
    path.write_text(text, encoding="utf-8")
    done = memfit("check", "--format", "json", str(path))
    codes = [d["code"] for d in json.loads(done.stdout)["files"][0]["diagnostics"]]
    assert codes.count("unknown-optimizer") == 1 and "schema" in codes
    assert "shape-mismatch" not in codes and "budget-exceeded" not in codes

"""`memfit fit --vary gpus` computes the model's tensors, the training step and its single-device walk once
per search and places each world size on them (check.pipeline.evaluate's memo; placement keeps the per-layer
expansion). Whatever it shares, each answer and each figure must be what `memfit check` says of that layout
in a fresh process: checked here against a loop over every size through `memfit check`, on configs where
what is shared could go wrong — a precision recipe that ZeRO changes (bf16-mixed is DeepSpeed's 16-bit mode
under ZeRO), LoRA, a config of declared tensors (new objects on every run) and a kept tensor-parallel size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SIZES = range(1, 17)
TINY = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 512,
}
RUN = {"micro_batch": 1, "seq_len": 64, "attention": "sdpa", "checkpointing": "none"}

CONFIGS = {
    "bf16-mixed": {"precision": "bf16-mixed", "optimizer": "adamw", "model": {"transformer": TINY}, "training": RUN, "parallel": {"gpus_per_node": 4}},
    "lora": {
        "optimizer": "adamw", "dtypes": {"parameters": "bfloat16", "gradients": "bfloat16", "activations": "bfloat16", "optimizer_state": "float32"},
        "model": {"transformer": TINY}, "training": RUN, "lora": {"r": 8, "target_modules": ["q_proj", "v_proj"]},
        "parallel": {"gpus_per_node": 4},
    },
    "declared": {
        "optimizer": "adam", "dtypes": {"parameters": "float32", "gradients": "float32", "activations": "float32", "optimizer_state": "float32"},
        "parameters": [{"name": "layers.*.w", "shape": [300, 300], "count": 6}, {"name": "embed.weight", "shape": [1000, 64]}],
        "activations": [{"name": "layers.*.saved", "shape": [4, 64, 300], "count": 6}],
        "parallel": {"gpus_per_node": 4},
    },
    "tensor-2": {"precision": "bf16-mixed", "optimizer": "adamw", "model": {"transformer": TINY}, "training": RUN, "parallel": {"tensor": 2, "gpus_per_node": 8}},
}


def memfit(*args):
    return subprocess.run([sys.executable, "-m", "memfit", *args], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def write(path: Path, base: dict, parallel: dict) -> Path:
    path.write_text(yaml.safe_dump({"memfit": 1, "name": path.stem, "device": {"memory": "1 TiB"}, **base, "parallel": parallel}), encoding="utf-8")
    return path


def gated(entry: dict) -> int:
    return entry["peak"]["bytes"] if entry.get("peak") else entry["footprint"]["total"]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_answers_and_figures_are_those_of_check_at_every_size(tmp_path, name):
    from memfit.whatif.gpus import STRATEGIES

    base = CONFIGS[name]
    kept = {k: v for k, v in base["parallel"].items() if k not in ("zero", "fsdp", "offload", "data")}
    # a budget: what ZeRO-3 needs per GPU at 6 data ranks or ZeRO-2 at 12, the larger, so that answers of at
    # least two strategies fall inside the loop
    needs = []
    for keys in ({"zero": 3, "data": 6}, {"zero": 2, "data": 12}):
        (entry,) = json.loads(memfit("check", "--format", "json", str(write(tmp_path / "budget.yaml", base, {**kept, **keys}))).stdout)["files"]
        needs.append(gated(entry))
    budget = f"{max(needs)}B"
    config = write(tmp_path / "config.yaml", base, kept)
    done = memfit("fit", "--vary", "gpus", "--format", "json", "--budget", budget, str(config))
    assert done.returncode in (0, 1), done.stderr
    (found,) = json.loads(done.stdout)["files"]
    rows = {row["strategy"]: row for row in found["strategies"]}

    files = {}
    for index, (strategy, keys) in enumerate(STRATEGIES):
        for size in SIZES:
            path = write(tmp_path / f"s{index}-d{size}.yaml", base, {**kept, **keys, "data": size})
            files[str(path)] = (strategy, size)
    checked = json.loads(memfit("check", "--format", "json", "--budget", budget, *files).stdout)["files"]
    results = {files[e["path"]]: e for e in checked}
    answered = 0
    for strategy, _ in STRATEGIES:
        row = rows[strategy]
        runs = {size: results[(strategy, size)] for size in SIZES}
        passing = [s for s, e in runs.items() if not any(d["severity"] == "error" for d in e["diagnostics"])]
        if row["data"] is None or row["data"] > SIZES[-1]:
            assert not passing, (strategy, row["data"], passing)
            continue
        brute = passing[0]
        assert row["data"] == brute, (strategy, row["data"], brute)
        # the figure the table shows is the one a fresh `memfit check` computes for that layout
        assert row["peak"] == gated(runs[brute]), (strategy, row["peak"], gated(runs[brute]))
        answered += brute > 1
    assert answered >= 2, rows  # answers past 1 GPU to compare, not only "1" and "none"

"""A vision-language model under `parallel.tensor` (issue 31): the per-rank saved activations of the footprint
(models.hf_sharded.activations_per_stage) are what the rank's own program keeps, through `memfit check --format
json` on config files: the language model split per rank, the vision tower and projector (or merger) beside it on
the first stage, as the rank's walk holds them. Without checkpointing every saved tensor is alive at the end of the
forward, so the footprint's activations equal the walked peak's; before, the footprint left the vision tower out
(Qwen2-VL-2B at tensor 2: 22,373,892,100 B against the walk's 60,067,285,508 B)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

MODELS = Path(__file__).resolve().parents[2] / "examples" / "models"
CASES = {
    "llava": ("llava-1.5-7b.json", {"freeze_vision_tower": True}),
    "qwen2_vl": ("qwen2-vl-2b-instruct.json", {"image_size": [720, 1280]}),
}


def _doc(config: str, training: dict, tensor: int | None) -> dict:
    doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "precision": "bf16-mixed", "optimizer": "adamw",
           "model": {"hf_config": str(MODELS / config)},
           "training": {"micro_batch": 4, "seq_len": 2048, "images_per_sample": 1, "attention": "sdpa", "checkpointing": "none", **training}}
    if tensor is not None:
        doc["parallel"] = {"tensor": tensor}
    return doc


@pytest.mark.parametrize("family", sorted(CASES))
def test_a_vlms_per_rank_activations_are_its_programs(tmp_path, family):
    config, training = CASES[family]
    paths = []
    for tensor in (None, 2):
        path = tmp_path / f"{family}-{tensor}.yaml"
        path.write_text(yaml.safe_dump(_doc(config, training, tensor), sort_keys=False))
        paths.append(str(path))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", *paths], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    one, split = json.loads(done.stdout)["files"]
    assert split["peak"]["phase"] != "optimizer_step", family  # (a peak with the saved tensors alive)
    assert split["footprint"]["activations"] == split["peak"]["live"]["activations"], family
    # the rank keeps less than one GPU (the language model's heads and MLP width split), never nothing of the tower
    assert 0 < split["footprint"]["activations"] < one["footprint"]["activations"], family

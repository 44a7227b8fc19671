"""PyTorch DDP's gradient buckets (issue 33), measured: DistributedDataParallel's reducer allocates one flat tensor per
bucket at its construction (torch/csrc/distributed/c10d/reducer.cpp initialize_buckets) and keeps them, a second copy
of the trainable parameters' gradients unless `gradient_as_bucket_view=True` makes the gradients views of them.
Two ranks on gloo (tests/support/ddp_worker.py: a tiny Llama under DDP, AdamW, MemTracker around a warm step, the
buckets given to it as the reducer's own tensors) against `memfit check --format json` on a memfit config naming
`parallel.data: 2` (and `parallel.gradient_as_bucket_view`), within 5%: one case whose peak is in backward (the
buckets beside the activations), one whose peak is the optimizer step (the buckets beside the gradients)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parents[1] / "support"
sys.path.insert(0, str(HERE))
import needs  # noqa: E402

BAND = 0.05
MODEL = {"model_type": "llama", "vocab_size": 250, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 128, "attention_dropout": 0.0,
         "tie_word_embeddings": False, "use_cache": False}


def measured(tmp_path, micro_batch: int, seq_len: int, views: bool) -> list:
    needs.module("torch")
    needs.module("transformers")
    case = {"model": MODEL, "micro_batch": micro_batch, "seq_len": seq_len, "gradient_as_bucket_view": views}
    spec, out = tmp_path / "case.json", tmp_path / "ranks.json"
    spec.write_text(json.dumps(case))
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, str(HERE / "ddp_worker.py"), "2", str(out), str(spec)], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def checked(tmp_path, micro_batch: int, seq_len: int, parallel: dict | None) -> dict:
    (tmp_path / "config.json").write_text(json.dumps(MODEL))
    doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "optimizer": "adamw", "model": {"hf_config": "config.json"},
           "training": {"micro_batch": micro_batch, "seq_len": seq_len, "attention": "sdpa", "optimizer_impl": "foreach"}}
    if parallel is not None:
        doc["parallel"] = parallel
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["files"][0]["peak"]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("micro_batch, seq_len, views", [(2, 64, False), (1, 8, False), (1, 8, True)])
def test_ddp_ranks_within_five_percent_of_memtracker(tmp_path, micro_batch, seq_len, views):
    theirs = measured(tmp_path, micro_batch, seq_len, views)
    ours = checked(tmp_path, micro_batch, seq_len, {"data": 2, "gradient_as_bucket_view": views})
    single = checked(tmp_path, micro_batch, seq_len, None)
    assert len(theirs) == 2
    for report in theirs:
        assert report["buckets"] == report["gradients"]  # the reducer's buckets hold every trainable gradient once
        assert abs(ours["bytes"] - report["bytes"]) <= BAND * report["bytes"], (report["rank"], ours["bytes"], report["bytes"], ours["bytes"] / report["bytes"])
        if not views:  # without the buckets (one GPU's figure) memfit would be more than 5% low: the buckets are what is counted
            assert report["bytes"] - single["bytes"] > BAND * report["bytes"], (single["bytes"], report["bytes"])
    if views:  # the gradients are the buckets: one copy, the figure of the same run without views less the buckets
        assert ours["bytes"] == checked(tmp_path, micro_batch, seq_len, {"data": 2})["bytes"] - theirs[0]["buckets"]

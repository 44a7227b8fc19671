"""A checkpointed layer's own forward moment (models/hf_nograd.py checkpointed_flights), measured without FSDP.

torch.utils.checkpoint's non-reentrant forward (transformers' default) saves nothing for the backward, so a
checkpointed layer's tensors are freed as soon as no Python name holds them, and its MLP part's worst moment is its
product (act_fn(gate) * up made, beside the part's input and the norm's output) or, where autocast caches no weight
cast, its up projection's call. memfit priced a checkpointed part as its output written: the tiny Llama's last layer
in fp32 712,000 B against MemTracker's 798,272 B, the forward's worst moment 761,408 B (its head's) against 798,272
B (0.954). Now within 256 B of both, under: the position ids (modeling_llama.py LlamaModel.forward, `torch.arange`
(1, s) int64, held through the model's forward), which memfit counts in no run. Under bf16 autocast (the weight
casts cached) the layer's moment 982,336 -> 1,011,008 B against 1,011,264 B; the forward's worst is the head's.

The reference: tests/support/checkpointed_forward_worker.py, a warm step of the real run under MemTracker (the same
tiny Llama as tests/ledger/test_fsdp_cast_cache.py, one process, no FSDP), the forward's worst moment by module."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import needs
import pytest
import yaml

needs.module("torch")
needs.module("transformers")

import fsdp1_cast_worker as worker  # noqa: E402

HERE = os.path.dirname(os.path.abspath(worker.__file__))
BAND = 0.005   # memfit within this fraction of MemTracker's (256 B under here); a layer's output is 16,384 B


def _run(tmp_path, precision: str) -> dict:
    out = tmp_path / f"real-{precision}.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, os.path.join(HERE, "checkpointed_forward_worker.py"), str(out), precision],
                          capture_output=True, text=True, timeout=300, check=False, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(out.read_text())


def _memfit(tmp_path, precision: str) -> list:
    (tmp_path / "config.json").write_text(json.dumps(worker.config()))
    doc = {"memfit": 1, "device": {"memory": "1 TiB", "type": "cpu"}, "model": {"hf_config": "config.json"},
           "precision": precision, "optimizer": "sgd",
           "training": {"micro_batch": worker.MICRO_BATCH, "seq_len": worker.SEQ_LEN, "attention": "sdpa",
                        "checkpointing": "full", "optimizer_impl": "for_loop"}}
    path = tmp_path / f"run-{precision}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "explain", "--format", "json", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["files"][0]["timeline"]


def _within(ours: int, theirs: int, label: str) -> None:
    assert abs(ours - theirs) <= BAND * theirs, f"{label}: memfit {ours:,} against MemTracker's {theirs:,}"


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_checkpointed_layer_forward_moment(precision, tmp_path):
    real, timeline = _run(tmp_path, precision), _memfit(tmp_path, precision)
    last = f"model.layers.{worker.LAYERS - 1}"
    theirs = max(b for m, b in real["by_module"].items() if m == last or m.startswith(last + "."))
    moment = max(e["bytes"] for e in timeline if e["module"] == last and e["phase"] == "forward")
    forward = max(e["bytes"] for e in timeline if e["phase"] == "forward")
    print(f"{precision}: {last}'s forward memfit {moment:,} / MemTracker {theirs:,}; forward {forward:,} / "
          f"{real['peaks']['forward']:,}")
    _within(moment, theirs, f"{last}'s forward")
    _within(forward, real["peaks"]["forward"], "the forward")

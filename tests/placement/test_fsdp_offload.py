"""FSDP2 with CPU parameter offload, measured (issue 31): what one GPU holds does not grow with the GPUs.

tests/support/fsdp_offload_worker.py runs one warm step of a tiny Llama, every decoder layer and the model
`fully_shard`ed with CPUOffloadPolicy, on gloo at 1, 2 and 4 ranks, under torch's FSDPMemTracker. On the CPU host
and device are one memory, so the per-GPU figure is every live byte except what the offload policy keeps on the
host (the sharded parameters, the sharded gradients, the optimizer state; the optimizer step runs on the host),
at its largest over forward and backward. memfit's figure is `memfit check --format json`'s per-GPU peak on the
same run written as a config file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import needs
import pytest
import yaml

needs.module("torch")
needs.module("transformers")
import hf_measure  # noqa: E402

HERE = Path(__file__).resolve().parents[1] / "support"
BAND = 0.05
WORLDS = (1, 2, 4)
CHECKPOINTING = ("none", "full")
# FSDP2 at world size 1 runs no all-gather (_fsdp_param_group.py `unshard` returns before one, `wait_for_unshard`
# copies the sharded parameters straight into the unsharded ones), so it holds no all-gather output: from 2 ranks the
# last unit's (135,680 B here) is live through the forward and the unit prefetched beside the running one in
# backward. Measured 868,424 B at 1 rank, 1,004,104 B at 2 and 4 (no checkpointing), 740,680 B and 757,064 B (full);
# memfit 869,440 B, 1,005,120 B, 741,440 B and 757,824 B (1.001 each). Before memfit walked FSDP2's units (one
# figure at every size, 1,033,984 B without checkpointing) 1 rank was a strict xfail at 1.191.
# (gaps measured and open, as strict xfails with their numbers: none)
GAPS: dict = {}


def config() -> dict:
    return hf_measure.without_attention_dropout(hf_measure.tiny("llama"))


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp_offload")
    (tmp / "config.json").write_text(json.dumps(config()))
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    out = {}
    for world in WORLDS:
        path = tmp / f"out{world}.json"
        proc = subprocess.run([sys.executable, str(HERE / "fsdp_offload_worker.py"), str(world), str(path), str(tmp / "config.json"), *CHECKPOINTING],
                              capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        for per_rank in json.loads(path.read_text()):
            for report in per_rank:
                key = (world, report["checkpointing"])
                out[key] = max(out.get(key, 0), report["device_peak"])  # the most-loaded rank
    return tmp, out


def memfit_peak(tmp: Path, world: int, checkpointing: str) -> int:
    doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "host": {"memory": "1 TiB"}, "precision": "32-true", "optimizer": "adamw",
           "model": {"hf_config": "config.json"},
           "training": {"micro_batch": 2, "seq_len": 32, "attention": "sdpa", "checkpointing": checkpointing, "optimizer_impl": "foreach"},
           "parallel": {"data": world, "fsdp": "full_shard", "gpus_per_node": 8, "offload": {"parameters": "cpu", "optimizer": "cpu"}}}
    path = tmp / f"run-{world}-{checkpointing}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["files"][0]["peak"]["bytes"]


CASES = [pytest.param(w, c, id=f"{w}-ranks-{c}", marks=[pytest.mark.xfail(strict=True, reason=GAPS[(w, c)])] if (w, c) in GAPS else [])
         for w in WORLDS for c in CHECKPOINTING]


@pytest.mark.parametrize("world,checkpointing", CASES)
def test_fsdp2_cpu_offload_per_gpu_peak_matches_memtracker(world, checkpointing, measured):
    tmp, figures = measured
    theirs = figures[(world, checkpointing)]
    ours = memfit_peak(tmp, world, checkpointing)
    assert abs(ours - theirs) <= BAND * theirs, (ours, theirs, ours / theirs)


def test_fsdp2_cpu_offload_per_gpu_peak_does_not_grow_past_two_ranks(measured):
    """The framework itself: from 2 ranks on, a GPU's figure does not grow with the ranks (what memfit holds), within
    the band: on a loaded machine gloo's asynchronous all-gather can overlap one more unit with the step (measured
    once, in the whole suite: 1,053,768 B at 4 ranks against 1,004,104 B at 2; run alone, no more at 4 than at 2)."""
    _, figures = measured
    for checkpointing in CHECKPOINTING:
        assert figures[(4, checkpointing)] <= (1 + BAND) * figures[(2, checkpointing)], (checkpointing, figures)


# --- 8 ranks on this machine: one rank of the world on fake tensors (torchtitan's memory estimator) ----------------
# tests/support/fsdp_fake_worker.py runs the same step as rank 0 of WORLD in one process (FakeTensorMode, the "fake"
# backend on torch's FakeStore, FSDPMemTracker). Checked against the gloo run first, at 2 and 4 ranks: without
# checkpointing the same bytes to the byte (1,004,104 B, every tracker category equal); under full checkpointing the
# fake rank holds 26,624 B more at its peak (783,688 B against 757,064 B measured, 1.035: 2,048 B of activations and
# 24,576 B of temporaries more in the recomputation on fake tensors), within the band. Then it stands in for 8 ranks.
FAKE_WORLDS = (2, 4, 8)


@pytest.fixture(scope="module")
def faked(measured):
    tmp, _ = measured
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    out = {}
    for world in FAKE_WORLDS:
        path = tmp / f"fake{world}.json"
        proc = subprocess.run([sys.executable, str(HERE / "fsdp_fake_worker.py"), str(world), str(path), str(tmp / "config.json"), *CHECKPOINTING],
                              capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (reports,) = json.loads(path.read_text())
        for report in reports:
            out[(world, report["checkpointing"])] = report["device_peak"]
    return out


@pytest.mark.parametrize("world", (2, 4))
def test_one_fake_rank_agrees_with_the_gloo_run(world, measured, faked):
    _, figures = measured
    # (the real gloo run is not the same from run to run: at 2 ranks without checkpointing it measured 1,004,104 B in
    # three runs and 1,053,768 B in a fourth, where the fake rank gives 1,004,104 each time: a band, not equality)
    plain = figures[(world, "none")]
    assert abs(faked[(world, "none")] - plain) <= BAND * plain, (faked[(world, "none")], plain)
    theirs = figures[(world, "full")]
    assert abs(faked[(world, "full")] - theirs) <= BAND * theirs, (faked[(world, "full")], theirs)


@pytest.mark.parametrize("checkpointing", CHECKPOINTING)
def test_fsdp2_cpu_offload_per_gpu_peak_at_8_ranks_matches_the_fake_rank(checkpointing, measured, faked):
    tmp, _ = measured
    theirs = faked[(8, checkpointing)]
    ours = memfit_peak(tmp, 8, checkpointing)
    assert abs(ours - theirs) <= BAND * theirs, (ours, theirs, ours / theirs)

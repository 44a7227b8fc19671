"""Autocast's cast cache under FSDP1 (`parallel: {fsdp: ...}`), measured: FSDP1's forward sets each module's
parameters to plain views of the unsharded flat parameter (torch/distributed/fsdp/_flat_param.py,
FlatParamHandle._use_unsharded_views(as_params=False), with use_orig_params and without), and autocast's cached_cast
caches only a leaf that is no view (aten/src/ATen/autocast_mode.cpp `can_try_cache`), so the checkpointed layers'
weight casts are not held to the forward's end there (ledger/training.py _layer_rows `cached`, Row.cast_cached).

The reference: MemTracker around a warm step of the real FSDP1 run (2 gloo ranks on CPU, tiny Llama full fine-tune,
bf16 CPU autocast, transformers' gradient checkpointing; tests/support/fsdp1_cast_worker.py), with autocast's cache
on and off: the forward's peak is the same (the cache holds nothing). memfit's forward worst moment (`memfit explain
--format json`'s timeline, on the config file) may sit above MemTracker's for what its FSDP model gathers, but by
less than the casts a cache would hold (2 bytes per checkpointed linear weight element, counted on the real model).
Before: memfit's forward 1,072,832 against MemTracker's 660,672 (412,160 above, casts 270,336); after: 802,496.
"""

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

WORKER = os.path.join(os.path.dirname(os.path.abspath(worker.__file__)), "fsdp1_cast_worker.py")
WORLD = 2


def _run(tmp_path, orig: bool, cache: bool) -> dict:
    out = tmp_path / f"fsdp1-{int(orig)}-{int(cache)}.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, WORKER, str(WORLD), str(out), "1", str(int(orig)), str(int(cache))],
                          capture_output=True, text=True, timeout=300, check=False, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(out.read_text())[0]


def _memfit_forward(tmp_path) -> int:
    (tmp_path / "config.json").write_text(json.dumps(worker.config()))
    doc = {"memfit": 1, "device": {"memory": "1 TiB", "type": "cpu"}, "model": {"hf_config": "config.json"},
           "precision": "bf16-mixed", "optimizer": "sgd",
           "training": {"micro_batch": worker.MICRO_BATCH, "seq_len": worker.SEQ_LEN, "attention": "sdpa",
                        "checkpointing": "full", "optimizer_impl": "for_loop"},
           "parallel": {"data": WORLD, "fsdp": "full_shard"}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "explain", "--format", "json", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    timeline = json.loads(done.stdout)["files"][0]["timeline"]
    return max(e["bytes"] for e in timeline if e["phase"] == "forward")


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("use_orig_params", [True, False])
def test_fsdp1_forward_holds_no_cast_cache(use_orig_params, tmp_path):
    cached, uncached = _run(tmp_path, use_orig_params, True), _run(tmp_path, use_orig_params, False)
    # the real run: autocast's cache holds nothing under FSDP1 (the same forward peak with it off)
    assert cached["peaks"]["forward"] == uncached["peaks"]["forward"], (cached, uncached)
    ours = _memfit_forward(tmp_path)
    theirs = cached["peaks"]["forward"]
    print(f"FSDP1 use_orig_params={use_orig_params}: memfit forward {ours:,} / MemTracker {theirs:,} "
          f"(casts a cache would hold {cached['casts']:,})")
    assert ours >= theirs, f"forward {ours:,} below MemTracker's {theirs:,}"
    assert ours - theirs < cached["casts"], \
        f"forward {ours:,} above MemTracker's {theirs:,} by {ours - theirs:,}: the cast cache ({cached['casts']:,}) counted"

"""Every data-parallel rank walks its own program (issue 31), through `memfit check --format json` on config files a
user writes: Llama-3-8B (Meta's config.json, examples/models/llama-3-8b.json), bf16-mixed, AdamW, one 2,048-token
sequence. Under DDP, ZeRO 1/2/3 and FSDP a rank runs the one-device program (the techniques applied: activation
offloading, kept gradients, ...) with its shares of the parameters, gradients and optimizer state beside it, the
unit it gathers (ZeRO-3, FSDP) and DDP's reducer buckets; the per-GPU peak is that walk's worst instant, so what a
technique does to the program reaches it.

What the frameworks do, read from their sources:
- activation offloading moves the saved activations to the host under any layout: every rank's peak drops;
- kept gradients (zero_grad(set_to_none=False)): FSDP2's sharded gradients are the parameters' `.grad`, so they stay
  allocated from the next step's first instant and the peak rises; DeepSpeed ZeRO-3 frees every 16-bit `.grad` itself
  right after reducing it into its partition (deepspeed 0.19 runtime/zero/stage3.py `partition_grads`:
  `param.grad = None`) and its partitions are one flat buffer allocated once (`grad_partitions_flat_buffer`), held
  whatever zero_grad does: the peak does not move;
- one GPU (`data: 1`) runs the one-device step: the figure is the one-device walk's, to the byte; DDP on more holds
  its reducer's buckets beside it from construction (torch/csrc/distributed/c10d/reducer.cpp initialize_buckets).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

LLAMA = Path(__file__).resolve().parents[2] / "examples" / "models" / "llama-3-8b.json"


def doc(parallel: dict | None = None, **training) -> dict:
    out = {"memfit": 1, "device": {"name": "H100", "memory": "80 GB"}, "precision": "bf16-mixed", "optimizer": "adamw",
           "model": {"hf_config": str(LLAMA)}, "training": {"micro_batch": 1, "seq_len": 2048, **training}}
    if parallel is not None:
        out["parallel"] = parallel
    return out


def peaks(tmp_path, docs: dict, footprints: dict | None = None) -> dict:
    """name -> the per-GPU peak ({"bytes", "phase", "live", ...}) of each config, in one `memfit check` run (and the
    per-GPU footprint into `footprints`)."""
    paths = {}
    for name, d in docs.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(d, sort_keys=False))
        paths[str(path)] = name
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", *paths], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    out = {}
    for entry in json.loads(done.stdout)["files"]:
        assert not [d for d in entry["diagnostics"] if d["severity"] == "error" and d["code"] != "budget-exceeded"], entry["diagnostics"]
        out[paths[entry["path"]]] = entry["peak"]
        if footprints is not None:
            footprints[paths[entry["path"]]] = entry["footprint"]
    return out


ZERO3 = {"data": 8, "zero": 3}
LAYOUTS = {"zero3": ZERO3, "zero3-offload": {"data": 8, "zero": 3, "offload": {"optimizer": "cpu", "parameters": "cpu"}},
           "zero2": {"data": 8, "zero": 2}, "fsdp": {"data": 8, "fsdp": "full_shard"},
           "fsdp-offload": {"data": 8, "fsdp": "full_shard", "offload": {"optimizer": "cpu", "parameters": "cpu"}}}


def test_activation_offloading_lowers_every_sharded_layouts_per_gpu_peak(tmp_path):
    docs = {}
    for name, layout in LAYOUTS.items():
        docs[f"{name}-kept"] = doc(layout)
        docs[f"{name}-offloaded"] = doc(layout, activation_offloading=True)
    found = peaks(tmp_path, docs)
    for name in LAYOUTS:
        kept, offloaded = found[f"{name}-kept"], found[f"{name}-offloaded"]
        assert offloaded["bytes"] < kept["bytes"], (name, offloaded["bytes"], kept["bytes"])
        assert offloaded["live"]["activations"] < kept["live"]["activations"], name
    # the reproducer: ZeRO-3 on 8 GPUs was 21,346,029,060 B (seq_len 2,048 here: 34,975,909,388 B) with and without
    # offloading; what leaves the GPU is the saved activations, the shares beside them stay
    kept, offloaded = found["zero3-kept"], found["zero3-offloaded"]
    for category in ("parameters", "gradients", "optimizer_state"):
        assert kept["live"][category] == offloaded["live"][category], category


def test_kept_gradients_raise_fsdp_and_leave_zero3_as_it_is(tmp_path):
    docs = {}
    for name in ("zero3", "fsdp", "fsdp-offload"):
        docs[f"{name}-freed"] = doc(LAYOUTS[name])
        docs[f"{name}-kept"] = doc(LAYOUTS[name], keep_gradients=True)
    found = peaks(tmp_path, docs)
    # FSDP2: the rank's sharded gradients exist from the first instant; at its peak it holds all of them
    fsdp_freed, fsdp_kept = found["fsdp-freed"], found["fsdp-kept"]
    assert fsdp_kept["bytes"] > fsdp_freed["bytes"]
    assert fsdp_kept["live"]["gradients"] > fsdp_freed["live"]["gradients"]
    # with the parameters, gradients and optimizer offloaded the gradients are on the host: nothing to keep on the GPU
    assert found["fsdp-offload-kept"]["bytes"] == found["fsdp-offload-freed"]["bytes"]
    # DeepSpeed ZeRO-3: its gradient partitions are held the whole step either way
    assert found["zero3-kept"]["bytes"] == found["zero3-freed"]["bytes"]


def test_one_gpu_is_the_one_device_walk(tmp_path):
    docs = {}
    techniques = {"plain": {}, "offloaded": {"activation_offloading": True}, "kept": {"keep_gradients": True},
                  "checkpointed": {"checkpointing": "full"}}
    for name, training in techniques.items():
        docs[f"{name}-one"] = doc(None, **training)
        docs[f"{name}-data1"] = doc({"data": 1}, **training)
        docs[f"{name}-views"] = doc({"data": 2, "gradient_as_bucket_view": True}, **training)
        docs[f"{name}-ddp"] = doc({"data": 2}, **training)
    footprints: dict = {}
    found = peaks(tmp_path, docs, footprints)
    for name in techniques:
        one = found[f"{name}-one"]
        assert found[f"{name}-data1"]["bytes"] == one["bytes"], name
        # DDP on 2 GPUs: the one-device program beside the reducer's buckets, allocated at construction, the size of
        # every gradient (the footprint's): a second copy of them at every instant, or, with gradient_as_bucket_view,
        # the gradients themselves (every gradient's bytes from the first instant)
        buckets = footprints[f"{name}-ddp"]["gradients"]
        assert found[f"{name}-ddp"]["bytes"] == one["bytes"] + buckets, name
        assert one["bytes"] <= found[f"{name}-views"]["bytes"] < found[f"{name}-ddp"]["bytes"], name

"""Activation offloading's host side: the saved activations OffloadActivations copies to host memory appear in the
host figure per node (`check --format json`'s host.activations and total, `explain`'s host line); host.memory gates
them (host-budget-exceeded at that key). Against the port of that class (tests/support/offload_reference.py), whose
pack_tensor copies a storage once per op that saves it and copies the weights' transposed views too, memfit's figure
(each saved storage once) is the least the host holds: measured, tiny 4-layer Llama, bf16, 2 x 128 tokens: no
checkpointing 2,493,440 B of 3,944,448 (0.63), full checkpointing 240,640 of 299,008 (0.80)."""

from __future__ import annotations

import json
import subprocess
import sys

import needs
import pytest
import yaml

needs.module("torch")
needs.module("transformers")

from test_activation_offloading import _measure  # noqa: E402
from test_peak_transformers import hf_tiny  # noqa: E402


def _config(tmp_path, cfg: dict, precision: str, checkpointing: str, host: str | None = None):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "optimizer": "adamw", "model": {"hf_config": "config.json"},
           "precision": precision,
           "training": {"micro_batch": 2, "seq_len": 128, "checkpointing": checkpointing, "optimizer_impl": "foreach",
                        "attention": "sdpa", "activation_offloading": True}}
    if host:
        doc["host"] = {"memory": host}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _memfit(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memfit", *map(str, args)], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_offloaded_activations_are_on_the_host(tmp_path, checkpointing):
    cfg = {**hf_tiny("llama"), "num_hidden_layers": 4}
    _, measured = _measure(cfg, 2, 128, checkpointing, "bf16-true", offload=True)
    path = _config(tmp_path, cfg, "bf16-true", checkpointing)
    done = _memfit("check", "--format", "json", path)
    assert done.returncode == 0, done.stdout + done.stderr
    host = json.loads(done.stdout)["files"][0]["host"]
    assert host["gpus"] == 1 and host["total"] == host["activations"]
    # each storage once: never above what the class copies
    assert 0 < host["activations"] <= measured, (host["activations"], measured)
    text = _memfit("explain", path).stdout
    assert f"host memory per node (1 GPUs offloading): {host['total']:,} B" in text
    assert any(line.split()[:2] == ["activations", f"{host['activations']:,}"] for line in text.splitlines())


def test_host_memory_gates_the_offloaded_activations(tmp_path):
    cfg = {**hf_tiny("llama"), "num_hidden_layers": 4}
    path = _config(tmp_path, cfg, "bf16-true", "none", host="100 KiB")
    done = _memfit("check", "--format", "json", path)
    entry = json.loads(done.stdout)["files"][0]
    over = [d for d in entry["diagnostics"] if d["code"] == "host-budget-exceeded"]
    assert done.returncode == 1 and over, entry["diagnostics"]
    assert over[0]["range"]["start"]["line"] == yaml.safe_dump(yaml.safe_load(path.read_text()), sort_keys=False).splitlines().index("host:") + 1
    roomy = _config(tmp_path, cfg, "bf16-true", "none", host="1 GiB")
    assert _memfit("check", roomy).returncode == 0

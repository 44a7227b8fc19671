"""torchtune's shipped configs with `loss: LinearCrossEntropyLoss` (the loss of 162 of torchtune main's configs)
through the CLI: the reader maps it to `training.loss: {kind: linear, chunks: <num_output_chunks, default 8>}`
(ledger/techniques/chunked_loss.py, measured against the class's code in tests/ledger/test_chunked_loss.py) with no
not-modelled warning for the loss (a note that every token counts as labelled: an upper bound), and the figure is the chunked one: below the same config with its logits whole
by at least the whole logits in the model's dtype (which the loss never makes).

The configs are torchtune's, verbatim, in tests/read/torchtune_configs/: recipes/configs/llama3_1/8B_full_single_device.yaml,
llama3_2/3B_full_single_device.yaml (a tied head) and gemma2/2B_lora_single_device.yaml (a frozen tied head, 256,000
tokens) at pytorch/torchtune bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

CONFIGS = Path(__file__).resolve().parent / "torchtune_configs"
SHIPPED = ["llama3_1_8B_full_single_device.yaml", "llama3_2_3B_full_single_device.yaml", "gemma2_2B_lora_single_device.yaml"]


def memfit(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memfit", *map(str, args)], capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_linear_cross_entropy_configs_get_the_chunked_figure(tmp_path, name):
    source = CONFIGS / name
    assert "torchtune.modules.loss.LinearCrossEntropyLoss" in source.read_text()
    converted = memfit("convert", source)
    assert converted.returncode == 0, converted.stderr
    config = yaml.safe_load(converted.stdout)
    assert config["training"]["loss"] == {"kind": "linear", "chunks": 8}, config["training"]
    native = json.loads(memfit("check", "--format", "json", "--budget", "1TiB", source).stdout)["files"][0]
    assert not [d for d in native["diagnostics"] if "loss" in d["message"] and d["severity"] != "information"], native["diagnostics"]
    # a note at loss._component_ (where training.loss comes from): the labels are not read, the figure a bound
    (note,) = [d for d in native["diagnostics"] if "training.loss kind linear" in d["message"]]
    assert note["severity"] == "information" and "upper bound" in note["message"]
    line = next(n for n, text in enumerate(source.read_text().splitlines()) if "LinearCrossEntropyLoss" in text)
    assert note["range"]["start"]["line"] == line, (note["range"], line)
    # the memfit config it means gives the same figure; without the loss (transformers' whole logits) a larger one
    (tmp_path / "linear.yaml").write_text(converted.stdout)
    del config["training"]["loss"]
    (tmp_path / "whole.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    files = {Path(f["path"]).stem: f for f in json.loads(memfit("check", "--format", "json", "--budget", "1TiB", tmp_path / "linear.yaml",
                                                                 tmp_path / "whole.yaml").stdout)["files"]}
    assert files["linear"]["peak"]["bytes"] == native["peak"]["bytes"]
    run, shape = config["training"], config["model"]["transformer"]
    logits = run["micro_batch"] * run["seq_len"] * shape["vocab_size"] * 2   # bf16, as these configs' dtype
    assert config["precision"] == "bf16-true"
    assert files["whole"]["peak"]["bytes"] - native["peak"]["bytes"] >= logits, (files["whole"]["peak"]["bytes"], native["peak"]["bytes"], logits)


def test_a_linear_loss_with_a_teacher_is_refused(tmp_path):
    """torchtune main's KD recipes (recipes/knowledge_distillation_single_device.py lines 282-293 at bd2a0fc7) set
    chunks for CEWithChunkedOutputLoss and otherwise never call set_model_output, so LinearCrossEntropyLoss's forward
    raises on the student's logits: an error at the loss, not a figure (the shipped KD config with its loss edited)."""
    text = (CONFIGS / "llama3_2_8B_to_1B_KD_lora_single_device.yaml").read_text()
    edited, count = re.subn(r"(?m)^(  _component_: torchtune\.modules\.loss\.)CEWithChunkedOutputLoss$", r"\1LinearCrossEntropyLoss", text)
    assert count == 1
    path = tmp_path / "KD_lora_single_device.yaml"
    path.write_text(edited)
    (entry,) = json.loads(memfit("check", "--format", "json", "--budget", "1TiB", path).stdout)["files"]
    (error,) = [d for d in entry["diagnostics"] if d["severity"] == "error"]
    assert "training.teacher" in error["message"] and "LinearCrossEntropyLoss never makes" in error["message"], error
    line = next(n for n, line in enumerate(edited.splitlines()) if "LinearCrossEntropyLoss" in line)
    assert error["range"]["start"]["line"] == line

"""The native spellings of the adapters' dtype and DoRA (issue 32): each reader sets lora.dtype /
lora.autocast_adapter_dtype / lora.use_dora, `memfit convert` writes them, and the figures are the converted file's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "examples" / "models"
# Llama-3-8B (examples/models/llama-3-8b.json): all-linear at rank r trains r x (in + out) per linear, and DoRA one
# magnitude per output row: q, o 4096 -> 4096; k, v 4096 -> 1024; gate, up 4096 -> 14336; down 14336 -> 4096
LINEARS = [(4096, 4096), (4096, 1024), (4096, 1024), (4096, 4096), (4096, 14336), (4096, 14336), (14336, 4096)]


def adapter_elements(rank: int, dora: bool) -> int:
    return 32 * sum(rank * (i + o) + (o if dora else 0) for i, o in LINEARS)


def memfit(*args):
    return subprocess.run([sys.executable, "-m", "memfit", *map(str, args)], check=False, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ))


def converted_and_figures(native: Path) -> tuple[dict, dict]:
    out = memfit("convert", native)
    assert out.returncode == 0, out.stderr
    doc = yaml.safe_load(out.stdout)
    target = native.with_name(native.stem + ".memfit.yaml")
    target.write_text(out.stdout)
    figures = []
    for path in (native, target):
        done = memfit("check", "--format", "json", path)
        assert done.returncode in (0, 1), done.stderr
        figures.append(json.loads(done.stdout)["files"][0])
    assert figures[0]["footprint"] == figures[1]["footprint"]
    return doc, figures[0]["footprint"]


@pytest.fixture
def model(tmp_path):
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    return tmp_path / "llama-3-8b.json"


AXOLOTL = ("base_model: ./llama-3-8b.json\nadapter: lora\nlora_r: 16\nlora_alpha: 32\nlora_target_linear: true\n"
           "sequence_len: 1024\nmicro_batch_size: 1\nbf16: true\ndatasets:\n  - path: somewhere\n    type: alpaca\n")


@pytest.mark.parametrize("extra, lora, dtype_bytes, dora", [
    ("", {}, 4, False),
    ("peft_autocast_adapter_dtype: false\n", {"autocast_adapter_dtype": False}, 2, False),
    ("peft_use_dora: true\n", {"use_dora": True}, 4, True),
])
def test_axolotl_peft_keys(tmp_path, model, extra, lora, dtype_bytes, dora):
    """schemas/peft.py peft_use_dora (loaders/adapter.py: LoraConfig(use_dora=...)) and peft_autocast_adapter_dtype
    (passed to get_peft_model as autocast_adapter_dtype when set)."""
    native = tmp_path / "lora.yml"
    native.write_text(AXOLOTL + extra)
    doc, footprint = converted_and_figures(native)
    assert doc["lora"] == {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear", **lora}
    assert footprint["gradients"] == dtype_bytes * adapter_elements(16, dora)


def test_llama_factory_use_dora(tmp_path, model):
    """hparams/finetuning_args.py LoraArguments.use_dora -> LoraConfig(use_dora=...) in model/adapter.py."""
    native = tmp_path / "lf.yaml"
    native.write_text("model_name_or_path: ./llama-3-8b.json\nstage: sft\nfinetuning_type: lora\nuse_dora: true\n"
                      "bf16: true\nper_device_train_batch_size: 1\ncutoff_len: 1024\n")
    doc, footprint = converted_and_figures(native)
    assert doc["lora"]["use_dora"] is True
    assert footprint["gradients"] == 4 * adapter_elements(8, True)  # peft's fp32 adapters (LoRA's default)
    done = memfit("check", "--format", "json", native)
    assert "use_dora" not in json.dumps(json.loads(done.stdout)["files"][0]["diagnostics"])  # read, no longer warned


TORCHTUNE = """\
model:
  _component_: torchtune.models.llama3.lora_llama3_8b
  lora_attn_modules: ['q_proj', 'k_proj', 'v_proj', 'output_proj']
  apply_lora_to_mlp: True
  lora_rank: 8
  lora_alpha: 16
{dora}
tokenizer:
  _component_: torchtune.models.llama3.llama3_tokenizer
  path: /tmp/tokenizer.model
  max_seq_len: 1024
batch_size: 1
optimizer:
  _component_: torch.optim.AdamW
  fused: True
dtype: {dtype}
"""


@pytest.mark.parametrize("dtype, width", [("bf16", 2), ("fp32", 4)])
@pytest.mark.parametrize("dora", [False, True])
def test_torchtune_adapters_in_the_models_dtype(tmp_path, dtype, width, dora):
    """torchtune's recipes build the model under training.set_default_dtype(dtype): LoRALinear's lora_a / lora_b and
    DoRALinear's magnitude are in the model's dtype (lora.dtype: model)."""
    native = tmp_path / "tt.yaml"
    native.write_text(TORCHTUNE.format(dora="  use_dora: True" if dora else "", dtype=dtype))
    doc, footprint = converted_and_figures(native)
    assert doc["lora"]["dtype"] == "model"
    assert doc["lora"].get("use_dora", False) is dora
    assert footprint["gradients"] == width * adapter_elements(8, dora)

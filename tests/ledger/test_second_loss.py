"""training.second_loss (src/memfit/ledger/techniques/second_loss.py), which the LLaMA-Factory reader sets for a v1
file: `memfit check` on a v1 YAML a user could write against MemTracker around a faithful port of v1's SFT step
(tests/support/llamafactory_v1_step.py: compute_log_probs after the model's own loss, AdamW, clipping) on a tiny
Llama whose vocabulary (2,048) makes the logits the step's largest tensors: peak within 5%, the phase exactly, the
parameters and the optimizer state to the byte. Without the key the same run is priced below the band (the
model's loss alone), so the key is what closes it; with fp32 logits and one sequence (no copy: only the two
log-softmaxes at once) the backward is about as large, and without the key memfit names the wrong phase.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import needs
import pytest
import yaml

needs.module("torch")
needs.module("transformers")
needs.module("peft")

import hf_measure  # noqa: E402
import llamafactory_v1_step as v1  # noqa: E402

BAND = 0.05
PEAK_MD = Path(__file__).resolve().parents[2] / "docs" / "peak.md"
LORA = {"r": 8, "alpha": 16, "dropout": 0.05}
# quant_config bnb, 4 bits (examples/v1/train_qlora/quantization.yaml's), computing in bfloat16
QUANT = {"method": "nf4", "double_quant": True, "compute_dtype": "bfloat16"}
# (name, checkpoint dtype, LoRA, enable_activation_checkpointing, micro_batch_size, cutoff_len, 4-bit base)
RUNS = [
    ("full", "float32", None, True, 2, 256, None),
    ("full-no-checkpointing", "float32", None, False, 2, 256, None),
    ("lora-bf16", "bfloat16", LORA, True, 2, 256, None),
    # one sequence: `logits[..., :-1, :]` is contiguous already, .contiguous() copies nothing
    ("full-one-row", "float32", None, True, 1, 384, None),
    ("lora-bf16-one-row", "bfloat16", LORA, False, 1, 384, None),
    ("qlora-bf16", "bfloat16", LORA, True, 2, 256, QUANT),
]


def tiny_llama(dtype: str) -> dict:
    cfg = hf_measure.without_attention_dropout(hf_measure.tiny("llama", vocab_size=2048, max_position_embeddings=512))
    cfg["torch_dtype"] = dtype
    return cfg


def v1_yaml(micro_batch: int, cutoff: int, lora: dict | None, checkpointing: bool, quant: dict | None = None) -> str:
    text = (f"model: tiny/llama\nmodel_class: llm\ntrain_dataset: data/v1_sft_demo.yaml\n"
            f"micro_batch_size: {micro_batch}\ncutoff_len: {cutoff}\nlearning_rate: 1.0e-4\nmax_steps: 10\n")
    if not checkpointing:
        text += "enable_activation_checkpointing: false\n"
    if lora:
        text += (f"peft_config:\n  name: lora\n  r: {lora['r']}\n  lora_alpha: {lora['alpha']}\n"
                 f"  lora_dropout: {lora['dropout']}\n  target_modules: all\n")
    if quant:
        text += (f"quant_config:\n  name: bnb\n  quantization_bit: 4\n  quantization_type: {quant['method']}\n"
                 f"  double_quantization: {str(quant['double_quant']).lower()}\n  compute_dtype: {quant['compute_dtype']}\n")
    return text


def memfit(*args):
    done = subprocess.run([sys.executable, "-m", "memfit", *map(str, args)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("name,dtype,lora,checkpointing,micro_batch,cutoff,quant", RUNS, ids=[r[0] for r in RUNS])
def test_a_v1_file_matches_v1s_step(name, dtype, lora, checkpointing, micro_batch, cutoff, quant, tmp_path):
    if quant:
        needs.module("bitsandbytes")
    cfg = tiny_llama(dtype)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "memfit.toml").write_text('[models]\n"tiny/llama" = "config.json"\n')
    native = tmp_path / "train.yaml"
    native.write_text(v1_yaml(micro_batch, cutoff, lora, checkpointing, quant))
    [entry] = json.loads(memfit("check", "--format", "json", "--device", "H100-80GB", native))["files"]
    assert entry["input_format"] == "llama-factory" and entry["diagnostics"] == [], entry["diagnostics"]
    theirs = v1.measure(cfg, micro_batch=micro_batch, seq_len=cutoff, lora=lora, checkpointing=checkpointing, quantization=quant)
    ours = entry["peak"]
    assert abs(ours["bytes"] - theirs["bytes"]) <= BAND * theirs["bytes"], (ours["bytes"], theirs["bytes"])
    assert ours["phase"] == theirs["phase"] == "forward"
    if not quant:   # (MemTracker files the 4-bit weights' quant states, absmax and code, neither parameters nor buffers, apart)
        assert ours["live"]["parameters"] == theirs["parameters"]
    assert ours["live"]["optimizer_state"] == theirs["optimizer_state"]
    # the converted config carries the key; without it memfit prices the model's loss alone: below the band
    doc = yaml.safe_load(memfit("convert", native))
    assert doc["training"]["second_loss"] == "log_probs"
    del doc["training"]["second_loss"]
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump(doc, sort_keys=False))
    [without] = json.loads(memfit("check", "--format", "json", "--device", "H100-80GB", plain))["files"]
    # docs/peak.md's table ("A second loss from the logits") prints the three figures of this run to the byte
    section = PEAK_MD.read_text(encoding="utf-8").split("### A second loss from the logits")[1].split("\n### ")[0]
    cells = (f"| {theirs['bytes']:,} ({theirs['phase']}) | {ours['bytes']:,} ({ours['phase']}) | "
             f"{ours['bytes'] / theirs['bytes']:.3f} | {without['peak']['bytes']:,} ({without['peak']['phase']}) | "
             f"{without['peak']['bytes'] / theirs['bytes']:.3f} |")
    assert any(line.endswith(cells) for line in section.splitlines()), cells
    if micro_batch > 1 or dtype != "float32":
        assert without["peak"]["bytes"] < (1 - BAND) * theirs["bytes"], (without["peak"]["bytes"], theirs["bytes"])
    else:   # fp32 logits (`.float()` returns them) and one sequence (its slice is contiguous): no copy, only the
        # model's log-softmax beside the trainer's; the step's backward is as large here, which memfit then reports
        assert without["peak"]["phase"] == "backward"

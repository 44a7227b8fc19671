"""bitsandbytes' 32-bit paged optimizers named in native configs: every reader sets `training.paged_optimizer`, so the
whole fp32 state of each parameter of 100,000+ elements is priced in CUDA unified memory (optim/optimizer.py
`get_state_buffer`: `F.get_paged` unless `p.numel() < 1e5`), off the device's peak, with the `paged-state` note.

The names are the frameworks' own: transformers' `_get_bitsandbytes_optimizer` (`is_paged = "paged" in optim_name`,
`optim_bits = 8 if "8bit" in optim_name else 32`) for the Trainer, Axolotl and LLaMA-Factory; bitsandbytes' classes
(`bitsandbytes.optim.PagedAdamW`, `PagedAdamW32bit`, `PagedAdam`, `PagedLion` ...) for torchtune's `_component_`.
Each paged config is checked against the same config with the unpaged optimizer, through `memfit check`: the device's
peak is lower by exactly the bytes the note names, the footprint is the same."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from test_native import MODELS, figures, memfit

ROOT = Path(__file__).resolve().parents[2]
TORCHTUNE_8B = Path(__file__).resolve().parent / "torchtune_configs" / "llama3_1_8B_full_single_device.yaml"


def _paged_note(entry) -> int:
    notes = [d for d in entry["diagnostics"] if d["code"] == "paged-state"]
    assert len(notes) == 1 and notes[0]["severity"] == "information", entry["diagnostics"]
    return int(re.match(r"([\d,]+) B", notes[0]["message"]).group(1).replace(",", ""))


def _paged_less(paged, unpaged) -> int:
    """The paged-state note's bytes, checked to be the whole difference between the two configs' figures."""
    assert not [d for d in unpaged["diagnostics"] if d["code"] == "paged-state"]
    moved = _paged_note(paged)
    assert moved > 0
    assert unpaged["peak"]["bytes"] - paged["peak"]["bytes"] == moved
    assert paged["footprint"] == unpaged["footprint"]   # the bytes exist, in unified memory
    return moved


@pytest.fixture
def model(tmp_path):
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    return "./llama-3-8b.json"


TRAINER_FORMATS = {
    "axolotl": ("run.yml", "optimizer", lambda m: {"base_model": m, "sequence_len": 1024, "micro_batch_size": 1, "bf16": True,
                                                     "gradient_checkpointing": True, "datasets": []}),
    "llama-factory": ("run.yaml", "optim", lambda m: {"model_name_or_path": m, "stage": "sft", "finetuning_type": "full",
                                                       "cutoff_len": 1024, "per_device_train_batch_size": 1, "bf16": True,
                                                       "gradient_checkpointing": True}),
    "hf-trainer": ("args.json", "optim", lambda m: {"model_name_or_path": m, "output_dir": "out", "do_train": True, "block_size": 1024,
                                                    "per_device_train_batch_size": 1, "bf16": True, "gradient_checkpointing": True}),
}


def _write(tmp_path, fmt, name, **optim):
    file, _, base = TRAINER_FORMATS[fmt]
    path = tmp_path / f"{name}-{file}"
    doc = {**base(str(Path("./llama-3-8b.json"))), **optim}
    path.write_text(json.dumps(doc) if file.endswith(".json") else yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("fmt", sorted(TRAINER_FORMATS))
def test_trainer_paged_32bit_names_page_the_whole_state(tmp_path, model, fmt):
    key = TRAINER_FORMATS[fmt][1]
    flags = ("--input-format", fmt, "--device", "H100-80GB")
    paged_adamw = _write(tmp_path, fmt, "paged-adamw", **{key: "paged_adamw_32bit"})
    entry, _ = figures(paged_adamw, *flags)
    assert entry["input_format"] == fmt
    converted = memfit("convert", *flags, paged_adamw)
    assert converted.returncode == 0, converted.stderr
    doc = yaml.safe_load(converted.stdout)
    assert doc["optimizer"] == "adamw" and doc["dtypes"]["optimizer_state"] == "float32" and doc["training"]["paged_optimizer"] is True
    # the same run with the state on the device: the memfit config convert prints, paged_optimizer switched off
    doc["training"]["paged_optimizer"] = False
    unpaged_file = tmp_path / "unpaged.memfit.yaml"
    unpaged_file.write_text(yaml.safe_dump(doc))
    unpaged, _ = figures(unpaged_file, "--device", "H100-80GB")
    moved = _paged_less(entry, unpaged)
    # full fine-tune of Llama 3 8B, fp32 exp_avg and exp_avg_sq: all but the norms' weights (4,096 elements) are paged
    assert moved == unpaged["footprint"]["optimizer_state"] - 8 * 4096 * (2 * 32 + 1)
    # Lion: paged_lion_32bit against lion_32bit, both the Trainer's names
    lion, _ = figures(_write(tmp_path, fmt, "paged-lion", **{key: "paged_lion_32bit"}), *flags)
    plain, _ = figures(_write(tmp_path, fmt, "lion", **{key: "lion_32bit"}), *flags)
    assert _paged_less(lion, plain) * 2 == moved     # one fp32 state tensor, not two


def test_trainer_paged_lion_8bit_is_paged(tmp_path, model):
    """paged_lion_8bit was read as Lion8bit (unpaged); it is PagedLion8bit: uint8 state1 paged, as PagedAdamW8bit's."""
    flags = ("--input-format", "hf-trainer", "--device", "H100-80GB")
    paged, _ = figures(_write(tmp_path, "hf-trainer", "paged", optim="paged_lion_8bit"), *flags)
    plain, _ = figures(_write(tmp_path, "hf-trainer", "plain", optim="lion_8bit"), *flags)
    adamw8, _ = figures(_write(tmp_path, "hf-trainer", "adamw8", optim="paged_adamw_8bit"), *flags)
    assert _paged_less(paged, plain) * 2 == _paged_note(adamw8)


@pytest.mark.parametrize(("paged", "unpaged", "states"), [
    ("PagedAdamW", "AdamW", 2), ("PagedAdamW32bit", "AdamW32bit", 2), ("PagedAdam", "Adam", 2), ("PagedLion32bit", "Lion32bit", 1),
])
def test_torchtune_paged_32bit_components(tmp_path, paged, unpaged, states):
    shipped = TORCHTUNE_8B.read_text(encoding="utf-8")
    assert "_component_: bitsandbytes.optim.PagedAdamW8bit" in shipped
    files = {}
    for name in (paged, unpaged):
        files[name] = tmp_path / f"{name}.yaml"
        files[name].write_text(shipped.replace("bitsandbytes.optim.PagedAdamW8bit", f"bitsandbytes.optim.{name}"))
    a, _ = figures(files[paged], "--input-format", "torchtune")
    b, _ = figures(files[unpaged], "--input-format", "torchtune")
    moved = _paged_less(a, b)
    # Llama 3.1 8B, fp32 state: every parameter but the 65 norm weights of 4,096 elements
    assert moved == states * 4 * (8_030_261_248 - 65 * 4096)
    note = next(d for d in a["diagnostics"] if d["code"] == "paged-state")
    assert note["range"]["start"]["line"] == 59     # at optimizer._component_ (line 60) in the torchtune file

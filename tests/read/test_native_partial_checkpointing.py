"""Partial checkpointing read from the native formats that spell it: torchtune's `ac_mode: selective` + `ac_option`
(layers N-1, 2N-1, ...), the Trainer's `activation_checkpointing_kwargs: {every_n_layers: N}` (transformers 5, layers
0, N, ...) and Axolotl's `gradient_checkpointing_kwargs` (passed to the Trainer). Each native file gives the same
figures as its conversion, and its peak lies above the every-layer figure."""

from __future__ import annotations

import shutil

from test_native import MODELS, figures, same_figures_as_converted

TORCHTUNE = """\
model:
  _component_: torchtune.models.llama3.llama3_8b
tokenizer:
  _component_: torchtune.models.llama3.llama3_tokenizer
  path: /tmp/tokenizer.model
  max_seq_len: 2048
batch_size: 2
optimizer:
  _component_: torch.optim.AdamW
  fused: True
dtype: bf16
enable_activation_checkpointing: False
"""


def test_torchtune_selective_ac_option_is_every_nth_layer_from_the_nth(tmp_path):
    every = tmp_path / "every.yaml"
    every.write_text(TORCHTUNE + "ac_mode: selective\nac_option: 2\n")
    out = same_figures_as_converted(every, "--device", "H100-80GB")
    training = out["doc"]["training"]
    assert (training["checkpointing"], training["checkpoint_every"], training["checkpoint_offset"]) == ("full", 2, 1)
    full = tmp_path / "full.yaml"
    full.write_text(TORCHTUNE.replace("enable_activation_checkpointing: False", "enable_activation_checkpointing: True"))
    all_layers, _ = figures(full, "--device", "H100-80GB")
    assert out["native"]["peak"]["bytes"] > all_layers["peak"]["bytes"]
    op = tmp_path / "op.yaml"
    op.write_text(TORCHTUNE + "ac_mode: selective\nac_option: op\n")
    entry, _ = figures(op, "--device", "H100-80GB")
    assert any(d["code"] == "not-modelled" and "op-level" in d["message"] for d in entry["diagnostics"])


def test_trainer_and_axolotl_every_n_layers(tmp_path):
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    trainer = tmp_path / "args.json"
    trainer.write_text('{"model_name_or_path": "./llama-3-8b.json", "output_dir": "out", "per_device_train_batch_size": 1, '
                       '"block_size": 1024, "bf16": true, "torch_dtype": "bfloat16", "activation_checkpointing": true, '
                       '"activation_checkpointing_kwargs": {"every_n_layers": 4}}')
    out = same_figures_as_converted(trainer, "--device", "H100-80GB")
    assert out["doc"]["training"]["checkpoint_every"] == 4 and "checkpoint_offset" not in out["doc"]["training"]
    axolotl = tmp_path / "ax.yml"
    axolotl.write_text("base_model: ./llama-3-8b.json\nsequence_len: 1024\nmicro_batch_size: 1\nbf16: true\n"
                       "gradient_checkpointing: true\ngradient_checkpointing_kwargs:\n  use_reentrant: false\n  every_n_layers: 4\n")
    out = same_figures_as_converted(axolotl, "--device", "H100-80GB")
    assert out["doc"]["training"]["checkpoint_every"] == 4


def test_activation_offloading_from_each_format(tmp_path):
    """torchtune's enable_activation_offloading, Axolotl's activation_offloading and gradient_checkpointing: offload, the
    Trainer's activation_checkpointing_kwargs.offload: training.activation_offloading, the same figures as the
    conversion, a lower peak than the same run without it."""
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    on = tmp_path / "tt.yaml"
    on.write_text(TORCHTUNE + "enable_activation_offloading: True\n")
    out = same_figures_as_converted(on, "--device", "H100-80GB")
    assert out["doc"]["training"]["activation_offloading"] is True
    off = tmp_path / "tt-off.yaml"
    off.write_text(TORCHTUNE)
    plain, _ = figures(off, "--device", "H100-80GB")
    assert out["native"]["peak"]["bytes"] < plain["peak"]["bytes"]
    assert not [d for d in out["native"]["diagnostics"] if "offload" in d["message"]]
    for name, text in (("ax.yml", "activation_offloading: true\n"), ("ax2.yml", "gradient_checkpointing: offload\n")):
        axolotl = tmp_path / name
        axolotl.write_text("base_model: ./llama-3-8b.json\nsequence_len: 1024\nmicro_batch_size: 1\nbf16: true\n" + text)
        out = same_figures_as_converted(axolotl, "--device", "H100-80GB")
        assert out["doc"]["training"]["activation_offloading"] is True
    trainer = tmp_path / "args.json"
    trainer.write_text('{"model_name_or_path": "./llama-3-8b.json", "output_dir": "out", "bf16": true, "activation_checkpointing": true, '
                       '"activation_checkpointing_kwargs": {"offload": true}}')
    out = same_figures_as_converted(trainer, "--device", "H100-80GB")
    assert out["doc"]["training"]["activation_offloading"] is True and out["doc"]["training"]["checkpointing"] == "full"

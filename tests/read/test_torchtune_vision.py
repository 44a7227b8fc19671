"""torchtune's Llama 3.2 Vision against `memfit check` on the same torchtune config: memfit reads the model (the
shipped 11B builders, or DeepFusionModel with torchtune's encoder and decoder component builders at tiny widths, in
the shipped 11B_full_single_device.yaml / 11B_lora_single_device.yaml with their model mapping replaced) and
refuses it at model._component_ with torchtune's own parameter count and what the recipe trains (the full recipes:
DeepFusionModel's decoder_trainable / encoder_trainable / fusion_trainable; the LoRA recipes: get_adapter_params),
naming what differs from transformers' mllama, which memfit models. torchtune 0.6.1 builds each on the meta device
in an interpreter of its own (MEMFIT_TORCHTUNE_PYTHON, as tests/read/test_torchtune_built.py):
tests/support/torchtune_vision_count.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import needs
import pytest
import yaml

SUPPORT = Path(__file__).resolve().parents[1] / "support"
CONFIGS = Path(__file__).resolve().parent / "torchtune_configs"
PACKAGE = "torchtune.models.llama3_2_vision."
ENCODER = {"patch_size": 4, "num_heads": 2, "clip_embed_dim": 32, "clip_num_layers": 4, "clip_hidden_states": [1, 2],
           "num_layers_projection": 2, "decoder_embed_dim": 64, "tile_size": 16, "max_num_tiles": 2, "in_channels": 3}
DECODER = {"vocab_size": 128, "num_layers": 4, "fusion_interval": 2, "num_special_tokens": 8, "num_heads": 4,
           "num_kv_heads": 2, "embed_dim": 64, "max_seq_len": 256, "encoder_max_seq_len": 256, "intermediate_dim": 112}
SHIPPED_LORA = {"lora_attn_modules": ["q_proj", "v_proj", "output_proj"], "apply_lora_to_mlp": True,
                "apply_lora_to_output": False, "lora_rank": 8, "lora_alpha": 16}   # 11B_lora_single_device.yaml


def tiny(flags: dict, lora: dict | None = None, encoder_lora=True, fusion_lora=True, decoder_lora=False) -> dict:
    """DeepFusionModel of the component builders at tiny widths, as the 11B builder makes it."""
    if lora is None:
        encoder = {"_component_": PACKAGE + "llama3_2_vision_encoder", **ENCODER}
        decoder = {"_component_": PACKAGE + "llama3_2_vision_decoder", **DECODER}
    else:
        encoder = {"_component_": PACKAGE + "lora_llama3_2_vision_encoder", "encoder_lora": encoder_lora, "fusion_lora": fusion_lora, **lora, **ENCODER}
        decoder = {"_component_": PACKAGE + "lora_llama3_2_vision_decoder", "decoder_lora": decoder_lora, "fusion_lora": fusion_lora, **lora, **DECODER}
    return {"_component_": "torchtune.modules.model_fusion.DeepFusionModel", "encoder": encoder, "decoder": decoder, **flags}


MODELS = {
    "tiny full (11B_full_single_device's flags)": tiny({"decoder_trainable": False, "encoder_trainable": True, "fusion_trainable": True}),
    "tiny full, decoder trainable, fusion frozen": tiny({"decoder_trainable": True, "encoder_trainable": False, "fusion_trainable": False}),
    "tiny LoRA (11B_lora_single_device's)": tiny({"decoder_trainable": False, "encoder_trainable": True, "fusion_trainable": True}, SHIPPED_LORA),
    "tiny DoRA, q k v output, MLP, output, decoder adapted": tiny(
        {"decoder_trainable": True, "encoder_trainable": True, "fusion_trainable": True},
        {**SHIPPED_LORA, "lora_attn_modules": ["q_proj", "k_proj", "v_proj", "output_proj"], "apply_lora_to_output": True, "use_dora": True},
        decoder_lora=True),
    "tiny LoRA, encoder frozen, ranks apart": {
        **tiny({"decoder_trainable": False, "encoder_trainable": False, "fusion_trainable": True}),
        "encoder": {"_component_": PACKAGE + "lora_llama3_2_vision_encoder", "encoder_lora": False, "fusion_lora": True,
                    **SHIPPED_LORA, "lora_rank": 4, "apply_lora_to_output": True, **ENCODER},
        "decoder": {"_component_": PACKAGE + "lora_llama3_2_vision_decoder", "decoder_lora": False, "fusion_lora": True,
                    **SHIPPED_LORA, "lora_rank": 16, "lora_attn_modules": ["k_proj"], **DECODER}},
    "llama3_2_vision_11b": {"_component_": PACKAGE + "llama3_2_vision_11b"},
    "lora_llama3_2_vision_11b": {"_component_": PACKAGE + "lora_llama3_2_vision_11b", "decoder_trainable": "frozen",
                                 "encoder_trainable": "lora", "fusion_trainable": "lora", **SHIPPED_LORA, "image_size": 560},
    "qlora_llama3_2_vision_11b": {"_component_": PACKAGE + "qlora_llama3_2_vision_11b", **SHIPPED_LORA},
    "llama3_2_vision_90b": {"_component_": PACKAGE + "llama3_2_vision_90b", "decoder_trainable": False,
                            "encoder_trainable": True, "fusion_trainable": True},
    "lora_llama3_2_vision_90b": {"_component_": PACKAGE + "lora_llama3_2_vision_90b", **SHIPPED_LORA},
}


def torchtune_python() -> str:
    python = os.environ.get("MEMFIT_TORCHTUNE_PYTHON")
    if not python:
        needs.unavailable("MEMFIT_TORCHTUNE_PYTHON is not set (an interpreter with torchtune 0.6.1 and torchao 0.10.0)")
    return python


@pytest.fixture(scope="module")
def theirs() -> dict:
    done = subprocess.run([torchtune_python(), str(SUPPORT / "torchtune_vision_count.py"), json.dumps(list(MODELS.values()))],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(zip(MODELS, json.loads(done.stdout.strip().splitlines()[-1])))


def check(tmp_path: Path, model: dict) -> dict:
    """memfit check on the shipped 11B config of the model's recipe (torchtune's, verbatim, in torchtune_configs/) with
    its model mapping replaced by this one."""
    lora = any(str(n.get("_component_", "")).rsplit(".", 1)[-1].startswith(("lora_", "qlora_")) for n in (model, *model.values()) if isinstance(n, dict))
    shipped = yaml.safe_load((CONFIGS / f"llama3_2_vision_11B_{'lora' if lora else 'full'}_single_device.yaml").read_text(encoding="utf-8"))
    config = {"model": model, **{k: v for k, v in shipped.items() if k != "model"}}
    path = tmp_path / "vision.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    out = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", "--budget", "1GiB", str(path)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 1, out.stdout
    (entry,) = json.loads(out.stdout)["files"]
    (error,) = [d for d in entry["diagnostics"] if d["severity"] == "error"]
    return error


@pytest.mark.parametrize("name", list(MODELS))
def test_the_refusal_gives_torchtunes_parameters_and_what_its_recipe_trains(tmp_path, theirs, name):
    error = check(tmp_path, MODELS[name])
    counted = theirs[name]
    assert error["code"] == "unsupported-model" and error["range"]["start"] == {"line": 1, "character": 15}, error
    recipe = "LoRA" if counted["lora"] else "full"
    assert f"torchtune builds {counted['parameters']:,} parameters and the {recipe} recipe trains {counted['trainable']:,} of them" in error["message"], (counted, error["message"])
    assert "MllamaForConditionalGeneration" in error["message"] and "TransformerSelfAttentionLayer" in error["message"]


def test_a_fusion_model_of_other_components_is_refused_at_the_component(tmp_path):
    model = tiny({"fusion_trainable": True})
    model["decoder"]["_component_"] = "torchtune.models.llama3.llama3"
    error = check(tmp_path, model)
    assert error["code"] == "unsupported-model" and error["range"]["start"]["line"] == 17, error
    assert "model.decoder: memfit reads a DeepFusionModel of torchtune's Llama 3.2 Vision component builders" in error["message"]


def test_a_lora_builder_with_a_full_part_is_torchtunes_assertion(tmp_path):
    model = {**MODELS["lora_llama3_2_vision_11b"], "decoder_trainable": "full"}
    error = check(tmp_path, model)
    assert error["code"] == "native-config" and error["range"]["start"]["line"] == 2, error
    assert "mixed LoRA + Full" in error["message"] and "use llama3_2_vision_11b" in error["message"]

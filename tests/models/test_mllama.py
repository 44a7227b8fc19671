"""Llama 3.2 Vision (transformers' mllama: MllamaForConditionalGeneration, a tiled vision transformer with gated
global layers, a multi-modal projector and a Llama text model with tanh-gated cross-attention layers) through the
front door: `memfit check --format json` on a config.json and a memfit config, against the real transformers model:
parameters on the meta device, saved bytes in a real CPU step with images (autograd's saved_tensors_hooks), the
step's peak against MemTracker."""

from __future__ import annotations

import json

import needs
import pytest

from memfit.models import hf, hf_config

needs.module("torch")
needs.module("transformers")

import hf_measure as hm  # noqa: E402
from family_check import buffer_bytes, check_json  # noqa: E402
import peak_reference as ref  # noqa: E402

# 2 vision layers and 2 global ones, 2 tiles of 56 px (16 patches + the class token, padded to 24), a 4-layer text
# model whose layers 1 and 3 cross-attend
TINY = {"model_type": "mllama", "architectures": ["MllamaForConditionalGeneration"], "image_token_index": 127,
        "text_config": {"hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 4, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "vocab_size": 128, "cross_attention_layers": [1, 3], "pad_token_id": 0,
                        "bos_token_id": 1, "eos_token_id": 2},
        "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_global_layers": 2,
                          "attention_heads": 2, "image_size": 56, "patch_size": 14, "max_num_tiles": 2,
                          "intermediate_layers_indices": [0, 2], "vision_output_dim": 96,
                          "supported_aspect_ratios": [[1, 1], [1, 2], [2, 1]]}}
TEXT_LORA = {"r": 4, "alpha": 8, "target_modules": r".*language_model.*\.(q_proj|v_proj)"}


def meta_model(raw: dict):
    import torch
    import transformers

    config = transformers.AutoConfig.for_model("mllama", **{k: v for k, v in raw.items() if k != "model_type"})
    with torch.device("meta"):
        return transformers.MllamaForConditionalGeneration(config)


@pytest.mark.parametrize("raw", [{"model_type": "mllama"}, TINY], ids=["default-11b", "tiny"])
def test_parameters_are_the_real_models(raw):
    import torch.nn as nn

    assert hf_config.validate(raw) == []
    cfg = hf_config.model_view(hf_config.normalize(raw))
    model = meta_model(raw)
    assert [(p.name, p.shape) for p in hf.parameters(cfg)] == [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert hf.parameter_count(cfg) == sum(p.numel() for p in model.parameters())
    modules = [(n, m.in_features, m.out_features, m.bias is not None) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert hf.linear_modules(cfg) == modules


CASES = [(p, a, c, lora) for p in ("bf16-true", "32-true") for a in ("sdpa", "eager") for c in ("none", "full")
         for lora in (False, True)]


def _check(tmp_path, precision, attention, checkpointing, lora):
    import yaml

    (tmp_path / "config.json").write_text(json.dumps(TINY))
    doc = {"memfit": 1, "device": {"memory": "1 TiB", "type": "cpu"}, "precision": precision, "optimizer": "adamw",
           "model": {"hf_config": "config.json"},
           "training": {"micro_batch": 2, "seq_len": 40, "attention": attention, "checkpointing": checkpointing},
           **({"lora": TEXT_LORA} if lora else {})}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(doc))
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(tmp_path / "t.yaml")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["files"][0]


@pytest.mark.parametrize("precision,attention,checkpointing,lora", CASES)
def test_check_matches_the_real_model(precision, attention, checkpointing, lora, tmp_path):
    """Saved bytes: exact without checkpointing; full checkpointing within 0.6% (a few KB over)."""
    result = _check(tmp_path, precision, attention, checkpointing, lora)
    assert result["diagnostics"] == []
    measured = hm.measure(TINY, micro_batch=2, seq_len=40, attention=attention, checkpointing=checkpointing,
                          precision=precision, lora=TEXT_LORA if lora else None)["peak"]
    mine = result["footprint"]["activations"]
    assert abs(mine - measured) <= 0.05 * measured, (mine, measured)
    if checkpointing == "none":
        assert mine == measured
    if not lora and precision == "32-true":
        elements = sum(p.numel() for p in meta_model(TINY).parameters())
        built = meta_model(TINY)
        assert result["footprint"]["parameters"] == 4 * elements + buffer_bytes(built)
        assert result["footprint"]["optimizer_state"] == 8 * elements


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_peak_matches_memtracker(checkpointing, lora, tmp_path):
    import torch

    model = hm.build(TINY, "sdpa", "bf16-true", TEXT_LORA if lora else None)
    if checkpointing == "full":
        model.gradient_checkpointing_enable()
    batch = hm.mllama_inputs(TINY, 2, 40, torch.Generator().manual_seed(1), 1)
    opt = ref.OPTIMIZERS["adamw"]([p for p in model.parameters() if p.requires_grad], **ref.IMPLS["foreach"])
    keys = ("input_ids", "labels", "pixel_values", "aspect_ratio_ids", "aspect_ratio_mask", "cross_attention_mask")
    with hm.cuda_dropout():
        theirs = ref.measure(model, tuple(batch[k] for k in keys),
                             lambda m, *x: m(**dict(zip(keys, x))).loss, opt)
    result = _check(tmp_path, "bf16-true", "sdpa", checkpointing, lora)
    ours = result["peak"]
    assert abs(ours["bytes"] - theirs["bytes"]) <= 0.05 * theirs["bytes"], (ours["bytes"], theirs["bytes"], ours["phase"], theirs["phase"])


def test_lora_on_the_vision_tower_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    result = check_json(tmp_path, TINY, micro_batch=1, seq_len=40)
    assert result["diagnostics"] == []
    import subprocess
    import sys

    import yaml

    doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "optimizer": "adamw", "model": {"hf_config": "config.json"},
           "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}, "training": {"micro_batch": 1, "seq_len": 40}}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(doc))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(tmp_path / "t.yaml")],
                          capture_output=True, text=True, timeout=120, check=False)
    diagnostics = json.loads(done.stdout)["files"][0]["diagnostics"]
    assert [d["code"] for d in diagnostics] == ["unsupported-model"]
    assert "vision_model.transformer.layers.0.self_attn.q_proj" in diagnostics[0]["message"]


@pytest.mark.parametrize("extra, code, where", [({"precision": "bf16-mixed"}, "unsupported-model", "precision"),
                                                ({"training": {"micro_batch": 1, "seq_len": 40, "image_size": 448}}, "schema",
                                                 "image_size"),
                                                ({"parallel": {"tensor": 2}}, "unsupported-model", "tensor"),
                                                ({"training": {"micro_batch": 1, "seq_len": 40, "checkpointing": "selective"}},
                                                 "unsupported-model", "checkpointing")])
def test_what_is_not_modeled_is_refused_in_place(extra, code, where, tmp_path):
    """Autocast over the vision tower (bf16-mixed: measured 0.79-0.88 of autograd's saved bytes before this refusal),
    an image size of one's own (the processor tiles at the config's image_size), tensor parallelism (the vision
    tower per rank is not modeled) and selective checkpointing are refused at their key."""
    import subprocess
    import sys

    import yaml

    (tmp_path / "config.json").write_text(json.dumps(TINY))
    doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "optimizer": "adamw", "model": {"hf_config": "config.json"},
           "training": {"micro_batch": 1, "seq_len": 40}, **extra}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(tmp_path / "t.yaml")],
                          capture_output=True, text=True, timeout=120, check=False)
    [diagnostic] = json.loads(done.stdout)["files"][0]["diagnostics"]
    assert diagnostic["code"] == code and where in diagnostic["message"]
    line = (tmp_path / "t.yaml").read_text().splitlines()[diagnostic["range"]["start"]["line"]]
    assert where in line


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_two_images_per_sample(checkpointing, tmp_path):
    """Two images per sequence: twice the tiles through the vision tower, twice the image tokens each cross-attention
    layer attends to (measured: exact without checkpointing, 0.2% over with it)."""
    result = check_json(tmp_path, TINY, micro_batch=2, seq_len=40, checkpointing=checkpointing, images_per_sample=2)
    assert result["diagnostics"] == []
    import yaml

    doc = yaml.safe_load((tmp_path / "train.yaml").read_text())
    doc["precision"], doc["device"]["type"] = "bf16-true", "cpu"
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(doc))
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(tmp_path / "train.yaml")],
                          capture_output=True, text=True, timeout=120, check=False)
    mine = json.loads(done.stdout)["files"][0]["footprint"]["activations"]
    measured = hm.measure(TINY, micro_batch=2, seq_len=40, checkpointing=checkpointing, precision="bf16-true", images=2)["peak"]
    assert measured <= mine <= 1.005 * measured, (mine, measured)
    if checkpointing == "none":
        assert mine == measured

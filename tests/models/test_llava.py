"""LLaVA (issue 21: LlavaForConditionalGeneration, a CLIP vision tower, a projector and a Llama text model) through the
front door: `memfit check --format json` on a config.json and a memfit config with training.images_per_sample (and
training.freeze_vision_tower), against the real transformers model: parameters on the meta device (names, shapes,
the tied head), saved bytes in a real CPU step (autograd's saved_tensors_hooks, the vision tower and projector
included), the step's peak against MemTracker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import needs
import pytest

from memfit.models import hf, hf_activations, hf_config

needs.module("torch")
needs.module("transformers")

import hf_measure as hm  # noqa: E402
import peak_reference as ref  # noqa: E402
from family_check import buffer_bytes, check_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
VISION = {"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 3,
          "num_attention_heads": 2, "image_size": 28, "patch_size": 7}
TEXT = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 128}
TINY = {"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"], "vision_config": VISION, "text_config": TEXT,
        "image_token_index": 127, "image_seq_length": 16}   # (28 / 7)^2 = 16 patches: the CLS token is cut (default)
VARIANTS = {
    "default": {},
    "full-last": {"vision_feature_select_strategy": "full", "vision_feature_layer": -1, "image_seq_length": 17},
    "two-layers-tied": {"vision_feature_layer": [-3, -1], "text_config": {**TEXT, "tie_word_embeddings": True},
                        "multimodal_projector_bias": False},
}


def config(variant: str = "default") -> dict:
    import transformers

    raw = {**TINY, **VARIANTS[variant]}
    return transformers.AutoConfig.for_model("llava", **{k: v for k, v in raw.items() if k != "model_type"}).to_dict()


def meta_model(cfg: dict):
    import torch
    import transformers

    config_ = transformers.AutoConfig.for_model("llava", **{k: v for k, v in cfg.items() if k != "model_type"})
    with torch.device("meta"):
        return transformers.LlavaForConditionalGeneration(config_)


def graded_elements(cfg: dict, images: int = 1) -> int:
    """Elements of the parameters a real step gives a .grad (and AdamW a state): a tiny model run forward and backward
    (the tower's layers past the hidden state the projector reads, and post_layernorm, reach no loss)."""
    model = hm.build(cfg)
    batch = hm.inputs(cfg, 1, 40, images=images)
    model(input_ids=batch["input_ids"], labels=batch["labels"], pixel_values=batch["pixel_values"]).loss.backward()
    return sum(p.numel() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("raw", [{"model_type": "llava"}, *({**TINY, **v} for v in VARIANTS.values())],
                         ids=["llava-1.5-7b", *VARIANTS])
def test_parameters_are_the_real_models(raw):
    import torch.nn as nn

    assert hf_config.validate(raw) == []
    cfg = hf_config.model_view(hf_config.normalize(raw))
    model = meta_model({k: v for k, v in raw.items()})
    expected = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    assert [(p.name, p.shape) for p in hf.parameters(cfg)] == expected
    assert hf.parameter_count(cfg) == sum(p.numel() for p in model.parameters())
    modules = [(n, m.in_features, m.out_features, m.bias is not None) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert hf.linear_modules(cfg) == modules


@pytest.mark.parametrize("images", [1, 2])
@pytest.mark.parametrize("checkpointing", ["none", "full"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_check_matches_the_real_model(variant, attention, checkpointing, images, tmp_path):
    cfg = config(variant)
    seq_len = 40
    result = check_json(tmp_path, cfg, micro_batch=2, seq_len=seq_len, attention=attention, checkpointing=checkpointing,
                        images_per_sample=images)
    assert result["diagnostics"] == []
    built = meta_model(cfg)
    elements = sum(p.numel() for p in built.parameters())
    footprint = result["footprint"]
    graded = graded_elements(cfg)
    assert footprint["parameters"] == 4 * elements + buffer_bytes(built)
    assert footprint["gradients"] == 4 * graded and footprint["optimizer_state"] == 8 * graded
    measured = hm.measure(cfg, micro_batch=2, seq_len=seq_len, attention=attention, checkpointing=checkpointing, images=images)
    # the peak of what autograd keeps: the vision tower's layers after the hidden state the projector reads stay
    # alive to the end of the forward (LlavaModel's output holds the tower's), and are counted
    assert abs(footprint["activations"] - measured["peak"]) <= 0.05 * measured["peak"], (footprint["activations"], measured["peak"])


EXACT = [(a, c, p, b) for a in ("eager", "sdpa") for c in ("none", "full") for p in ("32-true", "bf16-mixed") for b in (1, 2)]


@pytest.mark.parametrize("attention,checkpointing,precision,micro_batch", EXACT)
def test_saved_bytes_are_exact(attention, checkpointing, precision, micro_batch):
    cfg = config()
    run = dict(micro_batch=micro_batch, seq_len=40, attention=attention, checkpointing=checkpointing, precision=precision)
    measured = hm.measure(cfg, **run)["peak"]
    mine_cfg = hf_config.model_view(hf_config.normalize(cfg))
    mine = (hf_activations.peak_saved(mine_cfg, **run) if checkpointing == "full"
            else hf_activations.total(hf_activations.saved(mine_cfg, **run)))
    # one sequence: the loss's targets are 8 bytes over in memfit's figure
    assert mine - measured in ((0,) if micro_batch > 1 else (0, -8)), (mine, measured)


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_a_frozen_vision_tower_trains_the_rest(checkpointing, tmp_path):
    cfg = config()
    result = check_json(tmp_path, cfg, micro_batch=2, seq_len=40, checkpointing=checkpointing, freeze_vision_tower=True)
    assert result["diagnostics"] == []
    model = meta_model(cfg)
    every = sum(p.numel() for p in model.parameters())
    trains = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("model.vision_tower."))
    footprint = result["footprint"]
    assert footprint["parameters"] == 4 * every + buffer_bytes(model)
    assert footprint["gradients"] == 4 * trains and footprint["optimizer_state"] == 8 * trains
    measured = hm.measure(cfg, micro_batch=2, seq_len=40, checkpointing=checkpointing, freeze=("model.vision_tower.",))["peak"]
    assert abs(footprint["activations"] - measured) <= 0.05 * measured, (footprint["activations"], measured)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_peak_matches_memtracker(checkpointing, tmp_path):
    cfg = config()
    model = hm.build(cfg)
    if checkpointing == "full":
        model.gradient_checkpointing_enable()
    batch = hm.inputs(cfg, 2, 64)
    opt = ref.OPTIMIZERS["adamw"](model.parameters(), **ref.IMPLS["foreach"])
    with hm.cuda_dropout():
        theirs = ref.measure(model, (batch["input_ids"], batch["labels"], batch["pixel_values"]),
                             lambda m, x, y, p: m(input_ids=x, labels=y, pixel_values=p).loss, opt)
    ours = check_json(tmp_path, cfg, micro_batch=2, seq_len=64, checkpointing=checkpointing, optimizer_impl="foreach")["peak"]
    assert ours["phase"] == theirs["phase"]
    assert abs(ours["bytes"] - theirs["bytes"]) <= 0.05 * theirs["bytes"], (ours["bytes"], theirs["bytes"])
    # (MemTracker's parameters include the vision tower's position_ids buffer, (1, 17) int64, which memfit leaves out)
    assert theirs["parameters"] - ours["live"]["parameters"] in (0, 8 * 17)


def test_images_must_fit_the_sequence_and_the_tower(tmp_path):
    cfg = config()
    result = check_json(tmp_path, cfg, micro_batch=1, seq_len=20, images_per_sample=2)
    assert [d["code"] for d in result["diagnostics"]] == ["schema"] and "seq_len" in result["diagnostics"][0]["message"]
    result = check_json(tmp_path, {**cfg, "image_seq_length": 17}, micro_batch=1, seq_len=40)
    assert [d["code"] for d in result["diagnostics"]] == ["unsupported-model"]
    llama = {"model_type": "llama", **{k: v for k, v in TEXT.items() if k != "model_type"}}
    result = check_json(tmp_path, llama, micro_batch=1, seq_len=40, images_per_sample=1)
    assert [d["code"] for d in result["diagnostics"]] == ["schema"]


def test_the_example_is_llava_1_5_7b(tmp_path):
    example = ROOT / "examples" / "families" / "llava-1.5-7b-full.yaml"
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(example)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("checkpointing", ["none", "full"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_lora_on_both_towers(attention, checkpointing):
    """peft has no default target_modules for llava; q_proj/v_proj match the vision tower's projections and the text
    model's alike, so the image features need a gradient and the text model's first layer keeps what the others do."""
    cfg = config()
    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    run = dict(micro_batch=2, seq_len=40, attention=attention, checkpointing=checkpointing, lora=lora)
    measured = hm.measure(cfg, **run)["peak"]
    mine_cfg = hf_config.model_view(hf_config.normalize(cfg))
    mine = (hf_activations.peak_saved(mine_cfg, **run) if checkpointing == "full"
            else hf_activations.total(hf_activations.saved(mine_cfg, **run)))
    if checkpointing == "none":
        assert mine == measured
    else:   # measured 0.9836 (sdpa) and 0.9861 (eager): the checkpointed vision layers' frames, as with a frozen tower
        assert 0.95 * measured <= mine <= measured, (mine, measured)

"""Qwen2-VL and Qwen2.5-VL (issue 34: Qwen2VLForConditionalGeneration / Qwen2_5_VLForConditionalGeneration, a vision
transformer with dynamic resolution, a patch merger and a Qwen2 text model rotated by mrope) through the front door:
`memfit check --format json` on a config.json and a memfit config with training.images_per_sample and image_size,
against the real transformers model: parameters on the meta device (names, shapes, the tied head), saved bytes in a real
CPU step with images (autograd's saved_tensors_hooks, the vision tower and merger included), the step's peak against
MemTracker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import needs
import pytest
import yaml

from memfit.models import hf, hf_config, qwen_vl

needs.module("torch")
needs.module("transformers")

import hf_measure as hm  # noqa: E402
from family_check import buffer_bytes, check_json  # noqa: E402
import peak_reference as ref  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TEXT = {"hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 128, "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3]}}
TOKENS = {"image_token_id": 120, "video_token_id": 121, "vision_start_token_id": 122, "vision_end_token_id": 123}
TINY = {
    "qwen2_vl": {"model_type": "qwen2_vl", "architectures": ["Qwen2VLForConditionalGeneration"], "text_config": TEXT,
                 "vision_config": {"depth": 2, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "mlp_ratio": 2}, **TOKENS},
    # window_size 56 px: 2 x 2 merged patches per window; block 1 attends within each image
    "qwen2_5_vl": {"model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"], "text_config": TEXT,
                   "vision_config": {"depth": 3, "hidden_size": 32, "intermediate_size": 40, "num_heads": 2,
                                     "out_hidden_size": 64, "window_size": 56, "fullatt_block_indexes": [1]}, **TOKENS},
}
IMAGE = [112, 84]   # px: 8 x 6 patches of 14, 12 image tokens (a multiple of 28 on each side: the processor keeps it)


def config(model_type: str, **change) -> dict:
    import transformers

    raw = {**TINY[model_type], **change}
    return transformers.AutoConfig.for_model(model_type, **{k: v for k, v in raw.items() if k != "model_type"}).to_dict()


def meta_model(cfg: dict):
    import torch
    import transformers

    config_ = transformers.AutoConfig.for_model(cfg["model_type"], **{k: v for k, v in cfg.items() if k != "model_type"})
    with torch.device("meta"):
        names = cfg.get("architectures") or [{"qwen2_vl": "Qwen2VLForConditionalGeneration"}.get(cfg["model_type"],
                                                                                         "Qwen2_5_VLForConditionalGeneration")]
        return getattr(transformers, names[0])(config_)


@pytest.mark.parametrize("raw", [{"model_type": "qwen2_vl"}, {"model_type": "qwen2_5_vl"}, *TINY.values(),
                                 {**TINY["qwen2_vl"], "tie_word_embeddings": True}],
                         ids=["qwen2_vl-default", "qwen2_5_vl-default", *TINY, "qwen2_vl-tied"])
def test_parameters_are_the_real_models(raw):
    import torch.nn as nn

    assert hf_config.validate(raw) == []
    cfg = hf_config.model_view(hf_config.normalize(raw))
    model = meta_model(raw)
    expected = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    assert [(p.name, p.shape) for p in hf.parameters(cfg)] == expected
    assert hf.parameter_count(cfg) == sum(p.numel() for p in model.parameters())
    modules = [(n, m.in_features, m.out_features, m.bias is not None) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert hf.linear_modules(cfg) == modules


def _transformers_smart_resize():
    """transformers' own smart_resize (image_processing_qwen2_vl.py), read from its source: the module itself needs
    torchvision and PIL to import, which the test environment does not have."""
    import ast
    import math
    import transformers

    path = Path(transformers.__file__).parent / "models" / "qwen2_vl" / "image_processing_qwen2_vl.py"
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "smart_resize")
    scope = {"math": math}
    exec(compile(ast.Module([node], []), str(path), "exec"), scope)
    return scope["smart_resize"]


def test_the_image_tokens_are_the_processors():
    """The processor's smart_resize and its defaults (min 56 x 56, max 28 x 28 x 1280 pixels) give the grid; the
    processor expands the placeholder to grid_h x grid_w / merge^2 tokens."""
    import inspect

    smart_resize = _transformers_smart_resize()
    defaults = inspect.signature(smart_resize).parameters
    assert (defaults["min_pixels"].default, defaults["max_pixels"].default) == (qwen_vl.MIN_PIXELS, qwen_vl.MAX_PIXELS)
    cfg = hf_config.model_view(hf_config.normalize({"model_type": "qwen2_vl"}))
    for (height, width), low, high in (((112, 84), None, None), ((500, 375), None, None), ((2000, 1000), None, None),
                                       ((30, 40), None, None), ((4000, 3000), 256 * 28 * 28, 768 * 768), ((None, None), None, None)):
        low, high = low or qwen_vl.MIN_PIXELS, high or qwen_vl.MAX_PIXELS
        cfg["qwen_vl"].update(min_pixels=low, max_pixels=high)
        if height is None:   # no image_size: the largest square the processor makes (a huge square image resized)
            cfg["qwen_vl"].pop("image_size", None)
            height = width = 100_000
        else:
            cfg["qwen_vl"]["image_size"] = [height, width]
        h, w = smart_resize(height, width, 28, low, high)
        assert qwen_vl.image_grid(cfg) == (h // 14, w // 14)
        assert qwen_vl.image_tokens(cfg) == (h // 14) * (w // 14) // 4


CASES = [(m, a, c, b) for m in TINY for a in ("eager", "sdpa") for c in ("none", "full") for b in (1, 2)]


@pytest.mark.parametrize("model_type,attention,checkpointing,images", CASES)
def test_check_matches_the_real_model(model_type, attention, checkpointing, images, tmp_path):
    cfg = config(model_type)
    seq_len = 40
    result = check_json(tmp_path, cfg, micro_batch=2, seq_len=seq_len, attention=attention, checkpointing=checkpointing,
                        images_per_sample=images, image_size=IMAGE)
    assert result["diagnostics"] == []
    built = meta_model(cfg)
    elements = sum(p.numel() for p in built.parameters())
    footprint = result["footprint"]
    assert footprint["parameters"] == 4 * elements + buffer_bytes(built) and footprint["optimizer_state"] == 8 * elements
    measured = hm.measure({**cfg, "_image_size": IMAGE}, micro_batch=2, seq_len=seq_len, attention=attention,
                          checkpointing=checkpointing, images=images)
    # measured: equal without checkpointing; under full checkpointing memfit is over by the blocks' cu_seqlens (a few
    # int32 each, which the checkpoint keeps as inputs and the tracker sees or not as the frames hold them)
    assert abs(footprint["activations"] - measured["peak"]) <= 0.05 * measured["peak"], (footprint["activations"], measured["peak"])
    if checkpointing == "none":
        assert footprint["activations"] == measured["peak"]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("model_type", TINY)
@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_peak_matches_memtracker(model_type, checkpointing, tmp_path):
    peak_against_memtracker(config(model_type), checkpointing, tmp_path)


def peak_against_memtracker(cfg: dict, checkpointing: str, tmp_path) -> None:
    model = hm.build(cfg)
    if checkpointing == "full":
        model.gradient_checkpointing_enable()
    import torch

    batch = hm.qwen_vl_inputs({**cfg, "_image_size": IMAGE}, 2, 64, torch.Generator().manual_seed(1), 2)
    opt = ref.OPTIMIZERS["adamw"](model.parameters(), **ref.IMPLS["foreach"])
    with hm.cuda_dropout():
        theirs = ref.measure(model, (batch["input_ids"], batch["labels"], batch["pixel_values"], batch["image_grid_thw"],
                                     batch["mm_token_type_ids"]),
                             lambda m, x, y, p, g, t: m(input_ids=x, labels=y, pixel_values=p, image_grid_thw=g,
                                                        mm_token_type_ids=t).loss, opt)
    ours = check_json(tmp_path, cfg, micro_batch=2, seq_len=64, checkpointing=checkpointing, optimizer_impl="foreach",
                      images_per_sample=2, image_size=IMAGE)["peak"]
    assert ours["phase"] == theirs["phase"], (ours, theirs)
    assert abs(ours["bytes"] - theirs["bytes"]) <= 0.05 * theirs["bytes"], (ours["bytes"], theirs["bytes"])


@pytest.mark.parametrize("model_type", TINY)
def test_a_frozen_vision_tower_trains_the_merger(model_type, tmp_path):
    """training.freeze_vision_tower (LLaMA-Factory's default): patch_embed and the blocks keep nothing and have no
    gradient; the merger and the text model train."""
    cfg = config(model_type)
    result = check_json(tmp_path, cfg, micro_batch=2, seq_len=40, freeze_vision_tower=True, image_size=IMAGE)
    assert result["diagnostics"] == []
    model = meta_model(cfg)
    frozen = ("model.visual.patch_embed.", "model.visual.blocks.")
    trains = sum(p.numel() for n, p in model.named_parameters() if not n.startswith(frozen))
    footprint = result["footprint"]
    assert footprint["gradients"] == 4 * trains and footprint["optimizer_state"] == 8 * trains
    measured = hm.measure({**cfg, "_image_size": IMAGE}, micro_batch=2, seq_len=40, freeze=frozen)["peak"]
    assert footprint["activations"] == measured


def test_images_must_fit_the_sequence(tmp_path):
    cfg = config("qwen2_vl")
    result = check_json(tmp_path, cfg, micro_batch=1, seq_len=20, images_per_sample=2, image_size=IMAGE)
    assert [d["code"] for d in result["diagnostics"]] == ["schema"] and "12 tokens each" in result["diagnostics"][0]["message"]
    # no image_size: the largest square the processor makes (980 x 980 px: 70 x 70 patches, 1,225 tokens)
    result = check_json(tmp_path, cfg, micro_batch=1, seq_len=1024)
    assert "1225 tokens each" in result["diagnostics"][0]["message"]
    result = check_json(tmp_path, cfg, micro_batch=1, seq_len=40, image_min_pixels=10_000, image_max_pixels=5_000)
    assert [d["code"] for d in result["diagnostics"]] == ["schema"]


def test_lora_on_the_vision_tower_is_refused(tmp_path):
    cfg = config("qwen2_5_vl")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "optimizer": "adamw", "model": {"hf_config": "config.json"},
           "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "gate_proj"]},
           "training": {"micro_batch": 1, "seq_len": 40, "image_size": IMAGE}}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(doc))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(tmp_path / "t.yaml")],
                          capture_output=True, text=True, timeout=120, check=False)
    diagnostics = json.loads(done.stdout)["files"][0]["diagnostics"]
    assert [d["code"] for d in diagnostics] == ["unsupported-model"] and "visual.blocks.0.mlp.gate_proj" in diagnostics[0]["message"]


@pytest.mark.parametrize("model_type, targets", [("qwen2_vl", ["qkv", "q_proj", "v_proj"]), ("qwen2_5_vl", ["proj", "down_proj"]),
                                                  ("qwen2_5_vl", "all-linear"), ("qwen2_vl", r".*visual\.merger\.mlp\.[02]")])
def test_the_refusal_names_the_vision_modules_peft_adapts(model_type, targets):
    """LoRA on the vision tower is refused, naming its modules: the ones peft itself wraps (a real tiny model),
    by suffix, whole-name regular expression and all-linear."""
    import torch
    import transformers

    peft = __import__("peft")
    cfg = config(model_type)
    torch.manual_seed(0)
    transformers.logging.set_verbosity_error()
    model = getattr(transformers, cfg["architectures"][0])(transformers.AutoConfig.for_model(
        model_type, **{k: v for k, v in cfg.items() if k != "model_type"}))
    adapted = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    wrapped = [name.split("base_model.model.model.", 1)[1] for name, module in adapted.named_modules()
               if hasattr(module, "lora_A") and ".visual." in name]
    mine = qwen_vl.vision_targets(hf_config.model_view(hf_config.normalize(cfg)), {"target_modules": targets})
    assert mine == wrapped and mine


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_lora_on_the_text_model(attention):
    """peft on q_proj/v_proj (the text model's only): the vision tower and merger frozen keep nothing."""
    from memfit.models import hf_activations

    cfg = config("qwen2_vl")
    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    run = dict(micro_batch=2, seq_len=40, attention=attention, checkpointing="none", lora=lora)
    measured = hm.measure({**cfg, "_image_size": IMAGE}, **run)["peak"]
    mine_cfg = hf_config.model_view(hf_config.normalize(cfg))
    mine_cfg["qwen_vl"]["image_size"] = IMAGE
    assert hf_activations.total(hf_activations.saved(mine_cfg, **run)) == measured


def test_the_examples_are_the_published_models(tmp_path):
    """Qwen2-VL-2B-Instruct, Qwen2.5-VL-3B-Instruct, Qwen2.5-VL-7B-Instruct as Qwen publishes their config.json: the
    parameters transformers builds (2,208,985,600; 3,754,622,976; 8,292,166,656), each example checked."""
    for name in ("qwen2-vl-2b-instruct", "qwen2.5-vl-3b-instruct", "qwen2.5-vl-7b-instruct"):
        raw = json.loads((ROOT / "examples" / "models" / f"{name}.json").read_text())
        assert hf_config.validate(raw) == []
        cfg = hf_config.model_view(hf_config.normalize(raw))
        assert hf.parameter_count(cfg) == sum(p.numel() for p in meta_model(raw).parameters())
    examples = sorted((ROOT / "examples" / "families").glob("qwen2*.yaml"))
    assert len(examples) == 3
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", *map(str, examples)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    for file in json.loads(done.stdout)["files"]:
        assert file["diagnostics"] == [] and file["footprint"]["activations"] > 0


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
@pytest.mark.parametrize("checkpointing", ["none", "full"])
@pytest.mark.parametrize("model_type", TINY)
def test_saved_bytes_in_16_bits(model_type, checkpointing, precision):
    """CPU autocast runs the vision tower in bf16 from the patch embedding on (LayerNorm included), each linear keeping
    its weight's bf16 copy; Qwen2.5-VL's RMSNorm product is fp32, so each of its linears casts a copy of its own.
    Measured: bf16-mixed exact (full checkpointing: within the cu_seqlens' bytes); bf16-true Qwen2-VL 0.2% over."""
    from memfit.models import hf_activations

    cfg = config(model_type)
    run = dict(micro_batch=2, seq_len=40, attention="sdpa", checkpointing=checkpointing, precision=precision)
    measured = hm.measure({**cfg, "_image_size": IMAGE}, images=2, **run)["peak"]
    mine_cfg = hf_config.model_view(hf_config.normalize(cfg))
    mine_cfg["qwen_vl"].update(image_size=IMAGE, images=2)
    mine = (hf_activations.peak_saved(mine_cfg, **run) if checkpointing == "full"
            else hf_activations.total(hf_activations.saved(mine_cfg, **run)))
    assert measured <= mine <= 1.003 * measured, (mine, measured)
    if precision == "bf16-mixed" and checkpointing == "none":
        assert mine == measured


# The text model's sliding layers (use_sliding_window, layers from max_window_layers on: Qwen2VLTextConfig) attend
# through create_sliding_window_causal_mask, Qwen2's: a window shorter than the text (24 < 64 tokens) hands sdpa a
# mask, k and v repeated to every query head. Before (memfit read no window), 2 x 64 with two images per sample:
# Qwen2-VL 5,211,364 B in the backward against 5,356,640 B measured in the forward (0.973), Qwen2.5-VL 5,818,660 B
# against 5,963,980 B (0.976); now 5,342,436 B and 5,949,732 B, in the forward (0.997, 0.998)
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("model_type", TINY)
def test_a_sliding_window_in_the_text_model_matches_memtracker(model_type, tmp_path):
    text = {**TEXT, "use_sliding_window": True, "sliding_window": 24, "max_window_layers": 0}
    assert config(model_type, text_config=text)["text_config"]["layer_types"] == ["sliding_attention"] * 2
    peak_against_memtracker(config(model_type, text_config=text), "none", tmp_path)

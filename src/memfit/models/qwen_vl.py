"""Qwen2-VL and Qwen2.5-VL (issue 34): their config (normalized as Qwen2VLConfig / Qwen2_5_VLConfig serialize it), the
images' geometry as Qwen2VLImageProcessor computes it, the vision tower's modules and what autograd keeps in it
(modeling_qwen2_vl.py, modeling_qwen2_5_vl.py, image_processing_qwen2_vl.py, vision_utils.py; transformers 5.24).

models/hf.py (parameters, training.images_per_sample / image_size) and models/hf_activations.py (what autograd keeps)
read it; the text model is a Qwen2 decoder rotated by multimodal rotary positions (its cos and sin are per sequence:
(b, s, head_dim), position ids (3, b, s)), which hf_activations models as Llama's layer with biased q/k/v.

Images. The processor resizes each image (smart_resize: both sides rounded to a multiple of patch_size x
spatial_merge_size, the area kept within [min_pixels, max_pixels]), cuts it into patch_size patches, repeats a still
image temporal_patch_size times (one temporal patch: grid_t 1) and expands each image's placeholder into
grid_h x grid_w / spatial_merge_size^2 image tokens, which count in the text sequence. The vision tower runs every
patch of every image of the micro-batch as one sequence of patches: Qwen2-VL attends within each image, Qwen2.5-VL
within windows of window_size pixels (fullatt_block_indexes attend within each image).
"""

from __future__ import annotations

import importlib
import math

from memfit.models.families import copied, part_base

# Qwen2VLImageProcessor's defaults (size: shortest_edge 56*56, longest_edge 28*28*1280 pixels)
MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 1280
BLOCKS = ("qwen2_vl", "qwen2_5_vl")
COMPOSITE = ("text_config", "vision_config")


def _fields(model_type: str):
    module = importlib.import_module(f"memfit.models.families.{model_type}")
    text = importlib.import_module("memfit.models.families.qwen2_vl").TEXT_FIELDS
    return text, module.VISION_FIELDS


def _text_given(raw: dict) -> dict:
    """The text model's keys: text_config when given, else the flat config.json's own (Qwen2VLConfig.__post_init__)."""
    text, _ = _fields(raw["model_type"])
    if isinstance(raw.get("text_config"), dict):
        return dict(raw["text_config"])
    out = {key: raw[key] for key in list(text) + ["rope_scaling", "rope_theta"] if key in raw}
    return out


def normalize_text(given: dict, dtype=None) -> dict:
    """Qwen2VLTextConfig: defaults, __post_init__ (the window only with use_sliding_window, key/value heads, layer types),
    convert_rope_params_to_dict (rope_scaling over rope_parameters, rope_theta 1e6, mrope read as default)."""
    text, _ = _fields("qwen2_vl")
    out = part_base(given.get("dtype", given.get("torch_dtype", dtype)))
    out.update({key: copied(default) for key, (default, _) in text.items()})
    extra = {}
    for key, value in given.items():
        if key in ("model_type", "transformers_version", "torch_dtype", "dtype"):
            continue
        if key in out:
            out[key] = copied(value)
        else:
            extra[key] = copied(value)
    if isinstance(out["dtype"], str) and out["dtype"].startswith("torch."):
        out["dtype"] = out["dtype"][len("torch."):]
    if not out["use_sliding_window"]:
        out["sliding_window"] = None
    if out["num_key_value_heads"] is None:
        out["num_key_value_heads"] = out["num_attention_heads"]
    if out["layer_types"] is None:
        window, first = out["sliding_window"], out["max_window_layers"]
        out["layer_types"] = ["sliding_attention" if window is not None and i >= first else "full_attention"
                              for i in range(out["num_hidden_layers"])]
    rope = extra.pop("rope_scaling", None) or out["rope_parameters"]
    rope = dict(rope) if rope else {}
    theta = extra.pop("rope_theta", None)
    rope.setdefault("rope_theta", 1000000.0 if theta is None else theta)
    if rope.get("rope_type", rope.get("type")) == "mrope":
        rope["rope_type"] = "default"
    rope.setdefault("rope_type", rope.get("type", "default"))
    out["rope_parameters"] = rope
    out.update(extra)
    out["_name_or_path"] = ""
    out["model_type"] = "qwen2_vl_text" if True else None
    out["output_attentions"] = False
    return out


def normalize_vision(model_type: str, given: dict | None) -> dict:
    _, vision = _fields(model_type)
    out = part_base()
    out.update({key: copied(default) for key, (default, _) in vision.items()})
    extra = {}
    for key, value in (given or {}).items():
        if key in ("model_type", "transformers_version"):
            continue
        if key == "num_attention_heads":
            key = "num_heads"
        elif key == "num_hidden_layers":
            key = "depth"
        (out if key in out else extra)[key] = copied(value)
    rope = dict(out["rope_parameters"] or {})
    rope.setdefault("rope_theta", 10000.0)
    rope.setdefault("rope_type", "axial")
    out["rope_parameters"] = rope
    out["_name_or_path"] = ""
    out.update(extra)
    out["model_type"] = f"{model_type}_vision"
    out["output_attentions"] = False
    return out


def normalize(raw: dict) -> dict:
    """What Qwen2VLConfig / Qwen2_5_VLConfig.to_dict() gives for `raw` (a flat config.json or one with text_config)."""
    from memfit.models.families import FAMILIES

    mt = raw["model_type"]
    family = FAMILIES[mt]
    dtype = raw.get("dtype", raw.get("torch_dtype"))
    if isinstance(dtype, str) and dtype.startswith("torch."):
        dtype = dtype[len("torch."):]
    out = part_base(dtype)
    for key in ("architectures", "output_hidden_states", "return_dict", "chunk_size_feed_forward", "problem_type"):
        if key in raw:
            out[key] = copied(raw[key])
    text = normalize_text(_text_given(raw), dtype)
    if mt == "qwen2_5_vl":
        text["model_type"] = "qwen2_5_vl_text"
    out["text_config"] = text
    out["vision_config"] = normalize_vision(mt, raw.get("vision_config"))
    for key, (default, _) in family.fields.items():
        if key not in COMPOSITE:
            out[key] = copied(raw.get(key, default))
    if not out["tie_word_embeddings"] and text.get("tie_word_embeddings"):
        out["tie_word_embeddings"] = True
    out["_name_or_path"] = ""
    out["model_type"] = mt
    out["output_attentions"] = False
    out["transformers_version"] = "5.24.0"
    return out


def model_view(cfg: dict) -> dict:
    """The dict models/hf.py and hf_activations.py read: the text model's keys at the top (model_type stays the
    family's), the vision tower and the composite keys under "qwen_vl"."""
    from memfit.models.families import FAMILIES

    mt = cfg["model_type"]
    text = dict(cfg["text_config"])
    own = {key: cfg[key] for key in FAMILIES[mt].fields if key not in COMPOSITE}
    return {**text, "model_type": mt, "architectures": cfg["architectures"], "tie_word_embeddings": cfg["tie_word_embeddings"],
            "qwen_vl": {**own, "vision": dict(cfg["vision_config"])}}


# ----------------------------------------------------------------------------------------- images


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """image_processing_qwen2_vl.smart_resize: both sides a multiple of `factor`, the area within [min, max] pixels."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def image_grid(cfg: dict) -> tuple[int, int]:
    """(grid_h, grid_w): one image's patches as the processor cuts it (training.image_size, else the largest square
    max_pixels allows)."""
    own = cfg["qwen_vl"]
    v = own["vision"]
    patch, merge = v["patch_size"], v["spatial_merge_size"]
    low, high = own.get("min_pixels", MIN_PIXELS), own.get("max_pixels", MAX_PIXELS)
    size = own.get("image_size")
    if size is None:
        side = math.isqrt(high)
        size = [side, side]
    elif isinstance(size, int):
        size = [size, size]
    h, w = smart_resize(size[0], size[1], patch * merge, low, high)
    return h // patch, w // patch


def image_tokens(cfg: dict) -> int:
    """The image tokens one image expands to in the text sequence (Qwen2VLProcessor.replace_image_token)."""
    gh, gw = image_grid(cfg)
    return gh * gw // cfg["qwen_vl"]["vision"]["spatial_merge_size"] ** 2


def windows(cfg: dict, gh: int, gw: int) -> list[int]:
    """Qwen2.5-VL: each window's patches for one image (vision_utils.get_vision_window_index)."""
    v = cfg["qwen_vl"]["vision"]
    merge = v["spatial_merge_size"]
    size = v["window_size"] // merge // v["patch_size"]
    lh, lw = gh // merge, gw // merge
    if size < 1:
        return [merge * merge] * (lh * lw)
    rows = [min(size, lh - i * size) for i in range(-(-lh // size))]
    cols = [min(size, lw - j * size) for j in range(-(-lw // size))]
    return [r * c * merge * merge for r in rows for c in cols]


def pixel_bytes(cfg: dict, micro_batch: int) -> int:
    """The processor's pixel_values for one micro-batch (fp32: patches x C x temporal_patch_size x patch^2), which the
    training loop's batch holds through the step."""
    from memfit.recipe.costs import dtype_bytes

    z = vision_sizes(cfg)
    gh, gw = image_grid(cfg)
    images = micro_batch * int(cfg["qwen_vl"].get("images", 1))
    return dtype_bytes(images * gh * gw * z["C"] * z["T"] * z["P"] * z["P"], "float32")


def vision_sizes(cfg: dict) -> dict:
    mt = cfg["model_type"]
    v = cfg["qwen_vl"]["vision"]
    if mt == "qwen2_vl":
        width, inner, out = v["embed_dim"], int(v["embed_dim"] * v["mlp_ratio"]), v["hidden_size"]
    else:
        width, inner, out = v["hidden_size"], v["intermediate_size"], v["out_hidden_size"]
    return {"E": width, "M": inner, "O": out, "H": v["num_heads"], "d": width // v["num_heads"], "layers": v["depth"],
            "C": v["in_channels"], "T": v["temporal_patch_size"], "P": v["patch_size"], "m": v["spatial_merge_size"]}


# ----------------------------------------------------------------------------------------- parameters


def vision_modules(cfg: dict) -> list:
    """The vision tower's modules (Qwen2VisionTransformerPretrainedModel / Qwen2_5_Vision...), paths under the base
    model: patch_embed, the blocks, the merger; as models/hf.Module's fields (path, type, dims)."""

    def Module(path, type_, dims):
        return (path, type_, dims)

    z = vision_sizes(cfg)
    E, M = z["E"], z["M"]
    rms = cfg["model_type"] == "qwen2_5_vl"
    norm = "rmsnorm" if rms else "layernorm"
    out = [Module("visual.patch_embed.proj.weight", "param", (E, z["C"], z["T"], z["P"], z["P"]))]
    for i in range(z["layers"]):
        at = f"visual.blocks.{i}."
        out += [Module(at + "norm1", norm, (E,)), Module(at + "norm2", norm, (E,)),
                Module(at + "attn.qkv", "linear", (E, 3 * E, True)), Module(at + "attn.proj", "linear", (E, E, True))]
        if rms:
            out += [Module(at + "mlp.gate_proj", "linear", (E, M, True)), Module(at + "mlp.up_proj", "linear", (E, M, True)),
                    Module(at + "mlp.down_proj", "linear", (M, E, True))]
        else:
            out += [Module(at + "mlp.fc1", "linear", (E, M, True)), Module(at + "mlp.fc2", "linear", (M, E, True))]
    wide = E * z["m"] ** 2
    return out + [Module("visual.merger.ln_q", norm, (E,)), Module("visual.merger.mlp.0", "linear", (wide, wide, True)),
                  Module("visual.merger.mlp.2", "linear", (wide, z["O"], True))]


def vision_targets(cfg: dict, lora: dict) -> list:
    """The vision modules (tower and merger) a LoRA config's target_modules would adapt, as peft picks them: a list
    matches a module whose name equals a target or ends in "." + target (the patch embedding's Conv3d `proj` too), a
    string is a regular expression the whole name must match, all-linear takes every linear but the output layer."""
    import re

    targets = lora.get("target_modules")
    if targets is None:
        return []
    modules = vision_modules(cfg)
    linear = [path for path, type_, _ in modules if type_ == "linear"]
    if targets in ("all-linear", ["all-linear"]):
        return linear
    # by name, peft also wraps the patch embedding's Conv3d (its LoRA takes convolutions)
    named = [path[: -len(".weight")] if type_ == "param" else path for path, type_, _ in modules if type_ in ("linear", "param")]
    if isinstance(targets, str):
        try:
            return [m for m in named if re.fullmatch(targets, "model." + m)]
        except re.error:
            return []
    names = [t for t in targets if isinstance(t, str)]
    return [m for m in named if any(m == t or m.endswith("." + t) for t in names)]


def adapted_vision(cfg: dict, lora: dict) -> str:
    """vision_targets as "visual.blocks.0.attn.qkv, visual.blocks.1.attn.qkv and 30 more", or ""."""
    hit = vision_targets(cfg, lora)
    return ", ".join(hit[:2]) + (f" and {len(hit) - 2} more" if len(hit) > 2 else "")


# ----------------------------------------------------------------------------------------- what autograd keeps


def _chunks(cfg: dict, images: int, full: bool) -> list[int]:
    """The patch counts attention runs over in one block: each image's (Qwen2-VL; Qwen2.5-VL's full-attention blocks),
    or each window's (Qwen2.5-VL's other blocks)."""
    gh, gw = image_grid(cfg)
    if cfg["model_type"] == "qwen2_vl" or full:
        return [gh * gw] * images
    return windows(cfg, gh, gw) * images

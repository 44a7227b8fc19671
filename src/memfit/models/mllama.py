"""Llama 3.2 Vision (transformers' mllama): its config (normalized as MllamaConfig serializes it), the vision tower's
and the cross-attention layers' modules, and what autograd keeps in the vision tower (modeling_mllama.py,
configuration_mllama.py, processing_mllama.py; transformers 5.24).

models/hf.py (parameters) and models/hf_activations.py (what autograd keeps) read it. The text model is a Llama
decoder whose `cross_attention_layers` are MllamaCrossAttentionDecoderLayer: q from the text, k and v from the
projected image tokens, an RMSNorm over each head of q and k, tanh gates on the attention and the MLP (the layer kind
"cross", hf_act_layers.cross_rows).

Images. The processor (processing_mllama.py, image_processing_mllama.py) cuts each image into up to max_image_tiles
tiles of image_size x image_size and pads every image to max_num_tiles tiles: pixel_values is
(batch, images, max_num_tiles, C, image_size, image_size), and the vision tower runs every tile, padding ones
included (MllamaVisionModel.forward, modeling_mllama.py:877-1013). Each image is one <|image|> token in the text;
the text attends to its tiles' patches: images x max_num_tiles x num_patches tokens per sample, where num_patches
is (image_size / patch_size)^2 + 1 (the class token, modeling_mllama.py:834).
"""

from __future__ import annotations

from memfit.models.families import copied, part_base
from memfit.models.families.mllama import TEXT_FIELDS, VISION_FIELDS

COMPOSITE = ("text_config", "vision_config")
ASPECT_RATIOS = [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]]   # MllamaVisionConfig.__post_init__
LAYERS = [3, 7, 15, 23, 30]   # intermediate_layers_indices' default
CROSS = [3, 8, 13, 18, 23, 28, 33, 38]   # cross_attention_layers' default


def _dtype(value):
    return value[len("torch."):] if isinstance(value, str) and value.startswith("torch.") else value


def normalize_text(given: dict | None) -> dict:
    """MllamaTextConfig: defaults, cross_attention_layers' default, convert_rope_params_to_dict (rope_scaling over
    rope_parameters, rope_theta 500000)."""
    given = dict(given or {})
    out = part_base(_dtype(given.get("dtype", given.get("torch_dtype"))))
    out.update({key: copied(default) for key, (default, _) in TEXT_FIELDS.items()})
    extra = {}
    for key, value in given.items():
        if key in ("model_type", "transformers_version", "torch_dtype", "dtype"):
            continue
        (out if key in out else extra)[key] = copied(value)
    if out["cross_attention_layers"] is None:
        out["cross_attention_layers"] = list(CROSS)
    rope = extra.pop("rope_scaling", None) or out["rope_parameters"]
    rope = dict(rope) if rope else {}
    theta = extra.pop("rope_theta", None)
    rope.setdefault("rope_theta", 500000.0 if theta is None else theta)
    rope.setdefault("rope_type", rope.pop("type", "default"))
    out["rope_parameters"] = rope
    out.update(extra)
    out["_name_or_path"] = ""
    out["model_type"] = "mllama_text_model"
    out["output_attentions"] = False
    return out


def normalize_vision(given: dict | None) -> dict:
    given = dict(given or {})
    out = part_base(_dtype(given.get("dtype", given.get("torch_dtype"))))
    out.update({key: copied(default) for key, (default, _) in VISION_FIELDS.items()})
    extra = {}
    for key, value in given.items():
        if key in ("model_type", "transformers_version", "torch_dtype", "dtype"):
            continue
        key = "attention_heads" if key == "num_attention_heads" else key
        (out if key in out else extra)[key] = copied(value)
    if out["supported_aspect_ratios"] is None:
        out["supported_aspect_ratios"] = copied(ASPECT_RATIOS)
    if out["intermediate_layers_indices"] is None:
        out["intermediate_layers_indices"] = list(LAYERS)
    out.update(extra)
    out["_name_or_path"] = ""
    out["model_type"] = "mllama_vision_model"
    out["output_attentions"] = False
    return out


def normalize(raw: dict) -> dict:
    """What MllamaConfig.to_dict() gives for `raw` (text_config and vision_config over their classes' defaults)."""
    out = part_base(_dtype(raw.get("dtype", raw.get("torch_dtype"))))
    for key in ("architectures", "output_hidden_states", "return_dict", "chunk_size_feed_forward", "problem_type"):
        if key in raw:
            out[key] = copied(raw[key])
    out["vision_config"] = normalize_vision(raw.get("vision_config"))
    out["text_config"] = normalize_text(raw.get("text_config"))
    out["image_token_index"] = raw.get("image_token_index", raw.get("image_token_id", 128256))
    out["_name_or_path"] = ""
    out["model_type"] = "mllama"
    out["output_attentions"] = False
    out["transformers_version"] = "5.24.0"
    return out


def model_view(cfg: dict) -> dict:
    """The dict models/hf.py and hf_activations.py read: the text model's keys at the top (model_type "mllama"), the
    vision tower and the image token under "mllama"."""
    text = dict(cfg["text_config"])
    return {**text, "model_type": "mllama", "architectures": cfg["architectures"],
            "mllama": {"image_token_index": cfg["image_token_index"], "vision": dict(cfg["vision_config"])}}


# ----------------------------------------------------------------------------------------- sizes


def vision_sizes(cfg: dict) -> dict:
    """The vision tower's widths and token counts: P patches per tile with the class token, Pp padded to a multiple of
    8 (MllamaVisionModel.forward pads each tile's patches, modeling_mllama.py:950), T tiles per image."""
    v = cfg["mllama"]["vision"]
    size, patch = v["image_size"], v["patch_size"]
    P = (size // patch) ** 2 + 1
    return {"E": v["hidden_size"], "M": v["intermediate_size"], "H": v["attention_heads"],
            "d": v["hidden_size"] // v["attention_heads"], "layers": v["num_hidden_layers"], "global": v["num_global_layers"],
            "C": v["num_channels"], "patch": patch, "size": size, "T": v["max_num_tiles"], "P": P, "Pp": P + (8 - P % 8) % 8,
            "ratios": len(v["supported_aspect_ratios"]), "out": v["vision_output_dim"],
            "features": len(v["intermediate_layers_indices"]) + 1}


def image_tokens(cfg: dict) -> int:
    """The image tokens the text attends to per image (every tile's patches, padding tiles included)."""
    z = vision_sizes(cfg)
    return z["T"] * z["P"]


# ----------------------------------------------------------------------------------------- parameters


def vision_modules(cfg: dict) -> list:
    """MllamaVisionModel's modules in registration order (modeling_mllama.py:826-858), paths under the base model;
    as models/hf.Module's fields (path, type, dims)."""
    z = vision_sizes(cfg)
    E, M, T, P, R = z["E"], z["M"], z["T"], z["P"], z["ratios"]
    at = "vision_model."
    out = [(at + "class_embedding", "param", (E,)),
           (at + "patch_embedding.weight", "param", (E, z["C"], z["patch"], z["patch"])),
           (at + "gated_positional_embedding.gate", "param", (1,)),
           (at + "gated_positional_embedding.embedding", "param", (P, E)),
           (at + "gated_positional_embedding.tile_embedding", "embedding", (R + 1, T * P * E)),
           (at + "pre_tile_positional_embedding.gate", "param", (1,)),
           (at + "pre_tile_positional_embedding.embedding", "embedding", (R + 1, T * E)),
           (at + "post_tile_positional_embedding.gate", "param", (1,)),
           (at + "post_tile_positional_embedding.embedding", "embedding", (R + 1, T * E)),
           (at + "layernorm_pre", "layernorm", (E,)), (at + "layernorm_post", "layernorm", (E,))]
    for stack, count, gated in (("transformer", z["layers"], False), ("global_transformer", z["global"], True)):
        for i in range(count):
            layer = f"{at}{stack}.layers.{i}."
            if gated:
                out += [(layer + "gate_attn", "param", (1,)), (layer + "gate_ffn", "param", (1,))]
            out += [(layer + "self_attn." + name, "linear", (E, E, False)) for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
            out += [(layer + "mlp.fc1", "linear", (E, M, True)), (layer + "mlp.fc2", "linear", (M, E, True)),
                    (layer + "input_layernorm", "layernorm", (E,)), (layer + "post_attention_layernorm", "layernorm", (E,))]
    return out


def cross_layer_modules(cfg: dict) -> list:
    """MllamaCrossAttentionDecoderLayer's modules (modeling_mllama.py:676-685): its own two gates first (named_parameters
    lists a module's own parameters before its children's), then cross_attn, input_layernorm, mlp, the second norm."""
    h, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d, inner = h // heads, cfg["intermediate_size"]
    return [("cross_attn_attn_gate", "param", (1,)), ("cross_attn_mlp_gate", "param", (1,)),
            ("cross_attn.q_proj", "linear", (h, heads * d, False)), ("cross_attn.k_proj", "linear", (h, kv * d, False)),
            ("cross_attn.v_proj", "linear", (h, kv * d, False)), ("cross_attn.o_proj", "linear", (heads * d, h, False)),
            ("cross_attn.q_norm", "rmsnorm", (d,)), ("cross_attn.k_norm", "rmsnorm", (d,)),
            ("input_layernorm", "rmsnorm", (h,)),
            ("mlp.gate_proj", "linear", (h, inner, False)), ("mlp.up_proj", "linear", (h, inner, False)),
            ("mlp.down_proj", "linear", (inner, h, False)), ("post_attention_layernorm", "rmsnorm", (h,))]


def adapted_vision(cfg: dict, lora: dict) -> str:
    """The vision tower's and projector's linears a LoRA config's target_modules would adapt, as peft picks them (a
    list: a name equal to a target or ending in "." + target; a string: a regular expression the whole name,
    model.<path>, must match; all-linear: every linear but the output layer), as "a, b and 30 more", or ""."""
    import re

    targets = lora.get("target_modules")
    if targets is None:
        return ""
    linear = [path for path, type_, _ in vision_modules(cfg) if type_ == "linear"] + ["multi_modal_projector"]
    if targets in ("all-linear", ["all-linear"]):
        hit = linear
    elif isinstance(targets, str):
        try:
            hit = [m for m in linear if re.fullmatch(targets, "model." + m)]
        except re.error:
            hit = []
    else:
        names = [t for t in targets if isinstance(t, str)]
        hit = [m for m in linear if any(m == t or m.endswith("." + t) for t in names)]
    return ", ".join(hit[:2]) + (f" and {len(hit) - 2} more" if len(hit) > 2 else "")


def batch_bytes(cfg: dict, micro_batch: int) -> int:
    """What MllamaProcessor adds to a batch, held all step: pixel_values (fp32, every image padded to max_num_tiles
    tiles), aspect_ratio_ids and aspect_ratio_mask (int64), and the cross-attention mask (int64, (b, s, images,
    tiles), at the seq_len hf_derive records)."""
    seq_len = cfg["mllama"].get("seq_len")
    z = vision_sizes(cfg)
    images = micro_batch * int(cfg["mllama"].get("images", 1))
    if not images:
        return 0
    pixels = 4 * images * z["T"] * z["C"] * z["size"] * z["size"]
    return pixels + 8 * images * (1 + z["T"]) + (8 * images * seq_len * z["T"] if seq_len else 0)

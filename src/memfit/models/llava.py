"""LLaVA's vision tower as its config sizes it (modeling_llava.py, modeling_clip.py; transformers 5.24): read by
models/hf.py (parameters, training.images_per_sample) and models/hf_activations.py (what autograd keeps)."""

from __future__ import annotations


def llava_vision_sizes(cfg: dict) -> dict:
    """The CLIP vision tower's sizes: hidden, heads, intermediate, layers, channels, image and patch size, patches (P,
    without the CLS token), the hidden state the projector reads (index into hidden_states) and the layers run up to it
    (the rest run and are dropped), the projector's input width."""
    v = cfg["llava"]["vision"]
    patches = (v["image_size"] // v["patch_size"]) ** 2
    layer = cfg["llava"]["vision_feature_layer"]
    n = v["num_hidden_layers"]
    picked = [x if x >= 0 else n + 1 + x for x in (layer if isinstance(layer, list) else [layer])]
    return {"hv": v["hidden_size"], "Hv": v["num_attention_heads"], "iv": v["intermediate_size"], "layers": n,
            "C": v["num_channels"], "image": v["image_size"], "patch": v["patch_size"], "P": patches,
            "used": max(picked), "features": len(picked), "cls": cfg["llava"]["vision_feature_select_strategy"] == "default"}


def reaches_no_loss(cfg: dict, name: str) -> bool:
    """Whether a parameter of the vision tower gets no gradient: the layers after the hidden state the projector reads
    (their outputs are dropped: modeling_llava.py get_image_features reads `hidden_states[vision_feature_layer]`) and
    post_layernorm (CLIPVisionTransformer's pooled output, which LLaVA never reads): no .grad, so AdamW keeps no state
    for them (measured: MemTracker's gradients and optimizer state in tests/models/test_llava.py)."""
    if not name.startswith("model.vision_tower."):
        return False
    if name.startswith("model.vision_tower.post_layernorm."):
        return True
    prefix = "model.vision_tower.encoder.layers."
    if not name.startswith(prefix):
        return False
    return int(name[len(prefix):].split(".", 1)[0]) >= llava_vision_sizes(cfg)["used"]

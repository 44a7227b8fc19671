"""The image settings of a vision-language fine-tune in the native formats (issue 34): LLaMA-Factory's processor
arguments (hparams/model_args.py ProcessorArguments.image_max_pixels, image_min_pixels) and
freeze_vision_tower (hparams/finetuning_args.py FinetuningArguments.freeze_vision_tower, default true), Axolotl's
image_size (utils/schemas/multimodal.py MultiModalConfig.image_size: an integer, a padded square, or (width,
height)), read into training.image_max_pixels / image_min_pixels / freeze_vision_tower / image_size where the model is
one memfit takes images for (models/qwen_vl.py; llava's vision tower has a fixed image size). Each reader calls its
function once its model is resolved (ctx.model_config)."""

from __future__ import annotations

DYNAMIC = ("qwen2_vl", "qwen2_5_vl")   # models whose processor sizes images by pixel counts
FREEZABLE = DYNAMIC + ("llava",)


def _model_type(ctx) -> str | None:
    raw = getattr(ctx, "model_config", None)
    return raw.get("model_type") if isinstance(raw, dict) else None


def llamafactory(r, ctx) -> None:
    kind = _model_type(ctx)
    data = r.data
    if kind in DYNAMIC:
        # mm_plugin._preprocess_image scales an image down to image_max_pixels (up to image_min_pixels) before
        # the processor's own smart_resize: the processor then sees images within these bounds
        for key, default in (("image_max_pixels", 768 * 768), ("image_min_pixels", 32 * 32)):
            r.set(("training", key), r.get(key, (int,), default), r.at(key) if key in data else None)
    if kind in FREEZABLE:
        freeze = r.get("freeze_vision_tower", (bool,), True)
        r.set(("training", "freeze_vision_tower"), freeze, r.at("freeze_vision_tower") if "freeze_vision_tower" in data else None)


def axolotl(r, ctx) -> None:
    if _model_type(ctx) not in DYNAMIC or "image_size" not in r.data:
        return
    size = r.get("image_size", (int, list), None)
    if isinstance(size, list) and len(size) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in size):
        size = [size[1], size[0]]   # Axolotl's (width, height); memfit's [height, width]
    if isinstance(size, int) and not isinstance(size, bool) or isinstance(size, list):
        r.set(("training", "image_size"), size, r.at("image_size"))

"""A transformers model's registered buffers: what `model.named_buffers()` of the transformers 5.24 class yields
for a config (the rotary embedding's inv_freq and original_inv_freq, BERT's position_ids and token_type_ids,
Gemma's embedding scale, DeepSeek-V3's router bias). They live on the device beside the parameters, without
gradients or optimizer state: the footprint counts them under `parameters` (as non-trainable tensors) and the
step's walk holds them for the whole step, so the two agree (tests/models/test_buffers.py builds each family on
the meta device and compares with `model.named_buffers()`).

A buffer's dtype is the one a model loaded with `from_pretrained(..., dtype=...)` keeps it in (transformers 5.24):
the rotary embedding computes inv_freq in float32 and keeps it there, DeepSeek-V3 keeps its router bias in float32
(_keep_in_fp32_modules_strict), BERT's ids are int64; None where it is made in the model's dtype (Gemma's
embed_scale). (`model.to(dtype)` after loading would cast the float ones too.)
"""

from __future__ import annotations

from typing import NamedTuple

from memfit.models.families import FAMILIES


class Buffer(NamedTuple):
    name: str
    shape: tuple
    dtype: str | None  # None: the model's dtype once it is cast


def buffers(cfg: dict, rotary: int) -> list[Buffer]:
    """The buffers of a normalized config, in `named_buffers()` order; `rotary` is the rotary dimension (0 for
    absolute positions: hf_activations' sizes["rot"])."""
    fam = FAMILIES[cfg["model_type"]]
    base, mt = fam.base, cfg["model_type"]
    out: list[Buffer] = []
    if mt == "whisper" or cfg.get("traced_model_type"):
        # Whisper's positions are parameters (the encoder's frozen sinusoids): no buffers; a traced architecture is
        # priced under its nearest family, whose buffers are not its own (the trace counts its parameters only)
        return out
    if mt in ("bert", "roberta"):   # (RoBERTa: the same two buffers)
        positions = (1, cfg["max_position_embeddings"])
        return [Buffer(f"{base}.embeddings.position_ids", positions, "int64"),
                Buffer(f"{base}.embeddings.token_type_ids", positions, "int64")]
    if mt == "llava":  # the CLIP vision tower's position ids (CLIPVisionEmbeddings: one per patch and the class token)
        from memfit.models.llava import llava_vision_sizes

        out.append(Buffer("model.vision_tower.vision_model.embeddings.position_ids", (1, llava_vision_sizes(cfg)["P"] + 1), "int64"))
    if mt in ("qwen2_vl", "qwen2_5_vl"):  # the vision tower's rotary (VisionRotaryEmbedding(head_dim // 2): dim / 2 each)
        from memfit.models.qwen_vl import vision_sizes

        half = (vision_sizes(cfg)["d"] // 4,)
        out += [Buffer("model.visual.rotary_pos_emb.inv_freq", half, "float32"),
                Buffer("model.visual.rotary_pos_emb.original_inv_freq", half, "float32")]
    if mt in ("gemma", "gemma2", "gemma3_text"):  # the scaled word embedding's normalizer: a scalar in the model's dtype
        out.append(Buffer(f"{base}.embed_tokens.embed_scale", (), None))
    if mt == "deepseek_v3":  # each MoE layer's router keeps e_score_correction_bias (n_routed_experts)
        first = min(cfg["num_hidden_layers"], cfg.get("first_k_dense_replace") or 0)
        out += [Buffer(f"{base}.layers.{i}.mlp.gate.e_score_correction_bias", (cfg["n_routed_experts"],), "float32")
                for i in range(first, cfg["num_hidden_layers"])]
    if rotary:
        half = (rotary // 2,)
        if mt == "gemma3_text":  # one inv_freq pair per layer type present (Gemma3RotaryEmbedding)
            kinds = [f"{t}_" for t in dict.fromkeys(cfg.get("layer_types") or ())] or [""]
        else:
            kinds = [""]
        for kind in kinds:
            out += [Buffer(f"{base}.rotary_emb.{kind}inv_freq", half, "float32"),
                    Buffer(f"{base}.rotary_emb.{kind}original_inv_freq", half, "float32")]
    return out

"""What autograd keeps for one config, evaluated (models/hf_activations.py): `saved`, `peak_saved`, `recomputed`
(memoized per config), the vision towers kept with the embeddings (LLaVA's CLIP, Qwen-VL's), and the
encoder-decoder stacks (`stacked_saved`, `stacked_peak_saved`)."""

from __future__ import annotations

from functools import lru_cache
from math import prod

from memfit.models import hf_encdec
from memfit.models.hf_act_ops import _activation, ACTIVATIONS, Block, Conditions, ActivationRules, K, Kept, _norm, TRUE_DTYPE
from memfit.models.hf_act_families import FAMILIES
from memfit.models.hf_act_layers import (
    _attention, BLOCK_NAMES, classifier, CLASSIFIER_LOSS_ROWS, _classifier_rows, _embedding_rows, _head_rows,
    _kind_family, layer_kinds, layer_rows, count_layers, LOSS_ROWS, _mlp,
)
from memfit.models.hf_act_eval import (
    _act, _boundary, check, _chunk_masked, layer_conditions, role_dtypes, _grads, _layer_blocks, _layer_types, _parallel,
    _quantized_base, _resolve, _shape, layer_sizes, _t5_sizes, trainable_flags, _window_conditions, _window_layers,
    cross_grads,
)
from memfit.models.hf_act_t5 import (
    _t5_conditions, _t5_embedding_rows, _t5_encoder_output_label, _t5_flags, _t5_head_rows, t5_layer_rows, t5_quantized_base,
)


CLIP_VISION = ActivationRules("layer", {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
                               "o": "self_attn.out_proj", "fc_in": "mlp.fc1", "fc_out": "mlp.fc2", "lm_head": "-"},
                     "separate", None, "plain", "hidden_act", False, dropout_keys=(("attn", "attention_dropout"),))


def _clip_rows(act: str) -> list:
    X, n = ("b", "s", "h"), CLIP_VISION.names
    return (_norm("layer", "layer_norm1", X, "x") + _attention(CLIP_VISION, n)
            + _norm("layer", "layer_norm2", X, "h1") + _mlp(CLIP_VISION, n, act))


def _llava_kept(cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora, shape=_shape):
    """LLaVA's vision tower and projector (LlavaModel.get_image_features), run on micro_batch x images images: (what
    stays kept, one vision layer's recomputation under full checkpointing beyond its input). The tower runs every
    layer, but the layers after the hidden state the projector reads (vision_feature_layer, -2 by default) reach no
    loss: their tensors are freed with the tower's outputs and are not counted; nor is post_layernorm's."""
    from memfit.models.llava import llava_vision_sizes

    own = cfg["llava"]
    images = micro_batch * int(own.get("images", 1))
    if images == 0:
        return [], [], False
    z = llava_vision_sizes(cfg)
    v = own["vision"]
    frozen = bool(own.get("freeze_vision_tower"))
    tokens = z["P"] if z["cls"] else z["P"] + 1
    d = z["hv"] // z["Hv"]
    sizes = {"b": images, "s": z["P"] + 1, "h": z["hv"], "i": z["iv"], "H": z["Hv"], "KV": z["Hv"], "d": d,
             "dk": -(-d // 8) * 8 if attention == "flash" else d, "q": z["hv"], "kv": z["hv"], "qkv": 3 * z["hv"], "rot": 0,
             "r": 0, "T": images * (z["P"] + 1), "R": int((lora or {}).get("r") or 0), "C": z["C"], "HI": z["image"],
             "p": z["patch"], "Pt": tokens, "F": z["features"] * z["hv"], "th": cfg["hidden_size"], "tb": micro_batch,
             "ts": seq_len, "TP": images * tokens}
    vcfg = {"num_attention_heads": z["Hv"], "attention_dropout": v.get("attention_dropout", 0.0), "use_cache": False}
    cond = layer_conditions(vcfg, CLIP_VISION, attention, checkpointing, images, precision, lora)
    roles = role_dtypes(precision, dtypes)
    w = trainable_flags(CLIP_VISION, lora)
    if frozen:
        w = {key: False for key in w}
    text_w = trainable_flags(FAMILIES["llava"], lora)
    rows = _clip_rows(v["hidden_act"])
    first = _grads(CLIP_VISION, w, w["W:embed"], False)
    later = _grads(CLIP_VISION, w, first["out"], False)
    layer0 = _resolve(rows, cond, roles, sizes, {**w, **first}, shape)
    layer1 = _resolve(rows, cond, roles, sizes, {**w, **later}, shape)
    out_grad = (later if z["used"] > 1 else first)["out"] if z["used"] else w["W:embed"]
    X = ("b", "s", "h")
    embed_rows = [K("patch_embedding", "pixel values (in the model's dtype; autocast's low copy)", ("b", "C", "HI", "HI"),
                    "low", None, ("W:embed",)),
                  K("patch_embedding", "weight, cast to the low dtype by autocast", ("h", "C", "p", "p"), "low", "mixed",
                    ("W:embed",))] + [r._replace(op="pre_layrnorm") for r in _norm("layer", "", X, "W:embed")]
    # the projector reads hidden_states[layer][:, 1:] (default) or all of it: a view of the tower's storage where
    # nothing forces a copy (one image, or no CLS cut and one layer), else a contiguous copy
    view = z["features"] == 1 and (images == 1 or not z["cls"])
    # (a view of the input of a layer that runs after it: that layer's layer_norm1 keeps the storage already)
    shared_view = view and z["used"] < z["layers"] and checkpointing != "full" and (later["x"] or w["W:norm"])
    w_proj = not lora   # the projector trains, also with the vision tower frozen; peft's LoRA freezes it
    pg = w_proj or out_grad   # the projector's output needs a gradient
    flags = {"W:embed": w["W:embed"], "W:proj": w_proj, "vx": out_grad, "pg": pg, "mix": pg or text_w["W:embed"]}
    act = own["projector_hidden_act"]
    proj_rows = [
        K("multi_modal_projector.linear_1", "input (the vision hidden state it reads: a view)", X, "act", "not_mixed&pv",
          ("W:proj",)),
        K("multi_modal_projector.linear_1", "input", ("TP", "F"), "act", "not_mixed&pc", ("W:proj",)),
        K("multi_modal_projector.linear_1", "input, cast to the low dtype by autocast", ("TP", "F"), "low", "mixed",
          ("W:proj",)),
        K("multi_modal_projector.linear_1", "weight, cast to the low dtype by autocast", ("th", "F"), "low", "mixed", ("vx",)),
        *_activation(act, "multi_modal_projector.act", ("TP", "th"), "pg"),
        K("multi_modal_projector.linear_2", "input (the activation's output)", ("TP", "th"), "lin", None, ("W:proj",)),
        K("multi_modal_projector.linear_2", "weight, cast to the low dtype by autocast", ("th", "th"), "low", "mixed", ("pg",)),
        K("masked_scatter", "the image-token mask (bool)", ("tb", "ts"), "bool", None, ("mix",)),
    ]
    pcond = Conditions(cond)
    pcond.update({"pv": view and not shared_view, "pc": not view})
    kept = _resolve(embed_rows, cond, roles, sizes, flags, shape)
    if checkpointing == "full":
        boundary = Kept("vision layer: its input (kept for the recomputation)", shape(X, sizes), roles["act"])
        kept += [boundary._replace(label=f"vision layer {i}: its input (kept for the recomputation)")
                 for i in range(z["used"]) if first["x"] or later["x"] or w["W:norm"]]
        recomputed = [k for k in layer1 if not k.label.startswith("layer_norm1: input")]
    else:
        # every layer runs, and the tower's output (LlavaModel's output holds it) keeps the layers after the hidden
        # state the projector reads, and post_layernorm on the CLS token, alive to the end of the forward
        for i in range(z["layers"]):
            kept += [k._replace(label=f"vision layer {i} {k.label}") for k in (layer0 if i == 0 else layer1)]
        recomputed = []
    kept += _resolve(proj_rows, pcond, roles, sizes, flags, shape)
    return kept, recomputed, pg


# Qwen2-VL / Qwen2.5-VL's vision tower and merger (issue 34; the sizes and images: models/qwen_vl.py)
def _qwen_vl_kept(cfg: dict, micro_batch: int, seq_len: int, attention: str, checkpointing: str, roles: dict, lora) -> tuple:
    """The vision tower and merger run on micro_batch x images images: (what stays kept through the forward, the
    largest vision block's recomputation under full checkpointing beyond its input, whether the image features
    need a gradient). The tower trains unless training.freeze_vision_tower (then patch_embed and the blocks are
    frozen and keep nothing; the merger trains) or a LoRA adapter freezes the model (peft: nothing of the vision
    tower is adapted by the text model's target modules: the tower and merger keep nothing)."""

    from memfit.models.qwen_vl import _chunks, image_grid, vision_sizes

    own = cfg["qwen_vl"]
    images = micro_batch * int(own.get("images", 1))
    if images == 0:
        return [], [], False
    z = vision_sizes(cfg)
    E, M, H, d, m = z["E"], z["M"], z["H"], z["d"], z["m"]
    gh, gw = image_grid(cfg)
    N = images * gh * gw
    tower = not lora and not own.get("freeze_vision_tower")
    merger = not lora
    if not merger:
        return [], [], False
    # CPU autocast (bf16-mixed) runs the Conv3d in the low dtype: the residual stream, LayerNorm (not autocast there)
    # and every linear's output are low from the patch embedding on; each linear keeps autocast's low copy of its
    # weight (and of an fp32 input: Qwen2.5-VL's RMSNorm multiplies by its fp32 weight). Under *-true and 32-true
    # every tensor is the model's dtype: `lin` is the tower's dtype in each recipe.
    lin, f32, low = roles["lin"], "float32", roles["low"]
    mixed = roles["act"] != roles["lin"]
    rms = cfg["model_type"] == "qwen2_5_vl"
    eager = attention == "eager"

    def weights(*shapes, label="") -> list:
        return [Kept(f"{label}weight, cast to the low dtype by autocast", shape, low) for shape in shapes] if mixed else []

    def norm(label: str) -> list:
        if rms:
            return [Kept(f"{label}: input, upcast to fp32 (in fp32 the input itself)", (N, E), f32),
                    Kept(f"{label}: 1/rms", (N, 1), f32),
                    Kept(f"{label}: normalized, cast back to the input dtype (weight * it)", (N, E), lin)]
        return [Kept(f"{label}: input", (N, E), lin), Kept(f"{label}: mean (fp32)", (N, 1), f32),
                Kept(f"{label}: 1/std (fp32)", (N, 1), f32)]

    def block(full: bool) -> list:
        rows = norm("norm1") + [Kept("attn.qkv: input", (N, E), lin)]
        rows.append(Kept("attention: v (a view of attn.qkv's output, which it keeps whole)", (N, 3 * E), lin))
        chunks = _chunks(cfg, int(own.get("images", 1)) * micro_batch, full)
        if eager:
            rows += [Kept("q @ k^T: q (each chunk's copy)", (H, N, d), lin), Kept("q @ k^T: k^T (each chunk's copy)", (H, d, N), lin),
                     Kept("softmax: probabilities of every chunk (fp32)", (H, sum(c * c for c in chunks)), f32)]
            if lin != f32:
                rows.append(Kept("p @ v: probabilities, cast to the value dtype", (H, sum(c * c for c in chunks)), lin))
        else:
            rows += [Kept("attention: q (after the rotary)", (N, H, d), lin), Kept("attention: k (after the rotary)", (N, H, d), lin),
                     Kept("attention: every chunk's output", (N, H, d), lin), Kept("attention: log-sum-exp (fp32)", (H, N), f32)]
        rows.append(Kept("attn.proj: input (the chunks' outputs, concatenated)", (N, E), lin))
        rows += norm("norm2")
        if rms:
            rows.append(Kept("mlp.gate_proj/up_proj: input", (N, E), lin))
            if mixed:   # (each autocast linear casts the fp32 product itself: up_proj keeps a copy of its own)
                rows.append(Kept("mlp.up_proj: input, cast to the low dtype by autocast", (N, E), lin))
            rows += [Kept("act_fn(gate): input (the projection's output)", (N, M), lin),
                     Kept("act * up: act_fn(gate)", (N, M), lin), Kept("act * up: up", (N, M), lin),
                     Kept("mlp.down_proj: input", (N, M), lin)]
            rows += weights((3 * E, E), (E, E), (M, E), (M, E), (E, M), label="qkv/proj/gate/up/down: ")
        else:
            extra = ACTIVATIONS[cfg["qwen_vl"]["vision"]["hidden_act"]] or []
            rows += [Kept("mlp.fc1: input", (N, E), lin), Kept("act: input (the projection's output)", (N, M), lin)]
            rows += [Kept(f"act: {what}", (N, M), lin) for what in extra]
            rows.append(Kept("mlp.fc2: input (the activation's output)", (N, M), lin))
            rows += weights((3 * E, E), (E, E), (M, E), (E, M), label="qkv/proj/fc1/fc2: ")
        return rows

    full_layers = set(cfg["qwen_vl"]["vision"].get("fullatt_block_indexes") or ()) if rms else set()
    out: list = []
    recomputed: list = []
    if tower:
        out.append(Kept("patch_embed (Conv3d): pixel values", (N, z["C"], z["T"], z["P"], z["P"]), lin))
        out += weights((E, z["C"], z["T"], z["P"], z["P"]), label="patch_embed: ")
        rotary = [Kept("vision rotary: cos (shared by every block)", (N, 1, d), f32),
                  Kept("vision rotary: sin (shared by every block)", (N, 1, d), f32)]
        if rms:
            out.append(Kept("window order: the patches' window index (int64)", (N // (m * m),), "int64"))
        if checkpointing == "full":
            # (torch.utils.checkpoint saves a block's tensor inputs: its hidden states and cu_seqlens; the rotary's cos
            # and sin come in a tuple, kept by the recomputed block only)
            chunks = len(_chunks(cfg, images, False)) if rms else images
            out += [Kept(f"vision block {i}: its input (kept for the recomputation)", (N, E), lin) for i in range(z["layers"])]
            out += [Kept(f"vision block {i}: cu_seqlens (int32)", (1 + (images if i in full_layers or not rms else chunks),), "int32")
                    for i in range(z["layers"])]
            recomputed = [rotary + [k for k in block(i in full_layers) if not k.label.startswith("norm1: input")]
                          for i in range(z["layers"])]
        else:
            out += rotary
            for i in range(z["layers"]):
                out += [k._replace(label=f"vision block {i} {k.label}") for k in block(i in full_layers)]
    wide = E * m * m
    # (a frozen tower's output needs no gradient: RMSNorm's pow and 1/rms then keep nothing, weight * normalized its
    # normalized input; nn.LayerNorm keeps input and statistics for its weight's gradient all the same)
    merger_norm = norm("ln_q") if tower or not rms else norm("ln_q")[2:]
    out += [k._replace(label=f"merger.{k.label}") for k in merger_norm]
    out += [Kept("merger.mlp.0: input (ln_q's output, viewed)", (N, E), lin),
            Kept("merger GELU: input", (N // (m * m), wide), lin), Kept("merger.mlp.2: input (GELU's output)", (N // (m * m), wide), lin)]
    out += weights(*([(wide, wide)] if tower else []), (z["O"], wide), label="merger.mlp.0/mlp.2: ")
    if rms:
        out.append(Kept("merger output, back in image order: the reverse index (int64)", (N // (m * m),), "int64"))
    out.append(Kept("masked_scatter: the image-token mask (bool)", (micro_batch, seq_len, 1), "bool"))
    return out, recomputed, True


def _qwen_vl_recompute_peak(cfg: dict, micro_batch: int, seq_len: int, attention: str, roles: dict, lora) -> int:
    """Under full checkpointing, the vision tower's worst moment in the backward: block i is recomputed once the text
    model, the merger and the blocks above it are done (their saved tensors and inputs released), so what lives is the
    patch embedding's input, the window order, the inputs of blocks 0..i and block i's recomputation (the rotary's
    cos and sin with it). The largest over the blocks (Qwen2.5-VL's full-attention blocks recompute more)."""
    out, recomputed, _ = _qwen_vl_kept(cfg, micro_batch, seq_len, attention, "full", roles, lora)
    if not recomputed:
        return 0
    base = [k for k in out if k.label.startswith(("patch_embed", "window order"))]
    inputs = [k for k in out if k.label.startswith("vision block")]
    per_block = len(inputs) // len(recomputed)   # (its hidden states and its cu_seqlens)
    return max(nbytes(base) + nbytes([k for k in inputs if int(k.label.split()[2].rstrip(":")) <= i]) + nbytes(again)
               for i, again in enumerate(recomputed)) if per_block else 0


# Llama 3.2 Vision's vision tower, projector and what its cross-attention layers share (models/mllama.py)
def _mllama_kept(cfg: dict, micro_batch: int, seq_len: int, attention: str, checkpointing: str, roles: dict, lora) -> tuple:
    """MllamaVisionModel.forward (modeling_mllama.py:877-1013) on micro_batch x images images of max_num_tiles tiles,
    then multi_modal_projector (:1356): (what stays kept through the forward, [], whether the image tokens need a
    gradient). Its encoder layers are plain nn.Modules, not GradientCheckpointingLayer: transformers' checkpointing
    leaves the vision tower as it is. Under LoRA (peft freezes the model; targets reaching the vision tower are refused)
    the tower and projector keep nothing. Each tile's patches are padded to a multiple of 8 (:950), and the local and
    the global transformer both attend over all of an image's tiles (T x Pp tokens), masked by
    _prepare_aspect_ratio_attention_mask (one (B, 1, L, L) mask for every layer, kept by sdpa)."""
    from memfit.models.mllama import vision_sizes

    images = micro_batch * int(cfg["mllama"].get("images", 1))
    shared = _mllama_shared(cfg, micro_batch, seq_len, attention, roles, lora)
    # under full checkpointing transformers calls enable_input_require_grads, which hooks every sub-model's input
    # embeddings (modeling_utils.py enable_input_require_grads): the vision model's patch_embedding output then needs a
    # gradient, and a frozen tower records what its inputs' gradients need (norms, attention, activations)
    hooked = bool(lora) and checkpointing == "full"
    if images == 0 or (lora and not hooked):
        return shared, [], False
    z = vision_sizes(cfg)
    E, M, H, d, T, P, Pp = z["E"], z["M"], z["H"], z["d"], z["T"], z["P"], z["Pp"]
    B, L = images, z["T"] * z["Pp"]
    lin, f32 = roles["lin"], "float32"
    eager = attention == "eager"

    def layer(at: str, gated: bool) -> list:
        rows = [Kept(f"{at}input_layernorm: input", (B, L, E), lin), Kept(f"{at}input_layernorm: mean", (B, L, 1), lin),
                Kept(f"{at}input_layernorm: 1/std", (B, L, 1), lin), Kept(f"{at}q/k/v_proj: input", (B * L, E), lin)]
        if eager:   # eager_attention_forward: q @ k^T, fp32 softmax cast back, p @ v, the heads merged by a copy
            rows += [Kept(f"{at}q @ k^T: q", (B, H, L, d), lin), Kept(f"{at}q @ k^T: k^T", (B, H, d, L), lin),
                     Kept(f"{at}softmax: probabilities (fp32)", (B, H, L, L), f32)]
            if lin != f32:
                rows.append(Kept(f"{at}p @ v: probabilities, cast to the value dtype", (B, H, L, L), lin))
            rows += [Kept(f"{at}p @ v: v", (B, H, L, d), lin), Kept(f"{at}o_proj: input (the heads merged)", (B * L, E), lin)]
        else:
            rows += [Kept(f"{at}attention: {what}", (B, H, L, d), lin) for what in ("q", "k", "v", "output")]
            rows.append(Kept(f"{at}attention: log-sum-exp (fp32)", (B, H, L), f32))
        if gated:
            rows += [Kept(f"{at}tanh(gate_attn)", (1,), lin), Kept(f"{at}gate_attn *: o_proj's output", (B, L, E), lin)]
        rows += [Kept(f"{at}post_attention_layernorm: input", (B, L, E), lin), Kept(f"{at}post_attention_layernorm: mean", (B, L, 1), lin),
                 Kept(f"{at}post_attention_layernorm: 1/std", (B, L, 1), lin), Kept(f"{at}mlp.fc1: input", (B * L, E), lin)]
        rows += [Kept(f"{at}mlp act: input", (B, L, M), lin)]
        rows += [Kept(f"{at}mlp act: {what}", (B, L, M), lin) for what in ACTIVATIONS[cfg["mllama"]["vision"]["hidden_act"]] or []]
        rows.append(Kept(f"{at}mlp.fc2: input", (B * L, M), lin))
        if gated:
            rows += [Kept(f"{at}tanh(gate_ffn)", (1,), lin), Kept(f"{at}gate_ffn *: fc2's output", (B, L, E), lin)]
        return rows

    out = [Kept("patch_embedding (Conv2d): pixel values, in the model's dtype", (B * T, z["C"], z["size"], z["size"]), lin),
           Kept("tile embeddings: aspect_ratio_ids (int64; one tensor for the three lookups)", (B, 1), "int64"),
           Kept("pre_tile_positional_embedding: tanh(gate)", (1,), lin),
           Kept("pre_tile_positional_embedding: the tile embeddings (for the gate's gradient)", (B, T, 1, E), lin),
           Kept("gated_positional_embedding: tanh(gate)", (1,), lin), Kept("gated_positional_embedding: 1 - tanh(gate)", (1,), lin),
           Kept("gated_positional_embedding: tanh(gate) again", (1,), lin),
           Kept("gated_positional_embedding: the tile position embeddings (for the gate's gradient)", (B, T, P, E), lin),
           Kept("layernorm_pre: input", (B, T, P, E), lin), Kept("layernorm_pre: mean", (B, T, P, 1), lin),
           Kept("layernorm_pre: 1/std", (B, T, P, 1), lin)]
    if not eager:
        out.append(Kept("the aspect-ratio attention mask (a float bias, one for every vision layer)", (B, 1, L, L), lin))
    for i in range(z["layers"]):
        out += layer(f"vision layer {i} ", False)
    out += [Kept("layernorm_post: input", (B, L, E), lin), Kept("layernorm_post: mean", (B, L, 1), lin),
            Kept("layernorm_post: 1/std", (B, L, 1), lin), Kept("post_tile_positional_embedding: tanh(gate)", (1,), lin),
            Kept("post_tile_positional_embedding: the tile embeddings (for the gate's gradient)", (B, T, 1, E), lin)]
    for i in range(z["global"]):
        out += layer(f"global layer {i} ", True)
    out.append(Kept("multi_modal_projector: input (the last and intermediate layers' features, unpadded)",
                    (B * T * P, z["out"]), lin))
    if hooked:   # frozen weights: what only their gradients need is not kept (linears' inputs, the gated products)
        weight_only = ("patch_embedding", "tile embeddings", "pre_tile", "gated_positional", "post_tile", "multi_modal")
        out = [k for k in out if not k.label.startswith(weight_only) and not k.label.endswith(
            ("q/k/v_proj: input", "mlp.fc1: input", "mlp.fc2: input", "o_proj's output", "fc2's output", "(the heads merged)"))]
    return out + shared, [], True


def _mllama_shared(cfg: dict, micro_batch: int, seq_len: int, attention: str, roles: dict, lora) -> list:
    """What every cross-attention layer reads and keeps once: the projected image tokens (k_proj's and v_proj's
    input, while their weights train), the cross-attention mask as a float bias (sdpa keeps it;
    _prepare_cross_attention_mask, modeling_mllama.py:53), the full-text-row mask (the MLP output's multiplier)."""
    from memfit.models.mllama import image_tokens

    if not cfg["cross_attention_layers"]:
        return []
    n = int(cfg["mllama"].get("images", 1)) * image_tokens(cfg)
    lin = roles["lin"]
    # (kept while k_proj's or v_proj's weight trains, or an adapter on them reads it in its own dtype: one storage for
    # every cross-attention layer; an adapter of another dtype keeps its own copy, with its layer)
    cross = trainable_flags(_kind_family(FAMILIES["mllama"], "cross"), lora)
    adapted = roles["ada"] == lin and any(cross.get(f"L:cross_attn.{m}_proj") for m in "kv")
    out = [Kept("cross-attention k_proj/v_proj: input (the projected image tokens)", (micro_batch * n, cfg["hidden_size"]), lin)
           ] if not lora or adapted else []
    if attention != "eager":
        out.append(Kept("cross attention: the cross-attention mask as a float bias", (micro_batch, 1, seq_len, n), lin))
    return out + [Kept("cross-attention MLP: the full-text-row mask", (micro_batch, 1, seq_len, 1), lin)]


class _Key:
    """A config dict (or None) keyed by its frozen value, carrying the dict itself: `_evaluate`'s memo compares
    configs by what they hold, and the evaluation reads the dict it was given."""

    __slots__ = ("value", "frozen")

    def __init__(self, value):
        self.value = value
        self.frozen = _freeze(value)

    def __hash__(self):
        return hash(self.frozen)

    def __eq__(self, other):
        return isinstance(other, _Key) and self.frozen == other.frozen


def _freeze(value):
    if isinstance(value, dict):
        return tuple(sorted(((k, _freeze(v)) for k, v in value.items()), key=lambda kv: repr(kv[0])))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, *(_freeze(v) for v in value))
    return (type(value).__name__, value)  # 1, 1.0 and True hash alike: the type keeps them apart


def _evaluate(cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora, shape=_shape, kind=None,
              moe=None):
    """(family, sizes, roles, embeddings, the first layer, a later layer, head, loss): the layers of `kind`
    (default: the first layer's).

    One check evaluates the same layer for its footprint, its peak of saved bytes and the ledger's step (six times
    for a dense model, more in `fit`'s search): with the plain shape rule the evaluation is remembered by value.
    A rank's shape rule (a closure) is evaluated each time."""
    if shape is not _shape:
        return _evaluate_now(cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora, shape, kind, moe)
    fam, sizes, roles, *kept = _evaluate_memo(_Key(cfg), micro_batch, seq_len, attention, checkpointing, precision,
                                              _Key(dtypes), _Key(lora), kind, _Key(moe))
    return (fam, dict(sizes), dict(roles), *(list(k) for k in kept))  # callers may extend what they are given


@lru_cache(maxsize=64)
def _evaluate_memo(cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora, kind, moe):
    return _evaluate_now(cfg.value, micro_batch, seq_len, attention, checkpointing, precision, dtypes.value, lora.value,
                         _shape, kind, moe.value)


def _evaluate_now(cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora, shape=_shape, kind=None,
                  moe=None):
    check(cfg, attention, checkpointing, precision)
    mt = cfg["model_type"]
    kind = layer_kinds(cfg)[0] if kind is None else kind
    fam = _kind_family(FAMILIES[mt], kind)
    head = classifier(cfg) if not cfg.get("traced_model_type") else None
    if head is not None:   # a classifier in place of the language-model head (the layers are the family's own)
        names = {**fam.names, "score": head["module"], "lm_head": "-"}
        if head["task"] == "seq" and fam.post_norm:
            names["pooler"] = "classifier.dense" if "batch_positions" in fam.embed_extra else "bert.pooler.dense"
        fam = fam._replace(head=head["task"], names=names)
    sizes = layer_sizes(cfg, micro_batch, seq_len, int((lora or {}).get("r") or 0), attention, moe=moe)
    cond = layer_conditions(cfg, fam, attention, checkpointing, micro_batch, precision, lora)
    if head is not None:
        sizes["L"] = head["labels"]
        task, loss = head["task"], head["loss"]
        cond.update({"seq_ce": task == "seq" and loss == "ce", "seq_mse": task == "seq" and loss == "mse",
                     "seq_bce": task == "seq" and loss == "bce", "token": task == "token",
                     "cls_dropout": head["dropout"] > 0, "pad_known": head["pad"]})
    if _chunk_masked(cfg, kind, attention, seq_len):
        cond = _window_conditions(cond)
    roles = role_dtypes(precision, dtypes)
    _quantized_base(cond, roles, dtypes)
    w = trainable_flags(fam, lora)
    parallel = _parallel(cfg)
    rows = layer_rows(mt, _act(cfg), parallel, kind)
    if kind == "cross" and roles["ada"] == roles["lin"]:   # the adapter's input is the shared image tokens themselves
        rows = [r for r in rows if not (r.op.startswith(("k_proj", "v_proj")) and r.what.startswith("input (cast to the adapter"))]
    # the layer input needs a gradient from the first layer on when the embeddings train; under LoRA the first
    # layer's input does not, and every later one does as soon as an earlier adapter reaches the residual stream
    vision = (_llava_kept(cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora, shape)
              if fam.llava else None)
    if fam.qwen_vl:
        vision = _qwen_vl_kept(cfg, micro_batch, seq_len, attention, checkpointing, role_dtypes(precision, dtypes), lora)
    if fam.mllama:
        vision = _mllama_kept(cfg, micro_batch, seq_len, attention, checkpointing, role_dtypes(precision, dtypes), lora)
        if kind == "cross":   # the cross-attention mask always reaches sdpa (k and v repeated: _window_conditions)
            cond = _window_conditions(cond)
    # (LLaVA: the image features scattered into the embeddings need a gradient when the tower or projector trains)
    # transformers' activation_checkpointing_enable also calls enable_input_require_grads (modeling_utils.py): a
    # hook makes the input embeddings' output require a gradient, so under full checkpointing with a frozen
    # embedding (LoRA) what follows the lookup (BERT's sum, LayerNorm and dropout) records its graph and the first
    # layer's input needs a gradient too
    embed_out = w["W:embed"] or checkpointing == "full"
    first = _grads(fam, w, embed_out or bool(vision and vision[2]), parallel)
    later = _grads(fam, w, first["out"], parallel)
    if kind == "cross":   # a self-attention layer comes first: its output's flag is the cross layer's input's
        base = FAMILIES[mt]
        x = _grads(base, trainable_flags(base, lora), embed_out, parallel)["out"]
        first = later = cross_grads(fam, w, x, bool(vision and vision[2]))
    flags0, flags1 = {**w, **first}, {**w, **later}
    layer0 = _resolve(rows, cond, roles, sizes, flags0, shape)
    layer1 = _resolve(rows, cond, roles, sizes, flags1, shape)
    top = {**w, "emb_out": embed_out, "rope": first["qk"] or later["qk"], "x": later["out"], "t": True, "tn": True, "fn": True}
    embeddings = _resolve(_embedding_rows(fam), cond, roles, sizes, top, shape)
    if fam.qwen_vl:   # mrope: cos and sin are per sequence, (b, s, head_dim), from the (3, b, s) position ids
        embeddings = [k._replace(shape=(micro_batch,) + tuple(k.shape[1:])) if k.label.startswith("rotary: ") else k
                      for k in embeddings]
    if vision:
        embeddings += vision[0]
    top["t"] = later["out"] or top.get(f"W:{fam.names.get('transform')}", False)
    if head is not None:
        head_rows, loss_rows = _classifier_rows(fam, head["dropout"] > 0), CLASSIFIER_LOSS_ROWS
    else:
        head_rows, loss_rows = _head_rows(fam), LOSS_ROWS
    head = _resolve(head_rows, cond, roles, sizes, top, shape)
    loss = _resolve(loss_rows, cond, roles, sizes, top, shape)
    return fam, sizes, roles, embeddings, layer0, layer1, head, loss


def saved(cfg: dict, *, micro_batch: int, seq_len: int, attention: str = "sdpa", checkpointing: str = "none",
          precision: str = "32-true", dtypes: dict | None = None, lora: dict | None = None, shape=None,
          target_len: int | None = None, moe: dict | None = None) -> list:
    """Blocks in forward order: embeddings, layer (x num_hidden_layers; the first layer apart when it differs, as
    under LoRA), head, loss; each lists its kept storages. With checkpointing "full" the layer block holds what
    stays saved through the forward (each layer's input); `peak_saved` adds one layer's recomputation.

    `shape(symbols, sizes) -> tuple[int, ...]`, if given, evaluates each row's symbolic shape (see `layer_sizes` for
    the symbols), e.g. with one tensor-parallel rank's share of the heads and widths."""
    measured = _measured(cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora)
    if measured is not None:
        return _measured_blocks(measured, checkpointing)
    if hf_encdec.is_stacked(cfg):  # an encoder-decoder: one layer block per stack (`target_len`: decoder tokens)
        check(cfg, attention, checkpointing, precision)
        return stacked_saved(cfg, micro_batch=micro_batch, seq_len=seq_len, target_len=target_len, attention=attention,
                               checkpointing=checkpointing, precision=precision, dtypes=dtypes, lora=lora, shape=shape)
    shape = shape or _shape
    fam, sizes, roles, embeddings, layer0, layer1, head, loss = _evaluate(
        cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora, shape, moe=moe)
    layers = count_layers(cfg)
    window = _window_layers(cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora, shape, moe)
    kinds = layer_kinds(cfg)
    if checkpointing == "full":
        middle = [Block("layer", layers, [_boundary(fam, roles, sizes, shape)])]
    elif window is not None:   # Gemma 3: sliding layers whose window masks sdpa keep more than the global ones
        middle = _layer_blocks(cfg, layers, layer0, layer1, window)
    elif len(set(kinds)) > 1:
        # layers that differ (dense and sparse): runs of alike layers in forward order, each kind its own block name
        by_kind = {kinds[0]: (layer0, layer1)}
        for kind in set(kinds) - {kinds[0]}:
            by_kind[kind] = _evaluate(cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora,
                                      shape, kind, moe)[4:6]
        middle = []
        for i, kind in enumerate(kinds):
            kept = by_kind[kind][0 if i == 0 else 1]
            name = BLOCK_NAMES[kind]
            if middle and middle[-1].name == name and middle[-1].kept == kept:
                middle[-1] = middle[-1]._replace(count=middle[-1].count + 1)
            else:
                middle.append(Block(name, 1, kept))
    elif layer0 == layer1 or layers == 1:
        middle = [Block("layer", layers, layer0)]
    else:
        middle = [Block("layer", 1, layer0), Block("layer", layers - 1, layer1)]
    return [Block("embeddings", 1, embeddings), *middle, Block("head", 1, head), Block("loss", 1, loss)]


def _measured(cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora):
    """A traced model's measured step (models/traced.measure) when it was measured at these settings (under full
    checkpointing it also answers for `none`: each layer's recomputation is what it keeps without checkpointing),
    else None: the generic rule answers."""
    measured = cfg.get("traced_measured")
    if measured is None or (dtypes and dtypes.get("activations") != TRUE_DTYPE.get(precision)):
        return None
    b, s, a, c, p, adapters = measured.run
    if (b, s, a, p, adapters) != (micro_batch, seq_len, attention, precision, lora_key(lora)) or \
            (c != checkpointing and (c, checkpointing) != ("full", "none")):
        return None
    return measured


def lora_key(lora: dict | None) -> str:
    """The LoRA settings a traced model's step ran with (models/traced.measure), as a comparable string ("" without)."""
    import json

    return json.dumps(lora, sort_keys=True, default=str) if lora else ""


def _measured_blocks(measured, checkpointing: str) -> list:
    def kept(items) -> list:
        return [Kept(*k) for k in items]

    blocks = [Block(name, count, kept(items)) for name, count, items in measured.blocks]
    if measured.run[3] == "full" and checkpointing == "none":   # the layers as they run without checkpointing
        layers: list = []
        for items in measured.recomputed:
            if layers and layers[-1].kept == kept(items):
                layers[-1] = layers[-1]._replace(count=layers[-1].count + 1)
            else:
                layers.append(Block("layer", 1, kept(items)))
        blocks = [blocks[0], *layers, blocks[-2], blocks[-1]]
    return blocks


def nbytes(kept: list) -> int:
    from memfit.recipe.costs import dtype_bytes  # the recipe prices a dtype

    return sum(dtype_bytes(prod(k.shape), k.dtype) for k in kept)


def total(blocks: list) -> int:
    return sum(b.count * nbytes(b.kept) for b in blocks)


def peak_saved(cfg: dict, *, micro_batch: int, seq_len: int, attention: str = "sdpa", checkpointing: str = "none",
               precision: str = "32-true", dtypes: dict | None = None, lora: dict | None = None, shape=None,
               target_len: int | None = None, moe: dict | None = None) -> int:
    """The peak of live saved bytes during the step. Without full checkpointing everything saved is live at the end
    of the forward. With it, the embeddings' tensors and every layer's input stay saved; on top of them either the
    head and the loss (at the end of the forward) or one layer's recomputation (in the backward, once the head and
    loss are released; it runs without the cache, and its input is the boundary already counted)."""
    measured = _measured(cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora)
    if measured is not None and measured.run[3] == checkpointing:
        return measured.peak
    if hf_encdec.is_stacked(cfg):
        check(cfg, attention, checkpointing, precision)
        return stacked_peak_saved(cfg, micro_batch=micro_batch, seq_len=seq_len, target_len=target_len,
                                    attention=attention, checkpointing=checkpointing, precision=precision, dtypes=dtypes,
                                    lora=lora, shape=shape)
    blocks = saved(cfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention, checkpointing=checkpointing,
                   precision=precision, dtypes=dtypes, lora=lora, shape=shape, moe=moe)
    if checkpointing != "full":
        return total(blocks)
    emb, layer, head, loss = blocks
    boundary = layer.kept[0]
    window = _window_layers(cfg, micro_batch, seq_len, attention, "full", precision, dtypes, lora, shape or _shape, moe)

    def recomputation(kept: list) -> int:
        size = nbytes(kept)
        # the recomputed layer's first kept tensor is the boundary itself when it is the layer's input (Cohere's
        # written-out LayerNorm keeps x - mean first: a storage of its own)
        if (kept and kept[0].dtype == boundary.dtype and prod(kept[0].shape) == prod(boundary.shape)
                and kept[0].label.split(": ", 1)[1].startswith("input")):
            size -= nbytes([boundary])
        return size

    recomputed = {}
    for kind in set(layer_kinds(cfg)):
        *_, later, _, _ = _evaluate(cfg, micro_batch, seq_len, attention, "full", precision, dtypes, lora,
                                    shape or _shape, kind, moe)
        # a sliding layer whose window masks sdpa recomputes more (Gemma 3): the larger of the two
        recomputed[kind] = max([recomputation(later)] + ([recomputation(window[1])] if window is not None else []))
    each = nbytes(layer.kept)
    emb_bytes = nbytes(emb.kept)
    if cfg["model_type"] == "llama4_text":
        # Llama 4's freqs_cis is kept only by a rope layer's complex multiply: under full checkpointing by the rope
        # layer being recomputed, by no one at the end of the forward or while a NoPE layer is recomputed
        freqs = nbytes([k for k in emb.kept if k.label.startswith("rotary: freqs_cis")])
        emb_bytes -= freqs
        recomputed = {kind: size + (0 if "nope" in kind.split() else freqs) for kind, size in recomputed.items()}
    kept = emb_bytes + layer.count * each
    # the backward recomputes layer i once the boundaries of the layers above it are released: where layers differ
    # (dense and sparse) the peak is the largest of (layers up to i kept + layer i's recomputation)
    worst = max(emb_bytes + (i + 1) * each + recomputed[kind] for i, kind in enumerate(layer_kinds(cfg)))
    if FAMILIES[cfg["model_type"]].qwen_vl:   # a vision block's recomputation, beyond its input
        ids = nbytes([k for k in emb.kept if k.label.startswith("embed_tokens: input ids")])   # (its backward runs last)
        worst = max(worst, ids + _qwen_vl_recompute_peak(cfg, micro_batch, seq_len, attention, role_dtypes(precision, dtypes), lora))
    if FAMILIES[cfg["model_type"]].llava:   # a vision layer's recomputation, beyond its input
        worst = max(worst, kept + nbytes(_llava_kept(cfg, micro_batch, seq_len, attention, "full", precision, dtypes, lora,
                                                     shape or _shape)[1]))
    return max(kept + nbytes(head.kept) + nbytes(loss.kept), worst)


def recomputed(cfg: dict, *, micro_batch: int, seq_len: int, attention: str = "sdpa", precision: str = "32-true",
               dtypes: dict | None = None, lora: dict | None = None, shape=None, target_len: int | None = None,
               moe: dict | None = None) -> list:
    """Under full checkpointing, what each layer keeps while its backward recomputes it (one list per layer, in
    order; each layer of its own kind where layers differ, a sliding layer's where its window masks sdpa): the
    checkpointed forward runs without the key/value cache, so its copies of k and v are not made. An
    encoder-decoder's layers are both stacks' in forward order (the encoder's, then the decoder's)."""
    measured = _measured(cfg, micro_batch, seq_len, attention, "full", precision, dtypes, lora)
    if measured is not None and measured.run[3] == "full":
        return [[Kept(*k) for k in kept] for kept in measured.recomputed]
    if hf_encdec.is_stacked(cfg):
        *_, embeddings, enc, dec, _, _ = _t5_evaluate(cfg, micro_batch, seq_len, target_len, attention, "full",
                                                      precision, dtypes, lora, shape)
        out: list = []
        for (first, later), (_, _, count), name in zip((enc, dec), hf_encdec.stacks(cfg), BUCKETS):
            # the stack's first layer computes the relative bias inside its checkpoint: its bucket indices are part
            # of that layer's recomputation (after its input, which stays the list's first tensor)
            first = first[:1] + [k for k in embeddings if k.label.startswith(name)] + first[1:]
            out += [first] + [later] * (count - 1) if count else []
        return out
    kinds = layer_kinds(cfg)
    by_kind = {}
    for kind in set(kinds):
        *_, layer0, layer1, _, _ = _evaluate(cfg, micro_batch, seq_len, attention, "full", precision, dtypes, lora,
                                             shape or _shape, kind, moe)
        by_kind[kind] = (layer0, layer1)
    window = _window_layers(cfg, micro_batch, seq_len, attention, "full", precision, dtypes, lora, shape or _shape, moe)
    types = _layer_types(cfg) if window is not None else ()
    out = []
    for i, kind in enumerate(kinds):
        sliding = window is not None and i < len(types) and types[i] == "sliding_attention"
        out.append((window if sliding else by_kind[kind])[0 if i == 0 else 1])
    return out


def qlora_precision(compute_dtype: str = "bfloat16") -> str:
    """The recipe whose activations a QLoRA model keeps. bitsandbytes' 4-bit matmul (MatMul4Bit) saves nothing for
    backward but the packed weight (a parameter) on its context, so a quantized base linear keeps no activations,
    like a frozen one; the rest of the model computes in `compute_dtype`. QLoRA's saved activations are LoRA's on
    the model in that dtype: `saved(cfg, ..., precision=qlora_precision(compute), lora=...)`."""
    names = {"bfloat16": "bf16-true", "bf16": "bf16-true", "float16": "16-true", "fp16": "16-true", "half": "16-true",
             "float32": "32-true", "fp32": "32-true", "float": "32-true"}
    return names[compute_dtype]


def _t5_evaluate(cfg, micro_batch, seq_len, target_len, attention, checkpointing, precision, dtypes, lora, shape=None):

    if attention == "flash":
        attention = "sdpa"  # T5 does not support flash-attn (_supports_flash_attn = False): SDPA runs
    shape = shape or _shape
    fam = FAMILIES["t5"]
    sizes = _t5_sizes(cfg, micro_batch, seq_len, target_len, int((lora or {}).get("r") or 0))
    enc_sizes = {**sizes, "s": sizes["se"], "T": sizes["Te"]}
    w = trainable_flags(fam, lora)
    cond = _t5_conditions(cfg, attention, checkpointing, micro_batch, precision, lora, bias_trains=w["W:embed"])
    roles = role_dtypes(precision, dtypes)
    t5_quantized_base(cond, roles, dtypes)
    n = hf_encdec.dims(cfg)
    enc_rows, dec_rows = t5_layer_rows(cfg, False), t5_layer_rows(cfg, True)
    # the encoder's first layer input needs a gradient when the embedding trains; later ones once any weight below does
    e0 = _t5_flags(w, w["W:embed"], False, False)
    e1 = _t5_flags(w, e0["out"], False, False)
    enc_out = (e1["out"] if n["Ne"] > 1 else e0["out"]) if n["Ne"] else w["W:embed"]
    enc = enc_out or w["W:norm"]
    d0 = _t5_flags(w, w["W:embed"], enc, True)
    d1 = _t5_flags(w, d0["out"], enc, True)
    dec_out = (d1["out"] if n["Nd"] > 1 else d0["out"]) if n["Nd"] else w["W:embed"]
    enc0 = _resolve(enc_rows, cond, roles, enc_sizes, {**w, **e0}, shape)
    enc1 = _resolve(enc_rows, cond, roles, enc_sizes, {**w, **e1}, shape)
    dec0 = _resolve(dec_rows, cond, roles, sizes, {**w, **d0}, shape)
    dec1 = _resolve(dec_rows, cond, roles, sizes, {**w, **d1}, shape)
    label = _t5_encoder_output_label()
    # the encoder's output, kept by the cross-attention k / v projections or, where they are frozen, by an adapter
    # reading it as it is (its storage: a row sourced from the projections' input in the same dtype)
    sharing = {r.label for r in dec_rows if r.source == label}

    def is_output(k) -> bool:
        return k.label == label or (k.label in sharing and cond["not_mixed"] and k.dtype == roles["act"])

    encoder_output = [k for k in dec0 + dec1 if is_output(k)][:1]
    encoder_output = [Kept(label, k.shape, k.dtype) for k in encoder_output]
    dec0 = [k for k in dec0 if not is_output(k)]
    dec1 = [k for k in dec1 if not is_output(k)]
    top = {**w, "attn_e": e0["attn"] or e1["attn"], "attn_c": d0["cattn"] or d1["cattn"], "xe": enc_out, "x": dec_out,
           "fn": True}
    embeddings = _resolve(_t5_embedding_rows(cfg), cond, roles, sizes, top, shape) + encoder_output
    head = _resolve(_t5_head_rows(cfg), cond, roles, sizes, top, shape)
    loss = _resolve([r for r in LOSS_ROWS if r.when == "mlm"], cond, roles, sizes, top, shape)
    return roles, sizes, enc_sizes, embeddings, (enc0, enc1), (dec0, dec1), head, loss


# under full checkpointing T5's relative bias is computed inside the first layer's checkpoint (its bucket indices are
# that layer's, recomputed with it) and passed to every later layer of its stack
BUCKETS = ("encoder relative bias", "decoder relative bias")
SHARED_BIAS = "checkpoint: the shared position bias"


def _t5_checkpoint_inputs(embeddings: list, n: dict, attention: str, roles: dict, sizes: dict, shape) -> list:
    """What full checkpointing keeps besides each layer's hidden input. torch's non-reentrant checkpoint saves every
    tensor argument of the layer (_NoopSaveInputs, until that layer's backward) and T5Stack passes its layers the
    first layer's position biases: the encoder's (1, H, se, se) and the decoder's (1, H, s, s) relative biases in the
    embedding's dtype, the cross-attention's zero bias (1, H, s, se) in the query's dtype (T5Attention makes it
    require a gradient under checkpointing), and eager's float causal mask (1, 1, s, s) and the encoder's output to
    every decoder layer. Measured (tiny T5, 3+3 layers, CPU): each is one storage live at the last decoder layer's
    recomputation; the bucket indices are not (they are saved inside the first layer's checkpoint)."""
    out = [k for k in embeddings if not k.label.startswith(BUCKETS)]
    if n["Ne"] > 1:
        out.append(Kept(f"{SHARED_BIAS} (encoder)", shape((1, "H", "se", "se"), sizes), roles["act"]))
    if n["Nd"] > 1:
        out.append(Kept(f"{SHARED_BIAS} (decoder)", shape((1, "H", "s", "s"), sizes), roles["act"]))
        out.append(Kept(f"{SHARED_BIAS} (cross-attention zeros)", shape((1, "H", "s", "se"), sizes), roles["out"]))
    if n["Nd"] and attention == "eager":
        out.append(Kept("checkpoint: the decoder's float causal mask", shape((1, 1, "s", "s"), sizes), roles["act"]))
    if n["Nd"] and not any(k.label == _t5_encoder_output_label() for k in out):
        # the encoder's output is every decoder layer's argument too: saved by the checkpoint where the cross-attention
        # keeps only autocast's 16-bit copies of it (bf16-mixed; measured: one (b, se, h) fp32 storage)
        out.append(Kept("checkpoint: the encoder's output", shape(("b", "se", "h"), sizes), roles["act"]))
    return out


def _t5_stack_blocks(name: str, count: int, first: list, later: list) -> list:

    if count == 0:
        return []
    if first == later or count == 1:
        return [Block(name, count, first)]
    return [Block(name, 1, first), Block(name, count - 1, later)]


def stacked_saved(cfg: dict, *, micro_batch: int, seq_len: int, target_len: int | None = None, attention: str = "sdpa",
          checkpointing: str = "none", precision: str = "32-true", dtypes: dict | None = None,
          lora: dict | None = None, shape=None) -> list:
    """Blocks in forward order: embeddings (both stacks' inputs, the relative-bias indices, the encoder's final norm
    and output), encoder layer, decoder layer, head, loss. With checkpointing "full" each layer keeps its input."""

    roles, sizes, enc_sizes, embeddings, enc, dec, head, loss = _t5_evaluate(
        cfg, micro_batch, seq_len, target_len, attention, checkpointing, precision, dtypes, lora, shape)
    n = hf_encdec.dims(cfg)
    shape = shape or _shape
    if checkpointing == "full":
        embeddings = _t5_checkpoint_inputs(embeddings, n, attention, roles, sizes, shape)
        boundary = "checkpoint: the layer's input (kept for the recomputation)"
        middle = [Block("encoder layer", n["Ne"], [Kept(boundary, shape(("b", "s", "h"), enc_sizes), roles["act"])])]
        middle += [Block("decoder layer", n["Nd"], [Kept(boundary, shape(("b", "s", "h"), sizes), roles["act"])])]
        middle = [b for b in middle if b.count]
    else:
        middle = _t5_stack_blocks("encoder layer", n["Ne"], *enc) + _t5_stack_blocks("decoder layer", n["Nd"], *dec)
    return [Block("embeddings", 1, embeddings), *middle, Block("head", 1, head), Block("loss", 1, loss)]


def stacked_peak_saved(cfg: dict, *, micro_batch: int, seq_len: int, target_len: int | None = None, attention: str = "sdpa",
               checkpointing: str = "none", precision: str = "32-true", dtypes: dict | None = None,
               lora: dict | None = None, shape=None) -> int:
    """The peak of live saved bytes. Without full checkpointing: everything saved (the end of the forward). With it,
    the largest of three moments: the end of the forward (every boundary, the embeddings' tensors, head and loss); a
    decoder layer's recomputation (every boundary and the embeddings' tensors beside it); an encoder layer's
    recomputation, once the decoder's backward has released its boundaries, the encoder's output and final norm
    and the decoder's inputs (the encoder's boundaries and inputs beside it). A layer's input is its boundary."""

    common = dict(micro_batch=micro_batch, seq_len=seq_len, target_len=target_len, attention=attention,
                  precision=precision, dtypes=dtypes, lora=lora, shape=shape)
    blocks = stacked_saved(cfg, checkpointing=checkpointing, **common)
    if checkpointing != "full":
        return total(blocks)
    *_, embeddings, enc, dec, head, loss = _t5_evaluate(cfg, micro_batch, seq_len, target_len, attention, "full",
                                                      precision, dtypes, lora, shape)
    boundaries = {b.name: (b.count, b.kept[0]) for b in blocks if b.name.endswith(" layer")}

    def recomputed(name, layers) -> tuple[int, int]:
        """(bytes of one layer's recomputation beyond its boundary, bytes of the stack's boundaries)"""
        if name not in boundaries:
            return 0, 0
        count, boundary = boundaries[name]
        each = nbytes(layers)
        # the first norm keeps the layer's input, the boundary itself: first in fp32, after the fp32 upcast in a
        # 16-bit recipe (measured, bf16-true: one storage)
        if any(k.dtype == boundary.dtype and k.shape == boundary.shape for k in layers[:2]
               if k.label.startswith("layer_norm (self-attention): input")):
            each -= nbytes([boundary])
        return each, count * nbytes([boundary])

    enc_each, enc_bounds = recomputed("encoder layer", enc[1])
    dec_each, dec_bounds = recomputed("decoder layer", dec[1])
    kept = blocks[0].kept   # the embeddings' tensors and the checkpoints' shared inputs (_t5_checkpoint_inputs)
    emb = nbytes(kept)
    encoder_inputs = nbytes([k for k in kept if k.label.startswith(ENCODER_INPUTS)])
    # a stack's first layer recomputes its relative bias (its bucket indices) once the later layers' backward has
    # released the shared bias; its own boundary and the rest of the stack's inputs beside it
    buckets = {name: nbytes([k for k in embeddings if k.label.startswith(name)]) for name in BUCKETS}
    shared = {name: nbytes([k for k in kept if k.label == f"{SHARED_BIAS} ({name})"]) for name in ("encoder", "decoder")}
    cross = nbytes([k for k in kept if k.label == f"{SHARED_BIAS} (cross-attention zeros)"])
    enc_first, _ = recomputed("encoder layer", enc[0])
    dec_first, _ = recomputed("decoder layer", dec[0])
    enc_one = enc_bounds // max(boundaries.get("encoder layer", (1,))[0], 1)
    dec_one = dec_bounds // max(boundaries.get("decoder layer", (1,))[0], 1)
    return max(emb + enc_bounds + dec_bounds + nbytes(head) + nbytes(loss),
               emb + enc_bounds + dec_bounds + dec_each,
               emb - shared["decoder"] - cross + enc_bounds + dec_one + dec_first + buckets[BUCKETS[1]],
               encoder_inputs + enc_bounds + enc_each,
               encoder_inputs - shared["encoder"] + enc_one + enc_first + buckets[BUCKETS[0]])


# what the embeddings block keeps for the encoder's layers (the rest goes once the decoder's backward is done)
ENCODER_INPUTS = ("encoder embed_tokens", "encoder embedding dropout", "encoder relative bias", f"{SHARED_BIAS} (encoder)")


def t5_later_kept(embeddings_kept: list, encoder_layers: int) -> dict:
    """{index in the embeddings block's kept tensors: the layer whose first row keeps it instead}. Measured (T5,
    MemTracker with a dispatch-mode tracer at the encoder's backward): what the embeddings block keeps for the decoder
    (its inputs, the encoder's final norm and output) is freed once the decoder's backward is done, and under full
    checkpointing each stack's shared position bias once its second layer's backward is (the later layers'
    checkpoints saved it; it is no argument of the first layer, which recomputes it: weakrefs to the first layers'
    outputs, tiny T5 2+2 under full checkpointing, find the decoder's bias freed at its first layer's recomputation);
    the input ids (the batch's), the encoder's inputs and the cross-attention's zero bias (a leaf with its gradient,
    held by its AccumulateGrad node: alive at both first layers' recomputations) stay."""
    out = {}
    for n, k in enumerate(embeddings_kept):
        shared = k.label == f"{SHARED_BIAS} (encoder)" and encoder_layers > 1
        if k.label.endswith("input ids") or (k.label.startswith(ENCODER_INPUTS) and not shared) or k.label.endswith("(cross-attention zeros)"):
            continue
        # (a decoder's shared bias exists only with two decoder layers or more: _t5_checkpoint_inputs)
        out[n] = 1 if shared else encoder_layers + 1 if k.label == f"{SHARED_BIAS} (decoder)" else encoder_layers
    return out



def batch_pixel_bytes(cfg: dict, micro_batch: int) -> int:
    """The pixel values a vision-language batch holds all step (0: none): Qwen2-VL's processor's, fp32 (issue 34);
    MllamaProcessor's (models/mllama.batch_bytes: fp32 pixels, the aspect ratios and the cross-attention mask)."""
    if cfg.get("mllama"):
        from memfit.models import mllama

        return mllama.batch_bytes(cfg, micro_batch)
    if not cfg.get("qwen_vl"):
        return 0
    from memfit.models import qwen_vl

    return qwen_vl.pixel_bytes(cfg, micro_batch)


def views_the_pixels(kept: Kept) -> bool:
    """A kept tensor that is the batch's own pixel values (a view, not a copy): an fp32 patch embedding's input."""
    return kept.label.startswith("patch_embed") and kept.dtype == "float32"

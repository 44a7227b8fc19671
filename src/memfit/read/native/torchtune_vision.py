"""torchtune's Llama 3.2 Vision (torchtune.models.llama3_2_vision, torchtune 0.6.1 and bd2a0fc): read as far as its
parameters and what its recipes train, then refused at `model._component_` naming what differs from the model memfit
has for it (transformers' MllamaForConditionalGeneration, the mllama family).

The model is a DeepFusionModel (modules/model_fusion/_deep_fusion.py) of an encoder (llama3_2_vision_encoder: a CLIP
vision encoder and a projection head) and a decoder (llama3_2_vision_decoder: Llama self-attention layers, a fusion
layer of cross-attention every fusion_interval of them, a FusionEmbedding of the vocabulary and num_special_tokens
rows apart). A config names it by a model builder (llama3_2_vision_11b, lora_/qlora_, 90b: VISION_BUILDERS, their
component builders' arguments) or as DeepFusionModel with its `encoder` and `decoder` component builders nested
(torchtune's instantiate builds nested components since 0.7; the way a config writes a smaller model).

What the recipes train: the full recipes what requires_grad says after DeepFusionModel's decoder_trainable,
encoder_trainable and fusion_trainable (the fusion parameters: every FusionLayer's fusion_layer, the
FusionEmbedding's fusion_embedding, the projection head: register_fusion_module); the LoRA recipes
get_adapter_params(model) only (lora_a, lora_b, DoRA's magnitude; recipes/lora_finetune_single_device.py).
tests/read/test_torchtune_vision.py compares these counts with torchtune 0.6.1's own build.
"""

from __future__ import annotations

from memfit.diagnostics import codes
from memfit.read.native.base import Reader

_ENCODER = {"patch_size": 14, "num_heads": 16, "clip_embed_dim": 1280, "clip_num_layers": 32,
            "clip_hidden_states": [3, 7, 15, 23, 30], "num_layers_projection": 8, "max_num_tiles": 4, "in_channels": 3}
_DECODER = {"vocab_size": 128_256, "fusion_interval": 4, "num_special_tokens": 8, "num_kv_heads": 8}
# torchtune/models/llama3_2_vision/_model_builders.py: each builder's encoder and decoder arguments (tile_size: the
# builder's image_size, 560 by default)
VISION_BUILDERS = {
    "llama3_2_vision_11b": ({**_ENCODER, "decoder_embed_dim": 4096},
                            {**_DECODER, "num_layers": 32, "num_heads": 32, "embed_dim": 4096, "intermediate_dim": 14336}),
    "llama3_2_vision_90b": ({**_ENCODER, "decoder_embed_dim": 8192},
                            {**_DECODER, "num_layers": 80, "num_heads": 64, "embed_dim": 8192, "intermediate_dim": 28672}),
}
FUSION = "torchtune.modules.model_fusion.DeepFusionModel"
ENCODER_ARGS = ("patch_size", "num_heads", "clip_embed_dim", "clip_num_layers", "num_layers_projection", "decoder_embed_dim", "tile_size")
DECODER_ARGS = ("vocab_size", "num_layers", "fusion_interval", "num_special_tokens", "num_heads", "embed_dim")


def is_vision(component: str) -> bool:
    builder = component.rsplit(".", 1)[-1]
    base = builder.removeprefix("qlora_").removeprefix("lora_")
    return component == FUSION or builder == "DeepFusionModel" or base.startswith("llama3_2_vision")


def _scale_hidden_dim(dim: int, multiple_of: int = 256) -> int:
    """torchtune.modules.scale_hidden_dim_for_mlp (the decoder's intermediate_dim where it is not given)."""
    hidden = int(2 * (4 * dim) / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def _lora_linear(spec: dict | None, fan_in: int, fan_out: int) -> int:
    """LoRALinear's lora_a (rank, in) and lora_b (out, rank); DoRALinear adds magnitude (out)."""
    if spec is None:
        return 0
    return spec["rank"] * (fan_in + fan_out) + (fan_out if spec["dora"] else 0)


def _clip_layer(E: int, lora: dict | None, gated: bool) -> tuple[int, int]:
    """A CLIP TransformerSelfAttentionLayer (clip_attention: q, k, v, output E x E without bias; clip_mlp: w1 E -> 4E,
    w2 4E -> E with biases; Fp32LayerNorm sa_norm, mlp_norm; the projection head's adds TanhGate sa_scale, mlp_scale):
    (parameters, LoRA adapters)."""
    params = 4 * E * E + (E * 4 * E + 4 * E) + (4 * E * E + E) + 4 * E + (2 if gated else 0)
    if lora is None:
        return params, 0
    adapters = sum(_lora_linear(lora, E, E) for m in ("q_proj", "k_proj", "v_proj", "output_proj") if m in lora["modules"])
    if lora["mlp"]:
        adapters += _lora_linear(lora, E, 4 * E) + _lora_linear(lora, 4 * E, E)
    return params, adapters


def _decoder_layer(dec: dict, lora: dict | None, cross: bool) -> tuple[int, int]:
    """llama3_2_vision_decoder's TransformerSelfAttentionLayer, or its TransformerCrossAttentionLayer (q_norm, k_norm
    over head_dim; ca_scale, mlp_scale TanhGates): (parameters, LoRA adapters)."""
    D, H, KV, inner = dec["embed_dim"], dec["num_heads"], dec["num_kv_heads"], dec["intermediate_dim"]
    hd = D // H
    shapes = {"q_proj": (D, H * hd), "k_proj": (D, KV * hd), "v_proj": (D, KV * hd), "output_proj": (D, D)}
    params = sum(i * o for i, o in shapes.values()) + 3 * D * inner + 2 * D + (2 * hd + 2 if cross else 0)
    if lora is None:
        return params, 0
    adapters = sum(_lora_linear(lora, *shapes[m]) for m in shapes if m in lora["modules"])
    if lora["mlp"]:
        adapters += 2 * _lora_linear(lora, D, inner) + _lora_linear(lora, inner, D)
    return params, adapters


def counts(enc: dict, dec: dict, flags: dict, lora: dict | None) -> dict:
    """Parameters and trained elements of the DeepFusionModel the arguments build. `lora`: None for the full
    builders, else {"encoder": spec, "decoder": spec}, a side's spec None where its component builder is not a lora_ one,
    else {rank, dora, modules, mlp, output, main (encoder_lora / decoder_lora), fusion (fusion_lora)}."""
    E, T, C, p = enc["clip_embed_dim"], enc["max_num_tiles"], enc["in_channels"], enc["patch_size"]
    P = (enc["tile_size"] // p) ** 2 + 1
    D, V, S = dec["embed_dim"], dec["vocab_size"], dec["num_special_tokens"]
    fusion_layers = dec["num_layers"] // dec["fusion_interval"]
    # clip_vision_encoder: conv, cls token, TiledTokenPositionalEmbedding (local P x E, global T x T x P x E, gate),
    # pre- and post-tile TilePositionalEmbedding (T x T x 1 x E, gate), ln_pre, ln_post
    tiled = {"global_token_positional_embedding": T * T * P * E, "pre_tile_pos_embed": T * T * E, "post_tile_pos_embed": T * T * E}
    clip_own = E * C * p * p + E + P * E + 1 + sum(tiled.values()) + 2 + 4 * E
    def on(side: str, key: str, output: bool = False):
        spec = (lora or {}).get(side)
        return spec if spec is not None and spec[key] and (spec["output"] or not output) else None

    clip_layer, clip_adapt = _clip_layer(E, on("encoder", "main"), False)
    head_layer, head_adapt = _clip_layer(E, on("encoder", "fusion"), True)
    proj_in = E * (len(enc.get("clip_hidden_states") or []) + 1)
    head_out = proj_in * D + D
    head_out_adapt = _lora_linear(on("encoder", "fusion", True), proj_in, D)   # the projection head's output
    self_layer, self_adapt = _decoder_layer(dec, on("decoder", "main"), False)
    cross_layer, cross_adapt = _decoder_layer(dec, on("decoder", "fusion"), True)
    out_adapt = _lora_linear(on("decoder", "main", True), D, V)                 # the decoder's output
    clip = clip_own + enc["clip_num_layers"] * clip_layer
    head = enc["num_layers_projection"] * head_layer + head_out
    decoder_own = V * D + D + V * D + dec["num_layers"] * self_layer   # embedding, norm, output, the self layers
    adapters = (enc["clip_num_layers"] * clip_adapt + enc["num_layers_projection"] * head_adapt + head_out_adapt
                + dec["num_layers"] * self_adapt + fusion_layers * cross_adapt + out_adapt)
    total = clip + head + decoder_own + fusion_layers * cross_layer + S * D + adapters
    if lora is not None:
        trained = adapters
    else:
        # DeepFusionModel: the encoder's and the decoder's parameters by their flags, then the fusion parameters
        # added (fusion_trainable) or taken out (not): they follow fusion_trainable alone
        fused = head + fusion_layers * cross_layer + S * D
        trained = ((clip if flags["encoder_trainable"] else 0) + (decoder_own if flags["decoder_trainable"] else 0)
                   + (fused if flags["fusion_trainable"] else 0))
    return {"parameters": total, "trained": trained, "tiled": tiled, "T": T, "P": P, "E": E, "S": S, "D": D}


def _args(r: Reader, node: dict, names: tuple, optional: dict, prefix: tuple, at) -> dict | None:
    """A component builder's integer arguments (names: required; optional: their defaults), read with their types."""
    out = {k: r.get(k, (int,), None, data=node, prefix=prefix) for k in names}
    missing = [k for k in names if out[k] is None]
    if missing:
        r.error(at, codes.NATIVE_CONFIG, f"{'.'.join(prefix)}: memfit needs {', '.join(missing)} (integers) to count this model")
        return None
    out.update({k: r.get(k, (int,), default, data=node, prefix=prefix) for k, default in optional.items()})
    return out


def _flags(r: Reader, model: dict, defaults: tuple) -> dict:
    return {k: r.get(k, (bool,), default, data=model, prefix=("model",)) for k, default in defaults}


def _lora(r: Reader, args: dict, prefix: tuple) -> dict:
    """LoRA's arguments (the builders' defaults: rank 8, no DoRA, no MLP, no output)."""
    get = (lambda key, kinds, default: r.get(key, kinds, default, data=args, prefix=prefix))
    modules = [m for m in get("lora_attn_modules", (list,), []) if isinstance(m, str)]
    return {"rank": get("lora_rank", (int,), 8), "dora": get("use_dora", (bool,), False), "modules": modules,
            "mlp": get("apply_lora_to_mlp", (bool,), False), "output": get("apply_lora_to_output", (bool,), False)}


def _from_fusion(r: Reader, model: dict, at):
    """DeepFusionModel with its encoder and decoder component builders nested: their arguments."""
    parts = {}
    for key, names, optional in (("encoder", ENCODER_ARGS, {"max_num_tiles": 4, "in_channels": 3}),
                                 ("decoder", DECODER_ARGS, {"num_kv_heads": None, "intermediate_dim": None})):
        node = model.get(key)
        component = node.get("_component_") if isinstance(node, dict) else None
        builder = str(component).rsplit(".", 1)[-1]
        if not isinstance(component, str) or builder.removeprefix("lora_") != f"llama3_2_vision_{key}":
            where = r.at("model", key, "_component_") if isinstance(node, dict) and "_component_" in node else at
            r.error(where, codes.UNSUPPORTED_MODEL, f"model.{key}: memfit reads a DeepFusionModel of torchtune's Llama 3.2 Vision "
                    f"component builders (llama3_2_vision_{key} or lora_llama3_2_vision_{key}), not {component!r}")
            return None
        args = _args(r, node, names, optional, ("model", key), r.at("model", key, "_component_"))
        if args is None:
            return None
        parts[key] = (builder.startswith("lora_"), args, node)
    (enc_lora, enc, enc_node), (dec_lora, dec, dec_node) = parts["encoder"], parts["decoder"]
    enc["clip_hidden_states"] = r.get("clip_hidden_states", (list,), [], data=enc_node, prefix=("model", "encoder"))
    dec["num_kv_heads"] = dec["num_kv_heads"] or dec["num_heads"]
    dec["intermediate_dim"] = dec["intermediate_dim"] or _scale_hidden_dim(dec["embed_dim"])
    flags = _flags(r, model, (("decoder_trainable", False), ("encoder_trainable", False), ("fusion_trainable", True)))
    lora = None
    if enc_lora or dec_lora:
        lora = {}
        for side, on, node in (("encoder", enc_lora, enc_node), ("decoder", dec_lora, dec_node)):
            get = (lambda key: r.get(key, (bool,), False, data=node, prefix=("model", side)))   # noqa: B023
            lora[side] = {**_lora(r, node, ("model", side)), "main": get(f"{side}_lora"), "fusion": get("fusion_lora")} if on else None
    return enc, dec, flags, lora


def _from_builder(r: Reader, model: dict, component: str, at):
    builder = component.rsplit(".", 1)[-1]
    base = builder.removeprefix("qlora_").removeprefix("lora_")
    shapes = VISION_BUILDERS.get(base)
    if shapes is None:
        r.error(at, codes.UNSUPPORTED_MODEL, f"torchtune builder {component!r}: not one memfit knows (Llama 3.2 Vision: "
                f"{', '.join(sorted(VISION_BUILDERS))} and their lora_ / qlora_ builders)")
        return None
    enc = {**shapes[0], "tile_size": r.get("image_size", (int,), 560, data=model, prefix=("model",))}
    dec = dict(shapes[1])
    if builder == base:
        return enc, dec, _flags(r, model, (("decoder_trainable", False), ("encoder_trainable", True), ("fusion_trainable", True))), None
    defaults = (("decoder_trainable", "frozen"), ("encoder_trainable", "lora"), ("fusion_trainable", "lora"))
    kinds = {k: str(model.get(k, default)).lower() for k, default in defaults}
    for key, kind in kinds.items():  # LoRATrainable(kind), then the builder's assertion against "full"
        if kind not in ("frozen", "lora"):
            why = ("torchtune's LoRA builders assert against it (\"We've temporarily removed support for mixed LoRA + Full "
                   f"Finetuning\"): use {base} for a full fine-tune" if kind == "full"
                   else "torchtune's LoRATrainable takes full, lora or frozen")
            r.error(r.at("model", key), codes.NATIVE_CONFIG, f"model.{key} {model[key]!r}: {why}")
            return None
    spec = _lora(r, model, ("model",))
    lora = {side: {**spec, "main": kinds[f"{side}_trainable"] == "lora", "fusion": kinds["fusion_trainable"] == "lora"}
            for side in ("encoder", "decoder")}
    return enc, dec, {k: v != "frozen" for k, v in kinds.items()}, lora


def refuse(r: Reader, model: dict, component: str, at) -> None:
    """A positioned unsupported-model at model._component_ with torchtune's parameter count and what its recipe
    trains, and what differs from transformers' mllama (which memfit models)."""
    builder = component.rsplit(".", 1)[-1]
    read = _from_fusion(r, model, at) if builder == "DeepFusionModel" else _from_builder(r, model, component, at)
    if read is None:
        return
    enc, dec, flags, lora = read
    n = counts(enc, dec, flags, lora)
    T, P, E, S = n["T"], n["P"], n["E"], n["S"]
    if lora is not None:
        sides = {side: lora.get(side) or {} for side in ("encoder", "decoder")}
        adapted = (("encoder_lora", sides["encoder"].get("main")),
                   ("fusion_lora", sides["encoder"].get("fusion") or sides["decoder"].get("fusion")),
                   ("decoder_lora", sides["decoder"].get("main")))
        what = (f"the LoRA recipe trains {n['trained']:,} of them, the adapters only (get_adapter_params: "
                + (", ".join(name for name, on in adapted if on) or "none") + ")")
        differs = "its adapters sit on the CLIP encoder and the projection head too, which memfit's mllama LoRA does not adapt; "
    else:
        trains = [k for k in ("encoder_trainable", "decoder_trainable", "fusion_trainable") if flags[k]]
        what = f"the full recipe trains {n['trained']:,} of them ({', '.join(trains) or 'none'})"
        differs = ("the decoder frozen but for its fusion layers and its FusionEmbedding's own "
                   f"{S} rows (fusion_embedding), where memfit's mllama trains every parameter; " if not flags["decoder_trainable"] else "")
    tiled = n["tiled"]
    r.error(at, codes.UNSUPPORTED_MODEL,
            f"torchtune builder {component!r}: Llama 3.2 Vision (torchtune.models.llama3_2_vision): torchtune builds "
            f"{n['parameters']:,} parameters and {what}; memfit models Llama 3.2 Vision as transformers' "
            "MllamaForConditionalGeneration (model.hf_config, model_type mllama), which differs: " + differs +
            f"torchtune's tiled positional embeddings are one per (tiles, tiles) pair (global_token_positional_embedding "
            f"{T} x {T} x {P} x {E} = {tiled['global_token_positional_embedding']:,}, pre_tile_pos_embed and post_tile_pos_embed "
            f"{T} x {T} x 1 x {E} = {tiled['pre_tile_pos_embed']:,} each) where transformers' are one per supported aspect ratio "
            "and a padding row; and enable_activation_checkpointing wraps every TransformerSelfAttentionLayer (the CLIP "
            "encoder's and the projection head's too, the cross-attention layers not). None of this is modelled or measured: "
            "write a memfit config with model.hf_config (the model's config.json) for transformers' training")

"""Encoder-decoder transformers (T5): the structure of their stacks.

These models have more than one stack of layers: an encoder over `training.seq_len` source tokens, then a decoder
over `training.target_len` target tokens (default: seq_len) whose every layer attends to the encoder's output. The
rest of memfit sees them as the decoder-only families with more layer blocks: models/hf.py lists their parameters
from `_segments()`, models/hf_activations.py (`stacked_saved`) gives "embeddings", "encoder layer"
(x num_layers), "decoder layer" (x num_decoder_layers), "head", "loss", and the ledger walks the layers of both
stacks in forward order (`stacks()`, `layer_index()`). This module imports nothing of memfit's but the tables.

Read off transformers 5.24's models/t5/modeling_t5.py (T5ForConditionalGeneration, T5Stack, T5Block,
T5LayerNorm, T5Attention, T5DenseActDense / T5DenseGatedActDense) and checked against a real CPU step
(tests/models/test_families_encdec.py, tests/models/test_transformers_activations.py).

Memory-relevant facts of T5 (transformers 5.24):
- one shared embedding `shared` feeds both stacks; T5Config always sets tie_word_embeddings, so lm_head *is*
  `shared.weight` (a config.json's "tie_word_embeddings": false, as flan-t5 writes, only turns off the decoder
  output's d_model ** -0.5 rescale): no separate head weight, no separate gradient or optimizer state;
- relative attention bias: layer 0 of each stack owns an (num_buckets, num_heads) table; its (1, H, q, k) bias is
  computed once per stack (bucket indices (q, k) int64 kept by the embedding lookup) and reused by every layer;
- T5LayerNorm is an RMSNorm that keeps its input in its own dtype besides the fp32 upcast (x * rsqrt(...));
- dropout (dropout_rate, 0.1 by default) after the embeddings, after each attention and feed-forward block, inside
  the feed-forward block (after the activation), on the attention probabilities and after each final norm;
- attention: eager keeps q, k, v copies (matmul folds the heads) and the probabilities (no fp32 upcast); SDPA on
  CPU runs the encoder's self-attention in its fused kernel (q, k, v, output, log-sum-exp, and the bias as the
  float mask, once per stack), and the decoder's self- and cross-attention in its math path (as eager, measured:
  torch 2.13 on CPU picks it for these inputs);
- the encoder's output is kept once, by every decoder layer's cross-attention k and v projections;
- the loss is nn.CrossEntropyLoss on the logits as they are (no fp32 upcast, no shift: the decoder input is the
  labels shifted right).
"""

from __future__ import annotations

from typing import NamedTuple

from memfit.models.families import FAMILIES


class Module(NamedTuple):
    """One module with parameters, as models/hf.Module (path, type, dims): hf.py lists their parameters."""

    path: str
    type: str
    dims: tuple


# module names inside a block (no stack or layer prefix), by role: LoRA targets, the ledger's layer parts
NAMES = {"q": "SelfAttention.q", "k": "SelfAttention.k", "v": "SelfAttention.v", "o": "SelfAttention.o",
         "cq": "EncDecAttention.q", "ck": "EncDecAttention.k", "cv": "EncDecAttention.v", "co": "EncDecAttention.o",
         "fc_in": "DenseReluDense.wi", "gate": "DenseReluDense.wi_0", "up": "DenseReluDense.wi_1",
         "fc_out": "DenseReluDense.wo", "lm_head": "lm_head"}


# ---------------------------------------------------------------------------------------------- parameters


def is_stacked(cfg: dict) -> bool:
    fam = FAMILIES.get(cfg.get("model_type"))
    return fam is not None and fam.stacked


def dims(cfg: dict) -> dict:
    return {"h": cfg["d_model"], "H": cfg["num_heads"], "d": cfg["d_kv"], "i": cfg["d_ff"], "V": cfg["vocab_size"],
            "Ne": cfg["num_layers"], "Nd": cfg["num_decoder_layers"], "buckets": cfg["relative_attention_num_buckets"]}


def _attention_modules(prefix: str, h: int, inner: int) -> list:
    return [Module(f"{prefix}.q", "linear", (h, inner, False)), Module(f"{prefix}.k", "linear", (h, inner, False)),
            Module(f"{prefix}.v", "linear", (h, inner, False)), Module(f"{prefix}.o", "linear", (inner, h, False))]


def _layer(cfg: dict, decoder: bool, first: bool) -> list:
    """One T5Block's modules, names relative to the block (`first`: layer 0, which owns the relative bias)."""
    n = dims(cfg)
    h, inner = n["h"], n["H"] * n["d"]
    out = _attention_modules("layer.0.SelfAttention", h, inner)
    if first:
        out.append(Module("layer.0.SelfAttention.relative_attention_bias", "embedding", (n["buckets"], n["H"])))
    out.append(Module("layer.0.layer_norm", "rmsnorm", (h,)))
    ff = "layer.2" if decoder else "layer.1"
    if decoder:
        out += _attention_modules("layer.1.EncDecAttention", h, inner) + [Module("layer.1.layer_norm", "rmsnorm", (h,))]
    if cfg["is_gated_act"]:
        out += [Module(f"{ff}.DenseReluDense.wi_0", "linear", (h, n["i"], False)),
                Module(f"{ff}.DenseReluDense.wi_1", "linear", (h, n["i"], False))]
    else:
        out.append(Module(f"{ff}.DenseReluDense.wi", "linear", (h, n["i"], False)))
    return out + [Module(f"{ff}.DenseReluDense.wo", "linear", (n["i"], h, False)), Module(f"{ff}.layer_norm", "rmsnorm", (h,))]


def stacks(cfg: dict) -> list:
    """(block name, parameter prefix of layer i = prefix + f"{i}.", layer count) in forward order."""
    n = dims(cfg)
    return [("encoder layer", "encoder.block.", n["Ne"]), ("decoder layer", "decoder.block.", n["Nd"])]


def _segments(cfg: dict) -> list:
    """named_parameters() order as (block, full module list) pieces; tied weights are left out later."""
    n = dims(cfg)
    out = [("embeddings", [Module("shared", "embedding", (n["V"], n["h"]))])]
    for (name, prefix, count), decoder in zip(stacks(cfg), (False, True)):
        for i in range(count):
            out.append((name, [Module(f"{prefix}{i}.{m.path}", m.type, m.dims) for m in _layer(cfg, decoder, i == 0)]))
        final = Module(f"{prefix.split('.')[0]}.final_layer_norm", "rmsnorm", (n["h"],))
        out.append(("embeddings" if not decoder else "head", [final]))
    out.append(("head", [Module("lm_head", "linear", (n["h"], n["V"], False))]))
    return out


TIED = {"lm_head.weight"}  # T5ForConditionalGeneration._tied_weights_keys (encoder/decoder embed_tokens too)


def layer_module(cfg: dict, index: int) -> str:
    """The module path of the step's layer `index` (over both stacks, encoder first): encoder.block.i, decoder.block.j."""
    for _, prefix, count in stacks(cfg):
        if index < count:
            return f"{prefix}{index}"
        index -= count
    raise IndexError(index)


def outer_modules(cfg: dict) -> tuple[str, str, str]:
    """(the embedding, the final norm before the head, the head): the module paths the timeline names the
    embeddings row and the head row by."""
    return "shared", "decoder.final_layer_norm", "lm_head"


def layer_index(cfg: dict, name: str):
    """A parameter's place in the step's walk: the layer's index over both stacks (encoder first), "embeddings"
    or "head"."""
    offset = 0
    for _, prefix, count in stacks(cfg):
        if name.startswith(prefix):
            if name.endswith("relative_attention_bias.weight"):
                return "embeddings"
            return offset + int(name[len(prefix):].split(".", 1)[0])
        offset += count
    return "head" if name.startswith(("decoder.final_layer_norm", "lm_head")) else "embeddings"




# ---------------------------------------------------------------------------------------------- Whisper (issue 34)
# WhisperForConditionalGeneration's modules in named_parameters() order (models/whisper.py: what its step saves).
# Its encoder and decoder are not T5's stacks (is_stacked is False): models/hf.py lists its parameters from here.


def _whisper_attention(prefix: str, h: int) -> list:
    return [Module(f"{prefix}.k_proj", "linear", (h, h, False)), Module(f"{prefix}.v_proj", "linear", (h, h, True)),
            Module(f"{prefix}.q_proj", "linear", (h, h, True)), Module(f"{prefix}.out_proj", "linear", (h, h, True))]


def _whisper_layer(cfg: dict, prefix: str, decoder: bool) -> list:
    h = cfg["d_model"]
    ffn = cfg["decoder_ffn_dim" if decoder else "encoder_ffn_dim"]
    out = _whisper_attention(f"{prefix}.self_attn", h) + [Module(f"{prefix}.self_attn_layer_norm", "layernorm", (h,))]
    if decoder:
        out += _whisper_attention(f"{prefix}.encoder_attn", h) + [Module(f"{prefix}.encoder_attn_layer_norm", "layernorm", (h,))]
    return out + [Module(f"{prefix}.fc1", "linear", (h, ffn, True)), Module(f"{prefix}.fc2", "linear", (ffn, h, True)),
                  Module(f"{prefix}.final_layer_norm", "layernorm", (h,))]


def whisper_modules(cfg: dict) -> list:
    """Every module with parameters, in named_parameters() order (proj_out, tied to embed_tokens, left out)."""
    h, m = cfg["d_model"], cfg["num_mel_bins"]
    out = [Module("model.encoder.conv1.weight", "param", (h, m, 3)), Module("model.encoder.conv1.bias", "param", (h,)),
           Module("model.encoder.conv2.weight", "param", (h, h, 3)), Module("model.encoder.conv2.bias", "param", (h,)),
           Module("model.encoder.embed_positions", "embedding", (cfg["max_source_positions"], h))]
    for i in range(cfg["encoder_layers"]):
        out += _whisper_layer(cfg, f"model.encoder.layers.{i}", False)
    out += [Module("model.encoder.layer_norm", "layernorm", (h,)),
            Module("model.decoder.embed_tokens", "embedding", (cfg["vocab_size"], h)),
            Module("model.decoder.embed_positions", "embedding", (cfg["max_target_positions"], h))]
    for i in range(cfg["decoder_layers"]):
        out += _whisper_layer(cfg, f"model.decoder.layers.{i}", True)
    out.append(Module("model.decoder.layer_norm", "layernorm", (h,)))
    if not cfg.get("tie_word_embeddings", True):
        out.append(Module("proj_out", "linear", (h, cfg["vocab_size"], False)))
    return out


def whisper_summary(cfg: dict) -> str:
    count = sum(_whisper_elements(m) for m in whisper_modules(cfg))
    return (f"WhisperForConditionalGeneration: {count:,} parameters; {cfg['encoder_layers']} encoder layers over "
            f"{cfg['max_source_positions']} positions ({2 * cfg['max_source_positions']} log-mel frames of "
            f"{cfg['num_mel_bins']}) + {cfg['decoder_layers']} decoder layers, hidden {cfg['d_model']}, "
            f"{cfg['encoder_attention_heads']}/{cfg['decoder_attention_heads']} heads, embeddings tied to the head")


def _whisper_elements(module: Module) -> int:
    """A module's parameter elements (a linear's weight and bias, a LayerNorm's two vectors, a bare parameter)."""
    if module.type == "linear":
        fan_in, fan_out, bias = module.dims
        return fan_in * fan_out + (fan_out if bias else 0)
    n = 1
    for d in module.dims:
        n *= d
    return 2 * n if module.type == "layernorm" else n

"""Whisper (WhisperForConditionalGeneration): its parameters and what one training step saves, without torch.

Read off transformers 5.24's models/whisper/modeling_whisper.py and checked against a real CPU step's
saved_tensors_hooks (tests/models/test_families_whisper.py):
- the encoder: conv1 (num_mel_bins -> d_model, kernel 3) and conv2 (stride 2) over 2 x max_source_positions log-mel
  frames, each followed by GELU, plus the sinusoidal `embed_positions` (frozen: requires_grad False); the encoder
  always runs max_source_positions positions (the feature extractor pads every clip to 30 s); pre-norm layers
  (LayerNorm, self-attention whose k_proj has no bias, LayerNorm, fc1, GELU, fc2), a final LayerNorm;
- the decoder: embed_tokens and learned embed_positions over `training.seq_len` tokens, pre-norm layers with a causal
  self-attention, a cross-attention over the encoder's output, the MLP; a final LayerNorm and `proj_out`, tied to
  embed_tokens; the loss is CrossEntropyLoss on the logits as they are;
- what autograd keeps (fp32, dropout 0 as Whisper's configs ship): the convolutions' inputs and the GELUs'; each
  LayerNorm its input and two (.., 1) statistics, each projection's input once (q, k and v share it), eager
  attention q, k, v and the probabilities, SDPA (its fused CPU kernel) q, k, v, its output and the log-sum-exp; the
  encoder's output once (every cross-attention's k and v projections read it); the embeddings' int64 indices.
Under full checkpointing each layer keeps its input (the decoder's also the encoder's output, its argument), and
the backward recomputes one layer at a time; the peak is the largest of the end of the forward, a decoder layer's
recomputation and an encoder layer's (once the decoder's tensors are released).

The step's figures are handed to the machinery the `[trace]` fallback uses (models/traced.py: a Traced model and a
Measured step), computed here rather than run on fake tensors.
"""

from __future__ import annotations

from memfit.config.presets import device_type
from memfit.models import hf, hf_encdec
from memfit.models.hf import Param
from memfit.recipe.autocast import op_dtype

F32, BF16, I64 = "float32", "bfloat16", "int64"


modules = hf_encdec.whisper_modules

FROZEN = frozenset({"model.encoder.embed_positions.weight"})  # WhisperEncoder: embed_positions.requires_grad_(False)


def parameters(cfg: dict) -> list[Param]:
    return hf.parameters(cfg)


def linear_modules(cfg: dict) -> list:
    return hf.linear_modules(cfg)


summary = hf_encdec.whisper_summary


def _elements(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# ------------------------------------------------------------------------------------------ what a step saves


def why_not(cfg: dict, training: dict, precision: str, adapted: dict) -> str:
    """Why these settings are outside what this module was measured at ("" when inside)."""
    if "quantization" in adapted:
        return "a quantized base"
    if "lora" in adapted and (lora_targets(adapted["lora"]) is None or precision != "32-true"):
        return ("LoRA other than target_modules [q_proj, v_proj] without dropout at 32-true (LoRA computed: q_proj and "
                "v_proj, any rank, no dropout, fp32)")
    if precision not in ("32-true", "bf16-true", "bf16-mixed"):
        return f"precision {precision} (32-true, bf16-true and bf16-mixed computed)"
    if training.get("attention", "sdpa") not in ("eager", "sdpa"):
        return f"attention {training.get('attention')} (eager and sdpa measured)"
    if training.get("checkpointing", "none") not in ("none", "full"):
        return f"checkpointing {training.get('checkpointing')}"
    drops = [k for k in ("dropout", "attention_dropout", "activation_dropout") if cfg.get(k)]
    if drops:
        return f"{', '.join(drops)} above 0 (Whisper's configs ship 0)"
    if cfg.get("apply_spec_augment"):
        return "apply_spec_augment"
    return ""


def _attention_kept(tag: str, b: int, heads: int, q: int, k: int, h: int, attention: str) -> list:
    d = h // heads
    out = [(f"{tag}: q", (b, heads, q, d), F32), (f"{tag}: k", (b, heads, k, d), F32), (f"{tag}: v", (b, heads, k, d), F32)]
    if attention == "eager":
        return out + [(f"{tag}: softmax probabilities", (b, heads, q, k), F32)]
    return out + [(f"{tag}: sdpa output", (b, heads, q, d), F32), (f"{tag}: sdpa log-sum-exp", (b, heads, q), F32)]


def _norm(tag: str, b: int, s: int, h: int) -> list:
    return [(f"{tag}: input", (b, s, h), F32), (f"{tag}: mean", (b, s, 1), F32), (f"{tag}: rstd", (b, s, 1), F32)]


def _layer_kept(cfg: dict, b: int, s: int, se: int, attention: str, decoder: bool) -> list:
    h = cfg["d_model"]
    heads = cfg["decoder_attention_heads" if decoder else "encoder_attention_heads"]
    ffn = cfg["decoder_ffn_dim" if decoder else "encoder_ffn_dim"]
    out = _norm("self_attn_layer_norm", b, s, h) + [("self_attn: q/k/v_proj input", (b * s, h), F32)]
    out += _attention_kept("self_attn", b, heads, s, s, h, attention) + [("self_attn: out_proj input", (b * s, h), F32)]
    if decoder:
        out += _norm("encoder_attn_layer_norm", b, s, h) + [("encoder_attn: q_proj input", (b * s, h), F32)]
        out += _attention_kept("encoder_attn", b, heads, s, se, h, attention) + [("encoder_attn: out_proj input", (b * s, h), F32)]
    return out + _norm("final_layer_norm", b, s, h) + [("fc1 input", (b * s, h), F32), ("fc1 output (GELU input)", (b, s, ffn), F32),
                                                       ("fc2 input", (b * s, ffn), F32)]


def _cast(kept: list, precision: str) -> list:
    """bf16-true: every floating tensor autograd keeps is bf16 (the model and the log-mel frames in bf16; LayerNorm's
    statistics too), but SDPA's log-sum-exp, fp32 in every dtype."""
    if precision != "bf16-true":
        return kept
    return [(label, shape, BF16 if dtype == F32 and "log-sum-exp" not in label else dtype) for label, shape, dtype in kept]


def _mixed_linear(tag: str, rows: int, n_in: int, n_out: int) -> list:
    """A linear under CPU autocast (bf16-mixed): its input's bf16 copy and its weight's (each call casts both)."""
    return [(f"{tag} input (bf16 copy)", (rows, n_in), BF16), (f"{tag} weight (bf16 copy)", (n_out, n_in), BF16)]


def _device_softmax(tag: str, b: int, heads: int, q: int, k: int, attention: str, device: str) -> list:
    """Eager attention's softmax of bf16 scores (no mask added: the encoder's self-attention, the decoder's
    cross-attention; `nn.functional.softmax(attn_weights, dim=-1)`, no dtype) where `device`'s autocast runs softmax
    in fp32 (recipe/autocast.py: CUDA's): its fp32 output is kept for its backward, beside the bf16 copy p @ v keeps."""
    if attention != "eager" or op_dtype("softmax", device, BF16, True) == BF16:
        return []
    return [(f"{tag}: softmax probabilities (fp32: {device} autocast's softmax)", (b, heads, q, k), F32)]


def _mixed_layer_kept(cfg: dict, b: int, s: int, se: int, attention: str, decoder: bool, device: str = "cpu") -> list:
    """A layer under bf16-mixed: LayerNorm in fp32 (the residual stream is fp32), every projection its input's and
    weight's bf16 copies (q, k and v each their own), the attention and GELU in bf16 (SDPA's log-sum-exp fp32); on a
    device whose autocast runs softmax in fp32, eager's unmasked softmaxes in fp32 too (_device_softmax). GELU (no
    pow) and LayerNorm (its input the fp32 residual stream) keep the same on CPU and CUDA."""
    h = cfg["d_model"]
    heads = cfg["decoder_attention_heads" if decoder else "encoder_attention_heads"]
    ffn = cfg["decoder_ffn_dim" if decoder else "encoder_ffn_dim"]
    bs = b * s
    out = _norm("self_attn_layer_norm", b, s, h)
    for name in ("q_proj", "k_proj", "v_proj"):
        out += _mixed_linear(f"self_attn.{name}", bs, h, h)
    out += _cast(_attention_kept("self_attn", b, heads, s, s, h, attention), "bf16-true")
    if not decoder:
        out += _device_softmax("self_attn", b, heads, s, s, attention, device)
    if decoder and attention == "eager":   # the fp32 causal mask promotes the scores: fp32 softmax, a bf16 copy for the matmul
        out += [("self_attn: softmax probabilities (fp32, the causal mask added)", (b, heads, s, s), F32)]
    out += _mixed_linear("self_attn.out_proj", bs, h, h)
    if decoder:
        out += _norm("encoder_attn_layer_norm", b, s, h) + _mixed_linear("encoder_attn.q_proj", bs, h, h)
        out += _mixed_linear("encoder_attn.k_proj (the encoder's output)", b * se, h, h)
        out += _mixed_linear("encoder_attn.v_proj (the encoder's output)", b * se, h, h)
        out += _cast(_attention_kept("encoder_attn", b, heads, s, se, h, attention), "bf16-true")
        out += _device_softmax("encoder_attn", b, heads, s, se, attention, device)
        out += _mixed_linear("encoder_attn.out_proj", bs, h, h)
    out += _norm("final_layer_norm", b, s, h) + _mixed_linear("fc1", bs, h, ffn)
    return out + [("fc1 output (GELU input)", (b, s, ffn), BF16)] + _mixed_linear("fc2", bs, ffn, h)


LORA_TARGETS = ("q_proj", "v_proj")   # the LoRA this module computes: the usual Whisper targets, both (peft 0.21 has no
# default for whisper: target_modules must be given)


def lora_targets(lora) -> tuple | None:
    """The adapted projections of a LoRA section this module computes (target_modules the list [q_proj, v_proj], which
    peft matches by name suffix in every attention; no dropout, no DoRA, nothing saved whole), else None."""
    if not isinstance(lora, dict):
        return None
    names = lora.get("target_modules")   # (a string is peft's regular expression over whole names: not computed)
    if not isinstance(names, list) or set(names) != set(LORA_TARGETS):   # (q or v alone: eager keeps otherwise)
        return None
    if lora.get("dropout") or lora.get("use_dora") or lora.get("modules_to_save") or lora.get("layers_to_transform"):
        return None
    return tuple(t for t in LORA_TARGETS if t in names)


def _lora_layer_kept(cfg: dict, b: int, s: int, se: int, attention: str, decoder: bool, first: bool, targets: tuple, r: int) -> list:
    """A layer under LoRA on `targets` with the base frozen: a frozen projection keeps nothing (its input's gradient
    needs only its weight), lora_A keeps the projections' input (once for q and v), lora_B its (.., r) input; a
    LayerNorm keeps its input once its input carries a gradient (not in a stack's first layer: the frozen embeddings
    and convolutions carry none); the attention and the GELU as without LoRA."""
    h = cfg["d_model"]
    heads = cfg["decoder_attention_heads" if decoder else "encoder_attention_heads"]
    ffn = cfg["decoder_ffn_dim" if decoder else "encoder_ffn_dim"]
    out = [] if first else _norm("self_attn_layer_norm", b, s, h)
    out += [("self_attn: lora_A input (the q/v projections' input)", (b * s, h), F32)]
    out += [(f"self_attn.{t}: lora_B input", (b * s, r), F32) for t in targets]
    attention_kept = _attention_kept("self_attn", b, heads, s, s, h, attention)
    if first and attention == "eager":   # q @ k^T keeps q for k's gradient: k (frozen k_proj, its input without one) has none
        attention_kept = [k for k in attention_kept if k[0] != "self_attn: q"]
    out += attention_kept
    if decoder:
        out += _norm("encoder_attn_layer_norm", b, s, h)
        if "q_proj" in targets:
            out += [("encoder_attn.q_proj: lora_A input", (b * s, h), F32), ("encoder_attn.q_proj: lora_B input", (b * s, r), F32)]
        if "v_proj" in targets:   # lora_A's input is the encoder's output, kept once (the bridge)
            out += [("encoder_attn.v_proj: lora_B input", (b * se, r), F32)]
        out += _attention_kept("encoder_attn", b, heads, s, se, h, attention)
    return out + _norm("final_layer_norm", b, s, h) + [("fc1 output (GELU input)", (b, s, ffn), F32)]


def measured(cfg: dict, micro_batch: int, seq_len: int, attention: str, checkpointing: str, precision: str = "32-true",
             lora: dict | None = None, device: str = "cuda"):
    """The step as models/traced.Measured: blocks (embeddings, each stack's layers in order, head, loss), the peak of
    live saved bytes (full checkpointing; else every saved byte) and each layer's recomputation. `device`: whose
    autocast runs a bf16-mixed step (config/presets.device_type)."""
    from memfit.models.traced import Measured
    from memfit.recipe.costs import dtype_bytes

    b, s, h, se = micro_batch, seq_len, cfg["d_model"], cfg["max_source_positions"]
    ne, nd = cfg["encoder_layers"], cfg["decoder_layers"]

    def size(kept) -> int:
        return sum(dtype_bytes(_elements(shape), dtype) for _, shape, dtype in kept)

    embeddings = [("conv1 input (log-mel features)", (b, cfg["num_mel_bins"], 2 * se), F32),
                  ("conv1 output (GELU input)", (b, h, 2 * se), F32), ("conv2 input", (b, h, 2 * se), F32),
                  ("conv2 output (GELU input)", (b, h, se), F32)]
    encoder = _layer_kept(cfg, b, se, se, attention, False)
    decoder = _layer_kept(cfg, b, s, se, attention, True)
    bridge = _norm("encoder layer_norm", b, se, h) + [("decoder embed_tokens indices", (b, s), I64),
                                                      ("decoder embed_positions indices", (b, s), I64)]
    encoder_output = [("the encoder's output (every encoder_attn k_proj / v_proj input)", (b * se, h), F32)] if nd else []
    head = _norm("decoder layer_norm", b, s, h) + [("proj_out input", (b * s, h), F32)]
    loss = [("log-softmax of the logits", (b * s, cfg["vocab_size"]), F32), ("targets (the labels)", (b * s,), I64),
            ("total weight", (), F32)]
    targets = lora_targets(lora)
    if targets:   # the frozen embeddings, convolutions and embedding indices keep nothing; proj_out (frozen) nothing
        r = lora.get("r", 8)
        embeddings = []
        encoder_first, encoder = (_lora_layer_kept(cfg, b, se, se, attention, False, first, targets, r) for first in (True, False))
        decoder_first, decoder = (_lora_layer_kept(cfg, b, s, se, attention, True, first, targets, r) for first in (True, False))
        bridge = _norm("encoder layer_norm", b, se, h)
        if "v_proj" not in targets:
            encoder_output = []
        head = _norm("decoder layer_norm", b, s, h)
    elif precision == "bf16-mixed":   # the convolutions in bf16 (input and weight copies); the encoder's output cast per layer
        mel = cfg["num_mel_bins"]
        embeddings = [("conv1 input (bf16 copy of the log-mel features)", (b, mel, 2 * se), BF16), ("conv1 weight (bf16 copy)", (h, mel, 3), BF16),
                      ("conv1 output (GELU input)", (b, h, 2 * se), BF16), ("conv2 input", (b, h, 2 * se), BF16),
                      ("conv2 weight (bf16 copy)", (h, h, 3), BF16), ("conv2 output (GELU input)", (b, h, se), BF16)]
        encoder_first = encoder = _mixed_layer_kept(cfg, b, se, se, attention, False, device)
        decoder_first = decoder = _mixed_layer_kept(cfg, b, s, se, attention, True, device)
        encoder_output = []
        head = _norm("decoder layer_norm", b, s, h) + _mixed_linear("proj_out", b * s, h, cfg["vocab_size"])
    else:
        encoder_first, decoder_first = encoder, decoder
    if precision == "bf16-true":
        embeddings, encoder, decoder, bridge, encoder_output, head, loss, encoder_first, decoder_first = (
            _cast(kept, precision) for kept in (embeddings, encoder, decoder, bridge, encoder_output, head, loss, encoder_first, decoder_first))
    from memfit.models.hf_activations import lora_key

    adapters = lora_key(lora)
    layers_total = ne + nd
    if checkpointing != "full":
        blocks = [("embeddings", 1, tuple(embeddings))]
        if ne:   # (under LoRA a stack's first layer keeps less: no gradient reaches its input)
            blocks += [("layer", 1, tuple(encoder_first))] + ([("layer", ne - 1, tuple(encoder))] if ne > 1 else [])
        if nd:
            blocks.append(("layer", 1, tuple(bridge + encoder_output + decoder_first)))
            if nd > 1:
                blocks.append(("layer", nd - 1, tuple(decoder)))
        else:
            head = bridge + head
        blocks += [("head", 1, tuple(head)), ("loss", 1, tuple(loss))]
        run = (micro_batch, seq_len, attention, checkpointing, precision, adapters)
        return Measured(run, tuple(blocks), sum(count * size(kept) for _, count, kept in blocks), (), layers_total, layers_total)
    enc_in = _cast([("checkpoint: the layer's input", (b, se, h), F32)], precision)
    dec_in = _cast([("checkpoint: the layer's input", (b, s, h), F32)], precision)
    blocks = [("embeddings", 1, tuple(embeddings))]
    if ne:
        blocks.append(("layer", ne, tuple(enc_in)))
    if nd:
        # the decoder layers' checkpoint keeps the encoder's output, their argument (fp32 also under bf16-mixed)
        argument = encoder_output or [("checkpoint: the encoder's output", (b * se, h), F32)]
        blocks.append(("layer", 1, tuple(bridge + argument + dec_in)))
        if nd > 1:
            blocks.append(("layer", nd - 1, tuple(dec_in)))
    else:
        head = bridge + head
    blocks += [("head", 1, tuple(head)), ("loss", 1, tuple(loss))]
    end_of_forward = sum(count * size(kept) for _, count, kept in blocks)
    # a layer's first LayerNorm keeps its input: the checkpoint's boundary, counted once
    decoder_each = size(decoder) - size(dec_in)
    encoder_each = size(encoder) - size(enc_in)
    moments = [end_of_forward]
    if nd:   # the last decoder layer's recomputation, once the head and loss are released
        moments.append(end_of_forward - size(head) - size(loss) + decoder_each)
    if ne:   # an encoder layer's, once the decoder's backward has released all it kept
        moments.append(size(embeddings) + ne * size(enc_in) + encoder_each)
    recomputed = tuple(tuple(encoder) for _ in range(ne)) + tuple(tuple(decoder) for _ in range(nd))
    run = (micro_batch, seq_len, attention, checkpointing, precision, adapters)
    return Measured(run, tuple(blocks), max(moments), recomputed, layers_total, layers_total)


def traced_model(cfg: dict):
    """The model as models/traced.Traced describes a model transformers built (the fallback's machinery prices it)."""
    from memfit.models.traced import Traced

    heads = cfg["encoder_attention_heads"]
    sizes = {"hidden": cfg["d_model"], "heads": heads, "kv_heads": heads, "head_dim": cfg["d_model"] // heads,
             "vocab": cfg["vocab_size"], "rule": "gpt_neox", "intermediate": cfg["encoder_ffn_dim"], "act": "gelu"}
    return Traced("whisper", "WhisperForConditionalGeneration", "", parameters(cfg), FROZEN, linear_modules(cfg),
                  "model.encoder.layers.", cfg["encoder_layers"], sizes)


def derive(cfg: dict, raw: dict, out, where, file, data: dict, at_architecture) -> list:
    """models/hf.derive's tail for Whisper: the step this module computes, priced by the fallback's machinery
    (models/traced._tensors); settings it was not measured at run the `[trace]` fallback's fake-tensor step where
    memfit[trace] is installed, else are refused with the reason."""

    from memfit.diagnostics import codes
    from memfit.diagnostics.diagnostic import Problem
    from memfit.models import traced
    from memfit.models.hf import _recipe_arguments

    training = data.get("training") or {}
    missing = [key for key in ("micro_batch", "seq_len") if key not in training]
    if missing:
        at = ("training",) if "training" in data else ("model",)
        need = " and ".join(f"training.{key}" for key in missing)
        return [Problem(at, codes.SCHEMA, f"a transformer model needs {need}: the batch axis and the tokens per sequence", on_key=True)]
    parallel = data.get("parallel") if isinstance(data.get("parallel"), dict) else {}
    for key in ("tensor", "pipeline"):   # as the T5 family: the two stacks are not split across ranks
        if isinstance(parallel.get(key), int) and not isinstance(parallel[key], bool) and parallel[key] > 1:
            message = (f"parallel.{key} {parallel[key]}: memfit does not split Whisper's encoder and decoder across "
                       f"{key}-parallel ranks; data-parallel layouts (ZeRO, FSDP) are modeled")
            return [Problem(("parallel", key), codes.BAD_PARALLEL, message, on_key=True)]
    hints = []
    if "target_len" in training:
        message = ("training.target_len: Whisper's decoder runs training.seq_len tokens and its encoder "
                   f"max_source_positions ({cfg['max_source_positions']}) positions, whatever the clip: ignored")
        hints.append(Problem(("training", "target_len"), codes.IGNORED_KEY, message, on_key=True))
    seq_len = training["seq_len"]
    if isinstance(seq_len, int) and seq_len > cfg["max_target_positions"]:
        message = (f"training.seq_len {seq_len} is longer than Whisper's decoder positions (max_target_positions "
                   f"{cfg['max_target_positions']}): transformers refuses it; train at most that many tokens")
        return [Problem(("training", "seq_len"), codes.SCHEMA, message, on_key=True)]
    base = out.widths["parameters"].name
    recipe = _recipe_arguments(data, base if isinstance(base, str) else "float32")
    adapted = {key: data[key] for key in ("lora", "quantization") if key in data}
    why = why_not(cfg, training, recipe.get("precision", "32-true"), adapted)
    if architecture_name(cfg) != "WhisperForConditionalGeneration":
        why = f"{architecture_name(cfg)} (the decoder alone)"
    if why:
        reason = (f"{architecture_name(cfg)}: memfit's whisper family computes WhisperForConditionalGeneration's step at 32-true, bf16-true and bf16-mixed, "
                  f"eager or sdpa attention, checkpointing none or full, no dropout and no adapters; not {why}")
        return hints + traced.fallback(reason, raw, out, where, file, training, data, at_architecture)
    step = measured(cfg, training["micro_batch"], seq_len, training.get("attention", "sdpa"), training.get("checkpointing", "none"),
                    recipe.get("precision", "32-true"), recipe.get("lora"), device_type(data.get("device")))
    problems, _, _ = traced._tensors(traced_model(cfg), out, where, file, training, data, None, given=step)
    if out.model is not None:
        out.model = out.model._replace(summary=summary(cfg))
    return hints + problems


def architecture_name(cfg: dict) -> str:
    return (cfg.get("architectures") or ["WhisperForConditionalGeneration"])[0]

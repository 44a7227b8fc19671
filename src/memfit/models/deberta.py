"""DeBERTa-v2 / v3 (DebertaV2ForMaskedLM, ForSequenceClassification, ForTokenClassification): parameters and what one
training step saves, without torch (models/encoders.py prices it).

Read off transformers 5.24's models/deberta_v2/modeling_deberta_v2.py and checked against a real CPU step's
saved_tensors_hooks (tests/models/test_families_deberta_modernbert.py). The attention is the model's own (no SDPA:
training.attention does not change it). What autograd keeps (fp32; dropout as CUDA's fused kernel, a 1-byte mask):
- the embeddings: the token ids (and token-type ids, type_vocab_size > 0), the LayerNorm's input and statistics, the
  input mask as float (the output is multiplied by it), the dropout mask; with relative attention and norm_rel_ebd
  "layer_norm", that LayerNorm's statistics over the relative-position table (its input is the table itself);
- each layer: the q/k/v projections' input once, the score scale, q and k^T / scale (the bmm), with relative
  attention the table after pos_dropout (its mask) and, per position term, the projected table, the index (s x s
  int64), the scores before the gather and the term's scale (position-to-content also keeps k itself); the
  masked_fill's boolean mask (b, 1, s, s), the softmax output, the attention dropout's mask and output, v, the output
  dense's input, the dropout mask, the LayerNorm's input and statistics, the MLP's inputs and the GELU's, again a
  dropout mask and a LayerNorm;
- the heads: the masked LM's transform (dense input, GELU input, LayerNorm) and decoder input, then the
  cross-entropy over the vocabulary; the token classifier's dropout and classifier input; the sequence classifier's
  pooler (the [CLS] row of the last hidden state: the whole (b, s, h) storage it is a view of), its GELU, dropout and
  classifier, and the loss as DebertaV2ForSequenceClassification computes it (one label: MSE; else the labelled rows
  gathered first, then cross-entropy).
Under full checkpointing each layer keeps its input, the first also the float attention mask it is handed.
"""

from __future__ import annotations

from memfit.models.encoders import BOOL, F32, I64, cross_entropy, norm
from memfit.models.families import MASKED_LM, SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION, FAMILIES
from memfit.models.hf import Param

FAMILY = "deberta-v2"


def _get(cfg: dict, key: str, default):
    value = cfg.get(key, default)
    return default if value is None else value


def _geometry(cfg: dict) -> dict:
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    d = _get(cfg, "attention_head_size", h // heads)
    rel = bool(cfg.get("relative_attention"))
    buckets = _get(cfg, "position_buckets", -1)
    max_rel = _get(cfg, "max_relative_positions", -1)
    if max_rel < 1:
        max_rel = cfg["max_position_embeddings"]
    span = buckets if buckets > 0 else max_rel
    kinds = [k for k in (cfg.get("pos_att_type") or []) if k in ("c2p", "p2c")]
    norm_rel = [x.strip() for x in str(_get(cfg, "norm_rel_ebd", "none")).lower().split("|")]
    return {"h": h, "heads": heads, "d": d, "all": heads * d, "rel": rel, "span": span, "kinds": kinds if rel else [],
            "share": bool(_get(cfg, "share_att_key", False)), "norm_rel": rel and "layer_norm" in norm_rel,
            "I": cfg["intermediate_size"]}


def _kind(cfg: dict) -> str:
    fam = FAMILIES[FAMILY]
    return fam.architectures[(cfg.get("architectures") or [fam.default_architecture])[0]]


def _labels(cfg: dict) -> int:
    return len(cfg.get("id2label") or {0: 0, 1: 1})


# ------------------------------------------------------------------------------------------------ parameters


def _linear(name: str, n_in: int, n_out: int, bias: bool = True) -> list:
    return [Param(name + ".weight", (n_out, n_in), "other")] + ([Param(name + ".bias", (n_out,), "other")] if bias else [])


def _layernorm(name: str, h: int) -> list:
    return [Param(name + ".weight", (h,), "norm"), Param(name + ".bias", (h,), "norm")]


def _layer(cfg: dict, g: dict, prefix: str) -> list:
    h = g["h"]
    out = _linear(f"{prefix}.attention.self.query_proj", h, g["all"]) + _linear(f"{prefix}.attention.self.key_proj", h, g["all"])
    out += _linear(f"{prefix}.attention.self.value_proj", h, g["all"])
    if g["rel"] and not g["share"]:
        if "c2p" in g["kinds"]:
            out += _linear(f"{prefix}.attention.self.pos_key_proj", h, g["all"])
        if "p2c" in g["kinds"]:
            out += _linear(f"{prefix}.attention.self.pos_query_proj", h, g["all"])
    out += _linear(f"{prefix}.attention.output.dense", g["all"], h) + _layernorm(f"{prefix}.attention.output.LayerNorm", h)
    out += _linear(f"{prefix}.intermediate.dense", h, g["I"]) + _linear(f"{prefix}.output.dense", g["I"], h)
    return out + _layernorm(f"{prefix}.output.LayerNorm", h)


def parameters(cfg: dict) -> list[Param]:
    """named_parameters() of the DebertaV2 class architectures[0] names, in order, tied weights once."""
    g, h, kind = _geometry(cfg), cfg["hidden_size"], _kind(cfg)
    out = [Param("deberta.embeddings.word_embeddings.weight", (cfg["vocab_size"], h), "embedding")]
    if cfg.get("position_biased_input", True):
        out.append(Param("deberta.embeddings.position_embeddings.weight", (cfg["max_position_embeddings"], h), "embedding"))
    if cfg["type_vocab_size"] > 0:
        out.append(Param("deberta.embeddings.token_type_embeddings.weight", (cfg["type_vocab_size"], h), "embedding"))
    out += _layernorm("deberta.embeddings.LayerNorm", h)
    for i in range(cfg["num_hidden_layers"]):
        out += _layer(cfg, g, f"deberta.encoder.layer.{i}")
    if g["rel"]:
        out.append(Param("deberta.encoder.rel_embeddings.weight", (2 * g["span"], h), "embedding"))
        if g["norm_rel"]:
            out += _layernorm("deberta.encoder.LayerNorm", h)
    tied = cfg.get("tie_word_embeddings", True)
    if kind == MASKED_LM and cfg.get("legacy", True):
        out.append(Param("cls.predictions.bias", (cfg["vocab_size"],), "other"))
        out += _linear("cls.predictions.transform.dense", h, h) + _layernorm("cls.predictions.transform.LayerNorm", h)
        if not tied:   # tie_word_embeddings false unties the decoder's bias from cls.predictions.bias as well
            out += [Param("cls.predictions.decoder.weight", (cfg["vocab_size"], h), "other"),
                    Param("cls.predictions.decoder.bias", (cfg["vocab_size"],), "other")]
    elif kind == MASKED_LM:
        out.append(Param("lm_predictions.lm_head.bias", (cfg["vocab_size"],), "other"))
        out += _linear("lm_predictions.lm_head.dense", h, h) + _layernorm("lm_predictions.lm_head.LayerNorm", h)
    elif kind == SEQUENCE_CLASSIFICATION:
        pooled = cfg.get("pooler_hidden_size") or h
        out += _linear("pooler.dense", pooled, pooled) + _linear("classifier", h, _labels(cfg))
    else:
        out += _linear("classifier", h, _labels(cfg))
    return out


def linears(cfg: dict) -> list:
    """(module name, in, out, bias) of every nn.Linear, in module order (the masked LM's decoder, tied, last)."""
    params = parameters(cfg)
    names = {p.name for p in params}
    out = []
    for p in params:
        if p.name.endswith(".weight") and len(p.shape) == 2 and p.kind == "other" and p.name != "cls.predictions.decoder.weight":
            name = p.name[: -len(".weight")]
            out.append((name, p.shape[1], p.shape[0], name + ".bias" in names))
    if _kind(cfg) == MASKED_LM and cfg.get("legacy", True):
        out.append(("cls.predictions.decoder", cfg["hidden_size"], cfg["vocab_size"], True))
    return out


def buffers(cfg: dict) -> list:
    return [("deberta.embeddings.position_ids", (1, cfg["max_position_embeddings"]), "int64")]


def layer_prefix(cfg: dict) -> str:
    return "deberta.encoder.layer."


def max_positions(cfg: dict) -> int | None:
    """Absolute position embeddings have max_position_embeddings rows (position_biased_input); relative positions
    are bucketed or clamped, so only then is the length bounded."""
    return cfg["max_position_embeddings"] if cfg.get("position_biased_input", True) else None


def sizes(cfg: dict) -> dict:
    g = _geometry(cfg)
    return {"hidden": g["h"], "heads": g["heads"], "kv_heads": g["heads"], "head_dim": g["d"], "vocab": cfg["vocab_size"],
            "rule": "gpt_neox", "intermediate": g["I"], "act": "gelu"}


def summary(cfg: dict) -> str:
    g = _geometry(cfg)
    count = sum(_n(p.shape) for p in parameters(cfg))
    rel = (f"relative attention ({'+'.join(g['kinds']) or 'no position terms'} over {2 * g['span']} positions"
           f"{', shared keys' if g['share'] else ''})" if g["rel"] else "absolute positions")
    return (f"{(cfg.get('architectures') or ['DebertaV2ForMaskedLM'])[0]}: {count:,} parameters; {cfg['num_hidden_layers']} layers, "
            f"hidden {g['h']}, {g['heads']} heads of {g['d']}, {rel}")


def _n(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# ------------------------------------------------------------------------------------------ what a step saves


def why_not(cfg: dict, training: dict, precision: str, adapted: bool) -> str:
    """Why these settings are outside what this module computes ("" when inside)."""
    if adapted:
        return "LoRA or a quantized base"
    if precision != "32-true":
        return f"precision {precision} (fp32 computed)"
    if training.get("checkpointing", "none") not in ("none", "full"):
        return f"checkpointing {training.get('checkpointing')}"
    if _get(cfg, "conv_kernel_size", 0) > 0:
        return "conv_kernel_size above 0 (the first layer's convolution)"
    if _get(cfg, "embedding_size", cfg["hidden_size"]) != cfg["hidden_size"]:
        return "an embedding_size other than hidden_size (the embedding projection)"
    for key in ("hidden_act", "pooler_hidden_act"):
        if cfg.get(key) != "gelu":
            return f"{key} {cfg.get(key)!r} (gelu computed)"
    if cfg.get("problem_type") not in (None, "regression", "single_label_classification"):
        return f"problem_type {cfg.get('problem_type')}"
    return ""


def notes(cfg: dict, training: dict) -> list:
    from memfit.diagnostics import codes
    from memfit.diagnostics.diagnostic import Problem

    if training.get("attention", "eager") != "eager":
        message = (f"training.attention {training['attention']}: DeBERTa-v2 runs its own disentangled attention (transformers "
                   "has no SDPA or flash kernel for it; from_pretrained refuses attn_implementation=\"sdpa\"): ignored")
        return [Problem(("training", "attention"), codes.IGNORED_KEY, message, on_key=True)]
    return []


def overlap(cfg: dict, b: int, s: int) -> list:
    return [("the layer's input (the q/k/v projections' input)", (b, s, cfg["hidden_size"]), F32)]


def _dropout(cfg: dict, key: str) -> float:
    return float(_get(cfg, key, 0.0))


def _layer_kept(cfg: dict, g: dict, b: int, s: int, first: bool) -> list:
    h, heads, d, span = g["h"], g["heads"], g["d"], g["span"]
    bh = b * heads
    p_h, p_a = _dropout(cfg, "hidden_dropout_prob"), _dropout(cfg, "attention_probs_dropout_prob")
    out = [("q/k/v_proj input", (b * s, h), F32), ("the scores' scale", (), F32), ("query_layer (bmm)", (bh, s, d), F32),
           ("key_layer^T / scale (bmm)", (bh, d, s), F32)]
    if g["rel"] and p_h > 0:   # pos_dropout runs whether or not a position term reads its output
        out += [("pos_dropout mask", (2 * span, h), BOOL)]
    if g["rel"] and g["kinds"]:
        if p_h > 0:
            out += [("relative embeddings after pos_dropout (projections' input)", (2 * span, h), F32)]
        elif first and g["norm_rel"]:   # the LayerNorm's output, the same tensor for every layer
            out += [("relative embeddings, normed (projections' input)", (2 * span, h), F32)]
        if "c2p" in g["kinds"]:
            out += [("pos_key_layer (c2p bmm)", (bh, 2 * span, d), F32), ("c2p index", (s * s,), I64),
                    ("c2p scores (gather input)", (bh, s, 2 * span), F32), ("c2p scale", (), F32)]
        if "p2c" in g["kinds"]:
            out += [("pos_query_layer (p2c bmm)", (bh, 2 * span, d), F32), ("key_layer (p2c bmm)", (bh, s, d), F32),
                    ("p2c index", (s * s,), I64), ("p2c scores (gather input)", (bh, s, 2 * span), F32), ("p2c scale", (), F32)]
    out += [("masked_fill mask", (b, 1, s, s), BOOL), ("softmax output", (b, heads, s, s), F32)]
    if p_a > 0:
        out += [("attention dropout mask", (b, heads, s, s), BOOL), ("attention probabilities after dropout (bmm)", (bh, s, s), F32)]
    out += [("value_layer (bmm)", (bh, s, d), F32), ("attention.output.dense input", (b * s, g["all"]), F32)]
    if p_h > 0:
        out += [("attention.output dropout mask", (b, s, h), BOOL)]
    out += norm("attention.output.LayerNorm", b, s, h)
    out += [("intermediate.dense input", (b * s, h), F32), ("GELU input", (b, s, g["I"]), F32), ("output.dense input", (b * s, g["I"]), F32)]
    if p_h > 0:
        out += [("output dropout mask", (b, s, h), BOOL)]
    return out + norm("output.LayerNorm", b, s, h)


def _head(cfg: dict, g: dict, b: int, s: int) -> tuple:
    h, kind, p_h = g["h"], _kind(cfg), _dropout(cfg, "hidden_dropout_prob")
    if kind == MASKED_LM:
        head = [("transform.dense input", (b * s, h), F32), ("transform GELU input", (b, s, h), F32)]
        head += norm("transform.LayerNorm", b, s, h) + [("decoder input", (b * s, h), F32)]
        return head, cross_entropy(b * s, cfg["vocab_size"])
    labels = _labels(cfg)
    if kind == TOKEN_CLASSIFICATION:
        head = [("dropout mask", (b, s, h), BOOL)] if p_h > 0 else []
        return head + [("classifier input", (b * s, h), F32)], cross_entropy(b * s, labels)
    pooled = cfg.get("pooler_hidden_size") or h
    if _dropout(cfg, "pooler_dropout") > 0:
        head = [("pooler dropout mask", (b, pooled), BOOL), ("pooler.dense input", (b, pooled), F32)]
    else:   # the [CLS] row is a view: the dense keeps the last hidden state's whole storage
        head = [("pooler.dense input (the last hidden state, viewed at [CLS])", (b, s, h), F32)]
    head += [("pooler GELU input", (b, pooled), F32)]
    p_cls = _get(cfg, "cls_dropout", p_h)
    if float(p_cls) > 0:
        head += [("dropout mask", (b, pooled), BOOL)]
    head += [("classifier input", (b, pooled), F32)]
    problem = cfg.get("problem_type")
    if problem == "regression" or (problem is None and labels == 1):
        return head, [("MSE input (the logits)", (b,), F32), ("MSE target (the labels)", (b,), F32)]
    if problem is None:   # labelled rows gathered (nonzero), then cross-entropy on them
        loss = [("logits (gather input)", (b, labels), F32), ("labelled rows (gather index)", (b, 1), I64)]
        return head, loss + cross_entropy(b, labels)
    return head, cross_entropy(b, labels)


def step(cfg: dict, b: int, s: int, attention: str, recomputed: bool = False) -> tuple:
    g, h = _geometry(cfg), cfg["hidden_size"]
    embeddings = [("word_embeddings indices", (b, s), I64)]
    if cfg["type_vocab_size"] > 0:
        embeddings.append(("token_type_embeddings indices", (b, s), I64))
    embeddings += norm("embeddings.LayerNorm", b, s, h) + [("the input mask as float", (b, s, 1), F32)]
    if _dropout(cfg, "hidden_dropout_prob") > 0:
        embeddings.append(("embeddings dropout mask", (b, s, h), BOOL))
    if g["norm_rel"]:
        embeddings += [("relative embeddings LayerNorm: mean", (2 * g["span"], 1), F32),
                       ("relative embeddings LayerNorm: rstd", (2 * g["span"], 1), F32)]
    n = cfg["num_hidden_layers"]
    layers = [_layer_kept(cfg, g, b, s, recomputed or i == 0) for i in range(n)]
    boundary = [("checkpoint: the layer's input", (b, s, h), F32)]
    boundaries = [boundary + ([("checkpoint: the attention mask (float)", (b, 1, s, s), F32)] if i == 0 else []) for i in range(n)]
    head, loss = _head(cfg, g, b, s)
    return embeddings, layers, boundaries, head, loss


def derive(cfg: dict, raw: dict, out, where, file, data: dict, at_architecture) -> list:
    """models/hf.derive's tail for DeBERTa-v2 (models/encoders.derive with this module)."""
    import sys

    from memfit.models import encoders

    return encoders.derive(sys.modules[__name__], cfg, raw, out, where, file, data, at_architecture)

"""ModernBERT (ModernBertForMaskedLM, ForSequenceClassification, ForTokenClassification): parameters and what one
training step saves, without torch (models/encoders.py prices it).

Read off transformers 5.24's models/modernbert/modeling_modernbert.py and checked against a real CPU step's
saved_tensors_hooks (tests/models/test_families_deberta_modernbert.py). What autograd keeps (fp32; dropout as CUDA's
fused kernel, a 1-byte mask; ModernBERT's configs ship every dropout at 0):
- the embeddings: the token ids, the LayerNorm's input and statistics (and embedding_dropout's mask);
- each layer: the attention norm (none in layer 0: an identity) and the Wqkv input; the first layer of each type
  (full, sliding) the rotary cos and sin (s, head_dim) the later ones share; eager attention the rotated q and k, the
  softmax output (its dropout's mask and output), v (copied for the matmul) and Wo's input; SDPA (its fused CPU
  kernel) the rotated q and k, the whole Wqkv output (v is a view of it), the log-sum-exp and its output (Wo's input),
  and in a sliding layer whose window masks something (seq_len >= local_attention / 2) the float mask it converts;
  the MLP norm, Wi's input, Wi's output (the GELU's input and the gate are views of it), the GELU's output and Wo's
  input (mlp_dropout's mask);
- the head: the final norm, the prediction head (dense input, GELU input, LayerNorm) and the decoder's or
  classifier's input, then the loss; a sequence classifier pools the [CLS] row (a view: the dense keeps the final
  norm's whole output) or the mean (the mask and the token counts kept).
Under full checkpointing each layer keeps its input.
"""

from __future__ import annotations

from memfit.models.encoders import BOOL, F32, I64, cross_entropy, norm
from memfit.models.families import MASKED_LM, SEQUENCE_CLASSIFICATION, FAMILIES
from memfit.models.hf import Param

FAMILY = "modernbert"


def _kind(cfg: dict) -> str:
    fam = FAMILIES[FAMILY]
    return fam.architectures[(cfg.get("architectures") or [fam.default_architecture])[0]]


def _labels(cfg: dict) -> int:
    return len(cfg.get("id2label") or {0: 0, 1: 1})


def _types(cfg: dict) -> list:
    return list(cfg["layer_types"])[: cfg["num_hidden_layers"]]


# ------------------------------------------------------------------------------------------------ parameters


def _linear(name: str, n_in: int, n_out: int, bias: bool) -> list:
    return [Param(name + ".weight", (n_out, n_in), "other")] + ([Param(name + ".bias", (n_out,), "other")] if bias else [])


def _norm(cfg: dict, name: str) -> list:
    h = cfg["hidden_size"]
    return [Param(name + ".weight", (h,), "norm")] + ([Param(name + ".bias", (h,), "norm")] if cfg.get("norm_bias") else [])


def parameters(cfg: dict) -> list[Param]:
    """named_parameters() of the ModernBert class architectures[0] names, in order, tied weights once."""
    h, inter, kind = cfg["hidden_size"], cfg["intermediate_size"], _kind(cfg)
    attn, mlp = bool(cfg.get("attention_bias")), bool(cfg.get("mlp_bias"))
    out = [Param("model.embeddings.tok_embeddings.weight", (cfg["vocab_size"], h), "embedding")] + _norm(cfg, "model.embeddings.norm")
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        out += (_norm(cfg, f"{p}.attn_norm") if i else []) + _linear(f"{p}.attn.Wqkv", h, 3 * h, attn) + _linear(f"{p}.attn.Wo", h, h, attn)
        out += _norm(cfg, f"{p}.mlp_norm") + _linear(f"{p}.mlp.Wi", h, 2 * inter, mlp) + _linear(f"{p}.mlp.Wo", inter, h, mlp)
    out += _norm(cfg, "model.final_norm")
    out += _linear("head.dense", h, h, bool(cfg.get("classifier_bias"))) + _norm(cfg, "head.norm")
    if kind == MASKED_LM:
        if not cfg.get("tie_word_embeddings", True):
            out.append(Param("decoder.weight", (cfg["vocab_size"], h), "other"))
        if cfg.get("decoder_bias", True):
            out.append(Param("decoder.bias", (cfg["vocab_size"],), "other"))
    else:
        out += _linear("classifier", h, _labels(cfg), True)
    return out


def linears(cfg: dict) -> list:
    """(module name, in, out, bias) of every nn.Linear, in module order (the masked LM's decoder last)."""
    params = parameters(cfg)
    names = {p.name for p in params}
    out = [(p.name[: -len(".weight")], p.shape[1], p.shape[0], p.name[: -len("weight")] + "bias" in names)
           for p in params if p.name.endswith(".weight") and p.kind == "other" and p.name != "decoder.weight"]
    if _kind(cfg) == MASKED_LM:
        out.append(("decoder", cfg["hidden_size"], cfg["vocab_size"], bool(cfg.get("decoder_bias", True))))
    return out


def buffers(cfg: dict) -> list:
    """The rotary embedding's inv_freq pair per layer type present (sorted: full_attention before sliding_attention)."""
    half = (cfg["hidden_size"] // cfg["num_attention_heads"]) // 2
    out = []
    for kind in sorted(set(cfg["layer_types"])):
        out += [(f"model.rotary_emb.{kind}_inv_freq", (half,), "float32"), (f"model.rotary_emb.{kind}_original_inv_freq", (half,), "float32")]
    return out


def layer_prefix(cfg: dict) -> str:
    return "model.layers."


def max_positions(cfg: dict) -> int | None:
    return None   # rotary positions: max_position_embeddings bounds nothing the step builds


def sizes(cfg: dict) -> dict:
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    return {"hidden": h, "heads": heads, "kv_heads": heads, "head_dim": h // heads, "vocab": cfg["vocab_size"],
            "rule": "gpt_neox", "intermediate": cfg["intermediate_size"], "act": "gelu"}


def summary(cfg: dict) -> str:
    count = 0
    for p in parameters(cfg):
        n = 1
        for d in p.shape:
            n *= d
        count += n
    types = _types(cfg)
    heads = cfg["num_attention_heads"]
    return (f"{(cfg.get('architectures') or ['ModernBertForMaskedLM'])[0]}: {count:,} parameters; {len(types)} layers "
            f"({types.count('full_attention')} global, {types.count('sliding_attention')} over a window of "
            f"{cfg['local_attention']}), hidden {cfg['hidden_size']}, {heads} heads of {cfg['hidden_size'] // heads}")


# ------------------------------------------------------------------------------------------ what a step saves

ACTIVATIONS = ("gelu",)   # nn.functional.gelu: keeps its input


def why_not(cfg: dict, training: dict, precision: str, adapted: bool) -> str:
    """Why these settings are outside what this module computes ("" when inside)."""
    if adapted:
        return "LoRA or a quantized base"
    if precision != "32-true":
        return f"precision {precision} (fp32 computed)"
    attention = training.get("attention", "sdpa")
    if attention not in ("eager", "sdpa"):
        return f"attention {attention} (eager and sdpa computed)"
    if attention == "sdpa" and cfg.get("attention_dropout"):
        return "attention_dropout above 0 under sdpa (CPU's SDPA then runs its math kernel)"
    if training.get("checkpointing", "none") not in ("none", "full"):
        return f"checkpointing {training.get('checkpointing')}"
    for key in ("hidden_activation", "classifier_activation"):
        if cfg.get(key) not in ACTIVATIONS:
            return f"{key} {cfg.get(key)!r} (gelu computed)"
    if cfg.get("sparse_prediction") and _kind(cfg) == MASKED_LM:
        return "sparse_prediction (the masked rows picked by the labels)"
    if cfg.get("classifier_pooling") not in ("cls", "mean"):
        return f"classifier_pooling {cfg.get('classifier_pooling')!r}"
    if cfg.get("problem_type") not in (None, "regression", "single_label_classification"):
        return f"problem_type {cfg.get('problem_type')}"
    if any(t not in ("full_attention", "sliding_attention") for t in _types(cfg)):
        return "a layer type other than full_attention and sliding_attention"
    for params in (cfg.get("rope_parameters") or {}).values():
        if isinstance(params, dict) and params.get("rope_type", "default") != "default":
            return f"rope_type {params.get('rope_type')!r} (default rotary computed)"
    return ""


def notes(cfg: dict, training: dict) -> list:
    return []


def overlap(cfg: dict, b: int, s: int) -> list:
    return [("the layer's input (the attention norm's or Wqkv's input)", (b, s, cfg["hidden_size"]), F32)]


def _layer_kept(cfg: dict, b: int, s: int, attention: str, index: int, kind: str, first_of_kind: bool) -> list:
    h, heads, inter = cfg["hidden_size"], cfg["num_attention_heads"], cfg["intermediate_size"]
    d = h // heads
    p_attn, p_mlp = float(cfg.get("attention_dropout") or 0), float(cfg.get("mlp_dropout") or 0)
    out = norm("attn_norm", b, s, h) if index else []
    out += [("Wqkv input", (b * s, h), F32)]
    if first_of_kind:
        out += [("rotary cos", (1, s, d), F32), ("rotary sin", (1, s, d), F32)]
    if attention == "eager":
        out += [("k rotated (matmul)", (b, heads, s, d), F32), ("q rotated (matmul)", (b, heads, s, d), F32),
                ("softmax output", (b, heads, s, s), F32)]
        if p_attn > 0:
            out += [("attention dropout mask", (b, heads, s, s), BOOL), ("attention probabilities after dropout", (b, heads, s, s), F32)]
        out += [("v (copied for the matmul)", (b * heads, s, d), F32), ("Wo input", (b * s, h), F32)]
    else:
        if kind == "sliding_attention" and s >= cfg["local_attention"] // 2:
            out += [("sliding-window mask (float, as SDPA converts it)", (b, 1, s, s), F32)]
        out += [("q rotated (sdpa)", (b, heads, s, d), F32), ("k rotated (sdpa)", (b, heads, s, d), F32),
                ("Wqkv output (v is a view of it)", (b * s * 3 * h,), F32), ("sdpa log-sum-exp", (b, heads, s), F32),
                ("sdpa output (Wo input)", (b, heads, s, d), F32)]
    if p_attn > 0:
        out += [("out_drop mask", (b, s, h), BOOL)]
    out += norm("mlp_norm", b, s, h) + [("Wi input", (b * s, h), F32), ("Wi output (GELU input and gate)", (b * s * 2 * inter,), F32),
                                         ("GELU output (times the gate)", (b, s, inter), F32)]
    if p_mlp > 0:
        out += [("mlp dropout mask", (b, s, inter), BOOL)]
    return out + [("mlp.Wo input", (b * s, inter), F32)]


def _head(cfg: dict, b: int, s: int) -> tuple:
    h, kind = cfg["hidden_size"], _kind(cfg)
    head = norm("final_norm", b, s, h)
    rows = b * s
    if kind == SEQUENCE_CLASSIFICATION:
        rows = b
        if cfg.get("classifier_pooling") == "mean":
            head += [("mean pooling: the mask", (b, s, 1), BOOL), ("mean pooling: the token counts", (b, 1), I64),
                     ("head.dense input", (b, h), F32)]
        else:
            head += [("head.dense input (the final norm's output, viewed at [CLS])", (b, s, h), F32)]
    else:
        head += [("head.dense input", (rows, h), F32)]
    shape = (b, s, h) if rows == b * s else (b, h)
    stat = shape[:-1] + (1,)
    head += [("head GELU input", shape, F32), ("head.norm: input", shape, F32), ("head.norm: mean", stat, F32), ("head.norm: rstd", stat, F32)]
    if kind == MASKED_LM:
        return head + [("decoder input", (rows, h), F32)], cross_entropy(rows, cfg["vocab_size"])
    if float(cfg.get("classifier_dropout") or 0) > 0:
        head += [("classifier dropout mask", shape, BOOL)]
    head += [("classifier input", (rows, h), F32)]
    labels, problem = _labels(cfg), cfg.get("problem_type")
    if kind == SEQUENCE_CLASSIFICATION and (problem == "regression" or (problem is None and labels == 1)):
        return head, [("MSE input (the logits)", (b,), F32), ("MSE target (the labels)", (b,), F32)]
    return head, cross_entropy(rows, labels)


def step(cfg: dict, b: int, s: int, attention: str, recomputed: bool = False) -> tuple:
    h = cfg["hidden_size"]
    embeddings = [("tok_embeddings indices", (b, s), I64)] + norm("embeddings.norm", b, s, h)
    if float(cfg.get("embedding_dropout") or 0) > 0:
        embeddings.append(("embedding dropout mask", (b, s, h), BOOL))
    seen: set = set()
    layers = []
    for i, kind in enumerate(_types(cfg)):
        layers.append(_layer_kept(cfg, b, s, attention, i, kind, recomputed or kind not in seen))
        seen.add(kind)
    boundaries = [[("checkpoint: the layer's input", (b, s, h), F32)] for _ in layers]
    head, loss = _head(cfg, b, s)
    return embeddings, layers, boundaries, head, loss


def derive(cfg: dict, raw: dict, out, where, file, data: dict, at_architecture) -> list:
    """models/hf.derive's tail for ModernBERT (models/encoders.derive with this module)."""
    import sys

    from memfit.models import encoders

    return encoders.derive(sys.modules[__name__], cfg, raw, out, where, file, data, at_architecture)

"""Encoder-decoder transformers (T5): parameters and what autograd saves, stack by stack.

These models have more than one stack of layers: an encoder over `training.seq_len` source tokens, then a decoder
over `training.target_len` target tokens (default: seq_len) whose every layer attends to the encoder's output. The
rest of memfit sees them as the decoder-only families with more layer blocks: `blocks()` and `saved()` give
"embeddings", "encoder layer" (x num_layers), "decoder layer" (x num_decoder_layers), "head", "loss", and the
ledger walks the layers of both stacks in forward order (`stacks()`, `layer_index()`).

Read off transformers 5.24's models/t5/modeling_t5.py (T5ForConditionalGeneration, T5Stack, T5Block,
T5LayerNorm, T5Attention, T5DenseActDense / T5DenseGatedActDense) and checked against a real CPU step
(tests/test_t5_family.py, tests/test_transformers_activations.py).

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

from memfit.models.families import FAMILIES

# ---------------------------------------------------------------------------------------------- parameters


def is_stacked(cfg: dict) -> bool:
    fam = FAMILIES.get(cfg.get("model_type"))
    return fam is not None and fam.stacked


def dims(cfg: dict) -> dict:
    return {"h": cfg["d_model"], "H": cfg["num_heads"], "d": cfg["d_kv"], "i": cfg["d_ff"], "V": cfg["vocab_size"],
            "Ne": cfg["num_layers"], "Nd": cfg["num_decoder_layers"], "buckets": cfg["relative_attention_num_buckets"]}


def _attention_modules(prefix: str, h: int, inner: int) -> list:
    from memfit.models.hf import Module

    return [Module(f"{prefix}.q", "linear", (h, inner, False)), Module(f"{prefix}.k", "linear", (h, inner, False)),
            Module(f"{prefix}.v", "linear", (h, inner, False)), Module(f"{prefix}.o", "linear", (inner, h, False))]


def _layer(cfg: dict, decoder: bool, first: bool) -> list:
    """One T5Block's modules, names relative to the block (`first`: layer 0, which owns the relative bias)."""
    from memfit.models.hf import Module

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
    from memfit.models.hf import Module

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


def parameters(cfg: dict) -> list:
    from memfit.models.hf import _params

    return [p for _, modules in _segments(cfg) for m in modules for p in _params(m, m.path) if p.name not in TIED]


def linear_modules(cfg: dict) -> list:
    return [(m.path, *m.dims) for _, modules in _segments(cfg) for m in modules if m.type == "linear"]


def blocks(cfg: dict) -> list:
    """(block, count, one copy's params): the relative-bias tables and the encoder's final norm count with the
    embeddings (what they keep lives as long as the embeddings' tensors), a layer block's params are layer 1's
    (relative names), the decoder's final norm with the head."""
    from memfit.models.hf import Param, _params

    layer_blocks = {name: (prefix, count) for name, prefix, count in stacks(cfg)}
    out = {"embeddings": []}
    for name, modules in _segments(cfg):
        params = [p for m in modules for p in _params(m, m.path) if p.name not in TIED]
        if name in layer_blocks:
            prefix, count = layer_blocks[name]
            first = params[0].name.startswith(prefix + "0.")
            for p in params:
                if p.name.endswith("relative_attention_bias.weight"):
                    out["embeddings"].append(p)
                elif first:
                    local = p.name[len(prefix) + 2:]
                    out.setdefault(name, []).append(Param(local, p.shape, p.kind))
        else:
            out.setdefault(name, []).extend(params)
    order = ["embeddings"] + [name for name, _, _ in stacks(cfg)] + ["head"]
    counts = {name: count for name, _, count in stacks(cfg)}
    return [(name, counts.get(name, 1), out.get(name, [])) for name in order]


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


def parameter_count(cfg: dict) -> int:
    import math

    return sum(math.prod(p.shape) for p in parameters(cfg))


def summary(cfg: dict) -> str:
    from memfit.models.hf import architecture

    n = dims(cfg)
    ff = cfg["feed_forward_proj"]
    return (f"{architecture(cfg)}: {parameter_count(cfg):,} parameters; {n['Ne']} encoder + {n['Nd']} decoder layers, "
            f"hidden {n['h']}, {n['H']} heads of {n['d']}, feed-forward {n['i']} ({ff}), embeddings tied to the head")


# ------------------------------------------------------------------------------------------ activations

NAMES = {"q": "SelfAttention.q", "k": "SelfAttention.k", "v": "SelfAttention.v", "o": "SelfAttention.o",
         "cq": "EncDecAttention.q", "ck": "EncDecAttention.k", "cv": "EncDecAttention.v", "co": "EncDecAttention.o",
         "fc_in": "DenseReluDense.wi", "gate": "DenseReluDense.wi_0", "up": "DenseReluDense.wi_1",
         "fc_out": "DenseReluDense.wo", "lm_head": "lm_head"}
ROLES = {"cq": "q", "ck": "k", "cv": "v", "co": "o"}  # a cross-attention projection's role (hf_activations.ROLE)


def _t5_norm(n: str, x: tuple, f: str) -> list:
    """T5LayerNorm: x.to(fp32).pow(2) keeps the fp32 upcast, x * rsqrt(var) keeps x (its own dtype) and 1/rms,
    weight * (that, cast to a 16-bit weight's dtype) keeps the normalized tensor."""
    from memfit.models.hf_activations import K

    up = K(n, "input, upcast to fp32 (in fp32 the input itself)", x, "f32", needs=(f,))
    return [up,
            K(n, "input (x * rsqrt(...); in fp32 the upcast's storage)", x, "act", needs=(f,), source=up.label),
            K(n, "1/rms", x[:-1] + (1,), "f32", needs=(f,)),
            K(n, "normalized, in the weight dtype (weight * it)", x, "act", needs=("W:norm",))]


def _core(sk: str, g: dict, fused: str, op: str = "") -> list:
    """Attention core over keys of length `sk`; `g` names the gradient flags (q, k, qk, v, attn); `fused` is the
    condition under which SDPA's fused kernel runs (else the eager / math rows)."""
    from memfit.models.hf_activations import K

    math_path = f"not_{fused}&not_math_upcast"
    probs = ("b", "H", "s", sk)
    rows = [
        # SDPA's math path on 16-bit inputs (measured, torch 2.13 on CPU): q, k, probabilities, v upcast to fp32
        K("q @ k^T", "q (fp32, SDPA's math path on 16-bit inputs)", ("b", "H", "s", "d"), "f32", f"not_{fused}&math_upcast", (g["k"],)),
        K("q @ k^T", "k (fp32)", ("b", "H", sk, "d"), "f32", f"not_{fused}&math_upcast", (g["q"],)),
        K("softmax", "probabilities (fp32)", probs, "f32", f"not_{fused}&math_upcast", (g["qk"],)),
        K("p @ v", "v (fp32)", ("b", "H", sk, "d"), "f32", f"not_{fused}&math_upcast", (g["qk"],)),
        K("q @ k^T", "q (a copy: matmul folds the heads)", ("b", "H", "s", "d"), "lin", math_path, (g["k"],)),
        K("q @ k^T", "k (a copy)", ("b", "H", sk, "d"), "lin", math_path, (g["q"],)),
        K("softmax", "probabilities", probs, "soft", math_path, (g["qk"],)),
        K("attention dropout", "mask", probs, "bool", f"{math_path}&attn_drop", (g["qk"],)),
        K("p @ v", "dropped-out probabilities", probs, "low", f"{math_path}&attn_drop", (g["v"],)),
        K("p @ v", "probabilities, cast to the value dtype", probs, "low", f"{math_path}&no_attn_drop", (g["v"],),
          "softmax: probabilities"),
        K("p @ v", "v (a copy)", ("b", "H", sk, "d"), "lin", math_path, (g["qk"],)),
        K("attention", "q", ("b", "H", "s", "d"), "lin", fused, (g["attn"],)),
        K("attention", "k", ("b", "H", sk, "d"), "lin", fused, (g["attn"],)),
        K("attention", "v", ("b", "H", sk, "d"), "lin", fused, (g["attn"],)),
        K("attention", "output", ("b", "s", "H", "d"), "lin", fused, (g["attn"],)),
        K("attention", "log-sum-exp (fp32)", ("b", "H", "s"), "f32", fused, (g["attn"],)),
    ]
    if fused == "dec_fused":  # each decoder layer's float mask (where(causal, bias, min); the cross-attention's zeros)
        rows.append(K("attention", "float mask (the position bias)", (1, "H", "s", sk), "low", fused, (g["attn"],)))
    return [r._replace(op=op + r.op) for r in rows]


def _attention(keys: tuple, x_flag: str, kv_input: tuple, kv_flag: str, sk: str, g: dict, fused: str) -> list:
    from memfit.models.hf_activations import _linear

    q, k, v, o = (NAMES[key] for key in keys)
    role = lambda key: ROLES.get(key, key)  # noqa: E731
    T = ("T", "h")
    if kv_input == T:
        rows = _linear([(role(keys[0]), q, "q"), (role(keys[1]), k, "q"), (role(keys[2]), v, "q")], T, x_flag)
    else:
        rows = _linear([(role(keys[0]), q, "q")], T, x_flag) + _linear([(role(keys[1]), k, "q"), (role(keys[2]), v, "q")], kv_input, kv_flag)
    rows += _core(sk, g, fused, "cross-attention " if keys[0] == "cq" else "")
    out = [(role(keys[3]), o, "h")]
    rows += [r._replace(when=_join(f"not_{fused}", r.when)) for r in _linear(out, ("T", "q"), g["attn"], low_input=True)]
    rows += [r._replace(when=_join(fused, r.when)) for r in _linear(out, ("T", "q"), g["attn"], low_input=True, source="attention: output")]
    if keys[0] == "cq":
        rows = [r._replace(source="cross-attention " + r.source) if r.source and r.source.startswith(("attention:", "softmax:")) else r for r in rows]
    return rows


def _join(a: str, b: str | None) -> str:
    return a if not b else f"{a}&{b}"


def _feed_forward(cfg: dict, f: str, g: dict) -> list:
    from memfit.models.hf_activations import K, _activation, _linear

    T, I = ("T", "h"), ("b", "s", "i")
    act = cfg["dense_act_fn"]
    if cfg["is_gated_act"]:
        rows = _linear([("gate", NAMES["gate"], "i"), ("up", NAMES["up"], "i")], T, f) + _activation(act, "act_fn(wi_0)", I, g["g"])
        rows += [K("act * wi_1", "act_fn(wi_0)", I, "lin", None, (g["u"],)), K("act * wi_1", "wi_1 output", I, "lin", None, (g["g"],))]
        inner = g["p"]
    else:
        rows = _linear([("fc_in", NAMES["fc_in"], "i")], T, f) + _activation(act, "act", I, g["g"])
        inner = g["g"]
        if act == "relu":  # relu keeps its result (wo's input too, without dropout: one storage)
            relu = K("act", "relu output", I, "lin", None, (g["g"],))
            rows.append(relu)
            rows.append(K("feed-forward dropout", "mask", I, "bool", "drop", (inner,)))
            down = ("fc_out", NAMES["fc_out"], "h")
            return (rows + [r._replace(when=_join("drop", r.when)) for r in _linear([down], ("T", "i"), inner, low_input=True)]
                    + [r._replace(when=_join("no_attn_drop", r.when)) for r in _linear([down], ("T", "i"), inner, low_input=True, source=relu.label)])
    rows.append(K("feed-forward dropout", "mask", I, "bool", "drop", (inner,)))
    down = ("down", NAMES["fc_out"], "h") if cfg["is_gated_act"] else ("fc_out", NAMES["fc_out"], "h")
    return rows + _linear([down], ("T", "i"), inner, low_input=True)


def _encoder_output_label() -> str:
    """The label of the cross-attention k / v projections' shared input (the encoder's output)."""
    from memfit.models.hf_activations import _linear

    return _linear([("k", NAMES["ck"], "q"), ("v", NAMES["cv"], "q")], ("Te", "h"), "enc")[0].label


def layer_rows(cfg: dict, decoder: bool) -> list:
    """One T5Block's rows (symbolic; the encoder's evaluate with s = the source length)."""
    from memfit.models.hf_activations import K

    X = ("b", "s", "h")
    g = {"q": "q", "k": "k", "qk": "qk", "v": "v", "attn": "attn"}
    rows = _t5_norm("layer_norm (self-attention)", X, "x")
    rows += _attention(("q", "k", "v", "o"), "n1", ("T", "h"), "n1", "s", g, "enc_fused" if not decoder else "dec_fused")
    rows.append(K("self-attention output dropout", "mask", X, "bool", "drop", ("o",)))
    if decoder:
        c = {"q": "cq", "k": "ck", "qk": "cqk", "v": "cv", "attn": "cattn"}
        rows += _t5_norm("layer_norm (cross-attention)", X, "h1")
        # the k / v projections' input is the encoder's output: one storage, kept with the embeddings (saved())
        rows += _attention(("cq", "ck", "cv", "co"), "n2", ("Te", "h"), "enc", "se", c, "dec_fused")
        rows.append(K("cross-attention output dropout", "mask", X, "bool", "drop", ("co",)))
    rows += _t5_norm("layer_norm (feed-forward)", X, "h")
    rows += _feed_forward(cfg, "nf", {"g": "g", "u": "u", "p": "p"})
    rows.append(K("feed-forward output dropout", "mask", X, "bool", "drop", ("d",)))
    return rows


def _flags(w: dict, x: bool, enc: bool, decoder: bool) -> dict:
    """Which tensors of one block need a gradient, given its input's flag and the encoder output's."""

    def t(key):
        m = NAMES[key]
        return w.get(f"W:{m}", False) or w.get(f"L:{m}", False)

    bias = w["W:embed"]
    g = {"x": x, "enc": enc}
    g["n1"] = x or w["W:norm"]
    g["q"], g["k"], g["v"] = g["n1"] or t("q"), g["n1"] or t("k"), g["n1"] or t("v")
    g["qk"] = g["q"] or g["k"] or bias
    g["attn"] = g["qk"] or g["v"]
    g["o"] = g["attn"] or t("o")
    h = x or g["o"]
    g["h1"] = h
    if decoder:
        g["n2"] = h or w["W:norm"]
        g["cq"], g["ck"], g["cv"] = g["n2"] or t("cq"), enc or t("ck"), enc or t("cv")
        g["cqk"] = g["cq"] or g["ck"]
        g["cattn"] = g["cqk"] or g["cv"]
        g["co"] = g["cattn"] or t("co")
        h = h or g["co"]
    g["h"] = h
    g["nf"] = h or w["W:norm"]
    g["g"] = g["nf"] or t("gate") or t("fc_in")
    g["u"] = g["nf"] or t("up")
    g["p"] = g["g"] or g["u"]
    g["d"] = g["p"] or t("fc_out")
    g["out"] = h or g["d"]
    return g


def _sizes(cfg: dict, micro_batch: int, seq_len: int, target_len: int | None, rank: int = 0) -> dict:
    n = dims(cfg)
    s = target_len or seq_len
    q = n["H"] * n["d"]
    return {"b": micro_batch, "s": s, "h": n["h"], "i": n["i"], "i2": 2 * n["i"], "H": n["H"], "KV": n["H"],
            "d": n["d"], "dk": n["d"], "r": 0, "q": q, "kv": q, "qkv": 3 * q, "rot": 0, "V": n["V"],
            "T": micro_batch * s, "Tl": micro_batch * s, "E": 0, "k": 0, "S": 0, "R": rank, "R2": 2 * rank,
            "se": seq_len, "Te": micro_batch * seq_len}


def _embedding_rows(cfg: dict) -> list:
    from memfit.models.hf_activations import K

    return [
        K("encoder embed_tokens", "input ids", ("b", "se"), "i64", None, ("W:embed",)),
        K("encoder embedding dropout", "mask", ("b", "se", "h"), "bool", "drop", ("W:embed",)),
        K("encoder relative bias", "bucket indices", ("se", "se"), "i64", None, ("W:embed",)),
        K("encoder attention", "relative bias as SDPA's float mask (every layer's)", (1, "H", "se", "se"), "low",
          "enc_fused", ("attn_e",)),
        *_t5_norm("encoder.final_layer_norm", ("b", "se", "h"), "xe"),
        K("encoder final dropout", "mask", ("b", "se", "h"), "bool", "drop", ("xe",)),
        K("decoder embed_tokens", "input ids (the labels shifted right)", ("b", "s"), "i64", None, ("W:embed",)),
        K("decoder embedding dropout", "mask", ("b", "s", "h"), "bool", "drop", ("W:embed",)),
        K("decoder relative bias", "bucket indices", ("s", "s"), "i64", None, ("W:embed",)),
        K("decoder attention", "causal mask (where(causal, bias, min))", (1, 1, "s", "s"), "bool", "dec_sdpa",
          ("W:embed",)),
        K("decoder cross-attention", "mask (where(mask, bias, min))", (1, 1, "s", "se"), "bool", "dec_math_sdpa"),
    ]


def _head_rows(cfg: dict) -> list:
    from memfit.models.hf_activations import K, _linear

    X = ("b", "s", "h")
    rows = _t5_norm("decoder.final_layer_norm", X, "x")
    rows.append(K("decoder final dropout", "mask", X, "bool", "drop", ("x",)))
    return rows + _linear([("lm_head", "lm_head", "V")], ("T", "h"), "fn")


LOSS_ROWS_NAMES = ("log-softmax of the logits", "targets (the labels)", "total weight")


def _conditions(cfg, attention, checkpointing, micro_batch, precision, lora, bias_trains: bool = True):
    """hf_activations' conditions plus T5's. Measured (torch 2.13, CPU): SDPA runs the decoder's attentions in its
    math path when the relative bias trains (full fine-tuning), in the fused kernel when it is frozen (LoRA)."""
    from memfit.models import hf_activations as ha

    cond = ha._conditions(cfg, ha.FAMILIES["t5"], attention, checkpointing, micro_batch, precision, lora)
    drop = (cfg.get("dropout_rate") or 0) > 0
    low = precision not in (None, "32-true")
    fused = attention != "eager"
    dec_fused = fused and not bias_trains
    cond.update({"drop": drop, "attn_drop": drop and checkpointing != "selective", "no_attn_drop": not drop,
                 "enc_fused": fused, "not_enc_fused": not fused, "dec_fused": dec_fused, "not_dec_fused": not dec_fused,
                 "dec_sdpa": fused, "dec_math_sdpa": fused and not dec_fused, "causal": False, "mlm": True,
                 "math_upcast": fused and not dec_fused and low, "not_math_upcast": not (fused and not dec_fused and low)})
    return cond


def _evaluate(cfg, micro_batch, seq_len, target_len, attention, checkpointing, precision, dtypes, lora, shape=None):
    from memfit.models import hf_activations as ha

    if attention == "flash":
        attention = "sdpa"  # T5 does not support flash-attn (_supports_flash_attn = False): SDPA runs
    shape = shape or ha._shape
    fam = ha.FAMILIES["t5"]
    sizes = _sizes(cfg, micro_batch, seq_len, target_len, int((lora or {}).get("r") or 0))
    enc_sizes = {**sizes, "s": sizes["se"], "T": sizes["Te"]}
    w = ha._trainable(fam, lora)
    cond = _conditions(cfg, attention, checkpointing, micro_batch, precision, lora, bias_trains=w["W:embed"])
    roles = ha._dtypes(precision, dtypes)
    n = dims(cfg)
    enc_rows, dec_rows = layer_rows(cfg, False), layer_rows(cfg, True)
    # the encoder's first layer input needs a gradient when the embedding trains; later ones once any weight below does
    e0 = _flags(w, w["W:embed"], False, False)
    e1 = _flags(w, e0["out"], False, False)
    enc_out = (e1["out"] if n["Ne"] > 1 else e0["out"]) if n["Ne"] else w["W:embed"]
    enc = enc_out or w["W:norm"]
    d0 = _flags(w, w["W:embed"], enc, True)
    d1 = _flags(w, d0["out"], enc, True)
    dec_out = (d1["out"] if n["Nd"] > 1 else d0["out"]) if n["Nd"] else w["W:embed"]
    enc0 = ha._resolve(enc_rows, cond, roles, enc_sizes, {**w, **e0}, shape)
    enc1 = ha._resolve(enc_rows, cond, roles, enc_sizes, {**w, **e1}, shape)
    dec0 = ha._resolve(dec_rows, cond, roles, sizes, {**w, **d0}, shape)
    dec1 = ha._resolve(dec_rows, cond, roles, sizes, {**w, **d1}, shape)
    label = _encoder_output_label()
    encoder_output = [k for k in dec0 + dec1 if k.label == label][:1]
    dec0 = [k for k in dec0 if k.label != label]
    dec1 = [k for k in dec1 if k.label != label]
    top = {**w, "attn_e": e0["attn"] or e1["attn"], "xe": enc_out, "x": dec_out, "fn": True}
    embeddings = ha._resolve(_embedding_rows(cfg), cond, roles, sizes, top, shape) + encoder_output
    head = ha._resolve(_head_rows(cfg), cond, roles, sizes, top, shape)
    loss = ha._resolve([r for r in ha.LOSS_ROWS if r.when == "mlm"], cond, roles, sizes, top, shape)
    return roles, sizes, enc_sizes, embeddings, (enc0, enc1), (dec0, dec1), head, loss


def _stack_blocks(name: str, count: int, first: list, later: list) -> list:
    from memfit.models.hf_activations import Block

    if count == 0:
        return []
    if first == later or count == 1:
        return [Block(name, count, first)]
    return [Block(name, 1, first), Block(name, count - 1, later)]


def saved(cfg: dict, *, micro_batch: int, seq_len: int, target_len: int | None = None, attention: str = "sdpa",
          checkpointing: str = "none", precision: str = "32-true", dtypes: dict | None = None,
          lora: dict | None = None, shape=None) -> list:
    """Blocks in forward order: embeddings (both stacks' inputs, the relative-bias indices, the encoder's final norm
    and output), encoder layer, decoder layer, head, loss. With checkpointing "full" each layer keeps its input."""
    from memfit.models.hf_activations import Block, Kept, _shape

    roles, sizes, enc_sizes, embeddings, enc, dec, head, loss = _evaluate(
        cfg, micro_batch, seq_len, target_len, attention, checkpointing, precision, dtypes, lora, shape)
    n = dims(cfg)
    shape = shape or _shape
    if checkpointing == "full":
        boundary = "checkpoint: the layer's input (kept for the recomputation)"
        middle = [Block("encoder layer", n["Ne"], [Kept(boundary, shape(("b", "s", "h"), enc_sizes), roles["act"])])]
        middle += [Block("decoder layer", n["Nd"], [Kept(boundary, shape(("b", "s", "h"), sizes), roles["act"])])]
        middle = [b for b in middle if b.count]
    else:
        middle = _stack_blocks("encoder layer", n["Ne"], *enc) + _stack_blocks("decoder layer", n["Nd"], *dec)
    return [Block("embeddings", 1, embeddings), *middle, Block("head", 1, head), Block("loss", 1, loss)]


def peak_saved(cfg: dict, *, micro_batch: int, seq_len: int, target_len: int | None = None, attention: str = "sdpa",
               checkpointing: str = "none", precision: str = "32-true", dtypes: dict | None = None,
               lora: dict | None = None, shape=None) -> int:
    """The peak of live saved bytes. Without full checkpointing: everything saved (the end of the forward). With it,
    the largest of three moments: the end of the forward (every boundary, the embeddings' tensors, head and loss); a
    decoder layer's recomputation (every boundary and the embeddings' tensors beside it); an encoder layer's
    recomputation, once the decoder's backward has released its boundaries, the encoder's output and final norm
    and the decoder's inputs (the encoder's boundaries and inputs beside it). A layer's input is its boundary."""
    from memfit.models.hf_activations import nbytes, total

    common = dict(micro_batch=micro_batch, seq_len=seq_len, target_len=target_len, attention=attention,
                  precision=precision, dtypes=dtypes, lora=lora, shape=shape)
    blocks = saved(cfg, checkpointing=checkpointing, **common)
    if checkpointing != "full":
        return total(blocks)
    *_, embeddings, enc, dec, head, loss = _evaluate(cfg, micro_batch, seq_len, target_len, attention, "full",
                                                      precision, dtypes, lora, shape)
    boundaries = {b.name: (b.count, b.kept[0]) for b in blocks if b.name.endswith(" layer")}

    def recomputed(name, layers) -> tuple[int, int]:
        """(bytes of one layer's recomputation beyond its boundary, bytes of the stack's boundaries)"""
        if name not in boundaries:
            return 0, 0
        count, boundary = boundaries[name]
        each = nbytes(layers)
        if layers and layers[0].dtype == boundary.dtype and layers[0].shape == boundary.shape:
            each -= nbytes([boundary])
        return each, count * nbytes([boundary])

    enc_each, enc_bounds = recomputed("encoder layer", enc[1])
    dec_each, dec_bounds = recomputed("decoder layer", dec[1])
    emb = nbytes(embeddings)
    encoder_inputs = nbytes([k for k in embeddings if k.label.startswith(ENCODER_INPUTS)])
    return max(emb + enc_bounds + dec_bounds + nbytes(head) + nbytes(loss),
               emb + enc_bounds + dec_bounds + dec_each,
               encoder_inputs + enc_bounds + enc_each)


# what the embeddings block keeps for the encoder's layers (the rest goes once the decoder's backward is done)
ENCODER_INPUTS = ("encoder embed_tokens", "encoder embedding dropout", "encoder relative bias", "encoder attention")

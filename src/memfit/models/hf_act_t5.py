"""Encoder-decoder families (T5): the rows autograd keeps per stack, their conditions and score kernels
(models/hf_activations.py; models/hf_encdec.py has the structure)."""

from __future__ import annotations

from memfit.models import held, hf_encdec
from memfit.models.hf_act_ops import _activation, activation_output, K, _linear
from memfit.models.hf_act_families import FAMILIES
from memfit.models.hf_act_eval import layer_conditions, _quantized_base, role_dtypes, trainable_flags
from memfit.recipe.costs import dtype_bytes


# ---------------------------------------------------------------------------------------------------------------
# Encoder-decoder families (T5): what autograd keeps per stack. models/hf_encdec.py has the structure (the stacks,
# their layer counts, the module names); the facts these rows follow are in its docstring and in
# docs/transformers.md#encoder-decoder-families (transformers 5.24's models/t5/modeling_t5.py, measured on CPU).

T5_NAMES = hf_encdec.NAMES
T5_ROLES = {"cq": "q", "ck": "k", "cv": "v", "co": "o"}  # a cross-attention projection's role (hf_activations.ROLE)


def _t5_norm(n: str, x: tuple, f: str) -> list:
    """T5LayerNorm: x.to(fp32).pow(2) keeps the fp32 upcast, x * rsqrt(var) keeps x (its own dtype) and 1/rms,
    weight * (that, cast to a 16-bit weight's dtype) keeps the normalized tensor."""
    up = K(n, "input, upcast to fp32 (in fp32 the input itself)", x, "f32", needs=(f,))
    return [up,
            K(n, "input (x * rsqrt(...); in fp32 the upcast's storage)", x, "act", needs=(f,), source=up.label),
            K(n, "1/rms", x[:-1] + (1,), "f32", needs=(f,)),
            K(n, "normalized, in the weight dtype (weight * it)", x, "act", needs=("W:norm",))]


def _t5_core(sk: str, g: dict, fused: str, op: str = "") -> list:
    """Attention core over keys of length `sk`; `g` names the gradient flags (q, k, qk, v, attn); `fused` is the
    condition under which SDPA's fused kernel runs (else the eager / math rows)."""

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
    if fused in ("enc_fused", "dec_fused"):
        # each layer's float mask: the encoder's bias made contiguous (a copy of the permuted lookup), the decoder's
        # where(causal, bias, min); the cross-attention's zeros are one storage for every layer (saved())
        rows.append(K("attention", "float mask (the position bias)", (1, "H", "s", sk), "low", fused, (g["attn"],)))
    else:
        # unless they are made in a dtype SDPA casts under autocast (T5Attention builds them in the query's dtype: fp32
        # from a 4-bit q, t5_quantized_base): then each layer keeps its own low copy
        rows.append(K("attention", "float mask (the zero bias, cast to the low dtype by autocast)", (1, "H", "s", sk),
                      "low", "cross_zeros_cast", (g["attn"],)))
    if fused == "dec_fused":  # where(causal, bias, min) keeps its condition when the bias trains (every layer's)
        rows.append(K("attention", "causal mask (where(causal, bias, min))", (1, 1, "s", "s"), "bool", "dec_sdpa",
                      ("W:embed",)))
    return [r._replace(op=op + r.op) for r in rows]


def _t5_attention(keys: tuple, x_flag: str, kv_input: tuple, kv_flag: str, sk: str, g: dict, fused: str) -> list:

    q, k, v, o = (T5_NAMES[key] for key in keys)
    role = lambda key: T5_ROLES.get(key, key)  # noqa: E731
    T = ("T", "h")
    if kv_input == T:
        rows = _linear([(role(keys[0]), q, "q"), (role(keys[1]), k, "q"), (role(keys[2]), v, "q")], T, x_flag)
    else:
        rows = _linear([(role(keys[0]), q, "q")], T, x_flag) + _linear([(role(keys[1]), k, "q"), (role(keys[2]), v, "q")], kv_input, kv_flag)
    rows += _t5_core(sk, g, fused, "cross-attention " if keys[0] == "cq" else "")
    out = [(role(keys[3]), o, "h")]
    rows += [r._replace(when=_t5_join(f"not_{fused}", r.when)) for r in _linear(out, ("T", "q"), g["attn"], low_input=True)]
    rows += [r._replace(when=_t5_join(fused, r.when)) for r in _linear(out, ("T", "q"), g["attn"], low_input=True, source="attention: output")]
    if keys[0] == "cq":
        rows = [r._replace(source="cross-attention " + r.source) if r.source and r.source.startswith(("attention:", "softmax:")) else r for r in rows]
    return rows


def _t5_join(a: str, b: str | None) -> str:
    return a if not b else f"{a}&{b}"


def _t5_feed_forward(cfg: dict, f: str, g: dict) -> list:

    T, I = ("T", "h"), ("b", "s", "i")
    act = cfg["dense_act_fn"]
    if cfg["is_gated_act"]:
        rows = _linear([("gate", T5_NAMES["gate"], "i"), ("up", T5_NAMES["up"], "i")], T, f) + _activation(act, "act_fn(wi_0)", I, g["g"], "out")
        rows += [K("act * wi_1", "act_fn(wi_0)", I, activation_output(act, "out"), None, (g["u"],)), K("act * wi_1", "wi_1 output", I, "out", None, (g["g"],))]
        inner = g["p"]
    else:
        rows = _linear([("fc_in", T5_NAMES["fc_in"], "i")], T, f) + _activation(act, "act", I, g["g"], "out")
        inner = g["g"]
        if act == "relu":  # relu keeps its result (wo's input too, without dropout: one storage)
            relu = K("fc_out (DenseReluDense.wo)", "relu output (relu keeps it; wo's input without dropout)", I, "out", None, (g["g"],))
            rows.append(relu)
            rows.append(K("feed-forward dropout", "mask", I, "bool", "drop", (inner,)))
            down = ("fc_out", T5_NAMES["fc_out"], "h")
            # T5DenseActDense casts wo's input to wo's weight dtype (fp32 under autocast), which autocast casts back:
            # wo keeps a copy of its own under bf16-mixed, relu's output otherwise (without dropout)
            return (rows + [r._replace(when=_t5_join("wo_copy", r.when)) for r in _linear([down], ("T", "i"), inner, low_input=True, quantizable=False)]
                    + [r._replace(when=_t5_join("wo_shared", r.when))
                       for r in _linear([down], ("T", "i"), inner, low_input=True, source=relu.label, quantizable=False)])
    rows.append(K("feed-forward dropout", "mask", I, "bool", "drop", (inner,)))
    down = ("down", T5_NAMES["fc_out"], "h") if cfg["is_gated_act"] else ("fc_out", T5_NAMES["fc_out"], "h")
    # wo is never 4-bit: transformers leaves T5's _keep_in_fp32_modules unquantized (models/adapter_tables.KEEP_IN_FP32)
    return rows + _linear([down], ("T", "i"), inner, low_input=True, quantizable=False)


def _t5_encoder_output_label() -> str:
    """The label of the cross-attention k / v projections' shared input (the encoder's output)."""

    return _linear([("k", T5_NAMES["ck"], "q"), ("v", T5_NAMES["cv"], "q")], ("Te", "h"), "enc")[0].label


def t5_layer_rows(cfg: dict, decoder: bool) -> list:
    """One T5Block's rows (symbolic; the encoder's evaluate with s = the source length)."""

    X = ("b", "s", "h")
    g = {"q": "q", "k": "k", "qk": "qk", "v": "v", "attn": "attn"}
    rows = _t5_norm("layer_norm (self-attention)", X, "x")
    rows += _t5_attention(("q", "k", "v", "o"), "n1", ("T", "h"), "n1", "s", g, "enc_fused" if not decoder else "dec_fused")
    rows.append(K("self-attention output dropout", "mask", X, "bool", "drop", ("o",)))
    if decoder:
        c = {"q": "cq", "k": "ck", "qk": "cqk", "v": "cv", "attn": "cattn"}
        rows += _t5_norm("layer_norm (cross-attention)", X, "h1")
        # the k / v projections' input is the encoder's output: one storage, kept with the embeddings (saved())
        rows += _t5_attention(("cq", "ck", "cv", "co"), "n2", ("Te", "h"), "enc", "se", c, "cross_fused")
        rows.append(K("cross-attention output dropout", "mask", X, "bool", "drop", ("co",)))
    rows += _t5_norm("layer_norm (feed-forward)", X, "h")
    rows += _t5_feed_forward(cfg, "nf", {"g": "g", "u": "u", "p": "p"})
    rows.append(K("feed-forward output dropout", "mask", X, "bool", "drop", ("d",)))
    return rows


def _t5_flags(w: dict, x: bool, enc: bool, decoder: bool) -> dict:
    """Which tensors of one block need a gradient, given its input's flag and the encoder output's."""

    def t(key):
        m = T5_NAMES[key]
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


def _t5_embedding_rows(cfg: dict) -> list:

    return [
        K("encoder embed_tokens", "input ids", ("b", "se"), "i64", None, ("W:embed",)),
        K("encoder embedding dropout", "mask", ("b", "se", "h"), "bool", "drop", ("W:embed",)),
        K("encoder relative bias", "bucket indices", ("se", "se"), "i64", None, ("W:embed",)),
        *_t5_norm("encoder.final_layer_norm", ("b", "se", "h"), "xe"),
        K("encoder final dropout", "mask", ("b", "se", "h"), "bool", "drop", ("xe",)),
        K("decoder embed_tokens", "input ids (the labels shifted right)", ("b", "s"), "i64", None, ("W:embed",)),
        K("decoder embedding dropout", "mask", ("b", "s", "h"), "bool", "drop", ("W:embed",)),
        K("decoder relative bias", "bucket indices", ("s", "s"), "i64", None, ("W:embed",)),
        K("decoder cross-attention", "zero position bias as SDPA's float mask (every layer's)", (1, "H", "s", "se"),
          "out", "cross_zeros_shared", ("attn_c",)),
    ]


def _t5_head_rows(cfg: dict) -> list:

    X = ("b", "s", "h")
    rows = _t5_norm("decoder.final_layer_norm", X, "x")
    rows.append(K("decoder final dropout", "mask", X, "bool", "drop", ("x",)))
    # (the output head is never 4-bit: transformers' get_keys_to_not_convert skips it)
    return rows + _linear([("lm_head", "lm_head", "V")], ("T", "h"), "fn", quantizable=False)


LOSS_ROWS_T5_NAMES = ("log-softmax of the logits", "targets (the labels)", "total weight")


def _t5_conditions(cfg, attention, checkpointing, micro_batch, precision, lora, bias_trains: bool = True):
    """hf_activations' conditions plus T5's. Measured (torch 2.13, CPU): SDPA takes its fused kernel only when its
    float mask needs no gradient, else its math path (which upcasts 16-bit inputs to fp32). The self-attentions'
    mask is the relative bias: the math path when the bias trains (full fine-tuning), the fused kernel when it is
    frozen (LoRA). The cross-attention's mask is a zero bias, which T5Attention marks as needing a gradient under
    gradient checkpointing: the fused kernel without checkpointing, the math path with it."""

    cond = layer_conditions(cfg, FAMILIES["t5"], attention, checkpointing, micro_batch, precision, lora)
    drop = (cfg.get("dropout_rate") or 0) > 0
    low = precision not in (None, "32-true")
    sdpa = attention != "eager"
    self_fused = sdpa and not bias_trains
    cross_fused = sdpa and checkpointing != "full"
    cond.update({"drop": drop, "attn_drop": drop and checkpointing != "selective", "no_attn_drop": not drop,
                 "enc_fused": self_fused, "not_enc_fused": not self_fused, "dec_fused": self_fused,
                 "not_dec_fused": not self_fused, "cross_fused": cross_fused, "not_cross_fused": not cross_fused,
                 "cross_zeros_shared": cross_fused, "cross_zeros_cast": False,
                 "dec_sdpa": sdpa, "causal": False, "mlm": True,
                 "math_upcast": sdpa and low, "not_math_upcast": not (sdpa and low),
                 "wo_copy": drop or cond["mixed"], "wo_shared": not (drop or cond["mixed"])})
    return cond


def t5_quantized_base(cond: dict, roles: dict, dtypes: dict | None) -> None:
    """A 4-bit base under autocast (hf_act_eval._quantized_base: its linears output the input's dtype, fp32): besides,
    the cross-attention's zero bias, which T5Attention makes in the query's dtype (`torch.zeros(..., dtype=
    query_states.dtype)`, modeling_t5.py T5Attention.forward), is fp32, and SDPA under autocast casts it to the low
    dtype in every layer: each layer keeps its own low copy instead of the one shared storage (measured,
    saved_tensors_hooks, tiny T5 QLoRA on an fp32 base under bf16-mixed: one (1, H, s, se) bf16 mask per decoder
    layer)."""
    _quantized_base(cond, roles, dtypes)
    if cond["cross_fused"] and cond["mixed"] and roles["out"] != roles["low"]:
        cond["cross_zeros_shared"], cond["cross_zeros_cast"] = False, True


def t5_score_kernels(cfg: dict, attention: str, checkpointing: str, precision: str, lora: dict | None) -> tuple:
    """(self-attention materializes its scores, cross-attention does, their dtype): eager always, SDPA on its math
    path (see _t5_conditions), where the softmax's backward holds two (b, H, q, k) gradients at once."""
    if attention == "flash":
        attention = "sdpa"
    w = trainable_flags(FAMILIES["t5"], lora)
    cond = _t5_conditions(cfg, attention, checkpointing, 1, precision, lora, bias_trains=w["W:embed"])
    sdpa = attention != "eager"
    dtype = "float32" if cond["math_upcast"] else role_dtypes(precision, None)["soft" if not sdpa else "lin"]
    return not cond["enc_fused"], not cond["cross_fused"], dtype


def t5_flights(cfg: dict, sizes: dict, roles: dict, attention: str, checkpointing: str, precision: str, lora: dict | None,
               flights: dict, enc_flights: dict) -> tuple:
    """T5's kernels in a layer's backward, added to the parts' gradients in flight (`flights`: the decoder's,
    `enc_flights`: the encoder's, updated in place): (the self-attention materializes its scores, the gradients held
    between the decoder layers' backwards: t5_held_gradients)."""
    b, s, h = sizes["b"], sizes["s"], sizes["h"]
    # where T5's attention materializes its scores (eager; SDPA's math path), its softmax's backward holds the
    # gradients of the probabilities and of the scores, (b, H, q, k) each: the self-attention's in the layer's
    # attention part, the cross-attention's in its o_proj part (which runs from the self-attention's output
    # projection through the cross-attention)
    self_math, cross_math, score_dtype = t5_score_kernels(cfg, attention, checkpointing, precision, lora)
    H, se = sizes["H"], sizes["se"]
    if self_math:
        # measured (MemTracker with a dispatch-mode tracer, T5's encoder at its first layer's softmax backward):
        # beside the two score-sized gradients are the residual stream's, v's and one more (T, h) gradient and
        # the relative bias's gradient (1, H, q, k), accumulating over the stack's layers when the bias trains
        # (the decoder's is held between its layers under full checkpointing: t5_held_gradients); q's and k's come after the softmax's
        bias = trainable_flags(FAMILIES["t5"], lora)["W:embed"]
        # (the encoder's, under full checkpointing with two layers or more, is held from its last layer's backward on:
        # t5_encoder_held_gradients; measured there, at the first encoder layer's softmax backward: that one alone)
        enc_held = checkpointing == "full" and hf_encdec.stacks(cfg)[0][2] > 1
        for flight, q_len, own_bias in ((enc_flights, se, bias and not enc_held), (flights, s, bias and checkpointing != "full")):
            tokens = b * q_len
            at_softmax = (dtype_bytes(tokens * h, roles["act"]) + dtype_bytes(2 * tokens * sizes["kv"], roles["lin"])
                          + 2 * dtype_bytes(b * H * q_len * q_len, score_dtype)
                          + (dtype_bytes(H * q_len * q_len, roles["act"]) if own_bias else 0))
            flight["attention"] = max(flight["attention"], at_softmax)
    if cross_math:
        flights["o_proj"] += 2 * dtype_bytes(b * H * s * se, score_dtype)
    return self_math, t5_held_gradients(cfg, sizes, roles, checkpointing), t5_first_recomputed(cfg, sizes, roles, checkpointing)


def t5_first_recomputed(cfg: dict, sizes: dict, roles: dict, checkpointing: str) -> dict:
    """{part of a stack's first layer: the bytes its recomputation makes that nothing saves, alive from that part on
    until the recomputation ends}, by stack ("encoder", "decoder"): under full checkpointing each stack's first layer
    computes its relative position bias again inside its checkpoint (the embedding's output (q, k, H) in the bias's
    dtype, which the layer's outputs hold for the later layers: not saved by the recomputed ops, alive as the
    recomputed forward's value until it stops), and the decoder's first cross-attention its zero bias (1, H, s, se).
    Measured (MemTracker with a dispatch-mode trace of the live storages, tiny T5 2+2 under bf16-mixed, at its peak in
    the first decoder layer's recomputation): the (s, s, H) fp32 embedding output and the (1, H, s, se) bf16 zeros;
    8 x 96 -> 24: the encoder's (se, se, H) fp32 output alive from the first encoder layer's recomputed self-attention
    through its feed-forward's last cast, freed before that layer's backward."""
    if checkpointing != "full":
        return {"encoder": {}, "decoder": {}}
    s, H, se = sizes["s"], sizes["H"], sizes["se"]
    bias = dtype_bytes(H * s * s, roles["act"])
    return {"encoder": {"attention": dtype_bytes(H * se * se, roles["act"])},
            "decoder": {"attention": bias, "o_proj": dtype_bytes(H * s * se, roles["out"])}}


def t5_mlp_flight(cfg: dict, sizes: dict, roles: dict) -> tuple:
    """(bytes added to the MLP part's backward flight, to its moment after it, hf_act_flights._after_flights) of a T5
    feed-forward. A relu one (T5DenseActDense): relu saves its result (threshold_backward reads it), which the layer's
    parts keep with wo's input (its "fc_out" row: the part down_proj, whose backward runs first), so the walk frees it
    a part too early: alive at relu's backward, gone after it. A gated one (T5DenseGatedActDense): act * wi_1's
    backward holds three (T, i) gradients, wo's input's and the two products, as a gated MLP's does (the family's
    plain MLP counts two). Measured (MemTracker with a dispatch-mode trace, tiny T5 2+2 32-true, full checkpointing,
    4 x 24 -> 96, the peak in the first decoder layer's backward): relu: at threshold_backward, the (4, 96, 112) fp32
    relu output beside its gradient and threshold_backward's output; gated-gelu: at act * wi_1's backward (mul), three
    (4, 96, 112) fp32 gradients."""
    T, i = sizes["T"], sizes["i"]
    if cfg["is_gated_act"]:
        return dtype_bytes(T * i, roles["lin"]), 0
    if cfg["dense_act_fn"] != "relu":
        return 0, 0
    relu = dtype_bytes(T * i, roles["out"])
    return relu, -relu


def t5_recompute_flights(sizes: dict, roles: dict, redone: dict, arrived: int, quantized: bool) -> dict:
    """{part: bytes}: `redone` (hf_act_flights._recompute_flights: each part's recomputed moment, `arrived` in it) for
    a T5 stack's layer. The gradient reaching a T5Block's output is one (T, h) tensor (the walk's own: the residual's
    and the next layer's norm's are summed out of place, their parts freed), and where the feed-forward's output (wo's,
    autocast's low dtype) is narrower than the residual stream, the residual add's backward casts it for wo's backward
    (a (T, h) low copy, alive until wo's backward): that, not a second (T, h) gradient, is what has arrived. The
    feed-forward's recomputation stops at wo's input (torch's non-reentrant checkpoint stops once the last saved tensor
    is recomputed), with T5LayerFF's and T5DenseActDense's / T5DenseGatedActDense's locals alive and unsaved: under
    autocast the layer_norm's output (forwarded_states, the weight's dtype; wi reads autocast's low copy of it) and
    the activation (or product) cast to wo's weight dtype (`hidden_states.to(self.wo.weight.dtype)`, the parameters'
    dtype, which autocast casts back to the low dtype: wo's kept copy), (T, i) each. Measured (MemTracker with a
    dispatch-mode trace of the live storages, tiny T5 2+2, bf16-mixed, full checkpointing, relu and gated-gelu; the peak
    is that cast back in the first decoder layer's recomputation): the (4, 96, 64) bf16 gradient cast, the (4, 96, 64)
    fp32 norm output and the (4, 96, 112) fp32 cast, freed when the recomputation stops; none of them in fp32 or
    bf16-true (the norm's output is wi's input, the cast a no-op)."""
    T, h, i = sizes["T"], sizes["h"], sizes["i"]
    act, low = roles["act"], roles["lin"]
    cast = dtype_bytes(T * h, low) if low != act else 0
    # (a 4-bit base's linears output the input's dtype: the activation is already in wo's weight dtype; its norm's
    # output is what the adapters read: not measured there, left out)
    tail = 0
    if not quantized:
        tail = (dtype_bytes(T * h, act) if low != act else 0) + (dtype_bytes(T * i, act) if roles["out"] != act else 0)
    return {part: flight - arrived + cast + (tail if part == "down_proj" else 0) for part, flight in redone.items()}


def t5_held_gradients(cfg: dict, sizes: dict, roles: dict, checkpointing: str) -> dict:
    """{the part of the decoder's last layer whose backward makes them: [the bytes of each gradient]}: under full
    checkpointing, the gradients the later decoder layers' backward makes for what the first decoder layer and the
    encoder pass them (_t5_checkpoint_inputs), each in its tensor's dtype, accumulated over the later layers and held
    until the first decoder layer's backward has consumed them: the decoder's shared position bias's (1, H, s, s)
    (its self-attention's, the part "attention"), the cross-attention zero bias's .grad (1, H, s, se) and the encoder
    output's (b, se, h) (its cross-attention's, in the part "o_proj"; the encoder's final norm takes the last right
    after the first decoder layer's backward). Measured (MemTracker, tiny T5 2+2 under bf16-mixed, non-reentrant
    checkpointing): 190,464 B more at the first decoder layer's recomputation than at the second's, these three
    (fp32, bf16, fp32)."""
    if checkpointing != "full":
        return {}
    b, s, h, H, se = sizes["b"], sizes["s"], sizes["h"], sizes["H"], sizes["se"]
    # (the shared biases exist with two decoder layers or more: _t5_checkpoint_inputs)
    shared = hf_encdec.stacks(cfg)[1][2] > 1
    return {"o_proj": [dtype_bytes(b * se * h, roles["act"]), *([dtype_bytes(H * s * se, roles["out"])] if shared else [])],
            "attention": [dtype_bytes(H * s * s, roles["act"])] if shared else []}


def t5_encoder_held_gradients(cfg: dict, sizes: dict, roles: dict, checkpointing: str, lora: dict | None) -> dict:
    """{the part of the encoder's last layer whose backward makes it: [its bytes]}: under full checkpointing, the
    gradient the later encoder layers' backward makes for the encoder's shared position bias (the (1, H, se, se)
    permuted embedding output the first encoder layer computes and passes on, _t5_checkpoint_inputs), in the bias's
    dtype, accumulated over those layers and held until the first encoder layer's backward has consumed it: alive
    through that layer's recomputation (t5_held_gradients has the decoder's). Only where the bias trains (the
    relative_attention_bias embedding: not under LoRA) and the encoder has two layers or more. Measured (MemTracker
    with a dispatch-mode trace of the live storages, tiny T5 2+2, full checkpointing, 2 x 64 -> 32): a (1, 4, 64, 64)
    gradient, fp32 under bf16-mixed, bf16 under bf16-true, alive at the peak in the first encoder layer's
    recomputation."""
    if checkpointing != "full" or not trainable_flags(FAMILIES["t5"], lora)["W:embed"] or hf_encdec.stacks(cfg)[0][2] < 2:
        return {}
    return {"attention": [dtype_bytes(sizes["H"] * sizes["s"] * sizes["s"], roles["act"])]}


def t5_cross_math_moments(cfg: dict, sizes: dict, roles: dict, attention: str, checkpointing: str, precision: str,
                          lora: dict | None, quantized: bool) -> list:
    """[(the ops of a decoder layer's kept tensors not made yet, the bytes in flight beyond the kept ones)]: the
    recomputed cross-attention's moment on SDPA's math path (full checkpointing, _t5_conditions), for a 4-bit base
    under autocast, where its projections output the input's dtype (hf_act_eval._quantized_base); [] otherwise (not
    measured). At the math path's last cast (torch's _scaled_dot_product_attention_math returns `output.to(origin)`
    and `attn.to(origin)`) T5LayerCrossAttention / T5Attention.forward hold, unsaved: the layer_norm's output (the
    weight's dtype), the q, k and v LoRA sums (peft's Linear4bit: the input's dtype), the zero position bias
    (`torch.zeros(..., dtype=query_states.dtype)`) and autocast's low casts of it and of q, k and v (SDPA's inputs);
    the math path: its fp32 copies of q and k (what matmul saves is q scaled and k scaled; v's copy is saved), the
    probabilities' low cast, the fp32 output and its low cast. The output projection (and all after it) is not
    made yet. Each tensor priced by the recipe."""
    mixed = precision.endswith("-mixed")
    out, low = held.projection_dtype(roles, quantized, mixed), roles["low"]
    if attention == "eager" or checkpointing != "full" or out == low:
        return []
    w = trainable_flags(FAMILIES["t5"], lora)
    cond = _t5_conditions(cfg, attention, checkpointing, sizes["b"], precision, lora, bias_trains=w["W:embed"])
    if cond["cross_fused"]:
        return []
    b, s, se, H, q, T = sizes["b"], sizes["s"], sizes["se"], sizes["H"], sizes["q"], sizes["T"]
    Te, scores = b * se, b * H * s * se
    upcast = dtype_bytes(T * q + Te * q, "float32") if cond["math_upcast"] else 0
    flight = (dtype_bytes(T * sizes["h"], roles["act"])                                   # the layer_norm's output
              + dtype_bytes(T * q + 2 * Te * q, out) + dtype_bytes(T * q + 2 * Te * q, low)  # q, k, v and their casts
              + dtype_bytes(H * s * se, out) + dtype_bytes(H * s * se, low)                 # the zero bias, its cast
              + upcast + dtype_bytes(scores, low)                                          # the probabilities' cast
              + dtype_bytes(T * q, "float32") + dtype_bytes(T * q, low))                   # the output, its cast
    g = {"q": "cq", "k": "ck", "qk": "cqk", "v": "cv", "attn": "cattn"}
    core = {"cross-attention " + r.op for r in _t5_core("se", g, "cross_fused")}
    rows = t5_layer_rows(cfg, True)
    last = max(n for n, r in enumerate(rows) if r.op in core)
    return [(tuple(dict.fromkeys(r.op for r in rows[last + 1:])), flight)]


def t5_self_math_moments(cfg: dict, sizes: dict, roles: dict, attention: str, checkpointing: str, precision: str,
                         lora: dict | None, quantized: bool, decoder: bool, arrived: int) -> list:
    """[(the ops of a layer's kept tensors not made yet, the bytes in flight beyond the kept ones, less `arrived`,
    which the walk adds)]: a recomputed self-attention's two moments on SDPA's math path (full checkpointing, its
    relative bias training: _t5_conditions), at the float mask's add to the scores and at the math path's last cast;
    [] otherwise (a 4-bit base: not measured). From the code (transformers 5.24's modeling_t5.py,
    integrations/sdpa_attention.py; torch 2.13's _scaled_dot_product_attention_math), alive at both and unsaved:
    T5LayerSelfAttention / T5Attention.forward's layer_norm output (`weight * hidden`, the weight's dtype; where the
    linears read autocast's copies of it a tensor of its own, else their kept input), the q, k and v projections'
    outputs (what the math path saves are its copies); create_position_bias_mask's float mask (the encoder's
    `position_bias.contiguous()`, a copy of the permuted bias; the decoder's `torch.where(causal, bias, min)`) in the
    bias's dtype, and under autocast SDPA's low cast of it; the math path's q, k and v upcast to fp32 (from 16-bit
    inputs) and q scaled (matmul saves its folded copy; k's scaled temporary is gone once copied). At the add: the
    scores and the scores plus the mask, (b, H, s, s) each in the math's dtype, the probabilities and v's copy not
    made yet. At the last cast: the probabilities' cast back to the inputs' dtype (`attn.to(origin)`), the output and
    its cast. Beside them the gradient that reached the layer and, where the feed-forward's output is narrower than
    the residual stream, its low cast (t5_recompute_flights); the first layer's bias (the embedding's output) is
    t5_first_recomputed's. Measured (MemTracker with a dispatch-mode trace of the live storages, tiny T5 2+2, full
    checkpointing, each peak in the first encoder layer's recomputation): 2 x 64 -> 32, bf16-mixed and bf16-true, at
    the output's cast; 8 x 96 -> 24 bf16-mixed, at the add."""
    if attention == "eager" or checkpointing != "full" or quantized:
        return []
    w = trainable_flags(FAMILIES["t5"], lora)
    cond = _t5_conditions(cfg, attention, checkpointing, sizes["b"], precision, lora, bias_trains=w["W:embed"])
    fused = "dec_fused" if decoder else "enc_fused"
    if cond[fused]:
        return []
    b, s, H, q, T, h = sizes["b"], sizes["s"], sizes["H"], sizes["q"], sizes["T"], sizes["h"]
    act, lin, low, up = roles["act"], roles["lin"], roles["low"], cond["math_upcast"]
    math = "float32" if up else lin
    both = ((dtype_bytes(T * h, lin) + dtype_bytes(T * h, act) if lin != act else 0)   # the gradient's cast; the norm's output
            + dtype_bytes(3 * T * q, lin)                                               # q, k, v
            + dtype_bytes(H * s * s, act) + (dtype_bytes(H * s * s, low) if low != act else 0)  # the mask, its cast
            + (dtype_bytes(3 * T * q, "float32") if up else 0)                          # the upcasts
            + dtype_bytes(T * q, math))                                                 # q scaled
    at_add = both + 2 * dtype_bytes(b * H * s * s, math)                                # the scores, plus the mask
    at_cast = both + (dtype_bytes(b * H * s * s, lin) + dtype_bytes(T * q, lin) if up else 0) + dtype_bytes(T * q, math)
    g = {"q": "q", "k": "k", "qk": "qk", "v": "v", "attn": "attn"}
    core = _t5_core("s", g, fused)
    rows = t5_layer_rows(cfg, decoder)
    last = max(n for n, r in enumerate(rows) if r.op in {r.op for r in core})
    after = tuple(dict.fromkeys(r.op for r in rows[last + 1:]))
    after_scores = tuple(dict.fromkeys(r.op for r in core if r.op != "q @ k^T")) + after
    return [(after_scores, at_add - arrived), (after, at_cast - arrived)]


def t5_cache_copies(cfg: dict, sizes: dict, roles: dict, dtypes: dict | None, precision: str, checkpointing: str) -> list:
    """Per layer over both stacks: the bytes of the key/value cache's copies a decoder layer adds that nothing saves,
    held through the loss. T5Stack builds an EncoderDecoderCache of two DynamicCaches in a training step (use_cache
    from the config; GradientCheckpointingLayer drops it under checkpointing) and each decoder layer's self- and
    cross-attention put their k and v in it (DynamicLayer.update: `torch.cat`, a copy in the projection's output
    dtype). Where SDPA reads them in its own dtype the saved ones are these copies (the kept rows); a 4-bit base under
    autocast outputs fp32 (hf_act_eval._quantized_base) and SDPA saves its bf16 casts, so the fp32 copies stay
    referenced by the cache alone. Measured (tiny T5, QLoRA on an fp32 base under bf16-mixed, the model output's
    cache): four fp32 (b, H, s, d) / (b, H, se, d) tensors per decoder layer, live at MemTracker's forward peak."""
    layers = hf_encdec.dims(cfg)
    mixed = precision.endswith("-mixed")
    out = held.projection_dtype(roles, bool((dtypes or {}).get("quantized")), mixed)
    if not (mixed and checkpointing == "none" and cfg.get("use_cache", True) and out != roles["low"]):
        return [0] * (layers["Ne"] + layers["Nd"])
    b, H, d = sizes["b"], sizes["H"], sizes["d"]
    per_decoder = 2 * dtype_bytes(b * H * sizes["s"] * d, out) + 2 * dtype_bytes(b * H * sizes["se"] * d, out)
    return [0] * layers["Ne"] + [per_decoder] * layers["Nd"]


def t5_loss(logits: int, logits32: int, hidden: int, precision: str, cache: int = 0) -> tuple:
    """(forward, backward) bytes in flight at T5's loss: nn.CrossEntropyLoss on the logits as they are (no fp32 copy);
    measured at the loss in forward: the logits, a second logits-sized temporary and the decoder's unscaled output (a
    local of the forward) (under autocast cross_entropy runs in fp32: that temporary is the fp32 copy of the 16-bit
    logits, measured with a dispatch-mode tracer at MemTracker's bf16-mixed forward peak: _to_copy (T, V) float32),
    and the cache's copies nothing saves (t5_cache_copies)."""
    second = logits32 if precision.endswith("-mixed") else logits
    return (logits, second, hidden, *([cache] if cache else [])), (logits, logits)

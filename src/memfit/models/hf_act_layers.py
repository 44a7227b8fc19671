"""One layer's rows per family (models/hf_activations.py): attention (Falcon's, DeepSeek's MLA, Llama 4's), the MLP
and the experts (Qwen-MoE, DeepSeek, gpt-oss, Llama 4, PhiMoE's sparsemixer), the layer kinds, the embeddings,
the head, the classifier and the loss rows."""

from __future__ import annotations

from memfit.models import hf_encdec
from memfit.models.hf_act_ops import _activation, activation_output, _and, ActivationRules, K, _linear, _norm, _op, ROLE
from memfit.models.hf_act_families import DEFAULT_ACT, FAMILIES


def _falcon_attention(fam: ActivationRules, n: dict) -> list:
    """FalconAttention.forward (modeling_falcon.py), every path; `layer_conditions` picks the rows that apply.

    query_key_value's output is split by views (every head its own k and v), by `[..., [-2], :]` indexing (multi_query:
    one k/v head; the index ops keep their (1,) int64 index) or by indexing and broadcast_to + flatten (the new
    architecture: k and v copied to every query head). Rotary: q*cos + rotate_half(q)*sin keeps only cos and sin (with
    the embeddings). Eager: q @ k^T keeps q and k at every query head; `scores /= sqrt(d)` (rotary) or `*= 1/sqrt(d)`
    (ALiBi) keeps its Python float as a CPU scalar, no device memory (saved_tensors_hooks never sees it); softmax runs in the hidden states' dtype and keeps its result;
    ALiBi applies attention dropout (mask and dropped copy); p @ v keeps p and v at every head; merging the heads
    copies. SDPA: the causal mask is always materialised (create_causal_mask(allow_is_causal_skip=False)); the fused
    kernel keeps q, k, v, the output, the log-sum-exp and the mask (a bool mask as a (b, 1, s, s) float bias made per
    layer; the ALiBi bias (b, H, s, s) is one tensor for every layer). With multi_query the one k/v head does not match
    the query heads, so torch runs its math kernel: what eager keeps but the scalar."""
    T, B4, KV4 = ("T", "h"), ("b", "H", "s", "d"), ("b", "KV", "s", "d")
    QVIEW = "attention: q (a view of query_key_value's output)"
    rows = _linear([("qkv", n["qkv"], "qkv")], T, "n1")
    rows += [
        K("split heads", "key index [-2] (int64)", (1,), "i64", "fa_index", ("k",)),
        K("split heads", "value index [-1] (int64)", (1,), "i64", "fa_index", ("v",)),
        # q, k and v as the attention keeps them (eager's and the math kernel's batched matmuls, or the fused kernel):
        # a contiguous tensor at every query head; a view of query_key_value's output where no copy is made (a fused
        # kernel takes strided inputs; a batched matmul folds one sequence's heads without a copy); a multi_query k or
        # v at its one head where one sequence broadcasts without a copy
        # (torch's math kernel computes in fp32 from a 16-bit input: ToCopy up, and back after; its rows are fp32)
        *[K("attention", what, shape, role, _and(when, path), ("attn",), source)
          for what, shape, when, source in (
              ("q", B4, "fa_q_copy", None),
              ("q (a view of query_key_value's output)", ("b", "s", "qkv"), "fa_q_view", None),
              ("k (at every query head)", B4, "fa_k_heads", None),
              ("k (its one head)", KV4, "fa_k_own", None),
              ("k (a view of query_key_value's output)", ("b", "s", "qkv"), "fa_k_view", QVIEW),
              ("v (at every query head)", B4, "fa_v_heads", None),
              ("v (its one head)", KV4, "fa_v_own", None),
              ("v (a view of query_key_value's output)", ("b", "s", "qkv"), "fa_v_view", QVIEW))
          for role, path in (("lin", "fa_not_math"), ("f32", "fa_math"))],
        K("softmax", "probabilities (in the hidden states' dtype)", ("b", "H", "s", "s"), "act", "fa_eager", ("qk",)),
        K("softmax", "probabilities (in the hidden states' dtype)", ("b", "H", "s", "s"), "f32", "fa_math", ("qk",)),
        K("attention dropout", "mask", ("b", "H", "s", "s"), "bool", "fa_drop", ("qk",)),
        K("p @ v", "dropped-out probabilities (a low copy under autocast: the dropout's own output is kept by none)",
          ("b", "H", "s", "s"), "low", "fa_drop", ("v",)),
        K("p @ v", "probabilities (a low copy under autocast)", ("b", "H", "s", "s"), "low", "fa_eager&fa_no_drop", ("v",),
          "softmax: probabilities (in the hidden states' dtype)"),
        K("attention", "the causal mask as a float bias (made per layer)", ("b", 1, "s", "s"), "lin", "fa_mask", ("attn",)),
        K("attention", "the ALiBi bias, cast to the low dtype by autocast", ("b", "H", "s", "s"), "low", "fa_alibi_cast",
          ("attn",)),
        K("attention", "the ALiBi bias (shared by every layer; kept by the recomputed one)", ("b", "H", "s", "s"), "act",
          "fa_alibi_recomputed", ("attn",)),
        K("attention", "output", ("b", "s", "H", "d"), "lin", "fa_fused", ("attn",)),
        K("attention", "log-sum-exp (fp32)", ("b", "H", "s"), "f32", "fa_fused", ("attn",)),
        K("attention", "RNG state (flash-attn)", (2,), "i64", "flash", ("attn",)),
    ]
    o = [("o", n["o"], "h")]
    rows += [r._replace(when=_and("fa_bmm", r.when)) for r in _linear(o, ("T", "q"), "attn", low_input=True)]
    rows += [r._replace(when=_and("fa_fused", r.when))
             for r in _linear(o, ("T", "q"), "attn", low_input=True, source="attention: output")]
    # parallel_attn false: residual = dropout_add(attention_output, residual, config.attention_dropout)
    rows.append(K("attention output dropout (attention_dropout)", "mask", ("b", "s", "h"), "bool", "fa_seq_drop", ("o",)))
    return rows


def _falcon_rows(fam: ActivationRules, n: dict, act: str, layout) -> list:
    """FalconDecoderLayer.forward in its three layouts (models/falcon.py)."""
    X = ("b", "s", "h")
    attention, mlp = _falcon_attention(fam, n), _mlp(fam, n, act)
    # FalconLinear adds its bias after the matmul, outside autocast: under *-mixed with bias the activation's input is
    # fp32 (dense_4h_to_h then casts the activation's output to the low dtype, a copy of the same size)
    mlp = [r._replace(when=_and("not_fa_bias_mixed", r.when)) for r in mlp if r.op == "act"] + \
        [r._replace(role="act", when=_and("fa_bias_mixed", r.when)) for r in mlp if r.op == "act"] + \
        [r for r in mlp if r.op != "act"]
    mlp = sorted(mlp, key=lambda r: 0 if r.op.startswith("fc_in") else 1 if r.op == "act" else 2)
    if layout == "shared":
        return _shared_input_rows(fam, n, attention, mlp)
    if layout == "two_norms":   # ln_attn and ln_mlp both read the layer input: its storage is kept once
        second = [r for r in _norm(fam.norm, "ln_mlp", X, "x") if not r.what.startswith("input")]
        return _norm(fam.norm, "ln_attn", X, "x") + attention + second + mlp
    return (_norm(fam.norm, "input_layernorm", X, "x") + attention + _norm(fam.norm, "post_attention_layernorm", X, "h1")
            + mlp)


def _mla_attention(fam: ActivationRules, n: dict) -> list:
    """DeepseekV3Attention.forward (modeling_deepseek_v3.py), multi-head latent attention.

    q: q_b_proj(q_a_layernorm(q_a_proj(x))) (or q_proj(x) when q_lora_rank is null), viewed per head and split into
    its no-rope and rotary parts (views). kv_a_proj_with_mqa(x) gives the kv_lora_rank latent and the shared rotary key
    (slices): kv_a_layernorm upcasts the latent to fp32, which in fp32 is the slice itself, so its pow and mul keep the
    whole kv_a_proj_with_mqa output; from 16 bits a (b, s, kv_lora_rank) fp32 copy. The rotary (interleaved or not)
    keeps only cos and sin (with the embeddings), each (1, s, qk_rope_head_dim). The cache, when built, copies the
    latent and the rotary key (kv_b_proj then keeps the cache's copy of the latent: the same size). query_states is a
    cat (b, H, s, qk_head_dim); expand_kv runs kv_b_proj, splits every head's no-rope key and value (views) and copies
    the key and the broadcast rotary key into a new (b, H, s, qk_head_dim) key. No padding of v: transformers 5.24
    pads nothing (DeepSeek-V2's remote code padded v for flash-attn).
    Eager: q @ k^T keeps q and k, the fp32 softmax its result, p @ v the probabilities and a contiguous copy of v (a
    strided slice; with one sequence matmul folds the heads without a copy and keeps kv_b_proj's whole output). SDPA: torch's CPU flash kernel needs one head dim for q, k and v; where qk_head_dim differs from
    v_head_dim (every published DeepSeek-V2/V3 config: 192 vs 128) it runs the math kernel, which keeps a scaled copy
    of q and of k, its softmax's result and a contiguous v (measured, torch 2.13). Where they are equal the fused
    kernel keeps q, k, v (a view of kv_b_proj's output), its output and log-sum-exp. o_proj reads a contiguous copy of
    the merged heads (b, s, H*v_head_dim) with every kernel: query_states is a contiguous (b, H, s, d) cat, and the
    fused kernel's output follows q's layout, so transpose(1, 2).contiguous() copies it (Llama's q is a transposed
    view, its output already in (b, s, H, d) order: a view there)."""
    T, S4, V4 = ("T", "h"), ("b", "H", "s", "dqk"), ("b", "H", "s", "dv")
    rows = [r._replace(when=_and("mla_qlora", r.when))
            for r in _linear([("qa", n["qa"], "qr"), ("kva", n["kva"], "kva")], T, "n1")]
    rows += [r._replace(when=_and("mla_qplain", r.when))
             for r in _linear([("q", n["q"], "qb"), ("kva", n["kva"], "kva")], T, "n1")]
    rows += [r._replace(when=_and("mla_qlora", r.when)) for r in _norm("rms", "q_a_layernorm", ("b", "s", "qr"), "qa_out", "lin")]
    rows += [r._replace(when=_and("mla_qlora", r.when))
             for r in _linear([("qb", n["qb"], "qb")], ("T", "qr"), "qan", low_input=True)]
    kv_norm = _norm("rms", "kv_a_layernorm", ("b", "s", "kvr"), "kv_out", "lin")
    rows += [K("kv_a_layernorm", "input (a slice of kv_a_proj_with_mqa's output, which it keeps whole)", ("b", "s", "kva"), "f32",
               "lin32", ("kv_out",)),
             kv_norm[0]._replace(when=_and("not_lin32", kv_norm[0].when)), *kv_norm[1:]]
    rows += _linear([("kvb", n["kvb"], "kvb")], ("T", "kvr"), "kvn", low_input=True)
    soft = "probabilities (fp32)"
    rows += [
        # (torch's math kernel on CPU computes a 16-bit input in fp32: its copies of q, k and v and its softmax are fp32)
        *[K("q @ k^T", "q (the cat of its no-rope and rotary parts; the math kernel's scaled copy)", S4, role, when, ("k",))
          for role, when in (("lin", "mla_bmm_own"), ("f32", "mla_math_up"))],
        *[K("q @ k^T", "k (every head's no-rope key beside the shared rotary key; the math kernel's scaled copy)", S4, role,
            when, ("q",)) for role, when in (("lin", "mla_bmm_own"), ("f32", "mla_math_up"))],
        K("softmax", soft, ("b", "H", "s", "s"), "f32", "eager_core", ("qk",)),
        K("softmax (math kernel)", "probabilities", ("b", "H", "s", "s"), "lin", "mla_math&not_mla_math_up", ("qk",)),
        K("softmax (math kernel)", "probabilities (fp32)", ("b", "H", "s", "s"), "f32", "mla_math_up", ("qk",)),
        K("attention dropout", "mask", ("b", "H", "s", "s"), "bool", "eager_attn_dropout", ("qk",)),
        K("p @ v", "dropped-out probabilities", ("b", "H", "s", "s"), "low", "eager_attn_dropout", ("v",)),
        K("p @ v", "probabilities, cast to the value dtype", ("b", "H", "s", "s"), "low", "eager_core_no_dropout", ("v",),
          f"softmax: {soft}"),
        K("p @ v", "v (a contiguous copy of its slice of kv_b_proj's output)", V4, "lin", "mla_v_copy&mla_bmm_own", ("qk",)),
        K("p @ v", "v (the math kernel's fp32 copy)", V4, "f32", "mla_math_up", ("qk",)),
        K("p @ v", "v (a view of kv_b_proj's output: one sequence folds its heads without a copy)", ("b", "s", "kvb"), "lin",
          "mla_v_view&mla_bmm_own", ("qk",)),
        K("attention", "q", S4, "lin", "mla_fused", ("attn",)),
        K("attention", "k", S4, "lin", "mla_fused", ("attn",)),
        K("attention", "v (a view of kv_b_proj's output)", ("b", "s", "kvb"), "lin", "mla_fused", ("attn",)),
        K("attention", "output", V4, "lin", "mla_fused", ("attn",)),
        K("attention", "log-sum-exp (fp32)", ("b", "H", "s"), "f32", "mla_fused", ("attn",)),
    ]
    o = [("o", n["o"], "h")]
    return rows + _linear(o, ("T", "ov"), "attn", low_input=True)


def _deepseek_moe(fam: ActivationRules, n: dict, act: str) -> list:
    """DeepseekV3MoE.forward: the router (DeepseekV3TopkRouter: F.linear of the fp32 input and weight, sigmoid, the
    bias-corrected scores' group-limited top-k, the chosen scores gathered, renormalized with norm_topk_prob, times
    routed_scaling_factor: a Python number, nothing kept), the grouped experts (Mixtral's rows), then the shared
    experts (a gated MLP over every token) added. The group selection (topk over groups, masked_fill, topk) is
    indices and a mask that reach no loss: their graph is freed with the router's forward (never in the peak)."""
    T = ("T", "h")
    shared = _linear([("sgate", n["sgate"], "is"), ("sup", n["sup"], "is")], T, "n2")
    shared += _activation(act, "act_fn(gate) (shared experts)", ("b", "s", "is"), "sh") + [
        K("act * up", "act_fn(gate) (shared experts)", ("b", "s", "is"), "lin", None, ("sh",)),
        K("act * up", "up (shared experts)", ("b", "s", "is"), "lin", None, ("sh",)),
    ] + _linear([("sdown", n["sdown"], "h")], ("T", "is"), "sh", low_input=True)
    router = [
        K("router", "input, as fp32 (hidden_states.type(float32): a copy of a 16-bit input)", T, "f32", "not_mixed",
          ("W:router",), shared[0].label),
        K("router", "input, cast to the low dtype by autocast", T, "low", "mixed", ("W:router",)),
        K("router", "weight, as fp32 (a copy of a 16-bit weight)", ("E", "h"), "f32", "true16", ("n2",)),
        K("router", "weight, cast to the low dtype by autocast", ("E", "h"), "low", "mixed", ("n2",)),
        K("router (LoRA)", "weight + scaling * B @ A (the effective weight)", ("E", "h"), "act", "lora", ("L:router",)),
        K("router sigmoid", "scores (fp32)", ("T", "E"), "f32", "not_mixed", ("r",)),
        K("router sigmoid", "scores", ("T", "E"), "low", "mixed", ("r",)),
        K("scores.gather", "top-k indices", ("T", "k"), "i64", None, ("r",)),
        K("routing weights / sum", "sum (fp32)", ("T", 1), "f32", "topk_norm&not_mixed", ("r",)),
        K("routing weights / sum", "weights (fp32)", ("T", "k"), "f32", "topk_norm&not_mixed", ("r",)),
        K("routing weights / sum", "sum", ("T", 1), "low", "topk_norm&mixed", ("r",)),
        K("routing weights / sum", "weights", ("T", "k"), "low", "topk_norm&mixed", ("r",)),
    ]
    experts = []
    for r in _experts(fam):
        if r.op.startswith(("router", "routing weights")):
            continue
        if r.what.startswith("routing weight column"):   # the router's dtype: fp32, or autocast's low dtype
            experts += [r._replace(when="not_mixed"), r._replace(what="routing weight column", role="low", when="mixed")]
        else:
            experts.append(r)
    return router + experts + shared


def _attention(fam: ActivationRules, n: dict) -> list:
    """Projections, attention (every kernel: `layer_conditions` picks the rows that apply), output projection."""
    if fam.mla:
        return _mla_attention(fam, n)
    T = ("T", "h")
    if fam.qkv == "separate":
        rows = _linear([("q", n["q"], "q"), ("k", n["k"], "kv"), ("v", n["v"], "kv")], T, "n1")
    else:
        rows = _linear([("qkv", n["qkv"], "qkv")], T, "n1")
    if fam.qk_norm_full:
        # OLMo 2: one RMSNorm over q_proj's whole output, one over k_proj's (modeling_olmo2.py)
        rows += _norm(fam.norm, "q_norm", ("b", "s", "q"), "q_raw", "lin")
        rows += _norm(fam.norm, "k_norm", ("b", "s", "kv"), "k_raw", "lin")
    elif fam.qk_norm:
        # per-head RMSNorm on q_proj's and k_proj's outputs (its upcast is those outputs when they are fp32)
        rows += _norm(fam.norm, "q_norm", ("b", "s", "H", "d"), "q_raw", "lin")
        rows += _norm(fam.norm, "k_norm", ("b", "s", "KV", "d"), "k_raw", "lin")
    # rotary: q*cos + rotate_half(q)*sin keeps only cos and sin, shared by every layer (counted with the embeddings)
    soft = "probabilities" + (" (fp32)" if fam.softmax_fp32 else "")
    if fam.sinks:
        soft = "probabilities with the sink column (the scores' dtype)"
    rows += [
        # eager: q @ k^T keeps each side for the other's gradient (k repeated to every query head when grouped)
        K("q @ k^T", "q", ("b", "H", "s", "d"), "lin", "eager_q", ("k",)),
        K("q @ k^T", "q (a view of the fused qkv output: one sequence folds without a copy)", ("b", "s", "qkv"), "lin",
          "eager_q_view", ("k",)),
        K("q @ k^T", "k (repeated to every query head)", ("b", "H", "s", "d"), "lin", "eager_kv", ("q",)),
        # one key/value head and one sequence: repeat_kv's expand + reshape stays a stride-0 view that the batched
        # matmul takes without a copy, so k and v are kept at their one head (autocast's cast of k copies it to every
        # head; v comes out of v_proj in the low dtype already)
        K("q @ k^T", "k (its one head: repeat_kv's expand stays a view)", ("b", "KV", "s", "d"), "lin", "eager_kv_one", ("q",)),
        # Gemma 2's attn_logit_softcapping: tanh(scores / cap) * cap keeps the tanh's result (the divisions and
        # the scale by a Python number keep nothing)
        K("softcap tanh", "tanh(scores / cap)", ("b", "H", "s", "s"), "lin", "eager_core&attn_softcap", ("qk",)),
        *([K("softmax", soft, ("b", "H", "s", "s"), "f32" if fam.softmax_fp32 else fam.softmax_role, "eager_core&sm_scores",
             ("qk",)),
           # (an fp32 additive mask, training.attention_mask_fp32: the scores are fp32, and so are the probabilities)
           K("softmax", soft, ("b", "H", "s", "s"), "f32", "eager_core&sm_mask_f32", ("qk",)),
           # torch < 1.11 (training.softmax_saves_input): softmax kept its input too (derivatives.yaml at v1.10.0,
           # `_softmax`: `self: _softmax_backward_data(grad, result, dim, self)`), the scores in the dtype they have:
           # fp32 where an fp32 additive mask promotes them (training.attention_mask_fp32; GPT-2's causal mask, the
           # "soft" role), else the matmul's (CUDA autocast's fp32_set_opt_dtype hands softmax dtype=float, which
           # 1.10 ran on a half input as `_softmax(input, dim, half_to_float=true)`: the half scores kept)
           K("softmax", "input: the scores (kept by torch < 1.11)", ("b", "H", "s", "s"), "f32", "eager_core&sm_input_f32",
             ("qk",)),
           K("softmax", "input: the scores (kept by torch < 1.11)", ("b", "H", "s", "s"),
             "soft" if fam.softmax_role == "soft" else "lin", "eager_core&sm_input_scores", ("qk",))]
          if not fam.sinks else [
            # gpt-oss: cat([scores, sinks]) keeps nothing; `- max(dim=-1).values` keeps the max's indices; softmax (in
            # the logits' dtype: fp32 under autocast, where the float mask promotes the scores) keeps its result, whose
            # [..., :-1] slice p @ v reads (one storage) unless the cast to v's dtype copies it
            K("combined_logits.max", "indices (int64)", ("b", "H", "s", 1), "i64", "eager_core", ("qk",)),
            K("softmax", soft, ("b", "H", "s", "s1"), "soft", "eager_core", ("qk",))]),
        K("attention dropout", "mask", ("b", "H", "s", "s"), "bool", "eager_attn_dropout", ("qk",)),
        K("p @ v", "dropped-out probabilities", ("b", "H", "s", "s"), "low", "eager_attn_dropout", ("v",)),
        K("p @ v", "probabilities, cast to the value dtype", ("b", "H", "s", "s"), "low", "eager_core_no_dropout",
          ("v",), f"softmax: {soft}"),
        K("p @ v", "v (repeated to every query head)", ("b", "H", "s", "d"), "lin", "eager_v", ("qk",)),
        K("p @ v", "v (its one head: repeat_kv's expand stays a view)", ("b", "KV", "s", "d"), "lin", "eager_v_one", ("qk",)),
        K("p @ v", "v (a view of the fused qkv output: one sequence folds without a copy)", ("b", "s", "qkv"), "lin",
          "eager_v_view", ("qk",)),
        # fused kernels (SDPA's flash / memory-efficient, flash-attn): q, k, v at their own head counts, output, lse;
        # flash-attn pads the head dim to a multiple of 8 (dk; copies then) and keeps its RNG state
        K("attention", "q", ("b", "H", "s", "dk"), "lin", "fused_q", ("attn",)),
        K("attention", "q (a view of the fused qkv output)", ("b", "s", "qkv"), "lin", "fused_q_view", ("attn",)),
        # a sliding layer whose window is shorter than the sequence hands sdpa a mask: transformers then repeats k
        # and v to every query head (use_gqa_in_sdpa is False with a mask) and the kernel keeps the mask as a
        # float bias (integrations/sdpa_attention.py; CPU's flash kernel and CUDA's memory-efficient one alike)
        K("attention", "k (repeated to every query head: the window mask stops grouped-query sdpa)", ("b", "H", "s", "dk"),
          "lin", "window_mask", ("attn",)),
        K("attention", "v (repeated to every query head)", ("b", "H", "s", "dk"), "lin", "window_mask", ("attn",)),
        K("attention", "the sliding-window mask as a float bias", ("b", 1, "s", "s"), "lin", "window_mask", ("attn",)),
        K("attention", "k (the cache's copy)", ("b", "KV", "s", "dk"), "lin", "fused_cache", ("attn",)),
        K("attention", "v (the cache's copy)", ("b", "KV", "s", "dk"), "lin", "fused_cache", ("attn",)),
        K("attention", "k", ("b", "KV", "s", "dk"), "lin", "fused_k_nocache", ("attn",)),
        K("attention", "v", ("b", "KV", "s", "dk"), "lin", "fused_v_nocache", ("attn",)),
        K("attention", "v (a view of the fused qkv output)", ("b", "s", "qkv"), "lin", "fused_v_view", ("attn",)),
        K("attention", "output", ("b", "s", "H", "dk"), "lin", "fused", ("attn",)),
        K("attention", "log-sum-exp (fp32)", ("b", "H", "s"), "f32", "fused", ("attn",)),
        K("attention", "RNG state (flash-attn)", (2,), "i64", "flash", ("attn",)),
    ]
    # o_proj's input: eager merges heads with a copy; SDPA on CPU returns the output in q's layout, so a contiguous
    # q (partial rotary's cat) makes it a copy too; otherwise it is a view of the kept output
    o = [("o", n["o"], "h")]
    rows += [r._replace(when=_and("o_copy", r.when)) for r in _linear(o, ("T", "q"), "attn", low_input=True)]
    rows += [r._replace(when=_and("o_view", r.when))
             for r in _linear(o, ("T", "q"), "attn", low_input=True, source="attention: output")]
    rows.append(K("attention output dropout", "mask", ("b", "s", "h"), "bool", "resid_dropout", ("o",)))
    return rows


def _mlp(fam: ActivationRules, n: dict, act: str) -> list:
    T, X = ("T", "h"), ("b", "s", "h")
    if fam.mlp == "gated":
        eager = _activation(act, "act_fn(gate)", ("b", "s", "i"), "g", "out") + [
            K("act * up", "act_fn(gate)", ("b", "s", "i"), activation_output(act, "out"), None, ("u",)),
            K("act * up", "up", ("b", "s", "i"), "out", None, ("g",))]
        # Liger-Kernel's LigerSiLUMulFunction (training.liger_kernels swiglu; ops/swiglu.py, 0.6.4):
        # `ctx.save_for_backward(a, b)`, gate's and up's outputs, silu recomputed in its backward
        liger = [K("LigerSiLUMulFunction", "gate (gate_proj's output)", ("b", "s", "i"), "out", "swiglu_liger", ("g", "u")),
                 K("LigerSiLUMulFunction", "up (up_proj's output)", ("b", "s", "i"), "out", "swiglu_liger", ("g", "u"))]
        return (_linear([("gate", n["gate"], "i"), ("up", n["up"], "i")], T, "n2")
                + [r._replace(when=_and("swiglu_eager", r.when)) for r in eager] + liger
                + _linear([("down", n["down"], "h")], ("T", "i"), "p", low_input=True))
    if fam.mlp == "gated_fused":
        return _linear([("gate_up", n["gate_up"], "i2")], T, "n2") + [
            K("act_fn(gate), * up", "gate_up output (gate and up are halves of it)", ("b", "s", "i2"), "out", None, ("g",)),
            K("act * up", "act_fn(gate)", ("b", "s", "i"), "out", None, ("g",)),
        ] + _linear([("down", n["down"], "h")], ("T", "i"), "p", low_input=True) + [
            K("mlp output dropout", "mask", X, "bool", "resid_dropout", ("d",))]
    if fam.mlp == "plain":
        return _linear([("fc_in", n["fc_in"], "i")], T, "n2") + _activation(act, "act", ("b", "s", "i"), "g", "out") + \
            _linear([("fc_out", n["fc_out"], "h")], ("T", "i"), "g", low_input=True) + [
                K("mlp output dropout", "mask", X, "bool", "resid_dropout", ("d",))]
    rows = []
    if fam.mlp == "moe_shared":
        # Qwen2-MoE's shared expert over every token, then sigmoid(shared_expert_gate(x)) * its output (its linears'
        # outputs in `out`: fp32 from a 4-bit base under autocast, as the dense MLP's; measured: saved_tensors_hooks
        # and a dispatch-mode trace, QLoRA under bf16-mixed)
        rows = _linear([("sgate", n["sgate"], "is"), ("sup", n["sup"], "is"), ("sg", n["sg"], 1)], T, "n2") + \
            _activation(act, "act_fn(gate) (shared expert)", ("b", "s", "is"), "sh", "out") + [
                K("act * up", "act_fn(gate) (shared expert)", ("b", "s", "is"), activation_output(act, "out"), None, ("sh",)),
                K("act * up", "up (shared expert)", ("b", "s", "is"), "out", None, ("sh",)),
            ] + _linear([("sdown", n["sdown"], "h")], ("T", "is"), "sh", low_input=True) + [
                K("sigmoid", "output (the shared expert's gate)", ("T", 1), "out", None, ("sgw", "sd")),
                K("gate * shared expert", "shared expert output", ("T", "h"), "out", None, ("sgw",)),
            ]
        # the router reads the same normalized input as the shared expert: one storage when no cast copies it
        return rows + [r._replace(source=rows[0].label) if r.label == "router: input" else r for r in _experts(fam)]
    if fam.mlp == "moe_phi":
        # the routing weights are the sparsemixer's multipliers (multiplier * mask_for_one, type_as the softmax's
        # output): the softmax's dtype, fp32 under CUDA autocast
        return _sparsemixer(n) + [r._replace(role="softmax:lin") if r.label == "* routing weight: routing weight column" else r
                                  for r in _experts(fam) if not r.op.startswith(("router", "routing weights"))]
    if fam.mlp == "moe_deepseek":
        return _deepseek_moe(fam, n, act)
    if fam.mlp == "moe_oss":
        return _gpt_oss_experts()
    if fam.mlp == "moe_llama4":
        return _llama4_moe(n, act)
    return _experts(fam)


def _gpt_oss_experts() -> list:
    """GptOssMLP in training (modeling_gpt_oss.py, integrations/moe.py grouped_mm_experts_forward): the router is
    F.linear(x, weight, bias) (keeps x when it trains), top-k over the (T, E) logits (keeps its indices), softmax over
    the k chosen logits (keeps its result, the logits' dtype); then Mixtral's sorted grouped matmuls, plus the gather of
    each routed row's biases (gate_up_proj_bias[ids], down_proj_bias[ids]: one (S,) index, kept while the biases train)
    and the clamped SwiGLU: gate = gate_up[..., ::2].clamp(max=limit) and up = gate_up[..., 1::2].clamp(-limit, limit)
    keep the whole gate_up output (strided views); sigmoid(gate * alpha) keeps its result, gate * it keeps the clamped
    gate, (up + 1) * glu keeps both factors, and the down grouped_mm its product. Every expert tensor is in the
    model's dtype (grouped_mm is not autocast)."""
    T = ("T", "h")
    return [
        K("router", "input", T, "act", "not_mixed", ("W:router",)),
        K("router", "input, cast to the low dtype by autocast", T, "low", "mixed", ("W:router",)),
        K("router", "weight, cast to the low dtype by autocast", ("E", "h"), "low", "mixed", ("n2",)),
        K("router top-k", "indices", ("T", "k"), "i64", None, ("r",)),
        K("router softmax", "weights of the k chosen logits (the logits' dtype)", ("T", "k"), "lin", None, ("r",)),
        K("gather by expert", "token index", ("S",), "i64", None, ("n2",)),
        K("gather weights", "permutation", ("S",), "i64", None, ("r",)),
        K("grouped_mm", "group offsets", ("E",), "i32", None, ("e",)),
        K("expert biases", "sorted expert ids (gathering gate_up_proj_bias and down_proj_bias)", ("S",), "i64", None,
          ("W:experts",)),
        K("grouped_mm gate_up", "routed tokens (one row per chosen expert)", ("S", "h"), "act", None, ("W:experts",)),
        K("act_fn(gate), * up (clamped SwiGLU)", "gate_up output (both clamps keep it: gate and up interleave in it)",
          ("S", "ie2"), "act", None, ("e",)),
        K("act_fn(gate), * up (clamped SwiGLU)", "sigmoid(alpha * gate)", ("S", "ie"), "act", None, ("e",)),
        K("act_fn(gate), * up (clamped SwiGLU)", "clamped gate", ("S", "ie"), "act", None, ("e",)),
        K("act_fn(gate), * up (clamped SwiGLU)", "up + 1", ("S", "ie"), "act", None, ("e",)),
        K("act_fn(gate), * up (clamped SwiGLU)", "glu (gate * sigmoid(alpha * gate))", ("S", "ie"), "act", None, ("e",)),
        K("grouped_mm down", "input ((up + 1) * glu)", ("S", "ie"), "act", None, ("W:experts",)),
        K("* routing weight", "expert output", ("S", "h"), "act", None, ("r",)),
        K("* routing weight", "routing weight column", ("S", 1), "lin", None, ("e",)),
        K("unsort", "inverse permutation", ("S",), "i64", None, ("e",)),
    ]


def _llama4_moe(n: dict, act: str) -> list:
    """Llama4TextMoe.forward in training: the router (an nn.Linear) and the shared expert's gate and up read the
    normalized input (one storage); topk keeps its indices, sigmoid its fp32 result; every token is repeated once per
    expert (S = E·T rows) and multiplied by its score column (a copy of the transposed scores): the product keeps
    both; Llama4TextExperts' two torch.bmm keep their inputs (autocast casts them, and the stacked weights, to the
    low dtype); act_fn(gate) * up keeps both halves (gate and up are views of gate_up's output); the routed outputs
    are summed over the experts and added in place to the shared expert's output (nothing kept)."""
    T = ("T", "h")
    rows = _linear([("router", n["router"], "E"), ("sgate", n["sgate"], "is"), ("sup", n["sup"], "is")], T, "n2")
    rows += [
        K("router top-k", "indices (scatter keeps them too)", ("T", "k"), "i64", None, ("r",)),
        K("router sigmoid", "result (fp32)", ("T", "E"), "f32", None, ("r",)),
        K("* router scores", "score column (the transposed scores, copied)", ("S", 1), "lin", None, ("n2",)),
        K("* router scores", "input repeated once per expert", ("S", "h"), "act", None, ("r",)),
        K("experts bmm gate_up", "scaled routed input", ("S", "h"), "act", "not_mixed", ("W:experts",)),
        K("experts bmm gate_up", "scaled routed input, cast to the low dtype by autocast", ("S", "h"), "low", "mixed",
          ("W:experts",)),
        K("experts bmm gate_up", "gate_up_proj, cast to the low dtype by autocast", ("E", "h", "ie2"), "low", "mixed",
          ("e",)),
        K("act_fn(gate), * up", "gate_up output (gate and up are halves of it)", ("S", "ie2"), "lin", None, ("e",)),
        K("act * up", "act_fn(gate)", ("S", "ie"), "lin", None, ("e",)),
        K("experts bmm down", "input (act_fn(gate) * up)", ("S", "ie"), "lin", None, ("W:experts",)),
        K("experts bmm down", "down_proj, cast to the low dtype by autocast", ("E", "ie", "h"), "low", "mixed", ("e",)),
    ]
    rows += _activation(act, "act_fn(gate) (shared expert)", ("b", "s", "is"), "sh") + [
        K("act * up", "act_fn(gate) (shared expert)", ("b", "s", "is"), "lin", None, ("sh",)),
        K("act * up", "up (shared expert)", ("b", "s", "is"), "lin", None, ("sh",)),
    ] + _linear([("sdown", n["sdown"], "h")], ("T", "is"), "sh", low_input=True)
    return rows


def _llama4_attention(fam: ActivationRules, n: dict, rope: bool, cfg_flags: tuple) -> list:
    """Llama4TextAttention: Llama's projections and kernels; a rope layer's apply_rotary_emb multiplies by freqs_cis
    (complex; it keeps only freqs_cis, shared by every layer), then qk_norm (use_qk_norm) keeps each of q and k upcast
    to fp32 and its 1/rms; a NoPE layer with attn_temperature_tuning multiplies q by attn_scales (fp32, one per
    position), which the product keeps."""
    rows = _attention(fam, n)
    at = next(i for i, r in enumerate(rows) if r.op == "q @ k^T")
    extra = []
    if rope:
        extra += [r._replace(when="qk_norm_on") for r in _norm("l2", "qk_norm (q)", ("b", "s", "H", "d"), "q_raw", "lin")
                  + _norm("l2", "qk_norm (k)", ("b", "s", "KV", "d"), "k_raw", "lin")]
    else:
        extra.append(K("q * attn_scales (NoPE)", "attn_scales (fp32, one per position)", (1, "s", 1, 1), "f32",
                       "temperature_on", ("q_raw",)))
    return rows[:at] + extra + rows[at:]


def _sparsemixer(n: dict) -> list:
    """PhiMoE's router (an nn.Linear) and sparsemixer (top-2, training): per choice a masked_fill (its bool mask),
    a Gumbel-sampled expert (max's indices), a softmax (its output, kept again by PhimoeMultiplier), the gather of
    the chosen probability (PhimoeMultiplier keeps it), the softmax's max (its indices); the second choice scatters
    -inf over the first (the index, already kept)."""
    # input_jitter_noise > 0: the block, then the router, multiply their input in place by a uniform noise tensor,
    # which each multiply keeps for backward
    rows = [K("input jitter (block)", "noise (an in-place multiply keeps it)", ("b", "s", "h"), "act", "input_jitter", ("n2",)),
            K("input jitter (router)", "noise (an in-place multiply keeps it)", ("b", "s", "h"), "act", "input_jitter", ("n2",))]
    rows += _linear([("router", n["router"], "E")], ("T", "h"), "n2")
    for which in ("first", "second"):
        rows += [
            K(f"sparsemixer ({which})", "masked_fill mask", ("T", "E"), "bool", None, ("r",)),
            K(f"sparsemixer ({which})", "chosen expert (Gumbel max's indices)", ("T", 1), "i64", None, ("r",)),
            K(f"sparsemixer ({which})", "softmax of the masked gates", ("T", "E"), "softmax:lin", None, ("r",)),
            K(f"sparsemixer ({which})", "softmax max's indices", ("T", 1), "i64", None, ("r",)),
            K(f"sparsemixer ({which})", "chosen probability (PhimoeMultiplier)", ("T", 1), "softmax:lin", None, ("r",)),
        ]
    return rows


def _experts(fam: ActivationRules) -> list:
    T = ("T", "h")
    # Mixtral: a router, then every routed (token, expert) pair through one grouped matmul (transformers 5.24's
    # `grouped_mm` experts: F.grouped_mm is not autocast, so the experts run in the model's dtype): sorted by expert,
    # gathered, gate_up, act * up, down, times the routing weight, unsorted; each routed token once per expert
    # (`S` rows; a capacity factor pads each expert's rows: `layer_sizes`)
    return [
        K("router", "input", T, "act", "not_mixed", ("W:router",)),
        K("router", "input, cast to the low dtype by autocast", T, "low", "mixed", ("W:router",)),
        K("router", "weight, cast to the low dtype by autocast", ("E", "h"), "low", "mixed", ("n2",)),
        K("router (LoRA)", "weight + scaling * B @ A (the effective weight)", ("E", "h"), "act", "lora", ("L:router",)),
        K("router softmax", "probabilities (fp32)", ("T", "E"), "f32", None, ("r",)),
        K("router top-k", "indices", ("T", "k"), "i64", None, ("r",)),
        K("routing weights / sum", "sum (fp32)", ("T", 1), "f32", "topk_norm", ("r",)),
        K("routing weights / sum", "weights (fp32)", ("T", "k"), "f32", "topk_norm", ("r",)),
        K("gather by expert", "token index", ("S",), "i64", None, ("n2",)),
        K("gather weights", "permutation", ("S",), "i64", None, ("r",)),
        K("grouped_mm", "group offsets", ("E",), "i32", None, ("e",)),
        K("experts (LoRA)", "gate_up_proj + scaling * B @ A (every expert's effective weight)", ("E", "ie2", "h"), "act",
          "lora", ("L:experts",)),
        K("experts (LoRA)", "down_proj + scaling * B @ A", ("E", "h", "ie"), "act", "lora", ("L:experts",)),
        # the fold runs in the weight's dtype: on a 16-bit model it keeps 16-bit copies of the fp32 factors (peft
        # gives the fused gate_up twice the rank)
        K("experts (LoRA)", "gate_up factors B, cast to the weight dtype", ("E", "ie2", "R2"), "act", "lora&true16",
          ("L:experts",)),
        K("experts (LoRA)", "gate_up factors A, cast to the weight dtype", ("E", "R2", "h"), "act", "lora&true16",
          ("L:experts",)),
        K("experts (LoRA)", "down factors B, cast to the weight dtype", ("E", "h", "R"), "act", "lora&true16", ("L:experts",)),
        K("experts (LoRA)", "down factors A, cast to the weight dtype", ("E", "R", "ie"), "act", "lora&true16", ("L:experts",)),
        K("grouped_mm gate_up", "routed tokens (one row per chosen expert)", ("S", "h"), "act", None, ("W:experts",)),
        K("act_fn(gate), * up", "gate_up output", ("S", "ie2"), "act", None, ("e",)),
        K("act * up", "act_fn(gate)", ("S", "ie"), "act", None, ("e",)),
        K("grouped_mm down", "input", ("S", "ie"), "act", None, ("W:experts",)),
        K("* routing weight", "expert output", ("S", "h"), "act", None, ("r",)),
        K("* routing weight", "routing weight column" + (" (fp32)" if fam.routing_dtype == "f32" else ""), ("S", 1),
          fam.routing_dtype, None, ("e",)),
        K("unsort", "inverse permutation", ("S",), "i64", None, ("e",)),
    ]


def layer_kinds(cfg: dict) -> list:
    """Each layer's kind, in order: "moe" or "dense" where a family's layers differ (Qwen2/3-MoE's decoder layer is
    sparse unless it is in mlp_only_layers, (i + 1) % decoder_sparse_step != 0, or there are no experts); "" for
    every layer of the other families."""
    from memfit.models.families import EXPERTS_KEY

    mt = cfg["model_type"]
    n = count_layers(cfg)
    if mt == "deepseek_v3":   # DeepseekV3DecoderLayer: a dense MLP below first_k_dense_replace
        first = cfg.get("first_k_dense_replace") or 0
        return ["dense" if i < first else "moe" for i in range(n)]
    if mt == "llama4_text":
        # "moe" / "dense" by moe_layers, " nope" where no_rope_layers is 0, " chunked" where layer_types says so
        moe, rope, types = set(cfg["moe_layers"]), cfg["no_rope_layers"], cfg["layer_types"]
        return [("moe" if i in moe else "dense") + ("" if rope[i] else " nope")
                + (" chunked" if types[i] == "chunked_attention" else "") for i in range(n)]
    if mt == "mllama":   # MllamaTextModel: cross_attention_layers are MllamaCrossAttentionDecoderLayer
        cross = set(cfg["cross_attention_layers"])
        return ["cross" if i in cross else "" for i in range(n)]
    if mt not in ("qwen2_moe", "qwen3_moe"):
        return [""] * n
    experts, step, dense = cfg[EXPERTS_KEY[mt]], cfg["decoder_sparse_step"], set(cfg.get("mlp_only_layers") or ())
    return ["moe" if i not in dense and experts > 0 and (i + 1) % step == 0 else "dense" for i in range(n)]


class _BlockNames(dict):
    def __missing__(self, kind):   # Llama 4's "moe nope chunked": the block of its MLP kind
        return self[kind.split()[0]]


BLOCK_NAMES = _BlockNames({"": "layer", "moe": "layer", "dense": "dense layer", "cross": "cross-attention layer"})  # a layer kind's block name (models.hf's too)


CROSS_NAMES = {"q": "cross_attn.q_proj", "k": "cross_attn.k_proj", "v": "cross_attn.v_proj", "o": "cross_attn.o_proj"}


def _kind_family(fam: ActivationRules, kind: str) -> ActivationRules:
    if kind == "cross":   # MllamaCrossAttentionDecoderLayer: its projections under cross_attn, q/k normed per head
        return fam._replace(names={**fam.names, **CROSS_NAMES}, qk_norm=True)
    return fam._replace(mlp="gated") if kind.split(" ")[0] == "dense" else fam


def layer_rows(model_type: str, act: str | None = None, parallel: bool = True, kind: str = "") -> list:
    """The symbolic table of one layer (of a kind, where layers differ: layer_kinds): every row any kernel / recipe
    may keep, conditions unevaluated."""
    fam = _kind_family(FAMILIES[model_type], kind)
    n = fam.names
    act = act or DEFAULT_ACT.get(model_type, "silu")
    X = ("b", "s", "h")
    if fam.falcon:
        return _falcon_rows(fam, n, act, parallel)
    if kind == "cross":
        return _cross_rows(fam, n, act)
    attention, mlp = _attention(fam, n), _mlp(fam, n, act)
    if model_type == "llama4_text":
        attention = _llama4_attention(fam, n, "nope" not in kind.split(), ())
    if fam.post_norm:   # BERT: attention, add & norm; MLP, add & norm (whose output is the next layer's input)
        attention = [r._replace(needs=tuple("x" if x == "n1" else x for x in r.needs)) for r in attention]
        mlp = [r._replace(needs=tuple("h1n" if x == "n2" else x for x in r.needs)) for r in mlp]
        return (attention + [r._replace(op="attention.output LayerNorm") for r in _norm(fam.norm, "", X, "h1")]
                + mlp + [r._replace(op="output LayerNorm") for r in _norm(fam.norm, "", X, "out")])
    if fam.sandwich:
        return _sandwich_rows(fam, n, attention, mlp)
    if fam.shared_input:
        return _shared_input_rows(fam, n, attention, mlp)
    second = _norm(fam.norm, _op(ROLE["norm2"], n.get("norm2", "post_attention_layernorm")), X, "x" if parallel and fam.parallel_key else "h1")
    if parallel and fam.parallel_key:   # both norms read the layer input: its storage is kept once
        second = [r for r in second if not r.what.startswith("input")]
    return _norm(fam.norm, _op(ROLE["norm1"], n.get("norm1", "input_layernorm")), X, "x") + attention + second + mlp


def _cross_rows(fam: ActivationRules, n: dict, act: str) -> list:
    """MllamaCrossAttentionDecoderLayer.forward (modeling_mllama.py:688-721) and MllamaTextCrossAttention.forward
    (:428-486). q from the normed text (s tokens), k and v from the projected image tokens (N per sequence: "TN" rows,
    their gradient flag "xv"), an RMSNorm over each head of q and of k (:441, :449), a cross-attention mask always
    given (sdpa then repeats k and v to every query head and keeps the mask as a float bias, as a sliding window's
    mask does: _window_conditions); o_proj's output times tanh(cross_attn_attn_gate) (:711), the MLP's output times
    the full-text-row mask, then tanh(cross_attn_mlp_gate) (:717-718). What every cross-attention layer shares (the
    image tokens k_proj and v_proj read, the cross-attention mask, the row mask) is kept once, with the vision tower
    (hf_act_saved._mllama_kept): the base input rows of k_proj/v_proj here are never kept."""
    T, X, Q4, K4 = ("T", "h"), ("b", "s", "h"), ("b", "H", "s", "d"), ("b", "H", "N", "d")
    rows = _norm(fam.norm, _op(ROLE["norm1"], "input_layernorm"), X, "x") + _linear([("q", n["q"], "q")], T, "n1")
    rows += _norm(fam.norm, "q_norm", ("b", "H", "s", "d"), "q_raw", "lin")
    kv = _linear([("k", n["k"], "kv"), ("v", n["v"], "kv")], ("TN", "h"), "xv")
    rows += [r._replace(needs=("shared",)) if r.what == "input" else r for r in kv]
    rows += _norm(fam.norm, "k_norm", ("b", "KV", "N", "d"), "k_raw", "lin")
    soft = "probabilities (fp32)"
    rows += [
        K("q @ k^T", "q (q_norm's output)", Q4, "lin", "eager_core", ("k",)),
        K("q @ k^T", "k (repeated to every query head)", K4, "lin", "eager_core", ("q",)),
        K("softmax", soft, ("b", "H", "s", "N"), "f32", "eager_core", ("qk",)),
        K("p @ v", "probabilities, cast to the value dtype", ("b", "H", "s", "N"), "low", "eager_core", ("v",), f"softmax: {soft}"),
        K("p @ v", "v (repeated to every query head)", K4, "lin", "eager_core", ("qk",)),
        K("attention", "q (q_norm's output)", Q4, "lin", "fused", ("attn",)),
        K("attention", "k (repeated to every query head: the mask stops grouped-query sdpa)", K4, "lin", "fused", ("attn",)),
        K("attention", "v (repeated to every query head)", K4, "lin", "fused", ("attn",)),
        K("attention", "output", ("b", "s", "H", "d"), "lin", "fused", ("attn",)),
        K("attention", "log-sum-exp (fp32)", ("b", "H", "s"), "f32", "fused", ("attn",)),
    ]
    o = [("o", n["o"], "h")]
    rows += [r._replace(when=_and("eager_core", r.when)) for r in _linear(o, ("T", "q"), "attn", low_input=True)]
    rows += [r._replace(when=_and("fused", r.when)) for r in _linear(o, ("T", "q"), "attn", low_input=True, source="attention: output")]
    rows += [K("tanh(cross_attn_attn_gate) *", "tanh of the gate", (1,), "lin", None, ("o", "W:norm")),
             K("tanh(cross_attn_attn_gate) *", "o_proj's output", X, "lin", None, ("W:norm",))]
    rows += _norm(fam.norm, _op(ROLE["norm2"], "post_attention_layernorm"), X, "h1") + _mlp(fam, n, act)
    return rows + [K("tanh(cross_attn_mlp_gate) *", "tanh of the gate", (1,), "lin", None, ("d", "W:norm")),
                   K("tanh(cross_attn_mlp_gate) *", "the masked MLP output", X, "lin", None, ("W:norm",))]


def _sandwich_rows(fam: ActivationRules, n: dict, attention: list, mlp: list) -> list:
    """Gemma 2/3 (pre_post): input_layernorm, attention, post_attention_layernorm (on o_proj's output), residual
    add, pre_feedforward_layernorm, MLP, post_feedforward_layernorm (on down_proj's output), residual add.
    OLMo 2 (post): attention, post_attention_layernorm, add; MLP, post_feedforward_layernorm, add: q/k/v and
    gate/up read the layer input and the sum directly."""
    X = ("b", "s", "h")
    post_attention = _norm(fam.norm, "post_attention_layernorm", X, "o", "lin")
    post_mlp = _norm(fam.norm, "post_feedforward_layernorm", X, "d", "lin")
    if fam.sandwich == "post":
        attention = [r._replace(needs=tuple("x" if x == "n1" else x for x in r.needs)) for r in attention]
        mlp = [r._replace(needs=tuple("h1" if x == "n2" else x for x in r.needs)) for r in mlp]
        return attention + post_attention + mlp + post_mlp
    return (_norm(fam.norm, "input_layernorm", X, "x") + attention + post_attention
            + _norm(fam.norm, "pre_feedforward_layernorm", X, "h1") + mlp + post_mlp)


def _shared_input_rows(fam: ActivationRules, n: dict, attention: list, mlp: list) -> list:
    """Cohere: input_layernorm, then attention and the MLP both on its output; gate/up's input is q/k/v's storage.
    use_qk_norm adds a per-head CohereLayerNorm on q and k before the rotary."""
    X = ("b", "s", "h")
    shared = attention[0].label   # the q/k/v projections' input (Falcon: query_key_value's)
    own = mlp[0].label   # gate/up's input row; their LoRA inputs name it as their storage too
    mlp = [r._replace(needs=tuple("n1" if x == "n2" else x for x in r.needs),
                      source=shared if r.label == own or r.source == own else r.source) for r in mlp]
    qk = [r._replace(when=_and("qk_norm_on", r.when))
          for r in _norm(fam.norm, "q_norm", ("b", "s", "H", "d"), "q_raw", "lin")
          + _norm(fam.norm, "k_norm", ("b", "s", "KV", "d"), "k_raw", "lin")]
    return _norm(fam.norm, "input_layernorm", X, "x") + attention + qk + mlp


def _embedding_rows(fam: ActivationRules) -> list:
    X = ("b", "s", "h")
    rows = [K("embed_tokens", "input ids", ("b", "s"), "i64", None, ("W:embed",))]
    if "positions" in fam.embed_extra:
        rows.append(K("position embedding", "position ids", (1, "s"), "i64", None, ("W:embed",)))
    if "batch_positions" in fam.embed_extra:   # RoBERTa: both made per sequence from the input ids
        rows += [K("token_type embedding", "token type ids (gathered by the position ids)", ("b", "s"), "i64", None,
                   ("W:embed",)),
                 K("position embedding", "position ids (counted from the padding token)", ("b", "s"), "i64", None,
                   ("W:embed",))]
    if "token_types" in fam.embed_extra:
        rows.append(K("token_type embedding", "token type ids (gathered from the buffer)", (1, "s"), "i64", None,
                      ("W:embed",)))
    if fam.post_norm:   # (emb_out: the embeddings' output needs a gradient, see _evaluate)
        rows += _norm(fam.norm, "LayerNorm", X, "emb_out")
    rows.append(K("embedding dropout", "mask", X, "bool", "embd_dropout", ("emb_out",)))
    if fam.falcon:   # the ALiBi bias: built once in FalconModel.forward, kept by every layer's fused kernel
        rows.append(K("alibi", "the ALiBi + causal bias (shared by every layer)", ("b", "H", "s", "s"), "act", "fa_alibi_shared",
                      ("rope",)))
    if fam.rope:
        width = "rh" if fam.rope_half else "rot"
        rows += [K("rotary", "cos (shared by every layer)", (1, "s", width), "act", "rotary_on&cos_sin", ("rope",)),
                 K("rotary", "sin (shared by every layer)", (1, "s", width), "act", "rotary_on&cos_sin", ("rope",)),
                 # Llama 4: q and k times freqs_cis (complex64: rot / 2 pairs of fp32, shared by every rope layer)
                 K("rotary", "freqs_cis (complex64, shared by every rope layer)", (1, "s", "rot"), "f32",
                   "rotary_on&freqs_cis", ("rope",)),
                 # Gemma 3: a second pair for the other layer type (modeling_gemma3.py, Gemma3TextModel.forward)
                 K("rotary", "cos of the second layer type", (1, "s", "rot"), "act", "two_ropes", ("rope",)),
                 K("rotary", "sin of the second layer type", (1, "s", "rot"), "act", "two_ropes", ("rope",))]
    return rows


def _head_rows(fam: ActivationRules) -> list:
    X, n = ("b", "s", "h"), fam.names
    if fam.head == "mlm":   # BertForMaskedLM: dense, activation, LayerNorm, decoder
        return (_linear([("transform", n["transform"], "h")], ("T", "h"), "x")
                + _activation("gelu", "transform act", X, "t")
                + [r._replace(what="input (the activation's output)", role="layer_norm:lin") if i == 0 else r
                   for i, r in enumerate(_norm(fam.norm, "transform.LayerNorm", X, "t"))]
                + _linear([("lm_head", n["lm_head"], "V")], ("T", "h"), "tn", quantizable=False))
    return _norm(fam.norm, _op(ROLE["final"], n.get("final", "model.norm")), X, "x") + _linear([("lm_head", n["lm_head"], "V")], ("T", "h"), "fn", quantizable=False) + [
        # Gemma 2's final_logit_softcapping: tanh(logits / cap) * cap keeps the tanh's result
        K("final softcap tanh", "tanh(logits / cap)", ("T", "V"), "lin", "final_softcap", ("x", f"W:{n['lm_head']}"))]


def _classifier_rows(fam: ActivationRules, dropout: bool) -> list:
    """A classification head (issue 34; families' docstring): a decoder's final norm then `score` over every position,
    the last non-padding token's row picked by advanced indexing (its two index tensors kept); BERT's pooler (a view
    of the first token: the linear keeps the last hidden state's storage; tanh keeps its result), dropout and
    `classifier`. A token classifier: dropout, then its linear at every position (`dropout`: p > 0, else the linear
    reads the tensor before it)."""
    X, n = ("b", "s", "h"), fam.names
    if fam.head == "seq" and fam.post_norm and "batch_positions" in fam.embed_extra:
        # RobertaClassificationHead: dropout on the first token (a view: without dropout the dense keeps the last
        # hidden state's storage), dense, tanh, dropout, out_proj
        P, W, L = ("b", "h"), f"W:{n['pooler']}", f"L:{n['pooler']}"
        if dropout:
            rows = [K("classifier dropout", "mask (first token)", P, "bool", None, ("x", W)),
                    *_linear([("transform", n["pooler"], "h")], P, "x")]
        else:
            rows = [K("classifier.dense", "input (the first token: a view, the last hidden state's storage)", X, "act",
                      "not_mixed", (W, L)),
                    K("classifier.dense.lora_B", "input (lora_A's output)", ("b", "R"), "ada_low", "lora", (L,)),
                    K("classifier.dense", "input, cast to the low dtype by autocast", P, "low", "mixed", (W,)),
                    K("classifier.dense", "weight, cast to the low dtype by autocast", ("h", "h"), "low", "mixed", ("x",))]
        rows += [K("classifier activation", "tanh result", P, "lin", None, ("x", W)),
                 K("classifier dropout", "mask", P, "bool", "cls_dropout", ("x", W))]
        return rows + _linear([("score", n["score"], "L")], P, "x", low_input=True,
                              source=None if dropout else "classifier activation: tanh result")
    if fam.head == "seq" and fam.post_norm:   # BertForSequenceClassification
        P, W, L = ("b", "h"), f"W:{n['pooler']}", f"L:{n['pooler']}"
        rows = [K("pooler.dense", "input (the first token: a view, the last hidden state's storage)", X, "act", "not_mixed",
                  (W, L)),
                # peft's all-linear adapts the pooler: lora_A keeps the same view, lora_B lora_A's output
                K("pooler.dense.lora_B", "input (lora_A's output)", ("b", "R"), "ada_low", "lora", (L,)),
                K("pooler.dense", "input, cast to the low dtype by autocast", P, "low", "mixed", (W,)),
                K("pooler.dense", "weight, cast to the low dtype by autocast", ("h", "h"), "low", "mixed", ("x",)),
                K("pooler activation", "tanh result", P, "lin", None, ("x", W)),
                K("classifier dropout", "mask", P, "bool", "cls_dropout", ("x", W))]
        return rows + _linear([("score", n["score"], "L")], P, "x", low_input=True, quantizable=False,
                              source=None if dropout else "pooler activation: tanh result")
    if fam.post_norm:   # BertForTokenClassification: no final norm (each layer ends in its own)
        top, rows = "x", []
    else:
        top = "fn"
        rows = _norm(fam.norm, _op(ROLE["final"], n.get("final", "model.norm")), X, "x")
    if fam.head == "token":
        rows.append(K("classifier dropout", "mask", X, "bool", "cls_dropout", (top,)))
    rows += _linear([("score", n["score"], "L")], ("T", "h"), top, quantizable=False)
    if fam.head == "seq":
        rows += [K("pooling", "batch indices (arange)", ("b",), "i64", None, (top,)),
                 K("pooling", "each sequence's last non-padding position", ("b",), "i64", "pad_known", (top,))]
    return rows


# Classification losses (issue 34): config.problem_type's, on the pooled (b, L) logits or on every position's (T, L)
CLASSIFIER_LOSS_ROWS = [
    K("cross-entropy", "log-softmax of the pooled logits", ("b", "L"), "soft", "seq_ce"),
    K("cross-entropy", "targets (the labels)", ("b",), "i64", "seq_ce"),
    K("cross-entropy", "total weight", (), "soft", "seq_ce"),
    K("mse loss", "input (the pooled logits)", ("b", "L"), "soft", "seq_mse"),
    K("mse loss", "targets (the labels, fp32)", ("b", "L"), "f32", "seq_mse"),
    K("bce-with-logits loss", "input (the pooled logits)", ("b", "L"), "soft", "seq_bce"),
    K("bce-with-logits loss", "targets (the labels, fp32)", ("b", "L"), "f32", "seq_bce"),
    K("cross-entropy", "log-softmax of the logits (fp32)", ("T", "L"), "f32", "token"),
    K("cross-entropy", "targets (the labels)", ("T",), "i64", "token"),
    K("cross-entropy", "total weight", (), "f32", "token"),
]


def classifier(cfg: dict) -> dict | None:
    """The classification head `architectures[0]` names (as transformers picks the class), or None for a language
    model: {"task": "seq" | "token", "module", "labels", "loss": "ce" | "mse" | "bce", "dropout": p, "pad": bool}."""
    from memfit.models.families import FAMILIES as FAMS, SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION

    own = FAMS[cfg["model_type"]]
    names = cfg.get("architectures")
    kind = own.architectures.get(names[0] if names else own.default_architecture)
    if kind not in (SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION):
        return None
    labels = len(cfg["id2label"]) if cfg.get("id2label") is not None else 2
    problem = cfg.get("problem_type") or ("regression" if labels == 1 else "single_label_classification")
    loss = {"regression": "mse", "multi_label_classification": "bce"}.get(problem, "ce")
    keys = own.classifier_dropout
    if kind == SEQUENCE_CLASSIFICATION:
        module = ("classifier.out_proj" if own.encoder_head == "roberta" else "classifier") if own.block == "bert" else "score"
        keys = ("classifier_dropout", "hidden_dropout_prob") if own.block == "bert" else ()
    else:
        module = own.classifier
    p = next((cfg[k] for k in keys if cfg.get(k) is not None), 0.1 if kind == TOKEN_CLASSIFICATION else 0.0)
    return {"task": "seq" if kind == SEQUENCE_CLASSIFICATION else "token", "module": module, "labels": labels,
            "loss": loss, "dropout": p, "pad": cfg.get("pad_token_id") is not None}


# Causal LMs upcast the logits (logits.float()) before the cross-entropy; BERT's masked-LM loss does not
# (autocast runs its log-softmax in fp32 all the same).
LOSS_ROWS = [
    K("cross-entropy", "log-softmax of the logits (fp32)", ("T", "V"), "f32", "causal"),
    K("cross-entropy", "log-softmax of the logits", ("T", "V"), "soft", "mlm"),
    K("cross-entropy", "targets (labels padded by one and shifted: one sequence keeps the padded storage)", ("Tl",),
      "i64", "causal"),
    K("cross-entropy", "targets (the labels)", ("T",), "i64", "mlm"),
    K("cross-entropy", "total weight", (), "f32", "causal"),
    K("cross-entropy", "total weight", (), "soft", "mlm"),
    # gpt-oss with output_router_logits: load_balancing_loss_func (GptOssForCausalLM.forward adds router_aux_loss_coef x
    # it) takes a softmax of every layer's (T, E) router logits and their top-k after the last layer; they go with the
    # loss, before the backward's first recomputation
    K("router aux loss", "softmax of every layer's router logits (the logits' dtype)", ("nl", "T", "E"), "softmax:lin", "aux_loss",
      ("x", "W:router")),
    K("router aux loss", "top-k indices of every layer", ("nl", "T", "k"), "i64", "aux_loss", ("x", "W:router")),
    K("router aux loss", "tokens per expert (fp32; * the mean router probability keeps it)", ("E",), "f32", "aux_loss",
      ("x", "W:router")),
]


def count_layers(cfg: dict) -> int:
    if hf_encdec.is_stacked(cfg):  # every stack's layers, in forward order
        return sum(count for _, _, count in hf_encdec.stacks(cfg))
    return cfg["n_layer"] if cfg["model_type"] == "gpt2" else cfg["num_hidden_layers"]

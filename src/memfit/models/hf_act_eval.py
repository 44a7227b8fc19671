"""Evaluating the rows for one config (models/hf_activations.py): the routed experts' rows, the symbolic sizes,
the static conditions (Falcon's, MLA's, sliding windows), the dtype roles per precision (a quantized base's
included), which weights train (`trainable_flags`), the gradient flags, and resolving rows into kept tensors."""

from __future__ import annotations

from memfit.models import hf_encdec
from memfit.models.hf_act_ops import (ATTENTION_MASK_FP32, ATTENTIONS, Block, CHECKPOINTING, Conditions, ActivationRules, Kept, LOW,
                                      PRECISIONS, SOFTMAX_SAVES_INPUT, liger_rms_norm, liger_swiglu, mean_saves_input, rms_fp32_weight,
                                      rms_upcast)
from memfit.models.hf_act_families import FAMILIES, MOE, SUPPORTED
from memfit.models.hf_act_layers import layer_rows, count_layers
from memfit.recipe.autocast import DEVICE_OPS, op_dtype


# --------------------------------------------------------------------------------------------- evaluation


ROUTINGS = ("uniform", "worst_case")  # training.moe.routing


def routed_rows(tokens: int, k: int, experts: int, moe: dict | None = None) -> int:
    """Rows the routed experts of one MoE layer process on a rank (S), under training.moe: `routing` uniform (the
    default: T·k / E rows per expert, T·k in all: transformers' dropless grouped experts keep exactly T·k whatever
    the routing) or worst_case (every token of the expert-parallel group sends all its k choices to this rank's
    experts: expert · T · min(k, E / expert) rows); `capacity_factor` cf pads or cuts each expert's rows to its
    capacity ⌈cf·T·k/E⌉ (GShard, Switch, Megatron's --moe-expert-capacity-factor with padding): E·⌈cf·T·k/E⌉ rows
    on a rank, whatever the routing. `expert` is parallel.expert (the expert-parallel group's size)."""
    moe = moe or {}
    if not experts or not k:
        return tokens * k
    factor = moe.get("capacity_factor")
    if factor is not None:
        from fractions import Fraction

        capacity = -(-Fraction(str(factor)) * tokens * k // experts)   # ceil, exact for a decimal factor
        return experts * int(capacity)
    if moe.get("routing", "uniform") == "worst_case":
        group = max(1, int(moe.get("expert") or 1))
        return group * tokens * min(k, experts // group)
    return tokens * k


def layer_sizes(cfg: dict, micro_batch: int, seq_len: int, rank: int = 0, attention: str = "sdpa",
           target_len: int | None = None, moe: dict | None = None) -> dict:
    if hf_encdec.is_stacked(cfg):
        return _t5_sizes(cfg, micro_batch, seq_len, target_len, rank)
    mt = cfg["model_type"]
    h = cfg["n_embd"] if mt == "gpt2" else cfg["hidden_size"]
    heads = cfg["n_head"] if mt == "gpt2" else cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    if FAMILIES[mt].falcon:
        from memfit.models.falcon import falcon_kv_heads

        kv_heads = falcon_kv_heads(cfg)
    d = cfg.get("head_dim") or h // heads
    inter = (cfg.get("n_inner") or 4 * h) if mt == "gpt2" else cfg.get("ffn_hidden_size") or cfg["intermediate_size"]
    rope = cfg.get("rope_parameters") or {}
    rotary = int(d * rope.get("partial_rotary_factor", 1.0)) if FAMILIES[mt].rope else 0
    tokens = micro_batch * seq_len
    k = cfg.get("num_experts_per_tok", 0)
    from memfit.models.families import EXPERTS_KEY

    experts = cfg.get(EXPERTS_KEY.get(mt, ""), 0)
    expert_inter = cfg.get("moe_intermediate_size") or inter
    routed = routed_rows(tokens, k, experts, moe)
    shared = cfg.get("shared_expert_intermediate_size") or 0
    if mt == "llama4_text":   # every token through every expert (Llama4TextMoe repeats the input E times)
        inter, expert_inter, shared = cfg["intermediate_size_mlp"], cfg["intermediate_size"], cfg["intermediate_size"]
        experts = cfg["num_local_experts"]
        routed = experts * tokens
    return {"b": micro_batch, "s": seq_len, "h": h, "i": inter, "i2": 2 * inter, "H": heads, "KV": kv_heads, "d": d,
            "dk": -(-d // 8) * 8 if attention == "flash" else d, "r": rotary,
            "q": heads * d, "kv": kv_heads * d, "qkv": heads * d + 2 * kv_heads * d, "rot": rotary, "rh": rotary // 2,
            "s1": seq_len + 1, "nl": cfg["num_hidden_layers"] if mt != "gpt2" else cfg["n_layer"],
            "V": cfg["vocab_size"], "T": tokens, "Tl": tokens if micro_batch > 1 or FAMILIES[mt].llava else seq_len + 1,
            "E": experts, "k": k, "S": routed, "R": rank, "R2": 2 * rank,
            "ie": expert_inter, "ie2": 2 * expert_inter, "is": shared,
            **(_mla_sizes(cfg) if FAMILIES[mt].mla else {}), **(_mllama_sizes(cfg, micro_batch) if FAMILIES[mt].mllama else {})}


def _mllama_sizes(cfg: dict, micro_batch: int) -> dict:
    """Llama 3.2 Vision: N, the image tokens each sequence's cross-attention layers attend to (every tile's patches of
    its images: models/mllama.image_tokens), and TN = b x N."""
    from memfit.models.mllama import image_tokens

    n = int(cfg["mllama"].get("images", 1)) * image_tokens(cfg)
    return {"N": n, "TN": micro_batch * n}


def _mla_sizes(cfg: dict) -> dict:
    """DeepSeek-V3's latent-attention widths (and its shared experts': n_shared_experts * moe_intermediate_size). The
    ledger's q and kv (the attention's gradients in flight) become the query/key and value widths of every head."""
    H, nope, rope, dv = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    kvr, qr = cfg["kv_lora_rank"], cfg.get("q_lora_rank") or 0
    return {"qr": qr, "kvr": kvr, "kva": kvr + rope, "dqk": nope + rope, "dv": dv, "qb": H * (nope + rope),
            "kvb": H * (nope + dv), "ov": H * dv, "q": H * (nope + rope), "kv": H * dv,
            "is": cfg["moe_intermediate_size"] * cfg["n_shared_experts"]}


def dropout_on(cfg: dict, fam: ActivationRules, which: str) -> bool:
    key = dict(fam.dropout_keys).get(which)
    return bool(key and (cfg.get(key) or 0) > 0)


def layer_conditions(cfg: dict, fam: ActivationRules, attention: str, checkpointing: str, micro_batch: int,
                precision: str | None = None, lora: dict | None = None) -> dict:
    if precision is None:
        precision = "32-true"
    if attention == "sdpa" and not fam.sdpa:
        attention = "eager"   # what transformers runs by default where it refuses sdpa
    eager = attention == "eager"
    fused = not eager
    cache = fam.cache and bool(cfg.get("use_cache", True)) and checkpointing != "full"
    attn_drop = dropout_on(cfg, fam, "attn")
    core = eager and checkpointing != "selective"   # selective recomputation drops the attention core's tensors
    # GPT-2's q, k, v are strided views of one qkv output; matmul folds (b, H) into one batch dim, which copies them
    # unless b == 1 (then q's view keeps the whole qkv output, and k, v without the cache are views of it too)
    qkv_views = fam.qkv == "fused" and not fam.rope and micro_batch == 1
    no_rope_fused = fam.qkv == "fused" and not fam.rope
    # likewise a rotary fused-qkv model's v without the cache, when no grouped-query repeat copies it first
    heads = cfg.get("num_attention_heads") or cfg.get("n_head")
    v_view = (fam.qkv == "fused" and bool(fam.rope) and not cache and micro_batch == 1
              and (cfg.get("num_key_value_heads") or heads) == heads)
    mixed = precision.endswith("-mixed")
    # one key/value head, one sequence, separate projections: repeat_kv's views fold without a copy (eager)
    one_kv = (fam.qkv == "separate" and micro_batch == 1 and heads is not None and heads > 1
              and cfg.get("num_key_value_heads") == 1)
    lora_dropout = bool(lora) and (lora.get("dropout") or 0) > 0
    o_copy = eager or (attention == "sdpa" and fam.rope == "partial")
    falcon = _falcon_conditions(cfg, fam, attention, checkpointing, micro_batch, cache, mixed)
    return Conditions({
        **falcon,
        None: True,
        "eager": eager,
        "eager_q": eager and not qkv_views,
        "eager_q_view": eager and qkv_views,
        "eager_kv": eager and (cache or not qkv_views) and not (one_kv and not mixed),
        "eager_kv_one": eager and (cache or not qkv_views) and one_kv and not mixed,
        "eager_v": eager and (cache or not qkv_views) and not v_view and not one_kv,
        "eager_v_one": eager and (cache or not qkv_views) and not v_view and one_kv,
        "eager_v_view": eager and v_view,
        "eager_core": core,
        "eager_attn_dropout": core and attn_drop,
        "eager_core_no_dropout": core and not attn_drop,
        "fused": fused,
        "fused_q": fused and not no_rope_fused,
        "fused_q_view": fused and no_rope_fused,
        "fused_cache": fused and cache,
        "fused_k_nocache": fused and not cache and not no_rope_fused,
        "fused_v_nocache": fused and not cache and fam.qkv == "separate",
        "fused_v_view": fused and not cache and fam.qkv == "fused" and bool(fam.rope),
        "window_mask": False,   # set per sliding layer by _window_conditions
        "flash": attention == "flash",
        "o_copy": o_copy,
        "o_view": not o_copy,
        "resid_dropout": dropout_on(cfg, fam, "resid"),
        "embd_dropout": dropout_on(cfg, fam, "embd"),
        # Gemma 3's second cos/sin pair: kept by the layers of the other type; under full checkpointing only the
        # recomputed layer keeps one pair (the one counted with the embeddings)
        "rms_upcast": rms_upcast(cfg) and not liger_rms_norm(cfg),
        "rms_native": not rms_upcast(cfg) and not liger_rms_norm(cfg),
        "rms_cast_back": not liger_rms_norm(cfg) and not rms_fp32_weight(cfg),
        "rms_fp32_weight": not liger_rms_norm(cfg) and rms_fp32_weight(cfg),
        "rms_liger": liger_rms_norm(cfg),
        "swiglu_eager": not liger_swiglu(cfg),
        "swiglu_liger": liger_swiglu(cfg),
        "mean_saves": mean_saves_input(cfg),
        "qk_norm_on": bool(fam.qk_norm_key and cfg.get(fam.qk_norm_key)) or (cfg.get("model_type") == "llama4_text" and bool(cfg.get("use_qk_norm"))),
        "temperature_on": cfg.get("model_type") == "llama4_text" and bool(cfg.get("attn_temperature_tuning")),
        "freqs_cis": cfg.get("model_type") == "llama4_text",
        "cos_sin": cfg.get("model_type") != "llama4_text",
        "two_ropes": isinstance(cfg.get("rope_parameters"), dict) and "full_attention" in cfg["rope_parameters"]
        and len(set(cfg.get("layer_types") or ())) > 1 and checkpointing != "full",
        "attn_softcap": cfg.get("attn_logit_softcapping") is not None,
        # torch < 1.11's softmax kept its input (training.softmax_saves_input), fp32 under an fp32 additive mask
        "sm_input_f32": bool(cfg.get(SOFTMAX_SAVES_INPUT)) and bool(cfg.get(ATTENTION_MASK_FP32)),
        "sm_input_scores": bool(cfg.get(SOFTMAX_SAVES_INPUT)) and not cfg.get(ATTENTION_MASK_FP32),
        "sm_mask_f32": bool(cfg.get(ATTENTION_MASK_FP32)),
        "sm_scores": not cfg.get(ATTENTION_MASK_FP32),
        "final_softcap": cfg.get("final_logit_softcapping") is not None,
        "causal": fam.head == "causal",
        "mlm": fam.head == "mlm",
        "mixed": mixed,
        "mixed_base": mixed,   # a base linear's autocast casts (off on a 4-bit base: _quantized_base)
        "ada_cast": mixed,     # autocast's casts of the adapters' weights (none where they are in the low dtype: _quantized_base)
        "true16": precision in ("bf16-true", "16-true"),
        "not_mixed": not mixed,
        "lora": bool(lora),
        "lora_dropout": lora_dropout,
        "dora": bool(lora) and lora.get("use_dora") is True,
        "lora_plain": bool(lora) and not lora_dropout and not mixed,
        "lora_plain_mixed": bool(lora) and not lora_dropout and mixed,
        "topk_norm": bool(cfg.get("norm_topk_prob", True)),   # Mixtral always renormalizes; Qwen-MoE when asked
        "aux_loss": fam.mlp == "moe_oss" and bool(cfg.get("output_router_logits")),   # gpt-oss's load-balancing loss
        "input_jitter": (cfg.get("input_jitter_noise") or 0) > 0,   # PhiMoE
        **_mla_conditions(cfg, fam, attention, precision, micro_batch),
    })


def _mla_conditions(cfg: dict, fam: ActivationRules, attention: str, precision: str, micro_batch: int) -> dict:
    """Which of _mla_attention's rows apply: q through q_lora_rank or q_proj; the kernel (eager's and the math
    kernel's batched matmuls, or SDPA's fused kernel where q, k and v share one head dim)."""
    if not fam.mla:
        return {"mla_qlora": False, "mla_qplain": False, "mla_bmm": False, "mla_math": False, "mla_fused": False,
                "mla_v_copy": False, "mla_v_view": False, "mla_bmm_own": False, "mla_math_up": False,
                "not_mla_math_up": True, "lin32": False, "not_lin32": True}
    same = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"] == cfg["v_head_dim"]
    bmm = attention == "eager" or (attention == "sdpa" and not same)
    lin32 = precision == "32-true"
    return {"mla_qlora": cfg.get("q_lora_rank") is not None, "mla_qplain": cfg.get("q_lora_rank") is None,
            "mla_bmm": bmm, "mla_math": bmm and attention != "eager", "mla_fused": not bmm, "lin32": lin32,
            "mla_v_copy": bmm and micro_batch > 1, "mla_v_view": bmm and micro_batch == 1,
            "mla_bmm_own": attention == "eager" or (bmm and lin32), "mla_math_up": bmm and attention != "eager" and not lin32,
            "not_mla_math_up": not (bmm and attention != "eager" and not lin32),
            "not_lin32": not lin32}


def _falcon_conditions(cfg: dict, fam: ActivationRules, attention: str, checkpointing: str, micro_batch: int, cache: bool,
                       mixed: bool) -> dict:
    """Which of _falcon_attention's rows apply (all off for the other families)."""
    names = ("fa_rope", "fa_alibi", "fa_index", "fa_bmm", "fa_fused", "fa_math", "fa_not_math", "fa_eager", "fa_bias_mixed",
             "not_fa_bias_mixed", "fa_q_copy", "fa_q_view", "fa_k_heads", "fa_k_own",
             "fa_k_view", "fa_v_heads", "fa_v_own", "fa_v_view", "fa_drop", "fa_no_drop", "fa_mask", "fa_alibi_shared",
             "fa_alibi_recomputed", "fa_alibi_cast", "fa_seq_drop")
    if not fam.falcon:
        return dict.fromkeys(names, False) | {"rotary_on": True, "not_fa_bias_mixed": True}
    alibi, new = bool(cfg.get("alibi")), bool(cfg.get("new_decoder_architecture"))
    mq = not new and bool(cfg.get("multi_query"))
    mha = not new and not mq
    bmm = attention == "eager" or (attention == "sdpa" and mq)   # multi_query under sdpa: torch's math kernel
    fused = not bmm
    folds = fused or micro_batch == 1   # a strided view reaches the kernel without a copy
    # multi_query's k and v have one head (its cache copies too); the new architecture with one key/value group
    # broadcasts them to every head as stride-0 views (flatten merges the size-1 group without a copy) until the cache
    # copies them or the rotary multiplies k: a kernel then reads the one head's storage
    one_group = new and cfg.get("num_kv_heads") == 1 and not cache and folds
    own = bmm and mq and micro_batch == 1
    own_k, own_v = own or (one_group and alibi), own or one_group
    # FalconLinear's bias add (outside autocast) makes query_key_value's output fp32 under *-mixed: autocast's low
    # copies reach the kernel, never views
    bias_mixed = mixed and bool(cfg.get("bias"))
    # (the math kernel scales q: a copy; the new architecture's flatten copies q unless there is one key/value group)
    q_view = (alibi and (not new or cfg.get("num_kv_heads") == 1) and (fused or (attention == "eager" and micro_batch == 1))
              and not bias_mixed)
    k_view = alibi and mha and not cache and folds and not bias_mixed
    v_view = mha and not cache and folds and not bias_mixed
    math = attention == "sdpa" and mq
    drop = alibi and attention == "eager" and (cfg.get("attention_dropout") or 0) > 0
    sdpa = attention == "sdpa" and fused
    from memfit.models.falcon import falcon_layout

    return {
        "rotary_on": not alibi, "fa_rope": not alibi, "fa_alibi": alibi, "fa_index": not mha, "fa_bmm": bmm,
        "fa_fused": fused, "fa_math": math, "fa_not_math": not math, "fa_eager": attention == "eager",
        "fa_bias_mixed": bias_mixed, "not_fa_bias_mixed": not bias_mixed, "fa_q_copy": not q_view, "fa_q_view": q_view,
        "fa_k_view": k_view, "fa_k_own": own_k and not k_view, "fa_k_heads": not k_view and not own_k,
        "fa_v_view": v_view, "fa_v_own": own_v and not v_view, "fa_v_heads": not v_view and not own_v,
        "fa_drop": bmm and drop, "fa_no_drop": bmm and not drop,
        "fa_mask": sdpa and not alibi,
        # (under full checkpointing too: checkpoint keeps each layer's inputs, the bias among them, for the recomputation)
        "fa_alibi_shared": sdpa and alibi and not mixed,
        "fa_alibi_recomputed": False,
        "fa_alibi_cast": sdpa and alibi and mixed,
        "fa_seq_drop": falcon_layout(cfg) == "sequential" and (cfg.get("attention_dropout") or 0) > 0,
    }


def _roles(precision: str, dtypes: dict | None, adapter: str) -> dict:
    low = LOW.get(precision, "float32")
    if precision.endswith("-mixed"):
        act, lin, soft, copy = "float32", low, "float32", low
    else:
        act = lin = soft = copy = low
    forced = (dtypes or {}).get("activations")
    if forced:
        act = lin = soft = copy = forced
    ada_low = copy if precision.endswith("-mixed") else adapter
    roles = {"act": act, "lin": lin, "out": lin, "soft": soft, "low": copy, "ada": adapter, "ada_low": ada_low, "f32": "float32",
             "i64": "int64", "i32": "int32", "bool": "bool"}
    _device_roles(roles, precision.endswith("-mixed"), dtypes)
    return roles


def _device_roles(roles: dict, mixed: bool, dtypes: dict | None) -> None:
    """"<op>:<role>": what an op whose dtype depends on the autocast in force (recipe/autocast.py's table: softmax
    without a stated dtype, pow, layer_norm) keeps on an input of that role. `dtypes["autocast"]` names the device
    (hf_derive from the config's device.type); without it, CPU autocast, under which the rules were measured."""
    device = (dtypes or {}).get("autocast") or "cpu"
    mixed = mixed and not (dtypes or {}).get("activations")
    for op in DEVICE_OPS:
        for base in ("lin", "out"):
            roles[f"{op}:{base}"] = op_dtype(op, device, roles[base], mixed)


def role_dtypes(precision: str, dtypes: dict | None) -> dict:
    """The dtype of each role for a recipe (adapters in fp32, as peft keeps them, unless `dtypes` names theirs)."""
    return _roles(precision, dtypes, (dtypes or {}).get("adapter") or "float32")


def _quantized_base(cond: dict, roles: dict, dtypes: dict | None) -> None:
    """A 4-bit base (bitsandbytes Linear4bit) under autocast: Linear4bit.forward casts its input to the compute dtype
    and its output back to the input's dtype (`out.to(inp_dtype)`), outside autocast's op list. So autocast keeps no
    copy of a quantized linear's input or weight (MatMul4Bit keeps only the packed weight, a parameter), and what
    reads a projection's output in fp32 (the feed-forward's activation and product) keeps fp32 where a dense base's
    autocast matmul would have handed it the low dtype. Measured (saved_tensors_hooks, tiny Llama, QLoRA nf4 under
    bf16-mixed): the MLP's three (b, s, i) tensors per layer kept in fp32, no weight copies."""
    # (adapters already in the low dtype, as peft builds them on a 4-bit base computing in it with
    # autocast_adapter_dtype=False, are no autocast cast: their weights are saved as they are, parameters)
    cond["ada_cast"] = cond["mixed"] and roles["ada"] != roles["low"]
    if (dtypes or {}).get("quantized") and cond["mixed"]:
        cond["mixed_base"] = False
        roles["out"] = roles["act"]
        _device_roles(roles, True, dtypes)
        # a fused qkv output in fp32: SDPA under autocast saves its low copy of v, not the output's view (measured:
        # Phi-3 QLoRA under bf16-mixed, a dispatch-mode trace of the recomputation: q, k and v cast, (b, KV, s, d) v)
        if cond.get("fused_v_view"):
            cond["fused_v_view"], cond["fused_v_nocache"] = False, True


def _shape(symbols: tuple, sizes: dict) -> tuple:
    return tuple(sizes[x] if isinstance(x, str) else x for x in symbols)


def _resolve(rows: list, cond: dict, roles: dict, sizes: dict, flags: dict, shape=_shape) -> list:
    """Rows -> Kept, each storage once: a row with a `source` of the same dtype is that source's storage.
    `shape(symbols, sizes)` evaluates a row's symbolic shape (a parallel layout passes a rank's share)."""
    holds: dict = {}  # each condition looked up once per call (a compound "a&b" is worked out on every lookup)

    def on(r):
        when = r.when
        if when not in holds:
            holds[when] = cond[when]
        return holds[when]

    live = [r for r in rows if on(r)]
    dtype_of = {r.label: roles[r.role] for r in live}
    labelled = getattr(shape, "labelled", False)  # a shape that reads the row's label too (hf_sharded.rank_shape)
    kept, seen = [], set()
    for r in live:
        if r.needs and not any(_flag(flags, x) for x in r.needs):
            continue
        dtype = roles[r.role]
        key = r.label
        if r.source is not None and dtype_of.get(r.source) == dtype:
            key = r.source
        if key in seen:
            continue
        seen.add(key)
        kept.append(Kept(r.label, shape(r.shape, sizes, r.label) if labelled else shape(r.shape, sizes), dtype))
    return kept


def _flag(flags: dict, need) -> bool:
    """A need is a flag name, or a tuple of names that must all hold."""
    if isinstance(need, tuple):
        return all(flags.get(x, False) for x in need)
    return flags.get(need, False)


def _match(name: str, targets) -> bool:
    return any(name == t or name.endswith("." + t) for t in targets)


def _regex(pattern: str, name: str) -> bool:
    import re

    try:
        return re.fullmatch(pattern, name) is not None
    except re.error:
        return False


def trainable_flags(fam: ActivationRules, lora: dict | None) -> dict:
    """Weight flags: W:<module> (the weight trains), L:<module> (a LoRA adapter on it)."""
    modules = [m for k, m in fam.names.items() if k not in ("norm1", "norm2", "final")]
    if not lora:
        flags = {f"W:{m}": True for m in modules}
        flags.update({"W:norm": True, "W:embed": True, "W:experts": True, "W:router": True})
        return flags
    targets = lora.get("target_modules") or fam.lora_default
    if not targets:
        raise ValueError("peft has no default target_modules for this model type: name them")
    all_linear = targets in ("all-linear", ["all-linear"])
    save = lora.get("modules_to_save") or ()
    # peft 0.21's all-linear also wraps a mixture of experts' router and stacked expert weights (as parameters)
    experts = all_linear and fam.mlp in MOE and fam.lora_experts
    flags = {"W:norm": False, "W:embed": False, "W:experts": experts, "L:experts": experts, "W:router": experts,
             "L:router": experts}
    for m in modules:
        if all_linear:
            adapted = m != fam.names["lm_head"]   # peft's all-linear leaves the output layer alone
        elif isinstance(targets, str) and fam.mllama:   # peft: a regular expression over the whole module name
            adapted = _regex(targets, m if m == fam.names["lm_head"] else f"model.language_model.layers.0.{m}")
        elif isinstance(targets, str):
            adapted = _match(m, [targets])
        else:
            adapted = _match(m, targets)
        flags[f"W:{m}"] = _match(m, save)
        flags[f"L:{m}"] = adapted and not flags[f"W:{m}"]
    return flags


def _grads(fam: ActivationRules, w: dict, x: bool, parallel: bool) -> dict:
    """Which tensors of one layer need a gradient, given whether its input does and which weights train."""
    n = fam.names

    def t(role):   # the projection's output needs a gradient even when its input does not
        m = n.get(role)
        return m is not None and (w.get(f"W:{m}", False) or w.get(f"L:{m}", False))

    g = {"x": x}
    g["n1"] = x or w["W:norm"]
    if fam.qkv == "fused":
        g["q_raw"] = g["k_raw"] = g["v"] = g["n1"] or t("qkv")
    else:
        g["q_raw"], g["k_raw"], g["v"] = (g["n1"] or t("q"), g["n1"] or t("k"), g["n1"] or t("v"))
    g["q"] = g["q_raw"] or (fam.qk_norm and w["W:norm"])
    g["k"] = g["k_raw"] or (fam.qk_norm and w["W:norm"])
    if fam.mla:   # q_a_proj's output, q_a_layernorm's, kv_a_proj_with_mqa's, kv_a_layernorm's; then q, k and v
        g["qa_out"] = g["n1"] or t("qa")
        g["qan"] = g["qa_out"] or w["W:norm"]
        g["kv_out"] = g["n1"] or t("kva")
        g["kvn"] = g["kv_out"] or w["W:norm"]
        g["q"] = g["qan"] or t("qb") or t("q")
        g["k"] = g["v"] = g["kvn"] or t("kvb")
    g["qk"] = g["q"] or g["k"]
    g["attn"] = g["qk"] or g["v"]
    g["o"] = g["attn"] or t("o")
    g["h1"] = x or g["o"]
    g["h1n"] = g["h1"] or w["W:norm"]
    g["n2"] = (x if parallel and fam.parallel_key else g["h1"]) or w["W:norm"]
    if fam.mlp == "gated":
        g["g"], g["u"] = g["n2"] or t("gate"), g["n2"] or t("up")
    elif fam.mlp == "gated_fused":
        g["g"] = g["u"] = g["n2"] or t("gate_up")
    elif fam.mlp == "plain":
        g["g"] = g["u"] = (g["h1n"] if fam.post_norm else g["n2"]) or t("fc_in")
    else:
        g["r"] = g["n2"] or w["W:router"] or t("router")
        g["g"] = g["u"] = g["e"] = g["n2"] or w["W:experts"]
        if fam.mlp == "moe_deepseek":  # the shared experts' hidden product and output
            g["sh"] = g["n2"] or t("sgate") or t("sup")
            g["sd"] = g["sh"] or t("sdown")
        if fam.mlp in ("moe_shared", "moe_llama4"):  # the shared expert's hidden product, its output and its gate's logits
            g["sh"] = g["n2"] or t("sgate") or t("sup")
            g["sd"] = g["sh"] or t("sdown")
            g["sgw"] = g["n2"] or t("sg")
    g["p"] = g["g"] or g["u"]
    g["d"] = g["p"] or t("down") or t("fc_out")
    g["out"] = g["h1"] or g["d"]
    return g


def cross_grads(fam: ActivationRules, w: dict, x: bool, xv: bool) -> dict:
    """A cross-attention layer's gradient flags (hf_act_layers._cross_rows): as a layer's, but k and v come from the
    image tokens (`xv`: they need a gradient when the vision tower or the projector trains), not from the layer's
    input."""
    g = _grads(fam, w, x, False)
    m = fam.names

    def t(role):
        return w.get(f"W:{m[role]}", False) or w.get(f"L:{m[role]}", False)

    g["xv"] = xv
    g["k_raw"], g["v"] = xv or t("k"), xv or t("v")
    g["k"] = g["k_raw"] or w["W:norm"]
    g["qk"] = g["q"] or g["k"]
    g["attn"] = g["qk"] or g["v"]
    g["o"] = g["attn"] or t("o")
    g["h1"] = x or g["o"] or w["W:norm"]   # (the gate trains: tanh(gate) * o_proj's output needs a gradient)
    g["h1n"] = g["h1"] or w["W:norm"]
    g["n2"] = g["h1"] or w["W:norm"]
    g["g"], g["u"] = g["n2"] or t("gate"), g["n2"] or t("up")
    g["p"] = g["g"] or g["u"]
    g["d"] = g["p"] or t("down")
    g["out"] = g["h1"] or g["d"] or w["W:norm"]
    return g


def check(cfg: dict, attention: str, checkpointing: str, precision: str) -> None:
    if cfg.get("model_type") not in FAMILIES:
        raise ValueError(f"unsupported model_type {cfg.get('model_type')!r}; supported: {', '.join(SUPPORTED)}")
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}")
    if checkpointing not in CHECKPOINTING:
        raise ValueError(f"checkpointing must be one of {', '.join(CHECKPOINTING)}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}")


def _act(cfg: dict) -> str:
    return cfg.get(FAMILIES[cfg["model_type"]].act_key) or "gelu"


def _parallel(cfg: dict) -> bool:
    if FAMILIES[cfg["model_type"]].falcon:   # "shared" or "two_norms" (both true), or "" (sequential)
        from memfit.models.falcon import falcon_layout

        layout = falcon_layout(cfg)
        return "" if layout == "sequential" else layout
    key = FAMILIES[cfg["model_type"]].parallel_key
    return bool(cfg.get(key, True)) if key else False


def _boundary(fam: ActivationRules, roles: dict, sizes: dict, shape=_shape) -> Kept:
    return Kept("checkpoint: the layer's input (kept for the recomputation)", shape(("b", "s", "h"), sizes),
                roles["act"])


def _layer_types(cfg: dict) -> tuple:
    """Each layer's attention type; a family without layer_types (Starcoder2) slides in every layer when
    sliding_window is set."""
    if cfg.get("layer_types"):
        return tuple(cfg["layer_types"])
    kind = "sliding_attention" if cfg.get("sliding_window") is not None else "full_attention"
    return (kind,) * count_layers(cfg)


def _windowed(cfg: dict, fam: ActivationRules, attention: str, seq_len: int) -> bool:
    """A sliding layer's window is a mask sdpa must take: the sequence is as long as the window or longer
    (masking_utils._ignore_causal_mask_sdpa skips the mask only while kv_length < local_attention_size)."""
    window = cfg.get("sliding_window")
    return (fam.window_layers and attention == "sdpa" and fam.sdpa and window is not None and seq_len >= window
            and "sliding_attention" in _layer_types(cfg))


def _chunk_masked(cfg: dict, kind: str, attention: str, seq_len: int) -> bool:
    """A Llama 4 chunked layer under sdpa once the sequence is a chunk long or longer: create_chunked_causal_mask
    then gives sdpa a mask (masking_utils._ignore_causal_mask_sdpa skips it only while kv_length < local_size), which
    it keeps as a float bias, with k and v repeated to every query head (as a sliding window's mask does)."""
    chunk = cfg.get("attention_chunk_size")
    return ("chunked" in kind.split() and attention == "sdpa" and chunk is not None and seq_len >= chunk)


def _window_conditions(cond: dict) -> dict:
    out = Conditions(cond)
    out.update({"window_mask": True, "fused_cache": False, "fused_k_nocache": False, "fused_v_nocache": False,
                "fused_v_view": False})
    return out


def _window_layers(cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora, shape=_shape, moe=None):
    """(first, later): the kept tensors of a sliding layer whose window masks sdpa, or None when none does."""
    fam = FAMILIES[cfg["model_type"]]
    if not _windowed(cfg, fam, attention, seq_len):
        return None
    sizes = layer_sizes(cfg, micro_batch, seq_len, int((lora or {}).get("r") or 0), attention, moe=moe)
    cond = _window_conditions(layer_conditions(cfg, fam, attention, checkpointing, micro_batch, precision, lora))
    roles = role_dtypes(precision, dtypes)
    _quantized_base(cond, roles, dtypes)
    w = trainable_flags(fam, lora)
    parallel = _parallel(cfg)
    rows = layer_rows(cfg["model_type"], _act(cfg), parallel)
    # (under full checkpointing enable_input_require_grads makes the first layer's input need a gradient, as
    # hf_act_saved._evaluate's embed_out: a sliding first layer's recomputation then keeps its norms' inputs too)
    first = _grads(fam, w, w["W:embed"] or checkpointing == "full", parallel)
    later = _grads(fam, w, first["out"], parallel)
    return (_resolve(rows, cond, roles, sizes, {**w, **first}, shape),
            _resolve(rows, cond, roles, sizes, {**w, **later}, shape))


def _layer_blocks(cfg: dict, layers: int, layer0: list, layer1: list, window) -> list:
    """The layers in order as Blocks, consecutive equal ones merged (one block when every layer keeps the same)."""
    types = _layer_types(cfg)
    out: list = []
    for i in range(layers):
        sliding = window is not None and i < len(types) and types[i] == "sliding_attention"
        kept = (window[0] if i == 0 else window[1]) if sliding else (layer0 if i == 0 else layer1)
        if out and out[-1].kept == kept:
            out[-1] = Block("layer", out[-1].count + 1, kept)
        else:
            out.append(Block("layer", 1, kept))
    return out


# CLIP's encoder layer (modeling_clip.py CLIPEncoderLayer): layer_norm1, attention (q/k/v/out_proj with biases, no
# mask, no cache), residual, layer_norm2, fc1, activation (quick_gelu), fc2, residual
def _t5_sizes(cfg: dict, micro_batch: int, seq_len: int, target_len: int | None, rank: int = 0) -> dict:
    n = hf_encdec.dims(cfg)
    s = target_len or seq_len
    q = n["H"] * n["d"]
    return {"b": micro_batch, "s": s, "h": n["h"], "i": n["i"], "i2": 2 * n["i"], "H": n["H"], "KV": n["H"],
            "d": n["d"], "dk": n["d"], "r": 0, "q": q, "kv": q, "qkv": 3 * q, "rot": 0, "V": n["V"],
            "T": micro_batch * s, "Tl": micro_batch * s, "E": 0, "k": 0, "S": 0, "R": rank, "R2": 2 * rank,
            "se": seq_len, "Te": micro_batch * seq_len}

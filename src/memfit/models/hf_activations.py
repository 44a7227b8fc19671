"""What autograd saves for backward in one training step of a transformers model: closed form per layer kind.

Each block lists the distinct storages autograd keeps (each once, under the first op that keeps it), with a
symbolic shape; `saved()` evaluates them for one config. Nothing here is per element: a 70B config costs the same
as a tiny one. The per-op rules are the tables below (NORMS, ACTIVATIONS, the attention kernels, FAMILIES) and
were read off transformers 5.24 / torch 2.13 and checked against a real step (tests/test_transformers_activations.py,
docs/transformer-activations.md).

Dtype roles in the tables, resolved per precision recipe by `_dtypes`:
  act   the activation dtype (the parameters' dtype under *-true; under *-mixed what the op produces)
  lin   a linear layer's output (the low dtype under autocast, else act)
  f32   kept in float32 whatever the recipe (norm statistics and upcasts, softmax under upcast, the loss)
  i64, i32, bool   index tensors, offsets, dropout masks (one byte per element, as CUDA's fused dropout keeps them)
"""

from __future__ import annotations

from math import prod
from typing import NamedTuple


class Kept(NamedTuple):
    label: str
    shape: tuple
    dtype: str


class Block(NamedTuple):
    name: str
    count: int
    kept: list


class K(NamedTuple):
    """A table row: what one op keeps. `when` names a condition (see `_conditions`); `alias` names a row that is the
    same storage whenever both resolve to the same dtype (then this row is not counted again)."""

    op: str
    what: str
    shape: tuple
    role: str
    when: str | None = None
    alias: str | None = None


WIDTH = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4, "bool": 1}
PRECISIONS = ("32-true", "bf16-true", "16-true", "bf16-mixed", "16-mixed")
ATTENTIONS = ("eager", "sdpa", "flash")
CHECKPOINTING = ("none", "full", "selective")

# ---------------------------------------------------------------------------------------------------------------
# Op rules. Shapes use the symbols of `_sizes`: b batch, s sequence, h hidden, i intermediate, H/KV heads, d head
# dim, q = H*d, kv = KV*d, qkv = q + 2*kv, i2 = 2*i, r rotary dims, V vocab, T = b*s tokens, E experts, k experts
# per token, S = T*k routed tokens.

# HF RMSNorm (llama and relatives): upcast to fp32, x * rsqrt(mean(x^2)+eps), cast back, then weight * that.
# pow and mul keep the fp32 input (the input itself when it is fp32), mul keeps 1/rms, weight* keeps the cast-back
# normalized tensor. Gemma multiplies by (1 + weight) in fp32 before the cast: it keeps fp32 normalized and 1+w.
# nn.LayerNorm (native_layer_norm) keeps its input, mean and 1/std (fp32 statistics).
NORMS = {
    "rms": lambda n, x: [
        K(n, "input, upcast to fp32 (in fp32 the input itself)", x, "f32"),
        K(n, "1/rms", x[:-1] + (1,), "f32"),
        K(n, "normalized, cast back to the input dtype (weight * it)", x, "act"),
    ],
    "gemma_rms": lambda n, x: [
        K(n, "input, upcast to fp32", x, "f32"),
        K(n, "1/rms", x[:-1] + (1,), "f32"),
        K(n, "normalized (fp32)", x, "f32"),
        K(n, "1 + weight (fp32)", (x[-1],), "f32"),
    ],
    "layer": lambda n, x: [
        K(n, "input", x, "act"),
        K(n, "mean", x[:-1] + (1,), "f32"),
        K(n, "1/std", x[:-1] + (1,), "f32"),
    ],
}

# Activation functions: what each keeps beyond its input (None: not even the input; relu keeps its result, which
# the next op keeps anyway). gelu_new is a Python expression: x^3 and tanh keep x, tanh's result, 0.5*x and 1+tanh.
ACTIVATIONS = {
    "silu": [], "swish": [], "gelu": [], "gelu_pytorch_tanh": [], "gelu_fast": None, "relu": None,
    "gelu_new": [("tanh(...) result", "act"), ("0.5 * x", "act"), ("1 + tanh(...)", "act")],
}
ACTIVATIONS["gelu_fast"] = ACTIVATIONS["gelu_new"]
ACTIVATIONS["relu"] = None


def _activation(name: str, op: str, shape: tuple) -> list:
    rule = ACTIVATIONS[name]
    if rule is None:
        return []
    rows = [K(op, "input (the projection's output)", shape, "lin")]
    rows += [K(op, what, shape, role) for what, role in rule]
    return rows


class Family(NamedTuple):
    norm: str                 # NORMS key
    qkv: str                  # "separate" | "fused" (one projection; q, k, v are slices of it)
    rope: str | None          # "full" (elementwise: q keeps its (b,s,H,d) layout) | "partial" (a cat copy) | None
    mlp: str                  # "gated" | "gated_fused" | "plain" | "moe"
    act_key: str              # config key naming the activation function
    cache: bool               # the model builds a DynamicCache in a training step (decoders, use_cache)
    qk_norm: bool = False
    embed_extra: tuple = ()   # extra index tensors in the embeddings ("positions", "token_types")
    embed_norm: bool = False  # a norm (and dropout) right after the embeddings (BERT)
    post_norm: bool = False   # BERT: the norm comes after each residual add
    parallel_key: str | None = None   # GPT-NeoX: attention and MLP read the same input
    dropout_keys: tuple = ()  # (dropout, config key) pairs: which key sets the embd, attn and resid dropouts
    head: str = "causal"      # "causal" | "mlm"
    softmax_fp32: bool = True  # eager softmax upcast to fp32 (dtype=torch.float32) before the cast back


LLAMA = Family("rms", "separate", "full", "gated", "hidden_act", True, dropout_keys=(("attn", "attention_dropout"),))
FAMILIES = {
    "llama": LLAMA,
    "mistral": LLAMA,
    "qwen2": LLAMA,
    "qwen3": LLAMA._replace(qk_norm=True),
    "gemma": LLAMA._replace(norm="gemma_rms"),
    "mixtral": LLAMA._replace(mlp="moe"),
    "phi3": LLAMA._replace(qkv="fused", rope="partial", mlp="gated_fused",
                           dropout_keys=(("attn", "attention_dropout"), ("resid", "resid_pdrop"), ("embd", "embd_pdrop"))),
    "gpt2": Family("layer", "fused", None, "plain", "activation_function", True, embed_extra=("positions",),
                   dropout_keys=(("embd", "embd_pdrop"), ("attn", "attn_pdrop"), ("resid", "resid_pdrop")),
                   softmax_fp32=False),
    "gpt_neox": Family("layer", "fused", "partial", "plain", "hidden_act", True, parallel_key="use_parallel_residual",
                       dropout_keys=(("attn", "attention_dropout"), ("resid", "hidden_dropout"), ("embd", "hidden_dropout"))),
    "bert": Family("layer", "separate", None, "plain", "hidden_act", False, embed_extra=("token_types",),
                   embed_norm=True, post_norm=True, head="mlm", softmax_fp32=False,
                   dropout_keys=(("attn", "attention_probs_dropout_prob"), ("resid", "hidden_dropout_prob"),
                                 ("embd", "hidden_dropout_prob"))),
}
SUPPORTED = tuple(FAMILIES)


def _attention(fam: Family) -> list:
    """The attention sub-block, all kernels; `_conditions` picks the rows that apply."""
    X = ("b", "s", "h")
    rows = [K("q_proj/k_proj/v_proj" if fam.qkv == "separate" else "qkv_proj", "input", ("T", "h"), "act")]
    if fam.qk_norm:
        # per-head RMSNorm on q_proj's and k_proj's outputs (in fp32, the upcast is those outputs themselves)
        rows += NORMS[fam.norm]("q_norm", ("b", "s", "H", "d")) + NORMS[fam.norm]("k_norm", ("b", "s", "KV", "d"))
    # rotary: q*cos + rotate_half(q)*sin keeps only cos and sin, shared by every layer (counted with the embeddings)
    # eager: q @ k^T keeps q and k (k repeated to all heads when grouped), softmax its result, p @ v keeps p and v
    rows += [
        K("q @ k^T", "q", ("b", "H", "s", "d"), "lin", "eager_q"),
        K("q @ k^T", "q (a view of the fused qkv output: one sequence folds without a copy)", ("b", "s", "qkv"), "lin",
          "eager_q_view"),
        K("q @ k^T", "k (repeated to every query head)", ("b", "H", "s", "d"), "lin", "eager_kv"),
        K("softmax", "probabilities" + (" (fp32)" if fam.softmax_fp32 else ""), ("b", "H", "s", "s"),
          "f32" if fam.softmax_fp32 else "soft", "eager_core"),
        K("dropout", "mask", ("b", "H", "s", "s"), "bool", "eager_attn_dropout"),
        K("p @ v", "dropped-out probabilities", ("b", "H", "s", "s"), "soft_lo", "eager_attn_dropout"),
        K("p @ v", "probabilities, cast to the value dtype", ("b", "H", "s", "s"), "soft_lo", "eager_core_no_dropout",
          alias="probabilities" + (" (fp32)" if fam.softmax_fp32 else "")),
        K("p @ v", "v (repeated to every query head)", ("b", "H", "s", "d"), "lin", "eager_kv"),
        K("o_proj", "input (heads merged: a copy)", ("T", "q"), "lin", "eager"),
    ]
    # fused kernels (SDPA's flash/efficient, flash-attn): q, k, v at their own head counts, output, log-sum-exp
    fused_q = ("b", "s", "qkv") if fam.qkv == "fused" and not fam.rope else ("b", "H", "s", "d")
    rows += [
        K("attention", "q" if fused_q[-1] != "qkv" else "q (a view of the fused qkv output)", fused_q, "lin", "fused"),
        K("attention", "k (the cache's copy)", ("b", "KV", "s", "d"), "lin", "fused_cache"),
        K("attention", "v (the cache's copy)", ("b", "KV", "s", "d"), "lin", "fused_cache"),
        K("attention", "k", ("b", "KV", "s", "d"), "lin", "fused_k_nocache"),
        K("attention", "v", ("b", "KV", "s", "d"), "lin", "fused_v_nocache"),
        K("attention", "v (a view of the fused qkv output)", ("b", "s", "qkv"), "lin", "fused_v_view"),
        K("attention", "output", ("b", "s", "H", "d"), "lin", "fused"),
        K("attention", "log-sum-exp (fp32)", ("b", "H", "s"), "f32", "fused"),
        K("attention", "RNG state (flash-attn)", (2,), "i64", "flash"),
        K("o_proj", "input (a copy: SDPA on CPU returns (b,H,s,d) for a contiguous q)", ("T", "q"), "lin", "sdpa_o_copy"),
        K("dropout", "mask", X, "bool", "resid_dropout"),
    ]
    return rows


def _mlp(fam: Family, act: str) -> list:
    X = ("b", "s", "h")
    if fam.mlp == "gated":
        return [K("gate_proj/up_proj", "input", ("T", "h"), "act")] + _activation(act, "act_fn(gate)", ("b", "s", "i")) + [
            K("act * up", "act_fn(gate)", ("b", "s", "i"), "lin"),
            K("act * up", "up", ("b", "s", "i"), "lin"),
            K("down_proj", "input", ("T", "i"), "lin"),
        ]
    if fam.mlp == "gated_fused":
        return [K("gate_up_proj", "input", ("T", "h"), "act"),
                K("act_fn(gate), * up", "gate_up output (gate and up are halves of it)", ("b", "s", "i2"), "lin"),
                K("act * up", "act_fn(gate)", ("b", "s", "i"), "lin"),
                K("down_proj", "input", ("T", "i"), "lin"),
                K("dropout", "mask", X, "bool", "resid_dropout")]
    if fam.mlp == "plain":
        return [K("fc_in", "input", ("T", "h"), "act")] + _activation(act, "act", ("b", "s", "i")) + [
            K("fc_out", "input (the activation's output)", ("T", "i"), "lin"),
            K("dropout", "mask", X, "bool", "resid_dropout"),
        ]
    # Mixtral: a router, then every routed (token, expert) pair through one grouped matmul (transformers 5.24
    # `grouped_mm` experts): sorted by expert, gathered, gate_up, act * up, down, times the routing weight, unsorted.
    return [
        K("router", "input", ("T", "h"), "act"),
        K("router softmax", "probabilities (fp32)", ("T", "E"), "f32"),
        K("router top-k", "indices", ("T", "k"), "i64"),
        K("routing weights / sum", "sum (fp32)", ("T", 1), "f32"),
        K("routing weights / sum", "weights (fp32)", ("T", "k"), "f32"),
        K("gather by expert", "token index", ("S",), "i64"),
        K("gather weights", "permutation", ("S",), "i64"),
        K("grouped_mm", "group offsets", ("E",), "i32"),
        K("grouped_mm gate_up", "routed tokens (one row per chosen expert)", ("S", "h"), "act"),
        K("act_fn(gate), * up", "gate_up output", ("S", "i2"), "lin"),
        K("act * up", "act_fn(gate)", ("S", "i"), "lin"),
        K("grouped_mm down", "input", ("S", "i"), "lin"),
        K("* routing weight", "expert output", ("S", "h"), "lin"),
        K("* routing weight", "routing weight column (fp32)", ("S", 1), "f32"),
        K("unsort", "inverse permutation", ("S",), "i64"),
    ]


def layer_rows(model_type: str, act: str | None = None, parallel: bool = True) -> list:
    """The symbolic table of one layer: every row any kernel/config may keep (conditions unevaluated)."""
    fam = FAMILIES[model_type]
    act = act or {"gpt2": "gelu_new", "bert": "gelu", "gpt_neox": "gelu", "gemma": "gelu_pytorch_tanh"}.get(model_type, "silu")
    X = ("b", "s", "h")
    norm = NORMS[fam.norm]
    if fam.post_norm:   # BERT: attention, add, norm; MLP, add, norm (the output is the next layer's input)
        attention = _attention(fam)
        attention[0] = attention[0]._replace(what="input (the previous layer's output)")
        mlp = _mlp(fam, act)
        return (attention
                + [K("attention.output", "add & norm: " + r.what, r.shape, r.role) for r in norm("LayerNorm", X)]
                + [mlp[0]._replace(what="input (the norm's output)")] + mlp[1:]
                + [K("output", "add & norm: " + r.what, r.shape, r.role) for r in norm("LayerNorm", X)])
    first = norm("input_layernorm", X)
    second = norm("post_attention_layernorm", X)
    if parallel and fam.parallel_key:   # both norms read the layer input: its storage is kept once
        second = [r for r in second if not r.what.startswith("input")]
    attention = _attention(fam)
    attention[0] = attention[0]._replace(what="input (the norm's output)")
    mlp = _mlp(fam, act)
    mlp[0] = mlp[0]._replace(what="input (the norm's output)")
    return first + attention + second + mlp


def _embedding_rows(fam: Family) -> list:
    rows = [K("embed_tokens", "input ids", ("b", "s"), "i64")]
    if "positions" in fam.embed_extra:
        rows.append(K("position embedding", "position ids", (1, "s"), "i64"))
    if "token_types" in fam.embed_extra:
        rows.append(K("token_type embedding", "token type ids (gathered from the buffer)", (1, "s"), "i64"))
    if fam.embed_norm:
        rows += NORMS[fam.norm]("LayerNorm", ("b", "s", "h"))
    rows.append(K("dropout", "mask", ("b", "s", "h"), "bool", "embd_dropout"))
    if fam.rope:
        rows += [K("rotary", "cos (shared by every layer)", (1, "s", "r"), "act"),
                 K("rotary", "sin (shared by every layer)", (1, "s", "r"), "act")]
    return rows


def _head_rows(fam: Family) -> list:
    X = ("b", "s", "h")
    if fam.head == "mlm":   # BertForMaskedLM: dense, activation, LayerNorm, decoder
        norm = NORMS[fam.norm]("transform.LayerNorm", X)
        return ([K("transform.dense", "input (the last layer's output)", ("T", "h"), "act")]
                + _activation("gelu", "transform.act", X)
                + [norm[0]._replace(what="input (the activation's output)", role="lin")] + norm[1:]
                + [K("decoder", "input (the norm's output)", ("T", "h"), "act")])
    return NORMS[fam.norm]("final norm", X) + [K("lm_head", "input (the norm's output)", ("T", "h"), "act")]


LOSS_ROWS = [
    K("cross-entropy", "log-softmax of the logits (fp32)", ("T", "V"), "f32"),
    K("cross-entropy", "targets (labels padded by one and shifted: one sequence keeps the padded storage)", ("Tl",),
      "i64", "causal"),
    K("cross-entropy", "targets (the labels)", ("T",), "i64", "mlm"),
    K("cross-entropy", "total weight", (), "f32"),
]

# ---------------------------------------------------------------------------------------------------------------


def _sizes(cfg: dict, micro_batch: int, seq_len: int) -> dict:
    mt = cfg["model_type"]
    h = cfg["n_embd"] if mt == "gpt2" else cfg["hidden_size"]
    heads = cfg["n_head"] if mt == "gpt2" else cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    d = cfg.get("head_dim") or h // heads
    if mt == "gpt2":
        inter = cfg.get("n_inner") or 4 * h
    else:
        inter = cfg["intermediate_size"]
    rope = cfg.get("rope_parameters") or {}
    rotary = int(d * rope.get("partial_rotary_factor", 1.0)) if FAMILIES[mt].rope else 0
    tokens = micro_batch * seq_len
    k = cfg.get("num_experts_per_tok", 0)
    return {"b": micro_batch, "s": seq_len, "h": h, "i": inter, "i2": 2 * inter, "H": heads, "KV": kv_heads, "d": d,
            "q": heads * d, "kv": kv_heads * d, "qkv": heads * d + 2 * kv_heads * d, "r": rotary,
            "V": cfg["vocab_size"], "T": tokens,
            "Tl": tokens if micro_batch > 1 else seq_len + 1, "E": cfg.get("num_local_experts", 0), "k": k, "S": tokens * k}


def _drop(cfg: dict, fam: Family, which: str) -> bool:
    key = dict(fam.dropout_keys).get(which)
    return bool(key and (cfg.get(key) or 0) > 0)


def _conditions(cfg: dict, fam: Family, attention: str, checkpointing: str, micro_batch: int) -> dict:
    eager = attention == "eager"
    fused = not eager
    cache = fam.cache and bool(cfg.get("use_cache", True)) and checkpointing != "full"
    attn_drop = _drop(cfg, fam, "attn")
    # q stays a (b,s,H,d)-strided view unless partial rotary rebuilds it with a cat; SDPA on CPU returns the output
    # in q's layout, so a contiguous q makes o_proj's input a copy (CUDA's kernels return (b,s,H,d) either way)
    q_contiguous = fam.rope == "partial"
    core = eager and checkpointing != "selective"
    # GPT-2's q, k, v are strided views of one qkv output; matmul folds (b, H) into one batch dim, which copies them
    # unless b == 1 (then q's view keeps the whole qkv output, and k, v without the cache are views of it too)
    qkv_views = fam.qkv == "fused" and not fam.rope and micro_batch == 1
    return {
        None: True,
        "eager": eager,
        "eager_q": eager and not qkv_views,
        "eager_q_view": eager and qkv_views,
        "eager_kv": eager and (cache or not qkv_views),
        "eager_core": core,
        "eager_attn_dropout": core and attn_drop,
        "eager_core_no_dropout": core and not attn_drop,
        "fused": fused,
        "fused_cache": fused and cache,
        "fused_k_nocache": fused and not cache and not (fam.qkv == "fused" and not fam.rope),
        "fused_v_nocache": fused and not cache and fam.qkv == "separate",
        "fused_v_view": fused and not cache and fam.qkv == "fused" and bool(fam.rope),
        "flash": attention == "flash",
        "causal": fam.head == "causal",
        "mlm": fam.head == "mlm",
        "sdpa_o_copy": attention == "sdpa" and q_contiguous,
        "resid_dropout": _drop(cfg, fam, "resid"),
        "embd_dropout": _drop(cfg, fam, "embd"),
    }


def _dtypes(precision: str, dtypes: dict | None) -> dict:
    low = {"bf16-true": "bfloat16", "16-true": "float16", "bf16-mixed": "bfloat16", "16-mixed": "float16"}.get(
        precision, "float32")
    if precision.endswith("-true"):
        act = lin = soft = soft_lo = low
    elif precision.endswith("-mixed"):
        # autocast: linears and matmuls run low; norms, softmax and the residual stream stay fp32
        act, lin, soft, soft_lo = "float32", low, "float32", "float32"
    else:
        act = lin = soft = soft_lo = "float32"
    roles = {"act": act, "lin": lin, "soft": soft, "soft_lo": soft_lo, "f32": "float32", "i64": "int64",
             "i32": "int32", "bool": "bool"}
    if dtypes and dtypes.get("activations"):
        forced = dtypes["activations"]
        for role in ("act", "lin", "soft", "soft_lo"):
            roles[role] = forced
    return roles


def _resolve(rows: list, cond: dict, roles: dict, sizes: dict) -> list:
    kept, by_what = [], {}
    for r in rows:
        if not cond[r.when]:
            continue
        dtype = roles[r.role]
        if r.alias is not None and by_what.get(r.alias) == dtype:
            continue
        by_what[r.what] = dtype
        shape = tuple(sizes[x] if isinstance(x, str) else x for x in r.shape)
        kept.append(Kept(f"{r.op}: {r.what}", shape, dtype))
    return kept


def check(cfg: dict, attention: str, checkpointing: str, precision: str) -> None:
    if cfg.get("model_type") not in FAMILIES:
        raise ValueError(f"unsupported model_type {cfg.get('model_type')!r}; supported: {', '.join(SUPPORTED)}")
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}")
    if checkpointing not in CHECKPOINTING:
        raise ValueError(f"checkpointing must be one of {CHECKPOINTING}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}")


def saved(cfg: dict, *, micro_batch: int, seq_len: int, attention: str = "sdpa", checkpointing: str = "none",
          precision: str = "32-true", dtypes: dict | None = None, lora: dict | None = None) -> list:
    """Blocks in forward order: embeddings, layer (x num_hidden_layers), head, loss; each lists its kept storages.

    With checkpointing "full" the layer block holds what stays saved through the forward (each layer's input);
    `peak_saved` adds one layer's recomputation."""
    check(cfg, attention, checkpointing, precision)
    mt = cfg["model_type"]
    fam = FAMILIES[mt]
    sizes = _sizes(cfg, micro_batch, seq_len)
    cond = _conditions(cfg, fam, attention, checkpointing, micro_batch)
    roles = _dtypes(precision, dtypes)
    layers = cfg["n_layer"] if mt == "gpt2" else cfg["num_hidden_layers"]
    embeddings = _resolve(_embedding_rows(fam), cond, roles, sizes)
    layer = _resolve(layer_rows(mt, _act(cfg), _parallel(cfg)), cond, roles, sizes)
    if checkpointing == "full":
        layer = [_boundary(fam, roles, sizes)]
    head = _resolve(_head_rows(fam), cond, roles, sizes)
    loss = _resolve(LOSS_ROWS, cond, roles, sizes)
    return [Block("embeddings", 1, embeddings), Block("layer", layers, layer), Block("head", 1, head),
            Block("loss", 1, loss)]


def _act(cfg: dict) -> str:
    return cfg.get(FAMILIES[cfg["model_type"]].act_key) or "gelu"


def _parallel(cfg: dict) -> bool:
    key = FAMILIES[cfg["model_type"]].parallel_key
    return bool(cfg.get(key, True)) if key else False


def _boundary(fam: Family, roles: dict, sizes: dict) -> Kept:
    return Kept("checkpoint: the layer's input (kept for the recomputation)", (sizes["b"], sizes["s"], sizes["h"]),
                roles["act"])


def nbytes(kept: list) -> int:
    return sum(prod(k.shape) * WIDTH[k.dtype] for k in kept)


def total(blocks: list) -> int:
    return sum(b.count * nbytes(b.kept) for b in blocks)


def peak_saved(cfg: dict, *, micro_batch: int, seq_len: int, attention: str = "sdpa", checkpointing: str = "none",
               precision: str = "32-true", dtypes: dict | None = None, lora: dict | None = None) -> int:
    """The peak of live saved bytes during the step. Without full checkpointing everything saved is live at the end
    of the forward. With it: the embeddings and every layer's input stay saved; then either the head and loss (end
    of the forward) or one layer's recomputation (in the backward, after the head and loss are released)."""
    blocks = saved(cfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention, checkpointing=checkpointing,
                   precision=precision, dtypes=dtypes, lora=lora)
    if checkpointing != "full":
        return total(blocks)
    emb, layer, head, loss = blocks
    boundary = layer.kept[0]
    recomputed = _resolve(layer_rows(cfg["model_type"], _act(cfg), _parallel(cfg)),
                          _conditions(cfg, FAMILIES[cfg["model_type"]], attention, "full", micro_batch),
                          _dtypes(precision, dtypes), _sizes(cfg, micro_batch, seq_len))
    one_layer = nbytes(recomputed)
    first = recomputed[0]
    if first.dtype == boundary.dtype and prod(first.shape) == prod(boundary.shape):
        one_layer -= nbytes([boundary])   # the recomputed layer's input is the boundary itself
    kept = nbytes(emb.kept) + layer.count * nbytes(layer.kept)
    return kept + max(nbytes(head.kept) + nbytes(loss.kept), one_layer)

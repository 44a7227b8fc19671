"""What autograd saves for backward in one training step of a transformers model: closed form per layer kind.

Each block lists the distinct storages autograd keeps (each once, under the first op that keeps it) with its shape
and dtype; `saved()` evaluates the symbolic tables below for one config. Nothing is per element: a 70B config costs
the same as a tiny one. The rules were read off transformers 5.24, torch 2.13 and peft 0.21 and are checked against
a real step on CPU (tests/models/test_transformers_activations.py; docs/transformer-activations.md prints the tables).

A table row (`K`) says: this op keeps this tensor, of this symbolic shape, in this dtype *role*, under this static
condition (`when`: attention kernel, dropout on, cache, autocast...), provided one of the listed gradient flags is
set (`needs`: autograd only keeps what some gradient needs; a frozen weight's op keeps no input for it). A row that
names a `source` is that source's storage when both resolve to the same dtype (no cast happened), a copy otherwise.

Dtype roles, resolved per precision recipe by `_roles`:
  act    the model's dtype: the residual stream, norms' in/outputs (fp32 under *-mixed: autocast leaves them)
  lin    what a matmul produces (the low dtype under *-true and *-mixed)
  soft   eager attention's softmax result where the model does not upcast it (fp32 under autocast, where GPT-2's
         fp32 causal mask promotes the scores; BERT's unmasked softmax stays low: it uses `lin`)
  low    a copy autocast makes for a matmul (the low dtype under *-mixed; act otherwise)
  ada    a LoRA adapter's dtype (fp32: peft upcasts adapters on a 16-bit base); ada_low: what the adapter's matmul
         keeps (the autocast copy under *-mixed, else ada)
  f32, i64, i32, bool   fixed: statistics and upcasts, indices, offsets, dropout masks (1 byte, as CUDA keeps them)
"""

from __future__ import annotations


from functools import lru_cache
from math import prod
from typing import NamedTuple

from memfit.models import hf_encdec


class Kept(NamedTuple):
    label: str
    shape: tuple
    dtype: str


class Block(NamedTuple):
    name: str
    count: int
    kept: list


class K(NamedTuple):
    op: str
    what: str
    shape: tuple
    role: str
    when: str | None = None
    needs: tuple = ()
    source: str | None = None

    @property
    def label(self) -> str:
        return f"{self.op}: {self.what}"

    @property
    def alias(self) -> str | None:
        """The `what` of the source row (sources are named by label; a row's label is "op: what")."""
        return None if self.source is None else self.source.split(": ", 1)[1]


def _and(*names) -> str | None:
    """Conditions combine as "a&b" (a string, so a row's `when` indexes the conditions table directly)."""
    names = [n for n in names if n]
    return "&".join(names) or None


class Conditions(dict):
    """Named static conditions; "a&b" holds when both do."""

    def __missing__(self, key):
        if isinstance(key, str) and "&" in key:
            return all(self[k] for k in key.split("&"))
        raise KeyError(key)


PRECISIONS = ("32-true", "bf16-true", "16-true", "bf16-mixed", "16-mixed")
ATTENTIONS = ("eager", "sdpa", "flash")
CHECKPOINTING = ("none", "full", "selective")
LOW = {"bf16-true": "bfloat16", "16-true": "float16", "bf16-mixed": "bfloat16", "16-mixed": "float16"}
TRUE_DTYPE = {"32-true": "float32", "bf16-true": "bfloat16", "16-true": "float16"}   # what every activation is in

# Shape symbols (see `_sizes`): b batch, s sequence, h hidden, i intermediate, i2 = 2i, H / KV query / key-value
# heads, d head dim, q = H*d, kv = KV*d, qkv = q + 2kv, rot rotary dims, V vocab, T = b*s tokens, Tl the stored
# targets, E experts, k experts per token, S = T*k routed tokens, R LoRA rank; s1 = s + 1 (gpt-oss's sink column),
# rh = rot / 2 (gpt-oss's cos/sin).

# ------------------------------------------------------------------------------------------------- op rules

# Norms, given their input's flag `f` and role. HF RMSNorm upcasts to fp32, multiplies by 1/rms, casts back, then
# weight * that: pow and mul keep the fp32 input (the input itself when already fp32) and 1/rms (if the input needs
# a gradient); weight * keeps the cast-back tensor only when the weight trains. Gemma keeps fp32 normalized and
# (1 + weight) instead. nn.LayerNorm (one op) keeps input, mean and 1/std when anything needs a gradient.
def _norm(kind: str, n: str, x: tuple, f: str, role: str = "act") -> list:
    stat = x[:-1] + (1,)
    if kind == "rms":
        return [K(n, "input, upcast to fp32 (in fp32 the input itself)", x, "f32", needs=(f,)),
                K(n, "1/rms", stat, "f32", needs=(f,)),
                K(n, "normalized, cast back to the input dtype (weight * it)", x, role, needs=("W:norm",))]
    if kind == "gemma_rms":
        return [K(n, "input, upcast to fp32", x, "f32", needs=(f,)),
                K(n, "1/rms", stat, "f32", needs=(f,)),
                K(n, "normalized (fp32; (1 + weight) * it)", x, "f32", needs=("W:norm",)),
                K(n, "1 + weight (fp32)", (x[-1],), "f32", needs=(f,))]
    if kind == "l2":   # Llama 4's qk_norm: RMSNorm without a weight (x.float() * rsqrt(...), cast back)
        return [K(n, "input, upcast to fp32 (in fp32 the input itself)", x, "f32", needs=(f,)),
                K(n, "1/rms", stat, "f32", needs=(f,))]
    if kind == "cohere_ln":   # CohereLayerNorm, written out: (x - mean).pow(2) and (x - mean) * rsqrt(...) each
        # compute x - mean (two storages), rsqrt keeps its result, weight * keeps the normalized tensor (all fp32)
        return [K(n, "x - mean for the variance (fp32; pow keeps it)", x, "f32", needs=(f, "W:norm")),
                K(n, "rsqrt(variance + eps) (fp32)", stat, "f32", needs=(f, "W:norm")),
                K(n, "x - mean again (fp32; * rsqrt keeps it)", x, "f32", needs=(f,)),
                K(n, "normalized (fp32; weight * it)", x, "f32", needs=("W:norm",))]
    if kind == "olmo_rms":   # OLMo 2: (weight * fp32 normalized).to(input dtype): the product is taken in fp32
        return [K(n, "input, upcast to fp32 (in fp32 the input itself)", x, "f32", needs=(f,)),
                K(n, "1/rms", stat, "f32", needs=(f,)),
                K(n, "normalized (fp32; weight * it, then cast back)", x, "f32", needs=("W:norm",))]
    return [K(n, "input", x, role, needs=(f, "W:norm")),
            K(n, "mean (fp32)", stat, "f32", needs=(f, "W:norm")),
            K(n, "1/std (fp32)", stat, "f32", needs=(f, "W:norm"))]


# Activation functions: what each keeps beyond its input, all on its input's flag (None: not even the input; relu
# keeps its result, which the next op keeps anyway). gelu_new is a Python expression whose pow and tanh keep x,
# tanh's result, 0.5*x and 1+tanh.
ACTIVATIONS = {
    "silu": [], "swish": [], "gelu": [], "gelu_pytorch_tanh": [], "relu": None,
    "gelu_new": ["tanh(...) result", "0.5 * x", "1 + tanh(...)"],
}
ACTIVATIONS["gelu_fast"] = ACTIVATIONS["gelu_new"]
ACTIVATIONS["quick_gelu"] = ["sigmoid(1.702 * x) result"]   # CLIP: x * sigmoid(1.702 * x)


def _activation(name: str, op: str, shape: tuple, f: str, role: str = "lin") -> list:
    rule = ACTIVATIONS[name]
    if rule is None:
        return []
    return [K(op, "input (the projection's output)", shape, role, needs=(f,))] + [K(op, w, shape, role, needs=(f,)) for w in rule]


ROLE = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "qkv": "qkv_proj", "o": "o_proj", "gate": "gate_proj",
        "up": "up_proj", "gate_up": "gate_up_proj", "down": "down_proj", "fc_in": "fc_in", "fc_out": "fc_out",
        "lm_head": "lm_head", "transform": "transform", "norm1": "input_layernorm", "norm2": "post_attention_layernorm",
        "final": "final norm", "sgate": "shared_expert.gate_proj", "sup": "shared_expert.up_proj",
        "sdown": "shared_expert.down_proj", "sg": "shared_expert_gate", "router": "router",
        "qa": "q_a_proj", "qb": "q_b_proj", "kva": "kv_a_proj_with_mqa", "kvb": "kv_b_proj", "score": "classifier"}


def _op(role: str, module: str) -> str:
    """A row's op: the role (stable across families: o_proj, down_proj, fc_in...), with the module path when the
    family spells it differently."""
    return role if module == role or module.endswith("." + role) else f"{role} ({module})"


def _linear(group: list, x: tuple, f: str, low_input: bool = False, source: str | None = None, quantizable: bool = True) -> list:
    """Linears reading one input `x` whose gradient flag is `f`; `group` lists (role, module path, output width).
    The input is kept once if any of their weights trains (`source`: it is that row's storage). Under autocast each
    linear keeps its own low-precision copy of an fp32 input (`low_input`: the input already comes out of a matmul,
    low) and of its weight, the latter whenever the input needs a gradient, frozen or not. A LoRA adapter keeps its
    input (peft casts it to the adapter's fp32 first: a copy per adapter on a 16-bit model), or a dropout mask and
    the dropped copy, and its rank-R output. A `quantizable` linear is a bitsandbytes 4-bit one on a quantized base
    (every linear but the output head and a classifier: transformers' replace_with_bnb_linear): no autocast op, so
    none of its casts are kept (`mixed_base` off, _quantized_base)."""
    base_mixed = "mixed_base" if quantizable else "mixed"
    roles = "/".join(ROLE[r] for r, _, _ in group)
    modules = "/".join([group[0][1]] + [m.rsplit(".", 1)[-1] for _, m, _ in group[1:]])
    names = roles if all(m.endswith(ROLE[r]) for r, m, _ in group) else f"{roles} ({modules})"
    group = [(_op(ROLE[r], m), m, width) for r, m, width in group]
    base = K(names, "input", x, "lin" if low_input else "act", None if low_input else "not_mixed",
             tuple(f"W:{m}" for _, m, _ in group), source)
    rows, key = [base], source or base.label
    for short, m, width in group:
        lora = (f"L:{m}",)
        if not low_input:
            rows.append(K(short, "input, cast to the low dtype by autocast", x, "low", base_mixed, (f"W:{m}",)))
        rows += [
            K(short, "weight, cast to the low dtype by autocast", (width, x[-1]), "low", base_mixed, (f,)),
            K(f"{short}.lora_dropout", "mask", x, "bool", "lora_dropout", ((f"L:{m}", f),)),
            K(f"{short}.lora_A", "dropped-out input", x, "ada_low", "lora_dropout", lora),
            K(f"{short}.lora_A", "input (cast to the adapter dtype when it differs)", x, "ada", "lora_plain", lora, key),
            K(f"{short}.lora_A", "input, cast to the low dtype by autocast", x, "low", "lora_plain_mixed", lora),
            K(f"{short}.lora_A", "weight, cast to the low dtype by autocast", ("R", x[-1]), "low", "lora&mixed",
              ((f"L:{m}", f),)),
            K(f"{short}.lora_B", "input (lora_A's output)", x[:-1] + ("R",), "ada_low", "lora", lora),
            K(f"{short}.lora_B", "weight, cast to the low dtype by autocast", (width, "R"), "low", "lora&mixed", lora),
            # DoRA (peft tuners/lora/dora.py DoraLinearLayer.forward): result_dora = (m/|W+BA| - 1) * base_result +
            # m/|W+BA| * lora_B(lora_A(x)) * scaling. The magnitude's gradient keeps both products' other factor (the
            # base layer's output, lora_B's output); magnitude / weight_norm keeps the (detached) norm; the base
            # output's gradient keeps the (1, out) scale. The norm's eye-matrix graph is freed inside the forward.
            K(f"{short}.dora", "base layer's output (the magnitude's gradient)", x[:-1] + (width,), "lin", "dora", lora),
            K(f"{short}.dora", "lora_B's output (the magnitude's gradient)", x[:-1] + (width,), "ada_low", "dora", lora),
            K(f"{short}.dora", "weight norm (magnitude / norm)", (width,), "ada", "dora", lora),
            K(f"{short}.dora", "magnitude / norm (lora_B's output's gradient)", (width,), "ada", "dora", lora),
            K(f"{short}.dora", "magnitude / norm - 1 (the base output's gradient)", (width,), "ada", "dora", ((f"L:{m}", f),)),
        ]
    return rows


class Family(NamedTuple):
    norm: str                 # "rms" | "gemma_rms" | "layer"
    names: dict               # role -> module path inside a layer (or of the head)
    qkv: str                  # "separate" | "fused" (q, k, v are slices of one projection)
    rope: str | None          # "full" (elementwise: q keeps its (b,s,H,d) layout) | "partial" (a cat copy) | None
    mlp: str                  # "gated" | "gated_fused" | "plain" | "moe" | "moe_shared" (Qwen2-MoE: + a shared expert)
    act_key: str              # config key naming the activation function
    cache: bool               # the model builds a DynamicCache in a training step (decoders, use_cache)
    qk_norm: bool = False
    embed_extra: tuple = ()   # extra index tensors in the embeddings ("positions", "token_types")
    post_norm: bool = False   # BERT: norm after each residual add, and a norm after the embeddings
    parallel_key: str | None = None   # GPT-NeoX: attention and MLP read the same input
    dropout_keys: tuple = ()  # (dropout, config key): which key sets the embd, attn and resid dropouts
    head: str = "causal"      # "causal" | "mlm"
    softmax_fp32: bool = True  # eager softmax upcast to fp32 (dtype=torch.float32) then cast to q's dtype
    softmax_role: str = "soft"  # without the upcast: "soft" where an fp32 causal mask promotes the scores (GPT-2), "lin"
    # where nothing does (BERT: CPU autocast leaves softmax in the low dtype; CUDA autocast would upcast it)
    lora_default: tuple = ("q_proj", "v_proj")   # peft 0.21's default target_modules (none for phi3)
    # issue 21's dense decoders (appended; the defaults keep the ten families as they were)
    sandwich: str | None = None   # "pre_post": Gemma 2/3's norm before and after attention and MLP; "post": OLMo 2's
    # norm after each (on the sublayer's output, before the residual add) and none before
    sdpa: bool = True   # False: transformers refuses sdpa (Gemma 2: softcapping); its default there is eager
    qk_norm_full: bool = False   # OLMo 2: q_norm / k_norm over the whole (b, s, H*d) projection, before the head split
    window_layers: bool = False   # layer_types' sliding layers: under sdpa a window shorter than the sequence is a mask
    shared_input: bool = False   # Cohere: one norm, attention and MLP both read its output (out = x + attn + mlp)
    qk_norm_key: str | None = None   # Cohere: q_norm / k_norm only when this config key is true
    lora_experts: bool = True  # peft's all-linear adapts the router and the stacked experts (its v4->v5 MoE mapping)
    routing_dtype: str = "f32"  # the role of the routing weights the experts multiply by (Qwen-MoE: cast to the logits')
    llava: bool = False   # LLaVA: a Llama text model; the CLIP vision tower and the projector kept with the embeddings
    falcon: bool = False   # Falcon: its own attention (_falcon_attention) and three layer layouts (models/falcon.py)
    mla: bool = False   # DeepSeek-V3: multi-head latent attention (_mla_attention)
    sinks: bool = False   # gpt-oss: eager attention concatenates a per-head sink logit to the scores (softmax over s + 1
    # columns, in the scores' dtype, after subtracting the row max: its int64 indices kept) and drops it after
    rope_half: bool = False   # gpt-oss: cos and sin are (1, s, d/2) (its _apply_rotary_emb rotates the halves; no cat)
    qwen_vl: bool = False   # Qwen2-VL / Qwen2.5-VL: a Qwen2 text model rotated per sequence (mrope: cos and sin (b, s, d));
    # the vision tower and merger (_qwen_vl_kept) kept with the embeddings


LLAMA_NAMES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
               "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj", "lm_head": "lm_head"}
LLAMA = Family("rms", LLAMA_NAMES, "separate", "full", "gated", "hidden_act", True,
               dropout_keys=(("attn", "attention_dropout"),))
FAMILIES = {
    "llama": LLAMA,
    "mistral": LLAMA,
    "qwen2": LLAMA,
    "qwen3": LLAMA._replace(qk_norm=True),
    "gemma": LLAMA._replace(norm="gemma_rms"),
    "mixtral": LLAMA._replace(mlp="moe"),
    "phi3": LLAMA._replace(qkv="fused", rope="partial", mlp="gated_fused", lora_default=(),
                           names={"qkv": "self_attn.qkv_proj", "o": "self_attn.o_proj", "gate_up": "mlp.gate_up_proj",
                                  "down": "mlp.down_proj", "lm_head": "lm_head"},
                           dropout_keys=(("attn", "attention_dropout"), ("resid", "resid_pdrop"), ("embd", "embd_pdrop"))),
    "gpt2": Family("layer", {"qkv": "attn.c_attn", "o": "attn.c_proj", "fc_in": "mlp.c_fc", "fc_out": "mlp.c_proj",
                             "lm_head": "lm_head", "norm1": "ln_1", "norm2": "ln_2", "final": "transformer.ln_f"},
                   "fused", None, "plain", "activation_function", True, embed_extra=("positions",),
                   dropout_keys=(("embd", "embd_pdrop"), ("attn", "attn_pdrop"), ("resid", "resid_pdrop")),
                   softmax_fp32=False, lora_default=("c_attn",)),
    "gpt_neox": Family("layer", {"qkv": "attention.query_key_value", "o": "attention.dense",
                                 "fc_in": "mlp.dense_h_to_4h", "fc_out": "mlp.dense_4h_to_h", "lm_head": "embed_out",
                                 "final": "gpt_neox.final_layer_norm"},
                       "fused", "partial", "plain", "hidden_act", True, parallel_key="use_parallel_residual",
                       dropout_keys=(("attn", "attention_dropout"), ("resid", "hidden_dropout"), ("embd", "hidden_dropout")),
                       lora_default=("query_key_value",)),
    "bert": Family("layer", {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
                             "o": "attention.output.dense", "fc_in": "intermediate.dense", "fc_out": "output.dense",
                             "transform": "cls.predictions.transform.dense", "lm_head": "cls.predictions.decoder"},
                   "separate", None, "plain", "hidden_act", False, embed_extra=("token_types",), post_norm=True,
                   head="mlm", softmax_fp32=False, softmax_role="lin", lora_default=("query", "value"),
                   dropout_keys=(("attn", "attention_probs_dropout_prob"), ("resid", "hidden_dropout_prob"),
                                 ("embd", "hidden_dropout_prob"))),
    # modeling_roberta.py: BERT's layer; position ids counted from the padding token per sequence and the token
    # types gathered by them, so both are (b, s) int64 the embeddings keep; the masked-LM head is BERT's (lm_head
    # .dense, gelu, lm_head.layer_norm, the decoder); the sequence classifier drops out the first token, then
    # classifier.dense, tanh, dropout, classifier.out_proj (no pooler)
    "roberta": Family("layer", {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
                                "o": "attention.output.dense", "fc_in": "intermediate.dense", "fc_out": "output.dense",
                                "transform": "lm_head.dense", "lm_head": "lm_head.decoder"},
                      "separate", None, "plain", "hidden_act", False, embed_extra=("batch_positions",), post_norm=True,
                      head="mlm", softmax_fp32=False, softmax_role="lin", lora_default=("query", "value"),
                      dropout_keys=(("attn", "attention_probs_dropout_prob"), ("resid", "hidden_dropout_prob"),
                                    ("embd", "hidden_dropout_prob"))),
    # encoder-decoder families: their rows are in models/hf_encdec.py; this entry names their modules (LoRA flags,
    # the ledger's layer parts) and their dropout key
    "t5": Family("rms", dict(hf_encdec.NAMES), "separate", None, "plain", "dense_act_fn", False,
                 dropout_keys=(("attn", "dropout_rate"), ("resid", "dropout_rate"), ("embd", "dropout_rate")),
                 head="seq2seq", softmax_fp32=False, lora_default=("q", "v")),
}
# issue 21: the dense decoders
FAMILIES.update({
    # modeling_gemma2.py: four RMSNorms (1 + weight) per layer, the attention and final logits soft-capped
    # (tanh(x / cap) * cap keeps the tanh's result), no sdpa (Gemma2PreTrainedModel._supports_sdpa = False)
    "gemma2": LLAMA._replace(norm="gemma_rms", act_key="hidden_activation", sandwich="pre_post", sdpa=False),
    # modeling_olmo2.py: no norm before attention or MLP, one after each (on the sublayer's output); q_norm / k_norm
    # over the whole projections; RMSNorm multiplies by the weight in fp32 before casting back
    "olmo2": LLAMA._replace(norm="olmo_rms", sandwich="post", qk_norm=True, qk_norm_full=True),
    # modeling_granite.py: Llama with four scalar multipliers (embeddings, residual branches, attention scale, logits);
    # a product or quotient by a Python number keeps nothing, so what autograd keeps is Llama's
    "granite": LLAMA,
    # modeling_cohere.py: CohereLayerNorm (no bias, written out in fp32), one per layer; attention and MLP in
    # parallel on its output; logits * logit_scale keeps nothing; use_qk_norm adds per-head LayerNorms on q and k
    # modeling_starcoder2.py: Llama's attention with biases, nn.LayerNorm, a plain c_fc / act / c_proj MLP, residual
    # and embedding dropouts; every layer attends through sliding_window when it is set
    "starcoder2": LLAMA._replace(norm="layer", mlp="plain", window_layers=True,
                                 names={**LLAMA_NAMES, "fc_in": "mlp.c_fc", "fc_out": "mlp.c_proj"},
                                 dropout_keys=(("attn", "attention_dropout"), ("resid", "residual_dropout"),
                                               ("embd", "embedding_dropout"))),
    # modeling_smollm3.py: Llama; every no_rope_layer_interval-th layer skips the rotary (NoPE). q and k then stay
    # views of the projections, which the fused kernel keeps in place of the rotated copies: the same bytes
    "smollm3": LLAMA,
    "cohere": LLAMA._replace(norm="cohere_ln", shared_input=True, qk_norm_key="use_qk_norm"),
    # modeling_gemma3.py: Gemma 2's layer (no soft-capping by default, so sdpa runs) with per-head q_norm / k_norm;
    # one rotary embedding per layer type present (global and sliding layers rotate with different bases)
    "gemma3_text": LLAMA._replace(norm="gemma_rms", act_key="hidden_activation", sandwich="pre_post", qk_norm=True,
                                  window_layers=True),
    # modeling_falcon.py: fused query_key_value, FalconLinear (x @ W.T, + bias), nn.LayerNorm, a plain MLP; the layer
    # layout follows parallel_attn / new_decoder_architecture / num_ln_in_parallel_attn (models/falcon.py); rotary or
    # ALiBi; its own attention code (_falcon_attention)
    # modeling_llava.py: the text model is a Llama (LlavaModel.language_model); the vision tower (CLIP) and the
    # projector run first and are kept with the embeddings (_llava_kept)
    "llava": LLAMA._replace(llava=True, lora_default=()),   # (peft has no default target_modules for llava)
    "falcon": Family("layer", {"qkv": "self_attention.query_key_value", "o": "self_attention.dense",
                               "fc_in": "mlp.dense_h_to_4h", "fc_out": "mlp.dense_4h_to_h", "lm_head": "lm_head",
                               "final": "transformer.ln_f"},
                     "fused", "full", "plain", "activation", True, parallel_key="parallel_attn",
                     dropout_keys=(("attn", "attention_dropout"), ("resid", "hidden_dropout")),
                     softmax_fp32=False, lora_default=("query_key_value",), falcon=True),
})
# --- mixtures of experts (issue 21) ---------------------------------------------------------------------------
# Qwen2-MoE / Qwen3-MoE (modeling_qwen2_moe.py, modeling_qwen3_moe.py): Mixtral's router and grouped experts, but
# the top-k weights are renormalized only with norm_topk_prob and cast back to the router logits' dtype; Qwen2-MoE
# adds a shared expert (a gated MLP over every token) scaled by sigmoid(shared_expert_gate(x)). Dense layers
# (mlp_only_layers, decoder_sparse_step) are Llama's gated MLP.
QWEN2_MOE_NAMES = {**LLAMA_NAMES, "sgate": "mlp.shared_expert.gate_proj", "sup": "mlp.shared_expert.up_proj",
                   "sdown": "mlp.shared_expert.down_proj", "sg": "mlp.shared_expert_gate"}
FAMILIES.update({
    # peft 0.21 maps the fused experts for the model types transformers converts from v4 (mixtral, qwen3_moe...), not
    # for qwen2_moe itself: its all-linear adapts the attention and the shared expert only
    "qwen2_moe": LLAMA._replace(mlp="moe_shared", names=QWEN2_MOE_NAMES, lora_default=(), routing_dtype="lin",
                                lora_experts=False),
    "qwen3_moe": LLAMA._replace(mlp="moe", qk_norm=True, lora_default=(), routing_dtype="lin"),
})
# PhiMoE (modeling_phimoe.py): LayerNorms, the router an nn.Linear, sparsemixer's top-2 routing (two masked softmaxes,
# Gumbel sampling, PhimoeMultiplier), then the grouped experts; peft 0.21 maps no fused experts for phimoe
FAMILIES["phimoe"] = LLAMA._replace(norm="layer", mlp="moe_phi", names={**LLAMA_NAMES, "router": "mlp.router"},
                                    lora_default=(), routing_dtype="lin", lora_experts=False)
# DeepSeek-V3 (modeling_deepseek_v3.py): multi-head latent attention (_mla_attention), Llama's dense MLP in the first
# first_k_dense_replace layers, then a sigmoid router with group-limited top-k over n_routed_experts grouped experts
# (the routing weights stay fp32: the router computes in fp32) beside the shared experts (one gated MLP over every
# token); peft 0.21 has no default targets for deepseek_v3 and converts its MoE targets as qwen2_moe's (recipe/lora.py)
DEEPSEEK_NAMES = {"q": "self_attn.q_proj", "qa": "self_attn.q_a_proj", "qb": "self_attn.q_b_proj",
                  "kva": "self_attn.kv_a_proj_with_mqa", "kvb": "self_attn.kv_b_proj", "o": "self_attn.o_proj",
                  "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj",
                  "sgate": "mlp.shared_experts.gate_proj", "sup": "mlp.shared_experts.up_proj",
                  "sdown": "mlp.shared_experts.down_proj", "router": "mlp.gate", "lm_head": "lm_head"}
FAMILIES["deepseek_v3"] = LLAMA._replace(mlp="moe_deepseek", names=DEEPSEEK_NAMES, mla=True, lora_default=())
# gpt-oss (modeling_gpt_oss.py): Llama's attention with biases and sinks (eager only: GptOssPreTrainedModel
# ._supports_sdpa = False, so `attention: sdpa` is the eager run transformers makes by default), GptOssRMSNorm multiplies
# by its weight in fp32 before casting back (OLMo 2's), a biased router (F.linear), top-k then a softmax over the k
# logits, and the grouped experts (integrations/moe.py grouped_mm_experts_forward, the default experts_implementation)
# with biases gathered per routed row and the clamped SwiGLU (_apply_gate); peft 0.21 has no default targets and no
# MoE conversion for gpt_oss: its all-linear adapts q/k/v/o only (the router and experts are not nn.Linear)
FAMILIES["gpt_oss"] = LLAMA._replace(norm="olmo_rms", mlp="moe_oss", sdpa=False, sinks=True, rope_half=True,
                                     lora_default=(), routing_dtype="lin", lora_experts=False)
# Llama 4 text (modeling_llama4.py): Llama's attention, rotated by a complex multiply (freqs_cis) on the rope layers,
# which L2-normalize q and k (use_qk_norm); NoPE layers scale q by attn_scales (attn_temperature_tuning); eager's
# softmax is not upcast; the rope layers attend in chunks (a mask under sdpa once the sequence is longer than a
# chunk). A MoE layer runs every token through every expert, each copy scaled by its sigmoid router score (zero off
# the top-k), plus the shared expert; dense layers run a gated MLP of intermediate_size_mlp
LLAMA4_NAMES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
                "gate": "feed_forward.gate_proj", "up": "feed_forward.up_proj", "down": "feed_forward.down_proj",
                "router": "feed_forward.router", "sgate": "feed_forward.shared_expert.gate_proj",
                "sup": "feed_forward.shared_expert.up_proj", "sdown": "feed_forward.shared_expert.down_proj",
                "lm_head": "lm_head"}
FAMILIES["llama4_text"] = LLAMA._replace(mlp="moe_llama4", names=LLAMA4_NAMES, softmax_fp32=False, lora_default=(),
                                         lora_experts=False)
# Qwen2-VL and Qwen2.5-VL (issue 34; modeling_qwen2_vl.py, modeling_qwen2_5_vl.py): the text model is Qwen2's layer;
# peft 0.21 has no default target_modules for either
FAMILIES["qwen2_vl"] = LLAMA._replace(qwen_vl=True, lora_default=())
FAMILIES["qwen2_5_vl"] = LLAMA._replace(qwen_vl=True, lora_default=())
MOE = ("moe", "moe_shared", "moe_phi", "moe_deepseek", "moe_oss", "moe_llama4")
SUPPORTED = tuple(FAMILIES)
DEFAULT_ACT = {"gpt2": "gelu_new", "bert": "gelu", "gpt_neox": "gelu", "gemma": "gelu_pytorch_tanh",
               "gemma2": "gelu_pytorch_tanh", "gemma3_text": "gelu_pytorch_tanh", "falcon": "gelu"}


def _falcon_attention(fam: Family, n: dict) -> list:
    """FalconAttention.forward (modeling_falcon.py), every path; `_conditions` picks the rows that apply.

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


def _falcon_rows(fam: Family, n: dict, act: str, layout) -> list:
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


def _mla_attention(fam: Family, n: dict) -> list:
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
             kv_norm[0]._replace(when="not_lin32"), *kv_norm[1:]]
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


def _deepseek_moe(fam: Family, n: dict, act: str) -> list:
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


def _attention(fam: Family, n: dict) -> list:
    """Projections, attention (every kernel: `_conditions` picks the rows that apply), output projection."""
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
        *([K("softmax", soft, ("b", "H", "s", "s"), "f32" if fam.softmax_fp32 else fam.softmax_role, "eager_core", ("qk",))]
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


def _mlp(fam: Family, n: dict, act: str) -> list:
    T, X = ("T", "h"), ("b", "s", "h")
    if fam.mlp == "gated":
        return _linear([("gate", n["gate"], "i"), ("up", n["up"], "i")], T, "n2") + _activation(act, "act_fn(gate)", ("b", "s", "i"), "g", "out") + [
            K("act * up", "act_fn(gate)", ("b", "s", "i"), "out", None, ("u",)),
            K("act * up", "up", ("b", "s", "i"), "out", None, ("g",)),
        ] + _linear([("down", n["down"], "h")], ("T", "i"), "p", low_input=True)
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
        # Qwen2-MoE's shared expert over every token, then sigmoid(shared_expert_gate(x)) * its output
        rows = _linear([("sgate", n["sgate"], "is"), ("sup", n["sup"], "is"), ("sg", n["sg"], 1)], T, "n2") + \
            _activation(act, "act_fn(gate) (shared expert)", ("b", "s", "is"), "sh") + [
                K("act * up", "act_fn(gate) (shared expert)", ("b", "s", "is"), "lin", None, ("sh",)),
                K("act * up", "up (shared expert)", ("b", "s", "is"), "lin", None, ("sh",)),
            ] + _linear([("sdown", n["sdown"], "h")], ("T", "is"), "sh", low_input=True) + [
                K("sigmoid", "output (the shared expert's gate)", ("T", 1), "lin", None, ("sgw", "sd")),
                K("gate * shared expert", "shared expert output", ("T", "h"), "lin", None, ("sgw",)),
            ]
        # the router reads the same normalized input as the shared expert: one storage when no cast copies it
        return rows + [r._replace(source=rows[0].label) if r.label == "router: input" else r for r in _experts(fam)]
    if fam.mlp == "moe_phi":
        return _sparsemixer(n) + [r for r in _experts(fam) if not r.op.startswith(("router", "routing weights"))]
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


def _llama4_attention(fam: Family, n: dict, rope: bool, cfg_flags: tuple) -> list:
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
            K(f"sparsemixer ({which})", "softmax of the masked gates", ("T", "E"), "lin", None, ("r",)),
            K(f"sparsemixer ({which})", "softmax max's indices", ("T", 1), "i64", None, ("r",)),
            K(f"sparsemixer ({which})", "chosen probability (PhimoeMultiplier)", ("T", 1), "lin", None, ("r",)),
        ]
    return rows


def _experts(fam: Family) -> list:
    T = ("T", "h")
    # Mixtral: a router, then every routed (token, expert) pair through one grouped matmul (transformers 5.24's
    # `grouped_mm` experts: F.grouped_mm is not autocast, so the experts run in the model's dtype): sorted by expert,
    # gathered, gate_up, act * up, down, times the routing weight, unsorted; each routed token once per expert
    # (`S` rows; a capacity factor pads each expert's rows: `_sizes`)
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
    n = _layers(cfg)
    if mt == "deepseek_v3":   # DeepseekV3DecoderLayer: a dense MLP below first_k_dense_replace
        first = cfg.get("first_k_dense_replace") or 0
        return ["dense" if i < first else "moe" for i in range(n)]
    if mt == "llama4_text":
        # "moe" / "dense" by moe_layers, " nope" where no_rope_layers is 0, " chunked" where layer_types says so
        moe, rope, types = set(cfg["moe_layers"]), cfg["no_rope_layers"], cfg["layer_types"]
        return [("moe" if i in moe else "dense") + ("" if rope[i] else " nope")
                + (" chunked" if types[i] == "chunked_attention" else "") for i in range(n)]
    if mt not in ("qwen2_moe", "qwen3_moe"):
        return [""] * n
    experts, step, dense = cfg[EXPERTS_KEY[mt]], cfg["decoder_sparse_step"], set(cfg.get("mlp_only_layers") or ())
    return ["moe" if i not in dense and experts > 0 and (i + 1) % step == 0 else "dense" for i in range(n)]


class _BlockNames(dict):
    def __missing__(self, kind):   # Llama 4's "moe nope chunked": the block of its MLP kind
        return self[kind.split()[0]]


BLOCK_NAMES = _BlockNames({"": "layer", "moe": "layer", "dense": "dense layer"})  # a layer kind's block name (models.hf's too)


def _kind_family(fam: Family, kind: str) -> Family:
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


def _sandwich_rows(fam: Family, n: dict, attention: list, mlp: list) -> list:
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


def _shared_input_rows(fam: Family, n: dict, attention: list, mlp: list) -> list:
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


def _embedding_rows(fam: Family) -> list:
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


def _head_rows(fam: Family) -> list:
    X, n = ("b", "s", "h"), fam.names
    if fam.head == "mlm":   # BertForMaskedLM: dense, activation, LayerNorm, decoder
        return (_linear([("transform", n["transform"], "h")], ("T", "h"), "x")
                + _activation("gelu", "transform act", X, "t")
                + [r._replace(what="input (the activation's output)", role="lin") if i == 0 else r
                   for i, r in enumerate(_norm(fam.norm, "transform.LayerNorm", X, "t"))]
                + _linear([("lm_head", n["lm_head"], "V")], ("T", "h"), "tn", quantizable=False))
    return _norm(fam.norm, _op(ROLE["final"], n.get("final", "model.norm")), X, "x") + _linear([("lm_head", n["lm_head"], "V")], ("T", "h"), "fn", quantizable=False) + [
        # Gemma 2's final_logit_softcapping: tanh(logits / cap) * cap keeps the tanh's result
        K("final softcap tanh", "tanh(logits / cap)", ("T", "V"), "lin", "final_softcap", ("x", f"W:{n['lm_head']}"))]


def _classifier_rows(fam: Family, dropout: bool) -> list:
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
    K("router aux loss", "softmax of every layer's router logits (the logits' dtype)", ("nl", "T", "E"), "lin", "aux_loss",
      ("x", "W:router")),
    K("router aux loss", "top-k indices of every layer", ("nl", "T", "k"), "i64", "aux_loss", ("x", "W:router")),
    K("router aux loss", "tokens per expert (fp32; * the mean router probability keeps it)", ("E",), "f32", "aux_loss",
      ("x", "W:router")),
]

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


def _sizes(cfg: dict, micro_batch: int, seq_len: int, rank: int = 0, attention: str = "sdpa",
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
            **(_mla_sizes(cfg) if FAMILIES[mt].mla else {})}


def _mla_sizes(cfg: dict) -> dict:
    """DeepSeek-V3's latent-attention widths (and its shared experts': n_shared_experts * moe_intermediate_size). The
    ledger's q and kv (the attention's gradients in flight) become the query/key and value widths of every head."""
    H, nope, rope, dv = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    kvr, qr = cfg["kv_lora_rank"], cfg.get("q_lora_rank") or 0
    return {"qr": qr, "kvr": kvr, "kva": kvr + rope, "dqk": nope + rope, "dv": dv, "qb": H * (nope + rope),
            "kvb": H * (nope + dv), "ov": H * dv, "q": H * (nope + rope), "kv": H * dv,
            "is": cfg["moe_intermediate_size"] * cfg["n_shared_experts"]}


def _drop(cfg: dict, fam: Family, which: str) -> bool:
    key = dict(fam.dropout_keys).get(which)
    return bool(key and (cfg.get(key) or 0) > 0)


def _conditions(cfg: dict, fam: Family, attention: str, checkpointing: str, micro_batch: int,
                precision: str | None = None, lora: dict | None = None) -> dict:
    if precision is None:
        precision = "32-true"
    if attention == "sdpa" and not fam.sdpa:
        attention = "eager"   # what transformers runs by default where it refuses sdpa
    eager = attention == "eager"
    fused = not eager
    cache = fam.cache and bool(cfg.get("use_cache", True)) and checkpointing != "full"
    attn_drop = _drop(cfg, fam, "attn")
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
        "resid_dropout": _drop(cfg, fam, "resid"),
        "embd_dropout": _drop(cfg, fam, "embd"),
        # Gemma 3's second cos/sin pair: kept by the layers of the other type; under full checkpointing only the
        # recomputed layer keeps one pair (the one counted with the embeddings)
        "qk_norm_on": bool(fam.qk_norm_key and cfg.get(fam.qk_norm_key)) or (cfg.get("model_type") == "llama4_text" and bool(cfg.get("use_qk_norm"))),
        "temperature_on": cfg.get("model_type") == "llama4_text" and bool(cfg.get("attn_temperature_tuning")),
        "freqs_cis": cfg.get("model_type") == "llama4_text",
        "cos_sin": cfg.get("model_type") != "llama4_text",
        "two_ropes": isinstance(cfg.get("rope_parameters"), dict) and "full_attention" in cfg["rope_parameters"]
        and len(set(cfg.get("layer_types") or ())) > 1 and checkpointing != "full",
        "attn_softcap": cfg.get("attn_logit_softcapping") is not None,
        "final_softcap": cfg.get("final_logit_softcapping") is not None,
        "causal": fam.head == "causal",
        "mlm": fam.head == "mlm",
        "mixed": mixed,
        "mixed_base": mixed,   # a base linear's autocast casts (off on a 4-bit base: _quantized_base)
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


def _mla_conditions(cfg: dict, fam: Family, attention: str, precision: str, micro_batch: int) -> dict:
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


def _falcon_conditions(cfg: dict, fam: Family, attention: str, checkpointing: str, micro_batch: int, cache: bool,
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
    return {"act": act, "lin": lin, "out": lin, "soft": soft, "low": copy, "ada": adapter, "ada_low": ada_low, "f32": "float32",

            "i64": "int64", "i32": "int32", "bool": "bool"}


def _dtypes(precision: str, dtypes: dict | None) -> dict:
    """The dtype of each role for a recipe (adapters in fp32, as peft keeps them, unless `dtypes` names theirs)."""
    return _roles(precision, dtypes, (dtypes or {}).get("adapter") or "float32")


def _quantized_base(cond: dict, roles: dict, dtypes: dict | None) -> None:
    """A 4-bit base (bitsandbytes Linear4bit) under autocast: Linear4bit.forward casts its input to the compute dtype
    and its output back to the input's dtype (`out.to(inp_dtype)`), outside autocast's op list. So autocast keeps no
    copy of a quantized linear's input or weight (MatMul4Bit keeps only the packed weight, a parameter), and what
    reads a projection's output in fp32 (the feed-forward's activation and product) keeps fp32 where a dense base's
    autocast matmul would have handed it the low dtype. Measured (saved_tensors_hooks, tiny Llama, QLoRA nf4 under
    bf16-mixed): the MLP's three (b, s, i) tensors per layer kept in fp32, no weight copies."""
    if (dtypes or {}).get("quantized") and cond["mixed"]:
        cond["mixed_base"] = False
        roles["out"] = roles["act"]


def _shape(symbols: tuple, sizes: dict) -> tuple:
    return tuple(sizes[x] if isinstance(x, str) else x for x in symbols)


def _resolve(rows: list, cond: dict, roles: dict, sizes: dict, flags: dict, shape=_shape) -> list:
    """Rows -> Kept, each storage once: a row with a `source` of the same dtype is that source's storage.
    `shape(symbols, sizes)` evaluates a row's symbolic shape (a parallel layout passes a rank's share)."""
    def on(r):
        return cond[r.when]

    dtype_of = {r.label: roles[r.role] for r in rows if on(r)}
    kept, seen = [], set()
    for r in rows:
        if not on(r) or (r.needs and not any(_flag(flags, x) for x in r.needs)):
            continue
        dtype = roles[r.role]
        key = r.label
        if r.source is not None and dtype_of.get(r.source) == dtype:
            key = r.source
        if key in seen:
            continue
        seen.add(key)
        kept.append(Kept(r.label, shape(r.shape, sizes), dtype))
    return kept


def _flag(flags: dict, need) -> bool:
    """A need is a flag name, or a tuple of names that must all hold."""
    if isinstance(need, tuple):
        return all(flags.get(x, False) for x in need)
    return flags.get(need, False)


def _match(name: str, targets) -> bool:
    return any(name == t or name.endswith("." + t) for t in targets)


def _trainable(fam: Family, lora: dict | None) -> dict:
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
        elif isinstance(targets, str):
            adapted = _match(m, [targets])
        else:
            adapted = _match(m, targets)
        flags[f"W:{m}"] = _match(m, save)
        flags[f"L:{m}"] = adapted and not flags[f"W:{m}"]
    return flags


def _grads(fam: Family, w: dict, x: bool, parallel: bool) -> dict:
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


def _layers(cfg: dict) -> int:
    if hf_encdec.is_stacked(cfg):  # every stack's layers, in forward order
        return sum(count for _, _, count in hf_encdec.stacks(cfg))
    return cfg["n_layer"] if cfg["model_type"] == "gpt2" else cfg["num_hidden_layers"]


def _boundary(fam: Family, roles: dict, sizes: dict, shape=_shape) -> Kept:
    return Kept("checkpoint: the layer's input (kept for the recomputation)", shape(("b", "s", "h"), sizes),
                roles["act"])


def _layer_types(cfg: dict) -> tuple:
    """Each layer's attention type; a family without layer_types (Starcoder2) slides in every layer when
    sliding_window is set."""
    if cfg.get("layer_types"):
        return tuple(cfg["layer_types"])
    kind = "sliding_attention" if cfg.get("sliding_window") is not None else "full_attention"
    return (kind,) * _layers(cfg)


def _windowed(cfg: dict, fam: Family, attention: str, seq_len: int) -> bool:
    """A sliding layer's window is a mask sdpa must take (the sequence is longer than the window)."""
    window = cfg.get("sliding_window")
    return (fam.window_layers and attention == "sdpa" and fam.sdpa and window is not None and seq_len > window
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
    sizes = _sizes(cfg, micro_batch, seq_len, int((lora or {}).get("r") or 0), attention, moe=moe)
    cond = _window_conditions(_conditions(cfg, fam, attention, checkpointing, micro_batch, precision, lora))
    roles = _dtypes(precision, dtypes)
    _quantized_base(cond, roles, dtypes)
    w = _trainable(fam, lora)
    parallel = _parallel(cfg)
    rows = layer_rows(cfg["model_type"], _act(cfg), parallel)
    first = _grads(fam, w, w["W:embed"], parallel)
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
CLIP_VISION = Family("layer", {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
                               "o": "self_attn.out_proj", "fc_in": "mlp.fc1", "fc_out": "mlp.fc2", "lm_head": "-"},
                     "separate", None, "plain", "hidden_act", False, dropout_keys=(("attn", "attention_dropout"),))


def _clip_rows(act: str) -> list:
    X, n = ("b", "s", "h"), CLIP_VISION.names
    return (_norm("layer", "layer_norm1", X, "x") + _attention(CLIP_VISION, n)
            + _norm("layer", "layer_norm2", X, "h1") + _mlp(CLIP_VISION, n, act))


def _llava_kept(cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora, shape=_shape):
    """LLaVA's vision tower and projector (LlavaModel.get_image_features), run on micro_batch x images images: (what
    stays kept, one vision layer's recomputation under full checkpointing beyond its input). The tower runs every
    layer, but the layers after the hidden state the projector reads (vision_feature_layer, -2 by default) reach no
    loss: their tensors are freed with the tower's outputs and are not counted; nor is post_layernorm's."""
    from memfit.models.llava import llava_vision_sizes

    own = cfg["llava"]
    images = micro_batch * int(own.get("images", 1))
    if images == 0:
        return [], [], False
    z = llava_vision_sizes(cfg)
    v = own["vision"]
    frozen = bool(own.get("freeze_vision_tower"))
    tokens = z["P"] if z["cls"] else z["P"] + 1
    d = z["hv"] // z["Hv"]
    sizes = {"b": images, "s": z["P"] + 1, "h": z["hv"], "i": z["iv"], "H": z["Hv"], "KV": z["Hv"], "d": d,
             "dk": -(-d // 8) * 8 if attention == "flash" else d, "q": z["hv"], "kv": z["hv"], "qkv": 3 * z["hv"], "rot": 0,
             "r": 0, "T": images * (z["P"] + 1), "R": int((lora or {}).get("r") or 0), "C": z["C"], "HI": z["image"],
             "p": z["patch"], "Pt": tokens, "F": z["features"] * z["hv"], "th": cfg["hidden_size"], "tb": micro_batch,
             "ts": seq_len, "TP": images * tokens}
    vcfg = {"num_attention_heads": z["Hv"], "attention_dropout": v.get("attention_dropout", 0.0), "use_cache": False}
    cond = _conditions(vcfg, CLIP_VISION, attention, checkpointing, images, precision, lora)
    roles = _dtypes(precision, dtypes)
    w = _trainable(CLIP_VISION, lora)
    if frozen:
        w = {key: False for key in w}
    text_w = _trainable(FAMILIES["llava"], lora)
    rows = _clip_rows(v["hidden_act"])
    first = _grads(CLIP_VISION, w, w["W:embed"], False)
    later = _grads(CLIP_VISION, w, first["out"], False)
    layer0 = _resolve(rows, cond, roles, sizes, {**w, **first}, shape)
    layer1 = _resolve(rows, cond, roles, sizes, {**w, **later}, shape)
    out_grad = (later if z["used"] > 1 else first)["out"] if z["used"] else w["W:embed"]
    X = ("b", "s", "h")
    embed_rows = [K("patch_embedding", "pixel values (in the model's dtype; autocast's low copy)", ("b", "C", "HI", "HI"),
                    "low", None, ("W:embed",)),
                  K("patch_embedding", "weight, cast to the low dtype by autocast", ("h", "C", "p", "p"), "low", "mixed",
                    ("W:embed",))] + [r._replace(op="pre_layrnorm") for r in _norm("layer", "", X, "W:embed")]
    # the projector reads hidden_states[layer][:, 1:] (default) or all of it: a view of the tower's storage where
    # nothing forces a copy (one image, or no CLS cut and one layer), else a contiguous copy
    view = z["features"] == 1 and (images == 1 or not z["cls"])
    # (a view of the input of a layer that runs after it: that layer's layer_norm1 keeps the storage already)
    shared_view = view and z["used"] < z["layers"] and checkpointing != "full" and (later["x"] or w["W:norm"])
    w_proj = not lora   # the projector trains, also with the vision tower frozen; peft's LoRA freezes it
    pg = w_proj or out_grad   # the projector's output needs a gradient
    flags = {"W:embed": w["W:embed"], "W:proj": w_proj, "vx": out_grad, "pg": pg, "mix": pg or text_w["W:embed"]}
    act = own["projector_hidden_act"]
    proj_rows = [
        K("multi_modal_projector.linear_1", "input (the vision hidden state it reads: a view)", X, "act", "not_mixed&pv",
          ("W:proj",)),
        K("multi_modal_projector.linear_1", "input", ("TP", "F"), "act", "not_mixed&pc", ("W:proj",)),
        K("multi_modal_projector.linear_1", "input, cast to the low dtype by autocast", ("TP", "F"), "low", "mixed",
          ("W:proj",)),
        K("multi_modal_projector.linear_1", "weight, cast to the low dtype by autocast", ("th", "F"), "low", "mixed", ("vx",)),
        *_activation(act, "multi_modal_projector.act", ("TP", "th"), "pg"),
        K("multi_modal_projector.linear_2", "input (the activation's output)", ("TP", "th"), "lin", None, ("W:proj",)),
        K("multi_modal_projector.linear_2", "weight, cast to the low dtype by autocast", ("th", "th"), "low", "mixed", ("pg",)),
        K("masked_scatter", "the image-token mask (bool)", ("tb", "ts"), "bool", None, ("mix",)),
    ]
    pcond = Conditions(cond)
    pcond.update({"pv": view and not shared_view, "pc": not view})
    kept = _resolve(embed_rows, cond, roles, sizes, flags, shape)
    if checkpointing == "full":
        boundary = Kept("vision layer: its input (kept for the recomputation)", shape(X, sizes), roles["act"])
        kept += [boundary._replace(label=f"vision layer {i}: its input (kept for the recomputation)")
                 for i in range(z["used"]) if first["x"] or later["x"] or w["W:norm"]]
        recomputed = [k for k in layer1 if not k.label.startswith("layer_norm1: input")]
    else:
        # every layer runs, and the tower's output (LlavaModel's output holds it) keeps the layers after the hidden
        # state the projector reads, and post_layernorm on the CLS token, alive to the end of the forward
        for i in range(z["layers"]):
            kept += [k._replace(label=f"vision layer {i} {k.label}") for k in (layer0 if i == 0 else layer1)]
        recomputed = []
    kept += _resolve(proj_rows, pcond, roles, sizes, flags, shape)
    return kept, recomputed, pg


# Qwen2-VL / Qwen2.5-VL's vision tower and merger (issue 34; the sizes and images: models/qwen_vl.py)
def _qwen_vl_kept(cfg: dict, micro_batch: int, seq_len: int, attention: str, checkpointing: str, roles: dict, lora) -> tuple:
    """The vision tower and merger run on micro_batch x images images: (what stays kept through the forward, the
    largest vision block's recomputation under full checkpointing beyond its input, whether the image features
    need a gradient). The tower trains unless training.freeze_vision_tower (then patch_embed and the blocks are
    frozen and keep nothing; the merger trains) or a LoRA adapter freezes the model (peft: nothing of the vision
    tower is adapted by the text model's target modules: the tower and merger keep nothing)."""

    from memfit.models.qwen_vl import _chunks, image_grid, vision_sizes

    own = cfg["qwen_vl"]
    images = micro_batch * int(own.get("images", 1))
    if images == 0:
        return [], [], False
    z = vision_sizes(cfg)
    E, M, H, d, m = z["E"], z["M"], z["H"], z["d"], z["m"]
    gh, gw = image_grid(cfg)
    N = images * gh * gw
    tower = not lora and not own.get("freeze_vision_tower")
    merger = not lora
    if not merger:
        return [], [], False
    # CPU autocast (bf16-mixed) runs the Conv3d in the low dtype: the residual stream, LayerNorm (not autocast there)
    # and every linear's output are low from the patch embedding on; each linear keeps autocast's low copy of its
    # weight (and of an fp32 input: Qwen2.5-VL's RMSNorm multiplies by its fp32 weight). Under *-true and 32-true
    # every tensor is the model's dtype: `lin` is the tower's dtype in each recipe.
    lin, f32, low = roles["lin"], "float32", roles["low"]
    mixed = roles["act"] != roles["lin"]
    rms = cfg["model_type"] == "qwen2_5_vl"
    eager = attention == "eager"

    def weights(*shapes, label="") -> list:
        return [Kept(f"{label}weight, cast to the low dtype by autocast", shape, low) for shape in shapes] if mixed else []

    def norm(label: str) -> list:
        if rms:
            return [Kept(f"{label}: input, upcast to fp32 (in fp32 the input itself)", (N, E), f32),
                    Kept(f"{label}: 1/rms", (N, 1), f32),
                    Kept(f"{label}: normalized, cast back to the input dtype (weight * it)", (N, E), lin)]
        return [Kept(f"{label}: input", (N, E), lin), Kept(f"{label}: mean (fp32)", (N, 1), f32),
                Kept(f"{label}: 1/std (fp32)", (N, 1), f32)]

    def block(full: bool) -> list:
        rows = norm("norm1") + [Kept("attn.qkv: input", (N, E), lin)]
        rows.append(Kept("attention: v (a view of attn.qkv's output, which it keeps whole)", (N, 3 * E), lin))
        chunks = _chunks(cfg, int(own.get("images", 1)) * micro_batch, full)
        if eager:
            rows += [Kept("q @ k^T: q (each chunk's copy)", (H, N, d), lin), Kept("q @ k^T: k^T (each chunk's copy)", (H, d, N), lin),
                     Kept("softmax: probabilities of every chunk (fp32)", (H, sum(c * c for c in chunks)), f32)]
            if lin != f32:
                rows.append(Kept("p @ v: probabilities, cast to the value dtype", (H, sum(c * c for c in chunks)), lin))
        else:
            rows += [Kept("attention: q (after the rotary)", (N, H, d), lin), Kept("attention: k (after the rotary)", (N, H, d), lin),
                     Kept("attention: every chunk's output", (N, H, d), lin), Kept("attention: log-sum-exp (fp32)", (H, N), f32)]
        rows.append(Kept("attn.proj: input (the chunks' outputs, concatenated)", (N, E), lin))
        rows += norm("norm2")
        if rms:
            rows.append(Kept("mlp.gate_proj/up_proj: input", (N, E), lin))
            if mixed:   # (each autocast linear casts the fp32 product itself: up_proj keeps a copy of its own)
                rows.append(Kept("mlp.up_proj: input, cast to the low dtype by autocast", (N, E), lin))
            rows += [Kept("act_fn(gate): input (the projection's output)", (N, M), lin),
                     Kept("act * up: act_fn(gate)", (N, M), lin), Kept("act * up: up", (N, M), lin),
                     Kept("mlp.down_proj: input", (N, M), lin)]
            rows += weights((3 * E, E), (E, E), (M, E), (M, E), (E, M), label="qkv/proj/gate/up/down: ")
        else:
            extra = ACTIVATIONS[cfg["qwen_vl"]["vision"]["hidden_act"]] or []
            rows += [Kept("mlp.fc1: input", (N, E), lin), Kept("act: input (the projection's output)", (N, M), lin)]
            rows += [Kept(f"act: {what}", (N, M), lin) for what in extra]
            rows.append(Kept("mlp.fc2: input (the activation's output)", (N, M), lin))
            rows += weights((3 * E, E), (E, E), (M, E), (E, M), label="qkv/proj/fc1/fc2: ")
        return rows

    full_layers = set(cfg["qwen_vl"]["vision"].get("fullatt_block_indexes") or ()) if rms else set()
    out: list = []
    recomputed: list = []
    if tower:
        out.append(Kept("patch_embed (Conv3d): pixel values", (N, z["C"], z["T"], z["P"], z["P"]), lin))
        out += weights((E, z["C"], z["T"], z["P"], z["P"]), label="patch_embed: ")
        rotary = [Kept("vision rotary: cos (shared by every block)", (N, 1, d), f32),
                  Kept("vision rotary: sin (shared by every block)", (N, 1, d), f32)]
        if rms:
            out.append(Kept("window order: the patches' window index (int64)", (N // (m * m),), "int64"))
        if checkpointing == "full":
            # (torch.utils.checkpoint saves a block's tensor inputs: its hidden states and cu_seqlens; the rotary's cos
            # and sin come in a tuple, kept by the recomputed block only)
            chunks = len(_chunks(cfg, images, False)) if rms else images
            out += [Kept(f"vision block {i}: its input (kept for the recomputation)", (N, E), lin) for i in range(z["layers"])]
            out += [Kept(f"vision block {i}: cu_seqlens (int32)", (1 + (images if i in full_layers or not rms else chunks),), "int32")
                    for i in range(z["layers"])]
            recomputed = [rotary + [k for k in block(i in full_layers) if not k.label.startswith("norm1: input")]
                          for i in range(z["layers"])]
        else:
            out += rotary
            for i in range(z["layers"]):
                out += [k._replace(label=f"vision block {i} {k.label}") for k in block(i in full_layers)]
    wide = E * m * m
    # (a frozen tower's output needs no gradient: RMSNorm's pow and 1/rms then keep nothing, weight * normalized its
    # normalized input; nn.LayerNorm keeps input and statistics for its weight's gradient all the same)
    merger_norm = norm("ln_q") if tower or not rms else norm("ln_q")[2:]
    out += [k._replace(label=f"merger.{k.label}") for k in merger_norm]
    out += [Kept("merger.mlp.0: input (ln_q's output, viewed)", (N, E), lin),
            Kept("merger GELU: input", (N // (m * m), wide), lin), Kept("merger.mlp.2: input (GELU's output)", (N // (m * m), wide), lin)]
    out += weights(*([(wide, wide)] if tower else []), (z["O"], wide), label="merger.mlp.0/mlp.2: ")
    if rms:
        out.append(Kept("merger output, back in image order: the reverse index (int64)", (N // (m * m),), "int64"))
    out.append(Kept("masked_scatter: the image-token mask (bool)", (micro_batch, seq_len, 1), "bool"))
    return out, recomputed, True


def _qwen_vl_recompute_peak(cfg: dict, micro_batch: int, seq_len: int, attention: str, roles: dict, lora) -> int:
    """Under full checkpointing, the vision tower's worst moment in the backward: block i is recomputed once the text
    model, the merger and the blocks above it are done (their saved tensors and inputs released), so what lives is the
    patch embedding's input, the window order, the inputs of blocks 0..i and block i's recomputation (the rotary's
    cos and sin with it). The largest over the blocks (Qwen2.5-VL's full-attention blocks recompute more)."""
    out, recomputed, _ = _qwen_vl_kept(cfg, micro_batch, seq_len, attention, "full", roles, lora)
    if not recomputed:
        return 0
    base = [k for k in out if k.label.startswith(("patch_embed", "window order"))]
    inputs = [k for k in out if k.label.startswith("vision block")]
    per_block = len(inputs) // len(recomputed)   # (its hidden states and its cu_seqlens)
    return max(nbytes(base) + nbytes([k for k in inputs if int(k.label.split()[2].rstrip(":")) <= i]) + nbytes(again)
               for i, again in enumerate(recomputed)) if per_block else 0


class _Key:
    """A config dict (or None) keyed by its frozen value, carrying the dict itself: `_evaluate`'s memo compares
    configs by what they hold, and the evaluation reads the dict it was given."""

    __slots__ = ("value", "frozen")

    def __init__(self, value):
        self.value = value
        self.frozen = _freeze(value)

    def __hash__(self):
        return hash(self.frozen)

    def __eq__(self, other):
        return isinstance(other, _Key) and self.frozen == other.frozen


def _freeze(value):
    if isinstance(value, dict):
        return tuple(sorted(((k, _freeze(v)) for k, v in value.items()), key=lambda kv: repr(kv[0])))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, *(_freeze(v) for v in value))
    return (type(value).__name__, value)  # 1, 1.0 and True hash alike: the type keeps them apart


def _evaluate(cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora, shape=_shape, kind=None,
              moe=None):
    """(family, sizes, roles, embeddings, the first layer, a later layer, head, loss): the layers of `kind`
    (default: the first layer's).

    One check evaluates the same layer for its footprint, its peak of saved bytes and the ledger's step (six times
    for a dense model, more in `fit`'s search): with the plain shape rule the evaluation is remembered by value.
    A rank's shape rule (a closure) is evaluated each time."""
    if shape is not _shape:
        return _evaluate_now(cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora, shape, kind, moe)
    fam, sizes, roles, *kept = _evaluate_memo(_Key(cfg), micro_batch, seq_len, attention, checkpointing, precision,
                                              _Key(dtypes), _Key(lora), kind, _Key(moe))
    return (fam, dict(sizes), dict(roles), *(list(k) for k in kept))  # callers may extend what they are given


@lru_cache(maxsize=64)
def _evaluate_memo(cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora, kind, moe):
    return _evaluate_now(cfg.value, micro_batch, seq_len, attention, checkpointing, precision, dtypes.value, lora.value,
                         _shape, kind, moe.value)


def _evaluate_now(cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora, shape=_shape, kind=None,
                  moe=None):
    check(cfg, attention, checkpointing, precision)
    mt = cfg["model_type"]
    kind = layer_kinds(cfg)[0] if kind is None else kind
    fam = _kind_family(FAMILIES[mt], kind)
    head = classifier(cfg) if not cfg.get("traced_model_type") else None
    if head is not None:   # a classifier in place of the language-model head (the layers are the family's own)
        names = {**fam.names, "score": head["module"], "lm_head": "-"}
        if head["task"] == "seq" and fam.post_norm:
            names["pooler"] = "classifier.dense" if "batch_positions" in fam.embed_extra else "bert.pooler.dense"
        fam = fam._replace(head=head["task"], names=names)
    sizes = _sizes(cfg, micro_batch, seq_len, int((lora or {}).get("r") or 0), attention, moe=moe)
    cond = _conditions(cfg, fam, attention, checkpointing, micro_batch, precision, lora)
    if head is not None:
        sizes["L"] = head["labels"]
        task, loss = head["task"], head["loss"]
        cond.update({"seq_ce": task == "seq" and loss == "ce", "seq_mse": task == "seq" and loss == "mse",
                     "seq_bce": task == "seq" and loss == "bce", "token": task == "token",
                     "cls_dropout": head["dropout"] > 0, "pad_known": head["pad"]})
    if _chunk_masked(cfg, kind, attention, seq_len):
        cond = _window_conditions(cond)
    roles = _dtypes(precision, dtypes)
    _quantized_base(cond, roles, dtypes)
    w = _trainable(fam, lora)
    parallel = _parallel(cfg)
    rows = layer_rows(mt, _act(cfg), parallel, kind)
    # the layer input needs a gradient from the first layer on when the embeddings train; under LoRA the first
    # layer's input does not, and every later one does as soon as an earlier adapter reaches the residual stream
    vision = (_llava_kept(cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora, shape)
              if fam.llava else None)
    if fam.qwen_vl:
        vision = _qwen_vl_kept(cfg, micro_batch, seq_len, attention, checkpointing, _dtypes(precision, dtypes), lora)
    # (LLaVA: the image features scattered into the embeddings need a gradient when the tower or projector trains)
    # transformers' activation_checkpointing_enable also calls enable_input_require_grads (modeling_utils.py): a
    # hook makes the input embeddings' output require a gradient, so under full checkpointing with a frozen
    # embedding (LoRA) what follows the lookup (BERT's sum, LayerNorm and dropout) records its graph and the first
    # layer's input needs a gradient too
    embed_out = w["W:embed"] or checkpointing == "full"
    first = _grads(fam, w, embed_out or bool(vision and vision[2]), parallel)
    later = _grads(fam, w, first["out"], parallel)
    flags0, flags1 = {**w, **first}, {**w, **later}
    layer0 = _resolve(rows, cond, roles, sizes, flags0, shape)
    layer1 = _resolve(rows, cond, roles, sizes, flags1, shape)
    top = {**w, "emb_out": embed_out, "rope": first["qk"] or later["qk"], "x": later["out"], "t": True, "tn": True, "fn": True}
    embeddings = _resolve(_embedding_rows(fam), cond, roles, sizes, top, shape)
    if fam.qwen_vl:   # mrope: cos and sin are per sequence, (b, s, head_dim), from the (3, b, s) position ids
        embeddings = [k._replace(shape=(micro_batch,) + tuple(k.shape[1:])) if k.label.startswith("rotary: ") else k
                      for k in embeddings]
    if vision:
        embeddings += vision[0]
    top["t"] = later["out"] or top.get(f"W:{fam.names.get('transform')}", False)
    if head is not None:
        head_rows, loss_rows = _classifier_rows(fam, head["dropout"] > 0), CLASSIFIER_LOSS_ROWS
    else:
        head_rows, loss_rows = _head_rows(fam), LOSS_ROWS
    head = _resolve(head_rows, cond, roles, sizes, top, shape)
    loss = _resolve(loss_rows, cond, roles, sizes, top, shape)
    return fam, sizes, roles, embeddings, layer0, layer1, head, loss


def saved(cfg: dict, *, micro_batch: int, seq_len: int, attention: str = "sdpa", checkpointing: str = "none",
          precision: str = "32-true", dtypes: dict | None = None, lora: dict | None = None, shape=None,
          target_len: int | None = None, moe: dict | None = None) -> list:
    """Blocks in forward order: embeddings, layer (x num_hidden_layers; the first layer apart when it differs, as
    under LoRA), head, loss; each lists its kept storages. With checkpointing "full" the layer block holds what
    stays saved through the forward (each layer's input); `peak_saved` adds one layer's recomputation.

    `shape(symbols, sizes) -> tuple[int, ...]`, if given, evaluates each row's symbolic shape (see `_sizes` for
    the symbols), e.g. with one tensor-parallel rank's share of the heads and widths."""
    measured = _measured(cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora)
    if measured is not None:
        return _measured_blocks(measured, checkpointing)
    if hf_encdec.is_stacked(cfg):  # an encoder-decoder: one layer block per stack (`target_len`: decoder tokens)
        check(cfg, attention, checkpointing, precision)
        return stacked_saved(cfg, micro_batch=micro_batch, seq_len=seq_len, target_len=target_len, attention=attention,
                               checkpointing=checkpointing, precision=precision, dtypes=dtypes, lora=lora, shape=shape)
    shape = shape or _shape
    fam, sizes, roles, embeddings, layer0, layer1, head, loss = _evaluate(
        cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora, shape, moe=moe)
    layers = _layers(cfg)
    window = _window_layers(cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora, shape, moe)
    kinds = layer_kinds(cfg)
    if checkpointing == "full":
        middle = [Block("layer", layers, [_boundary(fam, roles, sizes, shape)])]
    elif window is not None:   # Gemma 3: sliding layers whose window masks sdpa keep more than the global ones
        middle = _layer_blocks(cfg, layers, layer0, layer1, window)
    elif len(set(kinds)) > 1:
        # layers that differ (dense and sparse): runs of alike layers in forward order, each kind its own block name
        by_kind = {kinds[0]: (layer0, layer1)}
        for kind in set(kinds) - {kinds[0]}:
            by_kind[kind] = _evaluate(cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora,
                                      shape, kind, moe)[4:6]
        middle = []
        for i, kind in enumerate(kinds):
            kept = by_kind[kind][0 if i == 0 else 1]
            name = BLOCK_NAMES[kind]
            if middle and middle[-1].name == name and middle[-1].kept == kept:
                middle[-1] = middle[-1]._replace(count=middle[-1].count + 1)
            else:
                middle.append(Block(name, 1, kept))
    elif layer0 == layer1 or layers == 1:
        middle = [Block("layer", layers, layer0)]
    else:
        middle = [Block("layer", 1, layer0), Block("layer", layers - 1, layer1)]
    return [Block("embeddings", 1, embeddings), *middle, Block("head", 1, head), Block("loss", 1, loss)]


def _measured(cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora):
    """A traced model's measured step (models/traced.measure) when it was measured at these settings (under full
    checkpointing it also answers for `none`: each layer's recomputation is what it keeps without checkpointing),
    else None: the generic rule answers."""
    measured = cfg.get("traced_measured")
    if measured is None or (dtypes and dtypes.get("activations") != TRUE_DTYPE.get(precision)):
        return None
    b, s, a, c, p, adapters = measured.run
    if (b, s, a, p, adapters) != (micro_batch, seq_len, attention, precision, lora_key(lora)) or \
            (c != checkpointing and (c, checkpointing) != ("full", "none")):
        return None
    return measured


def lora_key(lora: dict | None) -> str:
    """The LoRA settings a traced model's step ran with (models/traced.measure), as a comparable string ("" without)."""
    import json

    return json.dumps(lora, sort_keys=True, default=str) if lora else ""


def _measured_blocks(measured, checkpointing: str) -> list:
    def kept(items) -> list:
        return [Kept(*k) for k in items]

    blocks = [Block(name, count, kept(items)) for name, count, items in measured.blocks]
    if measured.run[3] == "full" and checkpointing == "none":   # the layers as they run without checkpointing
        layers: list = []
        for items in measured.recomputed:
            if layers and layers[-1].kept == kept(items):
                layers[-1] = layers[-1]._replace(count=layers[-1].count + 1)
            else:
                layers.append(Block("layer", 1, kept(items)))
        blocks = [blocks[0], *layers, blocks[-2], blocks[-1]]
    return blocks


def nbytes(kept: list) -> int:
    from memfit.recipe.costs import dtype_bytes  # the recipe prices a dtype

    return sum(dtype_bytes(prod(k.shape), k.dtype) for k in kept)


def total(blocks: list) -> int:
    return sum(b.count * nbytes(b.kept) for b in blocks)


def peak_saved(cfg: dict, *, micro_batch: int, seq_len: int, attention: str = "sdpa", checkpointing: str = "none",
               precision: str = "32-true", dtypes: dict | None = None, lora: dict | None = None, shape=None,
               target_len: int | None = None, moe: dict | None = None) -> int:
    """The peak of live saved bytes during the step. Without full checkpointing everything saved is live at the end
    of the forward. With it, the embeddings' tensors and every layer's input stay saved; on top of them either the
    head and the loss (at the end of the forward) or one layer's recomputation (in the backward, once the head and
    loss are released; it runs without the cache, and its input is the boundary already counted)."""
    measured = _measured(cfg, micro_batch, seq_len, attention, checkpointing, precision, dtypes, lora)
    if measured is not None and measured.run[3] == checkpointing:
        return measured.peak
    if hf_encdec.is_stacked(cfg):
        check(cfg, attention, checkpointing, precision)
        return stacked_peak_saved(cfg, micro_batch=micro_batch, seq_len=seq_len, target_len=target_len,
                                    attention=attention, checkpointing=checkpointing, precision=precision, dtypes=dtypes,
                                    lora=lora, shape=shape)
    blocks = saved(cfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention, checkpointing=checkpointing,
                   precision=precision, dtypes=dtypes, lora=lora, shape=shape, moe=moe)
    if checkpointing != "full":
        return total(blocks)
    emb, layer, head, loss = blocks
    boundary = layer.kept[0]
    window = _window_layers(cfg, micro_batch, seq_len, attention, "full", precision, dtypes, lora, shape or _shape, moe)

    def recomputation(kept: list) -> int:
        size = nbytes(kept)
        # the recomputed layer's first kept tensor is the boundary itself when it is the layer's input (Cohere's
        # written-out LayerNorm keeps x - mean first: a storage of its own)
        if (kept and kept[0].dtype == boundary.dtype and prod(kept[0].shape) == prod(boundary.shape)
                and kept[0].label.split(": ", 1)[1].startswith("input")):
            size -= nbytes([boundary])
        return size

    recomputed = {}
    for kind in set(layer_kinds(cfg)):
        *_, later, _, _ = _evaluate(cfg, micro_batch, seq_len, attention, "full", precision, dtypes, lora,
                                    shape or _shape, kind, moe)
        # a sliding layer whose window masks sdpa recomputes more (Gemma 3): the larger of the two
        recomputed[kind] = max([recomputation(later)] + ([recomputation(window[1])] if window is not None else []))
    each = nbytes(layer.kept)
    emb_bytes = nbytes(emb.kept)
    if cfg["model_type"] == "llama4_text":
        # Llama 4's freqs_cis is kept only by a rope layer's complex multiply: under full checkpointing by the rope
        # layer being recomputed, by no one at the end of the forward or while a NoPE layer is recomputed
        freqs = nbytes([k for k in emb.kept if k.label.startswith("rotary: freqs_cis")])
        emb_bytes -= freqs
        recomputed = {kind: size + (0 if "nope" in kind.split() else freqs) for kind, size in recomputed.items()}
    kept = emb_bytes + layer.count * each
    # the backward recomputes layer i once the boundaries of the layers above it are released: where layers differ
    # (dense and sparse) the peak is the largest of (layers up to i kept + layer i's recomputation)
    worst = max(emb_bytes + (i + 1) * each + recomputed[kind] for i, kind in enumerate(layer_kinds(cfg)))
    if FAMILIES[cfg["model_type"]].qwen_vl:   # a vision block's recomputation, beyond its input
        ids = nbytes([k for k in emb.kept if k.label.startswith("embed_tokens: input ids")])   # (its backward runs last)
        worst = max(worst, ids + _qwen_vl_recompute_peak(cfg, micro_batch, seq_len, attention, _dtypes(precision, dtypes), lora))
    if FAMILIES[cfg["model_type"]].llava:   # a vision layer's recomputation, beyond its input
        worst = max(worst, kept + nbytes(_llava_kept(cfg, micro_batch, seq_len, attention, "full", precision, dtypes, lora,
                                                     shape or _shape)[1]))
    return max(kept + nbytes(head.kept) + nbytes(loss.kept), worst)


def recomputed(cfg: dict, *, micro_batch: int, seq_len: int, attention: str = "sdpa", precision: str = "32-true",
               dtypes: dict | None = None, lora: dict | None = None, shape=None, target_len: int | None = None,
               moe: dict | None = None) -> list:
    """Under full checkpointing, what each layer keeps while its backward recomputes it (one list per layer, in
    order; each layer of its own kind where layers differ, a sliding layer's where its window masks sdpa): the
    checkpointed forward runs without the key/value cache, so its copies of k and v are not made. An
    encoder-decoder's layers are both stacks' in forward order (the encoder's, then the decoder's)."""
    measured = _measured(cfg, micro_batch, seq_len, attention, "full", precision, dtypes, lora)
    if measured is not None and measured.run[3] == "full":
        return [[Kept(*k) for k in kept] for kept in measured.recomputed]
    if hf_encdec.is_stacked(cfg):
        *_, embeddings, enc, dec, _, _ = _t5_evaluate(cfg, micro_batch, seq_len, target_len, attention, "full",
                                                      precision, dtypes, lora, shape)
        out: list = []
        for (first, later), (_, _, count), name in zip((enc, dec), hf_encdec.stacks(cfg), BUCKETS):
            # the stack's first layer computes the relative bias inside its checkpoint: its bucket indices are part
            # of that layer's recomputation (after its input, which stays the list's first tensor)
            first = first[:1] + [k for k in embeddings if k.label.startswith(name)] + first[1:]
            out += [first] + [later] * (count - 1) if count else []
        return out
    kinds = layer_kinds(cfg)
    by_kind = {}
    for kind in set(kinds):
        *_, layer0, layer1, _, _ = _evaluate(cfg, micro_batch, seq_len, attention, "full", precision, dtypes, lora,
                                             shape or _shape, kind, moe)
        by_kind[kind] = (layer0, layer1)
    window = _window_layers(cfg, micro_batch, seq_len, attention, "full", precision, dtypes, lora, shape or _shape, moe)
    types = _layer_types(cfg) if window is not None else ()
    out = []
    for i, kind in enumerate(kinds):
        sliding = window is not None and i < len(types) and types[i] == "sliding_attention"
        out.append((window if sliding else by_kind[kind])[0 if i == 0 else 1])
    return out


def qlora_precision(compute_dtype: str = "bfloat16") -> str:
    """The recipe whose activations a QLoRA model keeps. bitsandbytes' 4-bit matmul (MatMul4Bit) saves nothing for
    backward but the packed weight (a parameter) on its context, so a quantized base linear keeps no activations,
    like a frozen one; the rest of the model computes in `compute_dtype`. QLoRA's saved activations are LoRA's on
    the model in that dtype: `saved(cfg, ..., precision=qlora_precision(compute), lora=...)`."""
    names = {"bfloat16": "bf16-true", "bf16": "bf16-true", "float16": "16-true", "fp16": "16-true", "half": "16-true",
             "float32": "32-true", "fp32": "32-true", "float": "32-true"}
    return names[compute_dtype]


# ----------------------------------------------------------------------------------------- documentation

SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int64": "i64", "int32": "i32", "bool": "bool"}
TABLE_PRECISIONS = ("32-true", "bf16-true", "bf16-mixed")


def layer_table(cfg: dict) -> list:
    """One layer's rows for the docs, full training: (op, keeps, shape, eager, sdpa), where the eager and sdpa cells
    give the dtype kept under 32-true · bf16-true · bf16-mixed ("—": not kept; one shared storage is listed once)."""
    fam = FAMILIES[cfg["model_type"]]
    w = _trainable(fam, None)
    if hf_encdec.is_stacked(cfg):  # the decoder's block (self-attention, cross-attention, feed-forward)
        rows = t5_layer_rows(cfg, True)
        flags = {**w, **_t5_flags(w, True, True, True)}
        conditions = lambda a, p: _t5_conditions(cfg, a, "none", 2, p, None)  # noqa: E731
        sizes = _t5_sizes(cfg, 2, 16, None)
    else:
        rows = layer_rows(cfg["model_type"], _act(cfg), _parallel(cfg))
        flags = {**w, **_grads(fam, w, True, _parallel(cfg))}
        conditions = lambda a, p: _conditions(cfg, fam, a, "none", 2, p, None)  # noqa: E731
        sizes = _sizes(cfg, 2, 16)
    symbolic = {r.label: "(" + ", ".join(str(x) for x in r.shape) + ")" for r in rows}
    seen: dict = {}
    for attention in ("eager", "sdpa"):
        for precision in TABLE_PRECISIONS:
            cond = conditions(attention, precision)
            for k in _resolve(rows, cond, _roles(precision, None, "float32"), sizes, flags):
                seen.setdefault(k.label, {})[(attention, precision)] = SHORT[k.dtype]
    out = []
    for r in rows:
        if r.label not in seen or any(o[0] == r.op and o[1] == r.what for o in out):
            continue
        cells = [" · ".join(seen[r.label].get((a, p), "—") for p in TABLE_PRECISIONS) for a in ("eager", "sdpa")]
        out.append((r.op, r.what, symbolic[r.label], *cells))
    return out


def markdown_table(cfg: dict) -> str:
    lines = ["| op | keeps | shape | eager (32-true · bf16-true · bf16-mixed) | sdpa |", "|---|---|---|---|---|"]
    lines += [f"| {op} | {what} | {shape} | {e} | {s} |" for op, what, shape, e, s in layer_table(cfg)]
    return "\n".join(lines)


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
        rows = _linear([("gate", T5_NAMES["gate"], "i"), ("up", T5_NAMES["up"], "i")], T, f) + _activation(act, "act_fn(wi_0)", I, g["g"])
        rows += [K("act * wi_1", "act_fn(wi_0)", I, "lin", None, (g["u"],)), K("act * wi_1", "wi_1 output", I, "lin", None, (g["g"],))]
        inner = g["p"]
    else:
        rows = _linear([("fc_in", T5_NAMES["fc_in"], "i")], T, f) + _activation(act, "act", I, g["g"])
        inner = g["g"]
        if act == "relu":  # relu keeps its result (wo's input too, without dropout: one storage)
            relu = K("fc_out (DenseReluDense.wo)", "relu output (relu keeps it; wo's input without dropout)", I, "lin", None, (g["g"],))
            rows.append(relu)
            rows.append(K("feed-forward dropout", "mask", I, "bool", "drop", (inner,)))
            down = ("fc_out", T5_NAMES["fc_out"], "h")
            # T5DenseActDense casts wo's input to wo's weight dtype (fp32 under autocast), which autocast casts back:
            # wo keeps a copy of its own under bf16-mixed, relu's output otherwise (without dropout)
            return (rows + [r._replace(when=_t5_join("wo_copy", r.when)) for r in _linear([down], ("T", "i"), inner, low_input=True)]
                    + [r._replace(when=_t5_join("wo_shared", r.when)) for r in _linear([down], ("T", "i"), inner, low_input=True, source=relu.label)])
    rows.append(K("feed-forward dropout", "mask", I, "bool", "drop", (inner,)))
    down = ("down", T5_NAMES["fc_out"], "h") if cfg["is_gated_act"] else ("fc_out", T5_NAMES["fc_out"], "h")
    return rows + _linear([down], ("T", "i"), inner, low_input=True)


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


def _t5_sizes(cfg: dict, micro_batch: int, seq_len: int, target_len: int | None, rank: int = 0) -> dict:
    n = hf_encdec.dims(cfg)
    s = target_len or seq_len
    q = n["H"] * n["d"]
    return {"b": micro_batch, "s": s, "h": n["h"], "i": n["i"], "i2": 2 * n["i"], "H": n["H"], "KV": n["H"],
            "d": n["d"], "dk": n["d"], "r": 0, "q": q, "kv": q, "qkv": 3 * q, "rot": 0, "V": n["V"],
            "T": micro_batch * s, "Tl": micro_batch * s, "E": 0, "k": 0, "S": 0, "R": rank, "R2": 2 * rank,
            "se": seq_len, "Te": micro_batch * seq_len}


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
          "lin", "cross_fused", ("attn_c",)),
    ]


def _t5_head_rows(cfg: dict) -> list:

    X = ("b", "s", "h")
    rows = _t5_norm("decoder.final_layer_norm", X, "x")
    rows.append(K("decoder final dropout", "mask", X, "bool", "drop", ("x",)))
    return rows + _linear([("lm_head", "lm_head", "V")], ("T", "h"), "fn")


LOSS_ROWS_T5_NAMES = ("log-softmax of the logits", "targets (the labels)", "total weight")


def _t5_conditions(cfg, attention, checkpointing, micro_batch, precision, lora, bias_trains: bool = True):
    """hf_activations' conditions plus T5's. Measured (torch 2.13, CPU): SDPA takes its fused kernel only when its
    float mask needs no gradient, else its math path (which upcasts 16-bit inputs to fp32). The self-attentions'
    mask is the relative bias: the math path when the bias trains (full fine-tuning), the fused kernel when it is
    frozen (LoRA). The cross-attention's mask is a zero bias, which T5Attention marks as needing a gradient under
    gradient checkpointing: the fused kernel without checkpointing, the math path with it."""

    cond = _conditions(cfg, FAMILIES["t5"], attention, checkpointing, micro_batch, precision, lora)
    drop = (cfg.get("dropout_rate") or 0) > 0
    low = precision not in (None, "32-true")
    sdpa = attention != "eager"
    self_fused = sdpa and not bias_trains
    cross_fused = sdpa and checkpointing != "full"
    cond.update({"drop": drop, "attn_drop": drop and checkpointing != "selective", "no_attn_drop": not drop,
                 "enc_fused": self_fused, "not_enc_fused": not self_fused, "dec_fused": self_fused,
                 "not_dec_fused": not self_fused, "cross_fused": cross_fused, "not_cross_fused": not cross_fused,
                 "dec_sdpa": sdpa, "causal": False, "mlm": True,
                 "math_upcast": sdpa and low, "not_math_upcast": not (sdpa and low),
                 "wo_copy": drop or cond["mixed"], "wo_shared": not (drop or cond["mixed"])})
    return cond


def t5_score_kernels(cfg: dict, attention: str, checkpointing: str, precision: str, lora: dict | None) -> tuple:
    """(self-attention materializes its scores, cross-attention does, their dtype): eager always, SDPA on its math
    path (see _t5_conditions), where the softmax's backward holds two (b, H, q, k) gradients at once."""
    if attention == "flash":
        attention = "sdpa"
    w = _trainable(FAMILIES["t5"], lora)
    cond = _t5_conditions(cfg, attention, checkpointing, 1, precision, lora, bias_trains=w["W:embed"])
    sdpa = attention != "eager"
    dtype = "float32" if cond["math_upcast"] else _dtypes(precision, None)["soft" if not sdpa else "lin"]
    return not cond["enc_fused"], not cond["cross_fused"], dtype


def _t5_evaluate(cfg, micro_batch, seq_len, target_len, attention, checkpointing, precision, dtypes, lora, shape=None):

    if attention == "flash":
        attention = "sdpa"  # T5 does not support flash-attn (_supports_flash_attn = False): SDPA runs
    shape = shape or _shape
    fam = FAMILIES["t5"]
    sizes = _t5_sizes(cfg, micro_batch, seq_len, target_len, int((lora or {}).get("r") or 0))
    enc_sizes = {**sizes, "s": sizes["se"], "T": sizes["Te"]}
    w = _trainable(fam, lora)
    cond = _t5_conditions(cfg, attention, checkpointing, micro_batch, precision, lora, bias_trains=w["W:embed"])
    roles = _dtypes(precision, dtypes)
    n = hf_encdec.dims(cfg)
    enc_rows, dec_rows = t5_layer_rows(cfg, False), t5_layer_rows(cfg, True)
    # the encoder's first layer input needs a gradient when the embedding trains; later ones once any weight below does
    e0 = _t5_flags(w, w["W:embed"], False, False)
    e1 = _t5_flags(w, e0["out"], False, False)
    enc_out = (e1["out"] if n["Ne"] > 1 else e0["out"]) if n["Ne"] else w["W:embed"]
    enc = enc_out or w["W:norm"]
    d0 = _t5_flags(w, w["W:embed"], enc, True)
    d1 = _t5_flags(w, d0["out"], enc, True)
    dec_out = (d1["out"] if n["Nd"] > 1 else d0["out"]) if n["Nd"] else w["W:embed"]
    enc0 = _resolve(enc_rows, cond, roles, enc_sizes, {**w, **e0}, shape)
    enc1 = _resolve(enc_rows, cond, roles, enc_sizes, {**w, **e1}, shape)
    dec0 = _resolve(dec_rows, cond, roles, sizes, {**w, **d0}, shape)
    dec1 = _resolve(dec_rows, cond, roles, sizes, {**w, **d1}, shape)
    label = _t5_encoder_output_label()
    # the encoder's output, kept by the cross-attention k / v projections or, where they are frozen, by an adapter
    # reading it as it is (its storage: a row sourced from the projections' input in the same dtype)
    sharing = {r.label for r in dec_rows if r.source == label}

    def is_output(k) -> bool:
        return k.label == label or (k.label in sharing and cond["not_mixed"] and k.dtype == roles["act"])

    encoder_output = [k for k in dec0 + dec1 if is_output(k)][:1]
    encoder_output = [Kept(label, k.shape, k.dtype) for k in encoder_output]
    dec0 = [k for k in dec0 if not is_output(k)]
    dec1 = [k for k in dec1 if not is_output(k)]
    top = {**w, "attn_e": e0["attn"] or e1["attn"], "attn_c": d0["cattn"] or d1["cattn"], "xe": enc_out, "x": dec_out,
           "fn": True}
    embeddings = _resolve(_t5_embedding_rows(cfg), cond, roles, sizes, top, shape) + encoder_output
    head = _resolve(_t5_head_rows(cfg), cond, roles, sizes, top, shape)
    loss = _resolve([r for r in LOSS_ROWS if r.when == "mlm"], cond, roles, sizes, top, shape)
    return roles, sizes, enc_sizes, embeddings, (enc0, enc1), (dec0, dec1), head, loss


# under full checkpointing T5's relative bias is computed inside the first layer's checkpoint (its bucket indices are
# that layer's, recomputed with it) and passed to every later layer of its stack
BUCKETS = ("encoder relative bias", "decoder relative bias")
SHARED_BIAS = "checkpoint: the shared position bias"


def _t5_checkpoint_inputs(embeddings: list, n: dict, attention: str, roles: dict, sizes: dict, shape) -> list:
    """What full checkpointing keeps besides each layer's hidden input. torch's non-reentrant checkpoint saves every
    tensor argument of the layer (_NoopSaveInputs, until that layer's backward) and T5Stack passes its layers the
    first layer's position biases: the encoder's (1, H, se, se) and the decoder's (1, H, s, s) relative biases in the
    embedding's dtype, the cross-attention's zero bias (1, H, s, se) in the query's dtype (T5Attention makes it
    require a gradient under checkpointing), and eager's float causal mask (1, 1, s, s) and the encoder's output to
    every decoder layer. Measured (tiny T5, 3+3 layers, CPU): each is one storage live at the last decoder layer's
    recomputation; the bucket indices are not (they are saved inside the first layer's checkpoint)."""
    out = [k for k in embeddings if not k.label.startswith(BUCKETS)]
    if n["Ne"] > 1:
        out.append(Kept(f"{SHARED_BIAS} (encoder)", shape((1, "H", "se", "se"), sizes), roles["act"]))
    if n["Nd"] > 1:
        out.append(Kept(f"{SHARED_BIAS} (decoder)", shape((1, "H", "s", "s"), sizes), roles["act"]))
        out.append(Kept(f"{SHARED_BIAS} (cross-attention zeros)", shape((1, "H", "s", "se"), sizes), roles["lin"]))
    if n["Nd"] and attention == "eager":
        out.append(Kept("checkpoint: the decoder's float causal mask", shape((1, 1, "s", "s"), sizes), roles["act"]))
    if n["Nd"] and not any(k.label == _t5_encoder_output_label() for k in out):
        # the encoder's output is every decoder layer's argument too: saved by the checkpoint where the cross-attention
        # keeps only autocast's 16-bit copies of it (bf16-mixed; measured: one (b, se, h) fp32 storage)
        out.append(Kept("checkpoint: the encoder's output", shape(("b", "se", "h"), sizes), roles["act"]))
    return out


def _t5_stack_blocks(name: str, count: int, first: list, later: list) -> list:

    if count == 0:
        return []
    if first == later or count == 1:
        return [Block(name, count, first)]
    return [Block(name, 1, first), Block(name, count - 1, later)]


def stacked_saved(cfg: dict, *, micro_batch: int, seq_len: int, target_len: int | None = None, attention: str = "sdpa",
          checkpointing: str = "none", precision: str = "32-true", dtypes: dict | None = None,
          lora: dict | None = None, shape=None) -> list:
    """Blocks in forward order: embeddings (both stacks' inputs, the relative-bias indices, the encoder's final norm
    and output), encoder layer, decoder layer, head, loss. With checkpointing "full" each layer keeps its input."""

    roles, sizes, enc_sizes, embeddings, enc, dec, head, loss = _t5_evaluate(
        cfg, micro_batch, seq_len, target_len, attention, checkpointing, precision, dtypes, lora, shape)
    n = hf_encdec.dims(cfg)
    shape = shape or _shape
    if checkpointing == "full":
        embeddings = _t5_checkpoint_inputs(embeddings, n, attention, roles, sizes, shape)
        boundary = "checkpoint: the layer's input (kept for the recomputation)"
        middle = [Block("encoder layer", n["Ne"], [Kept(boundary, shape(("b", "s", "h"), enc_sizes), roles["act"])])]
        middle += [Block("decoder layer", n["Nd"], [Kept(boundary, shape(("b", "s", "h"), sizes), roles["act"])])]
        middle = [b for b in middle if b.count]
    else:
        middle = _t5_stack_blocks("encoder layer", n["Ne"], *enc) + _t5_stack_blocks("decoder layer", n["Nd"], *dec)
    return [Block("embeddings", 1, embeddings), *middle, Block("head", 1, head), Block("loss", 1, loss)]


def stacked_peak_saved(cfg: dict, *, micro_batch: int, seq_len: int, target_len: int | None = None, attention: str = "sdpa",
               checkpointing: str = "none", precision: str = "32-true", dtypes: dict | None = None,
               lora: dict | None = None, shape=None) -> int:
    """The peak of live saved bytes. Without full checkpointing: everything saved (the end of the forward). With it,
    the largest of three moments: the end of the forward (every boundary, the embeddings' tensors, head and loss); a
    decoder layer's recomputation (every boundary and the embeddings' tensors beside it); an encoder layer's
    recomputation, once the decoder's backward has released its boundaries, the encoder's output and final norm
    and the decoder's inputs (the encoder's boundaries and inputs beside it). A layer's input is its boundary."""

    common = dict(micro_batch=micro_batch, seq_len=seq_len, target_len=target_len, attention=attention,
                  precision=precision, dtypes=dtypes, lora=lora, shape=shape)
    blocks = stacked_saved(cfg, checkpointing=checkpointing, **common)
    if checkpointing != "full":
        return total(blocks)
    *_, embeddings, enc, dec, head, loss = _t5_evaluate(cfg, micro_batch, seq_len, target_len, attention, "full",
                                                      precision, dtypes, lora, shape)
    boundaries = {b.name: (b.count, b.kept[0]) for b in blocks if b.name.endswith(" layer")}

    def recomputed(name, layers) -> tuple[int, int]:
        """(bytes of one layer's recomputation beyond its boundary, bytes of the stack's boundaries)"""
        if name not in boundaries:
            return 0, 0
        count, boundary = boundaries[name]
        each = nbytes(layers)
        # the first norm keeps the layer's input, the boundary itself: first in fp32, after the fp32 upcast in a
        # 16-bit recipe (measured, bf16-true: one storage)
        if any(k.dtype == boundary.dtype and k.shape == boundary.shape for k in layers[:2]
               if k.label.startswith("layer_norm (self-attention): input")):
            each -= nbytes([boundary])
        return each, count * nbytes([boundary])

    enc_each, enc_bounds = recomputed("encoder layer", enc[1])
    dec_each, dec_bounds = recomputed("decoder layer", dec[1])
    kept = blocks[0].kept   # the embeddings' tensors and the checkpoints' shared inputs (_t5_checkpoint_inputs)
    emb = nbytes(kept)
    encoder_inputs = nbytes([k for k in kept if k.label.startswith(ENCODER_INPUTS)])
    # a stack's first layer recomputes its relative bias (its bucket indices) once the later layers' backward has
    # released the shared bias; its own boundary and the rest of the stack's inputs beside it
    buckets = {name: nbytes([k for k in embeddings if k.label.startswith(name)]) for name in BUCKETS}
    shared = {name: nbytes([k for k in kept if k.label == f"{SHARED_BIAS} ({name})"]) for name in ("encoder", "decoder")}
    cross = nbytes([k for k in kept if k.label == f"{SHARED_BIAS} (cross-attention zeros)"])
    enc_first, _ = recomputed("encoder layer", enc[0])
    dec_first, _ = recomputed("decoder layer", dec[0])
    enc_one = enc_bounds // max(boundaries.get("encoder layer", (1,))[0], 1)
    dec_one = dec_bounds // max(boundaries.get("decoder layer", (1,))[0], 1)
    return max(emb + enc_bounds + dec_bounds + nbytes(head) + nbytes(loss),
               emb + enc_bounds + dec_bounds + dec_each,
               emb - shared["decoder"] - cross + enc_bounds + dec_one + dec_first + buckets[BUCKETS[1]],
               encoder_inputs + enc_bounds + enc_each,
               encoder_inputs - shared["encoder"] + enc_one + enc_first + buckets[BUCKETS[0]])


# what the embeddings block keeps for the encoder's layers (the rest goes once the decoder's backward is done)
ENCODER_INPUTS = ("encoder embed_tokens", "encoder embedding dropout", "encoder relative bias", f"{SHARED_BIAS} (encoder)")

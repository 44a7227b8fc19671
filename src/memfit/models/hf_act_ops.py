"""What autograd saves, the op rules (models/hf_activations.py tells the whole story): a kept tensor (`Kept`), a
block of them (`Block`), a table row (`K`), the precisions and kernels, the norm, activation and linear rules
(LoRA/DoRA adapters and quantized bases included), and `ActivationRules`, a family's activation rules (by the
family's model_type in hf_act_families.FAMILIES; the family itself is models/families' `Family`)."""

from __future__ import annotations

from typing import NamedTuple

from memfit.recipe.dtypes import RECIPES



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


RMSNORM_UPCAST = "memfit_rmsnorm_upcast"   # set (False) in a model's config by training.rmsnorm_upcast: false
# set (True) in a model's config by training.rmsnorm_upcast: fp32_weight (LitGPT 0.5.13's RMSNorm: the weight's product
# taken in fp32 too)
RMSNORM_FP32_WEIGHT = "memfit_rmsnorm_fp32_weight"
MEAN_SAVES_INPUT = "memfit_mean_saves_input"   # set (True) in a model's config by training.mean_saves_input: true
# set (True) in a model's config by training.softmax_saves_input and training.attention_mask_fp32
SOFTMAX_SAVES_INPUT = "memfit_softmax_saves_input"
ATTENTION_MASK_FP32 = "memfit_attention_mask_fp32"
# set (True) in a model's config by training.liger_kernels (rms_norm, swiglu): Liger-Kernel's autograd functions in
# place of the family's RMSNorm and gated MLP's act_fn(gate) * up (models/hf_derive; ledger/techniques/liger_kernels.py)
LIGER_RMS_NORM = "memfit_liger_rms_norm"
LIGER_SWIGLU = "memfit_liger_swiglu"


def rms_upcast(cfg: dict) -> bool:
    """Whether the model's RMSNorm upcasts its input to fp32 (transformers' and LitGPT's from 6178c7cc on)."""
    return cfg.get(RMSNORM_UPCAST, True) is not False


def rms_fp32_weight(cfg: dict) -> bool:
    """Whether the model's RMSNorm multiplies its fp32 normalized input by an fp32 copy of its weight and casts the
    product back (LitGPT from 916a84ca, Jul 2024, on: training.rmsnorm_upcast fp32_weight)."""
    return cfg.get(RMSNORM_FP32_WEIGHT) is True


def liger_rms_norm(cfg: dict) -> bool:
    """Whether the model's RMSNorm is Liger-Kernel's LigerRMSNormFunction (training.liger_kernels rms_norm)."""
    return cfg.get(LIGER_RMS_NORM) is True


def liger_swiglu(cfg: dict) -> bool:
    """Whether the model's gated MLP multiplies through Liger-Kernel's LigerSiLUMulFunction (training.liger_kernels
    swiglu)."""
    return cfg.get(LIGER_SWIGLU) is True


def mean_saves_input(cfg: dict) -> bool:
    """Whether torch.mean keeps its input for backward (torch before 2.2: MeanBackward0/1 held `self_`)."""
    return cfg.get(MEAN_SAVES_INPUT) is True


class Conditions(dict):
    """Named static conditions; "a&b" holds when both do."""

    def __missing__(self, key):
        if isinstance(key, str) and "&" in key:
            return all(self[k] for k in key.split("&"))
        raise KeyError(key)


PRECISIONS = ("32-true", "bf16-true", "16-true", "bf16-mixed", "16-mixed")
ATTENTIONS = ("eager", "sdpa", "flash")
CHECKPOINTING = ("none", "full", "selective")
# a 16-bit precision's low dtype: autocast's under *-mixed, the model's under *-true (the recipe's table:
# recipe/dtypes.py RECIPES)
LOW = {name: RECIPES[name].autocast or RECIPES[name].activations for name in PRECISIONS
       if (RECIPES[name].autocast or RECIPES[name].activations) != "float32"}
# a *-true precision's one dtype, what every activation is in (the recipe's table: recipe/dtypes.py RECIPES)
TRUE_DTYPE = {name: RECIPES[name].activations for name in PRECISIONS if RECIPES[name].autocast is None}

# Shape symbols (see `layer_sizes`): b batch, s sequence, h hidden, i intermediate, i2 = 2i, H / KV query / key-value
# heads, d head dim, q = H*d, kv = KV*d, qkv = q + 2kv, rot rotary dims, V vocab, T = b*s tokens, Tl the stored
# targets, E experts, k experts per token, S = T*k routed tokens, R LoRA rank; s1 = s + 1 (gpt-oss's sink column),
# rh = rot / 2 (gpt-oss's cos/sin).

# ------------------------------------------------------------------------------------------------- op rules

# Norms, given their input's flag `f` and role. HF RMSNorm upcasts to fp32, multiplies by 1/rms, casts back, then
# weight * that: pow and mul keep the fp32 input (the input itself when already fp32) and 1/rms (if the input needs
# a gradient); weight * keeps the cast-back tensor only when the weight trains. Gemma keeps fp32 normalized and
# (1 + weight) instead. nn.LayerNorm (one op) keeps input, mean and 1/std when anything needs a gradient.
# An RMSNorm without the upcast (training.rmsnorm_upcast false: Lit-GPT before 6178c7cc, lit_gpt/rmsnorm.py 8641822:17-21,
# `norm_x = torch.mean(x * x, ...); x_normed = x * torch.rsqrt(norm_x + self.eps); return self.weight * x_normed`)
# computes in its input's dtype: x * x and x * rsqrt keep the input itself, rsqrt its result in that dtype (the
# "rms_native" condition, from the config's RMSNORM_UPCAST, which models/hf_derive sets from the training key).
# LitGPT from 916a84ca on (training.rmsnorm_upcast fp32_weight, the "rms_fp32_weight" condition) multiplies in fp32:
# `(x_normed * weight.float()).to(dtype)` keeps the fp32 normalized tensor in place of the cast-back one, and under a
# 16-bit model (*-true) weight.float()'s fp32 copy of the weight.
# Under torch before 2.2 (training.mean_saves_input, the "mean_saves" condition) the norm's torch.mean(x * x) also
# keeps its input, the squares: fp32 with the upcast (x.float() * x.float(), transformers' pow(2)), else in the
# input's dtype (torch 2.1.0's generated MeanBackward1 holds `SavedVariable self_`; 2.2.0's a sym_numel).
def _norm(kind: str, n: str, x: tuple, f: str, role: str = "act") -> list:
    stat = x[:-1] + (1,)
    if kind == "rms":
        return [K(n, "input, upcast to fp32 (in fp32 the input itself)", x, "f32", when="rms_upcast", needs=(f,)),
                K(n, "1/rms", stat, "f32", when="rms_upcast", needs=(f,)),
                K(n, "input, not upcast (x * x and x * rsqrt keep it)", x, role, when="rms_native", needs=(f,)),
                K(n, "1/rms in the input's dtype (rsqrt's result)", stat, role, when="rms_native", needs=(f,)),
                K(n, "squares, fp32 (torch before 2.2: mean keeps its input)", x, "f32", when="rms_upcast&mean_saves",
                  needs=(f,)),
                K(n, "squares in the input's dtype (torch before 2.2: mean keeps its input)", x, role,
                  when="rms_native&mean_saves", needs=(f,)),
                K(n, "normalized, cast back to the input dtype (weight * it)", x, role, when="rms_cast_back", needs=("W:norm",)),
                # LitGPT's RMSNorm from 916a84ca (Jul 2024) on (litgpt/model.py 26857050:1315-1322, PyPI 0.5.13:
                # `(x_normed * weight.float()).to(dtype=dtype)`): the product's mul keeps the fp32 normalized tensor
                # (for the weight's gradient) and weight.float() (for the input's), a copy of a 16-bit weight (the
                # weight itself in fp32: under *-mixed and 32-true nothing beyond the rows above)
                K(n, "normalized, fp32 (weight.float() * it, cast back after)", x, "f32", when="rms_fp32_weight",
                  needs=("W:norm",)),
                K(n, "weight.float(), an fp32 copy of the 16-bit weight", (x[-1],), "f32", when="rms_fp32_weight&true16",
                  needs=(f,)),
                # Liger-Kernel's LigerRMSNormFunction (training.liger_kernels rms_norm; ops/rms_norm.py, 0.6.4):
                # `ctx.save_for_backward(X, W, RSTD)`, the input itself and an fp32 1/rms per row (llama casting
                # mode), whenever its node is recorded (the input or the weight needs a gradient)
                K(n, "input (Liger's RMSNorm keeps X itself)", x, role, when="rms_liger", needs=(f, "W:norm")),
                K(n, "1/rms per row (Liger's RSTD, fp32)", stat, "f32", when="rms_liger", needs=(f, "W:norm"))]
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
# What the autocast in force decides (recipe/autocast.py): NewGELUActivation's `torch.pow(input, 3.0)` keeps its input
# as pow computes it (under CUDA autocast a float32 copy: the input itself is then kept by nothing), and the tanh terms
# follow pow's dtype (its result promotes the sum tanh takes); 0.5 * x stays in the input's dtype. FastGELUActivation
# (`gelu_fast`) multiplies instead (`input * input`): the same on both devices.
DEVICE_ROWS = {"gelu_new": ("pow", ("input (the projection's output)", "tanh(...) result", "1 + tanh(...)"))}


def activation_output(name: str, role: str) -> str:
    """The role of an activation's output on an input of `role`: gelu_new's is 0.5 * x times 1 + tanh(...), which
    takes pow's dtype (fp32 under CUDA autocast; what a gated MLP's product then keeps)."""
    device_op, _ = DEVICE_ROWS.get(name, (None, ()))
    return f"{device_op}:{role}" if device_op else role


def _activation(name: str, op: str, shape: tuple, f: str, role: str = "lin") -> list:
    rule = ACTIVATIONS[name]
    if rule is None:
        return []
    device_op, follow = DEVICE_ROWS.get(name, (None, ()))
    return [K(op, w, shape, f"{device_op}:{role}" if w in follow else role, needs=(f,))
            for w in ["input (the projection's output)", *rule]]


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
            K(f"{short}.lora_A", "weight, cast to the low dtype by autocast", ("R", x[-1]), "low", "lora&ada_cast",
              ((f"L:{m}", f),)),
            K(f"{short}.lora_B", "input (lora_A's output)", x[:-1] + ("R",), "ada_low", "lora", lora),
            K(f"{short}.lora_B", "weight, cast to the low dtype by autocast", (width, "R"), "low", "lora&ada_cast", lora),
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


class ActivationRules(NamedTuple):
    """What a family's blocks save, as rules over its layout (its norm, module names, attention and MLP kinds): one
    facet of the family (the one `Family` is models/families'), kept by its model_type in hf_act_families.FAMILIES.
    Not a family itself: a vision tower (CLIP_VISION) and a MoE family's dense layers (hf_act_layers._kind_family)
    have rules of their own and no config.json of their own. (Not a field of `Family` either: the rules read the
    family's facts, models/hf_encdec reads models/families, so the family's module cannot reach them.)"""

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
    softmax_role: str = "soft"  # without the upcast: "soft" where an fp32 causal mask promotes the scores (GPT-2),
    # "softmax:lin" where nothing does (BERT: the autocast in force decides, recipe/autocast.py: CPU's keeps the low
    # dtype, CUDA's runs softmax without a stated dtype in fp32)
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
    rope_fp32: bool = False   # Cohere: apply_rotary_pos_emb rotates fp32 copies of q and k (`q = q.float()`), cast back after
    mllama: bool = False   # Llama 3.2 Vision: a Llama text model with cross-attention layers (the layer kind "cross",
    # hf_act_layers._cross_rows); the vision tower and projector (_mllama_kept) kept with the embeddings
    qwen_vl: bool = False   # Qwen2-VL / Qwen2.5-VL: a Qwen2 text model rotated per sequence (mrope: cos and sin (b, s, d));
    # the vision tower and merger (_qwen_vl_kept) kept with the embeddings

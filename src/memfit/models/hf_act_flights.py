"""What a transformer layer's rows hold besides the tensors autograd keeps: the family's kernels, measured.

The gradients in flight at each part's worst backward moment, the recomputation's moments under full
checkpointing (a LoRA linear's, DoRA's weight norm, torch's math kernel), expert parallelism's all-to-all
buffers; ledger/training.py puts them on the step's rows. Every figure is a whole tensor priced by the recipe
(`dtype_bytes(elements, dtype)`); the dtypes are the recipe's roles (hf_act_eval.role_dtypes)."""

from __future__ import annotations

from types import SimpleNamespace

from memfit.models import held
from memfit.models.hf_act_eval import dropout_on, layer_conditions, trainable_flags
from memfit.models.hf_act_families import FAMILIES
from memfit.models.hf_act_ops import liger_rms_norm, liger_swiglu, rms_upcast
from memfit.models.hf_act_t5 import t5_cross_math_moments, t5_flights, t5_mlp_flight, t5_recompute_flights, t5_self_math_moments, \
    t5_encoder_held_gradients
from memfit.recipe.costs import dtype_bytes


def _below_fp32(elements: int, dtype: str) -> bool:
    """A dtype narrower than fp32 (a 16-bit activation's kernels compute in fp32), compared on whole tensors."""
    return dtype_bytes(elements, dtype) < dtype_bytes(elements, "float32")


def layer_kernels(cfg: dict, run: dict, recipe_args: dict, sizes: dict, enc_sizes: dict, roles: dict, checkpointing: str,
                  stacked: bool, model_dtypes: dict | None = None):
    """What a layer's rows hold besides their kept tensors (the family's kernels, measured): the gradients in flight
    at each part's worst backward moment, the recomputation's moments, expert parallelism's all-to-all buffers."""
    h, T = sizes["h"], sizes["T"]
    precision = recipe_args.get("precision", "32-true")
    fam = FAMILIES[cfg["model_type"]]
    flights = _layer_flights(cfg, sizes, roles, attention=run["attention"])
    enc_flights = _layer_flights(cfg, enc_sizes, roles, attention=run["attention"])
    dense_flights = _layer_flights(cfg, sizes, roles, routed=False, attention=run["attention"])
    early = _early_flights(cfg, sizes, roles, run["attention"])
    after, enc_after = _after_flights(cfg, sizes, roles), _after_flights(cfg, enc_sizes, roles)
    if stacked:  # T5's feed-forward backward: relu's output alive at its backward, a gated one's three gradients
        for flight, later, stack in ((flights, after, sizes), (enc_flights, enc_after, enc_sizes)):
            more, then = t5_mlp_flight(cfg, stack, roles)
            flight["mlp"], later["mlp"] = flight["mlp"] + more, later["mlp"] + then
    # expert parallelism (parallel.expert): a MoE layer sends its routed rows (T·k) to the ranks holding their experts
    # and receives its own experts' rows (S) by all-to-all, and back; the buffers live while the layer runs, in each
    # direction (the gradients take the same way back)
    moe = recipe_args.get("moe") or {}
    a2a = dtype_bytes((T * sizes["k"] + sizes["S"]) * h, roles["act"]) if (moe.get("expert") or 1) > 1 and sizes.get("k") else 0
    self_math, held_gradients, first_recomputed, enc_held = False, {}, {}, {}
    if stacked:
        self_math, held_gradients, first_recomputed = t5_flights(cfg, sizes, roles, run["attention"], checkpointing,
                                                                 precision, recipe_args.get("lora"), flights, enc_flights)
        enc_held = t5_encoder_held_gradients(cfg, enc_sizes, roles, checkpointing, recipe_args.get("lora"))
    quantized, mixed = bool((model_dtypes or {}).get("quantized")), precision.endswith("-mixed")
    dequantized, dense_dequantized = {}, {}
    if quantized and (model_dtypes or {}).get("quantized_from") and not stacked:
        # each 4-bit linear's dequantized weight in its backward (models/held.py; T5's stacks: not yet measured with it)
        grad = held.projection_dtype(roles, quantized, mixed)
        dequantized = _dequantized(cfg, sizes, model_dtypes["quantized_from"], grad, routed=True)
        dense_dequantized = _dequantized(cfg, sizes, model_dtypes["quantized_from"], grad, routed=False)
    redone = _recompute_flights(cfg, sizes, recipe_args.get("lora"), roles, quantized, mixed) if checkpointing == "full" else {}
    dora = _dora_flights(cfg, sizes, recipe_args.get("lora"), roles, precision, (model_dtypes or {}).get("dequantized"))
    if dora and redone:  # the recomputed forward computes DoRA's weight norm again
        redone = {part: max(flight, _arrived(cfg, sizes, roles) + dora.get(part, 0)) for part, flight in redone.items()}
    enc_redone = _recompute_flights(cfg, enc_sizes, recipe_args.get("lora"), roles, quantized, mixed) if checkpointing == "full" else {}
    if stacked:  # T5's gradient arriving at a layer, its feed-forward's locals at the recomputation's end
        redone = t5_recompute_flights(sizes, roles, redone, _arrived(cfg, sizes, roles), quantized)
        enc_redone = t5_recompute_flights(enc_sizes, roles, enc_redone, _arrived(cfg, enc_sizes, roles), quantized)
    # torch's math kernel, where an attention part runs it, holds its temporaries while the part is recomputed
    # ({part: its moments}; T5's recomputed cross-attention, on SDPA's math path, in its decoder's o_proj part)
    kernel = {"attention": _math_kernel_moments(cfg, sizes, roles, run["attention"], precision) if checkpointing == "full" else []}
    enc_kernel: dict = {}
    arrived = _arrived(cfg, sizes, roles)
    if stacked:
        kernel["o_proj"] = t5_cross_math_moments(cfg, sizes, roles, run["attention"], checkpointing, precision,
                                                 recipe_args.get("lora"), quantized)
        # (T5's recomputed self-attentions on SDPA's math path, each stack's at its lengths; the walk adds `arrived` to
        # a kernel's moment, the encoder's too)
        args = (run["attention"], checkpointing, precision, recipe_args.get("lora"), quantized)
        kernel["attention"] += t5_self_math_moments(cfg, sizes, roles, *args, decoder=True, arrived=arrived)
        enc_kernel["attention"] = t5_self_math_moments(cfg, enc_sizes, roles, *args, decoder=False, arrived=arrived)
    moe_tail = ((_llama4_recompute_tail(cfg, sizes, roles) or _oss_recompute_tail(cfg, sizes, roles, recipe_args.get("lora"))
                 or _qwen_recompute_tail(cfg, sizes, roles, recipe_args.get("lora"))) if checkpointing == "full" else {})
    unsort = _unsort_forward(cfg, sizes, roles, precision)
    # (T5's softmax backward, where its attention materializes the scores: p @ v's backward has freed what only it kept)
    freed = ("p @ v:",) if stacked and self_math else ()
    return SimpleNamespace(fam=fam, flights=flights, enc_flights=enc_flights, dense_flights=dense_flights, early=early, a2a=a2a,
                           freed=freed, held_gradients=held_gradients, enc_held=enc_held, first_recomputed=first_recomputed, redone=redone,
                           enc_redone=enc_redone, kernel=kernel, enc_kernel=enc_kernel, arrived=arrived, dora=dora, dequantized=dequantized,
                           dense_dequantized=dense_dequantized, after=after, enc_after=enc_after, moe_tail=moe_tail,
                           unsort=unsort,
                           lora_forward=held.forward_flights(_recompute_flights(cfg, sizes, recipe_args.get("lora"), roles, quantized, mixed),
                                                             arrived, bool(recipe_args.get("lora"))))


def lora_forward_flights(cfg: dict, sizes: dict, lora: dict | None, roles: dict, quantized: bool, mixed: bool) -> dict:
    """{part: bytes}: what each part's widest LoRA linear holds at its worst forward op beyond its kept tensors (the
    layer rows' forward flight, held.forward_flights)."""
    arrived = _arrived(cfg, sizes, roles)
    return held.forward_flights(_recompute_flights(cfg, sizes, lora, roles, quantized, mixed), arrived, bool(lora))


def final_norm_flight(cfg: dict, sizes: dict, output: int) -> int | None:
    """The final norm's backward moment beyond what it keeps: LlamaRMSNorm's backward runs in fp32: at pow's backward
    its output gradient, x * rsqrt's and mean's gradients, x.pow(1) and 2 * x.pow(1), five (T, h) fp32 (measured:
    MemTracker's peak at that mul once a fused loss no longer makes the loss the peak, tests/ledger/test_fused_loss.py);
    None for a LayerNorm (its rows' default), and for fp32 activations: measured from a 16-bit input, whose fp32 copy
    and upcast products these are (an fp32 run holds less there: FSDP2 x tensor parallelism on gloo, fp32, peaks at
    the loss's backward, 1,518,976 B, where this moment would make the rank 1,646,624 B: tests/ledger/test_ranks.py),
    and for an RMSNorm without the upcast (training.rmsnorm_upcast false: no fp32 copy, its backward in the input's
    dtype; not measured, so the rows' default) or Liger's (training.liger_kernels rms_norm: its backward writes the
    input's gradient over the output's, tests/ledger/test_liger_kernels.py)."""
    if (FAMILIES[cfg["model_type"]].norm != "rms" or not rms_upcast(cfg) or liger_rms_norm(cfg)
            or output == dtype_bytes(sizes["T"] * sizes["h"], "float32")):
        return None
    return output + dtype_bytes(5 * sizes["T"] * sizes["h"], "float32")


# the linears of each part of a layer: (role in ActivationRules.names, the size of its output in _sizes)
_PART_LINEARS = {
    "attention": (("q", "q"), ("k", "kv"), ("v", "kv"), ("qkv", "qkv")),
    "o_proj": (("o", "h"),),
    "mlp": (("gate", "i"), ("up", "i"), ("gate_up", "i2"), ("fc_in", "i")),
    "down_proj": (("down", "h"), ("fc_out", "h")),
}


def _arrived(cfg: dict, sizes: dict, roles: dict) -> int:
    """The gradients beside a layer's own output gradient while full checkpointing recomputes the layer: the
    gradient reaching the layer's output comes as two, the residual's and the next layer's norm's (summed into the
    first in place); a 16-bit model's RMSNorm computes it in fp32 and casts it back (measured: Mistral, OLMo 2; both
    held while the layer is recomputed), Liger's writes it over its output's gradient (training.liger_kernels
    rms_norm: measured, tests/ledger/test_liger_kernels.py)."""
    fam = FAMILIES[cfg["model_type"]]
    T = sizes["T"]
    arrived = dtype_bytes(T * sizes["h"], roles["act"])
    if (fam.norm != "layer" and (fam.norm != "rms" or (rms_upcast(cfg) and not liger_rms_norm(cfg)))
            and _below_fp32(T * sizes["h"], roles["act"])):
        arrived += dtype_bytes(T * sizes["h"], "float32") + dtype_bytes(T * sizes["h"], roles["act"])
    return arrived


def _math_kernel_moments(cfg: dict, sizes: dict, roles: dict, attention: str, precision: str) -> list:
    """The worst moments of an attention part that runs torch's math kernel, while full checkpointing recomputes it:
    [(the labels of the part's kept tensors not made yet, the bytes in flight beyond the kept ones)], [] where the
    part runs no math kernel (or one not measured: Falcon's ALiBi, a *-mixed recipe).

    Falcon's multi_query under SDPA (models.hf_activations' `fa_math`: the one key/value head does not match the
    query heads), rotary. FalconAttention.forward holds query_key_value's output, v (its `[-1]` index copy), and q and
    k after the rotary (k's index copy is dropped); SDPA's math kernel turns the bool causal mask into a float bias
    (b, 1, s, s) in q's dtype; from a 16-bit input it computes in fp32: copies of q, k and v at their own heads, q
    scaled by 1/sqrt(d) (which matmul's fold then copies where b > 1: the copy is what `attention: q` keeps; with one
    sequence the scaled q is kept itself), and at the end the output in fp32, its cast back and the probabilities'
    cast back (the kernel returns them). Two moments: q @ k^T's scores (fp32, (b, H, s, s)) and the mask added to
    them, both alive, before the probabilities and v are kept; and the output's cast, with every tensor of the part
    kept (measured: Falcon-7B's switches, bf16-true, MemTracker peaks at that cast in layer 0's recomputation,
    tests/ledger/test_combinations.py; the scores' moment binds at long sequences, s >> d). The forward's same
    moments are not priced: no measured step peaks there."""
    fam = FAMILIES[cfg["model_type"]]
    if not fam.falcon or precision.endswith("-mixed"):
        return []
    b, s, d, H, KV, T = sizes["b"], sizes["s"], sizes["d"], sizes["H"], sizes["KV"], sizes["T"]
    cond = layer_conditions(cfg, fam, attention, "full", b, precision)
    if not cond["fa_math"] or cond["fa_alibi"]:
        return []
    act = roles["act"]
    Q, K, P = b * H * s * d, b * KV * s * d, b * H * s * s
    up = _below_fp32(Q, act)   # 16-bit: the kernel's fp32 copies (a .to() of an fp32 tensor copies nothing)
    held = (dtype_bytes(T * sizes["qkv"], roles["lin"]) + dtype_bytes(K, act)     # query_key_value's output, v
            + dtype_bytes(Q, act) + dtype_bytes(K, act)                           # q and k after the rotary
            + dtype_bytes(b * s * s, act))                                        # the float mask
    # (v's fp32 copy is what `attention: v (its one head)` keeps where one sequence folds it without a copy)
    upcast = dtype_bytes(Q + K + (0 if cond["fa_v_own"] else K), "float32") if up else 0
    scaled = dtype_bytes(Q, "float32") if b > 1 else 0
    scores = (("attention: v", "softmax:"), held + upcast + scaled + 2 * dtype_bytes(P, "float32"))
    output = ((), held + upcast + scaled + dtype_bytes(Q, "float32")
              + (dtype_bytes(Q, act) + dtype_bytes(P, act) if up else 0))
    return [scores, output]


def _recompute_flights(cfg: dict, sizes: dict, lora: dict | None, roles: dict, quantized: bool = False, mixed: bool = False) -> dict:
    """What each part of a layer holds, beyond the tensors it keeps, at its worst op while full checkpointing
    recomputes it: a LoRA linear (peft's Linear.forward) holds its base output, the adapter's output and its
    scaled copy at once (`result + lora_B(lora_A(x)) * scaling`; the adapter in fp32 on a 16-bit base, in the
    low dtype under autocast), and under autocast peft's fp32 copy of a low-dtype input (held.lora_linear_flight).
    Measured: Mistral, bf16-true, all-linear LoRA: the step's peak is the up projection's recomputation in layer 0
    (MemTracker, tests/ledger/test_combinations.py)."""
    T = sizes["T"]
    arrived = _arrived(cfg, sizes, roles)
    # the down projection's lora_B saves the layer's last kept tensor (no norm after the MLP): the recomputation stops there
    stops = not FAMILIES[cfg["model_type"]].sandwich
    out = {}
    for part, linears in (_adapted_linears(cfg, lora) or dict.fromkeys(_PART_LINEARS, [])).items():
        worst = 0
        for role, width in linears:
            elements = T * sizes[width]
            copy = T * sizes[_LINEAR_INPUTS[role]] if role in LOW_INPUT else 0
            worst = max(worst, held.lora_linear_flight(elements, roles, quantized, mixed, copy, stops and part == "down_proj"))
        out[part] = arrived + worst
    return out


def _llama4_recompute_tail(cfg: dict, sizes: dict, roles: dict) -> dict:
    """{part: bytes}: what a Llama 4 MoE layer holds beyond its kept tensors at the end of its recomputation (full
    checkpointing), beside its output's gradient (transformers 5.24.0, modeling_llama4.py). Its backward meets the
    routed output's sum first: Llama4TextMoe.forward (:166-174) adds `routed_out.reshape(E, -1, h).sum(dim=0)` into
    the shared expert's output, so sum's backward expands the gradient and the experts' `next_states.view(-1, h)`
    (:83) materializes it, (S, h), before any saved tensor is unpacked. Then the layer is recomputed, and torch's
    non-reentrant checkpoint stops at the last saved tensor (shared_expert.down_proj's input), the forward's locals
    that no op saves still alive: the decoder layer's attention_states (:420-439); the router's logits (Llama4Router
    .forward, :147-152, returned to the MoE) and, below fp32, its scores cast back to their dtype (in fp32 the kept
    sigmoid itself); the experts' output routed_out (S, h); and in a 16-bit model the layer's input (checkpoint's) and
    the residual after the attention, which each norm's fp32 upcast does not share (in fp32 each norm keeps its input
    itself: counted). Measured: MemTracker with a dispatch-mode trace at its peak, Llama 4 bf16-true and 32-true, full
    checkpointing: the peak is at act_fn(gate) * up of layer 1's shared expert, recomputed
    (tests/models/test_families_llama4.py)."""
    if cfg["model_type"] != "llama4_text":
        return {}
    T, S, h, E = sizes["T"], sizes["S"], sizes["h"], sizes["E"]
    act, lin = roles["act"], roles["lin"]
    locals_ = (dtype_bytes(T * h, lin)                                       # attention_states
               + dtype_bytes(T * E, lin) + (dtype_bytes(T * E, lin) if _below_fp32(T * E, lin) else 0)
               + dtype_bytes(S * h, lin))                                   # routed_out
    # the layer's input and the residual after the attention: in fp32 each norm keeps its input itself (counted), and
    # so does an RMSNorm without its upcast (training.rmsnorm_upcast false: its input kept as it is)
    upcast = 2 * dtype_bytes(T * h, act) if _below_fp32(T * h, act) and rms_upcast(cfg) and not liger_rms_norm(cfg) else 0
    return {"down_proj": dtype_bytes(S * h, lin) + locals_ + upcast}


def _oss_recompute_tail(cfg: dict, sizes: dict, roles: dict, lora: dict | None) -> dict:
    """{"down_proj": bytes}: what a gpt-oss MoE layer holds beyond its kept tensors at the worst op of its
    recomputation (full checkpointing), taken against all of its down_proj part's kept tensors (transformers 5.24.0,
    modeling_gpt_oss.py, integrations/moe.py grouped_mm_experts_forward). Its backward meets the experts' reshape + sum
    first (:535): the output's gradient expanded and materialized, (S, h), beside the layer's own (T, h); then the unsort's
    backward unpacks inv_perm and the layer is recomputed. The experts' forward runs again through the down projection's
    bias gather (`self.down_proj_bias[expert_ids_g]`, :508), evaluated while the gate_up bias gather (:480, (S, 2·ie))
    is still bound to `selected_biases`: alive then, unsaved, are the decoder layer's locals (the residual after the
    attention, which in fp32 is the post-attention norm's kept input itself, and that norm's output), the router's
    logits (GptOssMLP.forward's `_`), and the experts' locals: the sorted expert ids, histc's input copy and counts
    (S and E of 4 bytes, as _unsort_forward), the routed tokens (S, h) and the gated output (S, ie) (kept instead
    where the experts train), both bias gathers; the expert output and inverse permutation are not made yet.
    Measured: a dispatch-mode trace at MemTracker's peak, LoRA q, v, bf16-true, 2 x 64: the peak is that gather in
    layer 1's recomputation (tests/ledger/test_peak_transformers.py)."""
    fam = FAMILIES[cfg["model_type"]]
    if fam.mlp != "moe_oss" or not sizes.get("k"):
        return {}
    T, S, h, E, ie = sizes["T"], sizes["S"], sizes["h"], sizes["E"], sizes["ie"]
    act, lin = roles["act"], roles["lin"]
    weighted = "float32" if fam.routing_dtype == "f32" and _below_fp32(S * h, act) else act
    grads = dtype_bytes(T * h, act) + dtype_bytes(S * h, weighted)
    residual = dtype_bytes(T * h, act) if _below_fp32(T * h, act) and rms_upcast(cfg) and not liger_rms_norm(cfg) else 0
    experts_train = trainable_flags(fam, lora).get("W:experts", False)
    unsaved = 0 if experts_train else dtype_bytes(S, "int64") + dtype_bytes(S * h, act) + dtype_bytes(S * ie, act)
    locals_ = (residual + dtype_bytes(T * h, act) + dtype_bytes(T * E, lin) + dtype_bytes(S + E, "float32") + unsaved
               + dtype_bytes(S * 2 * ie, lin) + dtype_bytes(S * h, lin))
    unmade = dtype_bytes(S * h, act) + dtype_bytes(S, "int64")
    return {"down_proj": grads + locals_ - unmade}


def _qwen_recompute_tail(cfg: dict, sizes: dict, roles: dict, lora: dict | None) -> dict:
    """{"down_proj": bytes}: what a Qwen2-MoE or Qwen3-MoE layer holds beyond its kept tensors and its output's
    gradient at the worst op of its recomputation (full checkpointing), taken against all of its down_proj part's kept
    tensors (transformers 5.24.0, modeling_qwen2_moe.py, modeling_qwen3_moe.py, integrations/moe.py
    grouped_mm_experts_forward). Alive then, unsaved: the decoder layer's residual after the attention (in fp32 the
    post-attention norm's kept input itself) and that norm's output (the MoE block's input); the router's logits and
    its top-k weights in their dtype (Qwen2MoeTopKRouter.forward, :327: the block's `_` and `routing_weights`); the
    experts' locals: the sorted expert ids, histc's input copy and counts (S and E of 4 bytes, as _unsort_forward), the
    routed tokens (S, h) (kept instead where the experts train) and the routing-weighted output `weighted_out` (:524,
    (S, h)). Qwen3-MoE: the experts' reshape + sum is the layer's last op, so its backward comes first and materializes
    the output's gradient, (S, h); the unsort's gather (:529) saves inv_perm before it runs, the layer's last kept
    tensor, and the recomputation stops there: its worst op is `torch.arange` (:528, S int64) filling inv_perm, the
    gather's output never made. Qwen2-MoE: the shared expert's gate (`sigmoid(...) * shared_expert_output`, :347) is
    made after the experts, so its backward comes first and no (S, h) gradient is made; the recomputation runs through
    the gather, its output (S, h) alive beside `weighted_out`, the gate's kept sigmoid (T, 1) not made yet.
    Measured: a dispatch-mode trace at MemTracker's peak, LoRA q, v, bf16-true, 2 x 64: the peak is that op in layer 1's
    recomputation (tests/ledger/test_peak_transformers.py)."""
    if cfg["model_type"] not in ("qwen2_moe", "qwen3_moe") or not sizes.get("k"):
        return {}
    T, S, h, E, k = sizes["T"], sizes["S"], sizes["h"], sizes["E"], sizes["k"]
    act, lin = roles["act"], roles["lin"]
    shared = cfg["model_type"] == "qwen2_moe"
    residual = dtype_bytes(T * h, act) if _below_fp32(T * h, act) and rms_upcast(cfg) and not liger_rms_norm(cfg) else 0
    routed = 0 if trainable_flags(FAMILIES[cfg["model_type"]], lora).get("W:experts", False) else dtype_bytes(S * h, act)
    locals_ = (residual + dtype_bytes(T * h, act) + dtype_bytes(T * E, lin) + dtype_bytes(T * k, lin) + dtype_bytes(S, "int64")
               + dtype_bytes(S + E, "float32") + routed + dtype_bytes(S * h, act))
    # Qwen2-MoE: the gather's output, the shared expert gate's sigmoid not made; Qwen3-MoE: the materialized (S, h)
    # gradient and arange's inv_perm values
    moment = (dtype_bytes(S * h, act) - dtype_bytes(T, act) if shared
              else dtype_bytes(S * h, act) + dtype_bytes(S, "int64"))
    return {"down_proj": locals_ + moment}


def _unsort_forward(cfg: dict, sizes: dict, roles: dict, precision: str) -> int:
    """What a mixture of experts' layer holds in the forward beyond its kept tensors at its experts' unsort
    (transformers 5.24.0, integrations/moe.py grouped_mm_experts_forward, the default experts_implementation):
    `weighted_out = proj_out * sample_weights_g.unsqueeze(-1)` (:524) and `weighted_out[inv_perm]` (:529) both alive,
    (S, h) each in the routing-weighted output's dtype (as the backward's flights price it); the CPU's float copy of
    the sorted expert ids for histc and histc's counts (:448-449: int32 on CUDA, the same width), S and E elements of
    4 bytes; where the experts have biases (gpt-oss) the down projection's bias gathered per routed row
    (`self.down_proj_bias[expert_ids_g]`, :508, (S, h) in the parameters' dtype); and the router's logits, which every
    MoE block keeps as a local (`_, weights, indices = self.gate(...)`: modeling_gpt_oss.py:143, modeling_mixtral.py
    :127, ...), (T, E) in the router's output dtype (DeepSeek-V3's fp32 F.linear, autocast's low dtype under *-mixed). 0 without
    grouped experts.
    Measured: gpt-oss 32-true, 2 x 64, no checkpointing: MemTracker peaks at layer 1's unsort in the forward
    (a dispatch-mode trace there: these tensors and the kept ones, tests/models/test_families_gpt_oss.py)."""
    fam = FAMILIES[cfg["model_type"]]
    if not sizes.get("k") or fam.mlp in ("moe_llama4",):
        return 0
    S, T, h, E = sizes["S"], sizes["T"], sizes["h"], sizes["E"]
    act = roles["act"]
    weighted = "float32" if fam.routing_dtype == "f32" and _below_fp32(S * h, act) else act
    bias = dtype_bytes(S * h, "float32" if precision.endswith("-mixed") else roles["lin"]) if fam.mlp == "moe_oss" else 0
    # the router's output dtype, as its rows price its scores (hf_act_layers._deepseek_moe): DeepSeek-V3's F.linear of
    # fp32 input and weight, autocast's low dtype under *-mixed; every other router a linear in the model's dtype
    logits = dtype_bytes(T * E, (roles["low"] if precision.endswith("-mixed") else "float32")
                         if fam.mlp == "moe_deepseek" else roles["lin"])
    return 2 * dtype_bytes(S * h, weighted) + dtype_bytes(S + E, "float32") + bias + logits


def _adapted_linears(cfg: dict, lora: dict | None) -> dict | None:
    """{part: [(role, output width symbol)]}: each part's linears (_PART_LINEARS) that the LoRA config adapts in this
    family (none without LoRA); None where the family cannot say which."""
    fam = FAMILIES[cfg["model_type"]]
    try:
        adapted = trainable_flags(fam, lora) if lora else {}
    except ValueError:
        return None
    return {part: [(role, width) for role, width in linears
                   if fam.names.get(role) is not None and adapted.get(f"L:{fam.names[role]}")]
            for part, linears in _PART_LINEARS.items()}


# the linears of _PART_LINEARS whose input comes out of a matmul (the attention's output, the MLP's product): in the
# low dtype under autocast (models.hf_act_ops `low_input`)
LOW_INPUT = ("o", "down", "fc_out")
# the input width of each linear of _PART_LINEARS (its symbol in _sizes)
_LINEAR_INPUTS = {"q": "h", "k": "h", "v": "h", "qkv": "h", "o": "q", "gate": "h", "up": "h", "gate_up": "h", "fc_in": "h",
                  "down": "i", "fc_out": "i"}


def _dequantized(cfg: dict, sizes: dict, quantized_from: str, grad: str, routed: bool) -> dict:
    """{part: bytes}: the dequantized weight of each part's largest bitsandbytes 4-bit linear, alive in its backward
    (models/held.dequantized_weight); a mixture of experts' routed MLP has no Linear4bit (transformers' experts are
    fused parameters)."""
    fam = FAMILIES[cfg["model_type"]]
    out = {}
    for part, linears in _PART_LINEARS.items():
        if routed and sizes.get("k") and part in ("mlp", "down_proj"):
            continue
        weights = [sizes[width] * sizes[_LINEAR_INPUTS[role]] for role, width in linears if fam.names.get(role) is not None]
        if weights:
            out[part] = held.dequantized_weight(max(weights), quantized_from, grad)
    return out


def _dora_flights(cfg: dict, sizes: dict, lora: dict | None, roles: dict, precision: str, dequantized: str | None = None) -> dict:
    """DoRA's weight norm, computed in every forward of an adapted linear (peft tuners/lora/dora.py
    DoraLinearLayer.forward, after the base layer's output exists): get_lora_weight runs an (in, in) identity through
    lora_A and lora_B ((in, r) and the (in, out) product, kept by that graph until the forward returns); the base weight
    cast to the input's (the adapters') dtype where it differs; `weight + scaling * lora_weight` (the scaled copy and
    the sum), all (out, in) in the adapters' dtype. A quantized base is first dequantized (an (out, in) copy in
    `dequantized`, its layer's dtype): where the adapters' dtype is the same, that copy is the weight the norm reads;
    where it differs, `weight = weight.to(x.dtype)` rebinds the name, and the dequantized copy is freed before the
    norm's copies exist (the cast's moment, dequantized + cast, is below the norm's). Then the output's three (T, out)
    temporaries. Per part, the worst linear's: base output + the larger of those.
    Measured (MemTracker without its module hooks, tiny and wide Llama, 32-true, bf16-true and a 4-bit nf4 base): the
    step's peak is this moment in the forward."""
    if not (isinstance(lora, dict) and lora.get("use_dora") is True):
        return {}
    parts = _adapted_linears(cfg, lora)
    if parts is None:
        return {}
    ada, rank, T = roles["ada"], int(lora.get("r") or 8), sizes["T"]
    weight = dequantized or ("float32" if precision.endswith("-mixed") else roles["lin"])
    out = {}
    for part, linears in parts.items():
        worst = 0
        for role, width in linears:
            n_in, n_out = sizes[_LINEAR_INPUTS[role]], sizes[width]
            # the weight the norm reads beside the base's own: the cast copy, else the dequantized one
            base = (dtype_bytes(n_out * n_in, ada) if weight != ada
                    else dtype_bytes(n_out * n_in, dequantized) if dequantized else 0)
            norm = dtype_bytes(n_in * n_in, ada) + dtype_bytes(n_in * rank, ada) + 3 * dtype_bytes(n_out * n_in, ada) + base
            # then `(scale - 1) * base_result + scale * lora_result * scaling`: two products and their sum, (T, out)
            # each in the adapters' dtype, beside the base output
            combine = 3 * dtype_bytes(T * n_out, ada)
            worst = max(worst, dtype_bytes(T * n_out, roles["lin"]) + max(norm, combine))
        out[part] = worst
    return out


def _after_flights(cfg: dict, sizes: dict, roles: dict) -> dict:
    """{part: bytes added to its flight}: a dense part whose flight comes before its weight gradients (ledger/training's
    FLIGHT_BEFORE_WEIGHTS) then runs its first linear's backward, with that linear's weight gradient made: the MLP's
    (up_proj's, the last made in forward) holds, beside the residual stream's gradient, the other gradients its
    activation's backward left (act's, a plain MLP's none) instead of the three (T, i) of act * up's moment, and its
    input's gradient (T, h); the attention's first projection, q's and k's gradients waiting for the rotary's backward
    and its input's instead of o_proj's input's and q's. (Under kept gradients that linear's fresh gradient comes
    here, ledger/techniques/keep_gradients.)"""
    T = sizes["T"]
    lin, act = roles["lin"], roles["act"]
    return {"mlp": dtype_bytes(T * sizes["h"], act) - dtype_bytes(T * sizes["i"], lin),
            "attention": dtype_bytes(T * sizes["h"], act) - dtype_bytes(T * sizes["q"], lin)}


def _early_flights(cfg: dict, sizes: dict, roles: dict, attention: str) -> dict:
    """A part's worst backward moment before its parameters' gradients are made, where one is known beyond
    _layer_flights' (after them): torch's math kernel's softmax backward (Falcon's multi_query under SDPA) holds the
    probabilities' gradient and the scores', (b, H, s, s) fp32 each, beside the residual stream's gradient, o_proj's
    input's and v's (fp32, summed back to its own heads), ahead of query_key_value's weight gradient (measured:
    Falcon-7B's switches, bf16-true, full checkpointing, s >> d: MemTracker peaks at _softmax_backward_data in
    layer 0's attention; with ALiBi too: 0.852 -> 0.949 of MemTracker at (2, 64))."""
    fam = FAMILIES[cfg["model_type"]]
    if fam.sandwich:
        return _sandwich_norm_flights(cfg, sizes, roles)
    if not fam.falcon:
        return {}
    cond = layer_conditions(cfg, fam, attention, "none", sizes["b"])
    if not cond["fa_math"]:
        return {}
    T, b, H, s = sizes["T"], sizes["b"], sizes["H"], sizes["s"]
    return {"attention": (dtype_bytes(T * sizes["h"], roles["act"]) + dtype_bytes(T * sizes["q"], roles["lin"])
                          + dtype_bytes(T * sizes["kv"] + 2 * b * H * s * s, "float32"))}


def _sandwich_norm_flights(cfg: dict, sizes: dict, roles: dict) -> dict:
    """Gemma 2/3, OLMo 2: a norm on o_proj's and on down_proj's output is the first op their backward meets, before
    those linears' weight gradients are made (_early_flights). It runs in fp32 (the norm upcasts its input,
    `x * rsqrt(x.pow(2).mean(-1) + eps)`), and its worst moment is pow's backward (torch's derivatives.yaml
    pow_backward: `grad * (exponent * self.pow(exponent - 1))`, three (T, h) fp32 tensors at once: self.pow(1), its
    scaled copy and the product), while mean's backward's gradient (its input there, `grad.expand(...) / n`,
    materialized) and x's gradient from `x * rsqrt` (waiting to be summed with pow's) are alive: five (T, h) fp32
    tensors beside the arriving gradient. Measured: a dispatch-mode trace at MemTracker's peak, full checkpointing:
    LoRA q, v bf16-true, Gemma 2 peaks in PowBackward0 of layer 1's post_feedforward_layernorm, Gemma 3 of layer 0's,
    after the layer is recomputed; Gemma 3 full fine-tuning 32-true there too, with down_proj's weight gradient not
    yet made (three at mul's backward before it)."""
    T, h = sizes["T"], sizes["h"]
    fam = FAMILIES[cfg["model_type"]]
    res = dtype_bytes(T * h, roles["act"])
    dropout = res if dropout_on(cfg, fam, "resid") else 0
    norm = res + dropout + dtype_bytes(5 * T * h, "float32")
    return {"down_proj": norm, "o_proj": norm}


def _layer_flights(cfg: dict, sizes: dict, roles: dict, routed: bool = True, attention: str = "sdpa") -> dict:
    """Gradients in flight at the worst backward moment of each part of a layer; the residual
    stream's gradient is alive through all of them, a residual dropout's gradient beside it. The
    down projection: its input's gradient; the MLP: the gradients of the down projection's input
    and of the gate and up outputs (a plain MLP: of the activation's input); o_proj: its input's;
    attention: o_proj's input's and those of q, k and v. A mixture of experts' layer (`routed`, when
    the model has experts) begins its backward at the unsort (transformers' grouped_mm experts): the
    MoE output's gradient (T, h), expanded to every routed row and materialized (S, h), the index
    backward's zeros (S, h) and its out-of-place index_put (S, h), in the routing-weighted output's dtype (measured:
    tests/ledger/test_peak.py, MemTracker at aten.index_put in the experts' backward); its MLP part is the gate_up
    grouped_mm's backward (the activation's kept tensors already freed). Liger's SwiGLU (training.liger_kernels
    swiglu): its backward holds the down projection's input's gradient alone, storing gate's and up's gradients over
    the two outputs it keeps (ops/swiglu.py: `tl.store(a_ptr + col_offsets, da_row)`), so the MLP's worst moment
    may come after it, at gate_proj's backward: up's input gradient (in the stream's dtype), gate's in the matmul's
    and its cast to the stream's (in one dtype: their sum), beside the two stored gradients (measured, bf16-true and
    bf16-mixed under full checkpointing, LoRA and full: tests/ledger/test_liger_kernels.py)."""
    T, h, i, q, kv = sizes["T"], sizes["h"], sizes["i"], sizes["q"], sizes["kv"]
    fam = FAMILIES[cfg["model_type"]]
    k = 2 if fam.mlp == "plain" else 3
    act, lin = roles["act"], roles["lin"]
    res = dtype_bytes(T * h, act)
    dropout = res if dropout_on(cfg, fam, "resid") else 0
    scores = 0
    if fam.falcon:
        # Falcon's batched-matmul attention (eager, and torch's math kernel for multi_query under sdpa, in fp32 from a
        # 16-bit input): the probabilities' gradient, (b, H, s, s), is in flight through the softmax's backward
        cond = layer_conditions(cfg, fam, attention, "none", sizes["b"])
        if cond["fa_bmm"]:
            scores = dtype_bytes(sizes["b"] * sizes["H"] * sizes["s"] ** 2, "float32" if cond["fa_math"] else act)
    out = {
        "down_proj": res + dropout + dtype_bytes(T * i, lin),
        "mlp": res + dropout + (max(dtype_bytes(T * i, lin), 2 * dtype_bytes(T * h, act) + dtype_bytes(T * h, lin))
                                if fam.mlp == "gated" and liger_swiglu(cfg) else dtype_bytes(T * k * i, lin)),
        "o_proj": res + dropout + dtype_bytes(T * q, lin),
        "attention": res + dtype_bytes(T * (2 * q + 2 * kv), lin) + scores,
    }
    if routed and sizes.get("k"):
        # the experts run their MLP once per routed row (S = T·k, or as training.moe sets it), at the experts' width
        S, ie = sizes["S"], sizes["ie"]
        # the routed rows' gradients take the routing-weighted output's dtype: fp32 where the weights stay fp32 (Mixtral)
        weighted = "float32" if fam.routing_dtype == "f32" and _below_fp32(S * h, act) else act
        out["down_proj"] = res + dropout + dtype_bytes(T * h, act) + dtype_bytes(3 * S * h, weighted)
        # the gate_up grouped_mm's backward: its output's gradient (S, 2·ie) and its input's (S, h)
        out["mlp"] = res + dropout + dtype_bytes(S * (2 * ie + h), act)
    return out

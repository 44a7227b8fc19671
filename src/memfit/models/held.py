"""What a transformers training step holds beyond what autograd saves, where the frameworks' own code holds it
(issue 32): tensors referenced by a Python local or a cache object, not by a saved-tensor slot, so
saved_tensors_hooks never sees them while MemTracker does.

- The key/value cache (transformers' DynamicCache, built in a training step when `use_cache` is on and the layers
  are not checkpointed): DynamicLayer.update concatenates each layer's k and v into the cache (`torch.cat`: a
  copy), and the attention reads the cache's copies. Where the attention kernel saves those copies themselves they
  are among the saved activations (models.hf_activations' "(the cache's copy)" rows); under autocast SDPA saves its
  own low-dtype casts instead, and a cache copy not already in the low dtype stays referenced by the cache, unsaved,
  until the model's output (which holds the cache) is dropped after the loss: k after the rotary embedding is in
  the residual stream's dtype (apply_rotary_pos_emb multiplies by cos and sin cast to the hidden states' dtype, fp32
  under *-mixed); v, and k without a rotary embedding, in the projection's output dtype (the low dtype from an
  autocast matmul; the input's dtype from a bitsandbytes 4-bit linear, whose forward casts its output back with
  `.to(inp_dtype)`).
- The head's input: the causal LM's forward holds `hidden_states` (the final norm's output) while its head and the
  loss run; where the head does not save it (a frozen head, or autocast's low copy saved instead), it is alive
  through the loss unsaved.
- A chunked output projection under autocast (torchtune's `chunked_output`, LitGPT's `lm_head_chunk_size`: the head
  called once per chunk): autocast caches its cast of a weight only for a leaf that requires a gradient
  (aten/src/ATen/autocast_mode.cpp `cached_cast`: `can_try_cache = ... arg.requires_grad() && arg.is_leaf() ...`),
  so a frozen head's fp32 weight is cast again by every chunk's linear, and each chunk's matmul saves its own copy
  for the input's gradient (a trained head's cast is cached: one copy, as unchunked).
- A bitsandbytes 4-bit linear's backward (bitsandbytes/autograd/_functions.py, 0.50.2, MatMul4Bit.backward:
  `grad_A = torch.matmul(grad_output, F.dequantize_4bit(B, ctx.state).to(grad_output.dtype))`): the whole (out, in)
  weight dequantized in the dtype it was quantized from (quant_state.dtype: transformers quantizes a checkpoint's
  tensor after casting it to the load dtype, core_model_loading.py `_dtype = dtype` for a param that needs
  quantization, then integrations/bitsandbytes.py Bnb4bitQuantize `Params4bit(value, ...)`), and its copy in the
  gradient's dtype where the two differ, alive while the input's gradient is made.
- A LoRA linear on a bitsandbytes 4-bit base under autocast (peft tuners/lora/bnb.py Linear4bit.forward):
  bitsandbytes returns its output cast back to the input's dtype (fp32 from an fp32 residual stream), peft clones
  it (`result = result.clone()`), then the adapter's output (autocast's low dtype) times the scaling is converted to
  the result's dtype (`requires_conversion = not torch.is_autocast_enabled()`: True under CPU autocast, which that
  call does not see) and summed out of place: the base output's clone, the converted adapter output and the sum are
  alive at once, three (T, out) tensors in the input's dtype. (Under CUDA autocast the conversion is skipped and the
  adapter output stays in the low dtype: this figure is then above the device's by one (T, out) in the low dtype
  less one in the input's dtype: the safe side.)

Measured with a dispatch-mode allocation trace at MemTracker's peak on the real tiny models
(tests/ledger/test_combinations.py): GPT-NeoX and Qwen2-MoE QLoRA under bf16-mixed peak at the loss in the forward
with both layers' fp32 cache copies of k and v and the final norm's fp32 output alive and unsaved; Phi-3 QLoRA
under bf16-mixed with full checkpointing peaks at gate_up_proj's sum in layer 0's recomputation, three fp32
(T, 2i) tensors; Qwen2 QLoRA under bf16-mixed with torchtune's chunked loss (8 chunks) peaks at the last chunk's
cross-entropy with eight bf16 copies of the frozen head's weight and the final norm's fp32 output alive; GPT-2
QLoRA bf16-true under full checkpointing peaks at layer 1's c_proj backward with its dequantized (256, 64) weight.
"""

from __future__ import annotations

from memfit.models.hf_act_eval import _layer_types
from memfit.recipe.costs import dtype_bytes

CACHE_COPY = "(the cache's copy)"   # models.hf_activations' label of a k or v the attention reads from the cache


def projection_dtype(roles: dict, quantized: bool, mixed: bool) -> str:
    """The dtype a (LoRA-adapted) projection outputs: the input's (the residual stream's) from a 4-bit base under
    autocast, else what a matmul produces."""
    return roles["act"] if quantized and mixed else roles["lin"]


def cache_copies(kept: list, roles: dict, rotary: bool, quantized: bool, mixed: bool, heads: int = 0,
                 kv_heads: int = 0, frozen: int = 0) -> int:
    """Bytes of one layer's cache copies of k and v that the cache holds and the attention does not save (its
    autocast casts are saved instead; outside autocast, the copies repeat_kv makes: repeated_cache_copies; where
    the attention saves nothing, `frozen`: frozen_cache)."""
    if not mixed:
        if frozen and heads and not any(k.label.startswith(KERNEL_SAVED) for k in kept):
            return frozen
        return repeated_cache_copies(kept, heads, kv_heads)
    out = projection_dtype(roles, quantized, mixed)
    total = 0
    for k in kept:
        if CACHE_COPY not in k.label:
            continue
        dtype = roles["act"] if (rotary and ": k " in f"{k.label} ") else out
        if dtype != roles["low"]:
            elements = 1
            for n in k.shape:
                elements *= n
            total += dtype_bytes(elements, dtype)
    return total


def cache_casts(kept: list, roles: dict, rotary: bool, quantized: bool, mixed: bool) -> int:
    """Under autocast, bytes of one layer's k and v labelled as the cache's copies that the attention saves as
    autocast's low casts of them (the cache's own copy not in the low dtype: cache_copies counts it): in a no-grad
    forward such a cast is the kernel's transient, the cache holds the other copy."""
    if not mixed:
        return 0
    out = projection_dtype(roles, quantized, mixed)
    total = 0
    for k in kept:
        if CACHE_COPY in k.label and (roles["act"] if (rotary and ": k " in f"{k.label} ") else out) != roles["low"]:
            elements = 1
            for n in k.shape:
                elements *= n
            total += dtype_bytes(elements, k.dtype)
    return total


REPEATED = " (repeated to every query head"   # models.hf_act_layers' label of a k or v repeat_kv copied
KERNEL_SAVED = ("attention: ", "q @ k^T")   # what an attention's kernel (sdpa's, eager's matmuls) saves, labelled


def frozen_cache(fam, sizes: dict, roles: dict, quantized: bool, mixed: bool) -> int:
    """One layer's key/value cache copies (DynamicLayer.update's `torch.cat`: k and v, (b, KV, s, d) each, in the
    projections' dtype) where its attention saves none of its inputs: a frozen layer with no trained tensor before
    it (LoRA on o_proj or the MLP alone: layer 0's attention), whose copies the cache alone holds until the model's
    output is dropped after the loss. Outside autocast, on an unquantized base with separate q, k and v projections
    (no latent cache, not Falcon's); 0 elsewhere. Measured (MemTracker with a dispatch-mode trace, Starcoder2 with
    LoRA on o_proj, bf16-true 8 x 128: layer 0's two (8, 2, 128, 16) cat copies alive at the loss, unsaved)."""
    if mixed or quantized or not fam.cache or fam.mla or fam.falcon or fam.qkv != "separate":
        return 0
    return 2 * dtype_bytes(sizes["b"] * sizes["KV"] * sizes["s"] * sizes["d"], roles["lin"])


def repeated_cache_copies(kept: list, heads: int, kv_heads: int) -> int:
    """Outside autocast, bytes of one layer's cache copies of k and v where the attention keeps k and v repeated to
    every query head: with fewer key/value heads than query heads, repeat_kv (models' modeling_*.py: `expand` then
    `reshape`) copies the cache's (b, KV, s, d) tensors, and the attention saves those copies (eager's q @ k^T and
    p @ v; sdpa given a mask, which turns grouped-query sdpa off), so the cache's own copies (DynamicLayer.update's
    `torch.cat`) stay referenced by the cache alone until the model's output is dropped after the loss. With as many
    key/value heads as query heads repeat_kv returns its input: the saved k and v are the cache's own. Measured
    (MemTracker with a dispatch-mode trace at its peak, 32-true, 2 x 64, no checkpointing): Gemma 2 (eager) and
    Starcoder2 (sdpa with a sliding-window mask) peak at the loss in the forward, gpt-oss (eager) at its last layer's
    unsort, each with both layers' (b, KV, s, d) k and v cache copies alive and unsaved."""
    if not heads or not kv_heads or kv_heads >= heads:
        return 0
    total = 0
    for k in kept:
        if (": k" + REPEATED) in k.label or (": v" + REPEATED) in k.label:
            elements = 1
            for n in k.shape:
                elements *= n
            total += dtype_bytes(elements // heads * kv_heads, k.dtype)
    return total


def lora_linear_flight(elements: int, roles: dict, quantized: bool, mixed: bool, input_elements: int = 0,
                       stops: bool = False) -> int:
    """What a LoRA linear holds at its worst op while it is recomputed, beyond what it keeps: `elements` = T x its
    output width. peft's Linear.forward: its base output, the adapter's output and the scaled copy at once
    (`result + lora_B(lora_A(x)) * scaling`; the adapter in its own dtype on a 16-bit base, in the low dtype under
    autocast). On a 4-bit base under autocast: the three (T, out) tensors in the input's dtype of the module
    docstring.

    `input_elements` (T x its input width) where its input comes out of a matmul (the attention's output, the MLP's
    product: the low dtype under autocast): peft casts the input to the adapter's dtype first (`x =
    self._cast_input_dtype(x, lora_A.weight.dtype)`, tuners/lora/layer.py Linear.forward), an fp32 copy under
    autocast, and the local holds it until the forward returns; autocast's lora_A casts it back to the low dtype and
    saves that cast (counted among the kept tensors), so the fp32 copy is alive unsaved through lora_A, lora_B and
    the sum. Measured (MemTracker with a dispatch-mode trace at its peak, Llama all-linear LoRA, bf16-mixed, full
    checkpointing, tests/ledger/test_lora_input_copy.py): the peak is layer 0's recomputation stopped at
    down_proj's lora_B, with down_proj's fp32 (T, i) input copy alive. Outside autocast the copy is lora_A's saved
    input (models.hf_act_ops' `lora_plain` row) and no flight.

    `stops` where this linear's lora_B saves the layer's last kept tensor (its input, lora_A's output): torch's
    non-reentrant checkpoint ends the recomputation at that save, before lora_B's output. On a 4-bit base outside
    autocast (peft's Linear4bit.forward, tuners/lora/bnb.py) its worst op is then `result = result.clone()`: the
    base output (bitsandbytes' gemm_4bit, (T, out) in the input's dtype; the dequantized weight stays inside the op,
    unseen by a dispatch mode and by MemTracker) and its clone. Measured (a dispatch-mode trace, Qwen3 QLoRA
    bf16-true, all-linear, full checkpointing, 2 x 32): layer 1 down_proj's recomputed clone is its worst op and
    lora_B's mm never runs."""
    copy = dtype_bytes(input_elements, roles["ada"]) if mixed and roles["ada"] != roles["lin"] else 0
    if quantized and stops and not mixed:
        return 2 * dtype_bytes(elements, roles["lin"])
    if quantized and mixed:
        return 3 * dtype_bytes(elements, roles["act"]) + copy
    return dtype_bytes(elements, roles["lin"]) + 2 * dtype_bytes(elements, roles["ada_low"]) + copy


def forward_flights(recompute: dict, arrived: int, adapted: bool) -> dict:
    """{part: bytes}: what a part's widest LoRA linear holds at its worst op in the forward, beyond the tensors it
    keeps (the recomputation's flight without the gradients that arrived for the layer's output). Measured: Qwen3 QLoRA
    under bf16-mixed with activation offloading peaks in the forward at up_proj's sum (three fp32 (T, i) tensors)."""
    if not adapted:
        return {}
    return {part: flight - arrived for part, flight in recompute.items() if flight > arrived}


def chunk_weight_casts(elements: int, roles: dict, mixed: bool, head_trains: bool) -> int:
    """Bytes of the autocast copy of the output projection's weight (`elements` = vocab x hidden) that each chunk
    of a chunked head makes and keeps anew (the module docstring): 0 outside autocast and for a trained head."""
    if not mixed or head_trains:
        return 0
    return dtype_bytes(elements, roles["low"])


def dequantized_weight(elements: int, quantized_from: str, grad_dtype: str) -> int:
    """Bytes a 4-bit linear of `elements` (out x in) weights holds in its backward besides the gradients: its
    dequantized weight, and that weight's copy in the gradient's dtype where it differs (the module docstring)."""
    total = dtype_bytes(elements, quantized_from)
    return total + (dtype_bytes(elements, grad_dtype) if grad_dtype != quantized_from else 0)


def unmade_at_flight(part: str, mlp: str, kept_after: list) -> list:
    """Of the kept tensors a part makes after its last LoRA linear's adapter (`kept_after`, in the order the part
    lists them), those not alive at that linear's worst forward op: its output (the sum, which the flight counts
    already) and what is computed from it. In the MLP of a plain (fc_in -> act) or fused gated (gate_up_proj, Phi-3)
    family that is all of them. A gated MLP with separate projections (transformers' LlamaMLP:
    `down_proj(act_fn(gate_proj(x)) * up_proj(x))`: the gate's activation exists before the up projection runs) and
    every other part (attention: the q/k norms run between the projections; a mixture of experts) count none out:
    the safe side (under activation offloading, Qwen3 QLoRA under bf16-mixed measured 0.915 with the up projection's
    output counted out). Measured: Phi-3 QLoRA at gate_up_proj's sum in the forward (MemTracker)."""
    if part != "mlp" or mlp not in ("plain", "gated_fused"):
        return []
    return list(kept_after)


def checkpoint_kwargs(cfg: dict, fam, attention: str, checkpointing: str, sizes: dict, roles: dict) -> list:
    """Under full checkpointing with eager attention (Gemma 2's default: transformers refuses it sdpa), the model's
    float masks: one (b, 1, s, s) additive mask per attention type its layers use (create_causal_mask,
    create_sliding_window_causal_mask: in the embeddings' dtype, fp32 under autocast over fp32 weights), handed to
    each layer as its attention_mask keyword. GradientCheckpointingLayer checkpoints `partial(forward, self,
    **kwargs)`, so the recomputation's closure holds the mask, unsaved (eager's `attn_weights + attention_mask` saves
    none), until that layer's backward: each mask lives until the backward of the lowest layer taking it. (bytes,
    that layer) each. Measured: a dispatch-mode trace at MemTracker's peak, LoRA q, v, 2 x 64: Gemma 2 in layer 1's
    post-feedforward norm backward holds both masks (bf16-true, bf16-mixed: fp32), gpt-oss in layer 0's backward
    the sliding one alone (layer 1's causal mask gone with layer 1's backward)."""
    eager = attention == "eager" or (attention == "sdpa" and not fam.sdpa)
    if checkpointing != "full" or not eager or fam.head != "causal" or fam.falcon:
        return []
    types = _layer_types(cfg)
    mask = dtype_bytes(sizes["b"] * sizes["s"] * sizes["s"], roles["act"])
    return [(mask, types.index(t)) for t in ("full_attention", "sliding_attention") if t in types]

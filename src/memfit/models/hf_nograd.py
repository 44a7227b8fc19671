"""What a transformers decoder's forward under `torch.no_grad()` (the evaluation pass, ledger/passes.py) holds at its
worst moments beyond the training rows' own tensors: nothing is saved for a backward there, so the tensors a
training step's rows keep are freed as soon as no Python name holds them, and what is alive is what the model's and
the layers' code still references:

- the embeddings' output: the decoder's forward binds it to `inputs_embeds` (modeling_llama.py LlamaModel.forward:
  `hidden_states = inputs_embeds`, then the loop rebinds `hidden_states` only), so it stays alive until that
  forward returns, through every layer and the final norm (the causal LM's head and loss run after it returned: its
  locals, these and the masks, are freed by then; in a training step the first layer's norm saves it);
- a layer's input: the model's loop (`hidden_states = decoder_layer(hidden_states, ...)`) references it while the
  layer runs, after the layer's first part (its input norm) is done with it (from the second layer on: the first
  layer's input is the embeddings' output);
- the key/value cache (DynamicCache, built in eval as `use_cache` is on): each layer's `torch.cat` copies of k and v
  stay referenced by the cache until the model's output is dropped after the loss, beside every later layer (in a
  training step the attention saves them, so they are counted once, as that layer's);
- eager attention's float masks (masking_utils.create_causal_mask / create_sliding_window_causal_mask for the eager
  interface: a (b, 1, s, s) additive mask in the embeddings' dtype, one per layer type, made before the first layer
  and held by the forward's `causal_mask_mapping` through all of them);
- sdpa's sliding-window mask where a window is shorter than the sequence: a (1, 1, s, s) bool made before the first
  layer and held by `causal_mask_mapping` through all of them (no padding mask given; sdpa's full layers get None);
- eager attention's scores beside their softmax: `attn_weights = attn_weights + attention_mask` is still bound while
  `softmax(attn_weights)` writes its (b, H, s, s) result (training saves the probabilities only); gpt-oss's sinks
  (modeling_gpt_oss.py eager_attention_forward) make it three: the scores, `torch.cat([attn_weights, sinks])` and
  `combined_logits - max` (b, H, s, s + 1) each, while the cat is still bound. torch's math kernel (sdpa where no
  fused kernel takes the call: Falcon's multi-query attention, DeepSeek-V3's q/k head dim unlike v's) makes its
  scores too, in fp32 whatever q's dtype;
- DeepSeek-V3's latent attention: q_b_proj's and kv_b_proj's whole outputs (the heads' views keep them), the
  unscaled q beside the kernel's scaled copy, the rotary key expanded to every head; its cache holds the latent
  (kv_a_proj's compressed kv and rotary key);
- each part's own worst op (part_deltas: a norm's intermediates freed, the MLP's product, the experts' unsort;
  Cohere's rotary embedding, on fp32 copies of q and k, rotary_fp32);
- under autocast (bf16-mixed): autocast's cast of every trained weight, cached (aten autocast_mode.cpp `cached_cast`
  keeps the cast of a leaf that requires a gradient, grad mode or not) from its linear's call until the autocast
  region exits after the loss; each linear's cast of its input made for its call only, beside the norm's output in
  the residual stream's dtype; the cache's own copies of k (fp32 after the rotary embedding) and v (the projection's
  low dtype), autocast's casts the training rows save for k being the kernel's transients; the rotary q in fp32
  (`q * cos`, cos fp32) beside autocast's cast for the kernel, a k repeated from the cache's fp32 one too
  (rotary_upcasts); DeepSeek-V3's q cat, its rotary part and its cached latent in fp32;
- under autocast, eager attention with an fp32 softmax and a rotary q (Gemma 2): the scores plus the fp32 mask are
  fp32, softmax's fp32 output beside them, no cast back (q is fp32), autocast's cast of the probabilities for p @ v
  made after that sum is freed;
- below fp32, the MLP's norm upcast of its input to fp32 is freed with the norm's call, the 16-bit residual it read
  left;
- under LoRA (a frozen base, peft's adapters): the base's no-grad forward makes what a trained base saves (the
  frozen rows leave out what only its weights' gradients need: frozen_unsaved adds it back), and each adapter's
  own tensors (its input cast to the adapter's dtype, lora_A's output) are freed with its linear's call; an
  adapted o_proj peaks in its adapter's call (x's cast, lora_B's output and its scaled copy beside the base's
  output, the attention's rotary q (fp32 under autocast) and output, a fused q, k, v projection's whole output,
  the layer's norm output), the attention at its kernel after its q, k, v adapters' flight or at the widest
  adapter's own call where that is larger (adapted_projections), an adapted MLP part at its last adapter's call
  (adapted_mlp: the residual, the norm's output, x's cast to the adapter's dtype, act_fn(gate) or the product). (The loss: the head's input, where the head does not save it, is counted once, in the
  loss's held bytes: ledger.passes.)

Measured: tests/ledger/test_eval_families.py (MemTracker around transformers' no-grad forward with the labels, as the
Trainer's prediction_step runs it, against `memfit check` with training.eval_batch)."""

from __future__ import annotations

from memfit.models import held, hf_activations as acts, hf_encdec, hf_parts
from memfit.models.hf_nograd_t5 import nograd_t5
from memfit.models.hf_act_eval import _parallel, _windowed, layer_sizes, role_dtypes
from memfit.models.hf_act_families import FAMILIES
from memfit.models.hf_act_flights import lora_forward_flights
from memfit.recipe.costs import dtype_bytes


def _elements(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# a norm's own intermediates (its statistics, its normalized input before the weight multiplies it): a no-grad
# forward frees them as soon as the norm's output exists (models.hf_act_layers' labels)
NORM_INNER = (": 1/rms", ": normalized", ": mean (fp32)", ": 1/std", ": 1 + weight")
NORM_UPCAST = "post_attention_layernorm: input, upcast to fp32"   # (models.hf_act_layers' label, below fp32 a copy)
ACT_INPUT = "act_fn(gate): input"   # a gated MLP's gate projection output: freed once act_fn(gate) is made
PROJECTION_INPUT = ("down_proj: input", "fc_out")   # the MLP's product (or activation) the output projection reads
DENSE = ("gated", "gated_fused", "plain")
KERNELS = ("attention: ", "q @ k^T")   # an attention part with sdpa's or eager's kernel
QK_NORM_INPUT = ("q_norm: input", "k_norm: input")
EAGER_OUT = "o_proj: input"   # eager's p @ v output transposed to (b, s, H*d) (sdpa's is its kernel's output)
AFTER_ATTENTION = "post_attention_layernorm: input"   # a norm after the attention: its input, the attention's output
DROPOUT = "dropout"   # a dropout's mask or output: model.eval() runs none
MASK_BIAS = "mask as a float bias"   # sdpa given a window's mask: its float bias, freed before the output's copy
FUSED_VIEW = "view of the fused qkv output"   # the row keeps the fused output whole already (GPT-2's q)
MOE = ("moe", "moe_shared", "moe_phi", "moe_oss")   # transformers' grouped experts (integrations/moe.py)
# the grouped experts' gate_up output and its activation's tensors, down's input: freed before the unsort
EXPERT_INNER = ("act_fn(gate), * up", "act * up", "grouped_mm down: input")
# Qwen2-MoE's shared expert, run before the routed experts: its intermediates freed once its output exists
SHARED_INNER = ("(shared expert)", "shared_expert.down_proj: input", "sigmoid: output")
# DeepSeek-V3's latent attention: the low-rank norms' inputs and the up-projections' inputs are freed once read,
# v's contiguous copy is made after the kernel's scores (modeling_deepseek_v3.py DeepseekV3Attention.forward)
MLA_FREED = ("q_a_layernorm: input", "q_b_proj: input", "kv_b_proj: input", "p @ v: v (a contiguous copy")
CORE = ("softcap tanh", "softmax")
P_CAST = "p @ v: probabilities, cast"   # eager's probabilities cast for p @ v (autocast's, or back to q's dtype)
ADAPTER = (".lora_A: ", ".lora_B: ", ".lora_dropout: ")   # a LoRA adapter's kept tensors: freed with its linear's call
# what an adapted o_proj's call finds bound in the attention's forward, as sdpa's rows label it: the rotary q and the
# kernel's output. Eager's and torch's math kernel's rows (Gemma 2, gpt-oss, DeepSeek-V3; Falcon's keeps no output)
# label them otherwise: nothing (or q only) is counted there, and their kernel's moment, holding the scores beside
# the probabilities, is the attention's worst (tests/ledger/test_eval_families.py pins it)
O_PROJ_ALIVE = ("attention: q", "attention: output")
# autocast's casts: a linear's input (made for its call, freed after it) and a trained weight's (cached by autocast
# until the autocast region exits: `cached_cast` keeps the cast of a leaf that requires a gradient)
INPUT_CAST = ": input, cast to the low dtype by autocast"
WEIGHT_CAST = ": weight, cast to the low dtype by autocast"   # eager attention's (b, H, s, s) tensors the training row keeps


def _bytes(k) -> int:
    return dtype_bytes(_elements(k.shape), k.dtype)


def part_deltas(parts: list, fam, hidden: int, qkv: int, parallel, bmm: bool = False) -> dict:
    """{part: bytes}: what a layer part's no-grad worst moment differs by from its training row's (its kept tensors
    and its output). `parts`: the layer's (part, kept) in forward order (models.hf_parts.layer_parts); `fam` its
    ActivationRules; `hidden` one (b, s, h) in the residual stream's dtype; `qkv` a fused projection's whole output
    (0 where q, k and v are separate); `parallel`: attention and MLP read the layer's input side by side ("shared":
    one norm's output, Falcon-7B's layout); `bmm`: the attention's scores are made as a tensor (eager, or torch's
    math kernel: Falcon's multi-query attention under sdpa).

    - a norm's intermediates are freed once its output exists (NORM_INNER); no dropout runs (model.eval());
    - the attention's worst moment is its kernel: q_norm's and k_norm's inputs (the raw projections) are freed; a
      fused projection's output stays whole (q, k, v are views of it, v's held to the end); eager's comes at its
      softmax, before p @ v's output and its transposed copy (o_proj's input) and the part's output exist; sdpa's
      at its output's transposed copy (`.contiguous()`, the part's output's size), or given a window's mask at the
      kernel (its float bias, made for the call, is freed before the copy);
    - a dense MLP's worst moment is its last op before the output projection (the product act_fn(gate) * up, or
      the plain MLP's activation): the projection's input made (the next part's first kept tensor), the gate
      projection's output freed where a product follows, the part's output not yet made (an activation written as
      a chain of ops, GPT-2's gelu_new, peaks among its own intermediates, which the row keeps); where a norm follows the
      attention (Gemma 2/3's sandwich, OLMo 2) its input (the attention's output) is freed by then;
    - grouped experts (integrations/moe.py grouped_mm_experts_forward): the MLP part's worst moment is its
      product (the gate_up output, the activation and the product alive beside the routed tokens), the down
      part's its unsort (ledger's forward_early), by when those are freed and the MLP part's own tensors (the
      norm's input and output, the router's, the routed tokens) are still bound; a shared expert (Qwen2-MoE) has
      run before them: only its output is left;
    - attention and MLP side by side (GPT-NeoX's parallel residual, Cohere's shared input): the attention's output
      is held through the MLP (`mlp_output + attn_output + hidden_states`), and Cohere's one norm's output too."""
    out = {}
    for n, (part, kept) in enumerate(parts):
        delta = -sum(_bytes(k) for k in kept if any(x in k.label for x in NORM_INNER) or DROPOUT in k.label
                     or k.label.startswith(MLA_FREED))
        # a 16-bit model's RMSNorm upcast of its input (`hidden_states.to(torch.float32)`) before the MLP: freed
        # with the norm's call, its input (the residual after the attention) left
        upcast = sum(_bytes(k) - hidden for k in kept if k.label.startswith(NORM_UPCAST) and _bytes(k) > hidden)
        delta -= upcast
        casts = sum(_bytes(k) for k in kept if INPUT_CAST in k.label)
        if casts:   # under autocast: the linears read the norm's output (in the residual stream's dtype), each
            delta += hidden - casts   # casting it for its own call (a transient of its call)
        if part == "attention" and any(k.label.startswith(KERNELS) for k in kept):
            delta -= sum(_bytes(k) for k in kept if k.label.startswith(QK_NORM_INPUT))
            delta += 0 if any(FUSED_VIEW in k.label for k in kept) else qkv
            if bmm or any(k.label.startswith("q @ k^T") for k in kept):
                delta -= sum(_bytes(k) for k in kept if k.label.startswith(EAGER_OUT)) + hidden
            elif any(MASK_BIAS in k.label for k in kept):
                delta -= hidden
            if casts and fam.rope:
                delta += rotary_upcasts(kept)
            if fam.rope_fp32:
                delta = max(delta, rotary_fp32(kept, hidden))
        if part == "mlp" and fam.mlp in DENSE and n + 1 < len(parts):
            later = parts[n + 1][1]
            product = next((_bytes(k) for k in later if k.label.startswith(PROJECTION_INPUT)), None)
            composed = sum(1 for k in kept if k.label.startswith("act: ")) > 1
            if product is not None and not composed:
                gate = sum(_bytes(k) for k in kept if k.label.startswith(ACT_INPUT))
                delta += product - gate - hidden
            elif composed:   # its intermediates are its worst moment, the product made from two of them
                delta -= hidden
            if fam.sandwich in ("pre_post", "post"):
                delta -= sum(_bytes(k) for k in kept if k.label.startswith(AFTER_ATTENTION))
        if part == "mlp" and fam.mlp in MOE and n + 1 < len(parts):
            shared = sum(_bytes(k) for k in kept if any(x in k.label for x in SHARED_INNER))
            alive = sum(_bytes(k) for k in kept if not any(x in k.label for x in NORM_INNER)) - shared - upcast
            experts = sum(_bytes(k) for k in parts[n + 1][1] if k.label.startswith(EXPERT_INNER))
            if experts:
                out[parts[n + 1][0]] = alive - experts
                delta += experts - hidden - shared
        if part in ("mlp", "down_proj") and (parallel or fam.shared_input):
            delta += hidden * (2 if fam.shared_input or parallel == "shared" else 1)
        out[part] = out.get(part, 0) + delta
    return out


def rotary_upcasts(kept: list) -> int:
    """Under autocast, what a rotary attention's sdpa kernel has alive beyond the low-dtype q and k its row keeps:
    the rotary embedding's q, in fp32 (`q * cos`, cos fp32: no autocast op, the type promotes), stays bound in the
    attention's forward beside autocast's cast of it for the kernel; where k is repeated to every query head
    (repeat_kv of the cache's fp32 rotary k) the repeated copy is fp32 too, beside its cast. Eager's worst moment
    is its softmax, after `q @ k^T`: autocast's casts of q and k made for that matmul are freed by then, their
    fp32 originals still bound."""
    out = 0
    for k in kept:
        if k.dtype == "float32":
            continue
        if k.label == "attention: q" or k.label.startswith("attention: k" + held.REPEATED):
            out += dtype_bytes(_elements(k.shape), "float32")
        elif k.label == "q @ k^T: q" or k.label.startswith("q @ k^T: k" + held.REPEATED):
            out += dtype_bytes(_elements(k.shape), "float32") - _bytes(k)
    return out


def rotary_fp32(kept: list, hidden: int) -> int:
    """What Cohere's attention part's rotary moment differs by from its training row's (kept tensors and the
    kernel's output copy, ledger.passes): its apply_rotary_pos_emb (modeling_cohere.py) binds fp32 copies of q and k
    (`q = q.float(); k = k.float()`, none where q is fp32 already) while the caller still holds q, k and v (the
    projections' views) beside the norm's output and the layer's input; then `(q * cos) + (rotate_half(q) * sin)`
    holds `q * cos`, rotate_half's stacked copy and its product with sin (or their sum) at once, q's rotated copy
    stays bound while k's makes the same three, and the casts back come last (q's and k's rotated fp32 copies beside
    their low-dtype casts)."""
    def size(prefix):
        return sum(_bytes(k) for k in kept if k.label.startswith(prefix))

    q, k, v, normed = size("attention: q"), size("attention: k"), size("attention: v"), size("q_proj/k_proj/v_proj: input")
    low = next((x.dtype for x in kept if x.label.startswith("attention: q")), "float32") != "float32"
    q32, k32 = (sum(dtype_bytes(_elements(x.shape), "float32") for x in kept if x.label.startswith(f"attention: {n}"))
                for n in ("q", "k"))
    copies = q32 + k32 if low else 0
    rotary = copies + max(3 * q32, q32 + 3 * k32, q32 + k32 + (q + k if low else 0))
    flight = size("attention: output")   # the kernel's output copy (sdpa's transposed output) the row counts
    return hidden + normed + q + k + v + rotary - sum(_bytes(x) for x in kept) - flight


def frozen_unsaved(trained: list, frozen: list, hidden: int = 0, lin: str = "float32", flights: dict | None = None,
                   q32: bool = False, fused: int = 0) -> dict:
    """{part: bytes}: what a layer's parts keep for backward when its weights train (`trained`, each (part, kept))
    and not when they are frozen (`frozen`: LoRA's base, which saves nothing for its weights' gradients: a norm's
    normalized input, a projection's or the routed tokens' input): a no-grad forward makes those tensors either way,
    so the frozen rows' no-grad moments are the trained rows' (part_deltas) with these added back; each adapter's own
    kept tensors (its input's cast, lora_A's output) are freed with its linear's call.

    An adapted o_proj's part (its row keeps only its adapter's tensors, a dropout's mask that evaluation does not
    make, or under autocast the frozen weight's cast, which a no-grad call frees with it) peaks in its adapter's call (peft tuners/lora/layer.py Linear.forward: `x = self._cast_input_dtype(x,
    lora_A.weight.dtype)`, then `result = result + lora_B(lora_A(dropout(x))) * scaling`; the row's forward flight
    counts the base's output, lora_B's and the scaled copy): x's cast to the adapter's dtype (none where `lin`, the
    linears' dtype, is the adapter's) is still bound, and so are the attention's locals (modeling_llama.py
    LlamaAttention.forward: its rotary q and the kernel's output, o_proj's input: O_PROJ_ALIVE, read off the base's
    rows as trained, which keep them whatever the adapters; `q32`: under autocast the rotary q is fp32, `q * cos`
    with cos fp32; where the base's o_proj keeps its own input, the kernel's output copied, that copy instead of the
    kernel's), a fused q, k, v projection's whole output (`fused`: q, k and v are its views) and the decoder layer's
    norm output (`hidden`, the residual stream's dtype). Measured (MemTracker with a dispatch-mode trace):
    Starcoder2 without a window, LoRA on o_proj, bf16-mixed 8 x 128, peaks at layer 1 o_proj's scaled copy with
    the fp32 rotary q, the kernel's output, the norm's output and the adapter's tensors alive (memfit was 0.901:
    this moment skipped for the frozen weight's cast its row keeps); GPT-NeoX all-linear 32-true at its dense
    adapter's with query_key_value's (T, 3h) output bound.

    The attention part's no-grad worst moment is its kernel (part_deltas, from its output's write), after its q, k
    and v adapters' calls: the adapters' forward flight its row counts (`flights`, hf_act_flights
    .lora_forward_flights) in place of that output is gone by then."""
    out = {}
    previous: list = []
    for (part, kept), (_, own) in zip(trained, frozen):
        labels = {k.label for k in own}
        adapters = sum(_bytes(k) for k in own if any(a in k.label for a in ADAPTER))
        out[part] = sum(_bytes(k) for k in kept if k.label not in labels) - adapters
        # a dropout's mask the frozen rows keep at this part and the trained ones at another (the parts are split by
        # position): the step's row counts it, though model.eval() makes none (part_deltas drops the trained rows').
        # In an adapted MLP those made after its last adapter are not yet made at that adapter's moment, which the
        # step's row prices without them already (ledger.training, held.unmade_at_flight): left as they are there
        last = max((n for n, k in enumerate(own) if ".lora_B: " in k.label), default=None)
        unmade = {id(k) for k in own[last + 1:]} if part == "mlp" and last is not None else set()
        trained_labels = {k.label for k in kept}
        out[part] -= sum(_bytes(k) for k in own if DROPOUT in k.label and k.label not in trained_labels
                         and not any(a in k.label for a in ADAPTER) and id(k) not in unmade)
        # (a dropout's mask beside them, the residual's: model.eval() runs no dropout, so the evaluation makes none)
        base_casts = sum(_bytes(k) for k in own if WEIGHT_CAST in k.label and not any(a in k.label for a in ADAPTER))
        if part == "o_proj" and adapters and all(any(a in k.label for a in ADAPTER) or DROPOUT in k.label
                                                 or WEIGHT_CAST in k.label for k in own):
            cast = sum(_bytes(k) for k in own if ".lora_A: " in k.label and k.dtype != lin)
            # (where the base's o_proj keeps its own input, the kernel's output copied, that copy is the one alive:
            # added back above, GPT-NeoX's)
            copied = any(k.label.endswith(": input") for k in kept)
            alive = sum(dtype_bytes(_elements(k.shape), "float32") if q32 and k.label == "attention: q" else _bytes(k)
                        for k in previous if k.label in O_PROJ_ALIVE and not (copied and k.label == "attention: output"))
            out[part] += cast + alive + hidden + fused - base_casts
        if part == "attention" and (flights or {}).get(part, 0) > hidden:
            out[part] -= flights[part] - hidden
        previous = kept   # (the base as trained: a frozen attention with no adapter before it saves none of them)
    return out


def adapted_mlp(part: str, trained: list, own: list, delta: int, fam, hidden: int, lin: str, flight: int,
                residual: int = 0, side: int = 0) -> int | None:
    """What a LoRA-adapted dense MLP's part's (`part`: "mlp" or "down_proj") no-grad worst moment differs by from
    its row's (`own`: the part's kept tensors under LoRA, beside its forward flight: the adapter's, less what is made
    after it, held.unmade_at_flight; `delta`: part_deltas of `trained`, the base's rows as trained), as
    frozen_unsaved's entry for that part; None where the part has no adapter or is not a dense MLP. The larger of
    two moments:

    - the base's own worst (its product or activation, as a trained base: `trained`'s kept, its output, `delta`);
    - its last adapter's (peft tuners/lora/layer.py Linear.forward: the base's output, lora_B's and the scaled copy,
      `flight`): the decoder layer's residual (the norm's input, `residual`: 0 where it is the layer's input or
      the MLP's own input) and the norm's output (`x`, bound in the MLP's forward, `hidden`: (b, s, h) in the
      residual stream's dtype); x cast to the adapter's dtype where it differs (the adapter's lora_A input below
      fp32, bound by peft's `x` through the call); in a gated MLP with separate
      projections (LlamaMLP: `down_proj(act_fn(gate_proj(x)) * up_proj(x))`) adapted last at the up projection,
      act_fn(gate) (the gate's own output freed once it is made); at the output projection (down_proj, c_proj) its
      input (the product or the activation), whose fp32 copy under autocast its flight counts; what a parallel
      layout holds beside (`side`: the attention's output). Not yet made: the product, the activation's later
      ops; lora_A's output is freed once lora_B has read it.
    Measured (MemTracker with a dispatch-mode trace at its peak, tests/ledger/test_eval_families.py): Llama with
    LoRA on gate_proj and up_proj, 32-true 8 x 128, peaks at layer 1 up_proj's scaled copy with the residual, the
    norm's output, act_fn(gate) and up's three (T, i) alive (memfit was 1.165 counting the gate's output, up's sum
    and the training rows' product); GPT-2 with LoRA on c_fc, bf16-true, at c_fc's scaled copy with ln_2's input
    and output, c_fc's input cast to fp32 and its three (T, i) (0.906: the cast left out); Llama all-linear under
    bf16-mixed at layer 1 down_proj's scaled copy, with the residual, the norm's output, the bf16 product, its fp32
    copy and down's three (T, h)."""
    if fam.mlp not in DENSE:
        return None
    last = [n for n, k in enumerate(own) if ".lora_B: " in k.label]
    if not last:
        return None
    unmade = sum(_bytes(k) for k in held.unmade_at_flight(part, fam.mlp, own[last[-1] + 1:]))
    row = sum(_bytes(k) for k in own) + max(hidden, flight - unmade) + delta
    base = sum(_bytes(k) for k in trained) + hidden + delta
    cast = max((_bytes(k) for k in own if ".lora_A: " in k.label and k.dtype != lin), default=0)
    up = fam.names.get("up", "").rsplit(".", 1)[-1]
    act = sum(_bytes(k) for k in trained if k.label.startswith("act * up: act_fn(gate)")) if (
        fam.mlp == "gated" and up and own[last[-1]].label.startswith(up + ".")) else 0
    if part == "down_proj":   # (its input, the MLP's product)
        act = sum(_bytes(k) for k in trained if k.label.startswith(PROJECTION_INPUT))
    cached = sum(_bytes(k) for k in own if WEIGHT_CAST in k.label and ".lora_" in k.label)   # (autocast's, held)
    return max(base, residual + hidden + cast + act + flight + side + cached) - row


def adapted_projections(own: list, delta: int, unsaved: int, hidden: int, lin: str, flight: int) -> int:
    """frozen_unsaved's `attention` entry (`unsaved`), raised where the attention's widest adapted projection's own
    moment is above its kernel's (`own`: the part's kept tensors under LoRA; `delta`: part_deltas of the base's rows
    as trained): peft's Linear.forward holds the base's output, lora_B's and the scaled copy (`flight`) beside the
    layer norm's output (`hidden`) and, below fp32, that output cast to the adapter's dtype; the first projection
    (q, or the fused q, k, v) runs with none of the others' outputs made. Measured (MemTracker with a dispatch-mode
    trace at its peak): GPT-NeoX all-linear, bf16-true 8 x 128, peaks at layer 1 query_key_value's scaled copy,
    its fp32 adapter's (T, 3h) output and scaled copy beside the base's bf16 output and the fp32 cast of the norm's
    output (memfit was 0.876 counting its kernel's moment only)."""
    if not any(".lora_B: " in k.label for k in own):
        return unsaved
    row = sum(_bytes(k) for k in own) + max(hidden, flight) + delta + unsaved
    cast = max((_bytes(k) for k in own if ".lora_A: " in k.label and k.dtype != lin), default=0)
    cached = sum(_bytes(k) for k in own if WEIGHT_CAST in k.label and ".lora_" in k.label)
    return unsaved + max(0, hidden + cast + flight + cached - row)


def cache_bytes(kept: list, heads: int, kv_heads: int, cache: bool) -> tuple:
    """One layer's key/value cache copies (its (b, KV, s, d) k and v) as the training rows label them: (all their
    bytes, those among the attention's own kept tensors: the copies it reads, held.CACHE_COPY). Where repeat_kv
    copies them to every query head the attention keeps the repeated copies: the cache's are the heads' share."""
    if not cache:
        return 0, 0
    total = own = 0
    for k in kept:
        if held.CACHE_COPY in k.label:
            total += _bytes(k)
            own += _bytes(k)
        elif heads and kv_heads and kv_heads < heads and ((": k" + held.REPEATED) in k.label or (": v" + held.REPEATED) in k.label):
            total += dtype_bytes(_elements(k.shape) // heads * kv_heads, k.dtype)
    return total, own


def described(cfg: dict) -> bool:
    """Whether a model's no-grad forward is described here: a causal decoder (not an encoder-decoder, an encoder,
    Falcon's ALiBi, LLaVA, nor a Qwen-VL, whose vision tower is its embeddings row: its no-grad forward, one tower
    layer at a time, is not described, and the row's saved tensors all at once would price every tower layer
    together)."""
    fam = FAMILIES.get(cfg.get("model_type"))
    return not (fam is None or fam.head != "causal" or fam.llava or (fam.falcon and cfg.get("alibi")) or cfg.get("qwen_vl"))


def nograd_forward(cfg: dict, run: dict, recipe_args: dict, dtypes: dict | None) -> dict | None:
    """What a model's no-grad forward holds beside the step's rows at `run`'s micro-batch (its training keys:
    micro_batch, seq_len, attention), as the fields of ledger.passes.NoGrad (nograd_held's, with `head_cast`; an
    encoder-decoder's: the moments of its whole forward, `moments`); None where that is not described (`described`,
    hf_nograd_t5.nograd_t5). `recipe_args`: the recipe's keys the rows take (precision,
    lora, ...); `dtypes`: the model's."""
    precision = recipe_args.get("precision", "32-true")
    if hf_encdec.is_stacked(cfg):   # an encoder-decoder (T5): its forward's own moments (models.hf_nograd_t5)
        moments = nograd_t5(cfg, run["micro_batch"], run["seq_len"], recipe_args.get("target_len"), run["attention"],
                            precision, recipe_args.get("lora"), dtypes)
        return {"moments": moments} if moments is not None else None
    if not described(cfg):   # (decided before the rows are built: nothing to build them for)
        return None
    fam = FAMILIES[cfg["model_type"]]
    shape = {"micro_batch": run["micro_batch"], "seq_len": run["seq_len"], "attention": run["attention"], "checkpointing": "none", "dtypes": dtypes}
    blocks = acts.saved(cfg, **shape, **recipe_args)
    layers = [hf_parts.layer_parts(blk.kept, fam) for blk in blocks[1:-2] for _ in range(blk.count)]
    unsaved = None
    if recipe_args.get("lora") is not None:
        # a frozen base saves less (nothing for its weights' gradients), but its no-grad forward makes the same
        # tensors: described from the rows of the base as trained, with what the frozen rows leave out added back
        trained = acts.saved(cfg, **shape, **{**recipe_args, "lora": None})
        full = [hf_parts.layer_parts(blk.kept, fam) for blk in trained[1:-2] for _ in range(blk.count)]
        sizes, roles = layer_sizes(cfg, run["micro_batch"], run["seq_len"], attention=run["attention"]), role_dtypes(precision, dtypes)
        hidden = dtype_bytes(sizes["b"] * sizes["s"] * sizes["h"], roles["act"])
        quantized, mixed = bool((dtypes or {}).get("quantized")), precision.endswith("-mixed")
        flights = lora_forward_flights(cfg, sizes, recipe_args["lora"], roles, quantized, mixed)
        # (under autocast a rotary q is fp32: `q * cos`, cos fp32, rotary_upcasts)
        q32 = mixed and bool(fam.rope)
        # a fused q, k, v projection's whole output (GPT-NeoX's query_key_value: q, k, v its views, bound in the
        # attention's forward through its output projection)
        fused = dtype_bytes(sizes["b"] * sizes["s"] * sizes["qkv"], roles["lin"]) if fam.qkv == "fused" else 0
        unsaved = [frozen_unsaved(a, b, hidden, roles["lin"], flights, q32, fused) for a, b in zip(full, layers)]
        adapted, layers = layers, full
    found = nograd_held(cfg, run["micro_batch"], run["seq_len"], run["attention"], precision, dtypes, layers,
                        adapted if unsaved is not None else None)
    if found is None:
        return None
    if unsaved is not None:
        # beside an adapted MLP: the decoder layer's residual (none of its own where the attention and the MLP run side
        # by side, `x + attn_output + mlp_output`: the layer's input, held already; nor in OLMo 2's post-norm layout,
        # whose MLP reads the residual itself), and the attention's output where they run side by side
        parallel = bool(_parallel(cfg) or fam.shared_input)
        residual = 0 if parallel or fam.sandwich == "post" else hidden
        side = hidden if parallel else 0
        for n, (trained, own) in enumerate(zip(layers, adapted)):
            for part in ("mlp", "down_proj"):
                moment = adapted_mlp(part, dict(trained).get(part, []), dict(own).get(part, []), found["parts"][n].get(part, 0),
                                     fam, hidden, roles["lin"], flights.get(part, 0), residual, side)
                if moment is not None:
                    unsaved[n][part] = moment
            unsaved[n]["attention"] = adapted_projections(dict(own).get("attention", []), found["parts"][n].get("attention", 0),
                                                          unsaved[n].get("attention", 0), hidden, roles["lin"], flights.get("attention", 0))
        found["parts"] = [{p: d.get(p, 0) + u.get(p, 0) for p in {*d, *u}} for d, u in zip(found["parts"], unsaved)]
        # autocast caches a cast of a weight that requires grad only: the adapters', not the frozen base's
        found["casts"] = weight_casts(adapted, trained_only=True)
    # the head's weight cast (its row is blocks[-2], the final norm's and the head's), cached to the forward's end
    # where the head trains: the loss runs inside the forward, labels given
    found["head_cast"] = sum(weight_casts([[("head", blocks[-2].kept)]], trained_only=unsaved is not None)[0].values())
    return found


def nograd_held(cfg: dict, micro_batch: int, seq_len: int, attention: str, precision: str, dtypes: dict | None,
                layer_parts: list, step_parts: list | None = None) -> dict | None:
    """{"masks", "cache", "own_cache", "attention", "parts"}: what a no-grad forward holds beyond the training rows
    at each layer part and the loss: eager's masks and GPT-2's token embeddings beside their sum with the
    positions' (`masks`, at every layer of the decoder: freed with its forward, before the head); each layer's
    cache copies (`cache`, a list in layer order, less what the training rows already hold unsaved (held.cache_copies): a
    layer's and all earlier ones' alive from its attention on, and at the loss; `own_cache`: those among its
    attention's kept tensors); eager attention's extra scores at the attention part (`attention`); each layer's
    part_deltas (`parts`). `layer_parts`: each layer's (part, kept) (models.hf_parts.layer_parts of
    models.hf_activations.saved, no checkpointing); `step_parts`: the rows the step itself was built from where they
    differ (LoRA's frozen base: `layer_parts` are then the base's rows as trained): the cache copies the step's rows
    hold unsaved are those rows' (ledger.training), so the rest of each layer's cache is counted here (a frozen
    layer 0 under LoRA on o_proj alone saves no k or v: its repeated copies, and so the cache's own, were counted by
    neither). None for a model this does not describe (an encoder-decoder, an encoder, Falcon's ALiBi, LLaVA). (The
    embeddings' output and a layer's input are the step's own tensors: ledger.passes holds them by id.)"""
    if not described(cfg):
        return None
    fam = FAMILIES[cfg["model_type"]]
    roles = role_dtypes(precision, dtypes)
    sizes = layer_sizes(cfg, micro_batch, seq_len, attention=attention)
    b, s, heads = sizes["b"], sizes["s"], sizes["H"]
    hidden = dtype_bytes(b * s * sizes["h"], roles["act"])
    qkv = dtype_bytes(b * s * sizes["qkv"], roles["lin"]) if fam.qkv == "fused" else 0
    eager = attention == "eager" or (attention == "sdpa" and not fam.sdpa)
    # Falcon: multi-query attention under sdpa runs torch's math kernel; its float mask is made inside the attention
    # (`attention_mask_float`, or sdpa's own from the bool mask) and freed after it
    falcon_bmm = fam.falcon and (eager or (not cfg.get("new_decoder_architecture") and bool(cfg.get("multi_query"))))
    # DeepSeek-V3's latent attention under sdpa, its q/k head dim not v's: torch's math kernel, its scores a tensor
    # (the model's mask a (1, 1, s, s) bool: no (b, s, s) float one)
    mla_math = fam.mla and attention == "sdpa" and cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"] != cfg["v_head_dim"]
    masks = scores = 0
    quantized, mixed = bool((dtypes or {}).get("quantized")), precision.endswith("-mixed")
    if eager or falcon_bmm or mla_math:
        kinds = set(cfg.get("layer_types") or ()) or {"full_attention"}
        masks = len(kinds) * dtype_bytes(b * s * s, roles["act"]) if not mla_math else 0
        # the scores and their softmax (or each of the softcap's steps and its input: two at once), less what the
        # attention row keeps of them already (the probabilities, the softcap's tanh)
        scores32 = dtype_bytes(b * heads * s * s, "float32")
        low = dtype_bytes(b * heads * s * s, roles["lin"])
        # eager: the scores, the softmax's fp32 output and, below fp32, its cast back to the scores' dtype
        core = low + scores32 + (low if low != scores32 else 0) if fam.softmax_fp32 else 2 * low
        if falcon_bmm and not eager or mla_math:
            # torch's math kernel computes a 16-bit q, k, v in fp32 (attention.cpp _scaled_dot_product_attention_math:
            # `query_acc = ... query_.to(at::kFloat)`): its scores and their sum with the mask, fp32
            core = 2 * scores32
        if fam.sinks:   # the scores, their cat with the sink column and its max-shifted copy (the scores plus the
            # mask, in the softmax's dtype: under autocast the matmul's low output plus the fp32 mask is fp32)
            core = dtype_bytes(b * heads * s * s, roles["soft"]) + 2 * dtype_bytes(b * heads * s * (s + 1), roles["soft"])
        core_kept = CORE
        if mixed and fam.softmax_fp32 and fam.rope and not fam.sinks:
            # under autocast the scores plus the fp32 mask are fp32 and so is the rotary q (`q * cos`, cos fp32):
            # softmax's fp32 output beside that sum, its `.to(query.dtype)` none; autocast's cast of the
            # probabilities for p @ v (the row keeps it) is made after the sum is freed
            core, core_kept = 2 * scores32, (*CORE, P_CAST)
        attention = dict(layer_parts[0]).get("attention", []) if layer_parts else []
        scores = max(0, core - sum(_bytes(k) for k in attention if k.label.startswith(core_kept)))
        if fam.falcon:
            scores, masks = scores + masks, 0
    elif _windowed(cfg, fam, attention, seq_len):
        # sdpa with a sliding layer's window shorter than the sequence: create_sliding_window_causal_mask's bool mask
        # (masking_utils.sdpa_mask: a (1, 1, s, s) storage expanded to the batch, no padding mask given), held by the
        # forward's mask mapping through every layer (a full layer's mask is None: sdpa's is_causal); the float bias
        # each layer's kernel makes of it is the attention row's
        masks = dtype_bytes(s * s, "bool")
    if fam.mla:
        # q_b_proj's (or q_proj's) and kv_b_proj's whole outputs (q_pass, q_rot, k_pass and value_states are views
        # of them), the unscaled q cat beside the kernel's scaled copy, k_rot expanded to every head; under the math
        # kernel its (s, s) float mask
        # (under autocast the rotary embedding's fp32 cos and sin make q's rotary part fp32, and the cat of q's
        # no-rope part with it: torch.cat promotes)
        T, H = sizes["T"], sizes["H"]
        rotated = roles["act"] if mixed else roles["lin"]
        scores += (dtype_bytes(T * (sizes["qb"] + sizes["kvb"]), roles["lin"])
                   + dtype_bytes(T * sizes["qb"] + T * H * cfg["qk_rope_head_dim"], rotated)
                   + (dtype_bytes(s * s, "float32") if mla_math else 0))
        if mla_math and mixed:   # autocast's cast of the fp32 q cat for sdpa (an autocast op in the low dtype)
            scores += dtype_bytes(T * sizes["qb"], roles["lin"])
        if mla_math and roles["lin"] != "float32":
            # below fp32 the math kernel's fp32 copies are its own (attention.cpp: `query_acc = query_.to(at::kFloat)`,
            # bound beside `query_acc * scaling_factor`): the unscaled fp32 q, and the model's key cat (k_pass beside
            # the expanded k_rot, in q's dtype) stays bound beside the kernel's fp32 key
            scores += dtype_bytes(T * sizes["qb"], "float32") + dtype_bytes(T * sizes["qb"], roles["lin"])
    on = fam.cache and bool(cfg.get("use_cache", True))
    cache, own = [], []
    for n, parts in enumerate(layer_parts):
        kept = [k for _, part in parts for k in part]
        total, mine = cache_bytes(kept, heads, sizes["KV"], on)
        if fam.mla and on:   # the cache holds the latent: kv_a_proj's compressed kv and its rotary key, (b, 1, s, .)
            # (under autocast fp32: kv_a_layernorm's fp32 weight times its low output, the rotary key by fp32 cos)
            total += dtype_bytes(sizes["T"] * sizes["kva"], roles["act"] if mixed else roles["lin"])
        if mixed and on and fam.rope:   # the cache's rotary k under autocast is fp32 (the rows' repeated k is its cast)
            total += sum(dtype_bytes(_elements(k.shape) // heads * sizes["KV"], roles["act"]) - dtype_bytes(_elements(k.shape) // heads * sizes["KV"], k.dtype)
                         for k in kept if (": k" + held.REPEATED) in k.label and k.dtype != roles["act"] and sizes["KV"] < heads)
        if mixed:   # (the cache's copies not in the low dtype the step's rows hold already; the casts saved instead are the kernel's)
            unsaved = held.cache_casts(kept, roles, bool(fam.rope), quantized, mixed) if on else 0
        else:
            unsaved = held.cache_copies(kept, roles, bool(fam.rope), quantized, mixed, heads if on else 0, sizes["KV"])
        if step_parts is not None:   # (what the step's own rows hold unsaved: ledger.training, from its rows' kept)
            stepped = [k for _, part in step_parts[n] for k in part]
            frozen = held.frozen_cache(fam, sizes, roles, quantized, mixed)
            unsaved += (held.cache_copies(stepped, roles, bool(fam.rope), quantized, mixed, heads if on else 0, sizes["KV"], frozen)
                        - held.cache_copies(kept, roles, bool(fam.rope), quantized, mixed, heads if on else 0, sizes["KV"]))
        cache.append(max(0, total - unsaved))
        own.append(mine)
    # GPT-2: `hidden_states = inputs_embeds + position_embeds` (modeling_gpt2.py): the token embeddings stay bound
    # beside their sum (the step's embeddings output) all forward
    embeds = hidden if "positions" in fam.embed_extra else 0
    return {"masks": masks + embeds, "cache": cache, "own_cache": own, "attention": scores,
            "parts": [part_deltas(parts, fam, hidden, qkv, _parallel(cfg), falcon_bmm or mla_math) for parts in layer_parts],
            "casts": weight_casts(layer_parts)}


def weight_casts(layer_parts: list, trained_only: bool = False) -> list:
    """Each layer's {part: bytes} of autocast's cached weight casts (alive from the part to the forward's end); with
    `trained_only` (a LoRA model's rows) only the adapters': autocast_mode.cpp's cached_cast caches a leaf that
    requires grad, so a frozen base weight is cast anew by each call and freed with it."""
    return [{part: sum(_bytes(k) for k in kept if WEIGHT_CAST in k.label and (not trained_only or ".lora_" in k.label))
             for part, kept in parts} for parts in layer_parts]


def checkpointed_flights(cfg: dict, parts: list, hidden: int, cached: bool) -> dict:
    """{part: bytes}: what a checkpointed layer's dense MLP part holds at its worst forward moment beyond the step's
    held tensors (the layer's input, saved as the checkpoint's boundary; autocast's cached weight casts,
    Row.cast_cached). torch.utils.checkpoint's non-reentrant forward (transformers' default, `use_reentrant` False)
    saves nothing for a backward: its pack hook drops what autograd would keep, so the part's tensors are freed as
    soon as no Python name holds them, as in a no-grad forward (part_deltas: the MLP's worst moment there is its
    product, act_fn(gate) * up made, beside the part's input, the norm's output and the weight casts cached). Where
    autocast caches no weight cast (`cached` False: FSDP1's views of the flat parameter), the up projection's call is
    worse: its cast of the norm's output and its weight's cast beside its output, in place of the product.
    `parts`: the un-checkpointed layer's (part, kept) in forward order (models.hf_parts.layer_parts); `hidden` one
    (b, s, h) in the residual stream's dtype. Measured: tests/ledger/test_fsdp_cast_cache.py (FSDP1, the tiny Llama's
    last layer under bf16 autocast: its MLP's up projection, MemTracker's peak of the forward). Other parts (the
    attention's kernel) and other MLPs (grouped experts, a plain MLP, attention and MLP side by side) are not
    priced here."""
    out, fam, parallel = {}, FAMILIES[cfg["model_type"]], _parallel(cfg)
    if parallel or fam.shared_input or fam.mlp not in DENSE:
        return out
    deltas = part_deltas(parts, fam, hidden, 0, parallel)
    for n, (part, kept) in enumerate(parts):
        if part != "mlp" or n + 1 == len(parts):
            continue
        product = next((_bytes(k) for k in parts[n + 1][1] if k.label.startswith(PROJECTION_INPUT)), None)
        if product is None or sum(1 for k in kept if k.label.startswith("act: ")) > 1:
            continue
        weights = [_bytes(k) for k in kept if WEIGHT_CAST in k.label]
        inputs = [_bytes(k) for k in kept if INPUT_CAST in k.label]
        # the product's moment (the part's kept tensors and output, as part_deltas prices a no-grad part), its
        # weight casts left to Row.cast_cached (or freed with their linears' calls where none is cached)
        worst = sum(_bytes(k) for k in kept) + hidden + deltas.get(part, 0) - sum(weights)
        if not cached and weights:
            # the last linear's call (up_proj): its output exists in place of the product, its input's and its
            # weight's casts beside it
            worst = max(worst, worst - product + (inputs[-1] if inputs else 0) + weights[-1])
        out[part] = worst
    return out

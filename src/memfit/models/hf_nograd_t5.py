"""What T5's (an encoder-decoder's) forward under `torch.no_grad()` holds, moment by moment: the evaluation pass
(ledger/passes.py) of T5ForConditionalGeneration with the labels, as the Trainer's prediction_step runs it (eval():
dropout is the identity; `use_cache` from the config). Nothing is saved for a backward, so a tensor lives while a
Python name (or the cache) references it; the forward is described as the tensors transformers 5.24's
models/t5/modeling_t5.py makes and frees, in order (`_Tape`), and the pass's worst moment is the largest sum of live
tensors over it (the weights and the batch are the step's own, outside it):

- the encoder: its `inputs_embeds` (the first layer's input) bound through the stack; each layer's input held by
  the stack's loop while the layer runs; T5LayerNorm's fp32 statistics (`variance` bound to its return) and its
  normalized input beside its output; the relative bias (compute_bias in layer 0: _relative_position_bucket's (q, k)
  int64 and fp32 intermediates, then the (q, k, H) embedding lookup, held by the stack as `position_bias` through
  every layer); SDPA's float mask (transformers' create_position_bias_mask: `position_bias.contiguous()`, a copy of
  the permuted lookup in each layer); the fused kernel's output and its log-sum-exp (freed as the op returns); q, k
  and v (the projections' outputs, the heads' views) bound to the attention's end; the feed-forward's input
  projection and its activation at once (each rebinding frees the one before);
- the encoder's output: bound by T5ForConditionalGeneration.forward (`encoder_outputs`) through the decoder, the
  head and the loss; the decoder's input ids (`_shift_right(labels)`, a local of the forward);
- the decoder: as the encoder's stack, with its self-attention's causal mask (where(causal, bias, min), then its
  contiguous copy: the lookup is permuted), the cross-attention over the encoder's output (its zero position bias
  (1, H, q, k), made in the first layer, held by the stack for every layer), and the key/value cache
  (EncoderDecoderCache: each layer's self- and cross-attention k and v, `torch.cat` copies, held through the loss
  by the model's output);
- the head and the loss: the final norm's output (`decoder_outputs`) beside its rescaled copy
  (`scale_decoder_outputs`), the logits and cross_entropy's log-softmax, the cache and the encoder's output alive.

Under autocast (`*-mixed`): each linear's cast of its input (its call's only) and autocast's cached cast of every
weight (a leaf that requires a gradient: held to the forward's end, autocast_mode.cpp cached_cast); the linears'
outputs in the low dtype, the residual stream in fp32 (fp32 + low promotes); T5DenseActDense's `.to(wo.weight.dtype)`
(fp32) of the activation before wo casts it back; SDPA's casts of its fp32 mask; cross_entropy's fp32 copy of the
logits. Below fp32 without autocast (`*-true`): T5LayerNorm's fp32 upcast of its input and its normalized fp32
copy (`x * rsqrt(var)` promotes), cast back to the weight's dtype.

Described for SDPA (transformers' default for T5) and for eager attention without autocast (its scores and each
step's copy of them, the probabilities returned up to T5Block, which binds them to `_` through its next sublayer;
the decoder's (b, 1, q, q) float causal mask), a model trained in full or peft's LoRA on its frozen base (each
adapted linear's flight, `adapter`; autocast caches only the adapters' weight casts); not for eager under autocast,
DoRA, `modules_to_save` or a 4-bit base (nograd_t5 returns None: those passes stay priced from the training rows).
Measured: tests/ledger/test_eval_families.py (MemTracker around transformers' no-grad forward with the labels)."""

from __future__ import annotations

from memfit.models import hf_encdec
from memfit.models.hf_act_eval import role_dtypes, trainable_flags
from memfit.models.hf_act_families import FAMILIES
from memfit.models.hf_act_ops import PRECISIONS
from memfit.recipe.costs import dtype_bytes

# the activations whose no-grad call makes nothing beside its output (torch's own kernels), and gelu_new's tanh
# approximation (transformers' NewGELUActivation: `0.5 * input * (1.0 + tanh(sqrt(2 / pi) * (input + 0.044715 *
# pow(input, 3))))`: `0.5 * input` bound to the last product, and two temporaries of the chain at once)
NATIVE = ("relu", "gelu", "gelu_pytorch_tanh", "silu", "swish")
TANH_CHAIN = ("gelu_new",)


class _Tape:
    """The live tensors of a forward as it runs: `new` makes one, `free` drops some; a moment is recorded just
    before the first free after any allocation (the live set can only have grown since the last one)."""

    def __init__(self):
        self.live: dict = {}
        self.moments: list = []
        self.grew = False
        self.count = 0
        self.where = ""

    def new(self, nbytes: int, name: str | None = None) -> str:
        self.count += 1
        key = name or f"t{self.count}"
        self.live[key] = nbytes
        self.grew = True
        return key

    def free(self, *keys) -> None:
        if self.grew:
            self.moment()
        for k in keys:
            if k is not None:
                self.live.pop(k, None)

    def moment(self) -> None:
        counts: dict = {}
        for nbytes in self.live.values():
            counts[nbytes] = counts.get(nbytes, 0) + 1
        self.moments.append((self.where, tuple(sorted(counts.items()))))
        self.grew = False


class _T5:
    """The no-grad forward's program (module docstring), sizes and dtypes of one config and batch."""

    def __init__(self, cfg: dict, b: int, se: int, s: int, precision: str, eager: bool = False, lora: dict | None = None,
                 dtypes: dict | None = None):
        n = hf_encdec.dims(cfg)
        self.b, self.se, self.s = b, se, s
        self.h, self.H, self.d, self.f, self.V = n["h"], n["H"], n["d"], n["i"], n["V"]
        self.q = self.H * self.d
        self.layers = (n["Ne"], n["Nd"])
        self.buckets, self.distance = n["buckets"], cfg.get("relative_attention_max_distance", 128)
        self.gated = bool(cfg.get("is_gated_act"))
        self.chain = cfg.get("dense_act_fn") in TANH_CHAIN
        self.cache = bool(cfg.get("use_cache", True))
        self.rescale = bool(cfg.get("scale_decoder_outputs", cfg.get("tie_word_embeddings", True)))
        roles = role_dtypes(precision, dtypes)
        # which linears train (autocast caches their weights' casts) and which carry peft's adapters (`L:`)
        self.flags, self.rank, self.ada = trainable_flags(FAMILIES["t5"], lora), int((lora or {}).get("r") or 0), roles["ada"]
        # the weights' and the residual stream's dtype; autocast's low one (None without autocast)
        self.act, self.low = roles["act"], roles["low"] if precision.endswith("-mixed") else None
        self.lin = self.low or self.act               # the linears' outputs
        self.eager = eager
        self.tape = _Tape()

    def bytes(self, elements: int, dtype: str | None = None) -> int:
        return dtype_bytes(elements, dtype or self.act)

    # ----------------------------------------------------------------------------------------- the modules

    def linear(self, tokens: int, n_in: int, n_out: int, x_dtype: str, key: str = "") -> str:
        """A linear's output (its (tokens, n_out) mm; `key`: its role, hf_encdec.NAMES); under autocast its input's
        cast (freed with the call) and its weight's (cached, autocast's cache holding it to the forward's end, where
        the weight trains; a frozen one's is cast anew by each call, autocast_mode.cpp cached_cast). With peft's
        adapter (`adapter`) its output is the adapter's sum."""
        t = self.tape
        cast = []
        name = hf_encdec.NAMES.get(key, key)
        if self.low is not None:
            weight = t.new(self.bytes(n_in * n_out, self.low))
            if not self.flags.get(f"W:{name}", False):
                cast.append(weight)
            if x_dtype != self.low:
                cast.append(t.new(self.bytes(tokens * n_in, self.low)))
        out = t.new(self.bytes(tokens * n_out, self.lin))
        t.free(*cast)
        if self.flags.get(f"L:{name}", False):
            out = self.adapter(out, tokens, n_in, n_out, x_dtype)
        return out

    def adapter(self, result: str, tokens: int, n_in: int, n_out: int, x_dtype: str) -> str:
        """peft 0.21's lora.Linear.forward after its base layer: x cast to lora_A's dtype (bound to the return),
        lora_A's output, lora_B's, `* scaling`, `result + it` (the sum in the wider dtype: fp32 beside a 16-bit
        base without autocast), `.to(torch_result_dtype)`; each freeing the one before. Under autocast lora_A's
        and lora_B's weight casts are cached (they train) and lora_A's input cast is its call's."""
        t, r = self.tape, self.rank
        x = t.new(self.bytes(tokens * n_in, self.ada)) if x_dtype != self.ada else None
        x_dtype = self.ada
        out = self.low or self.ada
        cast = []
        if self.low is not None:
            t.new(self.bytes(n_in * r, self.low))
            if x_dtype != self.low:
                cast.append(t.new(self.bytes(tokens * n_in, self.low)))
        a = t.new(self.bytes(tokens * r, out))
        t.free(*cast)
        if self.low is not None:
            t.new(self.bytes(r * n_out, self.low))
        bb = t.new(self.bytes(tokens * n_out, out))
        t.free(a)
        scaled = t.new(self.bytes(tokens * n_out, out))
        t.free(bb)
        wide = "float32" if "float32" in (out, self.lin) else self.lin
        total = t.new(self.bytes(tokens * n_out, wide))
        t.free(result, scaled)
        if wide != self.lin:
            back = t.new(self.bytes(tokens * n_out, self.lin))
            t.free(total)
            total = back
        t.free(x)
        return total

    def norm(self, tokens: int, x_dtype: str) -> tuple:
        """T5LayerNorm: `hidden_states.to(fp32).pow(2).mean(-1)` (variance bound to its return), `x * rsqrt(variance
        + eps)` (fp32 where x or the statistics are), cast to a 16-bit weight's dtype, `weight * it`. (output, dtype)"""
        t, h = self.tape, self.h
        up = t.new(self.bytes(tokens * h, "float32")) if x_dtype != "float32" else None
        p = t.new(self.bytes(tokens * h, "float32"))
        t.free(up)
        var = t.new(self.bytes(tokens, "float32"))
        t.free(p)
        r = t.new(self.bytes(tokens, "float32"))
        rs = t.new(self.bytes(tokens, "float32"))
        t.free(r)
        n = t.new(self.bytes(tokens * h, "float32"))
        t.free(rs)
        dtype = "float32"
        if self.act != "float32":   # a 16-bit weight: the normalized input cast to it, then weight * it
            n16 = t.new(self.bytes(tokens * h))
            t.free(n)
            n, dtype = n16, self.act
        out = t.new(self.bytes(tokens * h, dtype))
        t.free(n, var)
        return out, dtype

    def bucket_bias(self, tq: int, tk: int, bidirectional: bool) -> str:
        """T5Attention.compute_bias: the positions, _relative_position_bucket's intermediates, the (q, k, H) lookup."""
        t, i64 = self.tape, "int64"
        qk = tq * tk
        a = t.new(self.bytes(tq, i64))
        context = t.new(self.bytes(tq, i64))   # arange(q)[:, None] + past_seen_tokens
        t.free(a)
        memory = t.new(self.bytes(tk, i64))
        rel = t.new(self.bytes(qk, i64))
        if bidirectional:
            g = t.new(self.bytes(qk, "bool"))
            gl = t.new(self.bytes(qk, i64))
            t.free(g)
            gm = t.new(self.bytes(qk, i64))
            t.free(gl)
            buckets = t.new(self.bytes(qk, i64))
            t.free(gm)
            pos = t.new(self.bytes(qk, i64))   # abs
        else:
            z = t.new(self.bytes(qk, i64))
            mn = t.new(self.bytes(qk, i64))
            t.free(z)
            pos = t.new(self.bytes(qk, i64))   # -min(...)
            t.free(mn)
            buckets = None
        small = t.new(self.bytes(qk, "bool"))
        prev = t.new(self.bytes(qk, "float32"))   # .float(), then / max_exact, log, / log(...), * (...)
        for _ in range(4):
            nxt = t.new(self.bytes(qk, "float32"))
            t.free(prev)
            prev = nxt
        as_long = t.new(self.bytes(qk, i64))
        t.free(prev)
        large = t.new(self.bytes(qk, i64))   # max_exact + (...)
        t.free(as_long)
        full = t.new(self.bytes(qk, i64))
        large2 = t.new(self.bytes(qk, i64))   # torch.min(large, full_like(...))
        t.free(large, full)
        w = t.new(self.bytes(qk, i64))
        if buckets is None:   # relative_buckets = 0 (an int): 0 + where(...) is a new tensor
            buckets = t.new(self.bytes(qk, i64))
        t.free(w, pos, small, large2)   # (+= in place; the bucket function's locals at its return)
        values = t.new(self.bytes(qk * self.H))   # the embedding's (q, k, H) lookup, the weight's dtype
        t.free(rel, buckets, context, memory)
        return values

    def attention(self, x: str, x_dtype: str, tq: int, tk: int, kind: str, state: dict) -> tuple:
        """One T5Attention (`kind`: "encoder", "self" (the decoder's, causal), "cross"); `state` holds the stack's
        position bias and, for the cross-attention, the encoder's output. (its o projection's output, eager's
        probabilities: returned up to T5Block, which binds them to `_` until its next sublayer returns)"""
        t, b, q = self.tape, self.b, self.q
        c = "c" if kind == "cross" else ""
        qm = self.linear(b * tq, self.h, q, x_dtype, c + "q")
        src = x_dtype if kind != "cross" else state["enc_dtype"]
        km = self.linear(b * tk, self.h, q, src, c + "k")
        vm = self.linear(b * tk, self.h, q, src, c + "v")
        cached = kind != "encoder" and self.cache
        if cached:   # DynamicLayer.update: torch.cat copies, the cache's
            t.new(self.bytes(b * tk * q, self.lin))
            t.new(self.bytes(b * tk * q, self.lin))
            t.free(km, vm)
            km = vm = None
        if state.get("bias") is None:
            if kind == "cross":   # torch.zeros((1, H, q, k), dtype=query_states.dtype)
                state["bias"], state["bias_dtype"] = t.new(self.bytes(self.H * tq * tk, self.lin)), self.lin
            else:
                state["bias"], state["bias_dtype"] = self.bucket_bias(tq, tk, kind == "encoder"), self.act
        if self.eager:
            out, probs = self.eager_core(tq, tk, kind, cached)
        else:
            out, probs = self.sdpa_core(tq, tk, kind, state), None
        om = self.linear(b * tq, q, self.h, self.lin, c + "o")
        t.free(out, qm, km, vm)
        return om, probs

    def sdpa_core(self, tq: int, tk: int, kind: str, state: dict) -> str:
        """transformers' sdpa_attention_forward: the float mask (create_position_bias_mask), the fused kernel's
        output (b, q, H, d) and log-sum-exp (freed as the op returns); the mask freed with the call."""
        t, hq = self.tape, self.H * tq * tk
        free_mask = []
        if kind == "self":   # create_position_bias_mask: where(causal, bias, min), then .contiguous() (permuted)
            a1 = t.new(self.bytes(tq, "int64"))
            a2 = t.new(self.bytes(tk, "int64"))
            causal = t.new(self.bytes(tq * tk, "bool"))
            t.free(a1, a2)
            where = t.new(self.bytes(hq, state["bias_dtype"]))
            free_mask.append(t.new(self.bytes(hq, state["bias_dtype"])))
            t.free(where, causal)
        elif kind == "encoder":   # the permuted lookup made contiguous: a copy
            free_mask.append(t.new(self.bytes(hq, state["bias_dtype"])))
        if self.low is not None and state["bias_dtype"] != self.low:   # autocast's cast of the fp32 mask for SDPA
            free_mask.append(t.new(self.bytes(hq, self.low)))
        out = t.new(self.bytes(self.b * tq * self.q, self.lin))
        lse = t.new(self.bytes(self.b * self.H * tq, "float32"))
        t.free(lse)
        t.free(*free_mask)
        return out

    def eager_core(self, tq: int, tk: int, kind: str, cached: bool) -> tuple:
        """modeling_t5.py eager_attention_forward (no autocast: one dtype throughout): matmul's copy of q (a
        transposed view; k's and v's too where they are the projections' views, not the cache's contiguous
        copies), the scores, `* scaling` (1.0: a new tensor), `+ position_bias`, `+ attention_mask` (the decoder's
        causal float mask), softmax (each freeing the one before), p @ v and its contiguous transpose."""
        t, b, q = self.tape, self.b, self.q
        scores = self.bytes(b * self.H * tq * tk, self.lin)
        copies = [t.new(self.bytes(b * tq * q, self.lin))]
        if not cached:
            copies.append(t.new(self.bytes(b * tk * q, self.lin)))
        prev = t.new(scores)
        t.free(*copies)
        for _ in range(3 if kind == "self" else 2):   # * scaling, + position_bias (, + attention_mask)
            nxt = t.new(scores)
            t.free(prev)
            prev = nxt
        probs = t.new(scores)
        t.free(prev)
        v_copy = t.new(self.bytes(b * tk * q, self.lin)) if not cached else None
        pv = t.new(self.bytes(b * tq * q, self.lin))
        t.free(v_copy)
        out = t.new(self.bytes(b * tq * q, self.lin))   # .transpose(1, 2).contiguous()
        t.free(pv)
        return out, probs

    def activation(self, tokens: int) -> str:
        """The activation's output (its input, the caller's, still bound); gelu_new's chain: `0.5 * input`, then
        pow, * 0.044715, input +, * sqrt(2 / pi), tanh, 1.0 + (each freeing the one before), the product."""
        t, n = self.tape, tokens * self.f
        if not self.chain:
            return t.new(self.bytes(n, self.lin))
        half = t.new(self.bytes(n, self.lin))
        prev = t.new(self.bytes(n, self.lin))
        for _ in range(5):
            nxt = t.new(self.bytes(n, self.lin))
            t.free(prev)
            prev = nxt
        out = t.new(self.bytes(n, self.lin))
        t.free(half, prev)
        return out

    def feed_forward(self, x: str, tokens: int, x_dtype: str) -> str:
        """T5LayerFF: its norm, T5DenseActDense (wi, the activation, wo; the activation cast to wo's weight dtype
        where they differ: fp32 under autocast) or T5DenseGatedActDense; the residual sum."""
        t, f = self.tape, self.f
        normed, n_dtype = self.norm(tokens, x_dtype)
        if self.gated:
            g = self.linear(tokens, self.h, f, n_dtype, "gate")
            a = self.activation(tokens)
            t.free(g)
            u = self.linear(tokens, self.h, f, n_dtype, "up")
            p = t.new(self.bytes(tokens * f, self.lin))
            held = (a, u)   # hidden_gelu and hidden_linear: locals to the module's return
        else:
            g = self.linear(tokens, self.h, f, n_dtype, "fc_in")
            p = self.activation(tokens)
            t.free(g)
            held = ()
        p_dtype = self.lin
        if self.lin != self.act:   # `.to(self.wo.weight.dtype)`
            up = t.new(self.bytes(tokens * f))
            t.free(p)
            p, p_dtype = up, self.act
        w = self.linear(tokens, f, self.h, p_dtype, "fc_out")
        t.free(p, *held)
        t.free(normed)
        out = t.new(self.bytes(tokens * self.h))   # hidden_states + forwarded_states (the residual's dtype)
        t.free(w)
        return out

    def block(self, x: str, tokens: int, tk: int, decoder: bool, state: dict, index: int) -> str:
        """One T5Block (`index`: its layer's in forward order over both stacks, as the step's rows name them): its
        input `x` is held by the stack's loop (the caller frees it)."""
        t = self.tape
        t.where = f"layer {index} self-attention"
        n1, n_dtype = self.norm(tokens, self.act)
        o, probs = self.attention(n1, n_dtype, tokens // self.b, tk if not decoder else tokens // self.b,
                                  "self" if decoder else "encoder", state["self"])
        y = t.new(self.bytes(tokens * self.h))
        t.free(o, n1)
        if decoder:
            t.where = f"layer {index} cross-attention"
            n2, n_dtype = self.norm(tokens, self.act)
            o, cross = self.attention(n2, n_dtype, tokens // self.b, self.se, "cross", state["cross"])
            y2 = t.new(self.bytes(tokens * self.h))
            t.free(o, n2, y, probs)
            y, probs = y2, cross
        t.where = f"layer {index} feed-forward"
        z = self.feed_forward(y, tokens, self.act)
        t.free(y, probs)
        return z

    def stack(self, tokens: int, decoder: bool) -> str:
        t = self.tape
        t.where = "embeddings"
        embeds = t.new(self.bytes(tokens * self.h))
        # eager's causal float mask (create_causal_mask: (b, 1, q, q) in the embeddings' dtype), held by the decoder
        mask = t.new(self.bytes(tokens * tokens // self.b)) if decoder and self.eager else None
        state = {"self": {}, "cross": {"enc_dtype": self.act}}
        x = embeds
        first = self.layers[0] if decoder else 0
        for i in range(self.layers[decoder]):
            z = self.block(x, tokens, self.se, decoder, state, first + i)
            if x != embeds:
                t.free(x)
            x = z
        t.where = "embeddings" if not decoder else "final norm"   # (the encoder's final norm is the step's embeddings row's)
        out, _ = self.norm(tokens, self.act)
        t.free(x, embeds, mask, state["self"].get("bias"), state["cross"].get("bias"))
        return out

    def forward(self) -> list:
        t, b = self.tape, self.b
        enc = self.stack(b * self.se, False)
        t.where = "embeddings"
        ids = t.new(self.bytes(b * self.s, "int64"))   # _shift_right(labels): new_zeros, then a clone copied in
        t.free(t.new(self.bytes(b * (self.s - 1), "int64")))
        final = self.stack(b * self.s, True)
        t.where = "loss"
        x = final
        if self.rescale:   # sequence_output * model_dim ** -0.5 (decoder_outputs holds the final norm's output)
            x = t.new(self.bytes(b * self.s * self.h))
        logits = self.linear(b * self.s, self.h, self.V, self.act, "lm_head")
        # CrossEntropyLoss: log_softmax (in fp32 under autocast, of its fp32 copy of the logits), nll_loss
        up = t.new(self.bytes(b * self.s * self.V, "float32")) if self.lin != "float32" and self.low else None
        t.new(self.bytes(b * self.s * self.V, "float32" if self.low else self.lin))
        t.new(self.bytes(1, "float32"))
        t.free(up)
        t.free(logits, x, final, enc, ids)
        return t.moments


def nograd_t5(cfg: dict, micro_batch: int, seq_len: int, target_len: int | None, attention: str, precision: str,
              lora: dict | None, dtypes: dict | None) -> list | None:
    """The moments of T5's no-grad forward (module docstring): [(where, ((bytes, count), ...))], each a set of live
    tensors beyond the weights and the batch; None where it is not described (eager attention under autocast, DoRA,
    modules_to_save, a quantized base, a precision without a row here, an activation not described: gelu_new's chain under autocast, whose
    pow the device's autocast runs in fp32 or not)."""
    eager = attention == "eager"
    if (dtypes or {}).get("quantized") or precision not in PRECISIONS or (eager and precision.endswith("-mixed")):
        return None
    if lora is not None and (lora.get("use_dora") or lora.get("modules_to_save")):
        return None
    act = cfg.get("dense_act_fn")
    if act not in NATIVE + TANH_CHAIN or (act in TANH_CHAIN and precision.endswith("-mixed")):
        return None
    return _T5(cfg, micro_batch, seq_len, target_len or seq_len, precision, eager, lora, dtypes).forward()

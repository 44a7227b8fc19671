"""Measure what autograd saves for backward in one training step of a real transformers model (CPU).

The measurement the activation model (memfit.models.hf_activations) is checked against:

- one step: forward with `labels` (loss at every position; BERT's masked-LM head included), then backward;
- every tensor autograd saves passes `torch.autograd.graph.saved_tensors_hooks`' pack hook; each distinct storage
  (untyped storage data_ptr, nbytes) counts once, at its full size; parameters and buffers are left out (they are
  counted as parameters), as are storages that alias them (a transposed weight view);
- dropout goes through `torch.native_dropout`, the fused kernel CUDA runs, which saves a 1-byte bool mask
  (CPU's plain `F.dropout` would save a noise tensor of the input's dtype instead);
- live bytes: each packed tensor is wrapped in a holder that lives exactly as long as autograd keeps the saved
  value; a storage is live while any holder of it is. With non-reentrant checkpointing (transformers' default) the
  recomputed tensors go to torch.utils.checkpoint's own recomputation hook, whose pack hook is wrapped so that they
  count too (they live until their backward node releases them). The peak is the largest live total seen.
"""

from __future__ import annotations

import contextlib
import weakref

import torch
import torch.nn.functional as F
import torch.utils.checkpoint as checkpoint_module
import transformers

# Tiny sizes (hidden 64, 2 layers, vocab 128) in each family's own key names where they differ.
_BASE = {"hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 2, "num_attention_heads": 4}
_GQA = {**_BASE, "num_key_value_heads": 2}
TINY = {
    "llama": _GQA,
    "mistral": {**_GQA, "head_dim": 16},
    "qwen2": _GQA,
    "qwen3": {**_GQA, "head_dim": 16},
    "gemma": {**_GQA, "head_dim": 16},
    "phi3": {**_GQA, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
    "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128, "bos_token_id": 0, "eos_token_id": 0},
    "bert": _BASE,
    "gpt_neox": _BASE,
    "mixtral": {**_GQA, "intermediate_size": 48, "num_local_experts": 4, "num_experts_per_tok": 2},
    # encoder-decoder: seq_len source tokens and as many target tokens (the labels); dropout_rate 0.1 as T5's default
    "t5": {"d_model": 64, "d_kv": 16, "d_ff": 112, "num_layers": 2, "num_heads": 4, "decoder_start_token_id": 0},
    # issue 21's dense decoders: a window shorter than the longer measured sequence (40), so it masks something
    "gemma2": {**_GQA, "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 24},
    "gemma3_text": {**_GQA, "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 24,
                    "layer_types": ["sliding_attention", "full_attention"]},
    "olmo2": {**_GQA, "eos_token_id": 2},
    "cohere": {**_GQA, "eos_token_id": 2, "bos_token_id": 1},
    "smollm3": {**_GQA, "eos_token_id": 2, "bos_token_id": 1, "pad_token_id": 0, "no_rope_layer_interval": 2},
    "starcoder2": {**_GQA, "eos_token_id": 2, "bos_token_id": 1, "sliding_window": 24, "residual_dropout": 0.1,
                   "embedding_dropout": 0.1},
    "granite": {**_GQA, "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.0078125,
                "logits_scaling": 8.0},
    # mixtures of experts (issue 21)
    "qwen2_moe": {**_GQA, "moe_intermediate_size": 24, "shared_expert_intermediate_size": 40, "num_experts": 4,
                  "num_experts_per_tok": 2},
    "qwen3_moe": {**_GQA, "head_dim": 16, "moe_intermediate_size": 24, "num_experts": 4, "num_experts_per_tok": 2},
    "phimoe": {**_GQA, "intermediate_size": 48, "num_local_experts": 4, "num_experts_per_tok": 2},
    # Falcon-7B's switches (multi_query, parallel_attn, one norm); tests/models/test_falcon.py covers the others
    "falcon": {"hidden_size": 64, "ffn_hidden_size": 112, "num_hidden_layers": 2, "num_attention_heads": 4,
               "hidden_dropout": 0.1},
    # gpt-oss: a window (24) shorter than the longer measured sequence (40); tests/models/test_families_gpt_oss.py
    "gpt_oss": {**_GQA, "head_dim": 16, "intermediate_size": 48, "num_local_experts": 4, "num_experts_per_tok": 2,
                "sliding_window": 24},
}
SEQ2SEQ = ("t5",)  # built with AutoModelForSeq2SeqLM
# The families the shared cross-checks and tests/ledger/test_combinations.py's covering design draw from. Families
# added after that design was fixed are measured in their own test files (adding them here would redraw the design):
LATER = ("gpt_oss",)   # tests/models/test_families_gpt_oss.py
FAMILIES = tuple(f for f in TINY if f not in LATER)
# DeepSeek-V3 (issue 21): measured in tests/models/test_families_deepseek_v3.py and kept out of FAMILIES (added after it is drawn), the list the
# covering design of tests/ledger/test_combinations.py draws its models from (and the shared activation cross-checks
# iterate). Latent attention with q and k (16 + 8) wider than v (12), one dense layer then the MoE layer: 8 routed
# experts in 2 groups (1 chosen), 2 per token, 1 shared expert.
TINY["deepseek_v3"] = {**_BASE, "num_key_value_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
                       "qk_rope_head_dim": 8, "v_head_dim": 12, "moe_intermediate_size": 24, "n_routed_experts": 8,
                       "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "n_shared_experts": 1,
                       "first_k_dense_replace": 1}
VOCAB = 128


def tiny(model_type: str, **overrides) -> dict:
    given = dict(TINY[model_type], vocab_size=VOCAB, max_position_embeddings=128)
    if model_type == "gpt2" or model_type in SEQ2SEQ:
        given.pop("max_position_embeddings")
    given.update(overrides)
    if "layer_types" in given and len(given["layer_types"]) != given["num_hidden_layers"]:   # more layers: same pattern
        pattern = given["layer_types"]
        given["layer_types"] = [pattern[i % len(pattern)] for i in range(given["num_hidden_layers"])]
    return transformers.AutoConfig.for_model(model_type, **given).to_dict()


ATTENTION_DROPOUT = {"gpt2": "attn_pdrop", "bert": "attention_probs_dropout_prob", "t5": "dropout_rate"}


def without_attention_dropout(cfg: dict) -> dict:
    """SDPA on CPU falls back to its math kernel when attention dropout is on; CUDA's kernels keep only an RNG
    state for it. The model counts the fused kernels' tensors, so the sdpa measurement turns that dropout off."""
    key = ATTENTION_DROPOUT.get(cfg["model_type"], "attention_dropout")
    return dict(cfg, **{key: 0.0})


def quantize_4bit(model, quantization: dict):
    """QLoRA's base as transformers' BitsAndBytesConfig(load_in_4bit) makes it, on CPU: every Linear but the output
    layer and the class's _keep_in_fp32_modules becomes a bitsandbytes Linear4bit (NF4/FP4, blocksize 64) computing in `compute_dtype`; so does a GPT-2
    Conv1D, its (in, out) weight transposed (transformers/integrations/bitsandbytes.py, replace_with_bnb_linear:
    `isinstance(module, Conv1D)`, `in_features, out_features = module.weight.shape`, and the weight `value.T`)."""
    bnb = __import__("bitsandbytes")
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.quantizers_utils import should_convert_module

    compute = getattr(torch, quantization.get("compute_dtype", "bfloat16"))
    skip = set(quantization.get("skip_modules") or ["lm_head"])
    # (transformers' default skips the output layer whatever its name: BERT's cls.predictions.decoder, tied to the
    # input embeddings; get_keys_to_not_convert)
    output = model.get_output_embeddings() if not quantization.get("skip_modules") else None
    # and, whatever the skip list, the class's _keep_in_fp32_modules (T5's "wo"): quantizers/quantizer_bnb_4bit.py
    # _process_model_before_weight_loading passes model._keep_in_fp32_modules to get_modules_to_not_convert
    # (quantizers/base.py: `modules_to_not_convert.extend(keep_in_fp32_modules)`), matched by should_convert_module
    kept = sorted(getattr(model, "_keep_in_fp32_modules", None) or [])

    def swap(module, prefix=""):
        for name, child in module.named_children():
            full = f"{prefix}{name}"
            if (isinstance(child, (torch.nn.Linear, Conv1D)) and name not in skip and child is not output
                    and should_convert_module(full, kept)):
                conv = isinstance(child, Conv1D)
                in_features, out_features = child.weight.shape if conv else (child.in_features, child.out_features)
                weight = child.weight.data.T.contiguous() if conv else child.weight.data
                new = bnb.nn.Linear4bit(in_features, out_features, bias=child.bias is not None,
                                        compute_dtype=compute, quant_type=quantization.get("method", "nf4"),
                                        compress_statistics=quantization.get("double_quant", False), device="meta")
                new.weight = bnb.nn.Params4bit(weight.float(), requires_grad=False,
                                               quant_type=quantization.get("method", "nf4"),
                                               compress_statistics=quantization.get("double_quant", False))
                if child.bias is not None:
                    new.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
                setattr(module, name, new.to("cpu"))
            else:
                swap(child, f"{full}.")

    swap(model)
    model.is_loaded_in_4bit = True   # what from_pretrained sets: peft then wraps with its bnb LoRA layer
    return model


def build(cfg: dict, attention: str = "sdpa", precision: str = "32-true", lora: dict | None = None, seed: int = 0,
          quantization: dict | None = None):
    torch.manual_seed(seed)
    fields = {k: v for k, v in cfg.items() if k not in ("model_type", "_image_size")}
    config = transformers.AutoConfig.for_model(cfg["model_type"], **fields)
    architectures = cfg.get("architectures") or []
    if architectures:
        cls = getattr(transformers, architectures[0])
    elif cfg["model_type"] == "bert":
        cls = transformers.AutoModelForMaskedLM
    elif cfg["model_type"] in SEQ2SEQ:
        cls = transformers.AutoModelForSeq2SeqLM
    elif cfg["model_type"] == "whisper":
        cls = transformers.AutoModelForSpeechSeq2Seq
    else:
        cls = transformers.AutoModelForCausalLM
    # the concrete class the Auto class builds for this config (T5Config: T5ForConditionalGeneration)
    concrete = cls._model_mapping[type(config)] if cls.__name__.startswith("Auto") else cls
    if attention == "sdpa" and not concrete._supports_sdpa:
        attention = None   # Gemma 2 refuses sdpa: transformers' default (what a user without attn_implementation runs)
    model = cls.from_config(config, attn_implementation=attention) if cls.__name__.startswith("Auto") else \
        cls._from_config(config, attn_implementation=attention)
    if precision in ("bf16-true", "16-true"):
        model = model.to(torch.bfloat16 if precision == "bf16-true" else torch.float16)
        # the rotary inv_freq pair as from_pretrained(dtype=...) keeps it: fp32 (transformers 5.24; model.to casts
        # it, and the rotary embedding reads it as .float() either way)
        for module in model.modules():
            for name, buf in list(module._buffers.items()):
                if buf is not None and name.endswith("inv_freq"):
                    module._buffers[name] = buf.float()
    if quantization:
        quantize_4bit(model, quantization)
    if lora is not None:
        peft = __import__("peft")
        lora_config = peft.LoraConfig(r=lora.get("r", 8), lora_alpha=lora.get("alpha", 16),
                                      lora_dropout=lora.get("dropout", 0.0),
                                      target_modules=lora.get("target_modules"),
                                      modules_to_save=lora.get("modules_to_save") or None,
                                      use_dora=lora.get("use_dora", False))
        model = peft.get_peft_model(model, lora_config, autocast_adapter_dtype=lora.get("autocast_adapter_dtype", True))
    model.train()
    return model


def _native_dropout(input, p=0.5, training=True, inplace=False):
    if not training or p == 0.0:
        return input
    out, _mask = torch.native_dropout(input, p, True)
    if inplace:
        return input.copy_(out)
    return out


@contextlib.contextmanager
def cuda_dropout():
    """Route F.dropout (nn.Dropout and the functional calls in transformers) through torch.native_dropout."""
    original = F.dropout
    F.dropout = _native_dropout
    try:
        yield
    finally:
        F.dropout = original


def _key(t: torch.Tensor):
    s = t.untyped_storage()
    return (s.data_ptr(), s.nbytes())


class Tracker:
    """Distinct saved storages, their live bytes and the peak of those.

    A storage is known by its address and size, so the tracker keeps each one it has seen (the storage alone: no
    tensor, no grad_fn, nothing of the graph) until the step ends. Otherwise a saved tensor freed during the forward
    (PhiMoE's sparsemixer saves the indices of a max whose node dies when the function returns) could hand its address
    to a later saved tensor of the same size, which the tracker would then take for the first: one storage fewer,
    depending on where the allocator put it (PhiMoE LoRA bf16-true: 189,988 B against 190,244 B, now and then)."""

    def __init__(self, excluded: set):
        self.excluded = excluded
        self.refs: dict = {}
        self.seen: dict = {}
        self.storages: list = []   # holds the seen storages: no address is reused while the tracker lives
        self.live = 0
        self.peak = 0
        self.items: list = []

    def add(self, owner, t: torch.Tensor):
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        key = _key(t)
        if key[0] in self.excluded or key[1] == 0:
            return
        if key not in self.seen:
            self.seen[key] = key[1]
            self.storages.append(t.untyped_storage())
            self.items.append((tuple(t.shape), str(t.dtype).replace("torch.", ""), key[1]))
        count = self.refs.get(key, 0)
        self.refs[key] = count + 1
        if count == 0:
            self.live += key[1]
            self.peak = max(self.peak, self.live)
        weakref.finalize(owner, self._drop, key)

    def _drop(self, key):
        count = self.refs[key] - 1
        self.refs[key] = count
        if count == 0:
            self.live -= key[1]

    @property
    def total(self) -> int:
        return sum(self.seen.values())


class _Holder:
    __slots__ = ("__weakref__", "t")

    def __init__(self, t):
        self.t = t


@contextlib.contextmanager
def _track_recomputation(tracker: Tracker):
    original = checkpoint_module._recomputation_hook

    class Counting(original):
        def __init__(self, target_frame_ref, gid):
            super().__init__(target_frame_ref, gid)
            inner = self.pack_hook

            def pack_hook(x):
                frame = target_frame_ref()
                index = frame.recomp_counter[gid]
                try:
                    return inner(x)
                finally:
                    # the frame keeps x while the holder's handle for this graph task lives
                    holder = frame.weak_holders[index]() if index < len(frame.weak_holders) else None
                    handle = holder.handles.get(gid) if holder is not None else None
                    if handle is not None:
                        tracker.add(handle, x)

            self.pack_hook = pack_hook

    checkpoint_module._recomputation_hook = Counting
    try:
        yield
    finally:
        checkpoint_module._recomputation_hook = original


def inputs(cfg: dict, micro_batch: int, seq_len: int, seed: int = 1, images: int = 1, target_len: int | None = None):
    """Token ids and labels; an encoder-decoder's labels (the decoder's tokens) are `target_len` long."""
    g = torch.Generator().manual_seed(seed)
    if cfg["model_type"] == "llava":
        # as LLaVA's processor gives them: each image's image_seq_length tokens in the text sequence (first here), and
        # micro_batch x images images at the vision tower's size
        vocab, token = cfg["text_config"]["vocab_size"], cfg["image_token_index"]
        ids = torch.randint(0, vocab, (micro_batch, seq_len), generator=g)
        ids[ids == token] = (token + 1) % vocab
        ids[:, : images * cfg["image_seq_length"]] = token
        v = cfg["vision_config"]
        pixels = torch.randn(micro_batch * images, v["num_channels"], v["image_size"], v["image_size"], generator=g)
        out = {"input_ids": ids, "labels": ids.clone()}
        return {**out, "pixel_values": pixels} if images else out
    if cfg["model_type"] in ("qwen2_vl", "qwen2_5_vl"):
        return qwen_vl_inputs(cfg, micro_batch, seq_len, g, images)
    if cfg["model_type"] == "mllama":
        return mllama_inputs(cfg, micro_batch, seq_len, g, images)
    if cfg["model_type"] == "whisper":
        # Whisper: log-mel frames, 2 x max_source_positions long (its convolutions halve them), and seq_len decoder tokens
        features = torch.randn(micro_batch, cfg["num_mel_bins"], 2 * cfg["max_source_positions"], generator=g)
        return {"input_features": features, "labels": torch.randint(3, cfg["vocab_size"], (micro_batch, seq_len), generator=g)}
    ids = torch.randint(0, cfg["vocab_size"], (micro_batch, seq_len), generator=g)
    head = (cfg.get("architectures") or [""])[0]
    if head.endswith(("ForSequenceClassification", "ForTokenClassification")):
        # a classifier's labels: one per sequence (fp32 for a regression, num_labels 1) or one per token; no token is
        # the padding one, so the pooled position is each sequence's last
        labels = len(cfg.get("id2label") or {0: 0, 1: 1})
        pad = cfg.get("pad_token_id")
        if pad is not None:
            ids[ids == pad] = (pad + 1) % cfg["vocab_size"]
        shape = (micro_batch,) if head.endswith("ForSequenceClassification") else (micro_batch, seq_len)
        if labels == 1 or cfg.get("problem_type") == "multi_label_classification":
            shape = shape + ((labels,) if labels > 1 else ())
            target = torch.rand(shape, generator=g).round() if labels > 1 else torch.randn(shape, generator=g)
        else:
            target = torch.randint(0, labels, shape, generator=g)
        return {"input_ids": ids, "labels": target}
    if target_len is not None and target_len != seq_len:
        return {"input_ids": ids, "labels": torch.randint(0, cfg["vocab_size"], (micro_batch, target_len), generator=g)}
    return {"input_ids": ids, "labels": ids.clone()}


def qwen_vl_inputs(cfg: dict, micro_batch: int, seq_len: int, g, images: int = 1):
    """Qwen2-VL / Qwen2.5-VL as Qwen2VLProcessor gives a batch: each image cut into grid_h x grid_w patches (cfg's
    "_image_size" [h, w] pixels, already a multiple of patch_size x spatial_merge_size), flattened to (patches,
    C x temporal_patch_size x patch^2) pixel values with its image_grid_thw row, and grid_h x grid_w / merge^2 image
    tokens in the sequence (after two text tokens), mm_token_type_ids marking them."""
    v, token = cfg["vision_config"], cfg["image_token_id"]
    height, width = cfg.get("_image_size", (56, 56))
    patch, merge, temporal = v["patch_size"], v["spatial_merge_size"], v["temporal_patch_size"]
    gh, gw = height // patch, width // patch
    per_image = gh * gw // merge ** 2
    vocab = cfg["text_config"]["vocab_size"]
    ids = torch.randint(0, vocab, (micro_batch, seq_len), generator=g)
    special = {token, cfg["video_token_id"], cfg["vision_start_token_id"], cfg["vision_end_token_id"]}
    for t in special:
        ids[ids == t] = min(set(range(vocab)) - special)
    for i in range(images):
        ids[:, 2 + i * (per_image + 2): 2 + i * (per_image + 2) + per_image] = token
    out = {"input_ids": ids, "labels": ids.clone(), "mm_token_type_ids": (ids == token).int()}
    if not images:
        return out
    pixels = torch.randn(micro_batch * images * gh * gw, v["in_channels"] * temporal * patch * patch, generator=g)
    grid = torch.tensor([[1, gh, gw]] * (micro_batch * images))
    return {**out, "pixel_values": pixels, "image_grid_thw": grid}


def mllama_inputs(cfg: dict, micro_batch: int, seq_len: int, g, images: int = 1):
    """Llama 3.2 Vision as MllamaProcessor gives a batch: one <|image|> token per image (after a text token), fp32
    pixel_values (batch, images, max_num_tiles, C, image_size, image_size) with every image padded to max_num_tiles
    tiles, its aspect ratio id (the last supported ratio using every tile, else the first) and tile mask, and the
    cross-attention mask: each token from its image's token on attends to that image's tiles (the tokens before the
    first image attend to none: the full-text-row mask zeroes their cross-attention MLP)."""
    t, v, token = cfg.get("text_config") or {}, cfg.get("vision_config") or {}, cfg["image_token_index"]
    vocab, tiles = t.get("vocab_size", 128256), v.get("max_num_tiles", 4)
    size, channels = v.get("image_size", 448), v.get("num_channels", 3)
    ratios = v.get("supported_aspect_ratios") or [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]]
    full = [i for i, (h, w) in enumerate(ratios) if h * w == tiles]
    ids = torch.randint(0, vocab, (micro_batch, seq_len), generator=g)
    ids[ids == token] = (token + 1) % vocab
    out = {"input_ids": ids, "labels": ids.clone()}
    if not images:
        return out
    cross = torch.zeros(micro_batch, seq_len, images, tiles, dtype=torch.long)
    for i in range(images):
        ids[:, 1 + i] = token
        cross[:, 1 + i:, i, :] = 1
    pixels = torch.randn(micro_batch, images, tiles, channels, size, size, generator=g)
    ratio = torch.full((micro_batch, images), (full[-1] if full else 0) + 1)
    return {**out, "labels": ids.clone(), "pixel_values": pixels, "aspect_ratio_ids": ratio,
            "aspect_ratio_mask": torch.ones(micro_batch, images, tiles, dtype=torch.long), "cross_attention_mask": cross}


def measure(cfg: dict, *, micro_batch: int, seq_len: int, attention: str = "sdpa", checkpointing: str = "none",
            precision: str = "32-true", lora: dict | None = None, model=None, quantization: dict | None = None,
            images: int = 1, freeze: tuple = (), target_len: int | None = None) -> dict:
    """One forward + backward; returns {'total': distinct saved bytes, 'peak': peak live saved bytes, 'items': ...}.
    LLaVA: `images` per sample; `freeze`: module prefixes whose parameters do not train (model.vision_tower).
    An encoder-decoder's decoder runs `target_len` tokens."""
    if model is None:
        model = build(cfg, attention, precision, lora, quantization=quantization)
    for name, p in model.named_parameters():
        if name.startswith(tuple(freeze)):
            p.requires_grad_(False)
    if checkpointing == "full":
        model.activation_checkpointing_enable()
    excluded = {p.untyped_storage().data_ptr() for p in model.parameters()}
    excluded |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    tracker = Tracker(excluded)

    def pack(t):
        holder = _Holder(t)
        tracker.add(holder, t)
        return holder

    def unpack(holder):
        return holder.t

    batch = inputs(cfg, micro_batch, seq_len, images=images, target_len=target_len)
    if precision in ("bf16-true", "16-true") and "input_features" in batch:   # Whisper's log-mel frames in the model's dtype
        batch["input_features"] = batch["input_features"].to(torch.bfloat16 if precision == "bf16-true" else torch.float16)
    autocast = contextlib.nullcontext()
    if precision in ("bf16-mixed", "16-mixed"):
        autocast = torch.autocast("cpu", dtype=torch.bfloat16 if precision == "bf16-mixed" else torch.float16)
    with cuda_dropout(), _track_recomputation(tracker), torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        with autocast:
            loss = model(**batch).loss
        loss.backward()
    return {"total": tracker.total, "peak": tracker.peak, "items": tracker.items}


def saved_by_node(cfg: dict, *, micro_batch: int, seq_len: int, attention: str = "sdpa", precision: str = "32-true",
                  lora: dict | None = None) -> list:
    """For reading, not for the bands: each graph node's saved tensors (name, attribute, shape, dtype, storage bytes),
    in reverse topological order from the loss, so one sees which op keeps what."""
    model = build(cfg, attention, precision, lora)
    excluded = {p.untyped_storage().data_ptr() for p in model.parameters()}
    excluded |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    batch = inputs(cfg, micro_batch, seq_len)
    autocast = contextlib.nullcontext()
    if precision in ("bf16-mixed", "16-mixed"):
        autocast = torch.autocast("cpu", dtype=torch.bfloat16 if precision == "bf16-mixed" else torch.float16)
    with cuda_dropout(), autocast:
        loss = model(**batch).loss
    rows, seen, stack, visited = [], set(), [loss.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        for attr in dir(node):
            if not attr.startswith("_saved_"):
                continue
            value = getattr(node, attr)
            values = value if isinstance(value, (tuple, list)) else [value]
            for v in values:
                if isinstance(v, torch.Tensor):
                    key = _key(v)
                    new = key not in seen and key[0] not in excluded
                    seen.add(key)
                    rows.append((type(node).__name__, attr, tuple(v.shape), str(v.dtype).replace("torch.", ""),
                                 key[1] if new else 0))
        for next_node, _ in node.next_functions:
            stack.append(next_node)
    return rows
# issue 34's encoders, measured in tests/models/test_families_encoders.py and kept out of FAMILIES (the covering design's
# draw): RoBERTa with its position ids counted from the padding token (max_position_embeddings leaves room for them)
TINY["roberta"] = {**_BASE, "type_vocab_size": 1}
ATTENTION_DROPOUT["roberta"] = "attention_probs_dropout_prob"

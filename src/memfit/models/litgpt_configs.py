"""LitGPT's models as data: the shapes `litgpt/config.py` gives each model a finetune config names by its
`checkpoint_dir` (Lightning-AI/litgpt at 3ba6da4012fa880294ae4557cc16e5182591a73d, the commit of the config hub's
measured rows), written as the transformers config.json keys memfit derives a model from, and what LitGPT's LoRA
flags adapt in each family. A data module: it imports nothing, so every stage may read it (tests/project/test_arch.py
BOTTOM); read/native/litgpt.py reads it.

LitGPT finds a model's config by the checkpoint directory's name (`Config.from_checkpoint`: `model_config.yaml`, else
`path.name` in `name_to_config`; `Config.from_name` also matches `hf_config["name"]`): the keys here are the Hugging
Face names the directories are downloaded as (`checkpoints/<org>/<name>`), with LitGPT's own names beside them.
Where LitGPT's model is not transformers' the entry says LitGPT's: the padded vocabulary (`padded_vocab_size`,
`find_multiple(vocab_size, padding_multiple)`), `block_size` as the context, and an output head apart from the
embedding (litgpt/model.py GPT.__init__: `lm_head` and `wte` are two modules; finetune/*.py reject
`train.tie_embeddings`), so every entry says tie_word_embeddings false.
"""

from __future__ import annotations

# falcon-7b's own keys: FalconConfig's MLP width is ffn_hidden_size (4 x hidden_size, LitGPT's GptNeoxMLP default)
_FALCON_7B = {"multi_query": True, "parallel_attn": True, "new_decoder_architecture": False, "bias": False,
              "ffn_hidden_size": 18176}

# the checkpoint directory's name -> (LitGPT's config name, model_type, hidden_size, intermediate_size, layers, heads,
# key/value heads (n_query_groups), padded vocabulary, block_size, head_dim or None, the family's own keys;
# intermediate_size None: the family names the MLP's width in its own keys);
# each from litgpt/config.py at 3ba6da40 (line of its dict there)
CONFIGS: dict[str, tuple] = {
    # config.py 149: stablelm-base-alpha-3b takes Config's defaults: n_embd 4096, n_layer 16, n_head 32, vocab_size
    # 50254 padded to a multiple of 512 (50688), rotary_percentage 0.25, parallel_residual, bias, LayerNorm,
    # GptNeoxMLP of 4 x n_embd, block_size 4096
    "stablelm-base-alpha-3b": ("stablelm-base-alpha-3b", "gpt_neox", 4096, 16384, 16, 32, 32, 50688, 4096, None,
                               {"rotary_pct": 0.25, "use_parallel_residual": True, "hidden_act": "gelu"}),
    # config.py 437-449: falcon-7b: n_embd 4544, n_layer 32, n_head 71, one query group, vocab 65024, block_size
    # 2048, parallel residual with a shared attention norm, no bias, GptNeoxMLP (4 x n_embd)
    "falcon-7b": ("falcon-7b", "falcon", 4544, None, 32, 71, 1, 65024, 2048, None, _FALCON_7B),
    "falcon-7b-instruct": ("falcon-7b-instruct", "falcon", 4544, None, 32, 71, 1, 65024, 2048, None, _FALCON_7B),
    # config.py 786-798: Llama-2-7b{,-chat}-hf: n_layer 32, n_head 32, n_embd 4096 (Config's defaults), vocab 32000
    # (padding_multiple 64), LLaMAMLP 11008, block_size 4096
    "Llama-2-7b-hf": ("Llama-2-7b-hf", "llama", 4096, 11008, 32, 32, 32, 32000, 4096, None, {}),
    "Llama-2-7b-chat-hf": ("Llama-2-7b-chat-hf", "llama", 4096, 11008, 32, 32, 32, 32000, 4096, None, {}),
    # config.py 800-814: Llama-2-13b{,-chat}-hf
    "Llama-2-13b-hf": ("Llama-2-13b-hf", "llama", 5120, 13824, 40, 40, 40, 32000, 4096, None, {}),
    "Llama-2-13b-chat-hf": ("Llama-2-13b-chat-hf", "llama", 5120, 13824, 40, 40, 40, 32000, 4096, None, {}),
    # config.py 846-862: Gemma-2b: n_embd 2048, n_layer 18, n_head 8, one query group, vocab 256000, GemmaMLP
    # (gelu tanh) 16384, block_size 4096 (Config's default)
    "gemma-2b": ("Gemma-2b", "gemma", 2048, 16384, 18, 8, 1, 256000, 4096, 256, {"hidden_activation": "gelu_pytorch_tanh"}),
    # config.py 864-882: Gemma-7b: n_embd 3072, n_layer 28, n_head 16, head_size 256, GemmaMLP 24576
    "gemma-7b": ("Gemma-7b", "gemma", 3072, 24576, 28, 16, 16, 256000, 4096, 256, {"hidden_activation": "gelu_pytorch_tanh"}),
    # config.py 1349-1362: Mistral-7B-{,Instruct-}v0.1: n_layer 32, 8 query groups, vocab 32000, LLaMAMLP 14336,
    # block_size 4096 ("should be 32768 but sliding window attention is not implemented": no sliding window)
    "Mistral-7B-v0.1": ("Mistral-7B-v0.1", "mistral", 4096, 14336, 32, 32, 8, 32000, 4096, None, {"sliding_window": None}),
    "Mistral-7B-Instruct-v0.1": ("Mistral-7B-Instruct-v0.1", "mistral", 4096, 14336, 32, 32, 8, 32000, 4096, None, {"sliding_window": None}),
    # config.py 1413-1428: tiny-llama-1.1b{,-chat}: n_embd 2048, n_layer 22, n_head 32, 4 query groups, vocab 32000,
    # LLaMAMLP 5632, block_size 2048
    "TinyLlama-1.1B-intermediate-step-1431k-3T": ("tiny-llama-1.1b", "llama", 2048, 5632, 22, 32, 4, 32000, 2048, None, {}),
    "TinyLlama-1.1B-Chat-v1.0": ("tiny-llama-1.1b-chat", "llama", 2048, 5632, 22, 32, 4, 32000, 2048, None, {}),
    # The config hub's later models, each from litgpt/config.py at 26857050fe3ff627cd714fe92f5838f51a3d5efa (the
    # hub's HEAD; line of its dict there). The `{}` entries are the base and the -Instruct model (one dict, two names).
    # config.py 756-773: Llama-3-8B{,-Instruct}: n_layer 32, n_head 32, 8 query groups, vocab 128000 padded to 128256,
    # LLaMAMLP 14336, block_size 8192 (rope_base 500000: no memory)
    "Meta-Llama-3-8B": ("Llama-3-8B", "llama", 4096, 14336, 32, 32, 8, 128256, 8192, None, {}),
    "Meta-Llama-3-8B-Instruct": ("Llama-3-8B-Instruct", "llama", 4096, 14336, 32, 32, 8, 128256, 8192, None, {}),
    # config.py 774-792: Llama-3.1-8B{,-Instruct}: Llama 3 8B's shapes, block_size 131072 (rope_adjustments: llama3
    # frequency scaling of the cos/sin tables, no memory)
    "Meta-Llama-3.1-8B": ("Llama-3.1-8B", "llama", 4096, 14336, 32, 32, 8, 128256, 131072, None, {}),
    "Meta-Llama-3.1-8B-Instruct": ("Llama-3.1-8B-Instruct", "llama", 4096, 14336, 32, 32, 8, 128256, 131072, None, {}),
    # config.py 852-871: Llama-3.2-1B{,-Instruct}: n_embd 2048, n_layer 16, n_head 32, 8 query groups, LLaMAMLP 8192,
    # block_size 131072; LitGPT's GPT keeps lm_head apart from wte (config.py has no tie_embeddings for it, where
    # transformers' Llama 3.2 ties them)
    "Llama-3.2-1B": ("Llama-3.2-1B", "llama", 2048, 8192, 16, 32, 8, 128256, 131072, None, {}),
    "Llama-3.2-1B-Instruct": ("Llama-3.2-1B-Instruct", "llama", 2048, 8192, 16, 32, 8, 128256, 131072, None, {}),
    # config.py 872-891: Llama-3.2-3B{,-Instruct}: n_embd 3072, n_layer 28, n_head 24, 8 query groups, LLaMAMLP 8192
    "Llama-3.2-3B": ("Llama-3.2-3B", "llama", 3072, 8192, 28, 24, 8, 128256, 131072, None, {}),
    "Llama-3.2-3B-Instruct": ("Llama-3.2-3B-Instruct", "llama", 3072, 8192, 28, 24, 8, 128256, 131072, None, {}),
    # config.py 2055-2071: Mistral-7B-v0.2 (unsloth's upload): n_layer 32, 8 query groups, vocab 32000, LLaMAMLP
    # 14336, block_size 32768, no sliding window (none in LitGPT's dict, as in Mistral's v0.2 config.json)
    "Mistral-7B-v0.2": ("Mistral-7B-v0.2", "mistral", 4096, 14336, 32, 32, 8, 32000, 32768, None, {"sliding_window": None}),
    # config.py 1815-1831: Phi-3-mini-4k-instruct as LitGPT builds it: LLaMAMLP (fc_1, fc_2 and proj apart, where
    # transformers' Phi3MLP fuses gate_up_proj), LitGPT's fused qkv with 32 query groups (multi-head), head_size 96,
    # rotary_percentage 1.0, RMSNorm, vocab 32000 padded to 32064, block_size 4096: a Llama in memfit's families (its
    # lora_mlp adapts fc_1, fc_2, proj: Llama's gate, up, down). Its sliding_window_size 2048 at 26857050 (every
    # layer: sliding_window_indices defaults to all 1; none at f247be87) makes litgpt/model.py build a T x T mask in
    # each layer and pass it to SDPA (attn_mask): the windows are as long as the context or longer below 2,048 tokens,
    # and that mask, one T x T tensor in the compute dtype per layer that SDPA's backward keeps (32 x 512 x 512 x 2 B =
    # 16.8 MB at the hub's 512 tokens), is priced for a file read as 0.5.13 runs it (WINDOW_MASK below)
    "Phi-3-mini-4k-instruct": ("Phi-3-mini-4k-instruct", "llama", 3072, 8192, 32, 32, 32, 32064, 4096, None, {}),
}

# models of the config hub whose family memfit does not derive, and why
REFUSED: dict[str, str] = {
    "phi-2": "LitGPT's phi-2 (config.py 1327-1340) is transformers' Phi (model_type phi: a partial rotary, a shared "
             "attention norm, a biased head), a family memfit does not derive (it knows Phi-3's); write a memfit config",
}
# Gemma 2 (config.py 1109-1164 at 26857050: gemma-2-2b, gemma-2-9b): LitGPT's model is not transformers' Gemma 2, which
# is what memfit's gemma2 family prices: with attention_logit_softcapping its CausalSelfAttention computes the attention
# itself (scores = q @ k.mT * scale, tanh soft-cap, + a T x T mask it builds, softmax in fp32) on LitGPT's k and v
# expanded to every head and q, k re-assembled by torch.cat after RoPE, and its sliding-window layers build a second
# T x T bias; LoRA's GPT.forward with lm_head_chunk_size returns the chunks' logits without final_logit_softcapping
# (litgpt/lora.py 2b195c7f:546-551). memfit's training.litgpt_qkv was measured on LitGPT's SDPA path only, and
# transformers' eager Gemma 2 rows keep their own repeated k and v: what the two keep together is not measured
_GEMMA2 = ("LitGPT's Gemma 2 (litgpt/config.py 26857050:1109-1164) runs its own soft-capped attention (litgpt/model.py: "
           "scores = q @ k.mT, tanh soft-cap, its own T x T masks, softmax in fp32, on k and v expanded to every head), "
           "and LoRA's chunked head skips final_logit_softcapping (litgpt/lora.py 2b195c7f:546-551); memfit prices transformers' eager Gemma 2 and "
           "LitGPT's attention on the SDPA path only, so what this model keeps is not priced: write a memfit config "
           "of the run")
REFUSED["gemma-2-2b"] = _GEMMA2
REFUSED["gemma-2-9b"] = _GEMMA2

# what LitGPT's lora_* flags adapt (litgpt/lora.py: the attention's fused qkv `attn` by LoRAQKVLinear's enable_lora
# (lora_query, lora_key, lora_value), `proj` by lora_projection, the MLP's linears by lora_mlp, `lm_head` by lora_head)
# in each family, as the transformers module names memfit's LoRA targets: per family, the module each of query, key and
# value is in (one fused module: the same name), the projection, the MLP's modules, the head
LORA_MODULES: dict[str, dict] = {
    "llama": {"query": "q_proj", "key": "k_proj", "value": "v_proj", "projection": "o_proj",
              "mlp": ("gate_proj", "up_proj", "down_proj"), "head": "lm_head"},
    "mistral": {"query": "q_proj", "key": "k_proj", "value": "v_proj", "projection": "o_proj",
                "mlp": ("gate_proj", "up_proj", "down_proj"), "head": "lm_head"},
    "gemma": {"query": "q_proj", "key": "k_proj", "value": "v_proj", "projection": "o_proj",
              "mlp": ("gate_proj", "up_proj", "down_proj"), "head": "lm_head"},
    "gpt_neox": {"query": "query_key_value", "key": "query_key_value", "value": "query_key_value", "projection": "dense",
                 "mlp": ("dense_h_to_4h", "dense_4h_to_h"), "head": "lm_head"},
    "falcon": {"query": "query_key_value", "key": "query_key_value", "value": "query_key_value", "projection": "dense",
               "mlp": ("dense_h_to_4h", "dense_4h_to_h"), "head": "lm_head"},
}


# the families whose LitGPT model norms with its RMSNorm (norm_class_name RMSNorm, no unit offset: Gemma's adds one;
# memfit prices Gemma's norm as transformers' Gemma runs it, the (1 + weight) product in fp32, where 3ba6da40's casts the
# normalized input back first and multiplies in the input dtype (model.py 3ba6da40:415-419): not measured, likely high
# for a 3ba6da40 Gemma full fine-tune): from 916a84ca (2024-07) on it
# multiplies the fp32 normalized input by weight.float() and casts the product back (litgpt/model.py 26857050:1315-1322,
# PyPI 0.5.13), where 3ba6da40 casts the normalized input back first (model.py 3ba6da40:409-420): training.rmsnorm_upcast
# fp32_weight for the files read as 0.5.13 runs them
RMS_NORM_FAMILIES = ("llama", "mistral")

# the CONFIGS entries whose LitGPT config sets sliding_window_size at 26857050 (config.py 1830: Phi-3-mini-4k-instruct,
# 2048; none at 3ba6da40 or f247be87; config.py 1992-2006: Mistral-7B-{,Instruct-}v0.1, 4096, every layer): each layer
# builds a (1, 1, s, s) mask that SDPA keeps (training.litgpt_qkv window_mask, for the files read as 0.5.13 runs them)
WINDOW_MASK = ("Phi-3-mini-4k-instruct", "Mistral-7B-v0.1", "Mistral-7B-Instruct-v0.1")

# the families whose config.json counts key/value heads in num_key_value_heads (GPT-NeoX has as many as queries;
# Falcon says multi_query)
KV_HEADS = ("llama", "mistral", "gemma")


def lookup(name: str) -> str | None:
    """The CONFIGS key of a checkpoint directory's name or LitGPT's config name, else None."""
    if name in CONFIGS:
        return name
    return next((key for key, entry in CONFIGS.items() if entry[0] == name), None)


def transformer(key: str) -> dict:
    """The config.json keys (model.transformer) of a CONFIGS entry."""
    _, family, hidden, inter, layers, heads, groups, vocab, block, head_dim, own = CONFIGS[key]
    cfg = {"model_type": family, "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
           "vocab_size": vocab, "max_position_embeddings": block, "tie_word_embeddings": False}
    if inter is not None:
        cfg["intermediate_size"] = inter
    if family in KV_HEADS:
        cfg["num_key_value_heads"] = groups
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    cfg.update(own)
    return cfg


# `litgpt pretrain` names its model by LitGPT's config name (pretrain.py setup: `Config.from_name(model_name)`) or
# writes LitGPT's Config fields inline (`model_config:`). The config hub's pretrain files name these; each is the
# dict of litgpt/config.py at 26857050 (its lines), read by `from_fields` as LitGPT's Config reads it
PRETRAIN_NAMES: dict[str, dict] = {
    # config.py 375-383: pythia-14m (config_hub/pretrain/debug.yaml): Config's defaults otherwise (vocab 50254,
    # LayerNorm, GptNeoxMLP of 4 x n_embd, rotary_percentage 0.25, parallel residual, biases)
    "pythia-14m": {"block_size": 512, "n_layer": 6, "n_embd": 128, "n_head": 4, "padding_multiple": 128},
    # config.py 2178-2195: tiny-llama-1.1b (config_hub/pretrain/tinyllama.yaml)
    "tiny-llama-1.1b": {"block_size": 2048, "vocab_size": 32000, "padding_multiple": 64, "n_layer": 22, "n_head": 32,
                        "n_embd": 2048, "rotary_percentage": 1.0, "parallel_residual": False, "bias": False,
                        "norm_class_name": "RMSNorm", "norm_eps": 1e-5, "mlp_class_name": "LLaMAMLP",
                        "intermediate_size": 5632, "n_query_groups": 4},
    # config.py 2209-2226: micro-llama-300M (config_hub/pretrain/microllama.yaml)
    "micro-llama-300M": {"block_size": 2048, "vocab_size": 32000, "padding_multiple": 64, "n_layer": 12, "n_head": 16,
                         "n_embd": 1024, "rotary_percentage": 1.0, "parallel_residual": False, "bias": False,
                         "norm_class_name": "RMSNorm", "norm_eps": 1e-5, "mlp_class_name": "LLaMAMLP",
                         "intermediate_size": 5632, "n_query_groups": 4},
}

# litgpt/config.py 26857050 Config's defaults of the fields `from_fields` reads
FIELD_DEFAULTS = {"block_size": 4096, "n_layer": 16, "n_embd": 4096, "vocab_size": 50254, "padding_multiple": 512,
                  "padded_vocab_size": None, "norm_class_name": "LayerNorm", "parallel_residual": True, "n_head": 32,
                  "head_size": None, "n_query_groups": None, "rotary_percentage": 0.25, "intermediate_size": None,
                  "bias": True, "mlp_class_name": "GptNeoxMLP", "gelu_approximate": "none"}
# Config fields that do not change what the model holds or keeps (names, epsilons, RoPE's frequencies)
FIELDS_WITHOUT_MEMORY = ("name", "hf_config", "norm_eps", "rope_base", "rope_condense_ratio", "rope_adjustments",
                         "rope_interleave", "padding_multiple", "vocab_size", "padded_vocab_size", "block_size")
# read beside the model: sliding_window_size (every layer's window, sliding_window_indices left to its default) is
# training.litgpt_qkv window_mask, the mask each layer builds and SDPA keeps (read/native/litgpt.py)
FIELDS_BESIDE = ("sliding_window_size",)
# fields whose other values build parts memfit does not map from LitGPT's fields -> the value that builds none
FIELDS_REFUSED = {"norm_qk": False, "post_attention_norm": False, "post_mlp_norm": False, "shared_attention_norm": False,
                  "attn_bias": False, "attention_logit_softcapping": None, "n_expert": 0,
                  "scale_embeddings": False, "lm_head_bias": False, "final_logit_softcapping": None,
                  "latent_attention": None, "norm_1": True, "norm_2": True, "attention_scores_scalar": None}


def _find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - (n % k)   # litgpt/utils.py find_multiple


def from_fields(fields: dict) -> dict | str:
    """The config.json keys (model.transformer) of LitGPT's Config fields, as Config.__post_init__ completes them
    (head_size, padded_vocab_size, n_query_groups, intermediate_size), for the two block shapes memfit's families are:
    LLaMA's (RMSNorm, LLaMAMLP, sequential residual, no biases, full rotary: llama) and GPT-NeoX's (LayerNorm,
    GptNeoxMLP, biases, one key/value head per query head: gpt_neox); else a sentence saying which field is not mapped."""
    unknown = [k for k in fields if k not in FIELD_DEFAULTS and k not in FIELDS_WITHOUT_MEMORY and k not in FIELDS_REFUSED
               and k not in FIELDS_BESIDE]
    if unknown:
        return f"LitGPT Config field(s) {', '.join(sorted(map(str, unknown)))} are not mapped by memfit"
    refused = [k for k, plain in FIELDS_REFUSED.items() if k in fields and fields[k] != plain]
    if refused:
        return f"{', '.join(refused)} build parts memfit does not map from LitGPT's fields"
    c = {**FIELD_DEFAULTS, **{k: v for k, v in fields.items() if k in FIELD_DEFAULTS or k in ("vocab_size", "padding_multiple", "padded_vocab_size", "block_size")}}
    ints = ("block_size", "n_layer", "n_embd", "vocab_size", "padding_multiple", "n_head")
    if not all(isinstance(c[k], int) and not isinstance(c[k], bool) and c[k] > 0 for k in ints):
        return f"{', '.join(ints)} are positive integers"
    heads, width = c["n_head"], c["n_embd"]
    head = c["head_size"] if c["head_size"] is not None else width // heads
    if c["head_size"] is None and width % heads:
        return f"n_embd {width} is not a multiple of n_head {heads} (LitGPT asserts it)"
    groups = c["n_query_groups"] or heads
    if heads % groups:
        return f"n_head {heads} is not a multiple of n_query_groups {groups} (LitGPT asserts it)"
    vocab = c["padded_vocab_size"] or _find_multiple(c["vocab_size"], c["padding_multiple"])
    cfg = {"hidden_size": width, "num_hidden_layers": c["n_layer"], "num_attention_heads": heads, "vocab_size": vocab,
           "max_position_embeddings": c["block_size"], "tie_word_embeddings": False}
    llama = (c["norm_class_name"], c["mlp_class_name"], c["parallel_residual"], c["bias"]) == ("RMSNorm", "LLaMAMLP", False, False)
    neox = (c["norm_class_name"], c["mlp_class_name"], c["bias"]) == ("LayerNorm", "GptNeoxMLP", True)
    if llama and c["rotary_percentage"] == 1.0:
        if not isinstance(c["intermediate_size"], int):
            return "LLaMAMLP needs intermediate_size (LitGPT raises)"
        cfg.update({"model_type": "llama", "intermediate_size": c["intermediate_size"], "num_key_value_heads": groups,
                    "hidden_act": "silu"})
        if head * heads != width:
            cfg["head_dim"] = head
        return cfg
    if neox and groups == heads and head * heads == width and c["gelu_approximate"] == "none":
        cfg.update({"model_type": "gpt_neox", "intermediate_size": c["intermediate_size"] or 4 * width,
                    "rotary_pct": c["rotary_percentage"], "use_parallel_residual": bool(c["parallel_residual"]),
                    "hidden_act": "gelu"})
        return cfg
    return (f"norm_class_name {c['norm_class_name']}, mlp_class_name {c['mlp_class_name']}, parallel_residual "
            f"{c['parallel_residual']}, bias {c['bias']}, rotary_percentage {c['rotary_percentage']}: memfit maps LitGPT's "
            "LLaMA-shaped blocks (RMSNorm, LLaMAMLP, no biases, full rotary) and GPT-NeoX-shaped ones (LayerNorm, "
            "GptNeoxMLP, biases, multi-head)")

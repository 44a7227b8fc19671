"""torchtune recipe configs (pytorch/torchtune recipes/configs/): the model from its builder
(`model._component_`), the run from the recipe's keys. The builders' shapes are the table
BUILDERS, read from torchtune's torchtune/models/<family>/_model_builders.py (commit bd2a0fc of
2026-04-23; code_llama2's from v0.6.1, the last release that has it): each builder's arguments to its component builder (embed_dim, intermediate_dim,
num_layers, num_heads, num_kv_heads, vocab_size, max_seq_len, tie_word_embeddings, head_dim);
llama2's intermediate_dim, where the builder leaves it out, is
torchtune.models.llama2._model_utils.scale_hidden_dim_for_mlp(embed_dim). memfit derives the
tensors from these as from the family's config.json (model_type).

QLoRA builders (qlora_*) quantize the base linears with torchao's NF4Tensor
(modules/low_precision/nf4_linear.py FrozenNF4Linear, to_nf4(block_size=64, scaler_block_size=256)):
memfit's quantization method nf4-torchao counts it as torchao stores it.
"""

from __future__ import annotations

import difflib

from memfit.diagnostics import codes
from memfit.models.adapter_tables import FUSED_PROJECTIONS, TORCHTUNE_FAMILIES
from memfit.read.native import torchtune_vision
from memfit.read.native.base import COMPILED, Reader

# builder -> (model_type, hidden_size, intermediate_size, layers, heads, kv_heads, vocab, max_seq_len, tied, head_dim)
BUILDERS = {
    "gemma_2b": ("gemma", 2048, 16384, 18, 8, 1, 256000, 8192, True, 256),
    "gemma_7b": ("gemma", 3072, 24576, 28, 16, 16, 256000, 8192, True, 256),
    "gemma2_2b": ("gemma2", 2304, 9216, 26, 8, 4, 256000, 8192, True, 256),
    "gemma2_9b": ("gemma2", 3584, 14336, 42, 16, 8, 256000, 8192, True, 256),
    "gemma2_27b": ("gemma2", 4608, 36864, 46, 32, 16, 256000, 8192, True, 128),
    "code_llama2_7b": ("llama", 4096, 11008, 32, 32, 32, 32016, 16384, False, None),
    "code_llama2_13b": ("llama", 5120, 13824, 40, 40, 40, 32016, 16384, False, None),
    "code_llama2_70b": ("llama", 8192, 28672, 80, 64, 8, 32016, 16384, False, None),
    "phi4_14b": ("phi3", 5120, 17920, 40, 40, 10, 100352, 16384, False, None),
    "llama2_7b": ("llama", 4096, 11008, 32, 32, 32, 32000, 4096, False, None),
    "llama2_13b": ("llama", 5120, 13824, 40, 40, 40, 32000, 4096, False, None),
    "llama2_70b": ("llama", 8192, 28672, 80, 64, 8, 32000, 4096, False, None),
    "llama3_8b": ("llama", 4096, 14336, 32, 32, 8, 128256, 8192, False, None),
    "llama3_70b": ("llama", 8192, 28672, 80, 64, 8, 128256, 8192, False, None),
    "llama3_1_8b": ("llama", 4096, 14336, 32, 32, 8, 128256, 131072, False, None),
    "llama3_1_70b": ("llama", 8192, 28672, 80, 64, 8, 128256, 131072, False, None),
    "llama3_1_405b": ("llama", 16384, 53248, 126, 128, 8, 128256, 131072, False, None),
    "llama3_2_1b": ("llama", 2048, 8192, 16, 32, 8, 128256, 131072, True, None),
    "llama3_2_3b": ("llama", 3072, 8192, 28, 24, 8, 128256, 131072, True, None),
    "mistral_7b": ("mistral", 4096, 14336, 32, 32, 8, 32000, 32768, False, None),
    "phi3_mini": ("phi3", 3072, 8192, 32, 32, 32, 32064, 4096, False, None),
    "qwen2_7b": ("qwen2", 3584, 18944, 28, 28, 4, 152064, 32768, False, None),
    "qwen2_0_5b": ("qwen2", 896, 4864, 24, 14, 2, 151936, 32768, True, None),
    "qwen2_1_5b": ("qwen2", 1536, 8960, 28, 12, 2, 151936, 32768, True, None),
    "qwen2_5_0_5b": ("qwen2", 896, 4864, 24, 14, 2, 151936, 32768, True, None),
    "qwen2_5_1_5b_base": ("qwen2", 1536, 8960, 28, 12, 2, 151936, 131072, True, None),
    "qwen2_5_1_5b_instruct": ("qwen2", 1536, 8960, 28, 12, 2, 151936, 32768, True, None),
    "qwen2_5_3b": ("qwen2", 2048, 11008, 36, 16, 2, 151936, 32768, True, None),
    "qwen2_5_7b_base": ("qwen2", 3584, 18944, 28, 28, 4, 152064, 131072, False, None),
    "qwen2_5_7b_instruct": ("qwen2", 3584, 18944, 28, 28, 4, 152064, 32768, False, None),
    "qwen2_5_14b_base": ("qwen2", 5120, 13824, 48, 40, 8, 152064, 131072, False, None),
    "qwen2_5_14b_instruct": ("qwen2", 5120, 13824, 48, 40, 8, 152064, 32768, False, None),
    "qwen2_5_32b_base": ("qwen2", 5120, 27648, 64, 40, 8, 152064, 131072, False, None),
    "qwen2_5_32b_instruct": ("qwen2", 5120, 27648, 64, 40, 8, 152064, 32768, False, None),
    "qwen2_5_72b_base": ("qwen2", 8192, 29568, 80, 64, 8, 152064, 131072, False, None),
    "qwen2_5_72b_instruct": ("qwen2", 8192, 29568, 80, 64, 8, 152064, 32768, False, None),
    "qwen3_0_6b_base": ("qwen3", 1024, 3072, 28, 16, 8, 151936, 32768, True, 128),
    "qwen3_0_6b_instruct": ("qwen3", 1024, 3072, 28, 16, 8, 151936, 40960, True, 128),
    "qwen3_1_7b_base": ("qwen3", 2048, 6144, 28, 16, 8, 151936, 32768, True, 128),
    "qwen3_1_7b_instruct": ("qwen3", 2048, 6144, 28, 16, 8, 151936, 40960, True, 128),
    "qwen3_4b_base": ("qwen3", 2560, 9728, 36, 32, 8, 151936, 32768, True, 128),
    "qwen3_4b_instruct": ("qwen3", 2560, 9728, 36, 32, 8, 151936, 40960, True, 128),
    "qwen3_8b_base": ("qwen3", 4096, 12288, 36, 32, 8, 151936, 32768, False, 128),
    "qwen3_8b_instruct": ("qwen3", 4096, 12288, 36, 32, 8, 151936, 40960, False, 128),
    "qwen3_14b_base": ("qwen3", 5120, 17408, 40, 40, 8, 151936, 32768, False, 128),
    "qwen3_14b_instruct": ("qwen3", 5120, 17408, 40, 40, 8, 151936, 40960, False, 128),
    "qwen3_32b": ("qwen3", 5120, 25600, 64, 64, 8, 151936, 40960, False, 128),
}


def _scale_hidden_dim(dim: int, multiple_of: int = 256) -> int:
    """torchtune.models.llama2._model_utils.scale_hidden_dim_for_mlp."""
    hidden = int(2 * (4 * dim) / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


ALIASES = {"llama3_3_70b": "llama3_1_70b"}  # torchtune/models/llama3_3/_model_builders.py: llama3_3_70b = llama3_1_70b
# builders memfit refuses, and why (a positioned unsupported-model at model._component_); Llama 3.2 Vision
# (llama3_2_vision_*, DeepFusionModel) is counted and refused by read/native/torchtune_vision.py
REFUSED: dict = {}

# torchtune's LoRA module names -> the transformers module names memfit's LoRA targets
LORA_ATTN = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}
LORA_MLP = ("gate_proj", "up_proj", "down_proj")
DTYPES = {"bf16": "bf16-true", "fp32": "32-true", "fp16": "16-true"}  # training/precision.py PRECISION_STR_TO_DTYPE

# optimizer._component_ -> (memfit optimizer, optimizer_impl or None, optimizer_state dtype or None)
OPTIMIZERS = {
    "torch.optim.AdamW": ("adamw", "foreach", None),
    "torch.optim.Adam": ("adam", "foreach", None),
    "torch.optim.SGD": ("sgd", "foreach", None),
    "bitsandbytes.optim.PagedAdamW8bit": ("paged_adamw8bit", None, None),
    "bitsandbytes.optim.AdamW8bit": ("adamw8bit", None, None),
    # torchao's AdamW8bit (optim/adam.py _new_buffer, subclass_8bit.py OptimState8bit.zeros): uint8 codes and one fp32
    # scale per block of 256 for tensors of 4096+ elements, as bitsandbytes' blockwise state (its fallback for smaller
    # ones is zeros_like(p), not fp32, and each state has its own 256-entry qmap: a few KB apart)
    "torchao.prototype.low_bit_optim.AdamW8bit": ("adamw8bit", None, None),
    "torchao.optim.AdamW8bit": ("adamw8bit", None, None),
    "bitsandbytes.optim.PagedAdamW": ("adamw", "for_loop", "float32"),
    "bitsandbytes.optim.PagedAdamW32bit": ("adamw", "for_loop", "float32"),
    "bitsandbytes.optim.PagedAdam": ("adam", "for_loop", "float32"),
    "bitsandbytes.optim.PagedAdam32bit": ("adam", "for_loop", "float32"),
    "bitsandbytes.optim.PagedAdam8bit": ("paged_adam8bit", None, None),
    "bitsandbytes.optim.PagedLion": ("lion", "for_loop", "float32"),
    "bitsandbytes.optim.PagedLion32bit": ("lion", "for_loop", "float32"),
    "bitsandbytes.optim.PagedLion8bit": ("paged_lion8bit", None, None),
    # bitsandbytes' unpaged ones: optim_bits 32 keeps fp32 state1/state2 whatever the parameter's dtype
    "bitsandbytes.optim.AdamW": ("adamw", "for_loop", "float32"),
    "bitsandbytes.optim.AdamW32bit": ("adamw", "for_loop", "float32"),
    "bitsandbytes.optim.Adam": ("adam", "for_loop", "float32"),
    "bitsandbytes.optim.Adam32bit": ("adam", "for_loop", "float32"),
    "bitsandbytes.optim.Adam8bit": ("adam8bit", None, None),
    "bitsandbytes.optim.Lion": ("lion", "for_loop", "float32"),
    "bitsandbytes.optim.Lion32bit": ("lion", "for_loop", "float32"),
    "bitsandbytes.optim.Lion8bit": ("lion8bit", None, None),
}

def torch_impl(name: str, impl: str | None, kwargs: dict) -> tuple[str | None, str | None]:
    """The step's implementation an optimizer's keyword arguments choose, and the key that chose it: torch.optim's
    `fused=True` (one kernel per (device, dtype) group, no temporaries) or `foreach=False` (one parameter at a time:
    torch/optim/optimizer.py _default_to_fused_or_foreach is not consulted when foreach is given)."""
    if kwargs.get("fused") is True:
        return "fused", "fused"
    if name.startswith("torch.optim.") and impl == "foreach" and kwargs.get("foreach") is False:
        return "for_loop", "foreach"
    return impl, None


KEYS = {
    "model._component_": "model.transformer (BUILDERS); lora_* -> lora; qlora_* -> lora + quantization nf4-torchao",
    "model.lora_attn_modules / apply_lora_to_mlp / apply_lora_to_output": "lora.target_modules",
    "model.lora_rank (8) / lora_alpha (16) / lora_dropout (0.0)": "lora.r / alpha / dropout",
    "model.use_dora (false)": "lora.use_dora (DoRA's magnitude vector; its forward as peft's dora.py)",
    "(adapters built under set_default_dtype(dtype))": "lora.dtype model: the adapters in the model's dtype",
    "batch_size": "training.micro_batch",
    "tokenizer.max_seq_len": "training.seq_len (null: left to the data; memfit gates the setting data_seq_len, default 2,048, says so at the key with the longest length that fits)",
    "dataset.packed (false)": "training.seq_len: PackedDataset fills every sequence to tokenizer.max_seq_len (true with max_seq_len null: torchtune's error)",
    "gradient_accumulation_steps (1)": "training.gradient_accumulation",
    "dtype (fp32 when absent: training.get_dtype)": "precision bf16-true / 32-true",
    "optimizer._component_, optimizer.fused, optimizer.foreach": "optimizer, training.optimizer_impl (fused: true -> fused; foreach: false -> for_loop)",
    "enable_activation_checkpointing (false)": "training.checkpointing full",
    "ac_mode, ac_option": "(distributed recipes, ac_mode selective + ac_option N: with enable_activation_checkpointing false) training.checkpointing full, checkpoint_every N, checkpoint_offset N-1 (layers N-1, 2N-1, ...: training/_activation_checkpointing.py `_count % ac_freq == 0`); ac_option op: warned",
    "enable_activation_offloading (false)": "training.activation_offloading (OffloadActivations: saved tensors to the host but for its window)",
    "fsdp_cpu_offload (false)": "parallel.offload (distributed recipes: FSDP2 full shard over --gpus)",
    "loss._component_, loss.num_output_chunks (8)": "training.loss {kind: chunked, chunks} for CEWithChunkedOutputLoss, {kind: linear, chunks} for LinearCrossEntropyLoss",
    "optimizer_in_bwd (false)": "training.optimizer_in_backward",
    "fsdp_reshard_after_forward (true)": "parallel.fsdp full_shard, or shard_grad_op when false",
    "teacher_model (knowledge distillation: its _component_)": "training.teacher {transformer} (its weights in dtype, its no_grad forward and logits beside the student's)",
    "kd_loss._component_": "the KD loss: ForwardKLLoss / ForwardKLWithChunkedOutputLoss (chunked as loss is); another: warned",
}
KD_LOSSES = ("ForwardKLLoss", "ForwardKLWithChunkedOutputLoss")
UNMODELLED = {
    "compile": ((False,), COMPILED),
    "custom_sharded_layers": ((), "extra FSDP units: the figures are high, on the safe side (smaller units gathered at once)"),
    "tensor_parallel_dim": ((1,), "tensor parallelism: the figures are high, on the safe side (each GPU holds its share)"),
}


# keys only torchtune's distributed recipes read (recipes/*_distributed.py: FSDP2 and the parallel dims' mesh)
DISTRIBUTED_KEYS = ("fsdp_cpu_offload", "fsdp_reshard_after_forward", "custom_sharded_layers", "tensor_parallel_dim",
                    "data_parallel_shard_dim", "data_parallel_replicate_dim", "context_parallel_dim")


def _world_from_the_launch(r: Reader, gpus) -> None:
    """A distributed recipe's config says nothing of its world size: `tune run --nproc_per_node N` does. Without
    --gpus memfit checks a world of one, every parameter on one GPU: high, and a gate that fails a run that fits."""
    if gpus is not None:  # the user said how many (--gpus 1 included)
        return
    key = next((k for k in DISTRIBUTED_KEYS if k in r.data), None)
    if key is not None:
        r.warn(r.at(key, on_key=True), f"{key}: a distributed recipe's key; its world size is the launch's (tune run "
                                       "--nproc_per_node N), not the config's: memfit checks a world of 1 GPU (every "
                                       "parameter, gradient and optimizer state on it; high); pass --gpus N")


def _teacher(r: Reader, ctx) -> None:
    """Knowledge distillation (recipes/knowledge_distillation_*.py): `teacher_model` built as the student is, its
    forward-KL loss (kd_loss) chunked as the class loss is; training.teacher (ledger/passes.py)."""
    teacher = r.get("teacher_model", (dict,), None)
    if teacher is None:
        return
    component = r.get("_component_", (str,), "", data=teacher, prefix=("teacher_model",))
    at = r.at("teacher_model", "_component_") if "_component_" in teacher else r.at("teacher_model", on_key=True)
    builder = component.rsplit(".", 1)[-1]
    if builder.startswith(("lora_", "qlora_")):
        r.warn(at, f"teacher_model {builder}: memfit counts the teacher as its base model, without its adapters: the figure is low by them")
    base = builder.removeprefix("qlora_").removeprefix("lora_")
    transformer = _transformer(r, teacher, ALIASES.get(base, base), component, at, ("teacher_model",))
    if transformer is None:
        return
    gpus = ctx.conf.get("gpus")
    if isinstance(gpus, int) and gpus > 1:  # knowledge_distillation_distributed: the teacher sharded as the student is
        r.warn(at, f"teacher_model over {gpus} GPUs: the distributed recipe shards the teacher with FSDP as it shards the student; memfit models the teacher on one GPU only, so the figures are low by each rank's share of its weights and its forward")
        return
    r.set(("training", "teacher"), {"transformer": transformer}, at)
    kd = r.get("kd_loss", (dict,), {})
    name = str(kd.get("_component_", "")).rsplit(".", 1)[-1]
    if name and name not in KD_LOSSES:
        r.warn(r.at("kd_loss", "_component_"), f"kd_loss {name}: memfit models the forward KL (ForwardKLLoss, ForwardKLWithChunkedOutputLoss); {name} keeps other fp32 tensors of the logits' size for backward, so the figure may be low")


def _packed(r: Reader):
    """Where `packed: true` is written in the dataset (a mapping or a list of them), else None: PackedDataset fills
    every sequence to tokenizer.max_seq_len (datasets/_packed.py), so the figure at that length is the run's."""
    dataset = r.data.get("dataset")
    for i, entry in enumerate(dataset if isinstance(dataset, list) else [dataset]):
        if isinstance(entry, dict) and entry.get("packed") is True:
            return r.at("dataset", i, "packed") if isinstance(dataset, list) else r.at("dataset", "packed")
    return None


def _families() -> set[str]:
    """The model families (torchtune.models' modules) of BUILDERS' names: the longest module name a builder starts
    with (llama3_2_3b -> llama3_2, qwen2_5_0_5b -> qwen2_5), since a size's digits read like a module's."""
    modules = {*TORCHTUNE_FAMILIES, "code_llama2", "phi4", "qwen2_5"}
    return {max((m for m in modules if k.startswith(m + "_")), key=len, default=k) for k in BUILDERS}


def _transformer(r: Reader, model: dict, base: str, component: str, at, prefix: tuple) -> dict | None:
    """The config.json keys of a builder (BUILDERS) or a component builder called with its arguments (TORCHTUNE_FAMILIES);
    None after a positioned error."""
    if base in TORCHTUNE_FAMILIES and "num_layers" in model:  # a component builder called with its arguments in the config
        args = {k: r.get(k, (int, float, bool), None, data=model, prefix=prefix) for k in ("embed_dim", "intermediate_dim", "num_layers", "num_heads", "num_kv_heads", "vocab_size", "max_seq_len", "tie_word_embeddings", "head_dim")}
        if None in [args[k] for k in ("embed_dim", "num_layers", "num_heads", "vocab_size", "max_seq_len")]:
            r.error(at, codes.NATIVE_CONFIG, f"{component} with its arguments: memfit needs embed_dim, num_layers, num_heads, vocab_size and max_seq_len")
            return None
        shape = (
            TORCHTUNE_FAMILIES[base], args["embed_dim"], args["intermediate_dim"] or _scale_hidden_dim(args["embed_dim"]), args["num_layers"], args["num_heads"],
            args["num_kv_heads"] or args["num_heads"], args["vocab_size"], args["max_seq_len"], bool(args["tie_word_embeddings"]), args["head_dim"],
        )
    else:
        shape = BUILDERS.get(base)
    refused = next((why for start, why in REFUSED.items() if base.startswith(start)), None)
    if shape is None and refused is not None:
        r.error(at, codes.UNSUPPORTED_MODEL, f"torchtune builder {component!r}: {refused}")
        return None
    if shape is None:
        # a size written without its _base/_instruct suffix, else a name a typo away from a known builder
        near = sorted(k for k in BUILDERS if k.startswith(base + "_")) or difflib.get_close_matches(base, BUILDERS, n=2, cutoff=0.9)
        prefix = component[: len(component) - len(base)] if component.endswith(base) else component.rsplit(".", 1)[0] + "." + component.rsplit(".", 1)[-1].removesuffix(base)
        hint = f"the nearest memfit knows: {', '.join(prefix + n for n in near)}; " if near else ""
        r.error(at, codes.UNSUPPORTED_MODEL, f"torchtune builder {component!r}: not one memfit knows ({hint}memfit knows the builders of {', '.join(sorted(_families()))}, {len(BUILDERS)} in all); write a memfit config for this model")
        return None
    family, hidden, inter, layers, heads, kv, vocab, max_seq, tied, head_dim = shape
    tied = r.get("tie_word_embeddings", (bool,), tied, data=model, prefix=prefix)
    transformer = {
        "model_type": family, "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab, "max_position_embeddings": max_seq,
        "tie_word_embeddings": tied,
    }
    if head_dim is not None:
        transformer["head_dim"] = head_dim
    return transformer


def _optimizer(r: Reader, at) -> None:
    """The optimizer component: its state's kind, dtype and step implementation (OPTIMIZERS)."""
    optimizer = r.get("optimizer", (dict,), {})
    name = r.get("_component_", (str,), "torch.optim.AdamW", data=optimizer, prefix=("optimizer",))
    found = OPTIMIZERS.get(name)
    opt_at = r.at("optimizer", "_component_") if "_component_" in optimizer else None
    if found is None:
        r.set(("optimizer",), "adamw", opt_at)
        r.warn(opt_at or at, f"optimizer {name}: memfit does not model its state; counted as AdamW")
    else:
        r.set(("optimizer",), found[0], opt_at)
        impl, key = torch_impl(name, found[1], optimizer)
        if impl is not None:
            r.set(("training", "optimizer_impl"), impl, r.at("optimizer", key) if key else opt_at)
        if found[2] is not None:
            r.set(("dtypes", "optimizer_state"), found[2], opt_at)
        if found[2] == "float32" and name.startswith("bitsandbytes.optim.Paged"):  # bitsandbytes' 32-bit paged state
            r.set(("training", "paged_optimizer"), True, opt_at)  # (ledger/techniques/paged_optimizer.py)


def read(r: Reader, ctx) -> dict:
    data = r.data
    model = r.get("model", (dict,), {})
    component = r.get("_component_", (str,), "", data=model, prefix=("model",))
    at = r.at("model", "_component_")
    r.native.root = at
    builder = component.rsplit(".", 1)[-1]
    quantize = builder.startswith("qlora_") or model.get("quantize_base") is True
    lora = builder.startswith(("lora_", "qlora_"))
    base = builder.removeprefix("qlora_").removeprefix("lora_")
    base = ALIASES.get(base, base)
    if not model:
        r.native.root = r.at(next(iter(data)), on_key=True) if data else r.at()
        r.error(r.native.root, codes.MODEL_NOT_FOUND, "no model._component_: memfit reads the model of a torchtune recipe config from it (PPO's policy and reward models are not read)")
        return {}
    if torchtune_vision.is_vision(component):  # counted, and refused naming what differs (read/native/torchtune_vision.py)
        torchtune_vision.refuse(r, model, component, at)
        return {}
    transformer = _transformer(r, model, base, component, at, ("model",))
    if transformer is None:
        return {}
    family = transformer["model_type"]
    r.set(("model", "transformer"), transformer, at)

    dtype = r.get("dtype", (str,), "fp32", choices=tuple(DTYPES))
    r.set(("precision",), DTYPES[dtype], r.at("dtype") if "dtype" in data else None)
    micro = r.get("batch_size", (int,), 1)
    r.set(("training", "micro_batch"), micro, r.at("batch_size") if "batch_size" in data else None)
    tokenizer = r.get("tokenizer", (dict,), {})
    seq = r.get("max_seq_len", (int,), None, data=tokenizer, prefix=("tokenizer",))
    packed = _packed(r)
    if seq is None:
        where = r.at("tokenizer", "max_seq_len") if "max_seq_len" in tokenizer else r.at("tokenizer", on_key=True) if "tokenizer" in data else at
        if packed is not None:  # datasets/_alpaca.py, _sft.py ...: "PackedDataset requires a max_seq_len to be set on the tokenizer."
            r.error(packed, codes.NATIVE_CONFIG, "dataset packed: true needs tokenizer.max_seq_len: torchtune raises 'PackedDataset requires a max_seq_len to be set on the tokenizer'")
        else:
            seq = r.seq_left_to_data(where, ctx.conf, transformer["max_position_embeddings"], "tokenizer.max_seq_len is not set: torchtune does not truncate")
            r.set(("training", "seq_len"), seq)
    else:
        r.set(("training", "seq_len"), seq, r.at("tokenizer", "max_seq_len"))
    accum = r.get("gradient_accumulation_steps", (int,), 1)
    if "gradient_accumulation_steps" in data:
        r.set(("training", "gradient_accumulation"), accum, r.at("gradient_accumulation_steps"))
    checkpointing = r.get("enable_activation_checkpointing", (bool,), False)
    r.set(("training", "checkpointing"), "full" if checkpointing else "none", r.at("enable_activation_checkpointing") if "enable_activation_checkpointing" in data else None)
    ac_mode = r.get("ac_mode", (str,), None)
    if ac_mode is not None and not checkpointing:
        # the distributed recipes: apply_selective_activation_checkpointing(model, ac_mode, ac_option) only where
        # enable_activation_checkpointing is false; checkpoint_wrapper counts the blocks from 1 and wraps those with
        # `_count % ac_freq == 0` (ac_freq 0: every block)
        option = r.get("ac_option", (int, str), None)
        if isinstance(option, str) and option.isdigit():
            option = int(option)
        if ac_mode == "full" or (ac_mode == "selective" and isinstance(option, int) and option in (0, 1)):
            r.set(("training", "checkpointing"), "full", r.at("ac_mode"))
        elif ac_mode == "selective" and isinstance(option, int) and option > 1:
            r.set(("training", "checkpointing"), "full", r.at("ac_mode"))
            r.set(("training", "checkpoint_every"), option, r.at("ac_option"))
            r.set(("training", "checkpoint_offset"), option - 1, r.at("ac_option"))
        else:
            r.warn(r.at("ac_mode"), f"ac_mode {ac_mode} with ac_option {option!r}: op-level selective checkpointing is not modelled; memfit counts no checkpointing")
    if r.get("enable_activation_offloading", (bool,), False):
        r.set(("training", "activation_offloading"), True, r.at("enable_activation_offloading"))
    r.set(("training", "attention"), "sdpa")  # torchtune's MultiHeadAttention: F.scaled_dot_product_attention (modules/attention_utils.py)

    _optimizer(r, at)

    if lora:
        rank = r.get("lora_rank", (int,), 8, data=model, prefix=("model",))
        targets = [LORA_ATTN.get(m, m) for m in (r.get("lora_attn_modules", (list,), [], data=model, prefix=("model",)) or [])]
        fused = FUSED_PROJECTIONS.get(family)
        if fused is not None and targets:
            r.warn(r.at("model", "lora_attn_modules"), fused["note"])
            targets = [fused["attention"].get(t, t) for t in targets]
            targets = list(dict.fromkeys(targets))
        if r.get("apply_lora_to_mlp", (bool,), False, data=model, prefix=("model",)):
            targets += list(fused["mlp"]) if fused is not None else list(LORA_MLP)
        if r.get("apply_lora_to_output", (bool,), False, data=model, prefix=("model",)):
            targets.append("lm_head")
        spec = {"r": rank, "alpha": r.get("lora_alpha", (int, float), 16, data=model, prefix=("model",)), "dropout": r.get("lora_dropout", (int, float), 0.0, data=model, prefix=("model",)), "target_modules": targets}
        r.set(("lora",), spec, at)
        for key, memfit in (("lora_rank", "r"), ("lora_alpha", "alpha"), ("lora_dropout", "dropout"), ("lora_attn_modules", "target_modules")):
            if key in model:
                r.origin(("lora", memfit), r.at("model", key))
        # the recipes build the model under training.set_default_dtype(dtype): LoRALinear's lora_a / lora_b (and
        # DoRA's magnitude) are created in the model's dtype and never upcast (modules/peft/lora.py, dora.py)
        spec["dtype"] = "model"
        if r.get("use_dora", (bool,), False, data=model, prefix=("model",)):
            spec["use_dora"] = True
            r.origin(("lora", "use_dora"), r.at("model", "use_dora"))
    if quantize:
        r.set(("quantization",), {"method": "nf4-torchao"}, at)

    gpus = ctx.conf.get("gpus")
    _world_from_the_launch(r, gpus)
    if (gpus and gpus > 1) or "fsdp_cpu_offload" in data:
        r.set(("parallel", "fsdp"), "full_shard" if data.get("fsdp_reshard_after_forward", True) is not False else "shard_grad_op", r.at("fsdp_reshard_after_forward") if "fsdp_reshard_after_forward" in data else None)
        if r.get("fsdp_cpu_offload", (bool,), False):
            r.set(("parallel", "offload", "optimizer"), "cpu", r.at("fsdp_cpu_offload"))
            r.set(("parallel", "offload", "parameters"), "cpu", r.at("fsdp_cpu_offload"))
    loss = r.get("loss", (dict,), {})
    loss_class = str(loss.get("_component_", "")).rsplit(".", 1)[-1]
    if loss_class in ("CEWithChunkedOutputLoss", "LinearCrossEntropyLoss"):
        chunks = r.get("num_output_chunks", (int,), 8, data=loss, prefix=("loss",))
        kind = "chunked" if loss_class == "CEWithChunkedOutputLoss" else "linear"
        r.set(("training", "loss"), {"kind": kind, "chunks": chunks}, r.at("loss", "_component_"))
    elif "LinearCrossEntropy" in str(loss.get("_component_", "")) or "Chunked" in str(loss.get("_component_", "")):
        r.warn(r.at("loss", "_component_"), f"loss {loss['_component_'].rsplit('.', 1)[-1]}: the logits are computed in chunks, never whole; memfit counts the full logits")
    if r.get("optimizer_in_bwd", (bool,), False):
        r.set(("training", "optimizer_in_backward"), True, r.at("optimizer_in_bwd"))
    _teacher(r, ctx)
    r.unmodelled(UNMODELLED)
    return {}

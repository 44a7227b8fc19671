"""LitGPT finetune configs (Lightning-AI/litgpt `config_hub/finetune/<model>/{lora,qlora,full}.yaml`, the arguments of
`litgpt finetune lora|full --config FILE`), read as `litgpt/finetune/lora.py` and `full.py` run them at
3ba6da4012fa880294ae4557cc16e5182591a73d (the commit of the config hub's measured rows; `litgpt/args.py` TrainArgs).
The model is the checkpoint directory's: its name is looked up in LitGPT's model table (models/litgpt_configs.py,
from litgpt/config.py), or mapped in the settings' models table / a local directory with its config.json.

A file with LoRA keys (lora_*) or `quantize` is `finetune/lora.py`'s; without them, `finetune/full.py`'s. What
lora.py switches on that memfit models: its step `model(input_ids, lm_head_chunk_size=128)` and
`chunked_cross_entropy` (training.loss chunked_head, 128), LitGPT's own attention and LoRAQKVLinear
(training.litgpt_qkv), under `quantize: bnb.*` Lightning's BitsandbytesPrecision (quantization; the pinned
bitsandbytes 0.42.0 keeps each 4-bit matmul's input: training.quantized_saves_input) and bitsandbytes' PagedAdamW
(32-bit paged state). Both scripts run the model through Lightning Fabric, which hands the loop the logits in fp32
(training.outputs_dtype). full.py computes the whole logits (`model(input_ids)`), fp32 through Fabric, and
`chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])` over them, 128 rows of the flattened batch at a time
(training.loss chunked_rows, 128: the reshaped slice's copy where micro_batch > 1, each chunk's log-softmax, the
backward's chunk gradients, their concatenation and the slice's zero-filled whole gradient). Over more than one device both
scripts run FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block}): parallel.fsdp
full_shard over `devices` GPUs with every block checkpointed.
"""

from __future__ import annotations

import os

import yaml

from memfit.diagnostics import codes
from memfit.models import litgpt_configs
from memfit.read.native.base import COMPILED, Reader, model_value
from memfit.recipe.dtypes import DTYPES, HALF, RECIPES
from memfit.read.native.torchtune import OPTIMIZERS, torch_impl

# native key -> (default, memfit key, source in litgpt at 3ba6da40)
KEYS = {
    "checkpoint_dir": (None, "model.transformer (models/litgpt_configs.py by the directory's name; or its config.json)", "finetune/lora.py setup; config.py Config.from_checkpoint"),
    "precision": ("bf16-mixed", "precision (null: utils.get_default_supported_precision(training=True), bf16-mixed on a GPU with bfloat16; Lightning's short names bf16, 16, 32, 64)", "finetune/lora.py setup"),
    "quantize": (None, "quantization nf4 / fp4 / int8 (bnb.nf4-dq, bnb.fp4-dq: double_quant), training.quantized_saves_input, optimizer PagedAdamW (paged fp32 state)", "finetune/lora.py setup BitsandbytesPrecision, main optimizer_cls"),
    "devices": (1, "parallel.fsdp full_shard, parallel.data, training.checkpointing full (above 1: FSDPStrategy with activation_checkpointing_policy={Block})", "finetune/lora.py, full.py setup"),
    "lora_r": (8, "lora.r", "finetune/lora.py setup"),
    "lora_alpha": (16, "lora.alpha", "finetune/lora.py setup"),
    "lora_dropout": (0.05, "lora.dropout", "finetune/lora.py setup"),
    "lora_query / lora_key / lora_value": ("true / false / true", "lora.target_modules (the family's q, k, v modules), training.litgpt_qkv's parts", "finetune/lora.py setup; lora.py LoRAQKVLinear"),
    "lora_projection / lora_mlp / lora_head": (False, "lora.target_modules (the attention's output, the MLP's linears, the head)", "finetune/lora.py setup"),
    "train.micro_batch_size": ("4 (lora.py), 1 (full.py)", "training.micro_batch", "args.py TrainArgs; the scripts' setup defaults"),
    "train.global_batch_size": ("128 (lora.py), 64 (full.py)", "training.gradient_accumulation: global_batch_size // devices // micro_batch_size", "args.py TrainArgs.gradient_accumulation_iters"),
    "train.max_seq_length": (None, "training.seq_len (null: left to the data: memfit gates the setting data_seq_len, default 2,048, says so at the key with the longest length that fits)", "finetune/lora.py fit: model.max_seq_length = min(longest, max_seq_length)"),
    "train.tie_embeddings": (None, "(an error when set: the finetune scripts' validate_args refuses it)", "finetune/lora.py, full.py validate_args"),
    "optimizer": ("AdamW", "optimizer, training.optimizer_impl (a name or class_path + init_args; later LitGPT releases; init_args fused: true -> fused, foreach: false -> for_loop); a file with it is read as 0.5.13 runs it: training.rmsnorm_upcast fp32_weight (Llama, Mistral), training.litgpt_qkv window_mask (a model with sliding_window_size: Phi-3, Mistral-7B-v0.1)", "finetune/lora.py main: torch.optim.AdamW, bnb.optim.PagedAdamW under quantize; model.py 26857050 RMSNorm, CausalSelfAttention"),
}

# `litgpt pretrain --config FILE` (config_hub/pretrain/*.yaml): native key -> (default, memfit key, source in litgpt at
# 26857050, PyPI 0.5.13: pretrain.py)
PRETRAIN_KEYS = {
    "model_name": (None, "model.transformer (LitGPT's config name: models/litgpt_configs.py PRETRAIN_NAMES, then its finetune table)", "pretrain.py setup: Config.from_name(model_name)"),
    "model_config": (None, "model.transformer (LitGPT's Config fields, over model_name: LLaMA-shaped or GPT-NeoX-shaped blocks)", "pretrain.py setup"),
    "precision": ("bf16-mixed", "precision (null: bf16-mixed, get_default_supported_precision(training=True) on a GPU with bfloat16)", "pretrain.py setup"),
    "devices": ("auto", "parallel.fsdp hybrid_shard over devices x num_nodes (FSDPStrategy(sharding_strategy=\"HYBRID_SHARD\"), no activation checkpointing); auto: every GPU, memfit's --gpus (1 without)", "pretrain.py setup"),
    "num_nodes": (1, "parallel.gpus_per_node devices (the world: devices x num_nodes)", "pretrain.py setup"),
    "train.micro_batch_size": (4, "training.micro_batch", "pretrain.py setup's TrainArgs"),
    "train.global_batch_size": (512, "training.gradient_accumulation: global_batch_size // (devices x num_nodes) // micro_batch_size", "args.py TrainArgs.gradient_accumulation_iters"),
    "train.max_seq_length": (None, "training.seq_len (null: the model's block_size: fit cuts the token stream into max_seq_length + 1 windows, every sample full)", "pretrain.py main, fit"),
    "train.tie_embeddings": (False, "the head shares the embedding's weight (model.transformer tie_word_embeddings)", "pretrain.py main"),
    "optimizer": ("AdamW", "optimizer, training.optimizer_impl fused (pretrain.py main passes fused=True on CUDA)", "pretrain.py main: instantiate_torch_optimizer(optimizer, ..., fused=...)"),
}

# keys that change memory and are not modelled -> (no-effect values, what they do)
UNMODELLED = {
    "resume": ((False,), "resuming loads the optimizer state and the model from a checkpoint on the GPU: the figures may be low by the loaded copy while it is read"),
}

# the scripts' defaults that differ (finetune/lora.py and full.py setup's TrainArgs)
SCRIPT_DEFAULTS = {"lora": {"micro_batch_size": 4, "global_batch_size": 128}, "full": {"micro_batch_size": 1, "global_batch_size": 64}}
# Lightning's short names (fabric/connector.py _PRECISION_INPUT_STR_ALIAS_CONVERSION)
ALIASES = {"64": "64-true", "32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed"}
PRECISIONS = tuple(RECIPES)   # Lightning's precision names, the recipe's table (recipe/dtypes.py)
# BitsandbytesPrecision's modes (quantize[4:]) -> (quantization method, double_quant)
QUANTIZE = {"bnb.nf4": ("nf4", False), "bnb.nf4-dq": ("nf4", True), "bnb.fp4": ("fp4", False), "bnb.fp4-dq": ("fp4", True), "bnb.int8-training": ("int8", False)}
# finetune/lora.py setup's dtype map under quantize (those three names), each the recipe's dtype
COMPUTE = {name: RECIPES[name].parameters for name in ("bf16-true", "16-true", "32-true")}
LORA_FLAGS = (("lora_query", True), ("lora_key", False), ("lora_value", True), ("lora_projection", False), ("lora_mlp", False), ("lora_head", False))


def _model(r: Reader, ctx) -> dict | None:
    """The transformer of checkpoint_dir: the settings' models table or a local directory with a config.json (LitGPT's
    download keeps it there), else LitGPT's table by the directory's name; None after a positioned error."""
    value = r.data.get("checkpoint_dir")
    at = r.at("checkpoint_dir") if "checkpoint_dir" in r.data else r.native.root
    if not isinstance(value, str) or not value.strip():
        r.error(at, codes.MODEL_NOT_FOUND, "checkpoint_dir names no model: LitGPT reads the model from the checkpoint directory "
                f"(litgpt's default is checkpoints/stabilityai/stablelm-base-alpha-3b); name one of {_known()}")
        return None
    name = value.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1]
    local = os.path.join(ctx.base, value, "config.json")
    if value in (ctx.conf.get("models") or {}) or os.path.isfile(local):
        # a directory LitGPT opens where it runs, never a Hub name: './' so that it is read as the folder it is
        raw = ctx.model(value if value in (ctx.conf.get("models") or {}) or os.path.isabs(value) else os.path.join(os.curdir, value), at)
        if raw is None:
            return None
        r.native.doc.get("model", {}).pop("hf_config", None)  # the keys go inline (model.transformer), the file stays a reference
        r.native.origins.pop(("model", "hf_config"), None)
        # LitGPT's GPT keeps lm_head apart from the embedding whatever the config.json says
        return {**raw, "tie_word_embeddings": False}
    if name in litgpt_configs.REFUSED:
        r.error(at, codes.UNSUPPORTED_MODEL, f"checkpoint_dir {name}: {litgpt_configs.REFUSED[name]}")
        return None
    key = litgpt_configs.lookup(name)
    if key is None:
        r.error(at, codes.MODEL_NOT_FOUND, f"checkpoint_dir {value!r}: memfit knows LitGPT's {_known()}; map this one to its config.json in "
                f"the settings' models table ([tool.memfit.models] \"{value}\" = \"path/to/config.json\"), or put its config.json in that directory")
        return None
    return litgpt_configs.transformer(key)


def _known() -> str:
    return ", ".join(litgpt_configs.CONFIGS)


def _lora(r: Reader, family: str) -> tuple[dict, list]:
    """lora's spec from lora_r, lora_alpha, lora_dropout and the lora_* flags, and the qkv parts LoRAQKVLinear adapts."""
    modules = litgpt_configs.LORA_MODULES.get(family)
    flags = {key: r.get(key, (bool,), default) for key, default in LORA_FLAGS}
    parts = [p for p in ("query", "key", "value") if flags[f"lora_{p}"]]
    targets = []
    if modules is None:
        at = r.at("lora_r") if "lora_r" in r.data else r.native.root
        r.warn(at, f"LoRA on a {family} model: memfit has no map of LitGPT's lora_* flags onto its modules; counted on its q, k, v projections")
        targets = ["q_proj", "k_proj", "v_proj"]
    else:
        for part in parts:
            targets.append(modules[part])
        if flags["lora_projection"]:
            targets.append(modules["projection"])
        if flags["lora_mlp"]:
            targets.extend(modules["mlp"])
        if flags["lora_head"]:
            targets.append(modules["head"])
    spec = {"r": r.get("lora_r", (int,), 8), "alpha": r.get("lora_alpha", (int, float), 16), "dropout": r.get("lora_dropout", (int, float), 0.05),
            "target_modules": list(dict.fromkeys(targets)), "dtype": "model"}  # built under fabric.init_module: the precision's dtype
    return spec, parts


def _optimizer(r: Reader, quantized: bool) -> str:
    """AdamW (torch's, foreach on CUDA) or, under BitsandbytesPrecision, bitsandbytes' PagedAdamW (32-bit paged state:
    fp32 state1/state2, one in-place kernel per parameter); a later release's `optimizer` key by name or class_path."""
    value = r.data.get("optimizer")
    at = r.at("optimizer") if "optimizer" in r.data else None
    name, kwargs = "AdamW", {}
    if isinstance(value, str):
        name = value
    elif isinstance(value, dict):
        name = r.get("class_path", (str,), "AdamW", data=value, prefix=("optimizer",))
        at = r.at("optimizer", "class_path") if "class_path" in value else at
        init_args = value.get("init_args")
        kwargs = init_args if isinstance(init_args, dict) else {}
    elif value is not None:
        r.error(r.at("optimizer"), codes.NATIVE_CONFIG, "optimizer takes a name (AdamW) or class_path and init_args")
    short = name.rsplit(".", 1)[-1]
    if quantized and short in ("AdamW", "Adam"):
        name = f"bitsandbytes.optim.Paged{short}"  # finetune/lora.py main: optimizer_cls = bnb.optim.PagedAdamW
    elif "." not in name:
        name = f"torch.optim.{name}"
    found = OPTIMIZERS.get(name)
    if found is None:
        r.set(("optimizer",), "adamw", at)
        r.warn(at or r.native.root, f"optimizer {name}: memfit does not model its state; counted as AdamW")
        return name
    kind, impl, state = found
    r.set(("optimizer",), kind, at)
    if state is not None:
        r.set(("dtypes", "optimizer_state"), state, at)
    if name.startswith("bitsandbytes.optim.Paged") and state == "float32":
        r.set(("training", "optimizer_impl"), "fused", at)  # one in-place kernel per parameter: no temporaries
        r.set(("training", "paged_optimizer"), True, at)
    else:
        impl, key = torch_impl(name, impl, kwargs)
        if impl is not None:
            r.set(("training", "optimizer_impl"), impl, r.at("optimizer", "init_args", key) if key else at)
    return name


# torch.optim's classes that take `fused` (pretrain.py's extra_kwargs are kept only where the signature has the key)
FUSED = ("torch.optim.AdamW", "torch.optim.Adam", "torch.optim.SGD", "torch.optim.Adagrad")


def _batch(r: Reader, ctx, script: str, devices: int) -> None:
    train = r.get("train", (dict,), {})
    defaults = SCRIPT_DEFAULTS[script]
    micro = r.get("micro_batch_size", (int,), defaults["micro_batch_size"], data=train, prefix=("train",))
    r.set(("training", "micro_batch"), micro, r.at("train", "micro_batch_size") if "micro_batch_size" in train else None)
    total = r.get("global_batch_size", (int,), defaults["global_batch_size"], data=train, prefix=("train",))
    at = r.at("train", "global_batch_size") if "global_batch_size" in train else None
    if micro < 1 or total // max(devices, 1) // micro < 1:
        r.error(at or r.at("train", "micro_batch_size") if "train" in r.data else r.native.root, codes.NATIVE_CONFIG,
                f"global_batch_size {total} over {devices} device(s) is less than micro_batch_size {micro}: LitGPT's "
                "TrainArgs.gradient_accumulation_iters asserts at least one")
    else:
        # no origin: the accumulation is derived (TrainArgs.gradient_accumulation_iters), so a fix that changes the
        # micro-batch edits micro_batch_size alone and global_batch_size stays the run's (whatif/fixes.py native_edits)
        r.set(("training", "gradient_accumulation"), total // max(devices, 1) // micro)
    if train.get("tie_embeddings") is not None:  # finetune/lora.py, full.py validate_args
        r.error(r.at("train", "tie_embeddings"), codes.NATIVE_CONFIG, "train.tie_embeddings: LitGPT's finetune scripts refuse it "
                "(validate_args: \"doesn't support the 'tie_embeddings' argument\"); leave it null")


def _seq_len(r: Reader, ctx, block: int) -> None:
    train = r.get("train", (dict,), {})
    seq = r.get("max_seq_length", (int,), None, data=train, prefix=("train",))
    if seq is None:
        where = r.at("train", "max_seq_length") if "max_seq_length" in train else r.at("train", on_key=True) if "train" in r.data else r.native.root
        seq = r.seq_left_to_data(where, ctx.conf, block, "train.max_seq_length is not set: LitGPT does not truncate")
        r.set(("training", "seq_len"), seq)
        return
    at = r.at("train", "max_seq_length")
    if seq > block:
        r.warn(at, f"train.max_seq_length {seq:,} is above the model's block_size {block:,}: LitGPT raises 'Cannot attend to ...' "
                   f"on a longer sample (model.max_seq_length = min(longest, max_seq_length)); memfit gates {block:,} tokens")
        seq = block
    r.set(("training", "seq_len"), seq, at)


def read(r: Reader, ctx) -> dict:
    data = r.data
    if "checkpoint_dir" not in data and "model_name" in data:
        return read_pretrain(r, ctx)
    r.native.root = (r.at("checkpoint_dir", on_key=True) if "checkpoint_dir" in data
                     else r.at(next(iter(data)), on_key=True) if data else r.at())
    lora = "quantize" in data or any(key in data for key, _ in LORA_FLAGS) or any(k in data for k in ("lora_r", "lora_alpha", "lora_dropout"))
    script = "lora" if lora else "full"
    transformer = _model(r, ctx)
    if transformer is None:
        return {}
    r.set(("model", "transformer"), transformer, r.at("checkpoint_dir"))
    family = transformer.get("model_type")

    precision = r.get("precision", (str, int), None)
    precision = ALIASES.get(str(precision), precision) if precision is not None else None
    if precision is not None and precision not in PRECISIONS:
        r.error(r.at("precision"), codes.NATIVE_CONFIG, f"precision is {precision!r}: one of {', '.join(map(repr, PRECISIONS))}")
        precision = None
    r.set(("precision",), precision or "bf16-mixed", r.at("precision") if precision else None)
    precision = precision or "bf16-mixed"
    quantize = r.get("quantize", (str,), None, choices=tuple(QUANTIZE))
    if quantize is not None:
        if precision not in COMPUTE:
            r.error(r.at("quantize"), codes.NATIVE_CONFIG, f"quantize {quantize} with precision {precision}: LitGPT raises "
                    "'Quantization and mixed precision is not supported' (finetune/lora.py setup); use bf16-true")
        method, double = QUANTIZE[quantize]
        # Lightning's BitsandbytesPrecision replaces every torch.nn.Linear as the model is built, lm_head's too, and
        # quantizes each weight from float16 (fabric/plugins/precision/bitsandbytes.py _Linear4bit.quantize:
        # `weight.contiguous().to(device=device, dtype=torch.half)`): what each 4-bit matmul dequantizes to
        four_bit = DTYPES[method][0] == HALF  # nf4, fp4 (int8-training keeps its weights a byte each)
        spec = {"method": method, "double_quant": double, "compute_dtype": COMPUTE.get(precision, "bfloat16")}
        r.set(("quantization",), {**spec, **({"quantized_from": "float16"} if four_bit else {}), "skip_modules": []}, r.at("quantize"))
        if four_bit:
            r.set(("training", "quantized_saves_input"), True)  # bitsandbytes 0.42.0 (pinned then): MatMul4Bit keeps its input

    devices = r.get("devices", (int, "auto"), 1)
    if devices == "auto" or not isinstance(devices, int):
        devices = ctx.conf.get("gpus") or 1
    if devices > 1:
        if quantize is not None:
            r.error(r.at("devices"), codes.NATIVE_CONFIG, "quantize over more than one device: LitGPT raises 'Quantization is currently "
                    "not supported for multi-GPU training' (finetune/lora.py setup)")
        r.set(("parallel", "fsdp"), "full_shard", r.at("devices"))
        r.set(("parallel", "fsdp_version"), 1, r.at("devices"))  # Lightning's FSDPStrategy: FullyShardedDataParallel (FSDP1)
        r.set(("training", "checkpointing"), "full", r.at("devices"))
        if "gpus" not in ctx.conf.cli:
            ctx.launch = {**ctx.launch, "gpus": (devices, r.at("devices"))}
    else:
        r.set(("training", "checkpointing"), "none")
    _batch(r, ctx, script, devices)
    _seq_len(r, ctx, model_value(transformer, "max_position_embeddings") or 2048)
    # fit() rebinds `logits = model(...)` only once the next micro-batch's forward has returned (lora.py and full.py)
    r.set(("training", "previous_outputs_held"), True)
    if precision != "64-true":
        # both scripts run the model through Fabric (fabric.setup / setup_module): _FabricModule.forward converts its
        # outputs to torch.get_default_dtype() (lightning/fabric/wrappers.py 51ad6bb8:145, precision.convert_output),
        # the logits come back fp32 (64-true's fp64 logits converted down are not modelled: left as they are)
        r.set(("training", "outputs_dtype"), "float32")
    r.set(("training", "attention"), "sdpa")  # model.py CausalSelfAttention.scaled_dot_product_attention: F.scaled_dot_product_attention
    _optimizer(r, quantize is not None)
    if lora:
        spec, parts = _lora(r, family)
        r.set(("lora",), spec, r.at("lora_r") if "lora_r" in data else None)
        for key, memfit in (("lora_r", "r"), ("lora_alpha", "alpha"), ("lora_dropout", "dropout")):
            if key in data:
                r.origin(("lora", memfit), r.at(key))
        r.set(("training", "loss"), {"kind": "chunked_head", "chunk_size": 128})  # model(input_ids, lm_head_chunk_size=128)
        modules = litgpt_configs.LORA_MODULES.get(family) or {}
        fused = modules.get("query") is not None and modules.get("query") == modules.get("key")
        r.set(("training", "litgpt_qkv"), {"lora": parts} if fused else True)
        _head_model(r, ctx, family)
    else:
        # full.py: `logits = model(input_ids)`, `chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])` with its
        # default chunk_size=128 (litgpt/utils.py: the whole logits' rows split 128 at a time)
        r.set(("training", "loss"), {"kind": "chunked_rows", "chunk_size": 128})
        r.set(("training", "litgpt_qkv"), True)
        _head_model(r, ctx, family)
    r.unmodelled(UNMODELLED)
    return {}


def _head_model(r: Reader, ctx, family: str) -> None:
    """A file of a later release (the `optimizer` key, which the hub's files have at HEAD and not at 3ba6da40) is read as
    LitGPT 0.5.13 runs it: its RMSNorm multiplies by weight.float() in fp32 (training.rmsnorm_upcast fp32_weight;
    models/litgpt_configs.RMS_NORM_FAMILIES), and a model with sliding_window_size (its model_config.yaml in the
    checkpoint directory, else LitGPT's table: litgpt_configs.WINDOW_MASK) builds each layer's mask, which SDPA keeps
    (training.litgpt_qkv window_mask). A file without it keeps 3ba6da40's model, the published rows' commit."""
    if "optimizer" not in r.data:
        return
    at = r.at("optimizer", on_key=True)
    if family in litgpt_configs.RMS_NORM_FAMILIES:
        r.set(("training", "rmsnorm_upcast"), "fp32_weight", at)
    if _window(ctx, r.data.get("checkpoint_dir")):
        value = r.native.doc.get("training", {}).get("litgpt_qkv")
        parts = value.get("lora") if isinstance(value, dict) else None
        r.set(("training", "litgpt_qkv"), {**({"lora": parts} if parts is not None else {}), "window_mask": True}, at)


def _window(ctx, value) -> bool:
    """Whether LitGPT's model of checkpoint_dir sets sliding_window_size: its model_config.yaml (what LitGPT builds
    from, `litgpt download` leaves it beside config.json), else LitGPT's table by the directory's name."""
    if not isinstance(value, str):
        return False
    path = os.path.join(ctx.base, value, "model_config.yaml")
    if os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as handle:
                fields = yaml.safe_load(handle)
        except (OSError, yaml.YAMLError):
            return False
        return isinstance(fields, dict) and fields.get("sliding_window_size") is not None
    return litgpt_configs.lookup(value.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1]) in litgpt_configs.WINDOW_MASK


def _pretrain_model(r: Reader) -> dict | None:
    """model_config's LitGPT Config fields, else model_name's (pretrain.py setup: `Config.from_name(model_name)` where
    model_config is null; an org/ prefix is accepted, as Config.from_name does); None after a positioned error."""
    fields = r.data.get("model_config")
    if fields is not None:
        at = r.at("model_config", on_key=True)
        if not isinstance(fields, dict):
            r.error(at, codes.NATIVE_CONFIG, "model_config takes LitGPT's Config fields (n_embd, n_layer, n_head, ...) or null")
            return None
        cfg = litgpt_configs.from_fields(fields)
        if isinstance(cfg, str):
            r.error(at, codes.UNSUPPORTED_MODEL, f"model_config: {cfg}; write a memfit config of the run")
            return None
        return cfg
    value = r.data.get("model_name")
    at = r.at("model_name")
    name = value.rsplit("/", 1)[-1] if isinstance(value, str) else None
    if name in litgpt_configs.PRETRAIN_NAMES:
        return litgpt_configs.from_fields(litgpt_configs.PRETRAIN_NAMES[name])
    if name in litgpt_configs.REFUSED:
        r.error(at, codes.UNSUPPORTED_MODEL, f"model_name {name}: {litgpt_configs.REFUSED[name]}")
        return None
    key = litgpt_configs.lookup(name) if name else None
    if key is None:
        known = ", ".join([*litgpt_configs.PRETRAIN_NAMES, *(entry[0] for entry in litgpt_configs.CONFIGS.values())])
        r.error(at, codes.MODEL_NOT_FOUND, f"model_name {value!r}: memfit knows LitGPT's {known}; or write the model's "
                "Config fields under model_config")
        return None
    return litgpt_configs.transformer(key)


def _pretrain_layout(r: Reader, ctx) -> int:
    """devices x num_nodes: above one GPU, Lightning's FSDPStrategy(auto_wrap_policy={Block},
    sharding_strategy="HYBRID_SHARD") with no activation checkpointing (pretrain.py setup): sharded within each node's
    `devices` ranks. `devices: auto` is every GPU of the machine: --gpus or the settings' gpus (1 without, said at
    the key); a --gpus or --gpus-per-node that disagrees with the config's counts wins, with a warning. The world size."""
    devices = r.get("devices", (int, str), "auto")
    at = r.at("devices") if "devices" in r.data else None
    nodes = max(r.get("num_nodes", (int,), 1), 1)
    gpus = ctx.conf.get("gpus")
    if not isinstance(devices, int):
        if devices != "auto":
            r.error(at, codes.NATIVE_CONFIG, f"devices is {devices!r}: a number of GPUs or auto")
        if gpus is None:
            r.warn(at or r.native.root, "devices auto: LitGPT uses every GPU of the machine (parse_devices); memfit checks 1 GPU "
                                        "(give the machine's count with --gpus N)")
        devices = max(gpus or 1, 1) // nodes or 1
    devices = max(devices, 1)
    world = devices * nodes
    if isinstance(gpus, int) and gpus > 0 and gpus != world and "gpus" in ctx.conf.cli:
        r.warn(at or r.native.root, f"--gpus {gpus} is not this config's devices x num_nodes = {world}: memfit checks {gpus} GPUs "
                                    f"({gpus // nodes or 1} a node), what LitGPT would launch with devices: {gpus // nodes or 1}")
        world, devices = gpus, gpus // nodes or 1
    per_node = devices
    if "gpus_per_node" in ctx.conf.cli and ctx.conf.get("gpus_per_node") != devices and world > 1:
        r.warn(at or r.native.root, f"--gpus-per-node {ctx.conf.get('gpus_per_node')}: LitGPT's HYBRID_SHARD shards within each "
                                    f"node's devices = {devices} ranks; the figures are for {ctx.conf.get('gpus_per_node')} a node "
                                    "(below the run's where more)")
    if world > 1:
        r.set(("parallel", "fsdp"), "hybrid_shard", at)
        r.set(("parallel", "fsdp_version"), 1, at)  # Lightning's FSDPStrategy: FullyShardedDataParallel (FSDP1)
        ctx.launch = {**ctx.launch, "gpus": (world, at), "gpus_per_node": (per_node, at)}
    return world


def _pretrain_batch(r: Reader, world: int, block: int) -> None:
    train = r.get("train", (dict,), {})
    micro = r.get("micro_batch_size", (int,), 4, data=train, prefix=("train",))
    r.set(("training", "micro_batch"), micro, r.at("train", "micro_batch_size") if "micro_batch_size" in train else None)
    total = r.get("global_batch_size", (int,), 512, data=train, prefix=("train",))
    if micro < 1 or total // world // micro < 1:
        r.error(r.at("train", "global_batch_size") if "global_batch_size" in train else r.native.root, codes.NATIVE_CONFIG,
                f"global_batch_size {total} over {world} device(s) is less than micro_batch_size {micro}: LitGPT's "
                "TrainArgs.gradient_accumulation_iters asserts at least one")
    else:
        r.set(("training", "gradient_accumulation"), total // world // micro)
    seq = r.get("max_seq_length", (int,), None, data=train, prefix=("train",))
    if seq is None:
        # main: `if train.max_seq_length: model.max_seq_length = ...`, else the block size; fit slices every window of
        # the token stream to model.max_seq_length (input_ids = train_data[:, 0 : model.max_seq_length])
        r.set(("training", "seq_len"), block)
    else:
        if seq > block:
            r.error(r.at("train", "max_seq_length"), codes.NATIVE_CONFIG, f"train.max_seq_length {seq:,} is above the model's "
                    f"block_size {block:,}: LitGPT's GPT raises 'Cannot attend to {seq}, block size is only {block}'")
        r.set(("training", "seq_len"), min(seq, block), r.at("train", "max_seq_length"))


def read_pretrain(r: Reader, ctx) -> dict:
    """A `litgpt pretrain` config, read as pretrain.py runs it at 26857050 (PyPI litgpt 0.5.13): the model built from
    its Config (random weights, or initial_checkpoint_dir's loaded into them), every parameter trained, the whole
    logits and `chunked_cross_entropy(logits, targets)` (training.loss chunked_rows, shift false), Fabric's fp32 outputs, fused AdamW on
    CUDA, and `torch.compile(model)`, not modelled (a warning: the eager figure is gated)."""
    data = r.data
    r.native.root = r.at("model_name", on_key=True)
    transformer = _pretrain_model(r)
    if transformer is None:
        return {}
    train = data.get("train") if isinstance(data.get("train"), dict) else {}
    if train.get("tie_embeddings"):
        transformer = {**transformer, "tie_word_embeddings": True}  # main: model.transformer.wte.weight = model.lm_head.weight
    r.set(("model", "transformer"), transformer, r.at("model_config") if data.get("model_config") is not None else r.at("model_name"))
    precision = r.get("precision", (str, int), None)
    precision = ALIASES.get(str(precision), precision) if precision is not None else None
    if precision is not None and precision not in ("bf16-true", "bf16-mixed", "32-true"):
        r.error(r.at("precision"), codes.NATIVE_CONFIG, f"precision is {precision!r}: pretrain.py takes 'bf16-true', 'bf16-mixed' or '32-true'")
        precision = None
    r.set(("precision",), precision or "bf16-mixed", r.at("precision") if precision else None)
    world = _pretrain_layout(r, ctx)
    r.set(("training", "checkpointing"), "none")
    _pretrain_batch(r, world, transformer["max_position_embeddings"])
    r.set(("training", "previous_outputs_held"), True)   # fit rebinds `logits` once the next forward has returned
    # fit: `chunked_cross_entropy(logits, targets)`, the targets shifted by the data (train_data[:, 1 : max_seq_length + 1])
    r.set(("training", "loss"), {"kind": "chunked_rows", "chunk_size": 128, "shift": False})
    if (precision or "bf16-mixed") != "64-true":
        r.set(("training", "outputs_dtype"), "float32")   # Fabric's _FabricModule.forward: outputs to fp32
    r.set(("training", "attention"), "sdpa")
    # model.py 26857050: a model with sliding_window_size builds each layer's (1, 1, s, s) mask, which SDPA keeps
    fields, name = data.get("model_config"), data.get("model_name")
    windowed = (fields.get("sliding_window_size") is not None if isinstance(fields, dict)
                else isinstance(name, str) and litgpt_configs.lookup(name.rsplit("/", 1)[-1]) in litgpt_configs.WINDOW_MASK)
    r.set(("training", "litgpt_qkv"), {"window_mask": True} if windowed else True)
    if transformer.get("model_type") in litgpt_configs.RMS_NORM_FAMILIES:
        r.set(("training", "rmsnorm_upcast"), "fp32_weight")   # model.py 26857050 RMSNorm: weight.float() * x_normed
    if _optimizer(r, False) in FUSED:
        # main: instantiate_torch_optimizer(..., fused=fabric.device.type == "cuda"), which updates init_args
        # (utils.py instantiate_torch_optimizer: `optimizer["init_args"].update(kwargs)`): fused whatever they say
        r.set(("training", "optimizer_impl"), "fused")
    r.warn(r.native.root, f"litgpt pretrain compiles the model (pretrain.py main: torch.compile(model)); {COMPILED}")
    r.unmodelled(UNMODELLED)
    if data.get("initial_checkpoint_dir"):
        r.warn(r.at("initial_checkpoint_dir"), "initial_checkpoint_dir: fabric.load_raw reads the checkpoint into the model; "
                                                "the figures leave out the loaded copy while it is read")
    return {}

"""The names users know: the config names of transformers, peft, bitsandbytes, DeepSpeed, FSDP, Lightning,
TRL and the Trainer that have a memfit equivalent, and the case of enum values.

`FRAMEWORK_NAMES` is data: a name as the frameworks spell it -> where memfit keeps it (a key path, and the
value when the framework's name implies one). An unknown key with one of these names, anywhere in a config,
gets "did you mean" with the full memfit key (read/schema.py); `tests/read/test_names.py` checks that every
entry names a key, and a value, the schema accepts.

`canonical(data)`: enum values are matched without regard to case, as optimizer names and device presets
are (`FULL_SHARD` is `full_shard`); the data is returned with each such value spelled as the schema has it.
"""

from __future__ import annotations

from functools import lru_cache

from memfit.diagnostics.records import record


@record(frozen=True)
class Name:
    """A framework's name for a memfit key: the key (and value) it means, for a 'did you mean' note."""

    framework: str  # whose name it is
    key: str  # the memfit key path, dot-separated
    value: object = None  # the memfit value the framework's name implies (None: the user's value, as is)
    note: str = ""  # what to mind when moving the value over


TRANSFORMERS = "transformers' TrainingArguments"
TRL = "TRL's SFTConfig"
PEFT = "peft's LoraConfig"
BNB = "bitsandbytes (transformers' BitsAndBytesConfig)"
DEEPSPEED = "DeepSpeed's config"
FSDP = "PyTorch FSDP / Accelerate"
LIGHTNING = "Lightning's Trainer"
MEGATRON = "Megatron-LM"
TORCHRUN = "torchrun"

FRAMEWORK_NAMES: dict[str, Name] = {
    # batch, sequence, accumulation
    "per_device_train_batch_size": Name(TRANSFORMERS, "training.micro_batch"),
    "train_micro_batch_size_per_gpu": Name(DEEPSPEED, "training.micro_batch"),
    "micro_batch_size": Name(MEGATRON, "training.micro_batch"),
    "batch_size": Name(LIGHTNING + " (DataLoader)", "training.micro_batch", note="per GPU, per step; model.batch_size in the Keras form"),
    "train_batch_size": Name(DEEPSPEED, "training.micro_batch", note="DeepSpeed's is the global batch: micro_batch x gradient_accumulation x parallel.data"),
    "global_batch_size": Name(MEGATRON, "training.micro_batch", note="the global batch is micro_batch x gradient_accumulation x parallel.data"),
    "gradient_accumulation_steps": Name(TRANSFORMERS + ", " + DEEPSPEED, "training.gradient_accumulation"),
    "accumulate_grad_batches": Name(LIGHTNING, "training.gradient_accumulation"),
    "max_seq_length": Name(TRL, "training.seq_len"),
    "max_length": Name(TRL, "training.seq_len"),
    "model_max_length": Name("transformers' tokenizer", "training.seq_len"),
    "seq_length": Name(MEGATRON, "training.seq_len"),
    "sequence_len": Name("Axolotl", "training.seq_len"),
    # recomputation, attention, optimizer
    "gradient_checkpointing": Name(TRANSFORMERS, "training.checkpointing", "full"),
    "activation_checkpointing": Name(FSDP, "training.checkpointing", "full"),
    "recompute_granularity": Name(MEGATRON, "training.checkpointing", note="full or selective"),
    "attn_implementation": Name("transformers' from_pretrained", "training.attention", note="eager, sdpa or flash (flash_attention_2)"),
    "optim": Name(TRANSFORMERS, "optimizer", note="adamw_torch is adamw, adamw_bnb_8bit is adamw8bit"),
    "torch_compile": Name(TRANSFORMERS, "training.optimizer_impl", note="no compile key; the optimizer's implementation is foreach, fused or for_loop"),
    # precision
    "bf16": Name(TRANSFORMERS + ", " + DEEPSPEED, "precision", "bf16-mixed"),
    "fp16": Name(TRANSFORMERS + ", " + DEEPSPEED, "precision", "16-mixed"),
    "mixed_precision": Name("Accelerate", "precision", "bf16-mixed", note="fp16 is 16-mixed"),
    "torch_dtype": Name("transformers' from_pretrained", "precision", "bf16-true", note="the weights' dtype; training in it without a master copy"),
    "grad_accum_dtype": Name(DEEPSPEED + " (data_types)", "training.grad_accum_dtype"),
    # LoRA
    "peft_config": Name(PEFT, "lora"),
    "lora_config": Name(PEFT, "lora"),
    "lora_r": Name(PEFT, "lora.r"),
    "lora_alpha": Name(PEFT, "lora.alpha"),
    "lora_dropout": Name(PEFT, "lora.dropout"),
    "target_modules": Name(PEFT, "lora.target_modules"),
    "modules_to_save": Name(PEFT, "lora.modules_to_save"),
    # quantization
    "quantization_config": Name(BNB, "quantization"),
    "load_in_4bit": Name(BNB, "quantization.method", "nf4", note="or fp4, as bnb_4bit_quant_type says"),
    "load_in_8bit": Name(BNB, "quantization.method", "int8"),
    "bnb_4bit_quant_type": Name(BNB, "quantization.method"),
    "bnb_4bit_use_double_quant": Name(BNB, "quantization.double_quant"),
    "bnb_4bit_compute_dtype": Name(BNB, "quantization.compute_dtype"),
    "llm_int8_skip_modules": Name(BNB, "quantization.skip_modules"),
    # parallelism
    "world_size": Name(TORCHRUN, "parallel.data", note="the world size is data x tensor x pipeline"),
    "num_gpus": Name(DEEPSPEED + " launcher", "parallel.data", note="the world size is data x tensor x pipeline"),
    "devices": Name(LIGHTNING, "parallel.data", note="GPUs per node: parallel.gpus_per_node"),
    "nproc_per_node": Name(TORCHRUN, "parallel.gpus_per_node"),
    "num_nodes": Name(LIGHTNING, "parallel.data", note="GPUs in all: nodes x parallel.gpus_per_node"),
    "zero_stage": Name(DEEPSPEED, "parallel.zero"),
    "zero_optimization": Name(DEEPSPEED, "parallel.zero", note="its stage"),
    "stage": Name(DEEPSPEED + " (zero_optimization)", "parallel.zero"),
    "offload_optimizer": Name(DEEPSPEED + " (zero_optimization)", "parallel.offload.optimizer", "cpu"),
    "offload_param": Name(DEEPSPEED + " (zero_optimization)", "parallel.offload.parameters", "cpu"),
    "reduce_bucket_size": Name(DEEPSPEED + " (zero_optimization)", "parallel.buckets.reduce"),
    "allgather_bucket_size": Name(DEEPSPEED + " (zero_optimization)", "parallel.buckets.allgather"),
    "fsdp": Name(TRANSFORMERS + ", " + FSDP, "parallel.fsdp", note="full_shard, shard_grad_op, hybrid_shard or no_shard"),
    "fsdp_config": Name(TRANSFORMERS, "parallel.fsdp"),
    "sharding_strategy": Name(FSDP, "parallel.fsdp", note="FULL_SHARD is full_shard"),
    "cpu_offload": Name(FSDP, "parallel.offload.parameters", "cpu", note="FSDP's CPUOffload moves the parameters and the optimizer state: parallel.offload.optimizer too"),
    "strategy": Name(LIGHTNING, "parallel.zero", note="deepspeed_stage_3 is parallel.zero: 3; fsdp is parallel.fsdp: full_shard"),
    "tensor_model_parallel_size": Name(MEGATRON, "parallel.tensor"),
    "tensor_parallel_size": Name("vLLM / Nanotron", "parallel.tensor"),
    "tp_size": Name(TRANSFORMERS, "parallel.tensor"),
    "pipeline_model_parallel_size": Name(MEGATRON, "parallel.pipeline"),
    "pp_size": Name("Nanotron", "parallel.pipeline"),
    "data_parallel_size": Name(MEGATRON, "parallel.data"),
}


def _key(name) -> str:
    return str(name).strip().lower().replace("-", "_")


def framework_hint(name) -> str | None:
    """'did you mean' text for a framework's name of a memfit key, or None."""
    found = FRAMEWORK_NAMES.get(_key(name))
    if found is None:
        return None
    target = found.key if found.value is None else f"{found.key}: {found.value}"
    note = f"; {found.note}" if found.note else ""
    return f"did you mean {target}? (the name in {found.framework}{note})"


# --- enum values without regard to case -------------------------------------------------------

SKIP = frozenset({"parameters", "activations"})  # long lists of tensors: no enum in them that is not a dtype


def canonical(data, root: dict):
    """`data` with each string enum value spelled as the schema (`root`, read.schema.schema()) spells it,
    matched without regard to case (a copy where anything changed; `data` itself when nothing did)."""
    if not isinstance(data, dict):
        return data
    spellings = _spellings(_Same(root))
    if all(_spelled(value, spellings) for key, value in data.items() if key not in SKIP):
        return data  # (most configs: every string is already the only spelling the schema has of it, or none)
    return _walked(data, root)


def _walked(data: dict, root: dict):
    """canonical's walk along the schema: each value checked against the enums of its own node."""
    properties = root.get("properties", {})
    out = data
    for key, value in data.items():
        if key in SKIP or key not in properties:
            continue
        new = _walk(value, properties[key], root)
        if new is not value:
            out = {**out, key: new} if out is data else {**out, key: new}
    return out


class _Same:
    """The schema, hashed by identity (read.schema.schema() returns one object): _spellings' cache key."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __hash__(self):
        return id(self.value)

    def __eq__(self, other):
        return isinstance(other, _Same) and other.value is self.value


@lru_cache(maxsize=4)
def _spellings(schema: _Same) -> dict:
    """lower-case -> every spelling the schema's enums give it, over the whole schema."""
    out: dict = {}

    # (the schema is JSON's: its mappings are dicts, its arrays lists; the walk calls itself on those only, not once
    # per leaf, and costs a check half what it did)
    def visit(node: dict) -> None:
        enum = node.get("enum")
        if type(enum) is list:
            for value in enum:
                if isinstance(value, str):
                    out.setdefault(value.lower(), set()).add(value)
        for item in node.values():
            if type(item) is dict:
                visit(item)
            elif type(item) is list:
                visit_list(item)

    def visit_list(node: list) -> None:
        for item in node:
            if type(item) is dict:
                visit(item)
            elif type(item) is list:
                visit_list(item)

    visit(schema.value)
    return {k: frozenset(v) for k, v in out.items()}


def _spelled(value, spellings: dict) -> bool:
    """Whether no enum anywhere could respell `value` or anything in it: each string has no case-insensitive match
    in the schema's enums, or is itself the only spelling they have of it."""
    if isinstance(value, str):
        found = spellings.get(value.lower())
        return found is None or found == {value}
    if isinstance(value, dict):
        return all(_spelled(item, spellings) for item in value.values())
    if isinstance(value, list):
        return all(_spelled(item, spellings) for item in value)
    return True


def _resolve(node: dict, root: dict) -> dict:
    ref = node.get("$ref") if isinstance(node, dict) else None
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return _resolve(root["$defs"][ref.rsplit("/", 1)[1]], root)
    return node if isinstance(node, dict) else {}


@lru_cache(maxsize=None)
def _folded(values: tuple) -> dict:
    """lower-case -> the enum's spelling, for the strings no two of which differ only in case."""
    seen: dict = {}
    for v in values:
        if isinstance(v, str):
            seen.setdefault(v.lower(), []).append(v)
    return {k: vs[0] for k, vs in seen.items() if len(vs) == 1}


EXACT = frozenset({"#/$defs/layer_type"})  # Keras class names: `Conv2d` is a mistake to report (with the nearest types)


def _walk(value, node, root):
    if isinstance(node, dict) and node.get("$ref") in EXACT:
        return value
    node = _resolve(node, root)
    if isinstance(value, str):
        enum = node.get("enum")
        if isinstance(enum, list) and value not in enum:
            return _folded(tuple(enum)).get(value.lower(), value)
        for branch in [*node.get("anyOf", ()), *node.get("oneOf", ())]:
            new = _walk(value, branch, root)
            if new is not value:
                return new
        return value
    if isinstance(value, dict):
        properties = node.get("properties", {})
        out = value
        for key, item in value.items():
            if key in properties:
                new = _walk(item, properties[key], root)
                if new is not item:
                    out = {**out, key: new}
        # a layer's arguments: `if` its type is X `then` X's definition
        for sub in node.get("allOf", ()):
            out = _walk(out, sub, root)
        if "then" in node and _holds(out, node.get("if"), root):
            out = _walk(out, node["then"], root)
        return out
    if isinstance(value, list):
        items = node.get("items")
        if not isinstance(items, dict):
            return value
        new = [_walk(item, items, root) for item in value]
        return value if all(a is b for a, b in zip(new, value)) else new
    return value


def _holds(value: dict, condition, root) -> bool:
    """The `if` of an if/then as the schema writes them here: required keys, and consts."""
    if not isinstance(condition, dict):
        return False
    condition = _resolve(condition, root)
    if any(key not in value for key in condition.get("required", ())):
        return False
    for key, spec in condition.get("properties", {}).items():
        if isinstance(spec, dict) and "const" in spec and value.get(key) != spec["const"]:
            return False
    return True

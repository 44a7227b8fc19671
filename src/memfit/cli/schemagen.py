"""The JSON Schema, generated from memfit's tables: dtypes (dtypes.DTYPES), the unit grammar
(units.UNITS), optimizers (optim.OPTIMIZERS), recipes (precision, quant, lora), layer types with their argument specs and
activations (models.keras). `memfit schema` prints it; schemas/memfit.schema.json is that output
checked in (a test fails when it is stale), and what the checker validates against.

The texts here are what editors show (titles, descriptions, defaults, examples): the format's
structure is written once, below; what a table decides is computed from the table.
"""

from __future__ import annotations

import json

from memfit.recipe.dtypes import DTYPES
from memfit.diagnostics.units import BYTES_PATTERN, PERCENT_PATTERN, UNITS

ROOT_DEFS = "#/$defs/"


def schema_text() -> str:
    """The schema as `memfit schema` prints it and the checked-in file holds it."""
    return json.dumps(generate(), indent=2) + "\n"


def _bytes() -> dict:
    binary = [name for name, size in UNITS.items() if size > 1 and size & (size - 1) == 0]
    decimal = [name for name, size in UNITS.items() if size > 1 and name not in binary]
    return {
        "$anchor": "bytes",
        "title": "Byte quantity",
        "description": f"An integer byte count, or '<number> <unit>' with B, {', '.join(decimal)} (powers of 1000) or {', '.join(binary)} (powers of 1024).",
        "anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": BYTES_PATTERN}],
        "examples": ["24 GiB", "80GB", 1073741824],
    }


def _percent() -> dict:
    return {"$anchor": "percent", "title": "Percentage", "description": "A percentage such as '10%'.", "type": "string", "pattern": PERCENT_PATTERN, "examples": ["10%"]}


def _dtype() -> dict:
    return {
        "$anchor": "dtype",
        "title": "dtype",
        "description": "A dtype name or a positive byte width (a multiple of 1/8: 0.5 for 4-bit).",
        "anyOf": [{"enum": list(DTYPES)}, {"type": "number", "exclusiveMinimum": 0, "multipleOf": 0.125}],
        "examples": ["float32", "bfloat16", "float16", "int8", "nf4"],
    }


def _optimizer() -> dict:
    from memfit.recipe.optim import OPTIMIZERS, schema_description

    return {
        "title": "Optimizer",
        "description": schema_description(),
        "type": "string",
        "examples": list(OPTIMIZERS),
    }


def _recipes() -> dict:
    """precision, master_weights, lora, quantization (training.grad_accum_dtype is in _training):
    from the recipe modules' tables."""
    from memfit.recipe import lora
    from memfit.recipe import precision
    from memfit.recipe import quant

    return {
        **precision.schema_properties(),
        "lora": lora.schema_property(),
        "quantization": quant.schema_property(),
    }


def _activation_function() -> dict:
    from memfit.models.keras import ACTIVATIONS

    return {"$anchor": "activation-function", "title": "Activation", "description": "A Keras activation function name.", "enum": list(ACTIVATIONS)}


def _layer_type() -> dict:
    from memfit.models.keras import RULES

    return {
        "$anchor": "layer-type",
        "title": "Layer type",
        "description": "The Keras layer class, e.g. Conv2D, Dense, LSTM.",
        "type": "string",
        "enum": list(RULES),
    }


_LAYER_NAME = {"title": "Name", "description": "The layer's name (default: Keras's automatic name, e.g. 'conv2d_1'); `inputs` of later layers refer to it.", "type": "string"}


def _layer_inputs(merge) -> dict:
    """`inputs`: the tensors a layer takes, as Keras's functional API wires them."""
    spec = {
        "title": "Inputs",
        "description": "Names of the layers whose outputs this layer takes (or model.input_name, default 'input_layer', for the model's input); default: the previous layer's output.",
        "type": "array",
        "items": {"type": "string", "description": "An earlier layer's name, or the model's input name."},
        "minItems": 1,
        "maxItems": 1,
    }
    if merge:
        fewest, most = merge
        spec = {**spec, "description": f"Names of the {fewest}{'' if most == fewest else ' or more'} layers whose outputs this layer merges (model.input_name, default 'input_layer', names the model's input).", "minItems": fewest}
        del spec["maxItems"]
        if most is not None:
            spec["maxItems"] = most
    return spec


def _layer_defs() -> dict:
    """One closed definition per layer type, its arguments from the layer's table entry."""
    from memfit.models.keras import RULES

    return {
        f"layer_{kind}": {
            "title": kind,
            "description": rule.doc,
            "type": "object",
            "required": ["type", *rule.required, *(["inputs"] if rule.merge else [])],
            "additionalProperties": False,
            "properties": {"type": {"title": "Layer type", "description": f"{kind}.", "const": kind}, "name": _LAYER_NAME, "inputs": _layer_inputs(rule.merge), **rule.args},
        }
        for kind, rule in RULES.items()
    }


def _layer() -> dict:
    """The discriminator: `type` selects the closed definition of that layer type."""
    from memfit.models.keras import RULES

    branches = [
        {"if": {"properties": {"type": {"title": "Layer type", "description": f"Selects the {kind} arguments.", "const": kind}}}, "then": {"$ref": f"{ROOT_DEFS}layer_{kind}"}}
        for kind in RULES
    ]
    return {
        "$anchor": "layer",
        "title": "A layer",
        "description": "One Keras layer: `type` and that type's arguments (Keras 3 defaults).",
        "type": "object",
        "required": ["type"],
        "properties": {"type": {"$ref": f"{ROOT_DEFS}layer_type", "title": "Layer type", "description": "The Keras layer class, e.g. Conv2D, Dense, LSTM."}},
        "if": {"type": "object", "required": ["type"]},
        "then": {"allOf": branches},
        "examples": [{"type": "Conv2D", "filters": 32, "kernel_size": [8, 8], "strides": [4, 4], "padding": "same"}, {"type": "Dense", "units": 512}],
    }


def _count(title: str, description: str) -> dict:
    return {"title": title, "description": description, "type": "integer", "minimum": 1}


def _parallel_sections() -> dict:
    """`parallel` and `host` (sharding.py); `training.gradient_accumulation` is in _training."""
    from memfit.placement.sharding import FSDP_STRATEGIES, PIPELINE_SCHEDULES, TENSOR_PLANS, ZERO_STAGES

    offload = {"title": "Offload", "description": "Where it lives: 'cpu' (host memory) or 'none'.", "enum": ["cpu", "none"]}
    return {
        "parallel": {
            "title": "Parallel layout",
            "description": "Data, tensor and pipeline parallelism with DeepSpeed ZeRO or PyTorch FSDP: memfit checks the most-loaded GPU. World size = data x tensor x pipeline.",
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "data": _count("Data parallel", "Data-parallel ranks (default 1)."),
                "tensor": _count("Tensor parallel", "Megatron-style tensor-parallel ranks: column/row-parallel linears, vocabulary-parallel embedding (default 1)."),
                "pipeline": _count("Pipeline stages", "Pipeline stages under the 1F1B schedule (default 1)."),
                "expert": _count("Expert parallel", "Expert-parallel ranks, carved out of the data-parallel ones (Megatron's expert_model_parallel_size): each holds num_experts / expert of a mixture of experts' routed experts (parameters, gradients, optimizer state, the latter sharded over data / expert ranks under ZeRO) and exchanges routed tokens by all-to-all (default 1)."),
                "schedule": {"title": "Pipeline schedule", "description": "The pipeline schedule: '1f1b' (the default: a stage holds up to pipeline - stage micro-batches' activations) or 'gpipe' (every micro-batch's forward before any backward: a stage holds all of them). training.gradient_accumulation is the number of micro-batches.", "enum": list(PIPELINE_SCHEDULES)},
                "sequence_parallel": {"title": "Sequence parallel", "description": "Megatron sequence parallelism (needs tensor > 1).", "type": "boolean"},
                "tensor_plan": {"title": "Tensor-parallel plan", "description": "How a sequence-parallel rank feeds a column-parallel linear (q/k/v, gate/up, the output layer): 'megatron' (the default: Megatron-LM's ColumnParallelLinear all-gathers its input's sequence shard, saves the shard and gathers it again in backward) or 'dtensor' (torch's DTensor plans, as torchtitan and transformers write them: PrepareModuleInput redistributes the sequence shard to Replicate() before the attention and the MLP, and the ColwiseParallel linears save that all-gathered input, the whole sequence). Changes nothing without sequence_parallel.", "enum": list(TENSOR_PLANS)},
                "zero": {"title": "ZeRO stage", "description": "DeepSpeed ZeRO stage: 1 shards the optimizer state, 2 also gradients, 3 also parameters. Not with fsdp.", "enum": list(ZERO_STAGES)},
                "fsdp": {"title": "FSDP strategy", "description": "PyTorch FSDP sharding strategy. Not with zero.", "enum": list(FSDP_STRATEGIES)},
                "fsdp_version": {"title": "FSDP version", "description": "Which PyTorch FSDP runs parallel.fsdp: 2 (the default: FSDP2, torch.distributed.fsdp.fully_shard, as torchtune and torchtitan run it and accelerate with fsdp_version 2; memfit's sharding, gathers and prefetches are FSDP2's, measured) or 1 (FSDP1, FullyShardedDataParallel: accelerate's and the HF Trainer's default, Lightning's and LitGPT's FSDPStrategy). Under FSDP1 the forward holds no all-gather output beside the unit it runs (FSDP1 all-gathers into the flat parameter and prefetches nothing in forward by default) and autocast's cache holds no weight cast (FSDP1's forward parameters are views of the flat parameter, which autocast does not cache; FSDP2's are leaves, whose casts it keeps to the forward's end under checkpointing). Changes nothing without fsdp.", "enum": [1, 2]},
                "gpus_per_node": _count("GPUs per node", "GPUs in one node: hybrid_shard shards within a node, host memory is per node (default 8)."),
                "offload": {
                    "title": "CPU offload",
                    "description": "ZeRO-Offload / FSDP CPUOffload: what lives in host memory.",
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"optimizer": offload, "parameters": offload},
                },
                "zero_shard_size": _count("ZeRO shard group", "ZeRO shards over groups of this many data-parallel ranks, each group holding one whole copy (DeepSpeed MiCS's mics_shard_size): a GPU keeps 1/zero_shard_size of the sharded state, not 1/data. Must divide data; default: all data ranks."),
                "gradient_as_bucket_view": {"title": "DDP gradients as bucket views", "description": "Plain data parallelism (no zero, no fsdp) runs PyTorch DistributedDataParallel, whose reducer keeps gradient buckets from its construction on: a second copy of the trainable parameters' gradients, counted. true: the gradients are views of the buckets (DistributedDataParallel(gradient_as_bucket_view=True), Lightning's DDPStrategy(gradient_as_bucket_view=True)): one copy, held the whole step. Default false, as PyTorch, accelerate and the HF Trainer leave it.", "type": "boolean"},
                "bf16_optimizer": {"title": "DeepSpeed BF16_Optimizer", "description": "With zero: 1: the optimizer is DeepSpeed's BF16_Optimizer (runtime/bf16_optimizer.py), which DeepSpeed runs for ZeRO stage 1 with bf16 and data_types.grad_accum_dtype fp32 without optimizer offload (the DeepSpeed reader sets it there): its gradient buffer at training.grad_accum_dtype (float32) is of the whole model on every rank, not partitioned, held the whole step, and all-reduced through a 16-bit copy of it; the 16-bit gradients are kept until after the optimizer step. Without zero: 1 it changes nothing. Default false (stage_1_and_2.py's ZeRO-1).", "type": "boolean"},
                "buckets": {
                    "title": "Communication buckets",
                    "description": "Counted only when declared, in elements (DeepSpeed's reduce_bucket_size, allgather_bucket_size).",
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "reduce": _count("Reduce bucket", "Elements of the gradient reduce bucket."),
                        "allgather": _count("All-gather bucket", "Elements of the parameter all-gather bucket."),
                    },
                },
            },
            "examples": [{"data": 8, "fsdp": "full_shard", "gpus_per_node": 8}, {"data": 2, "tensor": 8, "pipeline": 4, "sequence_parallel": True, "zero": 1}],
        },
        "host": {
            "title": "Host",
            "description": "The host (CPU) side of a node.",
            "type": "object",
            "additionalProperties": False,
            "properties": {"memory": {"$ref": "#/$defs/bytes", "title": "Host memory", "description": "RAM per node: the budget for what the node's GPUs offload."}},
        },
    }


def _transformer_properties() -> dict:
    from memfit.models.families import SUPPORTED

    return {
        "hf_config": {
            "title": "Hugging Face config.json",
            "description": f"Path of a model's config.json, relative to this file; memfit derives the transformer's exact parameters and the activations training keeps. Families (model_type): {', '.join(SUPPORTED)}.",
            "type": "string",
            "minLength": 1,
            "examples": ["models/llama-3-8b.json"],
        },
        "transformer": {
            "title": "Transformer config",
            "description": "The keys of a Hugging Face config.json, inline, read as hf_config reads the file: keys left out take the transformers config class's defaults, and keys the family does not read (_name_or_path, transformers_version, ...) are ignored, as transformers ignores them.",
            "type": "object",
            "additionalProperties": True,
            "properties": _transformer_keys(),
            "examples": [{"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256}],
        },
    }


_JSON_TYPES = {
    "int": ["integer"],
    "float": ["number"],
    "number": ["number"],
    "bool": ["boolean"],
    "str": ["string"],
    "ids": ["integer", "array"],
    "ints": ["array"],
    "strs": ["array"],
    "strs|str": ["array", "string"],
    "dict": ["object"],
}
# keys a config.json may carry besides the config class's fields: legacy spellings transformers
# converts (rope, dtype, labels) and GPT-2's n_ctx
_LEGACY_KEYS = {
    "rope_theta": ("number", "The rotary base (transformers moves it into rope_parameters)."),
    "rope_scaling": ("object", "Rotary scaling (transformers moves it into rope_parameters)."),
    "partial_rotary_factor": ("number", "The share of each head's dims that are rotated."),
    "rotary_pct": ("number", "GPT-NeoX: the share of each head's dims that are rotated."),
    "rotary_emb_base": ("number", "GPT-NeoX: the rotary base."),
    "torch_dtype": ("string", "The checkpoint's dtype; training dtypes come from the memfit config's dtypes."),
    "num_labels": ("integer", "Classes of a classification head."),
    "n_ctx": ("integer", "GPT-2: the context length (n_positions is what sizes the model)."),
    "task_specific_params": ("object", "Generation settings; no effect on memory."),
}


def _transformer_keys() -> dict:
    """Every key of the ten families' config classes (a typo is a schema error, not a silent default)."""
    from memfit.models.families import BASE_FIELDS, FAMILIES, SUPPORTED

    owners: dict = {}
    kinds: dict = {}
    for name, family in FAMILIES.items():
        for key, (_, kind) in {**BASE_FIELDS, **family.fields, **{alias: (None, "int") for alias in family.attribute_map}}.items():
            owners.setdefault(key, []).append(name)
            kinds.setdefault(key, kind)
        if family.head_dim_key and name not in owners.setdefault("head_dim", []):
            owners["head_dim"].append(name)  # read through getattr by the attention even where not a field
            kinds.setdefault("head_dim", "int?")
    out = {
        "model_type": {"title": "Model family", "description": f"One of {', '.join(SUPPORTED)}.", "type": "string", "examples": list(SUPPORTED)},
        "architectures": {
            "title": "Architectures",
            "description": "The model class first; default: the family's causal-LM class (BertForMaskedLM for bert).",
            "type": ["array", "null"],
            "items": {"type": "string", "examples": [name for family in FAMILIES.values() for name in family.architectures]},
        },
    }
    for key in sorted(owners):
        if key in out:
            continue
        kind = kinds[key]
        types = list(_JSON_TYPES[kind.rstrip("?")]) + (["null"] if kind.endswith("?") else [])
        families = "every family" if len(owners[key]) == len(FAMILIES) else ", ".join(owners[key])
        out[key] = {"title": key, "description": f"A config.json key ({families}).", "type": types if len(types) > 1 else types[0]}
    for key, (kind, text) in _LEGACY_KEYS.items():
        out[key] = {"title": key, "description": text, "type": [kind, "null"]}
    return out


def _device_peak() -> dict:
    from memfit.config.presets import PRESETS

    return {
        "preset": {
            "title": "Preset",
            "description": "A GPU from memfit's table: fills device.memory with the memory its driver reports (an explicit device.memory wins). Case, spaces and dashes do not matter.",
            "type": "string",
            "examples": list(PRESETS),
        },
        "overhead": {
            "title": "Runtime overhead",
            "description": "Memory the process holds besides the tensors: auto (the preset's CUDA context, cuBLAS workspaces and the allocator's 512-byte rounding, each line sourced in docs/peak.md), a byte size, or 0.",
            "anyOf": [{"const": "auto"}, {"$ref": "#/$defs/bytes"}],
            "examples": ["auto", "1 GiB", 0],
        },
    }


def _training() -> dict:
    from memfit.models.hf import ATTENTIONS, CHECKPOINTING
    from memfit.ledger.step import IMPLS
    from memfit.recipe.precision import schema_training_properties
    from memfit.ledger import passes, rewrites

    return {
        "title": "Training",
        "description": "The shape of one training step on one device. A config with a training section describes a run: memfit checks the peak of its step (forward, backward, optimizer step) against the budget, not the sum of the categories.",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "micro_batch": {"title": "Micro-batch", "description": "Sequences (samples) per device per step: the batch axis.", "type": "integer", "minimum": 1, "examples": [4]},
            "seq_len": {"title": "Sequence length", "description": "Tokens per sequence (a transformer model).", "type": "integer", "minimum": 1, "examples": [4096]},
            "target_len": {"title": "Target length", "description": "An encoder-decoder model's decoder tokens per sequence (T5: the labels' length); seq_len is then the encoder's tokens. Default: seq_len.", "type": "integer", "minimum": 1, "examples": [128]},
            "attention": {
                "title": "Attention kernel",
                "description": "eager (softmax probabilities kept), sdpa (PyTorch's fused kernel: q, k, v, output, log-sum-exp) or flash (flash-attention).",
                "enum": list(ATTENTIONS),
                "default": "sdpa",
            },
            "checkpointing": {
                "title": "Activation checkpointing",
                "description": "none; full: each layer keeps only its input and is recomputed in the backward (the peak adds one layer's recomputation); selective: the attention core (softmax, its dropout) is recomputed, as Megatron-LM does.",
                "enum": list(CHECKPOINTING),
                "default": "none",
            },
            "images_per_sample": {"title": "Images per sample", "description": "A vision-language model (llava, qwen2_vl, qwen2_5_vl): images in each sequence, each run through the vision tower (llava: at its config's image_size, image_seq_length tokens each; Qwen2-VL/Qwen2.5-VL: at training.image_size as the processor resizes it, grid_h x grid_w / spatial_merge_size^2 tokens each); the image tokens count in seq_len, as transformers' processor expands them. Default 1.", "type": "integer", "minimum": 0, "default": 1},
            "freeze_vision_tower": {"title": "Freeze the vision tower", "description": "A vision-language model (llava, qwen2_vl, qwen2_5_vl): the vision tower's parameters do not train (no gradients, no optimizer state, none of its activations kept); the projector (Qwen2-VL's merger) and the text model train. Default false.", "type": "boolean", "default": False},
            "image_size": {"title": "Image size", "description": "Qwen2-VL / Qwen2.5-VL (dynamic resolution): each image's size in pixels as given to the processor, an integer (a square) or [height, width]; the processor resizes it (smart_resize: sides a multiple of patch_size x spatial_merge_size, the area within image_min_pixels..image_max_pixels). Default: the largest square image_max_pixels allows (the worst case).", "oneOf": [{"type": "integer", "minimum": 1}, {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 2, "maxItems": 2}]},
            "image_min_pixels": {"title": "Image min pixels", "description": "Qwen2-VL / Qwen2.5-VL: the processor's min_pixels (LLaMA-Factory's image_min_pixels): a smaller image is scaled up to it. Default 3136 (56 x 56, Qwen2VLImageProcessor's).", "type": "integer", "minimum": 1, "default": 3136},
            "image_max_pixels": {"title": "Image max pixels", "description": "Qwen2-VL / Qwen2.5-VL: the processor's max_pixels (LLaMA-Factory's image_max_pixels): a larger image is scaled down to it. Default 1003520 (28 x 28 x 1280, Qwen2VLImageProcessor's).", "type": "integer", "minimum": 1, "default": 1003520},
            "rmsnorm_upcast": {"title": "RMSNorm's fp32 upcast", "description": "Whether the model's RMSNorm computes in fp32 (transformers' LlamaRMSNorm and its relatives: x.float(), then cast back; LitGPT from 6178c7cc, 2023-10-24, on): it keeps an fp32 copy of its input and an fp32 1/rms. false: it computes in its input's dtype, as Lit-GPT's lit_gpt/rmsnorm.py did before (8641822: x * torch.rsqrt(torch.mean(x * x, ...) + eps)), keeping the input itself and 1/rms in that dtype. fp32_weight: the upcast carries through the weight's product, as LitGPT's RMSNorm does from 916a84ca (2024-07) on (PyPI 0.5.13: (x_normed * weight.float()).to(dtype)): it keeps the fp32 normalized input where transformers' keeps it cast back, and under a 16-bit model an fp32 copy of its weight. A family whose norm is not that RMSNorm (LayerNorm, Gemma's, OLMo 2's, T5's, Whisper's) ignores it, with a note. Default true.", "anyOf": [{"type": "boolean"}, {"const": "fp32_weight"}], "default": True},
            "mean_saves_input": {"title": "torch.mean keeps its input", "description": "true: the step runs on torch before 2.2, whose torch.mean kept its input for backward (2.1.0's MeanBackward0/1 hold self; 2.2.0's only its element count): each RMSNorm whose input needs a gradient also keeps the squares its mean reduces, fp32 under the upcast (transformers' hidden_states.pow(2).mean(...), LitGPT's torch.mean(x * x, ...) after x.float()) or in the input's dtype with training.rmsnorm_upcast false. A family whose norm is not that RMSNorm ignores it, with a note. Default false.", "type": "boolean", "default": False},
            "softmax_saves_input": {"title": "Softmax keeps its input", "description": "torch before 1.11: softmax and log_softmax kept their input for backward beside their output (derivatives.yaml at v1.10.0: `_softmax_backward_data(grad, result, dim, self)`; pytorch/pytorch#66018 passes only the input's dtype from 1.11 on). true prices an eager attention's scores (the softmax's input, in the dtype they have: see attention_mask_fp32) kept in every layer. The loss's log_softmax input (the logits, or their fp32 copy) is not priced: a language model's loss then keeps one logits-sized tensor more than memfit's figure. Default false (torch 1.11 and later).", "type": "boolean", "default": False},
            "attention_mask_fp32": {"title": "fp32 additive attention mask", "description": "An fp32 additive mask is added to an eager attention's scores (transformers 4.x's get_extended_attention_mask: built in the parameters' dtype, all ones when no mask is given), so under autocast the softmax's input is fp32, and so are the probabilities it keeps (CUDA's autocast runs softmax in fp32 anyway; CPU's in its input's dtype), and so is its input where it keeps it (softmax_saves_input). Default false.", "type": "boolean", "default": False},
            "gradient_accumulation": _count("Gradient accumulation", "Micro-batches per optimizer step (under pipeline parallelism: micro-batches in flight, up to the stages)."),
            "optimizer_impl": {
                "title": "Optimizer implementation",
                "description": "How torch.optim runs the step, which sets its temporaries: foreach (PyTorch's default on GPU; one temporary per parameter at once), fused (none) or for_loop (one parameter at a time).",
                "enum": list(IMPLS),
                "default": "foreach",
            },
            **schema_training_properties(),
            **rewrites.schema_properties(),
            **passes.KEYS,
            "moe": _moe(),
        },
        "examples": [{"micro_batch": 4, "seq_len": 4096, "attention": "sdpa", "checkpointing": "none", "optimizer_impl": "foreach"}],
    }


def _moe() -> dict:
    from memfit.models.hf_activations import ROUTINGS

    return {
        "title": "Mixture of experts",
        "description": "How a mixture of experts' routed tokens are sized (the rows each rank's experts process and keep for backward). The routing is data-dependent; memfit assumes uniform routing unless told.",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "routing": {
                "title": "Routing assumption",
                "description": "uniform: T·k/E rows per expert (T·k in all; transformers' dropless experts keep exactly that whatever the router picks); worst_case: every token of the expert-parallel group sends all its k choices to this rank's experts (parallel.expert · T · k rows).",
                "enum": list(ROUTINGS),
                "default": "uniform",
            },
            "capacity_factor": {
                "title": "Expert capacity factor",
                "description": "Each expert processes ⌈factor · T·k/E⌉ rows, padded or cut (GShard, Switch, Megatron's --moe-expert-capacity-factor with padding): E·⌈factor·T·k/E⌉ routed rows whatever the routing. Unset: dropless, as transformers runs.",
                "type": "number",
                "exclusiveMinimum": 0,
                "examples": [1.25],
            },
        },
        "examples": [{"routing": "uniform"}, {"capacity_factor": 1.25}],
    }


_DIM = {"type": "integer", "minimum": 0, "description": "A dimension's size: a non-negative integer."}


def _tensor_def(kind: str, optional: str, dtype_text: str, trainable: bool = False) -> dict:
    """A declared parameter or activation tensor: a bare shape, or a mapping (the two differ in
    their dtype's meaning and in `trainable`)."""
    properties = {
        "name": {"type": "string", "title": "Name", "description": "A label shown in reports (e.g. 'h.0.attn.c_attn.weight')."},
        "shape": {
            "type": "array",
            "title": "Shape",
            "description": "The tensor's dims; [] is a scalar (one element), a 0 dim gives zero elements.",
            "items": dict(_DIM),
            "examples": [[512, 6400], [768], []],
        },
        "dtype": {"$ref": "#/$defs/dtype", "description": dtype_text},
        "count": {"type": "integer", "minimum": 1, "title": "Count", "description": "How many identical copies (e.g. 12 transformer blocks).", "default": 1},
    }
    if trainable:
        properties["trainable"] = {
            "type": "boolean",
            "title": "Trainable",
            "default": True,
            "description": "false keeps the tensor in parameters but gives it no gradient and no optimizer state (frozen weights, LoRA base).",
        }
    return {
        "title": f"A {kind} tensor",
        "description": f"A bare shape such as [512, 6400], or a mapping with 'shape' and optional {optional}.",
        "type": ["array", "object"],
        "items": dict(_DIM),
        "properties": properties,
        "required": ["shape"],
        "additionalProperties": False,
        "examples": [[512, 6400], {"name": "fc.bias", "shape": [512], "count": 12}],
    }


def _device() -> dict:
    """The device whose memory is the budget."""
    return {
        "title": "Device",
        "description": "The device whose memory is the budget.",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "name": {"title": "Device name", "description": "A label, e.g. 'RTX 4090' or 'A100 80GB'.", "type": "string"},
            "memory": {
                "$ref": "#/$defs/bytes",
                "title": "Memory",
                "description": "Device memory: an integer byte count or '<number> <unit>' such as '24 GiB' or '80GB'. The budget is memory minus reserve.",
            },
            "reserve": {
                "title": "Reserve",
                "description": "Headroom kept free (CUDA context, allocator, fragmentation): bytes, a unit string, or a percentage of memory such as '10%'.",
                "anyOf": [{"$ref": "#/$defs/bytes"}, {"$ref": "#/$defs/percent"}],
                "examples": ["1 GiB", "10%"],
            },
            "warn_at": {
                "$ref": "#/$defs/percent",
                "title": "Warn at",
                "description": "Warn when the total is above this share of the budget (default 90%).",
            },
            **_device_peak(),
            "type": {
                "title": "Device type",
                "description": "The torch device the step runs on, whose autocast decides what *-mixed keeps for backward: cuda (the default: every preset is a CUDA or ROCm card) runs softmax without a stated dtype, pow and layer_norm in float32; cpu keeps them in the low dtype (docs/recipes.md, 'Which autocast').",
                "enum": ["cuda", "cpu"],
                "default": "cuda",
            },
        },
        "examples": [{"name": "RTX 4090", "memory": "24 GiB", "reserve": "1 GiB"}, {"preset": "A100-80GB", "overhead": "auto"}],
    }


def _dtypes() -> dict:
    """Each category's storage dtype."""
    return {
        "title": "dtypes",
        "description": "Storage dtype per category: a dtype name or a positive byte width (a multiple of 1/8). Each defaults to float32.",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "parameters": {"$ref": "#/$defs/dtype", "description": "Storage of the weights (default float32).", "title": "dtype"},
            "gradients": {"$ref": "#/$defs/dtype", "description": "Storage of the gradients (default float32).", "title": "dtype"},
            "activations": {
                "$ref": "#/$defs/dtype",
                "description": "Storage of the activations saved for backward (default float32).",
                "title": "dtype",
            },
            "optimizer_state": {"$ref": "#/$defs/dtype", "description": "Storage of each optimizer state tensor (default float32).", "title": "dtype"},
        },
        "examples": [{"parameters": "bfloat16", "gradients": "float32", "activations": "bfloat16", "optimizer_state": "float32"}],
    }


def _model() -> dict:
    """The model section: a transformer's config.json or a Keras-style layer graph."""
    return {
        "title": "Model",
        "description": "The model memfit derives tensors from, added to any explicit parameters/activations: a transformer from a Hugging Face config.json (hf_config, or its keys inline as transformer), or a Keras-style layer graph (input_shape, layers: each layer takes the previous one's output or the layers its `inputs` name, so residual and multi-branch networks are written as Keras's functional API writes them). One form, not both.",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            **_transformer_properties(),
            "input_shape": {
                "title": "Input shape",
                "description": "One sample's shape, no batch axis, channels last (Keras convention); integer ids' shape when the first layer is an Embedding.",
                "type": "array",
                "minItems": 1,
                "items": {"type": "integer", "minimum": 1, "description": "A dimension's size: a positive integer."},
                "examples": [[80, 80, 4], [128]],
            },
            "batch_size": {
                "title": "Batch size",
                "description": "Samples per training step: the batch axis of every activation (the Keras form; training.micro_batch says the same, and the two must agree).",
                "type": "integer",
                "minimum": 1,
            },
            "input_name": {
                "title": "Input name",
                "description": "The name `inputs` use for the model's input tensor (default 'input_layer', Keras's name for keras.Input).",
                "type": "string",
                "default": "input_layer",
            },
            "layers": {
                "title": "Layers",
                "description": "The layers in order, each applied to the previous one's output, or to the outputs its `inputs` name (earlier layers only).",
                "type": "array",
                "items": {"$ref": "#/$defs/layer"},
            },
        },
        "examples": [
            {
                "input_shape": [80, 80, 4],
                "batch_size": 32,
                "layers": [
                    {"type": "Conv2D", "filters": 32, "kernel_size": 8, "strides": 4, "padding": "same"},
                    {"type": "ReLU"},
                    {"type": "Flatten"},
                    {"type": "Dense", "units": 2},
                ],
            },
        ],
    }


def generate() -> dict:
    """The schema as data (key order is the file's)."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "urn:memfit:schema:config:1",
        "title": "memfit training config",
        "description": "Tensor shapes, dtypes, the optimizer and a device memory budget; memfit computes the training footprint and fails when it exceeds the budget.",
        "type": "object",
        "required": ["memfit", "optimizer"],
        "additionalProperties": False,
        "properties": {
            "memfit": {
                "title": "Format version",
                "description": "The marker that makes this file a memfit config, and the format version (1).",
                "const": 1,
            },
            "name": {"title": "Name", "description": "A name for this config, shown in reports.", "type": "string"},
            "device": _device(),
            "dtypes": _dtypes(),
            "optimizer": _optimizer(),
            "parameters": {
                "title": "Parameters",
                "description": "Parameter tensors; each also has a gradient (if trainable) and optimizer state.",
                "type": "array",
                "items": {"$ref": "#/$defs/parameter"},
            },
            "activations": {
                "title": "Activations",
                "description": "Activation tensors saved for backward, batch axis included.",
                "type": "array",
                "items": {"$ref": "#/$defs/activation"},
            },
            "training": _training(),
            "model": _model(),
            **_parallel_sections(),
            **_recipes(),
        },
        "$defs": {
            "bytes": _bytes(),
            "percent": _percent(),
            "dtype": _dtype(),
            "parameter": _tensor_def(
                "parameter",
                "name, dtype, count, trainable",
                "Storage dtype of this tensor, overriding dtypes.parameters. Its gradient and optimizer state keep dtypes.gradients and dtypes.optimizer_state.",
                trainable=True,
            ),
            "activation": _tensor_def("activation", "name, dtype, count", "Storage dtype of this tensor, overriding dtypes.activations. "),
            "activation_function": _activation_function(),
            "layer_type": _layer_type(),
            **_layer_defs(),
            "layer": _layer(),
        },
        "examples": [{"memfit": 1, "device": {"memory": "24 GiB"}, "optimizer": "adam", "parameters": [[512, 6400]], "activations": [[32, 512]]}],
    }

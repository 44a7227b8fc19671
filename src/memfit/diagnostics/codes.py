"""The diagnostic-code registry: every code memfit reports, with its default severity, a
one-line summary and what to do. Codes are a published contract (users filter on them, SARIF
publishes them as rules, the README lists them); raise sites name them through the constants
below, and what a code means for the pipeline is a property here, never a string comparison."""

from __future__ import annotations

ERROR = "error"
WARNING = "warning"
INFORMATION = "information"
INFO = INFORMATION  # a note: nothing is wrong, something is not checked


class Code:
    """One registry entry. A plain class, not a dataclass: it is built on every cold start."""

    __slots__ = ("ambiguous_keys", "help", "id", "keeps_footprint", "severity", "summary")

    def __init__(self, id: str, severity: str, summary: str, help: str, keeps_footprint: bool = False, ambiguous_keys: bool = False) -> None:
        self.id = id
        self.severity = severity  # the default; a raise site may override it
        self.summary = summary  # one line, no final period
        self.help = help  # what to do about it
        self.keeps_footprint = keeps_footprint  # the footprint is still right when this problem is present
        self.ambiguous_keys = ambiguous_keys  # the document has a key twice: positions cannot stop early

    def __repr__(self) -> str:
        return f"Code({self.id!r}, {self.severity!r})"


def _register(*codes: Code) -> dict[str, Code]:
    return {code.id: code for code in codes}


YAML_SYNTAX = "yaml-syntax"
DUPLICATE_KEY = "duplicate-key"
SCHEMA = "schema"
UNKNOWN_DTYPE = "unknown-dtype"
UNKNOWN_OPTIMIZER = "unknown-optimizer"
UNKNOWN_PRECISION = "unknown-precision"
MASTER_WEIGHTS_NOOP = "master-weights-noop"
NEEDS_TRANSFORMER = "needs-transformer"
BAD_LORA = "bad-lora"
LORA_NO_MATCH = "lora-no-match"
UNKNOWN_QUANTIZATION = "unknown-quantization"
BAD_QUANTIZATION = "bad-quantization"
BAD_UNIT = "bad-unit"
BAD_BUDGET = "bad-budget"
SHAPE_MISMATCH = "shape-mismatch"
DUPLICATE_LAYER = "duplicate-layer"
BAD_LAYER_INPUT = "bad-layer-input"
UNUSED_LAYER = "unused-layer"
UNKNOWN_PRESET = "unknown-preset"
PRESET_OVERRIDDEN = "preset-overridden"
OPTIMIZER_IMPL = "optimizer-impl"
NO_BUDGET = "no-budget"
BUDGET_EXCEEDED = "budget-exceeded"
NEAR_BUDGET = "near-budget"
BAD_PARALLEL = "bad-parallel"
HOST_BUDGET_EXCEEDED = "host-budget-exceeded"
NO_HOST_BUDGET = "no-host-budget"
TOO_LARGE = "too-large"
NOT_A_CONFIG = "not-a-config"
IO = "io"
INTERNAL = "internal"
JSON_SYNTAX = "json-syntax"
UNSUPPORTED_MODEL = "unsupported-model"
BAD_MODEL_CONFIG = "bad-model-config"
CANNOT_VARY = "cannot-vary"
NATIVE_CONFIG = "native-config"
NOT_MODELLED = "not-modelled"
MODEL_NOT_FOUND = "model-not-found"
MISSING_REFERENCE = "missing-reference"
IGNORED_KEY = "ignored-key"
SELECTIVE_NOOP = "selective-noop"
APPROXIMATE_ACTIVATIONS = "approximate-activations"
NO_CONFIGS = "no-configs"
NOT_TRAINING = "not-training"
MODEL_SHADOWED = "model-shadowed"
MEASURED_ACTIVATIONS = "measured-activations"
PAGED_STATE = "paged-state"
GPUS_OVERRIDDEN = "gpus-overridden"

CODES: dict[str, Code] = _register(
    Code(YAML_SYNTAX, ERROR, "The file is not valid YAML", "Fix the YAML syntax at the position shown; memfit reads YAML 1.1 with core tags only."),
    Code(DUPLICATE_KEY, ERROR, "A mapping key appears twice", "Remove one of the duplicated keys: YAML loaders silently keep only the last one.", ambiguous_keys=True),
    Code(SCHEMA, ERROR, "The config does not match the memfit schema", "Compare the node with `memfit schema`; unknown keys usually are typos of a known key."),
    Code(UNKNOWN_DTYPE, ERROR, "A dtype name memfit does not know", "Use a known dtype name such as bfloat16 or float32, or a positive byte width that is a multiple of 1/8."),
    Code(UNKNOWN_OPTIMIZER, ERROR, "An optimizer memfit does not know", "Use a known optimizer name (adam, adamw, sgd, ...): it sets the optimizer state kept per parameter."),
    Code(UNKNOWN_PRECISION, ERROR, "A precision recipe memfit does not know", "Use one of Lightning's names: 32-true, bf16-true, 16-true, bf16-mixed, 16-mixed (or 64-true)."),
    Code(
        MASTER_WEIGHTS_NOOP,
        WARNING,
        "master_weights with weights already that wide",
        "A master copy is kept only for 16-bit weights; drop master_weights or choose a 16-bit precision (16-true, bf16-true).",
        keeps_footprint=True,
    ),
    Code(NEEDS_TRANSFORMER, ERROR, "lora or quantization without a transformer model", "lora and quantization apply to the transformer form of the model (hf_config); declare it, or drop the section."),
    Code(BAD_LORA, ERROR, "A LoRA setting that peft refuses", "Give lora.r a positive integer rank and the targets as module-name suffixes, a regex or 'all-linear'."),
    Code(LORA_NO_MATCH, ERROR, "lora.target_modules match no linear module", "Use names from the model's linear modules (listed in the message), e.g. q_proj, v_proj, or 'all-linear'."),
    Code(UNKNOWN_QUANTIZATION, ERROR, "A quantization method memfit does not know", "Use nf4, fp4 or int8 (bitsandbytes via transformers' BitsAndBytesConfig)."),
    Code(BAD_QUANTIZATION, ERROR, "A quantized base the model cannot run with", "Train this model without `quantization` (LoRA on the 16-bit base), or quantize a model whose layers bitsandbytes can replace."),
    Code(
        BAD_UNIT,
        ERROR,
        "A byte quantity or percentage that cannot be read",
        "Write an integer byte count or '<number> <unit>' with B, kB, MB, GB, TB, KiB, MiB, GiB or TiB, e.g. '24 GiB'.",
        keeps_footprint=True,
    ),
    Code(
        BAD_BUDGET,
        ERROR,
        "The memory budget is zero or negative",
        "Make device.reserve smaller than device.memory (or pass a positive --budget): nothing fits in a budget of zero or less.",
        keeps_footprint=True,
    ),
    Code(
        SHAPE_MISMATCH,
        ERROR,
        "A layer cannot take the shape that reaches it",
        "Fix the layer's arguments (kernel, strides, padding, target_shape) or the layers before it; the message names the incoming shape.",
    ),
    Code(
        DUPLICATE_LAYER,
        ERROR,
        "Two layers of the model have the same name",
        "Rename one of them or drop its `name` to get Keras's automatic one: Keras refuses a model with two layers of one name.",
    ),
    Code(
        BAD_LAYER_INPUT,
        ERROR,
        "A layer's inputs name no earlier layer, or the wrong number of tensors",
        "Name the model's input (input_layer) or layers listed before this one in `inputs` (the message suggests the nearest name); a merge layer takes two or more, any other layer one.",
    ),
    Code(
        UNUSED_LAYER,
        WARNING,
        "A layer's output reaches neither a later layer nor the model's output",
        "Keras's functional Model leaves such a layer out; memfit counts it as written. Name it in a later layer's `inputs`, or drop it.",
        keeps_footprint=True,
    ),
    Code(
        UNKNOWN_PRESET,
        ERROR,
        "A device preset memfit does not know",
        "Use one of the preset names (the message suggests the closest; docs/peak.md lists them all with their sources), or give device.memory.",
        keeps_footprint=True,
    ),
    Code(
        PRESET_OVERRIDDEN,
        INFORMATION,
        "device.memory and device.preset are both given: memory wins",
        "Drop one of them: the preset only fills device.memory (and the overhead for `overhead: auto`).",
        keeps_footprint=True,
    ),
    Code(
        OPTIMIZER_IMPL,
        ERROR,
        "The optimizer implementation cannot be modelled for this optimizer",
        "torch.optim has no fused implementation of some optimizers: choose training.optimizer_impl foreach or for_loop (docs/peak.md has the table).",
        keeps_footprint=True,
    ),
    Code(NO_BUDGET, ERROR, "No memory budget to check against", "Set device.memory (and optionally device.reserve) in the config, or pass --budget."),
    Code(
        BUDGET_EXCEEDED,
        ERROR,
        "The training footprint exceeds the memory budget",
        "Reduce the footprint (batch size, dtypes, optimizer, frozen layers) or raise the budget; `memfit explain` shows the breakdown.",
    ),
    Code(NEAR_BUDGET, WARNING, "The training footprint is close to the memory budget", "The config fits, but with little headroom; `memfit explain` shows where the memory goes."),
    Code(
        BAD_PARALLEL,
        ERROR,
        "A parallel layout that cannot run",
        "Fix the key shown: one engine (zero or fsdp), sequence_parallel only with tensor > 1, tensor dividing the heads, at most one pipeline stage per layer, offload the engine supports.",
    ),
    Code(
        HOST_BUDGET_EXCEEDED,
        ERROR,
        "What the GPUs offload exceeds a node's host memory",
        "Offload less (parameters stay on the GPUs without offload.parameters), use more nodes, or raise host.memory; `memfit explain` shows the host side.",
        keeps_footprint=True,
    ),
    Code(
        NO_HOST_BUDGET,
        INFO,
        "Offloaded memory is not checked against a host budget",
        "Set host.memory (RAM per node) to have the offloaded bytes checked too.",
        keeps_footprint=True,
    ),
    Code(
        TOO_LARGE,
        ERROR,
        "A number too long to work with",
        "memfit reads integers of up to 4,300 digits and reports footprints of up to about 4,200 digits (Python's own limit on printing a number); check the dims, counts and sizes near the position shown.",
    ),
    Code(NOT_A_CONFIG, ERROR, "The file is not a memfit config", "Add a top-level `memfit: 1`, or pass --skip-unrecognized to skip files that are not memfit configs."),
    Code(IO, ERROR, "The file cannot be read", "Check that the path exists and is a readable UTF-8 text file, and that a directory holds *.yaml or *.yml files."),
    Code(INTERNAL, ERROR, "memfit itself failed on this file", "This is a bug in memfit; please report it with the file that triggers it."),
    Code(JSON_SYNTAX, ERROR, "A referenced config.json is not valid JSON", "Fix the JSON at the position shown in that file (a trailing comma or a missing quote, usually)."),
    Code(
        UNSUPPORTED_MODEL,
        ERROR,
        "A model family or architecture memfit does not derive",
        "Use one of the supported model_type values and architectures the message lists, or declare the tensors explicitly.",
    ),
    Code(
        BAD_MODEL_CONFIG,
        ERROR,
        "A model config.json key is missing or has the wrong type",
        "Give the key the type the transformers config class takes (an integer for sizes, true/false for flags); model_type is required.",
    ),
    Code(
        CANNOT_VARY,
        ERROR,
        "memfit fit has nothing to vary in this config",
        "Set the key `--vary` names (training.micro_batch, or model.batch_size in a Keras model; training.seq_len; training.gradient_accumulation), or vary one that changes memory.",
    ),
    Code(
        NATIVE_CONFIG,
        ERROR,
        "A key of a native config (Axolotl, LLaMA-Factory, Trainer, DeepSpeed, accelerate) or of the settings that memfit cannot read",
        "Give the key the type and value its framework takes (the message says which), and resolve conflicting keys such as bf16 and fp16 both true; docs/native.md lists each format's keys.",
    ),
    Code(
        IGNORED_KEY,
        INFORMATION,
        "A key of an inline transformer config that no model family reads, close to one that is read",
        "transformers keeps an unknown config key as an attribute the model never reads, and so does memfit: check the spelling (the message names the key it is close to).",
        keeps_footprint=True,
    ),
    Code(
        SELECTIVE_NOOP,
        INFORMATION,
        "checkpointing: selective with fused attention (sdpa, flash) recomputes nothing",
        "Selective recomputation drops the attention core's s x s matrices, which only eager attention saves: with sdpa or flash it keeps what `none` keeps. Use checkpointing: full to trade compute for memory (the message gives the peak it would have), or none to say what runs.",
        keeps_footprint=True,
    ),
    Code(
        APPROXIMATE_ACTIVATIONS,
        WARNING,
        "A transformers model without a memfit family: exact parameters, activations by the generic rule",
        "memfit[trace] built the model on the meta device for its parameters; its saved activations follow the Llama layer's rule at the model's sizes, within the band the message quotes (docs/transformers.md). Measure a real step when the margin is thinner than that band.",
        keeps_footprint=True,
    ),
    Code(
        NOT_MODELLED,
        WARNING,
        "A native key that changes memory and that memfit does not model",
        "The figures leave this key's effect out (the message says which way it goes); check the run's memory by measuring, or drop the key if it is not needed.",
        keeps_footprint=True,
    ),
    Code(
        MODEL_NOT_FOUND,
        ERROR,
        "The model a native config names cannot be found without the network",
        "Map the name to its config.json in the settings' models table ([tool.memfit.models] in pyproject.toml, or memfit.toml), put the model in the Hugging Face cache, or name a local directory.",
    ),
    Code(
        MISSING_REFERENCE,
        ERROR,
        "A file a native config references (a DeepSpeed JSON, a launch config) cannot be read",
        "Fix the path (it is relative to the config that names it; a launch config from the settings is relative to the settings file), or create the file.",
    ),
    Code(
        NO_CONFIGS,
        ERROR,
        "A directory named on the command line holds no config memfit recognises",
        "Name the configs' directory or files (a memfit config has `memfit: 1`; a native one is recognised by its keys, or named with --input-format), or pass --allow-empty where an empty check may pass.",
    ),
    Code(
        MODEL_SHADOWED,
        WARNING,
        "A local folder shadows the Hugging Face model of the same name",
        "memfit reads the local folder's config.json; the framework loads it only when the run starts where that path exists, and the Hub's model otherwise. Write './org/name' to mean the folder, or map the name in the settings' models table.",
        keeps_footprint=True,
    ),
    Code(
        NOT_TRAINING,
        INFORMATION,
        "A native config that trains nothing (inference, a merge, an evaluation, generation, quantization)",
        "memfit prices training steps: such a config gets no training figure. Check the training config that made the model instead.",
        keeps_footprint=True,
    ),
    Code(
        MEASURED_ACTIVATIONS,
        INFORMATION,
        "A transformers model without a memfit family: exact parameters, activations measured on fake tensors",
        "memfit[trace] built the model and ran one forward and backward on torch's fake tensors (no memory, no weights) at the config's batch, length, precision and checkpointing; what autograd saved is the activations figure (layers past the first few extrapolated per layer, as the message says).",
        keeps_footprint=True,
    ),
    Code(
        PAGED_STATE,
        INFORMATION,
        "A paged optimizer keeps part of its state in CUDA unified memory, outside the device's peak",
        "bitsandbytes' paged optimizers allocate the state of every parameter of 100,000+ elements with cudaMallocManaged: PyTorch's allocator does not count it and the driver pages it to the host when the device is full, so memfit gates the device without it (the footprint counts it). Leave host memory for it; `training.paged_optimizer: false` counts it on the device.",
        keeps_footprint=True,
    ),
    Code(
        GPUS_OVERRIDDEN,
        WARNING,
        "--gpus (or the settings' gpus) is not the world size the config's parallel section states: the config wins",
        "The figures are for the config's own world size, data x tensor x pipeline. Drop parallel.data to let --gpus set it, or pass the config's world size.",
        keeps_footprint=True,
    ),
)


def lookup(code: str) -> Code:
    """The registry entry; a code from elsewhere (a plugin, a newer memfit) gets a neutral one."""
    found = CODES.get(code)
    if found is None:
        return Code(code, ERROR, f"memfit diagnostic {code}", "See memfit's documentation for this diagnostic code.")
    return found

"""Per-rank memory under data, tensor and pipeline parallelism: which bytes each GPU keeps.

Pure functions over a list of `Tensor`s (a name, a shape and bytes per element per category, as
the recipe gives them) and a `Parallel` layout. Nothing here reads a config or imports a framework;
the rules below were read from the frameworks' sources (versions named) and are checked against
runs of those frameworks in tests/placement/test_sharding.py.

How each engine shards a data-parallel group of N ranks:

- DeepSpeed ZeRO 1/2 (deepspeed 0.19 runtime/zero/stage_1_and_2.py): all trainable parameters of a
  rank are flattened into one buffer padded to a multiple of 2*N elements
  (`nccl_start_alignment_factor * world_size`) and cut into N equal partitions; stage 1 partitions
  the optimizer's tensors (fp32 master, fp32 gradient partition, optimizer state), stage 2 also the
  16-bit gradients.
- DeepSpeed ZeRO-3 (partition_parameters.py `_aligned_size`): every parameter is padded on its own to
  a multiple of N and each rank keeps numel/N of it, for every category. The 16-bit parameters of
  the module being computed are all-gathered, and its full 16-bit gradients exist while they are
  reduce-scattered: that pair is the transient.
- PyTorch FSDP2 (torch 2.13 torch/distributed/fsdp/_fully_shard/_fsdp_param.py): every parameter is
  chunked on dim 0 (torch.chunk: ceil(d0/N) rows per rank, the last ranks get fewer or none); the
  sharded parameter's storage and the reduce-scattered gradient are padded to ceil(d0/N) rows on
  every rank, while torch.optim's state is `zeros_like` the unpadded local shard, so rank 0 holds
  the most. A wrapped unit is all-gathered whole (padded) while it computes.

Tensor parallel follows Megatron-LM: column-parallel linears split their output dimension,
row-parallel linears their input dimension (their bias is replicated), the vocabulary-parallel
embedding and output layer split a vocabulary padded to a multiple of 128 * tensor
(`--make-vocab-size-divisible-by 128`), norms are replicated. Pipeline stages take contiguous,
equal runs of layers; the embedding is on the first stage, what follows the last layer on the last.
"""

from __future__ import annotations

# the layout's arithmetic lives in models/ (hf_sharded reads it too); placement's callers keep these names
from memfit.models.layout import in_flight, padded_vocab, stage_layers  # noqa: F401
from memfit.models.hf_sharded import TENSOR_PLANS  # noqa: F401  (parallel.tensor_plan's values, for the schema)
from memfit.recipe.costs import dtype_bytes
from memfit.diagnostics.records import record

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache

ZERO_STAGES = (0, 1, 2, 3)
# torch.distributed.pipelining's ScheduleGPipe (every micro-batch's forward, then every backward) and Schedule1F1B
# (Megatron's default: a stage runs pipeline - stage forwards, then alternates one forward and one backward)
PIPELINE_SCHEDULES = ("1f1b", "gpipe")
FSDP_STRATEGIES = ("full_shard", "shard_grad_op", "hybrid_shard", "no_shard")

# How a category is sharded: "weights" (the working copy), "grads" (the working gradients) or
# "optimizer" (what only the optimizer step reads: master weights, the fp32 gradient partition,
# optimizer state). Categories not listed (activations, buffers) are not data-parallel sharded.
SHARD_CLASS: dict[str, str] = {
    "parameters": "weights",
    "gradients": "grads",
    "grad_accum": "optimizer",
    "master": "optimizer",
    "optimizer_state": "optimizer",
}

# Tensor-parallel role of a parameter, by its (transformers) name: the first matching rule wins.
# "column": the output features are split; "row": the input features (bias replicated);
# "vocab": the vocabulary rows, padded; anything unmatched is replicated.
TP_RULES: tuple[tuple[str, str], ...] = (
    (r"(^|\.)(embed_tokens|wte|word_embeddings|shared|embed_in)\.weight$", "vocab"),
    (r"(^|\.)(lm_head|embed_out|output_layer)\.weight$", "vocab"),
    (r"(^|\.)(pooler|cls\.predictions\.transform)\.", "replicated"),  # BERT's pooler and MLM transform: whole on every rank
    (r"(^|\.)(attention\.output\.dense|output\.dense)\.", "row"),
    (r"(^|\.)(intermediate\.dense)\.", "column"),
    (r"(^|\.)(q_proj|k_proj|v_proj|qkv_proj|query_key_value|c_attn|query|key|value|q|k|v|Wqkv|wq|wk|wv)\.", "column"),
    (r"(^|\.)(gate_proj|up_proj|gate_up_proj|fc1|c_fc|dense_h_to_4h|w1|w3|wi|wi_0|wi_1|lin1|fc_in)\.", "column"),
    (r"(^|\.)(o_proj|out_proj|dense|c_proj|down_proj|fc2|dense_4h_to_h|w2|wo|o|lin2|fc_out)\.", "row"),
)

LAYER_INDEX = re.compile(r"\.(?:layers|layer|h|blocks|block)\.(\d+)\.")


class LayoutError(ValueError):
    """A layout memfit cannot place: `path` is the config key at fault (e.g. "parallel.fsdp")."""

    def __init__(self, path: str, message: str):
        super().__init__(message)
        self.path = path


@dataclass(frozen=True)
class Tensor:
    """One parameter: `widths` maps a category to bytes per element (an int, or a Fraction for
    packed formats). A frozen parameter carries only "parameters". `kind` is models.hf's kind
    ("conv1d" weights are stored transposed). `tp` overrides the role TP_RULES gives the name;
    `unit` the gathering unit (default: FSDP wraps each layer, ZeRO-3 gathers each module)."""

    name: str
    shape: tuple[int, ...]
    widths: dict
    kind: str = "other"
    tp: str | None = None
    unit: str | None = None
    count: int = 1  # identical copies (a declared tensor's `count`), each sharded on its own

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@record(frozen=True)
class Parallel:
    """The `parallel` section: the layout's group sizes and what it shards, offloads and buckets."""

    data: int = 1
    tensor: int = 1
    pipeline: int = 1
    sequence_parallel: bool = False
    zero: int | None = None
    fsdp: str | None = None
    gpus_per_node: int = 8
    offload_optimizer: bool = False
    offload_parameters: bool = False
    reduce_bucket: int | None = None  # elements, as DeepSpeed's reduce_bucket_size
    allgather_bucket: int | None = None  # elements, as DeepSpeed's allgather_bucket_size
    gradient_accumulation: int = 1
    expert: int = 1  # expert-parallel ranks, carved out of the data-parallel ones (Megatron's expert_model_parallel_size)
    schedule: str = "1f1b"  # the pipeline schedule (parallel.schedule): PIPELINE_SCHEDULES
    gradient_as_bucket_view: bool = False  # DDP's gradients are views of its reducer's buckets (PyTorch's default: off)
    zero_shard_size: int | None = None  # ZeRO shards over groups of this many data ranks, replicated across them (MiCS)
    bf16_optimizer: bool = False  # ZeRO-1 runs DeepSpeed's BF16_Optimizer: its fp32 gradient buffer whole (ledger/ranks.py)
    # how a sequence-parallel rank feeds a column-parallel linear (parallel.tensor_plan, models.hf_sharded.TENSOR_PLANS):
    # Megatron's linear saves its input's sequence shard, DTensor's plan saves the all-gathered sequence
    tensor_plan: str = "megatron"
    # which PyTorch FSDP runs the sharding (parallel.fsdp_version): 2, fully_shard (the units, gathers and prefetches
    # modelled here, torch 2.13 _fully_shard), or 1, FullyShardedDataParallel (accelerate's default, Lightning's
    # FSDPStrategy), which differs from it in what memfit counts: its forward holds no all-gather output
    # beside the units (no implicit prefetch), its loss only the root, and its forward's parameters are views autocast
    # does not cache
    fsdp_version: int = 2

    @property
    def world(self) -> int:
        return self.data * self.tensor * self.pipeline

    @property
    def engine(self) -> str:
        if self.fsdp is not None:
            return "fsdp"
        return "zero" if self.zero else "ddp"

    @property
    def whole_grad_buffer(self) -> bool:
        """DeepSpeed runs its BF16_Optimizer (runtime/bf16_optimizer.py; `parallel.bf16_optimizer` under ZeRO stage 1):
        its fp32 gradient buffer (training.grad_accum_dtype) is of the whole model on every rank, not a partition.
        The one decision placement (_adds) and the ledger (ranks._zero_gradients) both read."""
        return self.bf16_optimizer and self.zero == 1

    def rank(self, stage: int = 0, data_rank: int = 0, tensor_rank: int = 0) -> int:
        """Megatron's rank order: tensor fastest, then data, then pipeline."""
        return (stage * self.data + data_rank) * self.tensor + tensor_rank


@record
class RankBytes:
    """What one GPU holds: `device` persistent bytes per category, `transient` the largest
    moment's extra bytes by what they are, `host` the bytes it offloads to its node's memory."""

    rank: int
    stage: int
    data_rank: int
    tensor_rank: int
    device: dict = field(default_factory=dict)
    transient: dict = field(default_factory=dict)
    host: dict = field(default_factory=dict)
    sharded: dict = field(default_factory=dict)  # category -> "sharded" | "replicated" | "offloaded"
    layers: tuple[int, int] = (0, 0)  # [first, last) transformer layers on this stage
    # what is gathered while the loss runs its backward, before any unit's backward has begun: FSDP's root unit
    # (kept unsharded from its forward), no unit's gradients yet; ZeRO-3 nothing
    at_loss: dict = field(default_factory=dict)
    # PyTorch DDP's reducer buckets (plain data parallelism): allocated at construction, live the whole step
    buckets: int = 0
    # FSDP2's units as its backward walks them (ledger.ranks): the root's gathered parameters ("root"), the largest
    # wrapped unit's ("unit") and its gradients' reduce-scatter input ("reduce_scatter"), the all-gather output a
    # unit is gathered into ("all_gather", 0 on a group of one rank, where FSDP2 copies the sharded parameters
    # straight into the unsharded ones and allocates no all-gather output), the root's ("root_all_gather", held from
    # the root's pre-forward through the embeddings to the first layer's copy-out) and whether the backward prefetches
    # the next unit into one ("prefetch": full_shard and hybrid_shard, whose units are resharded after forward)
    fsdp: dict = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.device.values())

    @property
    def peak(self) -> int:
        return self.total + sum(self.transient.values())


@record
class Sharded:
    """A placed layout: its ranks, the most-loaded rank's bytes, each pipeline stage's and the host's per node."""

    layout: Parallel
    ranks: int
    most_loaded: RankBytes
    stages: list  # the most-loaded rank of every pipeline stage
    host_per_node: dict  # category -> bytes on the most-loaded node
    notes: list = field(default_factory=list)


# ---------------------------------------------------------------- validation


def check_layout(p: Parallel, *, heads: int | None = None, kv_heads: int | None = None, layers: int | None = None,
                 experts: int | None = None) -> list:
    """Problems with a layout, as (config path, message, severity) triples: errors make it unplaceable."""
    out = []
    for key in ("data", "tensor", "pipeline", "gpus_per_node", "gradient_accumulation", "expert"):
        value = getattr(p, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            path = "training.gradient_accumulation" if key == "gradient_accumulation" else f"parallel.{key}"
            out.append((path, f"{key} is {value!r}: expected a whole number >= 1", "error"))
    if out:
        return out
    if p.zero is not None and p.fsdp is not None:
        out.append(("parallel.fsdp", "both zero and fsdp are set: DeepSpeed ZeRO and PyTorch FSDP are two engines, choose one", "error"))
    if p.zero is not None and p.zero not in ZERO_STAGES:
        out.append(("parallel.zero", f"zero is {p.zero!r}: DeepSpeed has stages 0, 1, 2 and 3", "error"))
    if p.fsdp is not None and p.fsdp not in FSDP_STRATEGIES:
        out.append(("parallel.fsdp", f"fsdp is {p.fsdp!r}: expected one of {', '.join(FSDP_STRATEGIES)}", "error"))
    if p.sequence_parallel and p.tensor < 2:
        out.append(("parallel.sequence_parallel", "sequence parallelism splits the tensor-parallel group's sequence: it needs tensor > 1", "error"))
    if heads is not None and heads % p.tensor:
        out.append(("parallel.tensor", f"tensor = {p.tensor} does not divide the {heads} attention heads", "error"))
    if kv_heads is not None and kv_heads % p.tensor:
        out.append(("parallel.tensor", f"tensor = {p.tensor} does not divide the {kv_heads} key/value heads", "error"))
    if layers is not None and p.pipeline > layers:
        if layers == 0:
            out.append(("parallel.pipeline", f"pipeline = {p.pipeline} stages but no layers to split: name the layer tensors with their index (model.layers.3.…) or use a transformer model", "error"))
        else:
            out.append(("parallel.pipeline", f"pipeline = {p.pipeline} stages but the model has {layers} layers", "error"))
    if p.zero_shard_size and p.data % p.zero_shard_size:
        out.append(("parallel.zero_shard_size", f"zero_shard_size = {p.zero_shard_size} does not divide data = {p.data}: ZeRO's shard groups (MiCS) split the data-parallel ranks evenly", "error"))
    if p.expert > 1:
        # Megatron: expert-parallel ranks are carved out of the data-parallel ranks (each EP group is EP data ranks
        # that exchange tokens with all-to-all); the routed experts divide evenly among them
        if p.data % p.expert:
            out.append(("parallel.expert", f"expert = {p.expert} does not divide data = {p.data}: expert-parallel ranks are carved out of the data-parallel ones", "error"))
        if experts is not None and experts % p.expert:
            out.append(("parallel.expert", f"expert = {p.expert} does not divide the model's {experts} routed experts", "error"))
        if experts == 0:
            out.append(("parallel.expert", "expert parallelism shards a mixture of experts' routed experts: this model has none", "error"))
    if p.fsdp == "hybrid_shard" and p.world % p.gpus_per_node:
        out.append(("parallel.gpus_per_node", f"hybrid_shard shards within a node: world size {p.world} is not a multiple of gpus_per_node = {p.gpus_per_node}", "error"))
    if p.offload_parameters and p.engine == "zero" and p.zero != 3:
        out.append(("parallel.offload.parameters", f"DeepSpeed offloads parameters only under ZeRO-3 (zero is {p.zero})", "error"))
    if p.offload_parameters and p.engine == "ddp":
        out.append(("parallel.offload.parameters", "parameter offload needs ZeRO-3 or FSDP", "error"))
    if p.offload_optimizer and p.engine == "ddp":
        out.append(("parallel.offload.optimizer", "optimizer offload needs ZeRO (stage >= 1)", "error"))
    if p.offload_optimizer and p.engine == "fsdp" and not p.offload_parameters:
        out.append(("parallel.offload.optimizer", "FSDP's CPUOffload moves parameters, gradients and the optimizer step together: set offload.parameters too", "error"))
    return out


# ---------------------------------------------------------------- tensor parallel


_TP_COMPILED = tuple((re.compile(pattern), role) for pattern, role in TP_RULES)
_INDEX = re.compile(r"\.\d+\.")


@lru_cache(maxsize=65536)
def _role_by_name(generic: str, one_dim: bool) -> str:
    for pattern, role in _TP_COMPILED:
        if pattern.search(generic):
            if role == "row" and one_dim:
                return "replicated"  # a row-parallel linear's bias is added after the all-reduce
            return role
    return "replicated"


def tp_role(t: Tensor) -> str:
    if t.tp is not None:
        return t.tp
    # the rules never look at layer indices: one lookup serves every layer
    return _role_by_name(_INDEX.sub(".#.", t.name), len(t.shape) == 1)


def tp_shard_shape(t: Tensor, tensor: int, tensor_rank: int = 0) -> tuple[int, ...]:
    """The shape of `t` on one tensor-parallel rank (Megatron's equal split; rank 0 when uneven)."""
    if tensor == 1 or not t.shape:
        return t.shape
    role = tp_role(t)
    shape = list(t.shape)
    if role == "vocab":
        shape[0] = padded_vocab(shape[0], tensor) // tensor
        return tuple(shape)
    if role == "replicated":
        return t.shape
    # nn.Linear stores [out, in]; GPT-2's Conv1D stores [in, out]
    out_dim, in_dim = (1, 0) if t.kind == "conv1d" else (0, 1)
    dim = out_dim if role == "column" else in_dim
    if len(shape) == 1:
        dim = 0
    size = shape[dim]
    chunk = -(-size // tensor)
    shape[dim] = max(0, min(chunk, size - tensor_rank * chunk))
    return tuple(shape)


# ---------------------------------------------------------------- pipeline


REPEATED = ".*."  # a layer tensor written once for every layer (models.hf: "model.layers.*.mlp.up_proj.weight", count = layers)


def expand_layers(tensors: list) -> list:
    """A tensor named with a `*` layer index and a count stands for one copy per layer: give each
    copy its index, so that pipeline stages, FSDP units and ZeRO-3 modules see the layers."""
    out = []
    for t in tensors:
        if t.count > 1 and REPEATED in "." + t.name:
            head, tail = ("." + t.name).split(REPEATED, 1)
            # the constructor, not dataclasses.replace: a 70B model has 720 copies and a search places it often
            out.extend(Tensor(f"{head[1:]}.{i}.{tail}" if head else f"{i}.{tail}", t.shape, t.widths, t.kind, t.tp, t.unit, 1) for i in range(t.count))
        else:
            out.append(t)
    return out


def layer_count(names_counts) -> int:
    """Layers a pipeline can split: indices in the names, or the count of a `*` layer tensor."""
    seen, repeated = set(), 0
    for name, count in names_counts:
        if REPEATED in "." + name:
            repeated = max(repeated, count)
        else:
            i = layer_of(name)
            if i is not None:
                seen.add(i)
    return max(len(seen), repeated)


def layer_of(name: str) -> int | None:
    m = LAYER_INDEX.search("." + name)
    return int(m.group(1)) if m else None


def stage_of_tensors(tensors: list, pipeline: int) -> tuple[list, list]:
    """The stage of every tensor, and every stage's layer range. What precedes the first layer
    (embeddings) sits on the first stage, what follows the last (final norm, head) on the last."""
    indices = [layer_of(t.name) for t in tensors]
    known = [i for i in indices if i is not None]
    count = max(known) + 1 if known else 0
    ranges = stage_layers(count, pipeline) if count else [(0, 0)] * pipeline
    by_layer = {}
    for s, (a, b) in enumerate(ranges):
        for i in range(a, b):
            by_layer[i] = s
    stages, seen_layer = [], False
    for i in indices:
        if i is not None:
            seen_layer = True
            stages.append(by_layer[i])
        else:
            stages.append(pipeline - 1 if seen_layer else 0)
    return stages, ranges


# ---------------------------------------------------------------- data-parallel sharding


def _bytes(elements: int, width) -> int:
    return dtype_bytes(elements, width)


def _chunk_rows(d0: int, n: int, r: int) -> tuple[int, int]:
    """torch.chunk on dim 0: (padded rows every rank stores, rows rank r really owns)."""
    chunk = -(-d0 // n)
    return chunk, max(0, min(chunk, d0 - r * chunk))


def _unit_of(t: Tensor, engine: str) -> str:
    return t.unit if t.unit is not None else _unit_by_name(t.name, engine)


@lru_cache(maxsize=65536)
def _unit_by_name(name: str, engine: str) -> str:
    """The gathering unit a parameter's name puts it in: FSDP wraps each layer, ZeRO-3 gathers each module
    (cached: a search places the same 720 layer copies of a 70B model many times)."""
    if engine == "fsdp":
        m = LAYER_INDEX.search("." + name)
        return ("." + name)[1 : m.end() - 1] if m else "<root>"
    return name.rsplit(".", 1)[0] if "." in name else "<root>"


# A routed expert tensor (models.hf: the stacked "mlp.experts.gate_up_proj" / "down_proj", dim 0 the experts): expert
# parallelism keeps num_experts / expert of them on a rank, and ZeRO / FSDP shard those over the expert-data-parallel
# group (data / expert ranks hold the same experts). A shared expert ("shared_expert.") is not routed.
EXPERT_TENSOR = re.compile(r"(^|\.)experts\.")


def is_expert(t: Tensor) -> bool:
    return bool(EXPERT_TENSOR.search(t.name))


def _expert_shape(shape: tuple, p: Parallel) -> tuple:
    return (shape[0] // p.expert, *shape[1:]) if shape else shape


def shard_group(p: Parallel) -> int:
    """Ranks one tensor is sharded over."""
    if p.engine == "fsdp":
        if p.fsdp == "no_shard":
            return 1
        if p.fsdp == "hybrid_shard":
            return max(1, min(p.data, p.gpus_per_node // p.tensor))
        return p.data
    if p.zero and p.zero_shard_size:  # MiCS: each group of zero_shard_size ranks holds one whole copy, sharded
        return max(1, min(p.data, p.zero_shard_size))
    return p.data if p.zero else 1


def _sharded_classes(p: Parallel) -> set:
    if p.engine == "fsdp":
        return set() if p.fsdp == "no_shard" else {"weights", "grads", "optimizer"}
    return {1: {"optimizer"}, 2: {"optimizer", "grads"}, 3: {"optimizer", "grads", "weights"}}.get(p.zero or 0, set())


def _offloaded_classes(p: Parallel) -> set:
    out = set()
    if p.offload_optimizer:
        out |= {"optimizer"}
        if p.engine == "zero" and (p.zero or 0) >= 2:
            out |= {"grads"}  # DeepSpeed copies each reduced gradient partition straight to the CPU
    if p.offload_parameters:
        out |= {"weights"}
        if p.engine == "fsdp":
            out |= {"grads", "optimizer"}
    return out


def _fsdp_widths(t: Tensor) -> dict:
    """FSDP2 keeps one sharded parameter (at the master width when a recipe has one: the 16-bit
    copy exists only all-gathered) and one sharded gradient at that width, which also accumulates
    micro-batches (no separate fp32 buffer)."""
    w = dict(t.widths)
    if "master" in w:
        w["parameters"] = w.pop("master")
        if "gradients" in w:
            w["gradients"] = w["parameters"]
    w.pop("grad_accum", None)
    return w


def _zero3_widths(t: Tensor) -> dict:
    """ZeRO-3 reduce-scatters each module's 16-bit gradients straight into the partition kept at
    the gradient-accumulation dtype (stage3.py `grad_partitions_flat_buffer`): with such a buffer
    the 16-bit gradients exist only for the module being reduced (a transient), not as a shard."""
    w = dict(t.widths)
    if "grad_accum" in w:
        w.pop("gradients", None)
    return w


def rank_bytes(tensors: list, p: Parallel, stage: int = 0, data_rank: int = 0, tensor_rank: int = 0, _stages=None) -> RankBytes:
    """Bytes one GPU holds; defaults describe the first rank of the first stage."""
    stages, ranges = _stages or stage_of_tensors(tensors, p.pipeline)
    engine = p.engine
    n = shard_group(p)
    sharded = _sharded_classes(p) if n > 1 else set()
    offloaded = _offloaded_classes(p)
    out = RankBytes(p.rank(stage, data_rank, tensor_rank), stage, data_rank, tensor_rank, layers=ranges[stage])
    if p.tensor == 1:  # every tensor whole on the rank (tp_shard_shape's first case)
        local = [(t, t.shape) for t, s in zip(tensors, stages) if s == stage]
    else:
        local = [(t, tp_shard_shape(t, p.tensor, tensor_rank)) for t, s in zip(tensors, stages) if s == stage]
    if p.expert > 1:
        local = [(t, _expert_shape(shape, p) if is_expert(t) else shape) for t, shape in local]

    def put(where: dict, category: str, amount: int):
        if amount:
            where[category] = where.get(category, 0) + amount

    flat: dict = {}  # ZeRO 1/2: (category, width, on host, group) -> elements in the flat buffer
    units: dict = {}  # gathering unit -> {"parameters": bytes, "gradients": bytes}
    # ZeRO-3 and FSDP gather each unit to compute it whatever the group's size: DeepSpeed partitions into one
    # partition at world size 1 and gathers from it, FSDP2 copies the sharded parameters into its all-gather
    # output at world size 1 (_fsdp_param_group.py `wait_for_unshard`), and with the parameters offloaded the
    # unit is copied from the host: one GPU holds that unit too, so adding GPUs never adds it
    gathering = (engine == "fsdp" and p.fsdp != "no_shard") or (engine == "zero" and p.zero == 3)
    # what one tensor adds depends on its local shape, count, widths and data-parallel group only: a model's
    # layer copies (expand_layers: the same shape and widths dict under 80 names) are priced once, then added up
    # per kind in the order the kinds first appear (so every dict fills in the order it did tensor by tensor)
    added: dict = {}  # (shape, count, widths, group) -> [what one adds, copies]
    for t, shape in local:
        group = max(1, n // p.expert) if p.expert > 1 and is_expert(t) else n  # an expert's: the expert-data-parallel group
        key = (shape, t.count, id(t.widths), group)
        entry = added.get(key)
        if entry is None:
            entry = added[key] = [_adds(t, shape, p, group, engine, sharded, offloaded, data_rank, gathering), 0]
        entry[1] += 1
        if gathering:
            unit = units.setdefault(_unit_of(t, engine), {"parameters": 0, "gradients": 0})
            unit["parameters"] += entry[0][3][0]
            unit["gradients"] += entry[0][3][1]
    for (puts, flats, statuses, _), copies in added.values():
        for on_host, category, amount in puts:
            put(out.host if on_host else out.device, category, copies * amount)
        for flat_key, elements in flats:
            flat[flat_key] = flat.get(flat_key, 0) + copies * elements
        for category, status in statuses:  # a category is kept one way on a rank, whatever the tensor
            out.sharded[category] = status
    for (category, width, on_host, group), elements in flat.items():
        alignment = 2 * group  # nccl_start_alignment_factor * dp world size (an expert buffer: its own group's)
        partition = -(-elements // alignment) * alignment // group
        put(out.host if on_host else out.device, category, _bytes(partition, width))
    if units:
        out.transient = _gathered(units, p)
        root = units.get("<root>", {}).get("parameters", 0) if engine == "fsdp" else 0
        out.at_loss = {"gathered parameters": root} if root else {}
        if engine == "fsdp":
            out.fsdp = _fsdp_units(units, p, n)
    if p.reduce_bucket:
        gw = max((t.widths["gradients"] for t, _ in local if "gradients" in t.widths), default=0)
        put(out.transient, "reduce bucket", _bytes(p.reduce_bucket, gw))
    if p.allgather_bucket:
        pw = max((t.widths["parameters"] for t, _ in local), default=0)
        put(out.transient, "allgather bucket", _bytes(p.allgather_bucket, pw))
    if engine == "ddp" and p.data > 1 and p.tensor == 1 and p.pipeline == 1 and p.expert == 1:
        # PyTorch DDP (plain data parallelism; Megatron's expert-parallel DDP keeps its gradients in its own buffer): the
        # reducer allocates one flat tensor per bucket at construction, the elements of its
        # parameters that require a gradient in their gradient's dtype (torch/csrc/distributed/c10d/reducer.cpp
        # initialize_buckets: at::empty({offset}, options)), and keeps them; bucket_cap_mb only groups them
        out.buckets = sum(t.count * _bytes(math.prod(shape), t.widths["gradients"]) for t, shape in local if "gradients" in t.widths)
    return out


def _adds(t: Tensor, shape: tuple, p: Parallel, n: int, engine: str, sharded: set, offloaded: set, data_rank: int, gathering: bool) -> tuple:
    """What one tensor adds to a rank (rank_bytes): (puts [(on host, category, bytes)], flat-buffer
    elements [((category, width, on host), elements)], [(category, how it is kept)], (gathered
    parameter bytes, gathered gradient bytes))."""
    numel = math.prod(shape)
    k = t.count
    puts, flats, statuses = [], [], []
    widths = _fsdp_widths(t) if engine == "fsdp" else _zero3_widths(t) if p.zero == 3 else t.widths
    for category, width in widths.items():
        cls = SHARD_CLASS.get(category)
        on_host = cls in offloaded
        # DeepSpeed's BF16_Optimizer (ZeRO-1) keeps its fp32 gradient buffer whole on every rank (ledger/ranks.py)
        if cls not in sharded or (category == "grad_accum" and p.whole_grad_buffer):
            puts.append((on_host, category, k * _bytes(numel, width)))
            statuses.append((category, "offloaded" if on_host else "replicated"))
            continue
        statuses.append((category, "offloaded" if on_host else "sharded"))
        if engine == "fsdp":
            d0 = shape[0] if shape else 1
            rest = numel // d0 if d0 else 0
            padded, own = _chunk_rows(d0, n, data_rank)
            rows = own if cls == "optimizer" else padded  # torch.optim's zeros_like sees the unpadded shard
            puts.append((on_host, category, k * _bytes(rows * rest, width)))
        elif p.zero == 3:
            puts.append((on_host, category, k * _bytes(-(-numel // n), width)))
        else:
            flats.append(((category, width, on_host, n), k * numel))
    gathered = (0, 0)
    if gathering:
        if engine == "fsdp":
            d0 = shape[0] if shape else 1
            size = -(-d0 // n) * n * (numel // d0 if d0 else 0)  # the padded all-gather output
        else:
            size = -(-numel // n) * n
        gathered = (k * _bytes(size, t.widths["parameters"]), k * _bytes(size, t.widths["gradients"]) if "gradients" in t.widths else 0)
    return puts, flats, statuses, gathered


def _gathered(units: dict, p: Parallel) -> dict:
    """The gathered bytes at the busiest moment. ZeRO-3: one module's 16-bit parameters and
    gradients (DeepSpeed's estimator: 4 x largest layer). FSDP2: the root unit stays unsharded
    from its forward to the end of backward (fully_shard's root heuristic) and its gradients are
    reduced last, on top of the largest other unit; under shard_grad_op (reshard_after_forward
    False) every unit's parameters stay gathered between its forward and its backward."""
    if p.engine == "zero":
        u = max(units.values(), key=lambda u: u["parameters"] + u["gradients"])
        out = {"gathered parameters": u["parameters"], "unit gradients": u["gradients"]}
    else:
        root = units.get("<root>", {"parameters": 0, "gradients": 0})
        others = [u for k, u in units.items() if k != "<root>"] or [{"parameters": 0, "gradients": 0}]
        u = max(others, key=lambda u: u["parameters"] + u["gradients"])
        params = sum(v["parameters"] for v in units.values()) if p.fsdp == "shard_grad_op" else root["parameters"] + u["parameters"]
        out = {"gathered parameters": params, "unit gradients": root["gradients"] + u["gradients"]}
    return {k: v for k, v in out.items() if v}


def _fsdp_units(units: dict, p: Parallel, n: int) -> dict:
    """FSDP2's units for the walk of its backward (RankBytes.fsdp), torch 2.13 _fully_shard: the all-gather output
    is one flat buffer of the unit's padded parameters (_fsdp_collectives.py foreach_all_gather), allocated only
    when the group has more than one rank (_fsdp_param_group.py `unshard` returns before any all-gather at world size
    1, and `wait_for_unshard` copies each sharded parameter into its own unsharded storage); the reduce-scatter input
    is a flat buffer of the unit's padded gradients at any group size (foreach_reduce)."""
    root = units.get("<root>", {"parameters": 0, "gradients": 0})
    others = [u for k, u in units.items() if k != "<root>"] or [{"parameters": 0, "gradients": 0}]
    u = max(others, key=lambda u: u["parameters"] + u["gradients"])
    return {"root": root["parameters"], "unit": u["parameters"], "reduce_scatter": u["gradients"],
            "all_gather": u["parameters"] if n > 1 else 0, "root_all_gather": root["parameters"] if n > 1 else 0,
            "prefetch": p.fsdp in ("full_shard", "hybrid_shard")}


def _busiest_node(stages: list, world: int, per_node: int, ranks_per_stage: int) -> dict:
    """The offloaded bytes of the node holding the most (ranks are laid out stage by stage, nodes of
    `per_node` consecutive ranks, the last one short when per_node does not divide the world).

    Closed form (issue 23: a 10^7-rank world must not be walked rank by rank): a node's bytes are the
    sum over the stages it overlaps of (ranks in both) x that stage's per-rank bytes. Nodes that lie
    inside one stage are alike, so only the first and the last node, each node holding a stage's first
    rank and the node after it can be the busiest: O(pipeline) candidates of O(pipeline) each."""
    nodes = -(-world // per_node)
    candidates = {0, nodes - 1}
    for s in range(len(stages)):
        at = (s * ranks_per_stage) // per_node
        candidates.update(n for n in (at, at + 1) if n < nodes)
    best: dict = {}
    for n in sorted(candidates):
        first, end = n * per_node, min(world, (n + 1) * per_node)
        node: dict = {}
        for s in range(first // ranks_per_stage, (end - 1) // ranks_per_stage + 1):
            overlap = min(end, (s + 1) * ranks_per_stage) - max(first, s * ranks_per_stage)
            for category, b in stages[s].host.items():
                node[category] = node.get(category, 0) + overlap * b
        if not best or sum(node.values()) > sum(best.values()):
            best = node
    return best


def shard(tensors: list, p: Parallel, staging: tuple | None = None) -> Sharded:
    """Every stage's most-loaded rank (data rank 0 and tensor rank 0: torch.chunk and Megatron
    give the first ranks the full shares), the most-loaded GPU overall and the host side.
    `staging`: stage_of_tensors(tensors, p.pipeline), when the caller has it already."""
    errors = [m for m in check_layout(p) if m[2] == "error"]
    if errors:
        path, message, _ = errors[0]
        raise LayoutError(path, message)
    staging = staging if staging is not None else stage_of_tensors(tensors, p.pipeline)
    # each stage's tensors, grouped once (issue 23: filtering every tensor per stage was O(stages x tensors),
    # 16 s for 2,048 stages); rank_bytes sees only its stage's tensors, all marked as on it
    by_stage: list[list] = [[] for _ in range(p.pipeline)]
    for t, s in zip(tensors, staging[0]):
        by_stage[s].append(t)
    stages = [rank_bytes(by_stage[s], p, s, _stages=([s] * len(by_stage[s]), staging[1])) for s in range(p.pipeline)]
    most = max(stages, key=lambda r: (r.peak, -r.stage))
    host = {}
    per_node = min(p.gpus_per_node, p.world)
    ranks_per_stage = p.data * p.tensor
    best = _busiest_node(stages, p.world, per_node, ranks_per_stage)
    host = {k: v for k, v in best.items() if v}
    notes = []
    if host:
        notes.append(f"host memory per node: {per_node} ranks x their offloaded shards")
    return Sharded(p, p.world, most, stages, host, notes)


# ---------------------------------------------------------------- activations (Korthikanti et al. 2022)

# How a saved activation of a transformer layer divides under tensor parallelism: "tensor" ones
# live between a column- and a row-parallel linear (split by t), "sequence" ones on the residual
# stream (split by t only under sequence parallelism). "core" marks the attention core that
# selective recomputation drops (softmax, its dropout mask and output).
ACTIVATION_SPLIT: tuple[tuple[str, str], ...] = (
    (r"(softmax|attn_probs|attention_probs|scores|attn_weights|attn_dropout_out|probs_dropout)", "core"),
    (r"(dropout_mask_attn_probs|softmax_dropout_mask)", "core"),
    (r"(^|_)(q|k|v|query|key|value|context|attn_out_in|o_proj_in|act_in|act_out|gelu_in|gelu_out|fc2_in|down_proj_in|up|gate)($|_)", "tensor"),
)


def activation_split(label: str) -> str:
    for pattern, kind in ACTIVATION_SPLIT:
        if re.search(pattern, label):
            return "tensor" if kind == "core" else kind
    return "sequence"


def is_attention_core(label: str) -> bool:
    return any(re.search(pattern, label) for pattern, kind in ACTIVATION_SPLIT if kind == "core")


def activation_bytes_per_rank(kept: list, p: Parallel, *, checkpointing: str = "none", layer_input: int | None = None) -> int:
    """Bytes of one layer's saved activations on one tensor-parallel rank. `kept` is a list of
    (label, bytes) for the whole (unsplit) layer; `layer_input` the bytes of the layer's input,
    the one tensor full recomputation keeps."""
    t = p.tensor
    if checkpointing == "full":
        size = layer_input if layer_input is not None else 0
        return -(-size // t) if p.sequence_parallel else size
    total = 0
    for label, size in kept:
        if checkpointing == "selective" and is_attention_core(label):
            continue
        split = activation_split(label)
        if split == "tensor" or p.sequence_parallel:
            total += -(-size // t)
        else:
            total += size
    return total


def korthikanti_layer(s: int, b: int, h: int, a: int) -> list:
    """The saved tensors of one GPT layer as Korthikanti et al. (2022, section 4.1) count them:
    16-bit activations, 1-byte dropout masks, a 4h MLP, dropout after attention and MLP."""
    sbh = s * b * h
    as2b = a * s * s * b
    return [
        ("ln1_in", 2 * sbh),
        ("qkv_in", 2 * sbh),
        ("q", 2 * sbh),
        ("k", 2 * sbh),
        ("softmax", 2 * as2b),
        ("softmax_dropout_mask", as2b),
        ("attn_dropout_out", 2 * as2b),
        ("v", 2 * sbh),
        ("o_proj_in", 2 * sbh),
        ("attn_residual_dropout_mask", sbh),
        ("ln2_in", 2 * sbh),
        ("fc1_in", 2 * sbh),
        ("gelu_in", 8 * sbh),
        ("fc2_in", 8 * sbh),
        ("mlp_residual_dropout_mask", sbh),
    ]


# ---------------------------------------------------------------- the config's keys

OFFLOAD_DEVICES = ("cpu", "none")


def from_config(data: dict) -> tuple:
    """`parallel`, `training.gradient_accumulation` and `host.memory` of a schema-valid document ->
    (Parallel or None when there is no `parallel` section, host budget in bytes or None, problems);
    problems are (path tuple, message, severity) with severity "error" or "note"."""
    from memfit.diagnostics.units import UnitError, parse_bytes

    problems = []
    host = None
    if isinstance(data.get("host"), dict) and "memory" in data["host"]:
        try:
            host = parse_bytes(data["host"]["memory"])
        except UnitError as error:
            problems.append((("host", "memory"), f"host.memory: {error}", "error"))
    section = data.get("parallel")
    if not isinstance(section, dict):
        return None, host, problems
    offload = section.get("offload") or {}
    buckets = section.get("buckets") or {}
    training = data.get("training") if isinstance(data.get("training"), dict) else {}
    layout = Parallel(
        data=section.get("data", 1),
        tensor=section.get("tensor", 1),
        pipeline=section.get("pipeline", 1),
        sequence_parallel=bool(section.get("sequence_parallel", False)),
        zero=section.get("zero"),
        fsdp=section.get("fsdp"),
        fsdp_version=section.get("fsdp_version", 2),
        gpus_per_node=section.get("gpus_per_node", 8),
        offload_optimizer=offload.get("optimizer", "none") not in (None, "none", False),
        offload_parameters=offload.get("parameters", "none") not in (None, "none", False),
        reduce_bucket=buckets.get("reduce"),
        allgather_bucket=buckets.get("allgather"),
        gradient_accumulation=training.get("gradient_accumulation", 1),
        expert=section.get("expert", 1),
        schedule=section.get("schedule", "1f1b"),
        gradient_as_bucket_view=bool(section.get("gradient_as_bucket_view", False)),
        zero_shard_size=section.get("zero_shard_size"),
        bf16_optimizer=bool(section.get("bf16_optimizer", False)),
        tensor_plan=section.get("tensor_plan", "megatron"),
    )
    if (layout.offload_optimizer or layout.offload_parameters) and host is None:
        at = ("parallel", "offload")
        problems.append((at, "offload without a host budget: set host.memory (per node) to check what the host holds", "note"))
    return layout, host, problems


def problems_for(layout: Parallel, model: dict | None = None) -> list:
    """check_layout with the config paths as tuples and the model's dims when known
    (`model`: heads, kv_heads, layers)."""
    out = []
    for path, message, severity in check_layout(layout, **(model or {})):
        out.append((tuple(path.split(".")), message, severity))
    return out

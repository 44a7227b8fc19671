"""A transformer's saved activations on one rank under tensor, sequence and pipeline parallelism.

models.hf_activations lists what autograd keeps per layer as symbolic rows; here each row is
evaluated with one rank's share of its dims, as Megatron-LM splits them (placement/sharding.py has the
layout and the parameter side; models/layout.py the arithmetic both use). Checked against Korthikanti
et al. 2022, Table 2, in tests/placement/test_sharding.py.
"""

from __future__ import annotations

from memfit.models import hf_activations as A
from memfit.models.families import own_name
from memfit.models.layout import in_flight, padded_vocab, stage_layers

# Symbolic dims (models.hf_activations) a tensor-parallel rank holds 1/t of: heads and the
# intermediate width live between a column- and a row-parallel linear. Sequence parallelism splits
# the sequence of what lies outside that region (the residual stream, norms, dropout masks).
# (DeepSeek-V3: its latent attention's per-head widths qb, kvb, ov; the latents qr, kvr, kva stay whole on every rank)
TP_SPLIT_DIMS = frozenset({"H", "KV", "q", "kv", "qkv", "i", "i2", "qb", "kvb", "ov"})
SP_SPLIT_DIMS = frozenset({"s", "T", "Tl"})
# `parallel.tensor_plan`: how a sequence-parallel rank feeds a column-parallel linear. "megatron" (Megatron-LM's
# ColumnParallelLinear with sequence_parallel: the linear all-gathers its input's sequence shard itself, saves the
# shard and gathers it again in backward, Korthikanti et al.'s 34/t); "dtensor" (torch's DTensor plans, torchtitan's
# and transformers': PrepareModuleInput redistributes the sequence shard to Replicate() before the module, the
# ColwiseParallel linear saves that all-gathered input, the whole sequence)
TENSOR_PLANS = ("megatron", "dtensor")
# the column-parallel linears (placement.sharding.TP_RULES' "column" and "vocab" output layers) by the canonical names
# models.hf_activations gives their rows (the op before a family's own name in parentheses, '/' between linears
# that share one input)
COLUMN_LINEARS = frozenset({"q_proj", "k_proj", "v_proj", "qkv_proj", "gate_proj", "up_proj", "gate_up_proj", "fc_in", "lm_head"})


def gathers_input(label: str) -> bool:
    """Whether a saved tensor is a column-parallel linear's input (or autocast's copy of it): under the DTensor
    plan with sequence parallelism it is the all-gathered sequence."""
    op, _, what = label.partition(": ")
    if not what.startswith("input") or what.startswith("input ("):
        return False
    names = op.split(" (", 1)[0].split("/")
    return all(name.rsplit(".", 1)[-1] in COLUMN_LINEARS for name in names)


def _rank_sizes(sizes: dict, tensor: int, sequence_parallel: bool, micro_batch: int) -> tuple:
    split = dict(sizes)
    for dim in TP_SPLIT_DIMS & set(sizes):   # (a family's own dims: DeepSeek-V3's)
        split[dim] = -(-sizes[dim] // tensor)
    if tensor > 1 and "V" in sizes:  # the logits of a vocabulary-parallel output layer: the padded vocabulary / t
        # (a vision tower's sizes have no vocabulary)
        split["V"] = padded_vocab(sizes["V"], tensor) // tensor
    seq = dict(sizes)
    if sequence_parallel:
        local_s = -(-sizes["s"] // tensor)
        seq.update(s=local_s, T=micro_batch * local_s)
        if "Tl" in sizes:
            seq["Tl"] = -(-sizes["Tl"] // tensor)
    return split, seq


def rank_shape(tensor: int, sequence_parallel: bool, plan: str = "megatron"):
    """`shape(symbols, sizes)` for models.hf_activations.saved: a row's shape on one tensor-parallel rank, Megatron's
    split (a row with a split dim — heads, the intermediate width, the vocabulary — takes the rank's share of each
    of its dims; any other row lives on the residual stream, split by the sequence under sequence parallelism).
    Under the DTensor plan with sequence parallelism (`plan`, TENSOR_PLANS) a column-parallel linear's saved input
    is the whole sequence: the shape then also takes the row's label (`shape.labelled`, models.hf_act_eval)."""
    cache: dict = {}
    gathered = sequence_parallel and plan == "dtensor"

    def shape(symbols: tuple, sizes: dict, label: str = "") -> tuple:
        key = id(sizes)
        tables = cache.get(key)
        if tables is None or tables[0] is not sizes:
            tables = cache[key] = (sizes, *_rank_sizes(sizes, tensor, sequence_parallel, sizes.get("b", 1)))
        _, split, seq = tables
        dims = {x for x in symbols if isinstance(x, str)}
        table = split if dims & (TP_SPLIT_DIMS | {"V"}) or (gathered and gathers_input(label)) else seq
        return tuple(table[x] if isinstance(x, str) else x for x in symbols)

    shape.labelled = gathered
    return shape


def rank_sizes(tensor: int, sequence_parallel: bool = False):
    """The rank's sizes for what a layer holds in flight (its kernels' temporaries, the logits): the split dims'
    shares, the sequence whole (the region between a column- and a row-parallel linear, where they live); `stream`:
    the residual stream's sequence (a sequence-parallel rank's slice)."""
    def sizes_of(sizes: dict) -> dict:
        split, seq = _rank_sizes(sizes, tensor, sequence_parallel, sizes.get("b", 1))
        return {**split, "stream": seq["s"]}

    return sizes_of


def _resolve_per_rank(rows: list, cond: dict, roles: dict, split: dict, seq: dict, gathered: bool = False) -> list:
    """models.hf_activations._resolve, each row evaluated with the rank's share of its dims (`gathered`: the DTensor
    plan under sequence parallelism, a column-parallel linear's input whole, rank_shape)."""
    out, by_what = [], {}
    for r in rows:
        if not cond[r.when]:
            continue
        dtype = roles[r.role]
        if r.alias is not None and by_what.get(r.alias) == dtype:
            continue
        by_what[r.what] = dtype
        dims = {x for x in r.shape if isinstance(x, str)}
        label = f"{r.op}: {r.what}"
        table = split if dims & (TP_SPLIT_DIMS | {"V"}) or (gathered and gathers_input(label)) else seq
        out.append(A.Kept(label, tuple(table[x] if isinstance(x, str) else x for x in r.shape), dtype))
    return out


def layer_saved_per_rank(cfg: dict, *, micro_batch: int, seq_len: int, tensor: int = 1, sequence_parallel: bool = False,
                         attention: str = "sdpa", checkpointing: str = "none", precision: str = "32-true",
                         dtypes: dict | None = None, moe: dict | None = None, plan: str = "megatron") -> list:
    """One transformer layer's saved tensors on one tensor-parallel rank: models.hf_activations'
    rows, each evaluated with the rank's share of its dims (Megatron's split: column-parallel
    outputs and the attention core by heads, the MLP by its intermediate width; under sequence
    parallelism everything else by the sequence). A mixture of experts' routed rows follow `moe`
    (training.moe's routing and capacity factor, parallel.expert), as on one device."""
    A.check(cfg, attention, checkpointing, precision)
    fam = A.FAMILIES[cfg["model_type"]]
    sizes = A.layer_sizes(cfg, micro_batch, seq_len, moe=moe)
    roles = A.role_dtypes(precision, dtypes)
    split, seq = _rank_sizes(sizes, tensor, sequence_parallel, micro_batch)
    if checkpointing == "full":
        b = A._boundary(fam, roles, sizes)
        return [A.Kept(b.label, (seq["b"], seq["s"], seq["h"]), b.dtype)]
    cond = A.layer_conditions(cfg, fam, attention, checkpointing, micro_batch, precision)
    gathered = sequence_parallel and plan == "dtensor"
    return _resolve_per_rank(A.layer_rows(cfg["model_type"], A._act(cfg), A._parallel(cfg)), cond, roles, split, seq, gathered)


def activations_per_stage(cfg: dict, layout, *, micro_batch: int, seq_len: int, attention: str = "sdpa",
                          checkpointing: str = "none", precision: str = "32-true", dtypes: dict | None = None,
                          moe: dict | None = None) -> list:
    """Saved-activation bytes on the most-loaded rank of every pipeline stage (`layout`: placement.sharding.Parallel,
    its tensor, sequence_parallel, tensor_plan, pipeline, gradient_accumulation and schedule): the stage's layers
    (and the embeddings on the first stage, the head and loss on the last), per tensor-parallel
    rank, times the micro-batches 1F1B keeps in flight there; under full checkpointing plus what one
    layer's recomputation keeps beyond them."""
    t, sp, plan = layout.tensor, layout.sequence_parallel, layout.tensor_plan
    fam = A.FAMILIES[cfg["model_type"]]
    sizes = A.layer_sizes(cfg, micro_batch, seq_len, moe=moe)
    roles = A.role_dtypes(precision, dtypes)
    split, seq = _rank_sizes(sizes, t, sp, micro_batch)
    cond = A.layer_conditions(cfg, fam, attention, checkpointing, micro_batch, precision)
    embeddings = A.nbytes(_resolve_per_rank(A._embedding_rows(fam), cond, roles, split, seq))
    if fam.llava or fam.qwen_vl:
        # a vision-language model: what runs before the language model's first layer (its vision tower and
        # projector or merger, the embedding, the image features scattered into it) as the rank's program keeps it
        # (models.hf_activations.saved's embeddings at the rank's shapes: LLaVA's CLIP tower split as the text
        # layers are, Qwen2-VL's tower whole on every rank), on the first stage
        blocks = A.saved(cfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention, checkpointing=checkpointing,
                         precision=precision, dtypes=dtypes, shape=rank_shape(t, sp, plan), moe=moe)
        embeddings = A.nbytes(blocks[0].kept)
    gathered = sp and plan == "dtensor"
    ends = A.nbytes(_resolve_per_rank(A._head_rows(fam), cond, roles, split, seq, gathered) + _resolve_per_rank(A.LOSS_ROWS, cond, roles, split, seq))
    common = dict(micro_batch=micro_batch, seq_len=seq_len, tensor=t, sequence_parallel=sp, attention=attention, precision=precision,
                  dtypes=dtypes, moe=moe, plan=plan)
    layer = A.nbytes(layer_saved_per_rank(cfg, checkpointing=checkpointing, **common))
    recompute = A.nbytes(layer_saved_per_rank(cfg, checkpointing="none" if checkpointing == "full" else checkpointing, **common)) if checkpointing == "full" else 0
    layers = cfg[own_name(cfg["model_type"], "num_hidden_layers")]
    out = []
    for s, (a, b) in enumerate(stage_layers(layers, layout.pipeline)):
        last = s == layout.pipeline - 1
        kept = (b - a) * layer + (embeddings if s == 0 else 0) + (ends if last else 0)
        # the backward recomputes one layer at a time, as on one device (hf_act_saved.peak_saved): beside the
        # boundaries already counted (its own input among them) and, on the last stage, once its micro-batch's head
        # and loss are released; so what it adds is what it keeps beyond those (at tensor 1 one device's figure)
        beyond = max(0, recompute - layer - (ends if last else 0)) if recompute else 0
        out.append(in_flight(s, layout.pipeline, layout.gradient_accumulation, layout.schedule) * kept + beyond)
    return out

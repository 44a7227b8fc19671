"""Each rank's own program under tensor, sequence and pipeline parallelism, walked as one device's.

A tensor-parallel rank runs the model with its shares: every parameter at the shape it holds (Megatron's split,
placement.sharding.tp_shard_shape: column- and row-parallel linears, the vocabulary-parallel embedding and head over
the padded vocabulary), every saved tensor at the rank's share of its dims (models.hf_sharded.rank_shape: heads and
the intermediate width split, the residual stream split by the sequence under sequence parallelism), the logits and
the loss over the rank's slice of the vocabulary. ledger.training.transformer_step builds that program from the
rank's tensors, as it builds one device's.

A pipeline stage runs its slice of that program: the embedding and the first layers on the first stage, the last
layers, the head and the loss on the last; a stage's output is kept until its backward (the schedule holds it to
run the backward), its input's gradient is sent back. The schedule decides how many micro-batches' saved tensors
a stage holds beside the one it runs (`parallel.schedule`, `training.gradient_accumulation` micro-batches): under
1F1B up to pipeline - stage, under GPipe all of them, each at its own moment of the step — the forward of the last
one in flight, the backward of the first (before any gradient exists) and of the second (with every gradient).

`ranks_peak` walks every stage's most-loaded rank (tensor rank 0: Megatron gives the first ranks the full shares)
with step.peak, the same walk as one device, and reports the worst, each stage's in `per_rank`.
Measured against MemTracker on every rank of real gloo runs in tests/ledger/test_ranks.py.
"""

from __future__ import annotations

from dataclasses import replace

from memfit.config.build import make_tensor
from memfit.ledger import training
from memfit.ledger.step import PHASES, Loss, Step, peak
from memfit.models import hf_encdec, hf_sharded
from memfit.placement import sharding

DECLARED = "declared tensors"


def applies(config) -> bool:
    """A transformer under tensor or pipeline parallelism without data-parallel sharding: its ranks' programs are
    walked here (ZeRO, FSDP and expert parallelism keep ledger.step.rank_peak)."""
    p = config.parallel
    model = getattr(config, "model", None)
    return (p is not None and (p.tensor > 1 or p.pipeline > 1) and p.engine == "ddp" and p.expert == 1
            and model is not None and hasattr(model, "cfg") and not hf_encdec.is_stacked(model.cfg))


def rank_config(config, tensor_rank: int = 0):
    """The config with the model's parameters at the shapes one tensor-parallel rank holds, priced by the recipe."""
    p = config.parallel
    if p.tensor == 1:
        return config
    out = []
    for t in config.tensors:
        if t.category == "parameters" and t.path and t.path[0] == "model":
            local = sharding.tp_shard_shape(sharding.Tensor(t.name, tuple(t.shape), {}, count=t.count), p.tensor, tensor_rank)
            if tuple(local) != tuple(t.shape):
                t = make_tensor(t.category, t.path, t.name, list(local), t.count, t.trainable, t.dtype, config)
        out.append(t)
    return replace(config, tensors=tuple(out))


def rank_step(config, data: dict, optimizer, impl: str, tensor_rank: int = 0) -> Step:
    """One tensor-parallel rank's step (every layer): its parameters, saved tensors and transients at its shares."""
    p = config.parallel
    own = [t for t in config.tensors if not t.path or t.path[0] != "model"]
    shape = hf_sharded.rank_shape(p.tensor, p.sequence_parallel) if p.tensor > 1 else None
    sizes = hf_sharded.rank_sizes(p.tensor, p.sequence_parallel) if p.tensor > 1 else None
    step = training.transformer_step(rank_config(config, tensor_rank), optimizer, impl, own, shape=shape, rank_sizes=sizes)
    ga = (data.get("training") or {}).get("gradient_accumulation")
    step.accumulating = isinstance(ga, int) and ga > 1
    if p.tensor > 1:
        # the vocabulary-parallel cross-entropy (torch's loss_parallel, measured in tests/ledger/test_ranks.py): its
        # backward holds three fp32 gradients the size of the rank's logits at once, where transformers' loss on
        # whole logits holds two
        step.loss = Loss(step.loss.forward, (*step.loss.backward, step.loss.backward[-1]))
    return step


def _layer(row) -> int | None:
    parts = row.name.split()
    return int(parts[1]) if len(parts) > 2 and parts[0] == "layer" and parts[1].isdigit() else None


def stage_step(step: Step, stage: int, pipeline: int) -> Step:
    """The rows of one pipeline stage, with their optimizer state; what precedes the first layer on the first
    stage, the head and the loss on the last. A stage's output is kept until its backward (the schedule sends it
    and runs its backward from the gradient it receives)."""
    if pipeline == 1:
        return step
    layers = sorted({i for i in map(_layer, step.rows) if i is not None})
    ranges = sharding.stage_layers(len(layers), pipeline)
    first, last = ranges[stage]
    mine = set(layers[first:last])
    last_stage = stage == pipeline - 1

    def on(row) -> bool:
        i = _layer(row)
        if i is not None:
            return i in mine
        return last_stage if row.name == "head" else stage == 0

    # optimizer state (and what optimizer.step() updates) in row order: a declared row's first, then one per trainable
    # parameter of each model row (training.transformer_step's order)
    model_rows = [r for r in step.rows if r.name != DECLARED]
    n_model = sum(len(r.grads) for r in model_rows)
    declared = len(step.optimizer_state) - n_model
    states = step.optimizer_state[:declared] if stage == 0 else []
    stepped = None
    if step.stepped is not None:
        n_declared = len(step.stepped) - n_model
        stepped = list(step.stepped[:n_declared]) if stage == 0 else []
    at, at_stepped = declared, (len(step.stepped) - n_model) if step.stepped is not None else 0
    rows = []
    for row in step.rows:
        if row.name == DECLARED:
            if stage == 0:
                rows.append(row)
            continue
        n = len(row.grads)
        if on(row):
            rows.append(row)
            states = states + step.optimizer_state[at:at + n]
            if stepped is not None:
                stepped += step.stepped[at_stepped:at_stepped + n]
        at += n
        at_stepped += n
    batch = [t for t in step.batch if any(t in r.kept for r in rows)]
    loss, loss_kept = step.loss, list(step.loss_kept)
    if not last_stage:
        loss, loss_kept = Loss((), ()), []
        tail = rows[-1]
        rows[-1] = replace(tail, kept=[*tail.kept, tail.output])  # the sent output, held until its backward
    elif stage > 0 or pipeline > 1:
        tail = rows[-1]  # the head: its logits are the stage's output, held until the loss's backward has run
        rows[-1] = replace(tail, kept=[*tail.kept, tail.output])
        loss = Loss(tuple(loss.forward[1:]), loss.backward)
        batch = [*batch, step.batch[-1]]  # the labels
    return Step(rows, step.tensors, batch, loss, states, step.optimizer, step.impl, step.overhead, stepped,
                step.accumulating, loss_kept)


def _saved(step: Step) -> int:
    """Bytes one micro-batch leaves saved on the stage at the end of its forward (its batch slices are views of the
    loader's batch: not counted)."""
    ids = {t for r in step.rows for t in r.kept} | set(step.loss_kept)
    return sum(step.tensors[t] for t in ids - set(step.batch))


def _with(result: dict, phase: str, extra: int) -> dict:
    info = result["phases"][phase]
    live = dict(info["live"])
    live["activations"] += extra
    return {"bytes": info["bytes"] + extra, "live": live, "at": info.get("at")}


def stage_peak(step: Step, stage: int, p, granule: int | None = None) -> dict:
    """The worst moment of a stage's rank over the schedule: {"bytes", "phase", "live", "phases"}.

    Beside the micro-batch it runs, a stage holds the saved tensors of the others in flight, the loader's batch
    (every micro-batch's ids or labels) and its receive buffers, one per micro-batch for the whole step
    (torch.distributed.pipelining allocates them once and keeps them): a later stage's inputs, an earlier stage's
    output gradients. The micro-batch it runs has its own input among them; its output gradient is the walk's."""
    m = max(1, p.gradient_accumulation)
    k = sharding.in_flight(stage, p.pipeline, m, p.schedule)
    if p.pipeline == 1:
        return peak(step, granule)
    first, last = stage == 0, stage == p.pipeline - 1
    x = 0 if first else step.tensors[step.rows[0].input]
    y = 0 if last else step.tensors[step.rows[-1].output]
    saved = _saved(step) - x  # one micro-batch's saved tensors; its input is its receive buffer
    loader = (m - 1) * sum(step.tensors[t] for t in step.batch)
    held = {"forward": (m - 1) * x + m * y, "backward": (m - 1) * x + (m - 1) * y, "optimizer_step": m * x + m * y}
    fresh = peak(replace(step, accumulating=False), granule)
    warm = peak(replace(step, accumulating=True), granule) if m > 1 else None

    def at(result, phase, others):
        return _with(result, phase, others * saved + loader + held[phase])

    candidates = {
        "forward": [at(fresh, "forward", k - 1)],
        "backward": [at(fresh, "backward", min(k - 1, m - 1))],
        "optimizer_step": [at(warm or fresh, "optimizer_step", 0)],
    }
    if warm is not None:
        if m > k:
            candidates["forward"].append(at(warm, "forward", k - 1))
        candidates["backward"].append(at(warm, "backward", min(k - 1, m - 2)))
    phases = {phase: max(candidates[phase], key=lambda c: c["bytes"]) for phase in PHASES}
    worst = max(PHASES, key=lambda ph: (phases[ph]["bytes"], -PHASES.index(ph)))
    return {"bytes": phases[worst]["bytes"], "phase": worst, "live": dict(phases[worst]["live"]), "phases": phases}


def ranks_peak(config, data: dict, optimizer, impl: str, granule: int | None = None) -> tuple[dict, Step]:
    """Every pipeline stage's most-loaded rank walked on its own program: the worst, as ledger.step.rank_peak
    reports it ({"bytes", "phase", "live", "gathered", "rank", "ranks"}) with `per_rank`: each stage's rank
    {"rank", "stage", "bytes", "phase", "live"}; and the binding rank's program (explain's rows read it)."""
    p = config.parallel
    whole = rank_step(config, data, optimizer, impl)
    per_rank, programs = [], []
    for stage in range(p.pipeline):
        program = stage_step(whole, stage, p.pipeline)
        result = stage_peak(program, stage, p, granule)
        programs.append(program)
        per_rank.append({"rank": p.rank(stage), "stage": stage, "bytes": result["bytes"], "phase": result["phase"], "live": result["live"]})
    best = max(per_rank, key=lambda r: (r["bytes"], -r["stage"]))
    return ({"bytes": best["bytes"], "phase": best["phase"], "live": dict(best["live"]), "gathered": {}, "rank": best["rank"],
             "ranks": p.world, "per_rank": per_rank}, programs[best["stage"]])

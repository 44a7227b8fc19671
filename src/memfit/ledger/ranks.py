"""Each rank's own program under data, tensor, sequence and pipeline parallelism, walked as one device's.

Under data parallelism alone (DDP, ZeRO 1/2/3, FSDP, with or without offload) every rank runs the one-device program
(ledger.training.build's, the techniques of `training` rewritten into it) and holds beside it, at every instant, its
shares of the parameters, gradients and optimizer state (placement), the unit it gathers and DDP's reducer buckets:
`ranks_peak` with that one program.

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

Under ZeRO or FSDP beside them, every moment holds the parameters, gradients and optimizer state the rank keeps
(placement: its data-parallel shares of its tensor shares) and the unit it gathers.

`ranks_peak` walks every stage's most-loaded rank (tensor rank 0: Megatron gives the first ranks the full shares)
with step.phases, the same walk as one device, instant by instant (`stage_walk`: its moments and row boundaries, with
what the rank holds beside them), and reports the worst, each stage's in `per_rank`. The timeline of the binding
stage is those instants (`stage_trace`, `binding_trace`): its largest is the peak, by construction.
Measured against MemTracker on every rank of real gloo runs in tests/ledger/test_ranks.py.
"""

from __future__ import annotations

from dataclasses import replace

from memfit.config.build import make_tensor
from memfit.ledger import rewrites, training
from memfit.ledger.step import PHASES, Loss, Step, phases, rounded
from memfit.models import hf_encdec, hf_sharded
from memfit.placement import sharding
from memfit.recipe.costs import dtype_bytes, dtype_elements

DECLARED = "declared tensors"


def applies(config) -> bool:
    """A transformer under tensor or pipeline parallelism: its ranks' programs are built here, its shares and its
    stage's slice (expert parallelism keeps ledger.step.rank_peak)."""
    p = config.parallel
    model = getattr(config, "model", None)
    return (p is not None and (p.tensor > 1 or p.pipeline > 1) and p.expert == 1
            and model is not None and hasattr(model, "cfg") and not hf_encdec.is_stacked(model.cfg))


def data_only(config) -> bool:
    """Data parallelism alone (DDP, ZeRO 1/2/3, FSDP, with or without offload): every rank runs the one-device
    program (ledger.training.build's, the techniques applied) and holds its data-parallel shares beside it; its walk
    is that program's, here (ranks_peak with the one program)."""
    p = config.parallel
    return p is not None and p.tensor == 1 and p.pipeline == 1 and p.expert == 1


def walked(config) -> bool:
    """Whether the ranks of a config's layout walk their own programs here (the timeline is then the binding rank's
    program, binding_trace)."""
    return applies(config) or data_only(config)


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
    shape = hf_sharded.rank_shape(p.tensor, p.sequence_parallel, p.tensor_plan) if p.tensor > 1 else None
    sizes = hf_sharded.rank_sizes(p.tensor, p.sequence_parallel) if p.tensor > 1 else None
    step = training.transformer_step(rank_config(config, tensor_rank), optimizer, impl, own, shape=shape, rank_sizes=sizes)
    ga = (data.get("training") or {}).get("gradient_accumulation")
    step.accumulating = isinstance(ga, int) and ga > 1
    if p.tensor > 1:
        # the vocabulary-parallel cross-entropy (torch's loss_parallel, measured in tests/ledger/test_ranks.py): its
        # backward holds three fp32 gradients the size of the rank's logits at once, where transformers' loss on
        # whole logits holds two
        step.loss = replace(step.loss, backward=(*step.loss.backward, step.loss.backward[-1]))
    return rewrites.rewrite(step, config, data.get("training") or {})


def _layer(row) -> int | None:
    parts = row.name.split()
    return int(parts[1]) if len(parts) > 2 and parts[0] == "layer" and parts[1].isdigit() else None


def stage_steps(step: Step, pipeline: int) -> list:
    """Every pipeline stage's slice of the step (one pass over its rows: a 2,048-layer model on 512 stages), with
    its optimizer state; what precedes the first layer on the first stage, the head and the loss on the last. A
    stage's output is kept until its backward (the schedule sends it and runs its backward from the gradient it
    receives); the last stage's output, the logits, until the loss's backward has run."""
    if pipeline == 1:
        return [step]
    indices = [_layer(r) for r in step.rows]
    layers = sorted({i for i in indices if i is not None})
    stage_of_layer = {}
    for s, (a, b) in enumerate(sharding.stage_layers(len(layers), pipeline)):
        for i in layers[a:b]:
            stage_of_layer[i] = s
    # optimizer state (and what optimizer.step() updates) in row order: a declared row's first, then one per trainable
    # parameter of each model row (training.transformer_step's order)
    n_model = sum(len(r.grads) for r in step.rows if r.name != DECLARED)
    declared = len(step.optimizer_state) - n_model
    declared_stepped = len(step.stepped) - n_model if step.stepped is not None else 0
    rows: list = [[] for _ in range(pipeline)]
    states: list = [list(step.optimizer_state[:declared])] + [[] for _ in range(pipeline - 1)]
    stepped = None if step.stepped is None else [list(step.stepped[:declared_stepped])] + [[] for _ in range(pipeline - 1)]
    at, at_stepped = declared, declared_stepped
    for row, i in zip(step.rows, indices):
        if row.name == DECLARED:
            rows[0].append(row)
            continue
        s = stage_of_layer[i] if i is not None else (pipeline - 1 if row.name in ("head", training.FINAL_NORM) else 0)
        n = len(row.grads)
        rows[s].append(row)
        states[s].extend(step.optimizer_state[at:at + n])
        if stepped is not None:
            stepped[s].extend(step.stepped[at_stepped:at_stepped + n])
        at += n
        at_stepped += n
    out = []
    for s in range(pipeline):
        mine = rows[s]
        tail = mine[-1]
        mine[-1] = replace(tail, kept=[*tail.kept, tail.output])  # its output, held until its backward
        # (activation offloading's saved-tensor hooks move what the stage's layers save; its output, which the schedule
        # holds for the backward, stays)
        kept = {t for r in mine for t in r.kept}
        batch = [t for t in step.batch if t in kept]
        if s == pipeline - 1:
            # the loss's first forward term is the logits, which the stage holds as its output (kept above): dropped
            # where it is that output; a rewrite that made it another tensor (training.outputs_dtype's fp32 copy, a
            # chunked loss's converted logits) keeps it, beside the output
            logits = step.tensors.get(tail.output, 0) if tail.output is not None else 0
            forward = step.loss.forward[1:] if step.loss.forward and step.loss.forward[0] == logits else step.loss.forward
            loss, loss_kept = Loss(tuple(forward), step.loss.backward), list(step.loss_kept)
            batch = [*batch, step.batch[-1]]  # the labels
        else:
            loss, loss_kept = Loss((), ()), []
        out.append(Step(mine, step.tensors, batch, loss, states[s], step.optimizer, step.impl, step.overhead,
                        None if stepped is None else stepped[s], step.accumulating, loss_kept, step_in_backward=step.step_in_backward,
                        offloaded={t for t in step.offloaded if t in kept and t != tail.output}, kept_gradients=step.kept_gradients))
    return out


def _saved(step: Step) -> int:
    """Bytes one micro-batch leaves saved on the stage at the end of its forward (its batch slices are views of the
    loader's batch: not counted; what activation offloading moved to the host neither)."""
    ids = {t for r in step.rows for t in r.kept} | set(step.loss_kept)
    return sum(step.tensors[t] for t in ids - set(step.batch) - step.offloaded)


class _Shares:
    """Under data parallelism a moment's parameters, gradients and optimizer state are what the rank keeps of its
    program's (placement: `device`, by footprint category), and it gathers a unit for a moment (`gathered`): the
    optimizer steps the rank's shard (its temporaries in proportion to the state it steps on the GPU); in forward the
    gathered parameters are live, in backward their gradients too, at the loss's backward only what stays gathered
    from forward (`at_loss`: FSDP's root unit; no unit's backward has begun). DDP's reducer buckets (`buckets`), held
    from construction, are a second copy of the gradients, or the gradients themselves when they are views of them
    (gradient_as_bucket_view).

    The gradients: ZeRO-3's partitions are one flat buffer allocated once (stage3.py `grad_partitions_flat_buffer`),
    held the whole step; FSDP's and DDP's gradients grow as the program's do, in proportion. ZeRO-1/2
    (stage_1_and_2.py, `zero` the rank's gradient bytes by kind, _zero_gradients): the whole 16-bit gradients
    ZeRO-1 keeps are the parameters' `.grad`, growing as the program's do; ZeRO-2's 16-bit partition is allocated at
    the first gradient the backward copies into it (`copy_grads_in_partition`: `self.grads_in_partition =
    torch.empty(...)` when None) and freed by the optimizer step (`free_grad_in_param_list`), so it is live from the
    program's first gradient (from the first instant of a later micro-batch of accumulation) to the step; the fp32
    gradient partition exists only in the step (`single_grad_partition = flat_grad_partition.to(fp32)`, set to None
    after `_optimizer_step`; `initialize_optimizer_states` frees the one it makes at construction). ZeRO-1 run by
    DeepSpeed's BF16_Optimizer (`parallel.bf16_optimizer`; runtime/bf16_optimizer.py) holds instead a `buffer`: its
    fp32 gradient buffer of the whole model, not partitioned (`fp32_groups_gradients_flat`, `torch.zeros_like` of the
    padded flat 16-bit parameters at construction, zeroed, never freed), the step's fp32 gradient partition a view of
    it; its reduction needs no reduce bucket (engine.py `buffered_allreduce_fallback` all-reduces the buffer)."""

    __slots__ = ("parameters", "state", "gradients", "all_grads", "all_state", "unit", "root", "persistent", "buckets", "views",
                 "growing", "partition", "step_only", "flat", "buffer", "fsdp")

    def __init__(self, step: Step, p, device: dict, gathered: dict, at_loss: dict | None, buckets: int, zero: dict | None = None,
                 fsdp: dict | None = None) -> None:
        self.parameters, self.state, self.gradients = device["parameters"], device["optimizer_state"], device["gradients"]
        self.all_grads = sum(sum(r.grads) for r in step.rows)
        self.all_state = sum(step.optimizer_state)
        self.buffer = zero["buffer"] if zero is not None else 0
        backward = sum(v for k, v in gathered.items() if not (self.buffer and k == "reduce bucket"))
        self.unit = {"forward": gathered.get("gathered parameters", 0), "backward": backward, "optimizer_step": 0}
        self.root = sum((at_loss or {}).values()) if gathered else 0
        self.persistent = p.engine == "zero" and zero is None
        self.buckets, self.views = buckets, p.gradient_as_bucket_view
        self.growing = self.partition = self.step_only = self.flat = 0
        if zero is not None:
            self.growing, self.partition, self.step_only, self.flat = zero["growing"], zero["partition"], zero["step_only"], zero["flat"]
        self.fsdp = _FsdpUnits(step, p, gathered, fsdp) if fsdp and gathered else None

    def _grads(self, phase: str, gradients: int) -> int:
        """The gradient bytes the rank holds at an instant of its program with these gradients (not the step)."""
        if self.persistent:
            return self.gradients
        if not (self.growing or self.partition or self.step_only):
            return _share(self.gradients, gradients, self.all_grads)
        other = self.gradients - self.growing - self.partition - self.step_only  # a declared tensor's, held throughout
        return other + self.buffer + _share(self.growing, gradients, self.all_grads) + (self.partition if gradients else 0)

    def _stepped(self, transient: int) -> tuple:
        """(gradients, transient) of ZeRO-1/2's optimizer step at an instant whose program has this transient, the
        larger of its two moments (stage_1_and_2.py step): the 16-bit gradients of the other ranks' partitions freed
        (`free_grad_in_param_list(params_not_in_partition)`), the rank's made the fp32 gradient partition
        (`.to(fp32)`); then the 16-bit ones freed, the optimizer steps beside the fp32 partition (its temporaries, in
        proportion to the state it steps). DeepSpeed flattens the rank's 16-bit gradients into a copy first
        (`flatten(self.averaged_gradients[i])`), alive beside both at the conversion (measured:
        tests/placement/test_zero12_gradients.py; DeepSpeed's estimator, which counts model states, leaves it out).

        BF16_Optimizer's (`buffer`): the backward accumulates the 16-bit `.grad` into the fp32 buffer and keeps them
        (`update_hp_grads`; they are freed by the step's `zero_grad`, after the optimizer steps); at the boundary the
        engine all-reduces the buffer through a 16-bit copy of it (`allreduce_bucket`: `tensor.to(
        communication_data_type)`, bf16 under bf16: half the fp32 buffer's bytes), freed before the optimizer steps
        on its partition of the buffer (a view: `grad_partition`, already fp32), with its temporaries."""
        other = self.gradients - self.growing - self.partition - self.step_only
        if self.buffer:
            held = other + self.buffer + self.growing
            allreduced = dtype_bytes(dtype_elements(self.buffer, "float32"), "bfloat16")  # the fp32 buffer's bf16 copy
            return max((held, allreduced), (held, _share(transient, self.state, self.all_state)), key=sum)
        converting = (other + self.flat + self.step_only, self.flat) if self.step_only else (other + self.flat, self.flat)
        stepping = (other + (self.step_only or self.flat), _share(transient, self.state, self.all_state))
        return max(converting, stepping, key=sum)

    def _terms(self, phase: str, at, gradients: int, transient: int, edge=None) -> tuple:
        """(gradients, transient) the rank holds at an instant whose program has these (`edge`: the row boundary the
        instant is at, None inside a row)."""
        if phase == "optimizer_step" and (self.growing or self.partition or self.step_only):
            g, t = self._stepped(transient)
        elif phase == "optimizer_step":
            g = self.gradients
            t = _share(transient, self.state, self.all_state)
        elif self.fsdp is not None and phase != "optimizer_step" and at != "loss":
            g = self._grads(phase, self.fsdp.sharded(phase, at, gradients))
            t = transient + self.fsdp.held(phase, at, gradients, edge)
        else:
            g = self._grads(phase, gradients)
            # at the loss: the root unit only in its backward, and in its forward (the loss's own moments) under FSDP1,
            # whose last layer is resharded and leaves nothing; FSDP2's keeps its all-gather output (a unit's bytes)
            # there, until the next copy-out (_FsdpUnits)
            fsdp1 = self.fsdp is not None and self.fsdp.fsdp1
            t = transient + (self.root if at == "loss" and (phase == "backward" or fsdp1) else self.unit[phase])
        if self.buckets:
            g = max(g, self.buckets) if self.views else g + self.buckets
        return g, t

    def total(self, phase: str, at, live: dict, edge=None) -> int:
        g, t = self._terms(phase, at, live["gradients"], live["transient"], edge)
        return self.parameters + self.state + g + t + live["activations"] + live["overhead"]

    def held(self, phase: str, at, live: dict, edge=None) -> dict:
        g, t = self._terms(phase, at, live["gradients"], live["transient"], edge)
        return {**live, "parameters": self.parameters, "gradients": g, "optimizer_state": self.state, "transient": t}


class _FsdpUnits:
    """What FSDP2 (torch 2.13 _fully_shard) holds beside a rank's program at an instant of its forward and backward,
    by the row the instant is in (`held`), from placement's units (RankBytes.fsdp):

    - the root unit's parameters throughout (fully_shard's root is not resharded after forward), and in forward and
      in a layer's backward the largest wrapped unit's (every layer is a unit); under shard_grad_op every unit's;
    - the all-gather output a unit is gathered into, on a group of more than one rank only (at world size 1
      `unshard` all-gathers nothing and `wait_for_unshard` copies the sharded parameters into the unsharded
      ones): in forward the last unit's, kept until the next unit's copy-out (implicit prefetch,
      `comm_ctx.all_gather_state`; none under FSDP1, parallel.fsdp_version 1), and at a layer's copy-out (its first
      row's pre-forward) the one before it too: `wait_for_unshard` drops `comm_ctx.all_gather_state` but its local
      `prev_all_gather_state` keeps it until it returns, after the copy-out (the root's before the first layer;
      measured: tests/ledger/test_fsdp_cast_cache.py, the forward's peak); in backward the unit before the one
      running, prefetched at its pre-backward (`_backward_prefetch`: the last layer's from the root's, under the head;
      none under the first layer);
    - the unsharded gradients autograd has made and FSDP has not yet reduce-scattered: the head's and the final
      norm's (the root's, reduced last), the running layer's so far; and the reduce-scatter input of the layer
      reduced last (a flat buffer of its padded gradients, at any group size, `foreach_reduce`; one is kept until
      the next unit's post-backward, `reduce_scatter_max_input_buffers` 1). The layers already reduced keep only
      their shards (the rank's `gradients`, on the host under CPU offload)."""

    __slots__ = ("rows", "all_gather", "prefetch", "forward", "accumulating", "_reduce_scatter", "fsdp1", "copy_out",
                 "embedding", "tail")

    def __init__(self, step: Step, p, gathered: dict, fsdp: dict) -> None:
        layers = [_layer(r) for r in step.rows]
        order = list(dict.fromkeys(i for i in layers if i is not None))
        per_layer = {i: 0 for i in order}
        for r, i in zip(step.rows, layers):
            if i is not None:
                per_layer[i] += sum(r.grads)
        whole = gathered.get("gathered parameters", 0) if p.fsdp == "shard_grad_op" else None
        in_layer = whole if whole is not None else fsdp["root"] + fsdp["unit"]
        outside = whole if whole is not None else fsdp["root"]
        self.all_gather, self.prefetch, self.accumulating = fsdp["all_gather"], fsdp["prefetch"], step.accumulating
        # FSDP1 (parallel.fsdp_version 1) all-gathers a unit straight into its flat parameter and prefetches nothing in
        # forward (FullyShardedDataParallel's forward_prefetch off): its forward holds the units gathered, no
        # all-gather output beside them, and its loss the root only (_Shares._terms; tests/ledger/test_fsdp_cast_cache.py)
        self.fsdp1 = p.fsdp_version == 1
        self.forward = gathered.get("gathered parameters", 0) + (0 if self.fsdp1 else self.all_gather)
        # FSDP2's copy-out of a layer (the pre-forward of its first row): the previous unit's all-gather output beside
        # it, the root's before the first layer (none at world size 1, where nothing is all-gathered)
        self.copy_out: dict = {}
        if not self.fsdp1 and self.all_gather:
            for r, i in zip(step.rows, layers):
                if i is not None and i not in self.copy_out:
                    self.copy_out[i] = (r.name, fsdp["root_all_gather"] if not self.copy_out else self.all_gather)
            self.copy_out = dict(self.copy_out.values())
        # FSDP2's forward before the first layer (the embeddings, the root's rows): the root gathered and its own
        # all-gather output, kept until the first layer's copy-out; memfit's forward elsewhere counts the largest
        # unit gathered and its output, which a root more than about twice a layer (a large vocabulary's embeddings
        # and head) exceeds (measured: tests/ledger/test_fsdp_cast_cache.py, the embeddings' moment)
        first = next((n for n, i in enumerate(layers) if i is not None), None)
        root_gather = 0 if self.fsdp1 or whole is not None else fsdp["root"] + fsdp["root_all_gather"]
        self.embedding = {r.name: max(self.forward, root_gather) for r in step.rows[:first]} if first else {}
        # after the last layer (the final norm, the head): that layer resharded by its post-forward, the root
        # gathered, and under FSDP2 the layer's all-gather output, which no later copy-out drops (measured:
        # tests/ledger/test_fsdp_cast_cache.py, the head's moment, FSDP1's and FSDP2's; shard_grad_op keeps every
        # unit gathered)
        last = max((n for n, i in enumerate(layers) if i is not None), default=None)
        tail = fsdp["root"] + (0 if self.fsdp1 else self.all_gather)
        self.tail = {r.name: tail for r in step.rows[last + 1:]} if last is not None and whole is None else {}
        # each row: (parameters gathered, prefetching, the gradients already reduced, a reduce-scatter input held,
        # the gradients made by the rows after it and by it: what a later micro-batch has made by then)
        position = {i: n for n, i in enumerate(order)}
        later = [0] * (len(order) + 1)  # the gradients of the layers after each (reduced before its backward)
        for n in range(len(order) - 1, -1, -1):
            later[n] = later[n + 1] + per_layer[order[n]]
        self.rows: dict = {}
        made, seen = 0, False
        for r, i in reversed(list(zip(step.rows, layers))):
            made += sum(r.grads)
            if i is not None:
                seen = True
                at = position[i]
                info = (in_layer, at > 0, later[at + 1], at + 1 < len(order), made)
            elif seen:  # before the first layer: the embeddings (the root's), every layer reduced
                info = (outside, False, sum(per_layer.values()), bool(order), made)
            else:  # after the last layer: the final norm and the head (the root's)
                info = (outside, bool(order), 0, False, made)
            self.rows.setdefault(r.name, info)
        # FSDP1 reduce-scatters a unit's unsharded flat gradient itself (_runtime_utils.py _reduce_grad: its chunks,
        # padded only where its numel is not divisible by the world size) and drops it with the post-backward: no
        # reduce-scatter input is kept beside the next unit's backward (tests/ledger/test_fsdp_cast_cache.py)
        self._reduce_scatter = 0 if self.fsdp1 else fsdp["reduce_scatter"]
        if not order:  # a program without layer rows (declared tensors, a Keras model): which unit runs when is not
            # known; every instant holds the largest unit gathered beside the root, the next one prefetched, at most
            # the root's and that unit's gradients unreduced and a reduce-scatter input
            cap = gathered.get("unit gradients", 0)
            self.rows = {r.name: (in_layer, True, 0, True, cap) for r in step.rows}
            self.accumulating = True

    def key(self, at, edge=None):
        """What `held` reads of the row an instant is in (the walk's candidates keep one instant per key)."""
        return self.rows.get(at), self.copy_out.get(at, 0) if edge == "pre-forward" else 0

    def sharded(self, phase: str, at, gradients: int) -> int:
        """Of the program's `gradients` at an instant of `phase` in row `at`, those whose shards the rank holds: in
        a backward that accumulates nothing, the units' already reduce-scattered (FSDP2's foreach_reduce and FSDP1's
        _reduce_grad make a unit's sharded gradient from its reduce-scatter output, the optimizer's zero_grad having
        dropped the last step's), not the root's or the running layer's, which `held` counts unsharded (measured:
        tests/ledger/test_fsdp_cast_cache.py, FSDP1's backward peak in a layer's backward)."""
        info = self.rows.get(at)
        if phase != "backward" or self.accumulating or info is None:
            return gradients
        return min(gradients, info[2])

    def held(self, phase: str, at, gradients: int, edge=None) -> int:
        """The bytes held beside the program at an instant of `phase` in row `at` (at its boundary `edge`, None
        inside it) whose program has made `gradients`."""
        if phase == "forward":
            gathered = self.embedding[at] if at in self.embedding else self.tail.get(at, self.forward)
            return gathered + (self.copy_out.get(at, 0) if edge == "pre-forward" else 0)
        info = self.rows.get(at)
        if info is None:
            return self.forward
        params, prefetching, reduced, scattering, made = info
        unreduced = max(0, (made if self.accumulating else gradients) - reduced)
        return (params + (self.all_gather if prefetching and self.prefetch else 0) + unreduced
                + (self._reduce_scatter if scattering else 0))


def _data_shares(step: Step, p, device: dict, gathered: dict, at_loss: dict | None = None, buckets: int = 0,
                 zero: dict | None = None, fsdp: dict | None = None) -> _Shares | None:
    """The rank's data-parallel holdings beside its program (_Shares); None where it holds nothing beside it (plain
    DDP of one rank, tensor or pipeline ranks without ZeRO or FSDP: the program as one device runs it)."""
    if p.engine == "ddp" and not buckets and not gathered:
        return None
    return _Shares(step, p, device, gathered, at_loss, buckets, zero, fsdp)


def _zero_gradients(p, rank) -> dict | None:
    """Under ZeRO-1/2 the rank's gradient bytes by when they live (_Shares): `growing` (ZeRO-1's whole 16-bit
    gradients), `partition` (ZeRO-2's 16-bit partition), `step_only` (the fp32 gradient partition), `buffer`
    (BF16_Optimizer's whole fp32 gradient buffer, in place of the partition); None otherwise."""
    if p.engine != "zero" or p.zero not in (1, 2):
        return None
    sixteen = rank.device.get("gradients", 0)
    # ZeRO-1's gradients are the parameters' whole .grad; ZeRO-2 copies them into its partition buffer, a group of one
    # rank included (stage_1_and_2.py runs the same step at any world size)
    replicated = p.zero == 1
    # the rank's 16-bit partition of them (ZeRO-1: its share of the whole gradients, flattened in the step)
    flat = -(-sixteen // sharding.shard_group(p)) if replicated else sixteen
    accum = rank.device.get("grad_accum", 0)
    if p.whole_grad_buffer and accum:
        # BF16_Optimizer's fp32 buffer is whole on every rank: placement keeps it so by the same decision
        # (Parallel.whole_grad_buffer; sharding._adds), so the device's grad_accum is the whole buffer; no flattened
        # copy. Without a buffer on the device (no training.grad_accum_dtype, or the optimizer offloaded, which
        # DeepSpeed runs as stage_1_and_2.py): ZeRO-1's gradients below
        return {"growing": sixteen, "partition": 0, "step_only": accum, "flat": 0, "buffer": accum}
    return {"growing": sixteen if replicated else 0, "partition": 0 if replicated else sixteen, "step_only": accum, "flat": flat, "buffer": 0}


def _share(amount: int, part: int, whole: int) -> int:
    """amount x part / whole, rounded up (a share is never under-counted)."""
    return -(-amount * part // whole) if whole else 0


def _instants(step: Step, granule: int | None) -> dict:
    """A program's walk, instant by instant: step.phases' trace with its row boundaries, {phase: [(phase, at, edge,
    live)]}, each phase's allocator rounding added to the overhead of its every instant (as step.peak adds it to
    the phase's worst moment: its largest instant is peak's phase figure)."""
    trace: list = []
    exact = phases(step, trace, edges=True)
    rounding = {}
    if granule:
        coarse = phases(rounded(step, granule))
        rounding = {ph: coarse[ph]["bytes"] - exact[ph]["bytes"] for ph in PHASES}
    out: dict = {ph: [] for ph in PHASES}
    for phase, at, live, edge in trace:
        if rounding.get(phase):
            live = dict(live)
            live["overhead"] += rounding[phase]
        out[phase].append((phase, at, edge, live))
    return out


def _hold(phase: str, at, live: dict, extra: int, shares, edge=None) -> dict:
    """An instant of the program's walk as the stage's rank holds it: `extra` saved bytes beside the micro-batch it
    runs (the others in flight, the loader's batch, the receive buffers) and, under data parallelism, its shares,
    the unit it gathers and DDP's buckets (`shares`, _data_shares)."""
    live = {**live, "activations": live["activations"] + extra}
    return shares.held(phase, at, live, edge) if shares is not None else live


def _held(instants: list, extra: int, shares) -> list:
    """A phase's instants as the stage's rank holds them (_hold)."""
    return [(phase, at, edge, _hold(phase, at, live, extra, shares, edge)) for phase, at, edge, live in instants]


def _candidates(instants: list, persistent: bool, fsdp=None) -> list:
    """The instants that can be a rank's worst: a rank's total grows with an instant's activations and, its shares
    put in, depends on nothing else but its phase, gradients (not when the rank holds its gradients the whole step),
    transient, overhead, whether it is the loss's backward and, under FSDP, what its row holds beside it
    (_FsdpUnits.key); of instants alike in those, the one with the most
    activations (a moment before a row boundary, the earliest on a tie) is the only candidate (a step of thousands of
    instants has a few hundred)."""
    best: dict = {}
    for n, (phase, at, edge, live) in enumerate(instants):
        key = (phase, None if persistent else live["gradients"], live["transient"], live["overhead"], phase == "backward" and at == "loss",
               None if fsdp is None else fsdp.key(at, edge))
        rank = (live["activations"], edge is None)
        if key not in best or rank > best[key][0]:
            best[key] = (rank, n)
    return [instants[n] for n in sorted(n for _, n in best.values())]


def _worst(instants: list, extra: int, shares, cache: dict | None = None) -> dict:
    """A phase's worst instant as the rank holds it (_held's, without building them all) {"bytes", "live", "at"}: a
    moment before a row boundary as large (the boundary is between two moments), the earliest on a tie. `cache`:
    the instants' candidates (_candidates), kept."""
    if shares is not None:
        key = ("candidates", id(instants), shares.persistent, shares.fsdp is not None)
        if cache is None:
            instants = _candidates(instants, shares.persistent, shares.fsdp)
        else:
            if key not in cache:
                cache[key] = (instants, _candidates(instants, shares.persistent, shares.fsdp))
            instants = cache[key][1]
    best = None
    for phase, at, edge, live in instants:
        # (without shares only the activations change, by `extra`: the total, without a copy of the instant)
        total = sum(live.values()) + extra if shares is None else shares.total(phase, at, live, edge) + extra
        if best is None or (total, edge is None) > (best[0], best[1]):
            best = (total, edge is None, phase, at, live, edge)
    total, _, phase, at, live, edge = best
    return {"bytes": total, "live": _hold(phase, at, live, extra, shares, edge), "at": at}


def holding(placement, i: int) -> dict:
    """What rank i of a placement holds beside its program (stage_walk's `holding`): its bytes by category
    (`device`), the unit it gathers (`gathered`), what stays gathered at the loss's backward (`at_loss`), DDP's
    reducer buckets (`buckets`) and, under ZeRO-1/2, its gradient bytes by when they live (`zero`)."""
    rank = placement.sharded.stages[i]
    return {"device": placement.devices[i], "gathered": placement.transients[i], "at_loss": rank.at_loss, "buckets": rank.buckets,
            "zero": _zero_gradients(placement.layout.parallel, rank), "fsdp": rank.fsdp}


def _cached_instants(step: Step, granule: int | None, cache: dict | None) -> dict:
    """_instants, kept in `cache` (a search over data-parallel sizes walks the same program for each)."""
    if cache is None:
        return _instants(step, granule)
    key = (id(step.rows), step.accumulating, granule)
    if key not in cache:
        cache[key] = (step.rows, _instants(step, granule))  # the rows too: their id stays theirs while kept
    return cache[key][1]


def stage_walk(step: Step, stage: int, p, granule: int | None = None, holding: dict | None = None, cache: dict | None = None) -> dict:
    """A stage's rank over the schedule, phase by phase: {phase: (instants, extra, shares, worst)}: the instants
    (phase, at, edge, live) of the walk of the program it runs then (step.phases' trace, row boundaries included),
    and what the rank holds beside them (_held: `extra` saved bytes, its data-parallel `shares` from `holding`);
    `worst` the phase's worst instant so held (_worst). `cache`: the program's walks, kept (_cached_instants).

    Beside the micro-batch it runs, a stage holds the saved tensors of the others in flight, the loader's batch
    (every micro-batch's ids or labels) and its receive buffers, one per micro-batch for the whole step
    (torch.distributed.pipelining allocates them once and keeps them): a later stage's inputs, an earlier stage's
    output gradients. The micro-batch it runs has its own input among them; its output gradient is the walk's.
    Each phase is the worst of the moments the schedule runs it: the forward of the last micro-batch in flight
    (before any gradient exists, or with every gradient when more micro-batches follow), the backward of the first
    (before any gradient) and of the second (with every gradient), the optimizer step after the last. A program
    whose gradients are kept between steps (training.keep_gradients, `Step.kept_gradients`) has every gradient from its
    first instant, its first micro-batch's too."""
    m = max(1, p.gradient_accumulation)
    k = sharding.in_flight(stage, p.pipeline, m, p.schedule)
    shares = None
    if holding is not None:
        shares = _data_shares(step, p, holding["device"], holding["gathered"] or {}, holding.get("at_loss"), holding.get("buckets", 0),
                              holding.get("zero"), holding.get("fsdp"))
    if p.pipeline == 1:  # one micro-batch at a time, as one device runs it (the program as built: under
        # accumulation a later micro-batch's, every gradient allocated), with the rank's data-parallel shares
        walked = _cached_instants(step, granule, cache)
        return {ph: (walked[ph], 0, shares, _worst(walked[ph], 0, shares, cache)) for ph in PHASES}
    first, last = stage == 0, stage == p.pipeline - 1
    x = 0 if first else step.tensors[step.rows[0].input]
    y = 0 if last else step.tensors[step.rows[-1].output]
    saved = _saved(step) - x  # one micro-batch's saved tensors; its input is its receive buffer
    # (one device loads each micro-batch in turn; a pipeline's schedule is handed the whole batch)
    loader = (m - 1) * sum(step.tensors[t] for t in step.batch) if p.pipeline > 1 else 0
    held = {"forward": (m - 1) * x + m * y, "backward": (m - 1) * x + (m - 1) * y, "optimizer_step": m * x + m * y}
    # the first micro-batch of a step has no gradient yet (under accumulation the program is built `accumulating`:
    # its later micro-batches'), unless the gradients are kept between steps: then every gradient is allocated from
    # the step's first instant, on every stage; one micro-batch is the program as built
    fresh = _cached_instants(step if m == 1 or step.kept_gradients else replace(step, accumulating=False), granule, cache)
    warm = _cached_instants(replace(step, accumulating=True), granule, cache) if m > 1 else None

    def at(walked, phase, others):
        extra = others * saved + loader + held[phase]
        return walked[phase], extra, shares, _worst(walked[phase], extra, shares, cache)

    candidates = {
        "forward": [at(fresh, "forward", k - 1)],
        "backward": [at(fresh, "backward", min(k - 1, m - 1))],
        "optimizer_step": [at(warm or fresh, "optimizer_step", 0)],
    }
    if warm is not None:
        if m > k:
            candidates["forward"].append(at(warm, "forward", k - 1))
        candidates["backward"].append(at(warm, "backward", min(k - 1, m - 2)))
    return {phase: max(candidates[phase], key=lambda c: c[3]["bytes"]) for phase in PHASES}


def stage_trace(step: Step, stage: int, p, granule: int | None = None, holding: dict | None = None) -> list:
    """The stage's rank's program, instant by instant, as stage_peak walks it: [(phase, at, edge, live)], each
    phase's from the program that phase runs (stage_walk). Its largest instant is stage_peak's bytes."""
    walked = stage_walk(step, stage, p, granule, holding)
    return [instant for phase in PHASES for instant in _held(*walked[phase][:3])]


def stage_peak(step: Step, stage: int, p, granule: int | None = None, holding: dict | None = None, cache: dict | None = None) -> dict:
    """The worst instant of a stage's rank over the schedule (stage_walk): {"bytes", "phase", "live", "at", "phases"}."""
    walked = stage_walk(step, stage, p, granule, holding, cache)
    phases_ = {phase: walked[phase][3] for phase in PHASES}
    worst = max(PHASES, key=lambda ph: (phases_[ph]["bytes"], -PHASES.index(ph)))
    return {"bytes": phases_[worst]["bytes"], "phase": worst, "live": dict(phases_[worst]["live"]), "at": phases_[worst]["at"], "phases": phases_}


def binding_trace(config) -> list:
    """The binding stage's rank's program, instant by instant (stage_trace), for a config whose ranks were walked
    here (`config.step` is that stage's program, placement.binding that stage)."""
    placement, i = config.placement, config.placement.binding
    return stage_trace(config.step, i, config.parallel, config.granule, holding(placement, i))


def _signature(step: Step) -> tuple:
    """What a stage's walk depends on, but the tensors' identities: its rows' bytes and its optimizer state."""
    size = step.tensors
    rows = tuple((r.name.rsplit(" ", 1)[-1], tuple(r.params), tuple(r.grads), tuple(r.frozen),
                  tuple(size[t] for t in r.kept), size.get(r.input, 0), size.get(r.output, 0), r.view, r.inner, r.inner_kept,
                  r.output_grad, r.grad_input, r.backward_extra, r.recompute, r.forward_flight, r.backward_flight,
                  r.flight_freed, r.recompute_moment, r.flight_first, r.after_flight, r.early_flight, r.forward_early,
                  tuple(r.grads_born), tuple(r.grads_taken))
                 for r in step.rows)
    return (rows, tuple(step.optimizer_state), None if step.stepped is None else tuple(step.stepped),
            tuple(size[t] for t in step.batch), step.loss.forward, step.loss.backward, tuple(size[t] for t in step.loss_kept))


def programs(config, data: dict, optimizer, impl: str) -> list:
    """Every pipeline stage's most-loaded rank's program (a function of the model, the run, tensor, sequence
    parallelism and pipeline: a search over data-parallel sizes builds it once)."""
    return stage_steps(rank_step(config, data, optimizer, impl), config.parallel.pipeline)


def ranks_peak(config, programs: list, granule: int | None = None, cache: dict | None = None) -> tuple[dict, Step]:
    """Every pipeline stage's most-loaded rank walked on its own program (`programs`; one under data parallelism
    alone, ledger.training.build's): the worst, as ledger.step.rank_peak reports it ({"bytes", "phase", "live",
    "gathered", "rank", "ranks"}) with `per_rank`: each stage's rank {"rank", "stage", "bytes", "phase", "live"}; and
    the binding rank's program (explain's rows). `cache`: the programs' walks, kept (a search over data sizes)."""
    p = config.parallel
    per_rank, where = [], []
    walked: dict = {}  # stages whose programs and holdings are alike (a pipeline's middle stages) walk once
    m = max(1, p.gradient_accumulation)
    for stage, program in enumerate(programs):
        held = holding(config.placement, stage)
        result = None
        if len(programs) > 1:
            key = (stage == 0, stage == p.pipeline - 1, sharding.in_flight(stage, p.pipeline, m, p.schedule),
                   tuple(sorted(held["device"].items())), tuple(sorted(held["gathered"].items())),
                   tuple(sorted(held["at_loss"].items())), held["buckets"], tuple(sorted((held["zero"] or {}).items())),
                   tuple(sorted((held["fsdp"] or {}).items())),
                   _signature(program))
            result = walked.get(key)
        if result is None:
            result = stage_peak(program, stage, p, granule, held, cache)
            if len(programs) > 1:
                walked[key] = result
        per_rank.append({"rank": p.rank(stage), "stage": stage, "bytes": result["bytes"], "phase": result["phase"], "live": result["live"]})
        where.append(result["at"])
    best = max(per_rank, key=lambda r: (r["bytes"], -r["stage"]))
    # what the binding rank gathers at that moment (ZeRO-3, FSDP): a unit's parameters in forward, its gradients too
    # in backward (at the loss's backward only what stays from forward), nothing in the optimizer step
    s = best["stage"]
    units, phase = config.placement.transients[s], best["phase"]
    if phase == "backward" and where[s] == "loss":
        gathered = dict(config.placement.sharded.stages[s].at_loss) if units else {}
    else:
        gathered = {k: v for k, v in units.items() if phase == "backward" or (phase == "forward" and k == "gathered parameters")}
    return ({"bytes": best["bytes"], "phase": phase, "live": dict(best["live"]), "gathered": gathered, "rank": best["rank"],
             "ranks": p.world, "per_rank": per_rank}, programs[s])

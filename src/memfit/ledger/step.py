"""The peak of one training step: forward, backward and the optimizer step as phases.

`footprint` adds four categories at full size; a device runs out of memory at its worst moment
instead, when some of them are not all there (the gradients grow while the saved activations
are freed) and buffers in none of them are (the gradient flowing between layers, the logits'
gradient, the optimizer's temporaries). This module walks a step the way PyTorch's eager
autograd runs it and reports the largest moment:

- forward, at each row: the parameters and the optimizer state (already allocated: a warm
  step), the input batch and labels, every tensor kept for backward so far, the row's input
  and output (and an intermediate such as a pre-activation), then the loss;
- backward, from the loss to the first row: the loss's gradients, then at each row the
  gradient of its output and the one it produces for its input, the gradients of the
  parameters accumulated so far (of rows after it and its own), and the tensors kept for
  backward by this row or an earlier one (a tensor is freed when the earliest row that keeps
  it has run its backward);
- the optimizer step: parameters, all gradients, the optimizer state and the temporaries of
  the chosen implementation (`foreach`, `fused`, `for_loop`, as torch.optim allocates them:
  OPTIMIZER_TEMPORARIES below, measured per optimizer in tests/ledger/test_peak.py).

Gradients are None between steps (`zero_grad(set_to_none=True)`, PyTorch's default). The
reference is torch.distributed._tools.mem_tracker.MemTracker around a real step on the CPU
(tests/support/peak_reference.py); docs/peak.md says what was measured.

Everything here is pure: rows in, exact integer bytes out. ledger/training.py builds the rows of a
config (the Keras-form layer stack, a transformer, declared tensors), every byte priced by the recipe.
"""

from __future__ import annotations

from dataclasses import field, replace
from itertools import accumulate

PHASES = ("forward", "backward", "optimizer_step")
LIVE = ("parameters", "gradients", "activations", "optimizer_state", "transient", "overhead")
IMPLS = ("foreach", "fused", "for_loop")

from memfit.diagnostics.records import record  # noqa: E402
from memfit.recipe.optim import TEMPORARIES as OPTIMIZER_TEMPORARIES  # noqa: E402  (the optimizer table's data)


class PeakError(ValueError):
    """The run cannot be modelled as asked (e.g. an implementation torch.optim does not have)."""


def optimizer_temporaries(optimizer: str, impl: str, params: list[int]) -> int:
    """Bytes of the optimizer step's temporaries; `params` = bytes of each trainable parameter in order.
    optimizer None: one torch.optim does not have (its temporaries are not modelled: none)."""
    if optimizer is None and impl in IMPLS:
        return 0
    table = OPTIMIZER_TEMPORARIES.get(optimizer)
    if table is None:
        raise PeakError(f"the temporaries of {optimizer!r} are not modelled (torch.optim has no {optimizer!r}); known: {', '.join(sorted(OPTIMIZER_TEMPORARIES))}")
    if impl not in IMPLS:
        raise PeakError(f"unknown optimizer_impl {impl!r}; one of {', '.join(IMPLS)}")
    rule = table[impl]
    if rule is None:
        have = [i for i in IMPLS if table[i] is not None]
        raise PeakError(f"torch.optim has no {impl} implementation of {optimizer}: use {' or '.join(have)}")
    if impl == "foreach":
        return rule * sum(params)
    if impl == "fused":
        return 0
    return max((a * p + b * (params[i - 1] if i else 0) for i, p in enumerate(params) for a, b in rule), default=0)


# --- the step's structure -----------------------------------------------------------------
@record(slots=True, compiled_init=True)
class Row:
    """One unit of the forward pass (a layer, or a transformer block), in forward order.

    Tensors are integer ids into Step.tensors (bytes). `kept` are the ids this row keeps for
    backward; a tensor kept by several rows is freed when the earliest of them has run its
    backward. `inner` is an intermediate of the row's own forward (a pre-activation) that
    lives only while the row runs and whose gradient exists during its backward."""

    name: str
    grads: list = field(default_factory=list)  # bytes of each trainable parameter's gradient, in order
    params: list = field(default_factory=list)  # bytes of each trainable parameter, in order
    frozen: list = field(default_factory=list)  # bytes of each parameter or buffer without a gradient
    input: int | None = None  # id of the tensor it reads
    output: int | None = None  # id of the tensor it produces
    view: bool = False  # the output is a view of the input (no new storage, no new gradient)
    kept: list = field(default_factory=list)
    inner: int = 0  # bytes of an intermediate inside the row (forward) and of its gradient (backward)
    inner_kept: bool = False  # the intermediate is kept for backward (then it is among the kept, not a transient)
    output_grad: bool = True  # its output needs a gradient (False: nothing before it is trained, no backward runs)
    grad_input: bool = True  # produces a gradient for its input (False for the first row: the batch needs none)
    backward_extra: int = 0  # bytes of further gradient buffers alive during its backward (e.g. a padded input's)
    recompute: int = 0  # bytes a checkpointed row recomputes at the start of its backward (alive until it is done)
    forward_flight: int | None = None  # the row's own worst transient in forward, when known better than input/output/inner
    # a forward moment before its output exists, its kept tensors made (a mixture of experts' unsort): the bytes in
    # flight beyond them
    forward_early: int | None = None
    backward_flight: int | None = None  # the gradients in flight at its worst backward moment, when known better
    flight_freed: int = 0  # bytes of its kept (or recomputed) tensors already freed by that moment (T5's p @ v inputs
    # at its softmax's backward)
    # a checkpointed row's worst moment while it is recomputed: (the bytes recomputed by then, what is in flight
    # beyond them: a LoRA linear's base output, adapter output and scaled copy before they are summed, and the
    # gradients that reached the layer's output besides its own); the recomputation runs when backward reaches
    # the last row of its layer, with that layer's output gradient waiting
    recompute_moment: tuple | None = None
    flight_first: bool = False  # that worst moment comes before its parameters' gradients are made (a MoE layer's
    # unsort backward, ahead of the experts' weight gradients)
    # the op that saves each of `kept` (parallel to it; empty: one op): one autograd node unpacks what its op saved
    kept_ops: list = field(default_factory=list)
    # a flight_first row's moment after its flight, its first linear's backward (backward_extra beside): (the bytes
    # of its gradients made by then, what its flight has changed by, negative where gradients were freed, the bytes
    # of its kept tensors freed by then)
    after_flight: tuple | None = None
    early_flight: int | None = None  # a second worst backward moment, before its parameters' gradients are made
    # (torch's math kernel's softmax backward, ahead of query_key_value's weight gradient)
    # a weight two rows use (a head tied to the input embedding): autograd sums its gradient's parts in the engine's
    # input buffer and hands the sum to AccumulateGrad only after the earlier row's backward (torch/csrc/autograd/
    # input_buffer.cpp). `grad_started`: the bytes of the part this row's backward makes (the head's); `grad_completed`
    # on the row whose backward adds the last part (the embeddings'). Where a .grad exists already
    # (Step.grad_buffered) the buffer is a tensor of its own between the two
    grad_started: int = 0
    grad_completed: int = 0
    # gradients its backward makes for tensors an earlier row's backward takes (T5's decoder under full checkpointing:
    # its shared position bias's, the cross-attention zero bias's, the encoder output's, models/hf_act_t5
    # t5_held_gradients): the bytes of each, alive from the end of its backward until the end of the backward of the
    # row whose `grads_taken` lists them (accumulated into by the rows between, in place)
    grads_born: list = field(default_factory=list)
    grads_taken: list = field(default_factory=list)
    # bytes of the low-dtype casts of its trained weights that autocast's cache holds beyond what the row keeps: from
    # its forward until the autocast context exits at the forward's end (aten/src/ATen/autocast_mode.cpp `cached_cast`
    # caches the cast of a leaf fp32 tensor that requires grad; `torch.autocast.__exit__` clears the cache when the
    # outermost context exits). A checkpointed row's: its matmuls' saved copies are dropped, the cache's stay. The
    # backward runs outside autocast; torch.utils.checkpoint's recomputation re-enters it and its exit clears what it
    # cached, which the recomputed matmuls save anyway (in `recompute`)
    cast_cached: int = 0


@record(slots=True)
class Loss:
    """The loss on the last row's output (the logits), as transients: in forward the copies the loss
    makes while the logits are alive (fp32 upcast, log-softmax); in backward the gradients from the
    loss back to the logits."""

    forward: tuple  # bytes of each tensor
    backward: tuple
    # the default loss's terms of `forward` by name (ledger/training._loss: the logits it reads, then these): the bytes
    # of its own fp32 copy of the logits (0: it computes on them as they are), and what the model's forward holds
    # unsaved through it; a rewrite of that loss on other logits (ledger/techniques/outputs_dtype.py) reads them here
    upcast: int = 0
    held: tuple = ()


@record(slots=True)
class Step:
    """One training step's program: its rows in forward order, the bytes of each tensor id, the batch, the loss
    and the optimizer's state and step."""

    rows: list
    tensors: dict  # id -> bytes
    batch: list  # ids the training loop holds for the whole step: the input batch, the labels
    loss: Loss
    optimizer_state: list  # bytes of each state tensor (allocated by an earlier step)
    optimizer: str  # its name in OPTIMIZER_TEMPORARIES
    impl: str  # foreach | fused | for_loop
    overhead: int = 0  # fixed runtime overhead (presets.overhead_lines or a given size)
    stepped: list | None = None  # bytes of each tensor optimizer.step() updates, when not the trainable parameters (an fp32 master copy)
    accumulating: bool = False  # gradient accumulation: a later micro-batch runs with every gradient already allocated
    # ids of what the loss keeps for its own backward (a transformer's log-softmax): made after the last row's
    # forward, freed by the loss's backward, before the last row's
    loss_kept: list = field(default_factory=list)
    # each parameter is stepped by an optimizer of its own as soon as its gradient is made, which that step then
    # frees (torchtune's optimizer_in_bwd: register_post_accumulate_grad_hook): gradients never accumulate over
    # rows, one parameter's gradient and its step's temporaries exist at a time, and optimizer.step() after the
    # backward has nothing left to do
    step_in_backward: bool = False
    # ids of kept tensors that live on the host between forward and backward (saved-tensor hooks that copy them
    # out): on the device only while a row keeping one runs its forward, and again while it runs its backward (a
    # checkpointed layer's: from its recomputation through its first row); never among the saved activations
    offloaded: set = field(default_factory=set)
    # the gradients are kept between steps (training.keep_gradients: zero_grad(set_to_none=False)): every micro-batch
    # of the step, its first too, runs with every gradient allocated (`accumulating` from its first instant)
    kept_gradients: bool = False
    # bytes the training loop still holds from the previous micro-batch while this one's forward runs, freed when the
    # forward returns (training.previous_outputs_held: LitGPT's `logits = model(...)` rebinds them only then)
    forward_held: int = 0
    # bytes of this micro-batch's outputs the loop holds from the loss on, through the backward and the optimizer step
    # (the same key: the logits stay bound until the next forward returns)
    outputs_held: int = 0
    # bytes a technique's rewrite adds to the saved activations the footprint counts (negative: takes from them): the
    # footprint is priced from the model's tensors before any rewrite; a technique that changes what the step keeps
    # for backward says here by how much, where it rewrites the program (ledger/techniques/chunked_loss.py), and
    # check adds it to each device's `activations` (placement.Placement.with_saved)
    saved_rewritten: int = 0
    # a shared weight's gradient parts are summed in a buffer apart from its .grad, which exists already (the
    # gradients kept between steps, or a later micro-batch's under accumulation: ledger/techniques/keep_gradients.py):
    # the buffer is live from the row that starts it (Row.grad_started) through the row that completes it
    grad_buffered: bool = False
    # tensors the forward hands a checkpointed layer as keyword arguments (eager attention's float masks): held unsaved
    # by its recomputation's closure from the forward until the backward of the lowest layer taking each: (bytes,
    # index of that layer's first row) each (models/held.checkpoint_kwargs)
    kwargs_held: tuple = ()


def _kwargs_alive(step: Step, i: int) -> int:
    """The bytes of Step.kwargs_held alive while row i runs its backward (each until its lowest layer's first row)."""
    return sum(size for size, first in step.kwargs_held if first <= i)


def _up(n: int, granule: int) -> int:
    return -(-n // granule) * granule


# What rounded() rounds up to the granule, field by field: bytes (an int; a list's or tuple's items; a dict's values;
# None stays None); every other field is carried as it is (dataclasses.replace). Each field of Row, Loss and Step is
# named in one of the two, so that a field added to them is placed on purpose (tests/ledger/test_step.py)
ROUNDED = {
    "Row": ("grads", "params", "frozen", "inner", "backward_extra", "recompute", "flight_freed", "recompute_moment",
            "grad_started", "grad_completed", "cast_cached", "grads_born", "grads_taken"),
    "Loss": ("forward", "backward", "upcast", "held"),
    "Step": ("tensors", "optimizer_state", "stepped", "forward_held", "outputs_held"),
}
CARRIED = {
    "Row": ("name", "input", "output", "view", "kept", "inner_kept", "output_grad", "grad_input", "forward_flight",
            "forward_early", "backward_flight", "flight_first", "kept_ops", "early_flight",
            "after_flight"),  # (but its first term, the bytes of the gradients made by then: rounded() rounds it)
    "Loss": (),
    "Step": ("rows", "batch", "loss", "optimizer", "impl", "overhead", "accumulating", "loss_kept", "step_in_backward",
             "offloaded", "kept_gradients", "saved_rewritten", "grad_buffered", "kwargs_held"),  # (rows and loss: each rounded)
}


def _up_all(value, granule: int):
    if value is None:
        return None
    if isinstance(value, int):
        return _up(value, granule)
    if isinstance(value, dict):
        return {k: _up(v, granule) for k, v in value.items()}
    return type(value)([_up(v, granule) for v in value])


def _round_fields(record, granule: int, **changed):
    """`record` with ROUNDED's fields of its class rounded up to the granule, `changed` as given, the rest as it is."""
    out = {f: _up_all(getattr(record, f), granule) for f in ROUNDED[type(record).__name__]}
    return replace(record, **out, **changed)


def rounded(step: Step, granule: int) -> Step:
    """The same step with every tensor rounded up to the allocator's granule (ROUNDED's fields)."""
    rows = [_round_fields(r, granule, after_flight=None if r.after_flight is None
                          else (_up(r.after_flight[0], granule), *r.after_flight[1:])) for r in step.rows]
    return _round_fields(step, granule, rows=rows, loss=_round_fields(step.loss, granule))


def _adjacent_ops(row: Row, off: set, size: dict) -> int:
    """The most bytes of offloaded tensors two adjacent ops of a row saved (kept_ops' order, forward order)."""
    ops: list = []
    for t, op in zip(row.kept, row.kept_ops):
        nbytes = size[t] if t in off else 0
        if ops and ops[-1][0] == op:
            ops[-1][1] += nbytes
        else:
            ops.append([op, nbytes])
    return max((ops[n][1] + (ops[n + 1][1] if n + 1 < len(ops) else 0) for n in range(len(ops))), default=0)


def _live(parameters, gradients, activations, optimizer_state, transient, overhead) -> dict:
    return dict(zip(LIVE, (parameters, gradients, activations, optimizer_state, transient, overhead)))


def _keepers(rows: list) -> dict:
    """Each kept id -> the earliest row keeping it (its backward frees it)."""
    keepers: dict[int, int] = {}
    for i, row in enumerate(rows):
        for t in row.kept:
            keepers.setdefault(t, i)
    return keepers


def _released(keepers: dict, batch: set) -> dict:
    """Row -> the kept tensors its backward frees: those it is the earliest keeper of (the batch stays)."""
    out: dict[int, list] = {}
    for t, k in keepers.items():
        if t not in batch:
            out.setdefault(k, []).append(t)
    return out


def _layer_start(rows: list, i: int) -> int:
    """The first row of the checkpointed layer whose last row is i (its rows recompute; a row keeping a tensor, the
    layer's input, opens it)."""
    first = i
    while first > 0 and rows[first - 1].recompute and not rows[first].kept:
        first -= 1
    return first


def _offload_windows(step: Step) -> tuple[list, list]:
    """Bytes of offloaded tensors on the device while each row runs forward (its own) and backward: in backward a
    node brings back what its op saved, and the node before it (the op after it in forward) still holds its own, so
    the most two adjacent ops of the row hold (the whole row where its ops are not known); a checkpointed layer's
    rows hold the whole layer's, brought back for its recomputation."""
    rows, size, off = step.rows, step.tensors, step.offloaded
    if not off:
        zeros = [0] * len(rows)
        return zeros, zeros
    own = [sum(size[t] for t in set(row.kept) if t in off) for row in rows]
    back = [_adjacent_ops(row, off, size) if row.kept_ops else own[i] for i, row in enumerate(rows)]
    i = len(rows) - 1
    while i >= 0:
        first = _layer_start(rows, i) if rows[i].recompute else i
        if rows[i].recompute:
            span = sum(own[first:i + 1])
            for j in range(first, i + 1):
                back[j] = span
        i = first - 1
    return own, back


def _stepped_in_backward(step: Step, row: Row, stepped: list, offset: int) -> Row:
    """A row whose parameters are each stepped as soon as its gradient is made (Step.step_in_backward), as its
    worst parameter: its gradient, then its own optimizer step's temporaries beside it (`offset`: the row's first
    parameter in `stepped`)."""
    own = [(g, optimizer_temporaries(step.optimizer, step.impl, [stepped[offset + n]]) if offset + n < len(stepped) else 0)
           for n, g in enumerate(row.grads)]
    grad, extra = max(own, key=sum, default=(0, 0))
    return replace(row, grads=[grad], backward_extra=row.backward_extra + extra,
                   backward_flight=None if row.backward_flight is None else row.backward_flight + extra)


def _flight_moments(row: Row, done: int, alive: int):
    """A row's backward moments at its flight: (the gradients made by then, the activations, the bytes in flight). Its
    flight, before its parameters' gradients where it comes first (flight_first); then, where known, its first linear's
    backward (after_flight: one weight gradient made, what the flight's op saved freed)."""
    yield (done if row.flight_first else done + sum(row.grads)), alive - row.flight_freed, row.backward_flight
    if row.flight_first and row.after_flight is not None:
        made_by, change, freed = row.after_flight
        yield (done + made_by, max(alive - row.flight_freed - freed, 0),
               max(row.backward_flight + change, 0) + row.backward_extra)


def phases(step: Step, trace: list | None = None, edges: bool = False) -> dict[str, dict]:
    """Each phase's worst moment: {"forward"|"backward"|"optimizer_step": {"bytes", "live", "at"}}.
    `trace` (a list) receives every moment considered, in order: (phase, at, live, edge), edge None; and, between
    them, each row's boundaries as the walk passes them, with the walk's own live bytes there: its pre-forward (the
    tensors kept so far, its input), in backward its pre-backward (the gradients made so far, what is still kept,
    its output's gradient) and post-backward (its own gradients too, what it was the last to need freed, the
    gradient it made for its input), when `edges` (the timeline's): an instant between two moments, never above."""
    rows, size, overhead = step.rows, step.tensors, step.overhead
    edges = edges and trace is not None
    params = sum(sum(r.params) + sum(r.frozen) for r in rows)
    state = sum(step.optimizer_state)
    stepped = step.stepped if step.stepped is not None else [b for r in rows for b in r.params]
    temporaries = optimizer_temporaries(step.optimizer, step.impl, stepped)
    all_grads = sum(sum(r.grads) for r in rows)
    # under gradient accumulation the worst micro-batch is a later one: every gradient exists already
    held = all_grads if step.accumulating else 0
    in_backward = step.step_in_backward and not step.accumulating
    keepers = _keepers(rows)
    batch = set(step.batch)
    out: dict[str, dict] = {}
    # a batch tensor no row keeps (the labels of a Keras-form stack) is held by the training loop for the whole step
    # but saved by nobody: counted with the step's transients, so the saved activations stay the footprint's
    loose = sum(size[t] for t in batch if t not in keepers)
    batch = {t for t in batch if t in keepers}
    buffered, kwargs = 0, _kwargs_alive(step, len(rows))  # backward's held gradients (Step.grad_buffered, Row.grads_born)

    def consider(phase, at, gradients, activations, transient, where=None):
        # (the live bytes by category, as numbers: a 70B's step has a thousand moments and one worst per phase)
        transient += loose + buffered + kwargs + (step.outputs_held if phase != "forward" else 0)
        if where is not None:  # a row's boundary, for the trace only (the timeline's)
            trace.append((phase, at, _live(params, gradients, activations, state, transient, overhead), where))
            return
        total = params + gradients + activations + state + transient + overhead
        if trace is not None:
            trace.append((phase, at, _live(params, gradients, activations, state, transient, overhead), None))
        best = out.get(phase)
        if best is None or total > best["bytes"]:  # the first moment wins a tie, as MemTracker records it
            out[phase] = {"bytes": total, "live": _live(params, gradients, activations, state, transient, overhead), "at": at}

    # forward: what exists after each row = created so far, minus what nobody keeps
    # (kept so far: a running set and its bytes, so a step of many rows stays linear)
    kept_ever = set(keepers)
    saved_all: set[int] = set(batch)
    saved_bytes = sum(size[t] for t in saved_all)

    off = step.offloaded
    own_off, back_off = _offload_windows(step)

    def create(t):
        nonlocal saved_bytes
        if t not in saved_all and t in kept_ever and t not in off:
            saved_all.add(t)
            saved_bytes += size[t]

    prior, cast_cache = step.forward_held, list(accumulate(r.cast_cached for r in rows))  # (Step.forward_held, Row.cast_cached)
    for i, row in enumerate(rows):
        if edges:
            consider("forward", row.name, held, saved_bytes, prior + cast_cache[i] - row.cast_cached + (size[row.input] if row.input is not None and row.input not in saved_all else 0), "pre-forward")
        for t in row.kept:
            create(t)
        if row.forward_early is not None:   # before its output exists, its kept tensors made (a MoE's unsort)
            consider("forward", row.name, held, saved_bytes, prior + cast_cache[i] + row.forward_early)
        if row.output is not None and not row.view:
            create(row.output)
        moving = {t for t in (row.input, row.output) if t is not None and t not in saved_all}
        inner = 0 if row.inner_kept else row.inner
        transient = sum(size[t] for t in moving) + inner if row.forward_flight is None else row.forward_flight
        if off:  # its own offloaded tensors exist while it runs (an input or output among them is a transient already)
            transient += sum(size[t] for t in set(row.kept) if t in off and (row.forward_flight is not None or t not in moving))
        consider("forward", row.name, held, saved_bytes, prior + cast_cache[i] + transient)
    by_loss = sum(size[t] for t in step.loss_kept)
    consider("forward", "loss", held, saved_bytes + by_loss, (cast_cache[-1] if rows else 0) + sum(step.loss.forward))

    # backward: the loss (which then frees what it kept), then rows in reverse
    consider("backward", "loss", held, saved_bytes + by_loss, sum(step.loss.backward))
    done = 0  # gradients accumulated by rows after the current one
    released = _released(keepers, batch)  # row -> the kept tensors its backward frees
    left = saved_bytes
    # under step_in_backward, each row's parameters in `stepped` order (their own optimizer's temporaries)
    offsets = list(accumulate(len(r.params) for r in rows)) if in_backward else None  # (each row's end)
    for i in range(len(rows) - 1, -1, -1):
        row, kwargs = rows[i], _kwargs_alive(step, i)
        if not row.output_grad:
            continue
        if in_backward:
            row, done = _stepped_in_backward(step, row, stepped, offsets[i] - len(row.params)), 0
        alive = left + row.recompute + back_off[i]
        g_out = size.get(row.output, 0) if row.output is not None else 0
        if edges:
            consider("backward", row.name, max(held, done), left, g_out, "pre-backward")
        if row.recompute and (i + 1 == len(rows) or not rows[i + 1].recompute or rows[i + 1].kept):
            # the last row of a checkpointed layer: backward first recomputes the layer, row by row in forward
            # order, each at its worst moment (recompute_moment), beside the layer output's gradient: moments of
            # this row, whose backward runs the recomputation
            for j in range(_layer_start(rows, i), i + 1):
                if rows[j].recompute_moment is not None:
                    redone, flight = rows[j].recompute_moment
                    consider("backward", row.name, max(held, done), left + redone + back_off[i], g_out + flight)
        g_in = size.get(row.input, 0) if row.grad_input and not row.view and row.input is not None else 0
        if row.early_flight is not None:
            consider("backward", row.name, max(held, done), alive, row.early_flight)
        if row.backward_flight is not None:
            for made, activations, flight in _flight_moments(row, done, alive):
                consider("backward", row.name, max(held, made), activations, flight)
        elif row.inner:  # the activation's backward, then the row's own
            consider("backward", row.name, max(held, done), alive, g_out + row.inner)
            flowing = row.inner + g_in
        else:
            flowing = g_out + g_in
        if row.backward_flight is None:
            consider("backward", row.name, max(held, done + sum(row.grads)), alive, flowing + row.backward_extra)
        done += sum(row.grads)
        left -= sum(size[t] for t in released.get(i, ()) if t in saved_all)
        buffered += (row.grad_started - row.grad_completed if step.grad_buffered else 0) + sum(row.grads_born) - sum(row.grads_taken)
        if edges:  # the last row to run backward makes no input gradient; the step's kept tensors but the batch go
            consider("backward", row.name, max(held, done), *((left, g_in) if i and rows[i - 1].output_grad else (sum(size[t] for t in batch), 0)), "post-backward")

    # (under step_in_backward every parameter was stepped in backward: no gradient left, no step to run)
    consider("optimizer_step", "step", 0 if in_backward else all_grads, sum(size[t] for t in batch), 0 if in_backward else temporaries)
    return {p: out[p] for p in PHASES}


def peak(step: Step, granule: int | None = None) -> dict:
    """{"bytes", "phase", "live", "phases": {phase: {"bytes", "live", "at"}}}: the worst phase, earliest on a tie.

    With a granule (the CUDA caching allocator's 512 bytes) each phase also holds what rounding
    every live tensor up to it adds, as overhead: the categories stay the tensors' own bytes."""
    by_phase = phases(step)
    if granule:
        coarse = phases(rounded(step, granule))
        for p in PHASES:
            extra = coarse[p]["bytes"] - by_phase[p]["bytes"]
            by_phase[p]["live"]["overhead"] += extra
            by_phase[p]["bytes"] += extra
            by_phase[p]["granularity"] = extra
    worst = max(PHASES, key=lambda p: (by_phase[p]["bytes"], -PHASES.index(p)))
    return {"bytes": by_phase[worst]["bytes"], "phase": worst, "live": dict(by_phase[worst]["live"]), "phases": by_phase}


def rows_table(step: Step) -> list[dict]:
    """The step per row (a layer, or a part of a transformer layer), in forward order: the bytes of
    its parameters (trainable and frozen), of their gradients and of the tensors it is the first to
    keep for backward. Summed over the rows they are the step's parameters, gradients and saved
    activations (the batch it keeps included) — a reduction of the same ledger as the peak."""
    first: dict[int, int] = {}
    for i, row in enumerate(step.rows):
        for t in row.kept:
            first.setdefault(t, i)
    saved = [0] * len(step.rows)
    for t, i in first.items():
        saved[i] += step.tensors[t]
    if saved:  # what the loss keeps is shown with the last row (the head whose logits it reads)
        saved[-1] += sum(step.tensors[t] for t in step.loss_kept)
    return [{"row": row.name, "parameters": sum(row.params) + sum(row.frozen), "gradients": sum(row.grads), "saved": saved[i]}
            for i, row in enumerate(step.rows)]


def _share(amount: int, part: int, whole: int) -> int:
    """amount x part / whole, rounded up (a share is never under-counted)."""
    return -(-amount * part // whole) if whole else 0


def _gathered(gathered: dict, phase: str) -> int:
    """What a rank gathers at a moment of `phase`: a unit's parameters in forward, and its
    gradients beside them in backward (placement's transients), nothing in the optimizer step."""
    if phase == "backward":
        return sum(gathered.values())
    return gathered.get("gathered parameters", 0) if phase == "forward" else 0


def walk(step: Step, granule: int | None = None) -> tuple[dict, list, int, int, int]:
    """The single-device walk rank_peak starts from, a function of the step alone (a search over layouts
    computes it once): peak(step, granule); every moment of the step (phases' trace) as (phase,
    gradients, activations, transient, overhead with the phase's allocator rounding); the step's
    gradients, its most saved activations at a moment, and its optimizer state."""
    trace: list = []
    phases(step, trace)
    single = peak(step, granule)
    rounding = {p: info.get("granularity", 0) for p, info in single["phases"].items()}
    # a moment of the loss's backward is marked: no unit's backward has begun then (what a rank gathers differs)
    moments = [(phase, live["gradients"], live["activations"], live["transient"], live["overhead"] + rounding.get(phase, 0), phase == "backward" and at == "loss")
               for phase, at, live, where in trace if where is None]
    all_grads = sum(sum(r.grads) for r in step.rows)
    most_acts = max((live["activations"] for _, _, live, where in trace if where is None), default=0)
    return single, moments, all_grads, most_acts, sum(step.optimizer_state)


def copied(result: dict) -> dict:
    """A peak() result with its own dicts (a walk shared by several runs stays as computed)."""
    out = {**result, "live": dict(result["live"])}
    if "phases" in result:
        out["phases"] = {p: {**info, "live": dict(info["live"])} for p, info in result["phases"].items()}
    return out


def rank_peak(step: Step, placement, granule: int | None = None, walked: tuple | None = None) -> dict:
    """The step walked on each GPU of a parallel layout (placement.Placement): at every moment of the
    single-device walk, each category is the rank's own share of it — parameters and optimizer state
    as the rank holds them, the gradients and saved activations alive then in proportion to the
    rank's whole amount — plus the step's transients (each data rank runs the same micro-batch; the
    optimizer's temporaries in proportion to the state the rank steps on the GPU) and, in forward
    and backward, the unit it gathers (ZeRO-3, FSDP). The worst moment of the worst rank:
    {"bytes", "phase", "live", "gathered", "rank", "ranks"}. On one unsharded GPU this is peak()'s.
    `walked`: walk(step, granule), when the caller has it already."""
    single, moments, all_grads, most_acts, all_state = walked if walked is not None else walk(step, granule)
    layout = placement.layout.parallel
    # ZeRO's gradient partitions are flat buffers allocated once; pipeline micro-batches accumulate
    persistent = layout.engine == "zero" or layout.pipeline > 1 or layout.gradient_accumulation > 1
    # tensor and pipeline parallelism split the step itself: a rank runs its stage's rows, each a 1/tensor slice,
    # so its transients (a micro-batch's gradients in flight, the loss's copies) are its share of the single
    # device's, taken as its share of the parameters (one micro-batch at a time: the in-flight micro-batches of a
    # pipeline stage are saved activations, not transients)
    split = layout.tensor > 1 or layout.pipeline > 1
    all_params = single["live"]["parameters"]
    # a moment is only a candidate if no moment of its phase with the same gradients (when a rank's gradients follow
    # them), transients and overhead has more activations: every term of a rank's total grows with each of them, so the
    # worst moment is among these (a step of thousands of layers has a few hundred of them)
    kept_at: dict = {}
    for n, (phase, live_gradients, live_activations, live_transient, overhead, at_loss) in enumerate(moments):
        key = (phase, None if persistent else live_gradients, live_transient, overhead, at_loss)
        if key not in kept_at or live_activations > moments[kept_at[key]][2]:
            kept_at[key] = n
    moments = [moments[n] for n in sorted(kept_at.values())]
    best = None
    walked_for: set = set()  # ranks holding the same bytes walk alike (a pipeline's middle stages): walked once
    for i, held in enumerate(placement.devices):
        gathered = dict(placement.transients[i])
        same = (held["parameters"], held["gradients"], held["activations"], held["optimizer_state"], tuple(sorted(gathered.items())))
        if same in walked_for:
            continue  # its worst moment equals an earlier rank's, which a tie leaves the best
        walked_for.add(same)
        at_moment = _rank_moment(placement, i, persistent, split, all_params, all_grads, most_acts, all_state)
        for moment in moments:  # the total first, the categories only for a new worst
            terms = at_moment(*moment)
            total = sum(terms)
            if best is None or total > best[0]:
                best = (total, moment, terms, i)
    total, moment, terms, i = best
    sharded = placement.sharded
    return {"bytes": total, "phase": moment[0], "live": dict(zip(LIVE, terms)), "gathered": _gathered_at(placement, i, moment[0], moment[5]),
            "rank": sharded.stages[i].rank, "ranks": sharded.ranks}


def _gathered_at(placement, i: int, phase: str, at_loss: bool) -> dict:
    """What rank i has gathered at a moment of `phase` (at the loss's backward: only what stays from forward)."""
    gathered = placement.transients[i]
    if at_loss:
        return dict(placement.sharded.stages[i].at_loss) if gathered else {}
    return {k: v for k, v in gathered.items() if phase == "backward" or (phase == "forward" and k == "gathered parameters")}


def _rank_moment(placement, i: int, persistent: bool, split: bool, all_params: int, all_grads: int, most_acts: int, all_state: int):
    """Rank i's live bytes at a moment of the single-device walk, as a function of that moment (phase, gradients,
    activations, transient, overhead, at the loss's backward): the terms in LIVE's order."""
    held = placement.devices[i]
    gathered = placement.transients[i]
    # what the rank gathers at a moment of each phase: a unit's parameters in forward, its gradients beside them in backward
    extra = {phase: _gathered(gathered, phase) for phase in PHASES}
    # at the loss's backward only what stays gathered from forward (FSDP's root unit): no unit's backward has begun
    at_loss_extra = sum(placement.sharded.stages[i].at_loss.values()) if gathered else 0
    parameters, gradients, activations, state = held["parameters"], held["gradients"], held["activations"], held["optimizer_state"]
    # DDP's reducer buckets, held from construction: a second copy of the gradients, or the gradients themselves
    # when they are views of the buckets (gradient_as_bucket_view)
    buckets = getattr(placement.sharded.stages[i], "buckets", 0)
    views = placement.layout.parallel.gradient_as_bucket_view

    def terms(phase, live_gradients, live_activations, live_transient, overhead, at_loss):
        if phase == "optimizer_step":
            g = gradients
            # the optimizer steps the rank's own shard (on the host when it is offloaded there)
            transient = _share(live_transient, state, all_state)
        else:
            g = gradients if persistent else _share(gradients, live_gradients, all_grads)
            transient = (_share(parameters, live_transient, all_params) if split else live_transient) + (at_loss_extra if at_loss else extra[phase])
        if buckets:
            g = max(g, buckets) if views else g + buckets
        return parameters, g, _share(activations, live_activations, most_acts), state, transient, overhead

    return terms


def rank_trace(step: Step, placement, granule: int | None = None) -> list:
    """The binding rank's program: every instant of the single-device walk (its moments and row boundaries, as
    step.phases' trace) as that rank holds it, by rank_peak's own rule: [(phase, at, edge, live)]. Its largest
    instant is rank_peak's bytes."""
    result = placement.peak if placement.step_peak is not None else rank_peak(step, placement, granule)
    single, _, all_grads, most_acts, all_state = walk(step, granule)
    layout = placement.layout.parallel
    persistent = layout.engine == "zero" or layout.pipeline > 1 or layout.gradient_accumulation > 1
    split = layout.tensor > 1 or layout.pipeline > 1
    i = next(n for n, r in enumerate(placement.sharded.stages) if r.rank == result["rank"])
    at_moment = _rank_moment(placement, i, persistent, split, single["live"]["parameters"], all_grads, most_acts, all_state)
    trace: list = []
    phases(step, trace, edges=True)
    rounding = {p: info.get("granularity", 0) for p, info in single["phases"].items()}
    out = []
    for phase, at, live, edge in trace:
        moment = (phase, live["gradients"], live["activations"], live["transient"], live["overhead"] + rounding.get(phase, 0), phase == "backward" and at == "loss")
        out.append((phase, at, edge, dict(zip(LIVE, at_moment(*moment)))))
    return out


# --- words and bars (explain, hover, the budget's diagnostic) ---------------------------------
PHASE_WORDS = {"forward": "forward", "backward": "backward", "optimizer_step": "the optimizer step", "evaluation": "the evaluation pass"}
LIVE_WORDS = {"parameters": "parameters", "gradients": "gradients", "activations": "activations", "optimizer_state": "optimizer state", "transient": "transient", "overhead": "overhead"}


def public(result: dict) -> dict:
    """The JSON form: {"bytes", "phase", "live"} (the per-phase detail stays internal)."""
    return {"bytes": result["bytes"], "phase": result["phase"], "live": dict(result["live"])}


def summary(result: dict) -> str:
    """'peak 78.2 GiB during backward'."""
    from memfit.diagnostics.units import human

    return f"peak {human(result['bytes'])} during {PHASE_WORDS[result['phase']]}"


def live_text(live: dict) -> str:
    from memfit.diagnostics.units import human

    return ", ".join(f"{LIVE_WORDS[k]} {human(v)}" for k, v in live.items() if v or k in ("parameters", "activations"))


def phase_lines(result: dict, budget: int | None = None, width: int = 80) -> list[str]:
    """One bar per phase, scaled to the budget (or to the peak without one), the peak marked."""
    from memfit.diagnostics.units import human

    scale = max(budget or 0, result["bytes"]) or 1
    label_w, size_w = 16, 11
    bar_w = max(10, width - label_w - size_w - 16)
    out = []
    for phase in (*PHASES, *(("evaluation",) if "evaluation" in result["phases"] else ())):  # ledger/passes.py's pass
        info = result["phases"][phase]
        filled = min(bar_w, -(-info["bytes"] * bar_w // scale))
        bar = "#" * filled + "." * (bar_w - filled)
        mark = "  <- peak" if phase == result["phase"] else ""
        out.append(f"{phase:<{label_w}}[{bar}] {human(info['bytes']):>{size_w}}{mark}")
    peak_info = result["phases"][result["phase"]]
    at = peak_info.get("at")
    out.append(f"the peak is in {PHASE_WORDS[result['phase']]}" + (f", at {at}" if at and at not in ("step", "loss") else " (the loss)" if at == "loss" else "") + ":")
    line = " "
    for part in live_text(result["live"]).split(", "):
        if len(line) + len(part) + 2 > width and line.strip():
            out.append(line.rstrip(","))
            line = " "
        line += " " + part + ","
    out.append(line.rstrip(","))
    return out

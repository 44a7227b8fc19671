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
  OPTIMIZER_TEMPORARIES below, measured per optimizer in tests/test_peak.py).

Gradients are None between steps (`zero_grad(set_to_none=True)`, PyTorch's default). The
reference is torch.distributed._tools.mem_tracker.MemTracker around a real step on the CPU
(tests/peak_reference.py); docs/peak.md says what was measured.

Everything here is pure: rows in, exact integer bytes out. The model adapters (the Keras-form
layer stack below; the transformers families) build the rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

PHASES = ("forward", "backward", "optimizer_step")
LIVE = ("parameters", "gradients", "activations", "optimizer_state", "transient", "overhead")
IMPLS = ("foreach", "fused", "for_loop")

# Temporaries of optimizer.step() beyond parameters, gradients and state, in steady state
# (after the first steps: RAdam switches to its rectified update at step 6).
#   foreach: k x the bytes of the (device, dtype) group of trainable parameters: each
#            torch._foreach_* that returns new tensors allocates one per parameter at once;
#   for_loop: max over parameters, in order, and over the (a, b) moments listed, of a x this
#            parameter + b x the previous one (the previous iteration's temporaries live until
#            their names are rebound);
#   fused: one kernel, in place: none. None: torch.optim has no fused implementation.
# Read from torch/optim/*.py (_multi_tensor_*, _single_tensor_*) and measured with MemTracker
# against torch 2.13; tests/test_peak.py re-measures every entry.
OPTIMIZER_TEMPORARIES: dict[str, dict[str, tuple | int | None]] = {
    "sgd": {"foreach": 0, "for_loop": ((0, 0),), "fused": 0},
    "momentum": {"foreach": 0, "for_loop": ((0, 0),), "fused": 0},
    "sgd_momentum": {"foreach": 0, "for_loop": ((0, 0),), "fused": 0},
    "nesterov": {"foreach": 0, "for_loop": ((1, 0),), "fused": 0},
    "adagrad": {"foreach": 2, "for_loop": ((1, 1),), "fused": 0},
    "rmsprop": {"foreach": 1, "for_loop": ((1, 1),), "fused": None},
    "adadelta": {"foreach": 2, "for_loop": ((2, 1), (1, 2)), "fused": None},
    "adam": {"foreach": 1, "for_loop": ((2, 1),), "fused": 0},
    "adamw": {"foreach": 1, "for_loop": ((2, 1),), "fused": 0},
    "adamax": {"foreach": 1, "for_loop": ((1, 0),), "fused": None},
    "nadam": {"foreach": 1, "for_loop": ((2, 1),), "fused": None},
    "radam": {"foreach": 1, "for_loop": ((5, 0),), "fused": None},
}


class PeakError(ValueError):
    """The run cannot be modelled as asked (e.g. an implementation torch.optim does not have)."""


def optimizer_temporaries(optimizer: str, impl: str, params: list[int]) -> int:
    """Bytes of the optimizer step's temporaries; `params` = bytes of each trainable parameter in order."""
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
@dataclass(slots=True)
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


@dataclass(slots=True)
class Loss:
    """The loss on the last row's output (the logits), as transients: in forward the copies the loss
    makes while the logits are alive (fp32 upcast, log-softmax); in backward the gradients from the
    loss back to the logits."""

    forward: tuple  # bytes of each tensor
    backward: tuple


@dataclass(slots=True)
class Step:
    rows: list
    tensors: dict  # id -> bytes
    batch: list  # ids the training loop holds for the whole step: the input batch, the labels
    loss: Loss
    optimizer_state: list  # bytes of each state tensor (allocated by an earlier step)
    optimizer: str  # its name in OPTIMIZER_TEMPORARIES
    impl: str  # foreach | fused | for_loop
    overhead: int = 0  # fixed runtime overhead (presets.overhead_lines or a given size)


def _up(n: int, granule: int) -> int:
    return -(-n // granule) * granule


def rounded(step: Step, granule: int) -> Step:
    """The same step with every tensor rounded up to the allocator's granule."""
    def each(xs):
        return [_up(x, granule) for x in xs]

    rows = [
        replace(r, grads=each(r.grads), params=each(r.params), frozen=each(r.frozen), inner=_up(r.inner, granule), backward_extra=_up(r.backward_extra, granule))
        for r in step.rows
    ]
    return Step(rows, {t: _up(b, granule) for t, b in step.tensors.items()}, list(step.batch),
                Loss(tuple(each(step.loss.forward)), tuple(each(step.loss.backward))),
                each(step.optimizer_state), step.optimizer, step.impl, step.overhead)


def _live(parameters, gradients, activations, optimizer_state, transient, overhead) -> dict:
    return dict(zip(LIVE, (parameters, gradients, activations, optimizer_state, transient, overhead)))


def phases(step: Step) -> dict[str, dict]:
    """Each phase's worst moment: {"forward"|"backward"|"optimizer_step": {"bytes", "live", "at"}}."""
    rows, size = step.rows, step.tensors
    params = sum(sum(r.params) + sum(r.frozen) for r in rows)
    state = sum(step.optimizer_state)
    temporaries = optimizer_temporaries(step.optimizer, step.impl, [b for r in rows for b in r.params])
    all_grads = sum(sum(r.grads) for r in rows)
    keepers: dict[int, int] = {}  # kept id -> earliest row keeping it
    for i, row in enumerate(rows):
        for t in row.kept:
            keepers.setdefault(t, i)
    batch = set(step.batch)
    out: dict[str, dict] = {}

    def consider(phase, at, live):
        total = sum(live.values())
        best = out.get(phase)
        if best is None or total > best["bytes"]:  # the first moment wins a tie, as MemTracker records it
            out[phase] = {"bytes": total, "live": live, "at": at}

    # forward: what exists after each row = created so far, minus what nobody keeps
    created: set[int] = set(batch)
    kept_ever = set(keepers)
    for i, row in enumerate(rows):
        if row.output is not None and not row.view:
            created.add(row.output)
        created.update(t for t in row.kept)
        saved = {t for t in created if t in kept_ever or t in batch}
        moving = {t for t in (row.input, row.output) if t is not None and t not in saved}
        inner = 0 if row.inner_kept else row.inner
        consider("forward", row.name, _live(params, 0, sum(size[t] for t in saved), state, sum(size[t] for t in moving) + inner, step.overhead))
    saved_all = {t for t in created if t in kept_ever or t in batch}
    consider("forward", "loss", _live(params, 0, sum(size[t] for t in saved_all), state, sum(step.loss.forward), step.overhead))

    # backward: the loss, then rows in reverse
    saved_bytes = sum(size[t] for t in saved_all)
    consider("backward", "loss", _live(params, 0, saved_bytes, state, sum(step.loss.backward), step.overhead))
    done = 0  # gradients accumulated by rows after the current one
    freed = set()
    for i in range(len(rows) - 1, -1, -1):
        row = rows[i]
        if not row.output_grad:
            continue
        alive = sum(size[t] for t in saved_all if t not in freed)
        g_out = size.get(row.output, 0) if row.output is not None else 0
        g_in = size.get(row.input, 0) if row.grad_input and not row.view and row.input is not None else 0
        if row.inner:  # the activation's backward, then the row's own
            consider("backward", row.name, _live(params, done, alive, state, g_out + row.inner, step.overhead))
            flowing = row.inner + g_in
        else:
            flowing = g_out + g_in
        consider("backward", row.name, _live(params, done + sum(row.grads), alive, state, flowing + row.backward_extra, step.overhead))
        done += sum(row.grads)
        freed.update(t for t, k in keepers.items() if k == i and t not in batch)

    batch_bytes = sum(size[t] for t in batch)
    consider("optimizer_step", "step", _live(params, all_grads, batch_bytes, state, temporaries, step.overhead))
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


# --- the Keras-form layer stack (`model:`) -------------------------------------------------
def keras_step(model: dict, config, optimizer: str, impl: str, overhead: int = 0) -> Step:
    """The rows of a schema-valid, shape-checked `model` section under the config's dtypes.

    Walks the layers as layers.derive does (the same RULES, the same tensor identities), keeping
    what derive folds away: which tensor each layer reads and writes. The loss is PyTorch's
    cross-entropy on the last layer's output with integer class labels (one per output row)."""
    from .calculator import tensor_bytes
    from .layers import ACTIVATIONS, IDS, IN, INT64, OUT, RULES, defaults
    from .dtypes import DTYPES

    widths = config.widths

    def nbytes(shape, dtype=None) -> int:
        n = 1
        for d in shape:
            n *= d
        return tensor_bytes(n, DTYPES[dtype][0] if dtype else widths["activations"].bytes)

    tensors: dict[int, int] = {}

    def fresh(shape, dtype=None) -> int:
        tensors[len(tensors) + 1] = nbytes(shape, dtype)
        return len(tensors)

    layers = model.get("layers", [])
    shape = [model["batch_size"], *model["input_shape"]]
    ids_in = bool(layers) and layers[0]["type"] == "Embedding"
    current = fresh(shape, INT64 if ids_in else None)
    current_dtype = INT64 if ids_in else None
    batch = [current]
    rows: list[Row] = []
    elements: list[int] = []  # of each trainable weight, in order
    requires_grad = False
    for layer in layers:
        kind = layer["type"]
        rule = RULES[kind]
        p = {**defaults().get(kind, {}), **layer}
        out_shape = rule.shape(p, shape)
        row = Row(kind, input=current)
        for _, wshape, trainable in rule.weights(p, shape):
            n = 1
            for d in wshape:
                n *= d
            if trainable:
                elements.append(n)
                row.params.append(tensor_bytes(n, widths["parameters"].bytes))
                row.grads.append(tensor_bytes(n, widths["gradients"].bytes))
            else:
                row.frozen.append(tensor_bytes(n, widths["parameters"].bytes))
        row.grad_input = requires_grad
        view = rule.view(p)
        out = current if view else fresh(out_shape)
        row.output, row.view = out, view
        activation = ACTIVATIONS.get(p.get("activation", "linear")) if rule.activation else None
        specs = [(s, current, out) for s in rule.saved(p, shape, out_shape)]
        if activation is not None:
            pre = fresh(out_shape)
            specs = [(s, current, pre) for s, _, _ in specs] + [(activation, pre, out)]
        for spec, incoming, result in specs:
            if spec == IDS:
                row.kept.append(incoming if current_dtype == INT64 else fresh(shape, INT64))
            elif spec == IN:
                row.kept.append(incoming)
            elif spec == OUT:
                row.kept.append(result)
            else:
                label, sshape, dtype = spec
                row.kept.append(fresh(sshape, dtype))
                if label == "padded input":  # F.pad's copy: its gradient exists beside the op's own
                    row.backward_extra += tensors[row.kept[-1]]
        if activation is not None:
            row.inner = tensors[pre]
            row.inner_kept = pre in row.kept
        requires_grad = requires_grad or bool(row.grads)
        if not requires_grad:  # nothing upstream needs a gradient: autograd records no backward here
            row.output_grad = False
        rows.append(row)
        current, shape = out, out_shape
        current_dtype = current_dtype if view else None
    # the loss keeps the logits (as log_softmax's output of the same size); integer labels
    logits = tensors[current]
    if rows:
        rows[-1].kept.append(current)
    labels = fresh(shape[:-1], INT64)
    batch.append(labels)
    states = [tensor_bytes(n, widths["optimizer_state"].bytes) for n in elements for _ in range(config.states)]
    return Step(rows, tensors, batch, Loss(forward=(logits,), backward=(logits, logits)), states, optimizer, impl, overhead)

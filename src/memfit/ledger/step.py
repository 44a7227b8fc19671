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

import re
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
    recompute: int = 0  # bytes a checkpointed row recomputes at the start of its backward (alive until it is done)
    forward_flight: int | None = None  # the row's own worst transient in forward, when known better than input/output/inner
    backward_flight: int | None = None  # the gradients in flight at its worst backward moment, when known better


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
        replace(r, grads=each(r.grads), params=each(r.params), frozen=each(r.frozen), inner=_up(r.inner, granule),
                backward_extra=_up(r.backward_extra, granule), recompute=_up(r.recompute, granule))
        for r in step.rows
    ]
    return Step(rows, {t: _up(b, granule) for t, b in step.tensors.items()}, list(step.batch),
                Loss(tuple(each(step.loss.forward)), tuple(each(step.loss.backward))),
                each(step.optimizer_state), step.optimizer, step.impl, step.overhead)


def _live(parameters, gradients, activations, optimizer_state, transient, overhead) -> dict:
    return dict(zip(LIVE, (parameters, gradients, activations, optimizer_state, transient, overhead)))


def phases(step: Step, trace: list | None = None) -> dict[str, dict]:
    """Each phase's worst moment: {"forward"|"backward"|"optimizer_step": {"bytes", "live", "at"}}.
    `trace` (a list) receives every moment considered, in order: (phase, at, live)."""
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
        if trace is not None:
            trace.append((phase, at, live))
        total = sum(live.values())
        best = out.get(phase)
        if best is None or total > best["bytes"]:  # the first moment wins a tie, as MemTracker records it
            out[phase] = {"bytes": total, "live": live, "at": at}

    # forward: what exists after each row = created so far, minus what nobody keeps
    # (kept so far: a running set and its bytes, so a step of many rows stays linear)
    kept_ever = set(keepers)
    saved_all: set[int] = set(batch)
    saved_bytes = sum(size[t] for t in saved_all)

    def create(t):
        nonlocal saved_bytes
        if t not in saved_all and t in kept_ever:
            saved_all.add(t)
            saved_bytes += size[t]

    for i, row in enumerate(rows):
        if row.output is not None and not row.view:
            create(row.output)
        for t in row.kept:
            create(t)
        moving = {t for t in (row.input, row.output) if t is not None and t not in saved_all}
        inner = 0 if row.inner_kept else row.inner
        transient = sum(size[t] for t in moving) + inner if row.forward_flight is None else row.forward_flight
        consider("forward", row.name, _live(params, 0, saved_bytes, state, transient, step.overhead))
    consider("forward", "loss", _live(params, 0, saved_bytes, state, sum(step.loss.forward), step.overhead))

    # backward: the loss, then rows in reverse
    consider("backward", "loss", _live(params, 0, saved_bytes, state, sum(step.loss.backward), step.overhead))
    done = 0  # gradients accumulated by rows after the current one
    released: dict[int, list] = {}  # row -> the kept tensors its backward frees (it is their earliest keeper)
    for t, k in keepers.items():
        if t not in batch:
            released.setdefault(k, []).append(t)
    left = saved_bytes
    for i in range(len(rows) - 1, -1, -1):
        row = rows[i]
        if not row.output_grad:
            continue
        alive = left + row.recompute
        g_out = size.get(row.output, 0) if row.output is not None else 0
        g_in = size.get(row.input, 0) if row.grad_input and not row.view and row.input is not None else 0
        if row.backward_flight is not None:
            consider("backward", row.name, _live(params, done + sum(row.grads), alive, state, row.backward_flight, step.overhead))
        elif row.inner:  # the activation's backward, then the row's own
            consider("backward", row.name, _live(params, done, alive, state, g_out + row.inner, step.overhead))
            flowing = row.inner + g_in
        else:
            flowing = g_out + g_in
        if row.backward_flight is None:
            consider("backward", row.name, _live(params, done + sum(row.grads), alive, state, flowing + row.backward_extra, step.overhead))
        done += sum(row.grads)
        left -= sum(size[t] for t in released.get(i, ()) if t in saved_all)

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
def keras_step(model: dict, config, optimizer: str, impl: str, overhead: int = 0, declared=()) -> Step:
    """The rows of a schema-valid, shape-checked `model` section under the config's dtypes.

    Walks the layers as layers.derive does (the same RULES, the same tensor identities), keeping
    what derive folds away: which tensor each layer reads and writes. The loss is PyTorch's
    cross-entropy on the last layer's output with integer class labels (one per output row).
    `declared`: tensors listed explicitly beside the model (declared_row)."""
    from memfit.recipe.costs import tensor_bytes
    from memfit.recipe.dtypes import DTYPES
    from memfit.models.keras import ACTIVATIONS, IDS, IN, INT64, OUT, RULES, defaults

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
    extra = declared_row(declared, 0, tensors)
    if extra is not None:
        rows.append(extra)
    elements: list[int] = []  # of each trainable weight, in order
    requires_grad = False
    names = [r.name for r in config.layers] if len(config.layers) == len(layers) else [None] * len(layers)
    for layer, name in zip(layers, names):
        kind = layer["type"]
        rule = RULES[kind]
        p = {**defaults().get(kind, {}), **layer}
        out_shape = rule.shape(p, shape)
        row = Row(f"{name} ({kind})" if name else kind, input=current)
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
    states = declared_state(declared) + [tensor_bytes(n, widths["optimizer_state"].bytes) for n in elements for _ in range(config.states)]
    return Step(rows, tensors, batch, Loss(forward=(logits,), backward=(logits, logits)), states, optimizer, impl, overhead)


# --- words and bars (explain, hover, the budget's diagnostic) ---------------------------------
PHASE_WORDS = {"forward": "forward", "backward": "backward", "optimizer_step": "the optimizer step"}
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
    for phase in PHASES:
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


# --- transformers models (a normalized config, models.hf + models.hf_activations) ---------------
_LAYER = re.compile(r"\.(?:layers|h|layer)\.(\d+)\.")
_WIDTH = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4, "bool": 1}


def _elements(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def hf_step(cfg: dict, *, micro_batch: int, seq_len: int, attention: str = "sdpa", checkpointing: str = "none",
            precision: str = "32-true", optimizer: str = "adamw", impl: str = "foreach", states: int = 2,
            widths: dict | None = None, overhead: int = 0, dtypes: dict | None = None, declared=()) -> Step:
    """One training step of a transformers model: embeddings, each layer, the head (with the loss).

    What each block keeps comes from models.hf_activations.saved; the parameters from models.hf.
    `widths` = bytes per element of parameters, gradients and optimizer state (default: the
    precision's parameter dtype for all three, as torch.optim keeps its state in the parameter's
    dtype; a Fraction for sub-byte storage). `dtypes`: the config's dtypes (an activations dtype
    overrides the recipe's, as in hf_activations). The loss is transformers' ForCausalLMLoss: an
    fp32 copy of the logits when they are not fp32, log-softmax (kept), and in backward two fp32
    logits-sized gradients. `declared`: tensors listed explicitly beside the model."""
    from memfit.recipe.costs import tensor_bytes
    from memfit.models import hf as hfparams
    from memfit.models import hf_activations as acts

    low = {"bf16-true": 2, "16-true": 2}.get(precision, 4)
    widths = widths or {"parameters": low, "gradients": low, "optimizer_state": low}
    blocks = acts.saved(cfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention, checkpointing=checkpointing, precision=precision, dtypes=dtypes)
    roles = acts._dtypes(precision, dtypes)
    sizes = acts._sizes(cfg, micro_batch, seq_len)
    b, s, h, T = sizes["b"], sizes["s"], sizes["h"], sizes["T"]
    act_w, lin_w = _WIDTH[roles["act"]], _WIDTH[roles["lin"]]

    tensors: dict[int, int] = {}

    def fresh(nbytes: int) -> int:
        tensors[len(tensors) + 1] = nbytes
        return len(tensors)

    def kept_ids(kept, input_id, input_bytes):
        """Fresh ids, but the row's input where the first kept tensor is it (a norm keeping its fp32 input)."""
        out = []
        for n, k in enumerate(kept):
            nbytes = _elements(k.shape) * _WIDTH[k.dtype]
            if n == 0 and input_id is not None and nbytes == input_bytes and _elements(k.shape) == b * s * h and "input" in k.label:
                out.append(input_id)
            else:
                out.append(fresh(nbytes))
        return out

    # parameters by row: embeddings; each layer as four parts (norm and attention, its output
    # projection, norm and MLP, its down projection); the head
    params = hfparams.parameters(cfg)
    n_layers = next(bl.count for bl in blocks if bl.name == "layer")
    groups: dict = {"embeddings": [], "head": []}
    seen_layer = False
    for p in params:
        m = _LAYER.search(p.name)
        if m:
            groups.setdefault((int(m.group(1)), _part(p.name)), []).append(_elements(p.shape))
            seen_layer = True
        else:
            groups["head" if seen_layer else "embeddings"].append(_elements(p.shape))

    def weights(row: Row, key) -> Row:
        elements = groups.get(key, [])
        row.params = [tensor_bytes(n, widths["parameters"]) for n in elements]
        row.grads = [tensor_bytes(n, widths["gradients"]) for n in elements]
        return row

    emb, layer, head, loss = blocks
    ids, labels = fresh(b * s * 8), fresh(b * s * 8)
    hidden = b * s * h * act_w
    rows = []
    extra = declared_row(declared, 0, tensors)
    if extra is not None:
        rows.append(extra)
    x = fresh(hidden)
    row = weights(Row("embeddings", input=ids, output=x, grad_input=False), "embeddings")
    row.kept = [ids if k.label.endswith("input ids") else fresh(_elements(k.shape) * _WIDTH[k.dtype]) for k in emb.kept]
    row.frozen = _buffers(cfg, sizes, low)
    rows.append(row)
    every = layer.kept if checkpointing != "full" else acts.saved(cfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention, checkpointing="none", precision=precision, dtypes=dtypes)[1].kept
    parts = _split(every, acts.FAMILIES[cfg["model_type"]])
    part_bytes = [sum(_elements(k.shape) * _WIDTH[k.dtype] for k in kept) for _, kept in parts]
    flights = _layer_flights(cfg, sizes, act_w, lin_w)
    for i in range(n_layers):
        for n, (part, kept) in enumerate(parts):
            y = fresh(hidden)
            row = weights(Row(f"layer {i} {part}", input=x, output=y), (i, part))
            if checkpointing == "full":
                # only the boundary (the layer's input) stays kept; backward recomputes the layer
                # first, and each part's tensors go when its backward is done
                row.kept = [x] if n == 0 else []
                row.recompute = sum(part_bytes[: n + 1]) - hidden
            else:
                row.kept = kept_ids(kept, x, hidden) if n == 0 else [fresh(_elements(k.shape) * _WIDTH[k.dtype]) for k in kept]
            row.forward_flight = hidden  # its output while it is written; its inner tensors are kept
            row.backward_flight = flights[part]
            rows.append(row)
            x = y
    logits = fresh(T * sizes["V"] * lin_w)
    row = weights(Row("head", input=x, output=logits), "head")
    row.kept = kept_ids(head.kept, x, hidden) + [fresh(_elements(k.shape) * _WIDTH[k.dtype]) for k in loss.kept]
    rows.append(row)
    logits32 = T * sizes["V"] * 4
    upcast = logits32 if lin_w != 4 else 0
    order = ["embeddings", *[(i, part) for i in range(n_layers) for part, _ in parts], "head"]
    states_bytes = declared_state(declared) + [tensor_bytes(n, widths["optimizer_state"]) for key in order for n in groups.get(key, []) for _ in range(states)]
    return Step(rows, tensors, [ids, labels], Loss(forward=(tensors[logits], *([upcast] if upcast else [])), backward=(logits32, logits32)),
                states_bytes, optimizer, impl, overhead)


def _buffers(cfg: dict, sizes: dict, width: int) -> list:
    """The model's buffers (on the device, without gradients): the rotary embedding's inv_freq and
    original_inv_freq; BERT's position_ids and token_type_ids (int64, max_position_embeddings);
    Gemma's embedding normalizer (a float32 scalar)."""
    out = [sizes["rot"] // 2 * width] * 2 if sizes["rot"] else []
    if cfg["model_type"] == "bert":
        out += [cfg["max_position_embeddings"] * 8] * 2
    if cfg["model_type"] == "gemma":
        out.append(4)
    return out


# A layer's parameters by part, from their names (the families' spellings); the first match wins.
_PARTS = (
    ("o_proj", ("o_proj", "attn.c_proj", "attention.dense", "attention.output.")),
    ("attention", ("attn", "attention", "input_layernorm", "ln_1", "q_norm", "k_norm")),
    ("down_proj", ("down_proj", "mlp.c_proj", "dense_4h_to_h", ".output.")),
    ("mlp", ("",)),
)
def _part(name: str) -> str:
    return next(part for part, words in _PARTS if any(w in name for w in words))


def _split(kept: list, fam) -> list:
    """A layer's kept tensors as its four parts, in forward order (a part that keeps nothing of
    its own, such as o_proj whose input the attention kernel keeps, is empty). A part begins at
    the first label of its first op."""
    n = fam.names
    # hf_activations names an op by its role (o_proj, fc_out, ...) or by the family's module
    starts_with = {
        "o_proj": ("o_proj", n["o"]),
        "mlp": ("post_attention_layernorm", "gate_proj", "gate_up_proj", "fc_in", *(n[k] for k in ("gate", "gate_up", "fc_in") if k in n)),
        "down_proj": ("down_proj", "fc_out", "grouped_mm down", *(n[k] for k in ("down", "fc_out") if k in n)),
    }
    order = ["attention", "o_proj", "mlp", "down_proj"]
    starts = [0] * len(order) + [len(kept)]
    for i in range(len(order) - 1, 0, -1):
        found = next((m for m, k in enumerate(kept) if k.label.startswith(starts_with[order[i]])), None)
        starts[i] = min(found if found is not None else starts[i + 1], starts[i + 1])
    return [(part, kept[starts[i] : starts[i + 1]]) for i, part in enumerate(order)]


def _layer_flights(cfg: dict, sizes: dict, act_w: int, lin_w: int) -> dict:
    """Gradients in flight at the worst backward moment of each part of a layer; the residual
    stream's gradient is alive through all of them, a residual dropout's gradient beside it. The
    down projection: its input's gradient; the MLP: the gradients of the down projection's input
    and of the gate and up outputs (a plain MLP: of the activation's input); o_proj: its input's;
    attention: o_proj's input's and those of q, k and v."""
    from memfit.models import hf_activations as acts

    T, h, i, q, kv = sizes["T"], sizes["h"], sizes["i"], sizes["q"], sizes["kv"]
    fam = acts.FAMILIES[cfg["model_type"]]
    k = 2 if fam.mlp == "plain" else 3
    routed = sizes["k"] or 1  # a mixture of experts runs its MLP once per (token, chosen expert)
    res = T * h * act_w
    dropout = res if acts._drop(cfg, fam, "resid") else 0
    return {
        "down_proj": res + dropout + routed * T * i * lin_w,
        "mlp": res + dropout + routed * T * k * i * lin_w,
        "o_proj": res + dropout + T * q * lin_w,
        "attention": res + T * (2 * q + 2 * kv) * lin_w,
    }




# --- declared tensors (`parameters:` / `activations:` lists) -------------------------------------
def declared_row(tensors, states: int, ids: dict) -> Row | None:
    """The explicitly declared tensors as one row ahead of any model: its parameters (count copies
    each), and its activations, all kept for backward (what a list of tensors says: they are saved).
    `ids` (id -> bytes) receives the activations. None when nothing is declared."""
    row = Row("declared tensors", grad_input=False, output_grad=False)
    any_declared = False
    for t in tensors:
        any_declared = True
        copies = max(t.count, 1)
        if t.category == "parameters":
            each = t.bytes.get("parameters", 0) // copies
            if t.trainable:
                row.params += [each] * copies
                row.grads += [t.bytes.get("gradients", 0) // copies] * copies
            else:
                row.frozen += [each] * copies
        else:
            for _ in range(copies):
                ids[len(ids) + 1] = t.bytes.get("activations", 0) // copies
                row.kept.append(len(ids))
    if row.grads:  # its parameters are trained, so its backward runs (their gradients appear)
        row.output_grad = True
    return row if any_declared else None


def declared_state(tensors) -> list:
    """Optimizer state of the declared trainable parameters, as tensors (bytes each)."""
    out = []
    for t in tensors:
        if t.category == "parameters" and t.trainable and t.bytes.get("optimizer_state"):
            out.append(t.bytes["optimizer_state"])
    return out


def tensors_step(tensors, optimizer: str, impl: str, overhead: int = 0) -> Step:
    """A run described only by declared tensors: forward keeps all the activations, backward adds
    the gradients, the optimizer step its temporaries. No layer structure, so no flowing
    gradients: the backward is the footprint's total."""
    ids: dict = {}
    row = declared_row(tensors, 0, ids)
    rows = [row] if row is not None else []
    return Step(rows, ids, [], Loss((), ()), declared_state(tensors), optimizer, impl, overhead)

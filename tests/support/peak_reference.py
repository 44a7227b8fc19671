"""The reference for memfit's peak: PyTorch's MemTracker around one real training step on the CPU.

One step as a training loop runs it once it is warm: the optimizer state already allocated (a
warm-up step before), gradients set to None, then forward, backward and `optimizer.step()`.
MemTracker reports the peak by category but not the phase; the loop below names the phase it is
in and a MemTracker subclass notes the phase, and what is then really accumulated in `.grad`
(MemTracker calls a gradient `Temp` until its accumulate hook ran), whenever the peak grows.
"""

from __future__ import annotations

import contextlib
import difflib

import torch
from torch.distributed._tools.mem_tracker import MemTracker

CPU = torch.device("cpu")
IMPLS = {"foreach": {"foreach": True}, "for_loop": {"foreach": False}, "fused": {"fused": True}}


# set by `audited`: whether the PhaseTrackers made now run MemTracker's module tracker, and the list they join
_AUDIT: dict | None = None


@contextlib.contextmanager
def audited(modules: bool):
    """Every PhaseTracker made inside (the references of peak_reference.measure, measure_hf, test_combinations'
    measure_transformer, test_eval_families' measured_evaluation) runs with MemTracker's module tracker (`modules`, as
    the references run) or without it (NoModules: every byte still counted by the dispatch mode), and records the live
    bytes after each op it sees (`tracker.trace`: [(op, bytes)]). Yields the list of those trackers."""
    global _AUDIT
    made: list = []
    before, _AUDIT = _AUDIT, {"modules": modules, "trackers": made}
    try:
        yield made
    finally:
        _AUDIT = before


def aligned_live(a: list, b: list) -> list:
    """[(op, bytes in a, bytes in b)] at each op both traces ran in the same order (difflib's matching blocks of their op
    names: the module tracker's own ops, a view_as per leaf input it hooks, appear in one trace only)."""
    ops_a, ops_b = [op for op, _ in a], [op for op, _ in b]
    out = []
    for i, j, n in difflib.SequenceMatcher(None, ops_a, ops_b, autojunk=False).get_matching_blocks():
        out.extend((ops_a[i + k], a[i + k][1], b[j + k][1]) for k in range(n))
    return out


class PhaseTracker(MemTracker):
    def __init__(self, params):
        super().__init__()
        self.phase = "forward"
        self.params = list(params)
        self.peak_phase = None
        self.peak_grads = 0
        self.trace = None
        if _AUDIT is not None:
            self.trace = []
            if not _AUDIT["modules"]:
                self._mod_tracker = NoModules()
            _AUDIT["trackers"].append(self)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if self.trace is not None:
            self.trace.append((str(func), self._curr_mem_snap.get(CPU, {}).get("Total", 0)))
        return out

    def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
        # MemTracker hooks every parameter's gradient; a frozen one (a LoRA base, a 4-bit weight)
        # cannot take a hook. Its module's gradients are then counted as temporaries, not as
        # gradients: the totals compared are the same.
        frozen = any(not p.requires_grad for p in module.parameters())
        return super()._track_module_params_and_buffers(module, install_grad_hooks=install_grad_hooks and not frozen)

    def _update_peak_stats(self, peak_state):
        before = self._peak_mem.get(CPU, 0)
        super()._update_peak_stats(peak_state)
        if self._peak_mem.get(CPU, 0) > before:
            self.peak_phase = self.phase
            self.peak_grads = sum(p.grad.untyped_storage().nbytes() for p in self.params if p.grad is not None)

    def peak(self) -> tuple:
        """(the peak's bytes on the CPU, the phase it was reached in)."""
        return self.get_tracker_snapshot("peak")[CPU]["Total"], self.peak_phase


def tracked(step, model, *external, warm: int = 2, times: int = 1, tracker=None, modules: bool = False):
    """A warm step under MemTracker: `step(tracker=None)` (a loop's step, naming its phase on the tracker it is given)
    run `warm` times (the optimizer state exists), then `times` times under `tracker` (a PhaseTracker over the model's
    parameters unless given), the model and `external` (the optimizer, the batch) tracked; `modules`: MemTracker's
    module hooks, else none (NoModules: every byte still counted). Returns the tracker."""
    for _ in range(warm):
        step()
    tracker = tracker if tracker is not None else PhaseTracker(list(model.parameters()))
    if not modules:
        tracker._mod_tracker = NoModules()
    tracker.track_external(model, *external)
    with tracker:
        for _ in range(times):
            step(tracker)
    return tracker


def warm_step(model, opt, x, y, accumulation: int = 1, autocast=None, tracker=None, modules: bool = True):
    """A transformers model's optimizer step of `accumulation` micro-batches (the loss in the model's forward, under
    `autocast()` where given, as the Trainer runs it; each backward outside it; gradients set to None after it), run
    twice to warm (the optimizer state exists), then once under `tracker` (a PhaseTracker over the model's parameters
    unless given), its phase set as the step goes; `modules`: MemTracker's module hooks, their stats reset between
    micro-batches (they refuse a module called twice otherwise), else none (NoModules); inside `audited`, the audit's
    choice. Returns the tracker."""
    import hf_measure

    context = autocast or contextlib.nullcontext
    if _AUDIT is not None:
        modules = _AUDIT["modules"]

    def step(tracker=None):
        for n in range(accumulation):
            if tracker is not None:
                tracker.phase = "forward"
                if n and modules:
                    tracker.reset_mod_stats()
            with context():
                loss = model(input_ids=x, labels=y).loss
            if tracker is not None:
                tracker.phase = "backward"
            loss.backward()
            del loss
        if tracker is not None:
            tracker.phase = "optimizer_step"
        opt.step()
        opt.zero_grad(set_to_none=True)

    with hf_measure.cuda_dropout():
        return tracked(step, model, opt, x, y, tracker=tracker, modules=modules)


def unhooked_step(model, opt, x, y, collector: bool = False) -> dict:
    """warm_step's peak with MemTracker's module tracker off (NoModules: every byte still counted by its dispatch mode)
    and Python's cyclic collector off through the warm-up and the step unless `collector`: {"bytes", "phase"}.
    ModTracker's pre-forward hook, register_multi_grad_hook(inputs, ...) in its "all" mode, closes over the inputs'
    grad_fns and is stored on those grad_fns: a reference cycle per module call, which a training loop without the
    tracker does not have (tests/ledger/test_dora_peak.py measures what it holds under DoRA)."""
    import gc

    enabled = gc.isenabled()
    gc.collect()
    if not collector:
        gc.disable()
    try:
        tracker = warm_step(model, opt, x, y, modules=False)
    finally:
        if enabled:
            gc.enable()
    return {"bytes": tracker._peak_mem[CPU], "phase": tracker.peak_phase}


class NoModules:
    """MemTracker's module tracker tracking no module (`tracker._mod_tracker = NoModules()`): every byte is still
    counted by its dispatch mode. ModTracker's backward hooks hold each module's outputs, so a graph whose nodes hold
    tensors as attributes (bitsandbytes < 0.43.2's MatMul4Bit) would outlive the loop's last reference to it."""

    parents: set = set()
    is_bw = False

    def register_user_hooks(self, *hooks):
        pass

    def clear_user_hooks(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def state_bytes(optimizer, scalars: bool) -> int:
    seen = {}
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value) and (scalars or value.dim() > 0):
                seen[value.untyped_storage().data_ptr()] = value.untyped_storage().nbytes()
    return sum(seen.values())


def measure(model, batch, loss_fn, optimizer, warmup: int = 2, set_to_none: bool = True) -> dict:
    """Peak of one step after `warmup` steps: {"bytes", "phase", "parameters", "gradients", "optimizer_state", "categories"}.
    `set_to_none` False: the loop zeroes the gradients in place (they stay allocated between steps)."""

    def step(tracker=None):
        def phase(name):
            if tracker is not None:
                tracker.phase = name

        phase("forward")
        loss = loss_fn(model, *batch)
        phase("backward")
        loss.backward()
        phase("optimizer_step")
        optimizer.step()
        optimizer.zero_grad(set_to_none=set_to_none)
        return loss

    for _ in range(warmup):
        step()
    params = [p for p in model.parameters()]
    tracker = PhaseTracker(params)
    # (an optimizer per parameter stepped in backward, test_combinations.InBackward: each one tracked)
    tracker.track_external(model, *getattr(optimizer, "optimizers", [optimizer]), *batch)
    with tracker:
        step(tracker)
    snap = tracker.get_tracker_snapshot("peak")[CPU]
    cats = {k.value if hasattr(k, "value") else k: v for k, v in snap.items()}
    return {
        "bytes": snap["Total"],
        "phase": tracker.peak_phase,
        "parameters": cats["Parameter"] + cats["Buffer"],
        "gradients": tracker.peak_grads,
        "optimizer_state": state_bytes(optimizer, scalars=False),
        "categories": cats,
    }


# --- the Keras-form layer stacks of tests/models/test_frameworks.py as a torch.nn.Module ------------
def keras_module(input_shape, layers, batch):
    """keras_reference.Reference (the same layers in plain PyTorch) as a module whose parameters
    and BatchNormalization buffers are created once and reused on every call."""
    import keras_reference as tf

    F = torch.nn.functional

    class Replay(tf.Reference):
        cursor = None

        def param(self, *shape):
            if self.cursor is None:
                return super().param(*shape)
            self.cursor += 1
            return self.params[self.cursor - 1]

        def layer(self, spec, x):
            if spec["type"] != "BatchNormalization" or self.cursor is None:
                return super().layer(spec, x)
            p = {**tf.defaults()["BatchNormalization"], **spec}
            c = x.shape[-1]
            mean, var = self.buffers[self.bcursor], self.buffers[self.bcursor + 1]
            self.bcursor += 2
            return tf._last(F.batch_norm(tf._first(x), mean, var, self.param(c) if p["scale"] else None, self.param(c) if p["center"] else None, training=True))

    class KerasModule(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ref = Replay()
            with torch.no_grad():
                self._run(keras_input(input_shape, layers, batch))
            self.weights = torch.nn.ParameterList(self.ref.params)
            for i, b in enumerate(self.ref.buffers):
                self.register_buffer(f"buffer{i}", b)

        def _run(self, x):
            from memfit.models.keras import RULES, layer_names

            # a graph (layers that name their `inputs`; keras_reference.merged): as Keras's Functional
            # runs it, each tensor is dropped after the last layer that reads it
            names = layer_names(layers)
            wanted = [spec.get("inputs") or [names[i - 1] if i else "input_layer"] for i, spec in enumerate(layers)]
            last = {n: i for i, ns in enumerate(wanted) for n in ns}
            made = {"input_layer": x}
            del x
            for i, (spec, name) in enumerate(zip(layers, names)):
                given = [made[n] for n in wanted[i]]
                for n in set(wanted[i]):
                    if last[n] == i:
                        del made[n]
                y = tf.merged(spec, given) if RULES[spec["type"]].merge else self.ref.layer(spec, given[0])
                del given
                made.setdefault(name, y)
                del y
            return made[names[-1]]

        def forward(self, x):
            self.ref.cursor = self.ref.bcursor = 0
            return self._run(x)

    return KerasModule()


def keras_input(input_shape, layers, batch):
    """The input batch: integer ids when the first layer is an Embedding."""
    if layers[0]["type"] == "Embedding":
        x = torch.randint(0, layers[0]["input_dim"], (batch, *input_shape))
    else:
        x = torch.randn(batch, *input_shape)
    return x


def measure_keras(input_shape, layers, batch, optimizer, impl) -> dict:
    torch.manual_seed(0)
    model = keras_module(input_shape, layers, batch)
    x = keras_input(input_shape, layers, batch)
    with torch.no_grad():
        out_shape = model(x).shape
    y = torch.randint(0, out_shape[-1], tuple(out_shape[:-1]))
    opt = OPTIMIZERS[optimizer](model.parameters(), **IMPLS[impl])

    def loss(module, x, y):
        logits = module(x)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    return measure(model, (x, y), loss, opt)


# memfit's optimizers as torch.optim builds them (each with the implementation asked for: IMPLS)
TORCH_OPTIMIZERS = {
    "sgd": lambda ps, **k: torch.optim.SGD(ps, lr=0.1, **k),
    "momentum": lambda ps, **k: torch.optim.SGD(ps, lr=0.1, momentum=0.9, **k),
    "sgd_momentum": lambda ps, **k: torch.optim.SGD(ps, lr=0.1, momentum=0.9, **k),
    "nesterov": lambda ps, **k: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, **k),
    "adagrad": lambda ps, **k: torch.optim.Adagrad(ps, **k),
    "rmsprop": lambda ps, **k: torch.optim.RMSprop(ps, **k),
    "adadelta": lambda ps, **k: torch.optim.Adadelta(ps, **k),
    "adam": lambda ps, **k: torch.optim.Adam(ps, **k),
    "adamw": lambda ps, **k: torch.optim.AdamW(ps, **k),
    "adamax": lambda ps, **k: torch.optim.Adamax(ps, **k),
    "nadam": lambda ps, **k: torch.optim.NAdam(ps, **k),
    "radam": lambda ps, **k: torch.optim.RAdam(ps, **k),
}


def _bnb(cls_name: str):
    """bitsandbytes' 8-bit optimizers: one in-place kernel per parameter; the torch.optim implementation
    asked for (foreach, fused, for_loop) does not apply to them."""
    def make(ps, **_):
        import bitsandbytes as bnb

        return getattr(bnb.optim, cls_name)(ps)

    return make


OPTIMIZERS = {**TORCH_OPTIMIZERS, **{name: _bnb(cls) for name, cls in (("adam8bit", "Adam8bit"), ("adamw8bit", "AdamW8bit"), ("paged_adam8bit", "PagedAdam8bit"),
                                                     ("paged_adamw8bit", "PagedAdamW8bit"), ("lion8bit", "Lion8bit"),
                                                     ("paged_lion8bit", "PagedLion8bit"))}}


def optimizer_step_temporaries(optimizer, impl, sizes, warmup: int = 8) -> int:
    """Bytes MemTracker sees above the resting state during one optimizer.step() (after `warmup`
    steps: RAdam's rectified update starts at step 6)."""
    params = [torch.nn.Parameter(torch.randn(n)) for n in sizes]
    opt = OPTIMIZERS[optimizer](params, **IMPLS[impl])
    for _ in range(warmup + 1):
        for p in params:
            p.grad = torch.randn_like(p)
        if _ < warmup:
            opt.step()
    tracker = MemTracker()
    tracker.track_external(opt, *params, *[p.grad for p in params])
    with tracker:
        opt.step()
    return tracker.get_tracker_snapshot("peak")[CPU]["Total"] - tracker.get_tracker_snapshot("current")[CPU]["Total"]


# --- transformers models (tests/support/hf_measure.py builds them as the activation cross-checks do) -----
def measure_hf(cfg: dict, *, micro_batch: int, seq_len: int, optimizer: str, impl: str, checkpointing: str = "none", precision: str = "32-true",
               set_to_none: bool = True) -> dict:
    """One step of a tiny transformers model with its labels (the model computes the loss), attention
    dropout off and dropout through torch.native_dropout (CUDA's 1-byte mask), as in hf_measure."""
    import hf_measure

    model = hf_measure.build(cfg, precision=precision)
    if checkpointing == "full":
        model.gradient_checkpointing_enable()  # transformers' default: non-reentrant torch.utils.checkpoint
    batch = hf_measure.inputs(cfg, micro_batch, seq_len)
    opt = OPTIMIZERS[optimizer](model.parameters(), **IMPLS[impl])
    with hf_measure.cuda_dropout():
        return measure(model, (batch["input_ids"], batch["labels"]), lambda m, x, y: m(input_ids=x, labels=y).loss, opt,
                       set_to_none=set_to_none)

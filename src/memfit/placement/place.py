"""Tensors x a device layout -> the bytes each device holds.

Everything that shows or judges a byte count (the footprint, the budget gate, explain, hover,
inlay hints, every reporter) reads it from a Placement, so a strategy that shards, replicates
or offloads tensors (ZeRO, FSDP, tensor and pipeline parallel) changes this stage only. A
single device holds every tensor whole; a `parallel` layout (sharding.Parallel) places them on
ranks as sharding.py computes it, and the placement describes each pipeline stage's
most-loaded rank, the binding one being the GPU that must fit.
"""

from __future__ import annotations

from fractions import Fraction

from memfit.recipe.costs import CATEGORIES

# sharding's categories -> the footprint's: the fp32 gradient buffer is a gradient, the master
# weights are optimizer state (where the ZeRO paper counts them)
FOOTPRINT_CATEGORY = {"parameters": "parameters", "gradients": "gradients", "grad_accum": "gradients", "master": "optimizer_state", "optimizer_state": "optimizer_state"}


class Layout:
    """Where training runs: one device, or `parallel` (a sharding.Parallel). Plain classes here: built on every start."""

    __slots__ = ("devices", "parallel", "model_activations", "memo")

    def __init__(self, devices: int = 1, parallel=None, model_activations: list | None = None, memo: dict | None = None) -> None:
        self.devices = devices if parallel is None else parallel.world
        self.parallel = parallel
        # per pipeline stage, a transformer's saved activations on its most-loaded rank
        # (models.hf_sharded); they replace the model section's whole-model activation rows
        self.model_activations = model_activations
        # a search's memo (check.pipeline.evaluate): the model's parameters, expanded per layer and
        # put on their pipeline stages, are the same for every data-parallel size; kept there once
        self.memo = memo


SINGLE = Layout()


class Placement:
    __slots__ = ("layout", "devices", "sharded", "transients", "step_peak")

    def __init__(self, layout: Layout, devices: list, sharded=None, transients=None, step_peak=None) -> None:
        self.step_peak = step_peak  # ledger.step.rank_peak: the step walked on each rank, for a run
        self.layout = layout
        self.devices = devices  # per device (per pipeline stage's most-loaded rank): category -> bytes, and "total"
        self.sharded = sharded  # sharding.Sharded under a parallel layout
        self.transients = transients or [{} for _ in devices]  # per device: what it gathers for a moment

    def with_step_peak(self, step_peak: dict) -> "Placement":
        """The same placement with the step's per-rank walk (a new object: a built placement is not changed)."""
        return Placement(self.layout, self.devices, self.sharded, self.transients, step_peak)

    def with_resident(self, held: dict) -> "Placement":
        """The same placement with more bytes resident on the one device (category -> bytes): tensors a pass beside
        the training step keeps for the whole run (a distillation teacher's weights, ledger.passes.with_teacher)."""
        if self.sharded is not None or len(self.devices) != 1:
            raise ValueError("resident bytes beside the step are placed on one device only")
        device = dict(self.devices[0])
        for category, size in held.items():
            device[category] += size
        device["total"] = sum(device[c] for c in CATEGORIES)
        return Placement(self.layout, [device], self.sharded, self.transients, self.step_peak)

    def with_saved(self, change: int) -> "Placement":
        """The same placement with each device's saved activations changed by `change` bytes (a technique's rewrite of
        what the step keeps: ledger.step.Step.saved_rewritten); every device runs the whole model's step."""
        if not change:
            return self
        devices = []
        for held in self.devices:
            device = dict(held)
            device["activations"] += change
            device["total"] = sum(device[c] for c in CATEGORIES)
            devices.append(device)
        return Placement(self.layout, devices, self.sharded, self.transients, self.step_peak)

    @property
    def binding(self) -> int:
        """The device that must fit: the one holding the most at its worst moment (each rank's walked peak where
        every stage's rank walked its own program: ledger.ranks, `per_rank`)."""
        walked = self.step_peak.get("per_rank") if self.step_peak is not None else None
        if walked and len(walked) == len(self.devices):
            return max(range(len(walked)), key=lambda i: (walked[i]["bytes"], -i))
        return max(range(len(self.devices)), key=lambda i: (self.devices[i]["total"] + sum(self.transients[i].values()), -i))

    @property
    def footprint(self) -> dict:
        """The binding device's bytes per category and total; under a parallel layout also the world
        size (`ranks`) and which rank this is (`rank`, Megatron's order: tensor, data, pipeline)."""
        held = self.devices[self.binding]
        if self.sharded is None:
            return held
        return {**held, "ranks": self.sharded.ranks, "rank": self.rank}

    @property
    def rank(self) -> int | None:
        return self.sharded.stages[self.binding].rank if self.sharded is not None else None

    @property
    def peak(self) -> dict | None:
        """Under a parallel layout: the binding GPU's footprint plus what it gathers for a moment."""
        if self.sharded is None:
            return None
        if self.step_peak is not None:
            return self.step_peak
        i = self.binding
        held, transient = self.devices[i], dict(self.transients[i])
        live = {c: held[c] for c in CATEGORIES}
        live["transient"] = sum(transient.values())
        live["overhead"] = 0
        # the shape of peak.py's report ("live" per category); "gathered" says what the transient is.
        # Every category at once plus a gathered unit and its gradients is the start of backward:
        # the phase is that one (no per-phase walk under a parallel layout)
        return {"bytes": held["total"] + live["transient"], "phase": "backward", "live": live, "gathered": transient, "rank": self.rank, "ranks": self.sharded.ranks}

    @property
    def host(self) -> dict | None:
        """Host memory of the most-loaded node under offload: category -> bytes, and "total"."""
        if self.sharded is None or not self.sharded.host_per_node:
            return None
        held = dict.fromkeys(CATEGORIES, 0)
        for category, size in self.sharded.host_per_node.items():
            held[FOOTPRINT_CATEGORY.get(category, category)] += size
        held.pop("activations")
        held["total"] = sum(held.values())
        held["gpus"] = min(self.layout.parallel.gpus_per_node, self.sharded.ranks)
        return held

    def of(self, tensor, device: int = 0) -> dict:
        """Bytes per category that `tensor` puts on a device whole (before any sharding)."""
        return tensor.bytes


def place(tensors, layout: Layout = SINGLE) -> Placement:
    if layout.parallel is not None:
        return _place_parallel(tensors, layout)
    if layout.devices != 1:
        raise ValueError(f"{layout.devices} devices: only a single-device layout is modelled")
    held = dict.fromkeys(CATEGORIES, 0)
    for tensor in tensors:
        for category, size in tensor.bytes.items():
            held[category] += size
    held["total"] = sum(held[c] for c in CATEGORIES)
    return Placement(layout, [held])


def _width(size: int, elements: int):
    w = Fraction(size, elements) if elements else Fraction(0)
    return w.numerator if w.denominator == 1 else w


def _per_layer(name: str) -> bool:
    return name.startswith("layer:") or ".*." in "." + name


def _place_parallel(tensors, layout: Layout) -> Placement:
    from memfit.placement import sharding

    p = layout.parallel
    parameters, activations, constants = [], [], dict.fromkeys(CATEGORIES, 0)
    for t in tensors:
        if t.category not in ("parameters", "activations") or t.buffer:
            # a module's buffers (rotary inv_freq): no ZeRO stage or FSDP shards them, every rank keeps its own
            # an optimizer's own constants (bitsandbytes' quantization maps): each rank's optimizer keeps them
            for category, size in t.bytes.items():
                constants[category] += size
        elif t.category == "parameters":
            parameters.append(t)
        else:
            activations.append(t)
    memo = layout.memo
    ids = tuple(map(id, parameters))
    kept = memo.get(("placement", p.pipeline)) if memo is not None else None
    if kept is not None and kept[0] == ids:
        staged = kept[2]
    else:  # one entry per pipeline size: a config whose own tensors are new objects every run keeps no more
        shardable = []
        for t in parameters:
            n = t.elements * t.count
            by_role = t.roles if t.roles is not None else t.bytes  # the recipe's roles: ZeRO shards each on its own
            widths = {c: _width(size, n) for c, size in by_role.items() if size or c == "parameters"}
            shardable.append(sharding.Tensor(t.name, tuple(t.shape), widths, count=t.count))
        expanded = sharding.expand_layers(shardable)
        staged = (expanded, sharding.stage_of_tensors(expanded, p.pipeline))
        if memo is not None:
            memo[("placement", p.pipeline)] = (ids, parameters, staged)  # the parameters too: their ids stay theirs while kept
    result = sharding.shard(staged[0], p, staged[1])
    # a declared activation sits on its layer's stage (by the index in its name), else on the first;
    # a stage keeps the activations of the micro-batches 1F1B has in flight there
    ranges = [r.layers for r in result.stages]
    per_stage = [0] * p.pipeline
    if layout.model_activations is not None:
        activations = [t for t in activations if not (t.path and t.path[0] == "model")]
    for t in activations:
        size = sum(t.bytes.values())
        if t.count > 1 and _per_layer(t.name) and p.pipeline > 1:  # one stage holds every copy (a MoE model's
            # "layer" rows count its sparse layers only, not every layer)
            # one copy per layer (models.hf's "layer: ..." rows): each stage keeps its layers' copies
            for s, (a, b) in enumerate(ranges):
                per_stage[s] += size // t.count * (b - a)
            continue
        index = sharding.layer_of(t.name)
        if index is not None:
            stage = next((s for s, (a, b) in enumerate(ranges) if a <= index < b), 0)
        else:  # before the layers (embeddings) on the first stage, after them (head, loss) on the last
            stage = p.pipeline - 1 if t.name.startswith(("head:", "loss:")) else 0
        per_stage[stage] += size
    devices = []
    for s, r in enumerate(result.stages):
        held = dict(constants)
        for category, size in r.device.items():
            held[FOOTPRINT_CATEGORY.get(category, category)] += size
        held["activations"] += sharding.in_flight(s, p.pipeline, p.gradient_accumulation, p.schedule) * per_stage[s]
        if layout.model_activations is not None:
            held["activations"] += layout.model_activations[s]
        held["total"] = sum(held[c] for c in CATEGORIES)
        devices.append(held)
    return Placement(layout, devices, result, [dict(r.transient) for r in result.stages])

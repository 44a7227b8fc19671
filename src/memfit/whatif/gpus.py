"""`memfit fit --vary gpus` (or `data`): the smallest data-parallel size at which a config passes `memfit
check`, for each data-parallel strategy (plain data parallelism, ZeRO 1-3, FSDP full/hybrid shard, with and
without CPU offload), keeping the config's tensor and pipeline sizes.

Every figure comes from the pipeline: `check.evaluate` on the loaded data with the `parallel` section
replaced; nothing here computes bytes. "Passes" is what `memfit check` says: no error (a near-budget warning
still passes), the per-GPU peak and, under offload, the host memory per node included. The runs of one search
share `evaluate`'s memo: the model's tensors, the training step and its walk, and the per-layer expansion are
computed once (they do not depend on the `parallel` section); each run places the tensors and walks the ranks.

How it searches. A sharded share is about n/d of what one GPU would hold, so a figure is about A + B/d in the
data size d (host memory per node only once a node is full: below that, its GPUs together hold every shard):
the pipeline runs at two sizes from a full node up, that curve gives a guess, and the guess is confirmed exactly (it
passes, the size below it does not); a guess that is off is corrected by doubling and bisection, O(log d)
runs in all. Pass/fail is monotone in d up to the rounding of shards (a d that does not divide a tensor pads
it: a few bytes per rank) and the size 1 (nothing to gather): wherever a size below the answer failed by
less than the largest rise seen between two probed sizes, every size of that stretch is checked, so the
answer is the smallest that passes, not a size bisection happened to land on. `tests/whatif/test_fit_gpus.py`
compares it with a loop over every size through `memfit check`.
"""

from __future__ import annotations

from dataclasses import field

from memfit.check.pipeline import Options, Result, evaluate, gated
from memfit.diagnostics import codes
from memfit.diagnostics.records import record

from memfit.whatif.fit import CLEAR, inline
from memfit.report.commands import REPORTERS as COMMANDS

GPU_VARY = ("gpus", "data")  # the names `--vary` takes for this question
CAP = 1 << 16  # data ranks: a strategy that does not fit here is reported as never fitting
GATES = frozenset({codes.BUDGET_EXCEEDED, codes.HOST_BUDGET_EXCEEDED})  # "does not fit" (any other error: the strategy does not apply)
OWN = ("zero", "fsdp", "offload", "data")  # the keys a strategy sets; tensor, pipeline, sequence_parallel, gpus_per_node, buckets stay

# (name, the parallel keys it sets), in the order the table lists them
STRATEGIES: tuple[tuple[str, dict], ...] = (
    ("data parallel", {}),
    ("ZeRO-1", {"zero": 1}),
    ("ZeRO-1 + offload optimizer", {"zero": 1, "offload": {"optimizer": "cpu"}}),
    ("ZeRO-2", {"zero": 2}),
    ("ZeRO-2 + offload optimizer", {"zero": 2, "offload": {"optimizer": "cpu"}}),
    ("ZeRO-3", {"zero": 3}),
    ("ZeRO-3 + offload optimizer", {"zero": 3, "offload": {"optimizer": "cpu"}}),
    ("ZeRO-3 + offload optimizer, parameters", {"zero": 3, "offload": {"optimizer": "cpu", "parameters": "cpu"}}),
    ("FSDP full_shard", {"fsdp": "full_shard"}),
    ("FSDP full_shard + offload", {"fsdp": "full_shard", "offload": {"parameters": "cpu", "optimizer": "cpu"}}),
    ("FSDP hybrid_shard", {"fsdp": "hybrid_shard"}),
    ("FSDP hybrid_shard + offload", {"fsdp": "hybrid_shard", "offload": {"parameters": "cpu", "optimizer": "cpu"}}),
)


@record(compiled_init=True)
class Row:
    strategy: str
    parallel: dict  # the parallel section at the answer (or the strategy's keys when there is none)
    data: int | None = None  # the smallest data-parallel size that passes; None: none up to CAP, or not applicable
    gpus: int | None = None  # data x tensor x pipeline
    peak: int | None = None  # the gated figure per GPU at that size
    host: int | None = None  # host memory of the most-loaded node (under offload)
    budget: int | None = None
    reason: str | None = None  # why there is no answer
    runs: int = 0
    on_device: dict | None = None  # the GPU's parameters, gradients and optimizer state at the answer (under offload)

    def to_json(self) -> dict:
        return {
            "strategy": self.strategy,
            "parallel": self.parallel,
            "data": self.data,
            "gpus": self.gpus,
            "peak": self.peak,
            "host": self.host,
            "budget": self.budget,
            "reason": self.reason,
        }


@record
class GpuFit:
    path: str
    vary: str
    rows: list[Row] = field(default_factory=list)
    diagnostics: list = field(default_factory=list)
    budget: int | None = None
    tensor: int = 1
    pipeline: int = 1
    runs: int = 0
    usage: bool = False

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "vary": self.vary,
            "tensor": self.tensor,
            "pipeline": self.pipeline,
            "budget": self.budget,
            "strategies": [r.to_json() for r in self.rows],
            "diagnostics": [d.to_json() for d in self.diagnostics],
        }

    @property
    def failed(self) -> bool:
        return any(d.severity == codes.ERROR for d in self.diagnostics) or not any(r.data for r in self.rows)


class Sizes:
    """One strategy's pipeline at data sizes d = step x m, memoized by m."""

    def __init__(self, data: dict, parallel: dict, step: int, options: Options, source: str, memo: dict | None = None) -> None:
        self.data, self.parallel, self.step, self.options, self.source = data, parallel, step, options, source
        self.memo = memo  # check.pipeline.evaluate's: the model's tensors and step, shared by every size and strategy
        self.seen: dict[int, Result] = {}
        self.flat: int | None = None  # set when the figures stop falling with d: the m where that was seen

    def result(self, m: int) -> Result:
        if m not in self.seen:
            self.seen[m] = evaluate({**self.data, "parallel": {**self.parallel, "data": m * self.step}}, self.options, self.source, self.memo)
        return self.seen[m]

    def errors(self, m: int) -> list:
        return [d for d in self.result(m).diagnostics if d.severity == codes.ERROR]

    def passes(self, m: int) -> bool:
        return not self.errors(m)

    def applies(self, m: int) -> bool:
        return all(d.code in GATES for d in self.errors(m))

    def figures(self, m: int) -> tuple[int, int]:
        """(per-GPU gated bytes, host bytes per node): what the two gates compare."""
        result = self.result(m)
        host = result.host
        return gated(result) or 0, host["total"] if host else 0

    def excess(self, m: int) -> int:
        """How far the size is from passing, in bytes (0 when it passes)."""
        if self.passes(m):
            return 0
        result = self.result(m)
        over = max(0, (gated(result) or 0) - (result.budget or 0))
        host, limit = result.host, getattr(result.config, "host_memory", None)
        if host and limit is not None:
            over = max(over, host["total"] - limit)
        return over


def _guess(sizes: Sizes, a: int, b: int) -> int | None:
    """From the figures at a < b, the smallest m where A + B/m is under each gate (None: never)."""
    result = sizes.result(a)
    limits = [result.budget, getattr(result.config, "host_memory", None)]
    guess = b
    for index, limit in enumerate(limits):
        if limit is None:
            continue
        fa, fb = sizes.figures(a)[index], sizes.figures(b)[index]
        if fb <= limit:
            continue
        # f(m) = A + B/m through (a, fa), (b, fb)
        slope = (fa - fb) * a * b  # B * (b - a)
        if slope <= 0:
            return None
        whole = fb - slope // ((b - a) * b)  # A (rounded down)
        if whole >= limit:
            return None
        guess = max(guess, -(-slope // ((b - a) * (limit - whole))))  # ceil(B / (limit - A))
    return guess


def smallest(sizes: Sizes, cap: int, node: int = 4) -> int | None:
    """The smallest m <= cap that passes (None: none does); exact, see the module's docstring. `node` is the
    first m that fills a node: below it a node's host memory holds every shard (it does not fall with d),
    so the curve is fitted from node and 2 x node."""
    if sizes.passes(1):
        return 1
    if cap < 2:
        return None
    a = min(max(4, node), cap)
    if a <= 2 and sizes.passes(2):
        return 2
    low = 2 if a <= 2 else 1  # fails (past a full node, sizes below it are bisected only when it passes)
    high = None  # passes
    if a > low:
        if sizes.passes(a):
            high = a
        else:
            low = a
            b = min(2 * a, cap)
            if b > a:
                if sizes.passes(b):
                    high = b
                else:
                    low = b
                    guess = _guess(sizes, a, b)
                    if guess is None and sizes.figures(a) == sizes.figures(b):
                        sizes.flat = b  # nothing this strategy holds falls with d past a node (replicated, or sharded within a node)
                        return None
                    if guess is None:
                        if not sizes.passes(cap):
                            return None
                        high = cap
                    elif guess > low:
                        guess = min(guess, cap)
                        if sizes.passes(guess):
                            high = guess
                        else:
                            low = guess
    while high is None:  # gallop up
        if low >= cap:
            return None
        candidate = min(low * 2, cap)
        if sizes.passes(candidate):
            high = candidate
        else:
            low = candidate
    while high - low > 1:  # bisection between a failing and a passing size
        middle = (low + high) // 2
        if sizes.passes(middle):
            high = middle
        else:
            low = middle
    return _confirm(sizes, high)


def _confirm(sizes: Sizes, answer: int) -> int:
    """Sizes below the answer that were probed failed. A figure falls with d but may rise a little from one
    size to a larger one (a shard padded to a multiple of d): by at most the largest rise seen between two
    probed sizes, and at least a hundred-thousandth of the budget is allowed for. A size that failed by more than
    that rules out every smaller size; from the largest such size up to the answer, every size is checked."""
    probed = sorted(m for m in sizes.seen if m >= 2)
    jitter = (sizes.result(1).budget or 0) // 100_000
    for x, y in zip(probed, probed[1:]):
        fx, fy = sizes.figures(x), sizes.figures(y)
        jitter = max(jitter, fy[0] - fx[0], fy[1] - fx[1])
    clear = max((m for m in probed if m < answer and sizes.excess(m) > jitter), default=1)
    for m in range(clear + 1, answer):
        if sizes.passes(m):
            return m
    return answer


def _base(data: dict) -> dict:
    parallel = data.get("parallel")
    return {k: v for k, v in parallel.items() if k not in OWN} if isinstance(parallel, dict) else {}


def gpus(checked: Result, vary: str = "gpus", options: Options = Options()) -> GpuFit:
    """The answer for one checked config."""
    out = GpuFit(checked.path, vary)
    out.diagnostics = [d for d in checked.diagnostics if d.code not in CLEAR | GATES]
    if checked.config is None or any(d.severity == codes.ERROR for d in out.diagnostics):
        return out
    out.budget = checked.budget
    data = inline(checked.data, checked.path)
    base = _base(data)
    out.tensor, out.pipeline = int(base.get("tensor", 1)), int(base.get("pipeline", 1))
    per_node = int(base.get("gpus_per_node", 8))
    memo: dict = {}
    for name, keys in STRATEGIES:
        parallel = {**base, **keys}
        step = 1
        if keys.get("fsdp") == "hybrid_shard":  # the world size must be whole nodes
            from math import gcd

            step = per_node // gcd(per_node, out.tensor * out.pipeline)
        sizes = Sizes(data, parallel, step, options, checked.path, memo)
        row = Row(name, parallel)
        if not sizes.applies(1):
            first = sizes.errors(1)[0]
            row.reason = f"does not apply: {first.message}"
        else:
            found = smallest(sizes, CAP // step, -(-per_node // step))
            if found is None and sizes.flat is not None:
                from memfit.diagnostics.units import human

                row.reason = f"no data-parallel size fits: the peak per GPU stays {human(sizes.figures(sizes.flat)[0])} with more GPUs"
            elif found is None:
                row.reason = f"no data-parallel size up to {CAP:,} fits"
            else:
                result = sizes.result(found)
                row.data = found * step
                row.gpus = row.data * out.tensor * out.pipeline
                row.parallel = {**parallel, "data": row.data}
                row.peak = gated(result)
                row.host = result.host["total"] if result.host else None
                if result.host:
                    row.on_device = {c: result.footprint.get(c, 0) for c in ("parameters", "gradients", "optimizer_state")}
        row.budget = sizes.result(1).budget
        row.runs = len(sizes.seen)
        out.runs += row.runs
        out.rows.append(row)
    return out


# the reporters: report/commands.py, the one registry of reporters by command
REPORTERS = COMMANDS["gpus"]

"""The one pipeline every front end calls: path -> text -> data -> schema -> config ->
tensors -> placement -> footprint -> budget -> positioned diagnostics. The CLI, the hook and
the language server are thin shells over `check`; nothing here is computed anywhere else."""

from __future__ import annotations

import gc
from dataclasses import field, replace
from fractions import Fraction

from memfit.diagnostics import codes
from memfit.diagnostics.codes import lookup
from memfit.diagnostics.diagnostic import FILE_START, Diagnostic, Problem, diagnostic
from memfit.diagnostics.records import record
from memfit.read.inputs import DEFAULT_MAX_FILE_SIZE, has_marker, is_config, looks_like_config, read
from memfit.diagnostics.units import with_bytes

__all__ = ["Options", "Result", "check", "check_file", "evaluate", "has_marker", "internal_error", "safe_check"]


@record(frozen=True)
class Options:
    """How a check runs: what the command line (or the API's caller) sets beside the config."""

    budget: int | None = None  # bytes, from --budget: supplies or overrides device.memory - reserve
    warn_at: Fraction | None = None  # overrides device.warn_at
    skip_unrecognized: bool = False  # files that are not memfit configs are skipped, not errors
    max_file_size: int = DEFAULT_MAX_FILE_SIZE  # bytes; a bigger file is an io error, never read
    # native configs (read/native): --input-format, whether a file may be detected as one (not in
    # a directory walk unless the settings include it), and the settings the command line gives
    input_format: str | None = None
    native: bool = True
    walked: frozenset = frozenset()
    settings: bool = True
    device: str | None = None
    gpus: int | None = None
    gpus_per_node: int | None = None
    host_memory: int | None = None
    reserve: object = None
    overhead: object = None
    launch: str | None = None
    model: str | None = None
    online: bool = False  # --online: fetch a model's config.json alone (read/native/resolve.py fetch: the standard library)


@record
class Result:
    """One checked file: its diagnostics, the config its figures came from and the budget they were held to."""

    path: str
    diagnostics: list = field(default_factory=list)
    config: object = None  # config.Config when the footprint could be computed
    budget: int | None = None
    budget_origin: str | None = None  # where the budget comes from, as written: "device.memory 24 GiB - reserve 1 GiB"
    warn_at: Fraction | None = None  # the warning mark in force (--warn-at, device.warn_at or the default)
    skipped: bool = False
    data: object = None
    fixes: list | None = None  # with --suggest: fixes.Fix, cheapest first
    closest: object = None  # with --suggest, when no fix fits: fixes.Closest, what came nearest
    input_format: str | None = "memfit"  # the format the file was read as (read/native.FORMATS); None: not a config
    origins: dict | None = None  # a native config: memfit key path -> the native node it came from
    references: list = field(default_factory=list)  # the other files the check read (absolute): config.json, DeepSpeed JSON, ...
    provenance: dict | None = None  # where the model, the device and the settings came from (read/native/settings.provenance)

    @property
    def footprint(self) -> dict | None:
        return self.config.footprint if self.config is not None else None

    @property
    def parallel_peak(self) -> dict | None:
        """Under a parallel layout: the binding GPU's peak (footprint + what it gathers), its rank and the world size."""
        return self.config.placement.peak if self.config is not None and self.config.placement is not None else None

    @property
    def host(self) -> dict | None:
        """Under offload: the host memory of the most-loaded node (with the saved activations offloaded there)."""
        from memfit.ledger.techniques import activation_offloading

        return activation_offloading.host(self.config) if self.config is not None and self.config.placement is not None else None

    @property
    def peak(self) -> dict | None:
        """{"bytes", "phase", "live"} of a run (a config with a training section), else None; under a
        parallel layout the most-loaded GPU's (with what it gathers, its rank and the world size)."""
        parallel = self.parallel_peak
        if parallel is not None:
            return parallel
        found = getattr(self.config, "peak", None) if self.config is not None else None
        return None if found is None else {"bytes": found["bytes"], "phase": found["phase"], "live": dict(found["live"])}

    @property
    def failed(self) -> bool:
        return any(d.severity == codes.ERROR for d in self.diagnostics)

    @property
    def gated(self) -> int | None:
        """The figure the budget gate compares (`gated`), for the reporters, which read a result and import no stage."""
        return gated(self)


def gated(result: Result) -> int | None:
    """The figure the budget gate compares: the run's peak where there is one, else the total."""
    peak = getattr(result, "peak", None)
    if isinstance(peak, dict) and isinstance(peak.get("bytes"), int):
        return peak["bytes"]
    footprint = result.footprint
    return footprint["total"] if footprint is not None else None


def check(text: str, path: str = "<text>", options: Options = Options()) -> Result:
    """The pipeline, with Python's cyclic garbage collector paused: it builds only acyclic data
    (a big config is millions of dicts, lists and rows), so each collection would walk all of it
    for nothing; 15-20% of a 150,000-tensor check. Anything cyclic is collected after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _check(text, path, options)
    finally:
        if enabled:
            gc.enable()


def _check(text: str, path: str, options: Options) -> Result:
    result = Result(path)
    if options.skip_unrecognized and not has_marker(text) and not _native_wanted(text, path, options):
        result.skipped = True
        return result
    from memfit.read import source  # after the marker test: a skipped file costs no YAML import

    loaded = source.load(text)
    result.diagnostics.extend(loaded.diagnostics)
    data = loaded.data
    if data is None and loaded.diagnostics:
        return result
    if (not is_config(data) or options.input_format not in (None, "memfit")) and _native_wanted(text, path, options):
        native = _read_native(data, path, options)
        if native is not None:
            return _check_native(native, text, options, result)
    if is_config(data) and not path.startswith("<"):  # with --no-settings, the command line's device and host still apply
        return _check_memfit(text, data, path, options, result)
    if not is_config(data):
        if options.skip_unrecognized:
            result.skipped = True
            result.diagnostics.clear()
            return result
        result.input_format = None  # read as no format: json says null, not "memfit"
        what = "the file is empty" if data is None else f"its top level is {_kind(data)}, not a mapping with a 'memfit' key" if not isinstance(data, dict) else "it has no top-level 'memfit' key"
        result.diagnostics.append(diagnostic(FILE_START, codes.NOT_A_CONFIG, f"not a memfit config: {what} (add 'memfit: 1')"))
        return result
    from memfit.read.names import canonical
    from memfit.read.schema import schema

    data = canonical(data, schema())  # enum values without regard to case (FULL_SHARD is full_shard)
    result.data = data
    problems = _with_full_figure(_pipeline(data, options, result), data, options, result)
    unique = not any(lookup(d.code).ambiguous_keys for d in result.diagnostics)
    result.diagnostics.extend(position(text, problems, data, unique_keys=unique))
    result.diagnostics.sort(key=lambda d: (d.range.start_line, d.range.start_character))
    return result


def _native_wanted(text: str, path: str, options: Options) -> bool:
    """Whether a file may be read as a native config: --input-format names one, or the file is
    named on the command line (not found by a directory walk, unless the settings include it)
    and carries a native format's keys."""
    if options.input_format not in (None, "memfit"):
        return True
    if not options.native or options.input_format == "memfit":
        return False
    from memfit.read.native.formats import sniff

    if not sniff(text):
        return False
    if path in options.walked:
        from memfit.read.native import settings

        return settings.included(path, settings.effective(path, options))
    return True


def _read_native(data, path: str, options: Options):
    from memfit.read.native import formats

    return formats.read(data, path, options, forced=options.input_format if options.input_format != "memfit" else None)


def _check_native(native, text: str, options: Options, result: Result) -> Result:
    """A native config: its memfit document through the pipeline, each problem on its native key."""
    from memfit.read.native.position import place

    result.input_format = native.format
    if not native.checkable and options.skip_unrecognized and native.training:
        result.skipped = True
        return result
    result.data, result.references = native.doc, list(native.files)
    result.provenance = native.provenance
    result.origins = {**native.origins, ("memfit",): native.root}  # the marker's place: the file's main key
    problems = _pipeline(native.doc, options, result) if native.checkable and not native.failed else []
    if native.seq_from_data is not None and native.seq_from_data[0] in native.found:
        warning, most = native.seq_from_data
        native.found[native.found.index(warning)] = replace(warning, message=warning.message + _longest_seq(native.doc, options, result, most))
    result.diagnostics.extend(place(native, text, result.path, problems))
    return result


class _SeqProbe:
    """The pipeline at one sequence length (the search's probe: whatif/fit.py's Probe on training.seq_len)."""

    def __init__(self, data: dict, options: Options, path: str) -> None:
        self.data, self.options, self.path, self._seen = data, options, path, {}

    def result(self, value: int) -> Result:
        if value not in self._seen:
            self._seen[value] = evaluate({**self.data, "training": {**self.data["training"], "seq_len": value}}, self.options, self.path)
        return self._seen[value]

    def fits(self, value: int) -> bool:
        result = self.result(value)
        return result.footprint is not None and result.budget is not None and not any(d.code == codes.BUDGET_EXCEEDED for d in result.diagnostics)

    def bytes(self, value: int) -> int | None:
        return gated(self.result(value))


def _longest_seq(data: dict, options: Options, result: Result, most: int) -> str:
    """What to add to the warning of a sequence length left to the data: the longest that fits the budget, as
    `memfit fit --vary seq_len` answers it (the same search on the same document)."""
    if result.config is None or result.budget is None:
        return "; no budget to find the longest sequence that fits (set a device)"
    from memfit.check.search import largest

    longest = largest(_SeqProbe(data, options, result.path))
    if longest == 0:
        return "; not even 1 token fits the budget"
    beyond = f", beyond the model's {most:,}: any length the model takes fits" if longest >= most else ""
    return f"; the longest sequence that fits is {longest:,} tokens{beyond}"


def _check_memfit(text: str, data: dict, path: str, options: Options, result: Result) -> Result:
    """A memfit config with the settings' device and host where it has none of its own; problems
    on a key the settings added are placed on the `memfit` marker."""
    from memfit.read.names import canonical
    from memfit.read.native import settings
    from memfit.read.schema import schema

    data = canonical(data, schema())  # enum values without regard to case (FULL_SHARD is full_shard)
    # the settings' device and host keys where the config says nothing itself (their problems go
    # on the `memfit` marker); the readers are imported only when a project has settings, so a
    # config without (every commit's hook, commonly) costs a few stats
    conf, added, world = settings.effective(path, options), set(), []
    if conf.values:
        from memfit.read.native.run import memfit_defaults, memfit_world

        data, added, world = memfit_world(data, conf)  # --gpus: parallel.data, or a warning where the config states another world
        data, more = memfit_defaults(data, conf)
        added |= more
        result.provenance = settings.provenance(conf, device=("device",) in added)
    result.data = data
    model = data.get("model")
    if isinstance(model, dict) and isinstance(model.get("hf_config"), str):  # the file the model section reads
        import os

        result.references = [os.path.abspath(os.path.join(os.path.dirname(path), os.path.expanduser(model["hf_config"])))]
    problems = world + _with_full_figure(_pipeline(data, options, result), data, options, result)
    if added:
        problems = [Problem(("memfit",), p.code, p.message, p.severity, True, p.file, p.at) if any(p.path[: len(a)] == a for a in added) else p for p in problems]
    unique = not any(lookup(d.code).ambiguous_keys for d in result.diagnostics)
    result.diagnostics.extend(position(text, problems, data, unique_keys=unique))
    result.diagnostics.sort(key=lambda d: (d.range.start_line, d.range.start_character))
    return result


def evaluate(data, options: Options = Options(), path: str = "<data>", memo: dict | None = None) -> Result:
    """The pipeline from loaded data, without positions (each diagnostic at the file start):
    fit and fixes re-run it with one key changed, never re-reading or re-parsing the text.

    `memo` (a dict the caller keeps for one search, empty at first): what does not depend on the
    `parallel` section is computed once for all the runs that share it — the model's tensors, the
    training step and its single-device walk (`_derived`, `_peak`), and the parameters expanded per layer
    (placement.place). The same functions run on
    the same inputs; every figure is the one a fresh run gives."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        result = Result(path, data=data)
        problems = _pipeline(data, options, result, memo)
        result.diagnostics.extend(Diagnostic(FILE_START, p.level, p.code, p.message) for p in problems)
        return result
    finally:
        if enabled:
            gc.enable()


def _pipeline(data: dict, options: Options, result: Result, memo: dict | None = None) -> list[Problem]:
    """schema -> config -> tensors -> placement -> footprint -> budget, on a document that is a config."""
    from memfit.read import schema
    from memfit.check.configure import configure
    from memfit.config.build import optimizer_constants
    from memfit.placement.place import SINGLE, place

    problems = schema.problems(data)
    cfg = None
    if problems:  # every problem at once: what the parts the schema accepts allow (salvage.py)
        from memfit.check.salvage import salvage

        from memfit.models.dispatch import layout_dims, transformer_config

        problems.extend(salvage(data, problems, lambda config, d: _layout_problems(config, layout_dims(transformer_config(d, result.path)))))
    else:
        config, problems = configure(data)
        if "lora" in data or "quantization" in data:
            from memfit.recipe import adapters

            problems.extend(adapters.problems(data))
        if "model" in data:
            emitted, found = _derived(data, config, result.path, memo)
            problems.extend(found)
            config = replace(config, tensors=config.tensors + tuple(emitted.tensors), layers=tuple(emitted.layers), model=emitted.model)
        if config.parallel is not None and _one_gpu(config.parallel):
            config = replace(config, parallel=None)  # one GPU, nothing sharded or offloaded: the single-device step, unchanged
        if config.parallel is not None:
            from memfit.models.dispatch import layout_dims, transformer_config

            cfg = config.model.cfg if config.model is not None else transformer_config(data, result.path)
            problems.extend(_layout_problems(config, layout_dims(cfg)))
        # an unknown optimizer or a layer that cannot apply leaves a number that is not the
        # footprint: report none rather than a wrong one; a bad unit spoils only the budget
        if all(lookup(p.code).keeps_footprint for p in problems):
            config = replace(config, tensors=config.tensors + tuple(optimizer_constants(config)))
            config = replace(config, placement=place(config.tensors, _layout(config, data, cfg, memo) if config.parallel is not None else SINGLE))
            too_large = _too_large(config)
            if too_large is not None:
                problems.append(too_large)
            else:
                # the step's walk (ledger): the peak of one device, or of each rank under a layout
                if "training" in data and not _errors(problems):
                    config, found = _peak(config, data, memo, result.path)
                    problems.extend(found)
                result.config = config
                if not _errors(problems):
                    problems.extend(_budget(config, options, result, data))
                    problems.extend(_host_budget(config))
    return problems


# Every output prints the footprint as an exact integer, and Python converts at most 4,300 digits
# to text (the conversion is quadratic). A footprint past 14,000 bits (about 4,214 digits) leaves
# room for the figures derived from it (per tensor, in training, elements at half a byte each).
MAX_FOOTPRINT_BITS = 14_000


def _too_large(config) -> Problem | None:
    total = config.footprint.get("total", 0)
    if total.bit_length() <= MAX_FOOTPRINT_BITS:
        return None
    biggest = max(config.tensors, key=lambda tensor: sum(tensor.bytes.values()), default=None)
    digits = total.bit_length() * 30103 // 100000 + 1
    message = f"the footprint is a number of about {digits:,} digits: memfit reports footprints of up to about 4,200 digits"
    return Problem(biggest.path if biggest is not None else (), codes.TOO_LARGE, message)


def _errors(problems) -> bool:
    """Anything but a note stops the budget gate (a bad unit keeps the footprint, not the budget)."""
    return any(p.level != codes.INFORMATION for p in problems)


def _with_full_figure(problems: list[Problem], data: dict, options: Options, result: Result) -> list[Problem]:
    """The selective-noop note (models.hf) with what `checkpointing: full` would give: the pipeline once
    more on the document with that one key changed, as `memfit fit` and `--suggest` run it. Only for a
    checked file, never inside a search's runs."""
    at = next((i for i, p in enumerate(problems) if p.code == codes.SELECTIVE_NOOP), None)
    now = gated(result) if at is not None and result.config is not None else None
    if now is None:
        return problems
    from memfit.diagnostics.units import human

    full = evaluate({**data, "training": {**data["training"], "checkpointing": "full"}}, options, result.path)
    then = gated(full)  # None when the changed config has no figure
    if then is None:
        return problems
    what = "peak" if result.peak is not None else "total"
    if then < now:
        figure = f": {what} {human(then)} instead of {human(now)}, {human(now - then)} lower"
    else:
        figure = f", though here it would not lower the {what} ({human(then)} against {human(now)})"
    note = problems[at]
    return problems[:at] + [Problem(note.path, note.code, note.message + figure, note.severity, note.on_key, note.file, note.at)] + problems[at + 1 :]


def _memo_key(data: dict, memo: dict) -> str:
    """What the model's tensors and the training step are a function of: the document without its
    `parallel` section, whether `parallel.zero` is 1 or more (what the recipe reads of that section: a
    `*-mixed` precision is DeepSpeed's 16-bit mode under ZeRO, recipe/precision.engine_precision) and
    `parallel.expert` (a mixture of experts' routed rows under worst-case routing, its all-to-all buffers)."""
    import json

    parallel = data.get("parallel")
    zero = parallel.get("zero") if isinstance(parallel, dict) else None
    zero_on = isinstance(zero, int) and not isinstance(zero, bool) and zero >= 1
    last = memo.get("last key")  # the run before asked for the same document (id: the document is alive while kept)
    if last is not None and last[0] is data:
        return last[1]
    rest = {k: v for k, v in data.items() if k != "parallel"}
    expert = parallel.get("expert") if isinstance(parallel, dict) else None
    key = json.dumps([rest, zero_on, expert], sort_keys=True, default=repr)
    memo["last key"] = (data, key)
    return key


def _derived(data: dict, config, path: str, memo: dict | None) -> tuple:
    """models.dispatch.derive: what the model section emits (its tensors, the transformer's Model) and the
    problems; with a memo, computed once per document-without-`parallel` (_memo_key)."""
    from memfit.models.dispatch import derive

    if memo is None:
        return derive(data, config, path)
    key = ("derive", path, _memo_key(data, memo))
    if key not in memo:
        memo[key] = derive(data, config, path)
    emitted, problems = memo[key]
    return emitted, list(problems)


def _peak(config, data: dict, memo: dict | None = None, path: str = "<data>") -> tuple:
    """A config with a training section describes a run: its step (ledger/training.py, every byte
    priced by the recipe, as the footprint's) and the step's peak: a new Config with them, and the problems."""
    from memfit.check import passes
    from memfit.ledger import passes as ledger_passes
    from memfit.ledger import rewrites
    from memfit.ledger import step as ledger
    from memfit.ledger import training

    training_keys = data.get("training") or {}
    # torch.optim's default is foreach; DeepSpeed's engine steps with its own fused Adam (FusedAdam,
    # or DeepSpeedCPUAdam on the host), in place
    zero = config.parallel is not None and config.parallel.engine == "zero"
    impl = training_keys.get("optimizer_impl", "fused" if zero and config.optimizer.strip().lower() in ("adam", "adamw") else "foreach")
    optimizer = config.optimizer.strip().lower()
    problems = rewrites.problems(config, training_keys) + passes.unplaced(config, training_keys)
    if optimizer not in ledger.OPTIMIZER_TEMPORARIES:
        problems.append(
            Problem(("optimizer",), codes.OPTIMIZER_IMPL, f"the temporaries of {optimizer}'s step are not modelled (recipe/optim.py TEMPORARIES): the peak counts none", severity=codes.INFORMATION)
        )
        optimizer = None
    try:
        if config.parallel is not None:
            # only a parallel layout needs the ranks' programs (ledger/ranks.py and the sharding tables it
            # brings: 4-5 ms of a 90 ms cold check of a config without `parallel`)
            from memfit.ledger import ranks
        if config.parallel is not None and ranks.applies(config):
            # tensor and pipeline parallelism: each stage's rank walks its own program (its shares, its slice, the
            # schedule's micro-batches in flight); the config's step is the binding rank's
            if memo is None:
                programs = ranks.programs(config, data, optimizer, impl)
            else:  # the same for every data-parallel size of a search
                p = config.parallel
                key = ("ranks", path, _memo_key(data, memo), optimizer, impl, p.tensor, p.pipeline, p.sequence_parallel, p.tensor_plan, p.gradient_accumulation)
                if key not in memo:
                    memo[key] = ranks.programs(config, data, optimizer, impl)
                programs = memo[key]
            result, program = ranks.ranks_peak(config, programs, config.granule)
            return replace(config, step=program, placement=config.placement.with_step_peak(result)), problems
        if memo is None:
            step, walks = training.build(config, data, optimizer, impl), None
        else:  # the step is a function of the model's tensors (_derived), the optimizer and the step's kernels
            key = ("step", path, _memo_key(data, memo), optimizer, impl, config.granule)
            if key not in memo:
                memo[key] = (training.build(config, data, optimizer, impl), {})
            step, walks = memo[key]  # its walks, made when first asked for
        if config.parallel is None:
            one = None
            if "teacher" in training_keys and config.model is not None and hasattr(config.model, "cfg"):  # check/passes.py
                step, found = passes.teacher(config, data, step, optimizer, impl, path)
                problems.extend(found)
            elif walks is not None:
                if "one device" not in walks:
                    walks["one device"] = ledger.peak(step, config.granule)
                one = ledger.copied(walks["one device"])
            config = replace(config, step=step, peak=ledger.peak(step, config.granule) if one is None else one)
            if step is not None:   # what a technique's rewrite changed in the saved activations (ledger/rewrites.py)
                config = replace(config, placement=config.placement.with_saved(step.saved_rewritten))
            if step is not None and "teacher" in training_keys:  # its weights are resident: the footprint's too
                config = replace(config, placement=config.placement.with_resident({"parameters": ledger_passes.teacher_weights(step)}))
            if "eval_batch" in training_keys and config.model is not None and hasattr(config.model, "cfg"):
                config = replace(config, peak=passes.evaluation(config, data, config.peak, optimizer, impl))
        elif ranks.data_only(config):
            # data parallelism alone: every rank runs this program, its shares of the parameters, gradients and
            # optimizer state beside it (ZeRO, FSDP: the unit it gathers; DDP: the reducer's buckets)
            result, step = ranks.ranks_peak(config, [step], config.granule, walks)
            config = replace(config, step=step, placement=config.placement.with_step_peak(result).with_saved(step.saved_rewritten))
        else:
            # expert parallelism, or a model ledger.ranks builds no rank's program of: each rank walks the step with
            # its own shares (ledger.step.rank_peak)
            if walks is not None and "walk" not in walks:
                walks["walk"] = ledger.walk(step, config.granule)
            walk = walks["walk"] if walks is not None else None
            config = replace(config, step=step, placement=config.placement.with_step_peak(ledger.rank_peak(step, config.placement, config.granule, walk)))
    except ledger.PeakError as error:
        where = ("training", "optimizer_impl") if "optimizer_impl" in training_keys else ("optimizer",)
        problems.append(Problem(where, codes.OPTIMIZER_IMPL, str(error)))
    return config, problems


def _kind(data) -> str:
    """What the top level is, without quoting it: the file may not be a config at all (a symlink
    to a secret, say), and its content is not the report's to repeat."""
    if isinstance(data, list):
        return "a list"
    if data is None:
        return "empty"
    return f"a scalar ({type(data).__name__})" if not isinstance(data, str) else f"a scalar (a string of {len(data):,} characters)"


def position(text: str, problems: list[Problem], data, unique_keys: bool = False) -> list[Diagnostic]:
    """Positions for all problems in one pass over the text (cut short when it can be: see source.locate)."""
    if not problems:
        return []
    requests = {}
    for problem in problems:
        if problem.path == () and isinstance(data, dict) and "memfit" in data:
            requests[problem] = (("memfit",), "key")  # the document as a whole: its marker
        else:
            requests[problem] = (problem.path, "key" if problem.on_key else "value")
    from memfit.read import source

    ranges = source.locate(text, requests.values(), unique_keys)
    out = []
    for p in problems:
        where = ranges[requests[p]]
        if p.file is None:
            out.append(Diagnostic(where, p.level, p.code, p.message))
        else:  # inside a referenced file: placed there, linked from the key that refers to it
            out.append(Diagnostic(p.at or FILE_START, p.level, p.code, p.message, file=p.file, related=where))
    return out


def _one_gpu(parallel) -> bool:
    """A layout of one GPU that shards, offloads and buckets nothing: the single device itself
    (`parallel: {data: 1}` or `zero: 0` on one GPU change no figure)."""
    return (parallel.world == 1 and not parallel.offload_optimizer and not parallel.offload_parameters
            and not parallel.reduce_bucket and not parallel.allgather_bucket
            # an engine runs as it does on more GPUs: ZeRO's flat gradient partitions, FSDP's all-gathered unit
            and not parallel.zero and parallel.fsdp in (None, "no_shard"))


def _layout(config, data: dict, cfg: dict | None, memo: dict | None = None):
    """The parallel layout; for a transformer, its activations per stage and rank (models.dispatch)."""
    from memfit.models.dispatch import stage_activations
    from memfit.placement.place import Layout

    return Layout(parallel=config.parallel, model_activations=stage_activations(config), memo=memo)


def _layout_problems(config, model: dict) -> list[Problem]:
    """The parallel layout against the model: what cannot run is a positioned bad-parallel."""
    from memfit.placement.sharding import layer_count, problems_for

    model = {k: v for k, v in model.items() if v is not None}
    if config.parallel.pipeline > 1 and "layers" not in model:
        # the layers a pipeline can split: indices in the parameters' names (layers.3.…, h.3.…)
        model["layers"] = layer_count((t.name, t.count) for t in config.tensors if t.category == "parameters")
    if config.parallel.expert > 1 and "experts" not in model:
        from memfit.placement.sharding import EXPERT_TENSOR

        # a model without routed experts (a dense transformer, declared tensors none of which is an expert's)
        if not any(EXPERT_TENSOR.search(t.name) for t in config.tensors if t.category == "parameters"):
            model["experts"] = 0
    return [Problem(path, codes.BAD_PARALLEL, message, on_key=True) for path, message, _ in problems_for(config.parallel, model)]


def _host_budget(config) -> list[Problem]:
    if config.host_memory is None:  # no host budget to hold to (and activation offloading's module not loaded)
        return []
    from memfit.ledger.techniques import activation_offloading

    host = activation_offloading.host(config)
    if host is None or host["total"] <= config.host_memory:
        return []
    gpus = host["gpus"]
    return [
        Problem(
            ("host", "memory"),
            codes.HOST_BUDGET_EXCEEDED,
            f"the {gpus} GPU{'s' if gpus != 1 else ''} of a node offload {with_bytes(host['total'])}, more than host.memory {with_bytes(config.host_memory)} by {with_bytes(host['total'] - config.host_memory)}",
        )
    ]


def _budget(config, options: Options, result: Result, data: dict) -> list[Problem]:
    if options.budget is not None:
        budget, where, origin = options.budget, ("memfit",), "from --budget"
        on_key = True
    elif config.memory is not None:
        budget, on_key = config.budget, False
        device = data["device"]
        where = ("device", "memory") if "memory" in device else ("device", "preset")
        origin = config.memory_origin or f"device.memory {device['memory']}"
        origin += f" - reserve {device['reserve']}" if "reserve" in device else ""
    else:
        at = ("device",) if "device" in data else ("memfit",)
        return [Problem(at, codes.NO_BUDGET, "no memory budget: set device.memory (e.g. '24 GiB'), name the card with device.preset (e.g. 'H100-80GB'), or pass --budget", on_key=True)]
    gated_peak = config.peak if config.peak is not None else config.placement.peak
    if config.overhead and not (gated_peak or {}).get("live", {}).get("overhead"):  # a run's peak holds the overhead; a tensor list's budget loses it
        budget -= config.overhead
        origin += f" - overhead {with_bytes(config.overhead)}"
    warn_at = options.warn_at if options.warn_at is not None else config.warn_at
    result.budget, result.budget_origin, result.warn_at = budget, origin, warn_at
    if budget <= 0:
        return [Problem(where, codes.BAD_BUDGET, f"the budget is {with_bytes(budget)} ({origin}): nothing fits in it", on_key=on_key)]
    parallel = config.placement.peak
    if config.peak is not None:
        from memfit.ledger.step import PHASE_WORDS

        used = config.peak["bytes"]
        what = f"peak {with_bytes(used)} during {PHASE_WORDS[config.peak['phase']]}"
        aside = f" (the four categories at full size total {with_bytes(config.footprint['total'])})"
    elif parallel is not None:  # per GPU: the most-loaded rank, with what it gathers for a moment
        used = parallel["bytes"]
        what = f"GPU rank {parallel['rank']} of {parallel['ranks']}: peak {with_bytes(used)}"
        total = config.footprint["total"]
        if used > total and any((parallel.get("gathered") or {}).values()):  # ZeRO-3, FSDP: a unit gathered at the peak
            aside = f" (on the GPU {with_bytes(total)}, gathered for a moment {with_bytes(used - total)})"
        else:  # a rank that holds a share of the whole (a pipeline stage, a tensor slice): never a negative "gathered"
            aside = f" (the four categories at full size total {with_bytes(total)})" if used != total else ""
    else:
        used = config.footprint["total"]
        what, aside = f"total {with_bytes(used)}", ""
    if used > budget:
        return [
            Problem(
                where,
                codes.BUDGET_EXCEEDED,
                f"{what} exceeds the budget {with_bytes(budget)} ({origin}) by {with_bytes(used - budget)}{aside}",
                on_key=on_key,
            )
        ]
    if used > warn_at * budget:
        share = Fraction(used * 100, budget)
        return [
            Problem(
                where,
                codes.NEAR_BUDGET,
                f"{what} is {float(share):.1f}% of the budget {with_bytes(budget)} ({origin}), above the {float(warn_at * 100):g}% warning mark; headroom {with_bytes(budget - used)}{aside}",
                on_key=on_key,
            )
        ]
    return []


def check_file(path: str, options: Options = Options()) -> Result:
    text, problem, raw = read(path, options.max_file_size)
    if problem is not None:
        # in skip mode an undecodable file is skipped only when it does not even look like a config
        if options.skip_unrecognized and raw and not looks_like_config(raw):
            return Result(path, skipped=True)
        return Result(path, [problem])
    return check(text, path, options)


def safe_check(path: str, options: Options = Options()) -> Result:
    """check_file, with a last line of defence: a bug in memfit is one diagnostic on one
    file, never a traceback that stops the other files from being checked."""
    try:
        return check_file(path, options)
    except Exception as error:  # noqa: BLE001
        return Result(path, [internal_error(error)])


def internal_error(error: Exception) -> Diagnostic:
    """A bug in memfit, as one diagnostic (the CLI and the language server both use it)."""
    message = f"internal error while checking this file ({type(error).__name__}: {error}); please report it"
    return diagnostic(FILE_START, codes.INTERNAL, message)

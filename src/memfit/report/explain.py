"""`memfit explain`: the breakdown a person reads, at 80 columns, colour only on a terminal."""

from __future__ import annotations

from memfit.ledger.step import LIVE_WORDS, PHASE_WORDS, phase_lines, rows_table, summary
from memfit.ledger.timeline import timeline
from memfit.recipe.costs import CATEGORIES
from memfit.recipe.precision import explain_lines
from memfit.report.model_tables import keras_lines, transformer_lines
from memfit.recipe.dtypes import describe
from memfit.report.present import bar, cut, pct, shape_text
from memfit.report.reporters import _entry, diagnostic_line
from memfit.diagnostics.safe_text import printable
from memfit.diagnostics.units import human, with_bytes

WIDTH = 80
TOP_TENSORS = 10


def json_entry(result) -> dict:
    """`explain --format json`'s entry of one file: check's json entry (path, footprint, peak, host,
    budget, diagnostics), the step's `timeline` (ledger.timeline; [] for a config that is not a run)
    and its `rows` (ledger.step.rows_table: per layer, parameters, gradients and saved bytes)."""

    step = getattr(result.config, "step", None) if result.config is not None else None
    rows = rows_table(step) if step is not None else []
    return _entry(result, {"budget": result.budget, "diagnostics": [d.to_json() for d in result.diagnostics], "timeline": timeline(result.config), "rows": rows})


def peak_lines(config, budget) -> list[str]:
    """The run's phases, one bar each (scaled to the budget), which one is the peak, what is live
    in it, and the overhead's named lines."""
    out = [cut(f"{summary(config.peak)}; each phase at its worst:", WIDTH)]
    out += ["  " + line for line in phase_lines(config.peak, budget, WIDTH - 2)]
    if config.overhead_lines or config.overhead:
        granularity = config.peak["phases"][config.peak["phase"]].get("granularity", 0)
        out.append("  overhead, on the device in every phase:")
        for line in config.overhead_lines:
            out.append(f"    {cut(line.name, 52):<52} {human(line.bytes):>11}")
        if not config.overhead_lines:
            out.append(f"    {'device.overhead':<52} {human(config.overhead):>11}")
        if granularity:
            out.append(f"    {'allocator rounding (512-byte blocks), at the peak':<52} {human(granularity):>11}")
    return out


def render(result, colour: bool = False) -> str:
    """The breakdown; every line made printable (names and paths come from the config and the
    file system), except the bar, whose colour is ours."""
    lines: list[str] = []
    bar_line = _render(result, colour, lines)
    return "\n".join(line if i == bar_line else printable(line) for i, line in enumerate(lines)) + "\n"


def _render(result, colour: bool, lines: list[str]) -> int | None:
    out = lines.append
    bar_line = None
    lines.extend(diagnostic_line(result.path, d) for d in result.diagnostics)
    config = result.config
    if config is None:
        out(f"{result.path}: no footprint (fix the errors above)")
        return None
    if lines:
        out("")
    title = printable(f"{config.name} ({result.path})" if config.name else result.path)
    out(cut(title, WIDTH))
    out("=" * min(WIDTH, len(title)))
    out(f"optimizer  {config.optimizer}: {config.states} state tensor{'s' if config.states != 1 else ''} per trainable parameter")
    for category in CATEGORIES:
        w = config.widths[category]
        out(f"{'dtype ' + category:<22} {w.name} ({describe(w.bytes)})")
    out("")

    per_parameter = explain_lines(config, WIDTH)
    if per_parameter:
        lines.extend(per_parameter)
        out("")

    if config.model is not None:
        lines.extend(transformer_lines(config.model, WIDTH, config.widths["parameters"].name))
        out("")

    if config.layers:
        lines.extend(keras_lines(config.layers, WIDTH))
        out("")

    fp = config.footprint
    total = fp["total"]
    if config.placement.sharded is not None:
        lines.extend(parallel_lines(config.placement))
        out("")
        out(f"GPU rank {fp['rank']} of {fp['ranks']} (the most loaded):")
    out(f"{'category':<16} {'bytes':>24} {'':>13} {'share':>7}")
    for category in CATEGORIES:
        out(f"{category:<16} {fp[category]:>24,} {human(fp[category]):>13} {pct(fp[category], total):>7}")
    out(f"{'total':<16} {total:>24,} {human(total):>13}")
    out("")

    peak = config.placement.peak
    if peak is not None and config.placement.step_peak is not None:
        # a run on a data-parallel layout: the step walked on this rank (ledger.step.rank_peak)
        out(f"the step on this rank peaks during {PHASE_WORDS[peak['phase']]}; live then:")
        for category, size in peak["live"].items():
            out(f"{'  ' + LIVE_WORDS[category]:<16} {size:>24,} {human(size):>13}")
        for what, size in peak["gathered"].items():
            out(f"{'    of it ' + what:<26} {size:>14,} {human(size):>13}")
        out(f"{'peak':<16} {peak['bytes']:>24,} {human(peak['bytes']):>13}")
        out("")
        total = peak["bytes"]
    elif peak is not None and peak["gathered"]:
        for what, size in peak["gathered"].items():
            out(f"{'+ ' + what:<28} {size:>12,} {human(size):>13}  (for a moment)")
        out(f"{'peak':<16} {peak['bytes']:>24,} {human(peak['bytes']):>13}")
        out("")
        total = peak["bytes"]
    from memfit.ledger.techniques import activation_offloading

    host = activation_offloading.host(config)
    if host is not None:
        limit = f" of host.memory {with_bytes(config.host_memory)}" if config.host_memory is not None else " (no host.memory to check against)"
        out(f"host memory per node ({host['gpus']} GPUs offloading): {with_bytes(host['total'])}{limit}")
        for category in ("parameters", "gradients", "optimizer_state", "activations"):
            if host.get(category):
                out(f"  {category:<14} {host[category]:>24,} {human(host[category]):>13}")
        out("")

    budget = result.budget
    if budget is not None:
        used = config.peak["bytes"] if config.peak is not None else total  # a run is gated on its peak
        what = "the peak is " if config.peak is not None else ""
        out(f"budget {with_bytes(budget)} ({result.budget_origin})")
        bar_line = len(lines)
        out(bar(used, budget, WIDTH - 2, colour, result.warn_at if result.warn_at is not None else config.warn_at))
        if used > budget:
            out(f"{what}{pct(used, budget)} of the budget: OVER by {with_bytes(used - budget)}")
        else:
            out(f"{what}{pct(used, budget)} of the budget: fits, headroom {with_bytes(budget - used)}")
        out("")

    if config.peak is not None:
        lines.extend(peak_lines(config, budget))
        out("")

    placement = config.placement
    largest = sorted(config.tensors, key=lambda t: sum(placement.of(t).values()), reverse=True)[:TOP_TENSORS]
    if largest:
        whole = " (whole, before sharding)" if placement.sharded is not None else ""
        out(f"largest tensors (of {len(config.tensors):,}), bytes over all their categories{whole}:")
        out(f"  {'name':<26} {'shape':<21} {'count':>6} {'bytes':>11}")
        for t in largest:
            shape = shape_text(t.shape)
            frozen = "" if t.trainable or t.category != "parameters" else " frozen"
            size = sum(placement.of(t).values())
            out(f"  {cut(printable(t.name), 26):<26} {cut(shape, 21):<21} {t.count:>6,} {human(size):>11}{frozen}")
    return bar_line



def parallel_lines(placement) -> list:
    """The per-rank table: each pipeline stage's most-loaded rank, what each category is (sharded,
    replicated, offloaded), and what it gathers for a moment."""
    sharded = placement.sharded
    p = sharded.layout
    engine = f"ZeRO-{p.zero}" if p.engine == "zero" else f"FSDP {p.fsdp}" if p.engine == "fsdp" else "DDP (no sharding)"
    offload = [name for name, on in (("optimizer", p.offload_optimizer), ("parameters", p.offload_parameters)) if on]
    out = [
        f"parallel   {sharded.ranks} GPUs = data {p.data} x tensor {p.tensor} x pipeline {p.pipeline}"
        + (" (sequence parallel)" if p.sequence_parallel else "") + f"; {engine}" + (f"; offload {', '.join(offload)} to the host" if offload else ""),
    ]
    status = sharded.most_loaded.sharded
    if status:
        short = {"parameters": "weights", "gradients": "grads", "grad_accum": "fp32 grads", "master": "master", "optimizer_state": "optimizer"}
        out.append(cut("  over the data ranks: " + ", ".join(f"{short.get(c, c)} {s}" for c, s in status.items()), WIDTH))
    out.append(f"  {'stage':>5} {'rank':>6} {'layers':>9} {'on the GPU':>13} {'gathered':>11} {'peak':>11} {'host':>11}")
    for s, r in enumerate(sharded.stages):
        device = placement.devices[s]["total"]
        gathered = sum(placement.transients[s].values())
        a, b = r.layers
        span = f"{a}-{b - 1}" if b > a else "-"
        # a run on a data-parallel layout: the step's peak on this rank (its transients included)
        walked = placement.step_peak.get("per_rank") if placement.step_peak is not None else None
        top = (walked[s]["bytes"] if walked and len(walked) == len(sharded.stages) else placement.step_peak["bytes"]) if placement.step_peak is not None else device + gathered
        out.append(f"  {s:>5} {r.rank:>6} {span:>9} {human(device):>13} {human(gathered):>11} {human(top):>11} {human(sum(r.host.values())):>11}")
    return out

"""`memfit explain`: the breakdown a person reads, at 80 columns, colour only on a terminal."""

from __future__ import annotations

from .costs import CATEGORIES
from .dtypes import describe
from .present import bar, cut, pct, shape_text
from .reporters import diagnostic_line
from .safe_text import printable
from .units import human, with_bytes

WIDTH = 80
TOP_TENSORS = 10


def peak_lines(config, budget) -> list[str]:
    """The run's phases, one bar each (scaled to the budget), which one is the peak, what is live
    in it, and the overhead's named lines."""
    from .peak import phase_lines, summary

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

    from .precision import explain_lines

    per_parameter = explain_lines(config, WIDTH)
    if per_parameter:
        lines.extend(per_parameter)
        out("")

    if config.model is not None:
        from .models.hf import summary_lines as model_lines

        lines.extend(model_lines(config.model, WIDTH, config.widths["parameters"].name))
        out("")

    if config.layers:
        from .models.keras import summary_lines

        lines.extend(summary_lines(config.layers, WIDTH))
        out("")

    fp = config.footprint
    total = fp["total"]
    out(f"{'category':<16} {'bytes':>24} {'':>13} {'share':>7}")
    for category in CATEGORIES:
        out(f"{category:<16} {fp[category]:>24,} {human(fp[category]):>13} {pct(fp[category], total):>7}")
    out(f"{'total':<16} {total:>24,} {human(total):>13}")
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
        out(f"largest tensors (of {len(config.tensors):,}), bytes over all their categories:")
        out(f"  {'name':<26} {'shape':<21} {'count':>6} {'bytes':>11}")
        for t in largest:
            shape = shape_text(t.shape)
            frozen = "" if t.trainable or t.category != "parameters" else " frozen"
            size = sum(placement.of(t).values())
            out(f"  {cut(printable(t.name), 26):<26} {cut(shape, 21):<21} {t.count:>6,} {human(size):>11}{frozen}")
    return bar_line


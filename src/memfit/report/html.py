"""`memfit explain --format html`: one self-contained HTML file for all the configs given.

Written with the standard library only: the chart is inline SVG drawn here, the styles and the
script are inline and allowed by their hashes in a Content-Security-Policy that forbids every
network request (`default-src 'none'`), and the file names no external URL. Every figure comes
from `explain_entry` (the same dict `explain --format json` prints): the stacked series of the
timeline carry their exact byte counts in `data-values`, the peak and the footprint's total are
printed as exact byte counts beside the rounded GiB, and the breakdowns are tables.
"""

from __future__ import annotations

import base64
import hashlib
import json
from html import escape

from memfit import __version__
from memfit.diagnostics.units import human
from memfit.ledger.step import LIVE, LIVE_WORDS
from memfit.recipe.costs import CATEGORIES

# the chart's geometry (SVG user units); the test reads the same attributes from the DOM
WIDTH, HEIGHT = 960, 320
LEFT, RIGHT, TOP, BOTTOM = 84, 16, 24, 40
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

STYLE = """
:root{color-scheme:light dark;--bg:#fff;--fg:#1b1f24;--muted:#59636e;--grid:#d1d9e0;--panel:#f6f8fa;
--parameters:#4c72b0;--gradients:#dd8452;--activations:#55a868;--optimizer_state:#8172b3;--transient:#c44e52;--overhead:#937860;
--budget:#d1242f;--peak:#1b1f24}
@media (prefers-color-scheme:dark){:root{--bg:#0d1117;--fg:#e6edf3;--muted:#9198a1;--grid:#3d444d;--panel:#151b23;
--parameters:#6d9eeb;--gradients:#f0a36d;--activations:#76c98a;--optimizer_state:#a898e0;--transient:#ef7a7e;--overhead:#c2a58a;
--budget:#ff7b72;--peak:#e6edf3}}
body{background:var(--bg);color:var(--fg);font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1000px;padding:16px}
h1{font-size:20px}h2{font-size:17px;margin-top:32px;border-top:1px solid var(--grid);padding-top:16px}h3{font-size:15px}
table{border-collapse:collapse;margin:8px 0}th,td{padding:2px 10px;text-align:left;border-bottom:1px solid var(--grid)}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}caption{text-align:left;font-weight:600;padding:4px 0}
.muted{color:var(--muted)}.ok{color:var(--activations)}.bad{color:var(--budget);font-weight:600}
svg.chart{width:100%;height:auto;background:var(--panel);border-radius:6px}
svg .grid{stroke:var(--grid);stroke-width:1}svg text{fill:var(--muted);font-size:11px}
svg .budget{stroke:var(--budget);stroke-width:2;stroke-dasharray:6 4}svg text.budget-label{fill:var(--budget)}
svg .peak{stroke:var(--peak);stroke-width:1.5}svg circle.peak{fill:var(--peak)}svg text.peak-label{fill:var(--fg)}
svg .step2{stroke:var(--muted);stroke-dasharray:2 3}svg .overlay{fill:none;stroke:var(--fg);stroke-width:1.5;stroke-dasharray:5 3}
.legend .overlay-key{display:inline-block;width:18px;border-top:2px dashed var(--fg);margin-right:4px;vertical-align:3px}svg .cursor{fill:var(--fg);opacity:.12}
.c-parameters{fill:var(--parameters);background:var(--parameters)}.c-gradients{fill:var(--gradients);background:var(--gradients)}
.c-activations{fill:var(--activations);background:var(--activations)}.c-optimizer_state{fill:var(--optimizer_state);background:var(--optimizer_state)}
.c-transient{fill:var(--transient);background:var(--transient)}.c-overhead{fill:var(--overhead);background:var(--overhead)}
.legend span{display:inline-block;margin-right:14px}.legend i{display:inline-block;width:11px;height:11px;margin-right:4px;border-radius:2px;vertical-align:-1px}
.tip{min-height:3.2em;background:var(--panel);border-radius:6px;padding:6px 10px;margin:6px 0;font-variant-numeric:tabular-nums}
.bar{display:flex;height:14px;width:100%;border-radius:3px;overflow:hidden;background:var(--grid)}.bar i{display:block;height:100%}
details{margin:8px 0}summary{cursor:pointer}
@media print{body{max-width:none;color:#000;background:#fff}.tip,select,.noprint{display:none}svg.chart{background:#fff}
h2{break-before:page}table,svg{break-inside:avoid}}
"""

SCRIPT = """
(function(){
var fmt=function(n){return n.toLocaleString('en-US')};
var gib=function(n){return (n/1073741824).toFixed(2)+' GiB'};
document.querySelectorAll('section.config').forEach(function(sec){
  var data=JSON.parse(sec.querySelector('script.memfit-data').textContent);
  var svg=sec.querySelector('svg.chart');var tip=sec.querySelector('.tip');
  var sel=sec.querySelector('select.rank');
  if(sel){sel.addEventListener('change',function(){sec.querySelectorAll('tr.rank-row').forEach(function(tr){
    tr.hidden=tr.getAttribute('data-rank')!==sel.value&&sel.value!=='all'})});}
  if(!svg||!tip)return;
  var ev=data.timeline,n=ev.length,x0=+svg.getAttribute('data-x0'),w=+svg.getAttribute('data-plot-w');
  var cur=svg.querySelector('.cursor');var words=data.words;
  function show(i){
    if(i<0||i>=n)return;var e=ev[i];cur.setAttribute('x',(x0+i*w/n).toFixed(2));cur.setAttribute('width',(w/n).toFixed(2));
    cur.setAttribute('visibility','visible');svg.setAttribute('data-index',i);
    tip.textContent='';var head=document.createElement('div');
    head.textContent='step '+e.step+' \\u00b7 '+e.phase+' \\u00b7 '+(e.module===null?'(rank '+e.rank+')':e.module)+(e.at?' \\u00b7 '+e.at:'')+': '+fmt(e.bytes)+' B ('+gib(e.bytes)+')';
    head.setAttribute('data-bytes',e.bytes);tip.appendChild(head);
    var body=document.createElement('div');
    Object.keys(e.live).forEach(function(k){if(!e.live[k])return;var s=document.createElement('span');s.className='live';
      s.setAttribute('data-cat',k);s.setAttribute('data-bytes',e.live[k]);s.textContent=words[k]+' '+fmt(e.live[k])+' B   ';body.appendChild(s);});
    tip.appendChild(body);
  }
  function at(evt){var m=svg.getScreenCTM(),p=svg.createSVGPoint();p.x=evt.clientX;p.y=evt.clientY;var q=p.matrixTransform(m.inverse());
    var px=2/m.a;if(q.x<x0-px||q.x>x0+w+px)return -1;
    return Math.min(n-1,Math.max(0,Math.floor((q.x-x0)/(w/n))));}  /* the mouse is in whole pixels: up to two short of either edge is the edge column (columns can be far narrower than a pixel) */
  svg.addEventListener('mousemove',function(evt){show(at(evt))});
  svg.addEventListener('keydown',function(evt){var i=+(svg.getAttribute('data-index')||-1);
    if(evt.key==='ArrowRight'){show(Math.min(n-1,i+1));evt.preventDefault()}if(evt.key==='ArrowLeft'){show(Math.max(0,i-1));evt.preventDefault()}});
});
})();
"""


def _hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


CSP = "default-src 'none'; script-src " + _hash(SCRIPT) + "; style-src " + _hash(STYLE) + "; img-src 'none'; connect-src 'none'; font-src 'none'; base-uri 'none'; form-action 'none'"


def _bytes_cell(n: int | None) -> str:
    if n is None:
        return '<td class="n">—</td><td class="n">—</td>'
    return f'<td class="n" data-bytes="{n}">{n:,}</td><td class="n">{escape(human(n))}</td>'


def _gib(n: int) -> str:
    return f"<b data-bytes=\"{n}\">{n:,} B</b> ({escape(human(n))})"


def render(results, entries: list[dict], before: list | None = None, heading: str = "") -> str:
    """The report of `results` (pipeline Results), whose json entries (explain_entry) are `entries`.
    `before`: for `memfit diff --format html`, per result (label, the json entry at the revision or None),
    drawn over each timeline as a dashed line."""
    before = before or [None] * len(results)
    sections = [_section(i, r, e, b) for i, (r, e, b) in enumerate(zip(results, entries, before))]
    index = "".join(f'<li><a href="#cfg{i}">{escape(e["path"])}</a></li>' for i, e in enumerate(entries))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        '<meta name="color-scheme" content="light dark">'
        f"<title>memfit report</title><style>{STYLE}</style></head><body>"
        f"<h1>memfit report</h1>{heading}<p class=\"muted\">memfit {escape(__version__)}: the memory of each config's training step, computed before the run. "
        "Hover the timeline (or focus it and use the arrow keys) for the bytes at each event.</p>"
        f"<ul class=\"noprint\">{index}</ul>" + "".join(sections) + f"<script>{SCRIPT}</script></body></html>\n"
    )


def _section(i: int, result, entry: dict, before=None) -> str:
    out = [f'<section class="config" id="cfg{i}" data-path="{escape(entry["path"])}">']
    config = result.config
    title = f"{config.name} ({entry['path']})" if config is not None and config.name else entry["path"]
    out.append(f"<h2>{escape(title)}</h2>")
    for d in entry["diagnostics"]:
        r = d["range"]["start"]
        out.append(f'<p class="{"bad" if d["severity"] == "error" else "muted"}">{escape(d["severity"])}[{escape(d["code"])}] line {r["line"] + 1}:{r["character"] + 1}: {escape(d["message"])}</p>')
    if config is None:
        out.append("<p>No footprint: fix the errors above.</p></section>")
        return "".join(out)
    out.append(_summary(result, entry))
    if before is not None:
        out.append(_before(*before, entry))
    out.append(_chart(entry, before))
    out.append(_footprint_table(entry))
    if config.placement is not None and config.placement.sharded is not None:
        out.append(_ranks(config.placement))
    if entry.get("host"):
        out.append(_host(entry["host"], config))
    out.append(_layers(config))
    out.append(_per_parameter(config))
    data = {"timeline": entry["timeline"], "words": LIVE_WORDS, "peak": entry.get("peak"), "budget": entry.get("budget")}
    out.append('<script type="application/json" class="memfit-data">' + json.dumps(data, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026") + "</script>")
    out.append("</section>")
    return "".join(out)


def _summary(result, entry: dict) -> str:
    fp, peak, budget = entry["footprint"], entry.get("peak"), entry.get("budget")
    rows = [f"<tr><th scope=\"row\">footprint total</th><td class=\"footprint-total\">{_gib(fp['total'])}</td></tr>"]
    if peak is not None:
        where = f" on GPU rank {peak['rank']} of {peak['ranks']}" if "rank" in peak else ""
        rows.append(f"<tr><th scope=\"row\">peak</th><td class=\"peak-bytes\">{_gib(peak['bytes'])} during {escape(peak['phase'].replace('_', ' '))}{where}</td></tr>")
    used = peak["bytes"] if peak is not None else fp["total"]
    if budget is not None:
        verdict = f'<span class="ok">fits, headroom {budget - used:,} B ({escape(human(budget - used))})</span>' if used <= budget else f'<span class="bad">OVER by {used - budget:,} B ({escape(human(used - budget))})</span>'
        rows.append(f"<tr><th scope=\"row\">budget</th><td class=\"budget-bytes\">{_gib(budget)} ({escape(result.budget_origin or '')}): {verdict}</td></tr>")
    return "<table class=\"summary\"><caption>Summary</caption>" + "".join(rows) + "</table>"


def _before(label: str, old: dict | None, entry: dict) -> str:
    """`memfit diff --format html`: the revision's peak and total beside the working tree's."""
    if old is None:
        return f"<p class=\"before\">Not at {escape(label)}: the config is new.</p>"
    rows = []
    for what, now, then in (("footprint total", entry["footprint"]["total"], (old.get("footprint") or {}).get("total")),
                            ("peak", (entry.get("peak") or {}).get("bytes"), (old.get("peak") or {}).get("bytes"))):
        if now is None or then is None:
            continue
        change = now - then
        rows.append(f"<tr><th scope=\"row\">{what}</th>{_bytes_cell(then)}{_bytes_cell(now)}<td class=\"n\" data-bytes=\"{change}\">{change:+,}</td></tr>")
    head = (f'<thead><tr><th scope="col"></th><th scope="col" class="n">at {escape(label)}</th><th scope="col" class="n"></th>'
            '<th scope="col" class="n">now</th><th scope="col" class="n"></th><th scope="col" class="n">change (bytes)</th></tr></thead>')
    return f'<table class="before"><caption>Against {escape(label)}</caption>{head}<tbody>{"".join(rows)}</tbody></table>'


def _chart(entry: dict, before=None) -> str:
    events = entry["timeline"]
    budget = entry.get("budget")
    if not events:
        return _footprint_chart(entry)
    n = len(events)
    old = (before[1] or {}).get("timeline") if before is not None else None
    top = max(max(e["bytes"] for e in events), budget or 0, *(e["bytes"] for e in old or ()))
    ymax = _nice(top)
    col = PLOT_W / n

    def y(b: int) -> float:
        return TOP + PLOT_H * (1 - b / ymax)

    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" tabindex="0" aria-label="memory over the training step, stacked by category" '
        f'data-x0="{LEFT}" data-y0="{TOP}" data-plot-w="{PLOT_W}" data-plot-h="{PLOT_H}" data-ymax="{ymax}" data-events="{n}">'
    ]
    parts.extend(_axis(ymax, y))
    # the stacked series: one step-shaped area per category, its exact values in data-values. Each
    # area is drawn from its stack's top down to zero, the highest first, so each lower one covers
    # the part below it (half the path of a band between two edges)
    present = [c for c in LIVE if any(e["live"].get(c) for e in events)]
    tops, running = {}, [0] * n
    for c in present:
        running = [r + e["live"].get(c, 0) for r, e in zip(running, events)]
        tops[c] = running
    for c in reversed(present):
        values = [e["live"].get(c, 0) for e in events]
        d = [f"M{LEFT},{y(0):.1f}"]
        for i, top in enumerate(tops[c]):
            d.append(f"V{y(top):.1f}H{LEFT + (i + 1) * col:.1f}")
        parts.append(f'<path class="series c-{c}" data-category="{c}" data-values="{" ".join(map(str, values))}" d="{"".join(d)}V{y(0):.1f}Z"><title>{escape(LIVE_WORDS[c])}</title></path>')
    if old:  # the revision's total, stretched over the same width (its events may be more or fewer)
        width = PLOT_W / len(old)
        d = [f"M{LEFT},{y(old[0]['bytes']):.1f}"] + [f"V{y(e['bytes']):.1f}H{LEFT + (i + 1) * width:.1f}" for i, e in enumerate(old)]
        parts.append(f'<path class="overlay" data-values="{" ".join(str(e["bytes"]) for e in old)}" d="{"".join(d)}"><title>total at {escape(before[0])}</title></path>')
    # where the second (warm) step begins
    second = next((i for i, e in enumerate(events) if e["step"] == 2), None)
    if second:
        x = LEFT + second * col
        parts.append(f'<line class="step2" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{TOP + PLOT_H}"/>')
        parts.append(f'<text x="{LEFT + 4}" y="{TOP + PLOT_H + 14}">step 1 (first: no optimizer state yet)</text>')
        parts.append(f'<text x="{x + 4:.1f}" y="{TOP + PLOT_H + 14}">step 2 (warm)</text>')
    parts.append(f'<text x="{LEFT}" y="{HEIGHT - 6}">forward → loss → backward → optimizer, per step ({n} events)</text>')
    if budget is not None:
        parts.append(f'<line class="budget" x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{y(budget):.2f}" y2="{y(budget):.2f}" data-bytes="{budget}"/>')
        parts.append(f'<text class="budget-label" x="{LEFT + PLOT_W - 4}" y="{y(budget) - 4:.1f}" text-anchor="end">budget {escape(human(budget))}</text>')
    peak = entry.get("peak")
    if peak is not None:
        i = peak_index(events, peak)
        x = LEFT + (i + 0.5) * col
        label = f"peak {human(peak['bytes'])}: {peak['phase'].replace('_', ' ')}" + (f", {events[i]['module']}" if events[i]["module"] else "")
        # the label stays inside its step's columns (the warm step's, from the line where it begins)
        start = LEFT + (second or 0) * col if events[i]["step"] == 2 else LEFT
        end = LEFT + second * col if events[i]["step"] == 1 and second else LEFT + PLOT_W
        lx, anchor, label = label_place(label, x, start, end)
        parts.append(f'<g class="peak-marker" data-index="{i}" data-bytes="{peak["bytes"]}" data-step-x0="{start:.1f}" data-step-x1="{end:.1f}">'
                     f'<line class="peak" x1="{x:.2f}" x2="{x:.2f}" y1="{TOP + PLOT_H}" y2="{y(peak["bytes"]):.2f}"/>'
                     f'<circle class="peak" cx="{x:.2f}" cy="{y(peak["bytes"]):.2f}" r="3.5"/>'
                     f'<text class="peak-label" x="{lx:.1f}" y="{max(TOP + 10, y(peak["bytes"]) - 6):.1f}" text-anchor="{anchor}">{escape(label)}</text></g>')
    parts.append(f'<rect class="cursor" x="{LEFT}" y="{TOP}" width="0" height="{PLOT_H}" visibility="hidden"/>')
    parts.append("</svg>")
    legend = "".join(f'<span><i class="c-{c}"></i>{escape(LIVE_WORDS[c])}</span>' for c in present)
    if old:
        legend += f'<span><i class="overlay-key"></i>total at {escape(before[0])}</span>'

    peak_text = ""
    if peak is not None:
        e = events[peak_index(events, peak)]
        breakdown = ", ".join(f"{escape(LIVE_WORDS[k])} {v:,} B" for k, v in peak["live"].items() if v)
        peak_text = f"<p class=\"peak-text\">The peak, {peak['bytes']:,} B ({escape(human(peak['bytes']))}), is in step {e['step']}'s {escape(e['phase'])}" + (f" at {escape(e['module'])}" if e["module"] else "") + f": {breakdown}.</p>"
    return ("<h3>Timeline</h3>" + "".join(parts) + f'<div class="legend">{legend}</div>'
            + '<div class="tip" role="status" aria-live="polite">Hover the chart for the bytes live at each event.</div>' + peak_text)


# the widest an 11px system-ui glyph is drawn (SVG user units), for placing a label without measuring it
CHAR_W = 7


def label_place(label: str, x: float, start: float, end: float) -> tuple:
    """(x, text-anchor, label) for a label about the point x that stays within [start, end]: to its right, else
    to its left, else centred in the span, shortened to fit."""
    room = int((end - start - 8) // CHAR_W)
    if len(label) > room:
        label = label[: max(1, room - 1)] + "…"
    width = len(label) * CHAR_W
    if x + 6 + width <= end:
        return x + 6, "start", label
    if x - 6 - width >= start:
        return x - 6, "end", label
    return (start + end) / 2, "middle", label


def _unit(ymax: int) -> tuple:
    """The one unit an axis up to ymax is labelled in: (name, bytes)."""
    for name, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if ymax >= size:
            return name, size
    return "B", 1


def _axis(ymax: int, y) -> list:
    """Grid lines and the y axis' labels, every label in the same unit (the axis top's)."""
    name, size = _unit(ymax)
    out = []
    for k in range(5):
        b = ymax * k // 4
        hundredths = (b * 100 + size // 2) // size  # integer arithmetic, as units.human
        text = f"{hundredths // 100:,}.{hundredths % 100:02d} {name}" if size > 1 else f"{b:,} B"
        out.append(f'<line class="grid" x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{y(b):.1f}" y2="{y(b):.1f}"/>')
        out.append(f'<text class="axis" x="{LEFT - 6}" y="{y(b) + 4:.1f}" text-anchor="end" data-bytes="{b}">{escape(text)}</text>')
    return out


def _footprint_chart(entry: dict) -> str:
    """A config without `training` describes tensors, not a run: its footprint as one stacked bar (every category at
    full size), against the budget, on the timeline's axis."""
    fp, budget = entry["footprint"], entry.get("budget")
    ymax = _nice(max(fp["total"], budget or 0))

    def y(b: int) -> float:
        return TOP + PLOT_H * (1 - b / ymax)

    parts = [f'<svg class="chart footprint-chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="the footprint, stacked by category" '
             f'data-x0="{LEFT}" data-y0="{TOP}" data-plot-w="{PLOT_W}" data-plot-h="{PLOT_H}" data-ymax="{ymax}">']
    parts.extend(_axis(ymax, y))
    x0, w = LEFT + PLOT_W / 3, PLOT_W / 3
    running = 0
    for c in CATEGORIES:
        size = fp.get(c, 0)
        if not size:
            continue
        parts.append(f'<rect class="series c-{c}" data-category="{c}" data-values="{size}" x="{x0:.1f}" width="{w:.1f}" '
                     f'y="{y(running + size):.2f}" height="{y(running) - y(running + size):.2f}"><title>{escape(c.replace("_", " "))} {size:,} B</title></rect>')
        running += size
    if budget is not None:
        parts.append(f'<line class="budget" x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{y(budget):.2f}" y2="{y(budget):.2f}" data-bytes="{budget}"/>')
        parts.append(f'<text class="budget-label" x="{LEFT + PLOT_W - 4}" y="{y(budget) - 4:.1f}" text-anchor="end">budget {escape(human(budget))}</text>')
    parts.append(f'<text x="{LEFT}" y="{HEIGHT - 6}">the footprint: no <tspan font-style="italic">training</tspan> section, so every category at full size (no step to walk)</text>')
    parts.append("</svg>")
    legend = "".join(f'<span><i class="c-{c}"></i>{escape(c.replace("_", " "))}</span>' for c in CATEGORIES if fp.get(c))
    return "<h3>Footprint</h3>" + "".join(parts) + f'<div class="legend">{legend}</div>'


def peak_index(events: list[dict], peak: dict) -> int:
    """The event the peak is: the warm step's (step 2) first event of the peak's bytes."""
    for i, e in enumerate(events):
        if e["step"] == 2 and e["bytes"] == peak["bytes"]:
            return i
    return max(range(len(events)), key=lambda i: (events[i]["bytes"], i))


def _nice(top: int) -> int:
    """The y axis' top: four grid steps of a round size in binary units (1, 2, 2.5 or 5 x 10^j KiB, MiB,
    GiB...), the smallest that leaves 5% above `top` (exact integers; 25 GiB steps keep an 80 GiB card's axis at 100
    GiB, not 200)."""
    steps = sorted(m * 1024**k for k in range(7) for m in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500))
    return 4 * next((s for s in steps if 4 * s * 20 >= max(top, 1) * 21), steps[-1] * -(-top // steps[-1]))


def _footprint_table(entry: dict) -> str:
    fp = entry["footprint"]
    rows = "".join(f"<tr><th scope=\"row\">{escape(c.replace('_', ' '))}</th>{_bytes_cell(fp[c])}</tr>" for c in CATEGORIES)
    rows += f"<tr><th scope=\"row\">total</th>{_bytes_cell(fp['total'])}</tr>"
    where = f" (GPU rank {fp['rank']} of {fp['ranks']}, the most loaded)" if "rank" in fp else ""
    return (f'<table class="footprint"><caption>Footprint: every category at full size{escape(where)}</caption>'
            f'<thead><tr><th scope="col">category</th><th scope="col" class="n">bytes</th><th scope="col" class="n">rounded</th></tr></thead><tbody>{rows}</tbody></table>')


def _ranks(placement) -> str:
    sharded = placement.sharded
    order = sorted(range(len(placement.devices)), key=lambda s: s != placement.binding)
    options = "".join(f'<option value="{sharded.stages[s].rank}">rank {sharded.stages[s].rank} (stage {s}){" — binding" if s == placement.binding else ""}</option>' for s in order)
    rows = []
    for s in order:
        r = sharded.stages[s]
        device = placement.devices[s]["total"]
        gathered = sum(placement.transients[s].values())
        a, b = r.layers
        span = f"{a}–{b - 1}" if b > a else "—"
        rows.append(f'<tr class="rank-row" data-rank="{r.rank}"><th scope="row">{r.rank}{" (binding)" if s == placement.binding else ""}</th><td>{s}</td><td>{span}</td>'
                    f"{_bytes_cell(device)}{_bytes_cell(gathered)}{_bytes_cell(device + gathered)}</tr>")
    return ('<h3>Per rank</h3><p>Each pipeline stage\'s most-loaded rank; the binding one (the GPU that must fit) first. '
            f'<label class="noprint">Show <select class="rank"><option value="all">all ranks</option>{options}</select></label></p>'
            '<table class="ranks"><caption>Bytes per GPU</caption><thead><tr><th scope="col">rank</th><th scope="col">stage</th><th scope="col">layers</th>'
            '<th scope="col" class="n">on the GPU</th><th scope="col" class="n"></th><th scope="col" class="n">gathered for a moment</th><th scope="col" class="n"></th>'
            '<th scope="col" class="n">peak</th><th scope="col" class="n"></th></tr></thead><tbody>' + "".join(rows) + "</tbody></table>")


def _host(host: dict, config) -> str:
    rows = "".join(f"<tr><th scope=\"row\">{escape(c.replace('_', ' '))}</th>{_bytes_cell(host[c])}</tr>" for c in ("parameters", "gradients", "optimizer_state") if host.get(c))
    rows += f"<tr><th scope=\"row\">total</th>{_bytes_cell(host['total'])}</tr>"
    limit = f"; host.memory {config.host_memory:,} B ({escape(human(config.host_memory))})" if config.host_memory is not None else ""
    return f'<h3>Host memory</h3><table class="host"><caption>Offloaded, per node ({host["gpus"]} GPUs){limit}</caption><tbody>{rows}</tbody></table>'


def _layers(config) -> str:
    """Per module: parameter bytes and the activations it saves for backward, from the ledger's rows."""
    step = getattr(config, "step", None)
    if step is None or not step.rows:
        return ""
    from memfit.ledger.timeline import module_namer

    name = module_namer(config)
    table: dict = {}
    seen: set = set()
    for row in step.rows:
        module = name(row.name)
        params, saved = table.get(module, (0, 0))
        own = [t for t in row.kept if t not in seen and t not in step.batch]
        seen.update(row.kept)
        table[module] = (params + sum(row.params) + sum(row.frozen), saved + sum(step.tensors[t] for t in own))
    rows = "".join(f"<tr><th scope=\"row\">{escape(m)}</th>{_bytes_cell(p)}{_bytes_cell(s)}</tr>" for m, (p, s) in table.items())
    return ('<h3>Per layer</h3><details open><summary>parameters and saved activations of each module, in forward order</summary>'
            '<table class="layers"><caption>Per module (bytes on the device)</caption><thead><tr><th scope="col">module</th>'
            '<th scope="col" class="n">parameters</th><th scope="col" class="n"></th><th scope="col" class="n">saved activations</th><th scope="col" class="n"></th></tr></thead>'
            f"<tbody>{rows}</tbody></table></details>")


def _per_parameter(config) -> str:
    from memfit.recipe.precision import explain_view

    view = explain_view(config)
    if view is None:
        return ""
    rows, every, trainable = view
    body = "".join(
        f"<tr><th scope=\"row\">{escape(r.category.replace('_', ' '))}</th><td>{escape(r.label)}</td><td>{escape(str(r.dtype))}</td>"
        f"<td class=\"n\">{float(r.per_parameter):.4f}</td>{_bytes_cell(r.bytes)}<td>{escape(r.origin)}</td></tr>"
        for r in rows
    )
    return (f'<h3>Bytes per parameter</h3><table class="per-parameter"><caption>{every:,} parameters, {trainable:,} trainable (gradients and state per trainable parameter)</caption>'
            '<thead><tr><th scope="col">category</th><th scope="col">tensor</th><th scope="col">dtype</th><th scope="col" class="n">bytes / parameter</th>'
            f'<th scope="col" class="n">bytes</th><th scope="col" class="n"></th><th scope="col">from</th></tr></thead><tbody>{body}</tbody></table>')


def render_diff(comparison, entry) -> str:
    """`memfit diff REV --format html`: the working tree's report of each config, the revision's
    timeline drawn over it. `entry` makes a json entry of a pipeline Result (explain_entry)."""
    label = comparison.base
    results, entries, before, gone = [], [], [], []
    for e in comparison.entries:
        if e.after.result is None:
            gone.append(e.path)
            continue
        results.append(e.after.result)
        entries.append(entry(e.after.result))
        old = e.before.result
        before.append((label, entry(old) if old is not None and old.config is not None else None))
    heading = f"<p>Against <code>{escape(label)}</code> ({escape(comparison.commit[:12])}): the dashed line is each config's total there.</p>"
    if gone:
        heading += "<p>Removed since then: " + ", ".join(f"<code>{escape(p)}</code>" for p in gone) + ".</p>"
    return render(results, entries, before, heading)

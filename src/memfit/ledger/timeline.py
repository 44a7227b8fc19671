"""The step as a series of events: what is live at each module boundary, for a picture of memory over time.

`step.phases(step, trace)` walks one warm training step and lists every moment it considers
(forward at each row, the loss, backward at each row in reverse, the optimizer step) and the row
boundaries between them. This module turns that walk into the timeline `memfit explain --format json|html` publishes:

    {"step": 1|2, "phase": "forward"|"loss"|"backward"|"optimizer", "module": <name>,
     "at": "pre-forward"|"post-forward"|"pre-backward"|"post-backward"|None, "bytes": int, "live": {...}}

- Two steps. Step 2 is the warm step the peak describes (the optimizer state exists from the
  start). Step 1 is the first step of a run: the same walk without the optimizer state until
  `optimizer.step()` creates it (torch.optim allocates its state lazily, in its first step),
  so its forward and backward are lower by the state's bytes and its optimizer moment is the
  warm one. The largest `bytes` over both steps is therefore the warm step's peak, `peak.bytes`.
- Module names are the model's own: a transformer's module paths (`model.embed_tokens`,
  `model.layers.3`, `lm_head`: the ledger models each layer as four rows, its attention, o_proj,
  MLP and down projection, and they all belong to the layer's module), a Keras-form layer's
  name, `declared tensors` for the tensors a config lists by hand; the loss and the optimizer
  step are `loss` and `optimizer`.
- The events are the walk's own instants (`step.phases`' trace, the walk that gives `peak.bytes`): its moments
  and the row boundaries it passes, with its live bytes there (gradients accumulated by earlier micro-batches
  included). `at`: a module's first row's pre-forward boundary is its pre-forward; its last row's forward moment
  its post-forward (its output just written); in backward its first row's pre-backward and its last row's
  post-backward boundaries. A moment inside a module (the worst moment of a transformer layer's attention, say)
  has `at` None. A decoder's final norm (`model.norm`, `transformer.ln_f`) and its head (`lm_head`) are rows of
  their own, each with its four edges; an encoder-decoder's final norm and head are one row (the norm's
  pre-forward and post-backward are that row's, the head's post-forward and pre-backward).
- With an allocator granule (`overhead: auto` on a preset), each moment's rounding (every live
  tensor up to 512 bytes) is added to its overhead, as `step.peak` adds it to each phase.

Under a parallel layout the timeline is the binding rank's program, the warm step, each event with its `rank`: under
tensor or pipeline parallelism the binding stage's own program walked as ledger.ranks walks it for the peak
(`ranks.binding_trace`: each phase from the program the schedule runs then, with the other micro-batches in flight,
the loader's batch, the receive buffers, the data-parallel shares and gathered units), otherwise each instant of the
single-device walk as the binding rank holds it (`step.rank_trace`, by the rule of rank_peak). Either way its
largest event is the peak.
"""

from __future__ import annotations

import re
from dataclasses import replace

from memfit.ledger import ranks
from memfit.ledger.step import LIVE, phases, rank_trace, rounded
from memfit.ledger.training import FINAL_NORM, final_norm

PHASE = {"forward": "forward", "backward": "backward", "optimizer_step": "optimizer"}
AT = ("pre-forward", "post-forward", "pre-backward", "post-backward")
_HF_ROW = re.compile(r"^layer (\d+) ")
_KERAS_ROW = re.compile(r"^(.*) \([A-Za-z0-9_]+\)$")


def module_namer(config):
    """row name -> the model's own module name, for the config's model."""
    model = getattr(config, "model", None)
    cfg = getattr(model, "cfg", None)
    step = getattr(config, "step", None)
    own_norm = step is not None and any(r.name == FINAL_NORM for r in step.rows)
    return hf_namer(cfg, own_norm) if cfg is not None else keras_namer


def hf_namer(cfg: dict, own_norm: bool = True):
    """A transformer's rows -> transformers' module paths (embeddings, each layer, the final norm, the head).
    `own_norm`: the final norm is a row of its own (training.FINAL_NORM); otherwise the head row is the final norm
    (an encoder-decoder's), then the output layer."""
    from memfit.models import hf_encdec
    from memfit.models.hf import module_tree  # the transformers module tree: embeddings first, the head last

    stacked = hf_encdec.is_stacked(cfg)
    if stacked:  # an encoder-decoder: the step's layers are both stacks' (encoder.block.i, then decoder.block.j)
        first, norm, last = hf_encdec.outer_modules(cfg)
        own_norm = False
    else:
        before, layers, _, after, _ = module_tree(cfg)
        first, last = before[0].path, after[-1].path
        norm = final_norm(cfg) or last

    def name(row: str, edge: str | None = None) -> str:
        m = _HF_ROW.match(row)
        if m:
            return hf_encdec.layer_module(cfg, int(m.group(1))) if stacked else f"{layers}.{m.group(1)}"
        if row == "head":
            # a head row that includes the final norm: its start (pre-forward) and its end in backward
            # (post-backward) are the norm's
            return norm if not own_norm and edge in ("pre-forward", "post-backward") else last
        return {"embeddings": first, FINAL_NORM: norm}.get(row, row)

    return name


def keras_namer(row: str, edge: str | None = None) -> str:
    """A Keras-form row ("stem (Conv2D)") -> the layer's name."""
    m = _KERAS_ROW.match(row)
    return m.group(1) if m else row


def _moments(step, granule):
    """The walk's own trace (step.phases): its moments (edge None) and the row boundaries it passes, each with
    its allocator rounding added to the overhead (the rounded step walked the same way, instant by instant)."""
    exact: list = []
    phases(step, exact, edges=True)
    exact = [(phase, at, where, live) for phase, at, live, where in exact]
    if not granule:
        return exact
    coarse: list = []
    phases(rounded(step, granule), coarse, edges=True)
    out = []
    for (phase, at, edge, live), (_, _, live_coarse, _) in zip(exact, coarse):
        live = dict(live)
        live["overhead"] += sum(live_coarse.values()) - sum(live.values())
        out.append((phase, at, edge, live))
    return out


def _events(moments, number: int, namer) -> list[dict]:
    """One step's events. A module of several rows (a transformer layer's four) takes its first
    row's pre- and its last row's post- edge; the moments between are inside it (at None)."""
    out: list[dict] = []
    first, last = {}, {}
    for i, (phase, at, _, _) in enumerate(moments):
        if phase in ("forward", "backward") and at != "loss":
            key = (phase, namer(at))
            first.setdefault(key, i)
            last[key] = i
    for i, (phase, at, edge, live) in enumerate(moments):
        live = {k: live[k] for k in LIVE}
        if phase == "optimizer_step":
            out.append(_event(number, "optimizer", "optimizer", None, live))
        elif at == "loss":
            out.append(_event(number, "loss" if phase == "forward" else "backward", "loss", None, live))
        else:
            module = namer(at)
            if phase == "forward" and edge is None and last[(phase, module)] == i:
                edge = "post-forward"  # the ledger's moment after a row: its output just written
            pre = edge is not None and edge.startswith("pre-")
            if edge is None or (pre and first[(phase, module)] == i) or (not pre and last[(phase, module)] == i):
                out.append(_event(number, phase, namer(at, edge) if edge else module, edge, live))
    return out


def _event(number, phase, module, at, live) -> dict:
    return {"step": number, "phase": phase, "module": module, "at": at, "bytes": sum(live.values()), "live": dict(live)}


def events(step, granule: int | None = None, namer=None) -> list[dict]:
    """The two steps' events, in order (see the module's docstring)."""
    namer = namer or (lambda name, edge=None: name)
    warm = _moments(step, granule)
    cold = _moments(replace(step, optimizer_state=[]), granule)
    # the first step's optimizer moment is the warm one: torch.optim creates the state inside it
    cold = [m if m[0] != "optimizer_step" else w for m, w in zip(cold, warm)]
    return _events(cold, 1, namer) + _events(warm, 2, namer)


def timeline(config) -> list[dict]:
    """The timeline of a checked config: [] when it describes no run (no training section). Under a parallel
    layout, the binding rank's program (ranks.binding_trace or step.rank_trace), each event with its `rank`."""
    if config is None:
        return []
    step = getattr(config, "step", None)
    placement = getattr(config, "placement", None)
    parallel = placement.peak if placement is not None else None
    if parallel is not None:
        if step is None or placement.step_peak is None:
            # no walk of the step (declared tensors without a training section): the binding rank's peak as one event
            live = {k: parallel["live"][k] for k in LIVE if k in parallel["live"]}
            return [{"step": 2, "phase": PHASE.get(parallel["phase"], parallel["phase"]), "module": None, "at": None,
                     "bytes": parallel["bytes"], "live": live, "rank": parallel["rank"]}]
        walked = parallel.get("per_rank") is not None and ranks.applies(config)
        warm = ranks.binding_trace(config) if walked else rank_trace(step, placement, config.granule)
        return [dict(e, rank=parallel["rank"]) for e in _events(warm, 2, module_namer(config))]
    if step is None or config.peak is None:
        return []
    return events(step, config.granule, module_namer(config))

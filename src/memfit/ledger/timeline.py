"""The step as a series of events: what is live at each module boundary, for a picture of memory over time.

`step.phases(step, trace)` walks one warm training step and lists every moment it considers
(forward at each row, the loss, backward at each row in reverse, the optimizer step). This
module turns that walk into the timeline `memfit explain --format json|html` publishes:

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
- `at`: a module's last row's forward moment is its post-forward (its output just written); the
  final moment of its backward, its post-backward. Its pre-forward (pre-backward) is the same
  instant as the preceding module's post-forward (post-backward, or the loss's gradient for the
  first module in backward): nothing is allocated between two modules, so those events repeat
  that moment's live bytes under the next module's name. A moment inside a module (the worst
  moment of a transformer layer's attention, say) has `at` None.
- With an allocator granule (`overhead: auto` on a preset), each moment's rounding (every live
  tensor up to 512 bytes) is added to its overhead, as `step.peak` adds it to each phase.

Under a parallel layout the ledger has no per-rank step walk yet: the timeline is one event,
the binding rank's peak, with its `rank`.
"""

from __future__ import annotations

import re
from dataclasses import replace

from memfit.ledger.step import LIVE, phases, rounded

PHASE = {"forward": "forward", "backward": "backward", "optimizer_step": "optimizer"}
AT = ("pre-forward", "post-forward", "pre-backward", "post-backward")
_HF_ROW = re.compile(r"^layer (\d+) ")
_KERAS_ROW = re.compile(r"^(.*) \([A-Za-z0-9_]+\)$")


def module_namer(config):
    """row name -> the model's own module name, for the config's model."""
    model = getattr(config, "model", None)
    cfg = getattr(model, "cfg", None)
    if cfg is not None:
        from memfit.models.hf import _tree  # the transformers module tree: embeddings first, the head last

        before, layers, _, after, _ = _tree(cfg)
        first, last = before[0].path, after[-1].path

        def hf(name: str) -> str:
            m = _HF_ROW.match(name)
            if m:
                return f"{layers}.{m.group(1)}"
            return {"embeddings": first, "head": last}.get(name, name)

        return hf

    def keras(name: str) -> str:
        m = _KERAS_ROW.match(name)
        return m.group(1) if m else name

    return keras


def _moments(step, granule):
    """The walk's moments, each with its allocator rounding added to the overhead."""
    exact: list = []
    phases(step, exact)
    if not granule:
        return exact
    coarse: list = []
    phases(rounded(step, granule), coarse)
    out = []
    for (phase, at, live), (_, _, live_coarse) in zip(exact, coarse):
        live = dict(live)
        live["overhead"] += sum(live_coarse.values()) - sum(live.values())
        out.append((phase, at, live))
    return out


def _events(moments, number: int, namer) -> list[dict]:
    out: list[dict] = []
    # which moment of each module is its last in forward / backward (a module spans several rows
    # and a row may have two backward moments)
    last = {}
    for i, (phase, at, _) in enumerate(moments):
        if phase in ("forward", "backward") and at != "loss":
            last[(phase, namer(at))] = i
    boundary = None  # the live bytes at the latest module boundary
    previous_module = {"forward": None, "backward": None}
    for i, (phase, at, live) in enumerate(moments):
        live = {k: live[k] for k in LIVE}
        if phase == "optimizer_step":
            out.append(_event(number, "optimizer", "optimizer", None, live))
            continue
        if at == "loss":
            out.append(_event(number, "loss" if phase == "forward" else "backward", "loss", None, live))
            boundary = live if phase == "backward" else boundary
            continue
        module = namer(at)
        if module != previous_module[phase]:
            previous_module[phase] = module
            if boundary is not None:
                out.append(_event(number, phase, module, "pre-" + phase, boundary))
        edge = last[(phase, module)] == i
        out.append(_event(number, phase, module, "post-" + phase if edge else None, live))
        if edge:
            boundary = live
    return out


def _event(number, phase, module, at, live) -> dict:
    return {"step": number, "phase": phase, "module": module, "at": at, "bytes": sum(live.values()), "live": dict(live)}


def events(step, granule: int | None = None, namer=None) -> list[dict]:
    """The two steps' events, in order (see the module's docstring)."""
    namer = namer or (lambda name: name)
    warm = _moments(step, granule)
    cold = _moments(replace(step, optimizer_state=[]), granule)
    # the first step's optimizer moment is the warm one: torch.optim creates the state inside it
    cold = [m if m[0] != "optimizer_step" else w for m, w in zip(cold, warm)]
    return _events(cold, 1, namer) + _events(warm, 2, namer)


def timeline(config) -> list[dict]:
    """The timeline of a checked config: [] when it describes no run (no training section)."""
    if config is None:
        return []
    placement = getattr(config, "placement", None)
    parallel = placement.peak if placement is not None else None
    if parallel is not None:
        # no per-rank step walk under a parallel layout yet: the binding rank's peak as one event
        live = {k: parallel["live"][k] for k in LIVE if k in parallel["live"]}
        return [{"step": 2, "phase": PHASE.get(parallel["phase"], parallel["phase"]), "module": None, "at": None,
                 "bytes": parallel["bytes"], "live": live, "rank": parallel["rank"]}]
    step = getattr(config, "step", None)
    if step is None or config.peak is None:
        return []
    return events(step, config.granule, module_namer(config))

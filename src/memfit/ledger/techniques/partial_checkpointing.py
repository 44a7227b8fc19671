"""Partial checkpointing: under `checkpointing: full`, only every N-th layer is checkpointed (recomputed in the
backward, keeping only its input); the others keep what they keep without checkpointing.

The frameworks' spellings count the layers from different ends:
- transformers (5.x) `activation_checkpointing_enable(every_n_layers=N)`: the layers whose index i (from 0) has
  i % N == 0 (modeling_utils.py _set_gradient_checkpointing, `layer_index % every_n_layers == 0`): layers 0, N, 2N...
  -> `checkpoint_every: N` (`checkpoint_offset: 0`, the default);
- torchtitan `selective_ac_option: "N"` and torchtune `ac_mode: selective` + `ac_option: N`: a counter from 1 over
  the blocks, `_count % ac_freq == 0` (torchtitan distributed/activation_checkpoint.py _apply_layer_sac; torchtune
  training/_activation_checkpointing.py checkpoint_wrapper): layers N-1, 2N-1... -> `checkpoint_every: N`,
  `checkpoint_offset: N - 1`.

The rewrite builds the transformer's program again with the chosen layers checkpointed (the builder hands it
`rebuild` through ledger.rewrites: ledger.training.transformer_step's `checkpointed`). Measured: tests/ledger/test_partial_checkpointing.py.
"""

from __future__ import annotations

from dataclasses import replace

from memfit.diagnostics import codes
from memfit.diagnostics.diagnostic import Problem

NAME = "partial_checkpointing"

KEYS = {
    "checkpoint_every": {
        "title": "Checkpoint every N-th layer",
        "description": "With checkpointing: full, only the layers whose index i (from 0) has i % N == checkpoint_offset are "
                       "checkpointed (recomputed in the backward); the others keep their activations. transformers' "
                       "every_n_layers (offset 0); torchtitan's selective_ac_option \"N\" and torchtune's ac_option N "
                       "checkpoint layers N-1, 2N-1, ... (offset N-1). Default 1: every layer.",
        "type": "integer",
        "minimum": 1,
        "default": 1,
    },
    "checkpoint_offset": {
        "title": "The first checkpointed layer",
        "description": "With checkpoint_every N: the index (from 0, below N) of the first checkpointed layer. Default 0.",
        "type": "integer",
        "minimum": 0,
        "default": 0,
    },
}


def _every(training: dict):
    every = training.get("checkpoint_every", 1)
    return every if isinstance(every, int) and not isinstance(every, bool) else 1


def _offset(training: dict):
    offset = training.get("checkpoint_offset", 0)
    return offset if isinstance(offset, int) and not isinstance(offset, bool) else 0


def applies(training: dict) -> bool:
    return _every(training) > 1 or _offset(training) > 0


def layers(training: dict, n_layers: int) -> frozenset:
    """The indices of the checkpointed layers."""
    every, offset = _every(training), _offset(training)
    return frozenset(i for i in range(n_layers) if i % every == offset)


def problems(config, training: dict) -> list:
    out = []
    every, offset = _every(training), _offset(training)
    if training.get("checkpointing") != "full":
        return [Problem(("training", "checkpoint_every" if "checkpoint_every" in training else "checkpoint_offset"), codes.NOT_MODELLED,
                        "checkpoint_every chooses which layers full checkpointing recomputes: without checkpointing: full it does "
                        "nothing")]
    if offset >= every:
        out.append(Problem(("training", "checkpoint_offset"), codes.SCHEMA,
                           f"checkpoint_offset {offset} must be below checkpoint_every {every}"))
    model = getattr(config, "model", None)
    if model is None or not hasattr(model, "cfg"):
        out.append(Problem(("training", "checkpoint_every"), codes.NEEDS_TRANSFORMER,
                           "checkpoint_every chooses transformer layers: it needs a transformers model (model.hf_config or model.transformer)"))
        return out
    from memfit.models import hf_encdec

    if hf_encdec.is_stacked(model.cfg):
        out.append(Problem(("training", "checkpoint_every"), codes.NOT_MODELLED,
                           "checkpoint_every on an encoder-decoder: memfit models every layer checkpointed (the figure is low)"))
    p = config.parallel
    if p is not None and (p.tensor > 1 or p.pipeline > 1):
        out.append(Problem(("training", "checkpoint_every"), codes.NOT_MODELLED,
                           "checkpoint_every under tensor or pipeline parallelism: each rank's program has every layer checkpointed "
                           "(the figure is low)"))
    return out


REBUILDS = True  # ledger.rewrites hands the rewrite the builder's `rebuild`


def rewrite(step, config, training: dict, rebuild=None):
    """`rebuild(checkpointed=...)`: the builder's transformer program again, with those layers checkpointed (None:
    the builder has none to hand, and the step stays)."""
    from memfit.models import hf_activations as acts, hf_encdec

    model = getattr(config, "model", None)
    if (rebuild is None or training.get("checkpointing") != "full" or model is None or not hasattr(model, "cfg")
            or hf_encdec.is_stacked(model.cfg) or _offset(training) >= _every(training)):
        return step
    p = config.parallel
    if p is not None and (p.tensor > 1 or p.pipeline > 1):
        return step
    chosen = layers(training, len(acts.layer_kinds(model.cfg)))
    rebuilt = rebuild(checkpointed=chosen)
    return replace(rebuilt, accumulating=step.accumulating)

"""The reference for memfit's timeline: MemTracker's module-state snapshots around one warm training step (CPU).

MemTracker (torch.distributed._tools.mem_tracker) records, for every module that runs inside it, the
live bytes of everything it tracks (parameters, buffers, gradients, activations, temporaries, optimizer
state, the batch) at the module's pre-forward, post-forward, pre-backward and post-backward hooks. This
runs `warmup` steps untracked (the optimizer state exists, as in the warm step the timeline's step 2
describes), then one tracked step, and returns {(module path, at): bytes} with the model's own module
paths (the root's class name MemTracker puts in front is dropped).
"""

from __future__ import annotations

import torch
from torch.distributed._tools.mem_tracker import MemTracker, _ModState

import peak_reference as ref

CPU = torch.device("cpu")
AT = {_ModState.PRE_FW: "pre-forward", _ModState.POST_FW: "post-forward", _ModState.PRE_BW: "pre-backward", _ModState.POST_BW: "post-backward"}


def boundaries(model, batch, loss_fn, optimizer, warmup: int = 2) -> dict:
    def step():
        loss_fn(model, *batch).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    tracker = MemTracker()
    tracker.track_external(model, optimizer, *batch)
    with tracker:
        step()
    out = {}
    for stats in tracker.memory_tracking.values():
        name = stats.mod_fqn.split(".", 1)[1] if "." in stats.mod_fqn else ""
        for state, at in AT.items():
            if stats.snapshots.get(state):
                out[(name, at)] = stats.snapshots[state][0][CPU]["Total"]
    return out


def hf_boundaries(cfg: dict, *, micro_batch: int, seq_len: int, optimizer: str, impl: str, checkpointing: str = "none") -> dict:
    import hf_measure

    model = hf_measure.build(cfg)
    if checkpointing == "full":
        model.gradient_checkpointing_enable()
    batch = hf_measure.inputs(cfg, micro_batch, seq_len)
    opt = ref.OPTIMIZERS[optimizer](model.parameters(), **ref.IMPLS[impl])
    with hf_measure.cuda_dropout():
        return boundaries(model, (batch["input_ids"], batch["labels"]), lambda m, x, y: m(input_ids=x, labels=y).loss, opt)


def keras_boundaries(input_shape, layers, batch, optimizer, impl, names) -> dict:
    """keras_reference's reference layers, each layer its own submodule named as the yaml names it."""
    torch.manual_seed(0)
    whole = ref.keras_module(input_shape, layers, batch)

    class Layer(torch.nn.Module):
        def __init__(self, spec):
            super().__init__()
            self.spec = spec

        def forward(self, x):
            return whole.ref.layer(self.spec, x)

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.whole = whole
            for name, spec in zip(names, layers):
                self.add_module(name, Layer(spec))

        def forward(self, x):
            whole.ref.cursor = whole.ref.bcursor = 0
            for name in names:
                x = getattr(self, name)(x)
            return x

    model = Stack()
    x = ref.keras_input(input_shape, layers, batch)
    with torch.no_grad():
        out_shape = model(x).shape
    y = torch.randint(0, out_shape[-1], tuple(out_shape[:-1]))
    opt = ref.OPTIMIZERS[optimizer](model.parameters(), **ref.IMPLS[impl])

    def loss(module, x, y):
        logits = module(x)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    return boundaries(model, (x, y), loss, opt)

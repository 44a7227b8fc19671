"""One real FSDP2 step with CPU parameter offload per rank (gloo on CPU), and what one GPU would hold.

Run as a script by tests/placement/test_fsdp_offload.py under a hard timeout:
    python tests/support/fsdp_offload_worker.py WORLD OUT.json CONFIG.json CHECKPOINTING [CHECKPOINTING ...]
CONFIG.json is a transformers config (a tiny Llama); every decoder layer and the model are `fully_shard`ed with
`CPUOffloadPolicy` (fp32, torch.optim.Adam). A warm step (the optimizer state allocated by a step before) runs
under torch's FSDPMemTracker, which names every byte: sharded parameters and gradients, unsharded ones, the
all-gather and reduce-scatter buffers, activations, temporaries, optimizer state.

On the CPU host and device are one memory. CPUOffloadPolicy keeps the sharded parameters, the sharded gradients
and the optimizer state on the host, and runs the optimizer step there (torch's docstring); what a GPU would hold is
every other live byte. The figure reported is its largest value over forward and backward, taken at every
allocation the tracker sees (not only at the total's peak).
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gloo_ranks import fork_ranks  # noqa: E402

HOST = ("Sharded Param", "Sharded Grad", "OptState")


def run(rank, world, config, cases):
    return [step(rank, world, config, case) for case in cases]


def step(rank, world, config, checkpointing, fake=None):
    """One warm step of rank `rank`. `fake`: a FakeTensorMode (tests/support/fsdp_fake_worker.py): the model is built
    and sharded on the meta device, then made real-shaped fake tensors inside it (torchtitan's estimator's order),
    and the steps run inside it."""
    import contextlib

    inside = fake if fake is not None else contextlib.nullcontext()
    import transformers
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    fields = {k: v for k, v in config.items() if k != "model_type"}
    cfg = transformers.AutoConfig.for_model(config["model_type"], **fields)
    with torch.device("meta") if fake is not None else contextlib.nullcontext():
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    model.train()
    if checkpointing == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    offload = CPUOffloadPolicy(pin_memory=False)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, offload_policy=offload)
    fully_shard(model, mesh=mesh, offload_policy=offload)
    with inside:
        return _warm_step(rank, world, config, checkpointing, model, fake, FSDPMemTracker)


def _warm_step(rank, world, config, checkpointing, model, fake, FSDPMemTracker):
    class DeviceTracker(FSDPMemTracker):
        """FSDPMemTracker noting, at every update, the live bytes outside what the offload keeps on the host."""

        def __init__(self, *args):
            super().__init__(*args)
            self.on = False
            self.phase = "forward"
            self.device_peak = 0
            self.at_peak = {}
            self.by_phase = {}

        def _update_peak_stats(self, peak_state):
            super()._update_peak_stats(peak_state)
            if not self.on:
                return
            for snap in self._curr_mem_snap.values():
                named = {getattr(k, "value", k): v for k, v in snap.items()}
                held = named["Total"] - sum(named.get(k, 0) for k in HOST)
                if held > self.device_peak:
                    self.device_peak, self.at_peak = held, {k: v for k, v in named.items() if v}
                if held > self.by_phase.get(self.phase, 0):
                    self.by_phase[self.phase] = held

    if fake is not None:
        model.to_empty(device="cpu")  # fake tensors of the real shapes (the sharded ones on the host)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, config["vocab_size"], (2, 32), generator=g)

    def one(tracker=None):
        if tracker is not None:
            tracker.on = True
        loss = model(input_ids=ids, labels=ids).loss
        if tracker is not None:
            tracker.phase = "backward"
        loss.backward()
        if tracker is not None:
            tracker.on = False  # the optimizer step runs on the host
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    one()
    tracker = DeviceTracker(model, optimizer)
    with tracker:
        one(tracker)
    return {"rank": rank, "world": world, "checkpointing": checkpointing, "device_peak": tracker.device_peak,
            "phases": tracker.by_phase, "at_peak": tracker.at_peak}


def main():
    world, out, config_path, cases = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
    with open(config_path) as f:
        config = json.load(f)
    fork_ranks(world, out, run, config, cases, preload=("torch.distributed.fsdp", "transformers.models.llama.modeling_llama"))


if __name__ == "__main__":
    main()

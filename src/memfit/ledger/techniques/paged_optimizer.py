"""Paged optimizer state: bitsandbytes' paged optimizers (`PagedAdamW8bit`, `PagedAdam8bit`; the Trainer's
`paged_adamw_8bit`) keep the state of every parameter of 100,000+ elements in CUDA unified memory, outside PyTorch's
allocator, and the driver moves those pages to the host when the device runs out.

From bitsandbytes' code (optim/optimizer.py `Optimizer8bit.get_state_buffer`, 0.41 to 0.50.2): `if not
self.is_paged or p.numel() < 1e5: return torch.zeros_like(p, dtype=dtype, device=p.device)`, else
`F.get_paged(*p.shape, dtype=dtype, device=p.device)`, which is `lib.cget_managed_ptr(num_bytes)`
(cudaMallocManaged) wrapped with `torch.frombuffer`: a tensor PyTorch sees as host memory. `init_state` makes
`state1`/`state2` (uint8, one per element) with it; the blockwise `absmax1`/`absmax2` (fp32, one per 256 elements)
and the quantization maps are ordinary `torch.zeros(..., device=p.device)`. So:
- none of the paged bytes is in `torch.cuda.memory_stats()` (allocated, active or reserved): torchtune's "Peak
  Memory" (training/memory.py `get_memory_stats`: `active_bytes.all.peak`) leaves them out, and its README's
  Llama 3.1 8B full fine-tune (`8B_full_single_device`, PagedAdamW8bit) runs on one 24 GB RTX 4090 at 18.9 GiB
  with 16 GB of 8-bit state beside 16 GB of bf16 weights: the state pages to the host;
- on the device they take what is left, the rest stays on the host: they need not fit.
memfit gates the device's peak without them (the parameters' state of under 100,000 elements and every absmax stay
on the device, counted); the footprint keeps the whole optimizer state (the bytes exist, in unified memory).
On the CPU bitsandbytes falls back to ordinary tensors (`p.device.type == "cpu"`), so a CPU measurement holds them
all: `paged_optimizer: false` prices that. Under a parallel layout the state is counted as before (bitsandbytes'
paged state is a single-process feature: torchtune offers it in its single-device recipes only).
"""

from __future__ import annotations

from dataclasses import replace

from memfit.diagnostics import codes
from memfit.diagnostics.diagnostic import Problem
from memfit.diagnostics.units import with_bytes
from memfit.recipe.costs import dtype_bytes
from memfit.recipe.optim import lookup, state_tensors

NAME = "paged_optimizer"

PAGED_MIN_ELEMENTS = 100_000  # get_state_buffer: `p.numel() < 1e5` keeps ordinary device memory
PAGED_DTYPE = "uint8"  # init_state: state1/state2 through get_state_buffer; absmax and qmaps are torch.zeros

KEYS = {
    "paged_optimizer": {
        "title": "Paged optimizer state",
        "description": "For bitsandbytes' paged optimizers (paged_adam8bit, paged_adamw8bit, paged_lion8bit): true (their default) "
                       "prices the 8-bit state of every parameter of 100,000+ elements in CUDA unified memory "
                       "(cudaMallocManaged), outside PyTorch's allocator, paged to the host when the device is full: "
                       "not gated against the device (the footprint still counts it). false: on the device, as "
                       "bitsandbytes keeps it on the CPU or where the device has room for it. With an optimizer of "
                       "torch's layout, true says it is bitsandbytes' 32-bit paged one (PagedAdamW, PagedAdamW32bit, "
                       "the Trainer's paged_adamw_32bit; set dtypes.optimizer_state: float32; the native readers set both): the "
                       "whole state of each parameter of 100,000+ elements is paged.",
        "type": "boolean",
        "default": True,
    },
}


def applies(training: dict) -> bool:
    # on by the optimizer (its table's `paged`) unless the key is false; `true` also pages bitsandbytes' 32-bit paged
    # optimizers, which memfit reads as torch's layout with fp32 state (PagedAdamW, PagedAdamW32bit, paged_adamw_32bit)
    return training.get("paged_optimizer", True) is True


def problems(config, training: dict) -> list:
    """A note at the optimizer: how much of its state is paged, off the device's peak."""
    name = getattr(config, "optimizer", None)
    if getattr(config, "parallel", None) is not None or not isinstance(name, str):
        return []
    try:
        paged = paged_bytes(config, name.strip().lower(), training.get("paged_optimizer") is True)
    except ValueError:
        return []
    total = sum(paged.get(t.bytes["optimizer_state"] // max(t.count, 1), 0) * max(t.count, 1)
                for t in getattr(config, "tensors", ())
                if t.category == "parameters" and t.trainable and t.bytes.get("optimizer_state") and t.elements >= PAGED_MIN_ELEMENTS)
    if not total:
        return []
    whose = f"{name}'s" if lookup(name).paged else f"bitsandbytes' 32-bit paged {name}'s"
    return [Problem(("optimizer",), codes.PAGED_STATE,
                    f"{with_bytes(total)} of {whose} state is paged (bitsandbytes allocates the state of "
                    f"parameters of 100,000+ elements in CUDA unified memory): not in the device's peak; the host holds "
                    f"what the device has no room for (training.paged_optimizer: false counts it on the device)",
                    severity=codes.INFORMATION)]


def paged_bytes(config, optimizer: str | None, stated: bool = False) -> dict:
    """{a trainable parameter's state bytes (one copy): the bytes of it in unified memory}. `stated`: the config says
    `paged_optimizer: true` (an optimizer with torch's layout is then bitsandbytes' 32-bit paged one: every state
    tensor of a parameter at or over the threshold comes from get_state_buffer, Optimizer2State.init_state)."""
    out: dict = {}
    if not optimizer:
        return out
    table = lookup(optimizer)
    if not table.paged and not (stated and table.layout == "elementwise"):
        return out
    for t in getattr(config, "tensors", ()):
        if t.category != "parameters" or not t.trainable or not t.bytes.get("optimizer_state"):
            continue
        if t.elements < PAGED_MIN_ELEMENTS:
            continue
        copies = max(t.count, 1)
        if table.paged:
            paged = sum(dtype_bytes(t.elements, dtype) for _, _, dtype in state_tensors(optimizer, t.shape, "float32")
                        if dtype == PAGED_DTYPE)
        else:
            paged = t.bytes["optimizer_state"] // copies
        if paged:
            out[t.bytes["optimizer_state"] // copies] = paged
    return out


def rewrite(step, config, training: dict):
    # the config's optimizer, as problems() reads it: the step names none where its temporaries are not modelled (Lion)
    name = step.optimizer or getattr(config, "optimizer", None)
    if getattr(config, "parallel", None) is not None or not isinstance(name, str):
        return step
    try:
        paged = paged_bytes(config, name.strip().lower(), training.get("paged_optimizer") is True)
    except ValueError:   # an optimizer the table does not know: nothing is paged
        return step
    if not paged:
        return step
    return replace(step, optimizer_state=[b - paged.get(b, 0) for b in step.optimizer_state])

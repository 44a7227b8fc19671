"""Optimizers as data: the state each keeps per parameter, as a function of the
parameter's shape and dtype.

Three layouts:
- "elementwise": torch.optim's per-element buffers, each `zeros_like(param)`, so
  in the parameter's dtype (or the master copy's, when the optimizer steps one).
- "blockwise8": bitsandbytes' 8-bit optimizers (optim/optimizer.py,
  Optimizer2State/Optimizer1State.init_state): one uint8 per state element plus
  one fp32 absmax per block of 256 elements; a tensor with fewer than
  `min_8bit_size` (4096) elements gets fp32 state instead (whatever the
  parameter's dtype). The quantization maps (256 fp32 each) exist once per
  optimizer, moved to the device when the first 8-bit state is made.
- "factored": torch.optim.Adafactor: a row and a column statistic for a tensor
  of 2+ dims (the shape with the last, resp. second-to-last, dim set to 1), a full
  `variance` for 0-/1-dim tensors, all `grad.new_zeros` (the gradient's dtype).

Scalar step counters (torch's `step`, NAdam's `mu_product`) are not counted: on a
GPU they stay in host memory unless the optimizer is fused or capturable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BNB_BLOCKSIZE = 256  # bitsandbytes optim/optimizer.py: `blocksize = 256` in init_state
BNB_MIN_8BIT_SIZE = 4096  # Optimizer8bit's `min_8bit_size` default
BNB_QMAP_ELEMENTS = 256  # F.create_dynamic_map(): 256 fp32 code values


@dataclass(frozen=True, slots=True)
class Optimizer:
    """One optimizer's state: its layout and the per-parameter state its framework keeps."""

    name: str
    layout: str  # "elementwise" | "blockwise8" | "factored"
    states: tuple  # the framework's per-parameter state keys, in its order
    framework: str  # the class that keeps this state
    note: str = ""
    qmaps: tuple = ()  # blockwise8: the shared quantization maps moved to the device
    paged: bool = False


def _torch(name, states, cls, note=""):
    return Optimizer(name, "elementwise", states, cls, note)


def _bnb(name, states, cls, qmaps, paged=False):
    note = "bitsandbytes 8-bit blockwise state"
    if paged:
        note += "; paged: state tensors of 100,000+ elements live in CUDA unified memory and may spill to host memory under pressure (same bytes; not gated against the device: training.paged_optimizer)"
    return Optimizer(name, "blockwise8", states, cls, note, qmaps, paged)


OPTIMIZERS: dict[str, Optimizer] = {
    o.name: o
    for o in (
        _torch("sgd", (), "torch.optim.SGD(momentum=0)", "no state"),
        _torch("momentum", ("momentum_buffer",), "torch.optim.SGD(momentum>0)"),
        _torch("sgd_momentum", ("momentum_buffer",), "torch.optim.SGD(momentum>0)"),
        _torch("nesterov", ("momentum_buffer",), "torch.optim.SGD(nesterov=True)"),
        _torch("adagrad", ("sum",), "torch.optim.Adagrad"),
        _torch("rmsprop", ("square_avg",), "torch.optim.RMSprop", "momentum>0 adds momentum_buffer, centered adds grad_avg"),
        _torch("adadelta", ("square_avg", "acc_delta"), "torch.optim.Adadelta"),
        _torch("lion", ("exp_avg",), "Lion (not in torch.optim)", "as the reference implementations and bitsandbytes' 32-bit Lion keep it"),
        _torch("adam", ("exp_avg", "exp_avg_sq"), "torch.optim.Adam"),
        _torch("adamw", ("exp_avg", "exp_avg_sq"), "torch.optim.AdamW"),
        _torch("adamax", ("exp_avg", "exp_inf"), "torch.optim.Adamax"),
        _torch("nadam", ("exp_avg", "exp_avg_sq"), "torch.optim.NAdam", "mu_product is a scalar"),
        _torch("radam", ("exp_avg", "exp_avg_sq"), "torch.optim.RAdam"),
        _bnb("adam8bit", ("state1", "state2"), "bitsandbytes.optim.Adam8bit", ("qmap1", "qmap2")),
        _bnb("adamw8bit", ("state1", "state2"), "bitsandbytes.optim.AdamW8bit", ("qmap1", "qmap2")),
        _bnb("paged_adam8bit", ("state1", "state2"), "bitsandbytes.optim.PagedAdam8bit", ("qmap1", "qmap2"), paged=True),
        _bnb("paged_adamw8bit", ("state1", "state2"), "bitsandbytes.optim.PagedAdamW8bit", ("qmap1", "qmap2"), paged=True),
        _bnb("lion8bit", ("state1",), "bitsandbytes.optim.Lion8bit", ("qmap1",)),
        _bnb("paged_lion8bit", ("state1",), "bitsandbytes.optim.PagedLion8bit", ("qmap1",), paged=True),
        Optimizer("adafactor", "factored", ("row_var", "col_var", "variance"), "torch.optim.Adafactor", "factored second moment, no first moment"),
    )
}

# Temporaries of optimizer.step() beyond parameters, gradients and state, in steady state
# (after the first steps: RAdam switches to its rectified update at step 6).
#   foreach: k x the bytes of the (device, dtype) group of trainable parameters: each
#            torch._foreach_* that returns new tensors allocates one per parameter at once;
#   for_loop: max over parameters, in order, and over the (a, b) moments listed, of a x this
#            parameter + b x the previous one (the previous iteration's temporaries live until
#            their names are rebound);
#   fused: one kernel, in place: none. None: torch.optim has no fused implementation.
# Read from torch/optim/*.py (_multi_tensor_*, _single_tensor_*) and measured with MemTracker
# against torch 2.13; tests/ledger/test_peak.py re-measures every entry (ledger/step.py applies them).
TEMPORARIES: dict[str, dict[str, tuple | int | None]] = {
    "sgd": {"foreach": 0, "for_loop": ((0, 0),), "fused": 0},
    "momentum": {"foreach": 0, "for_loop": ((0, 0),), "fused": 0},
    "sgd_momentum": {"foreach": 0, "for_loop": ((0, 0),), "fused": 0},
    "nesterov": {"foreach": 0, "for_loop": ((1, 0),), "fused": 0},
    "adagrad": {"foreach": 2, "for_loop": ((1, 1),), "fused": 0},
    "rmsprop": {"foreach": 1, "for_loop": ((1, 1),), "fused": None},
    "adadelta": {"foreach": 2, "for_loop": ((2, 1), (1, 2)), "fused": None},
    "adam": {"foreach": 1, "for_loop": ((2, 1),), "fused": 0},
    "adamw": {"foreach": 1, "for_loop": ((2, 1),), "fused": 0},
    "adamax": {"foreach": 1, "for_loop": ((1, 0),), "fused": None},
    "nadam": {"foreach": 1, "for_loop": ((2, 1),), "fused": None},
    "radam": {"foreach": 1, "for_loop": ((5, 0),), "fused": None},
    # torch.optim.Adafactor (optim/_adafactor.py): a matrix's update is `row_var @ col_var`, a tensor of the
    # parameter's size (a vector's: its variance cloned); foreach makes every update at once, for_loop one per
    # parameter, the previous one alive until it is replaced. Its row and column means (rows + columns elements)
    # and scalar norms are left out: measured 0.04-2% of the figure on matrices
    # (tests/ledger/test_peak.py::test_adafactor_temporaries_on_matrices)
    "adafactor": {"foreach": 1, "for_loop": ((1, 1),), "fused": None},
    # bitsandbytes' 8-bit optimizers update each parameter in one in-place kernel
    # (optimizer_update_8bit_blockwise) whatever torch.optim implementation is named: none. The
    # combinations measured in tests/ledger/test_combinations.py peak within 5% of MemTracker with none.
    **{name: {"foreach": 0, "for_loop": ((0, 0),), "fused": 0} for name in ("adam8bit", "adamw8bit", "paged_adam8bit", "paged_adamw8bit", "lion8bit", "paged_lion8bit")},
}


# The seed contract's optimizer -> state-tensor count (elementwise optimizers).
STATE_COUNTS: dict[str, int] = {name: len(o.states) for name, o in OPTIMIZERS.items() if o.layout == "elementwise"}


def lookup(name: str) -> Optimizer:
    key = name.strip().lower() if isinstance(name, str) else name
    try:
        return OPTIMIZERS[key]
    except (KeyError, TypeError):
        raise ValueError(f"optimizer is {name!r}: unknown optimizer; known: {', '.join(sorted(OPTIMIZERS))}") from None


def is_8bit(optimizer: Optimizer, elements: int, min_8bit_size: int = BNB_MIN_8BIT_SIZE) -> bool:
    return optimizer.layout == "blockwise8" and elements >= min_8bit_size


def state_tensors(name: str, shape, dtype: str, *, min_8bit_size: int = BNB_MIN_8BIT_SIZE) -> list[tuple[str, tuple, str]]:
    """(state key, shape, dtype) of every per-element state tensor one parameter gets.

    `dtype` is the dtype torch.optim would use (the parameter's, or its master
    copy's); bitsandbytes ignores it and uses uint8 or fp32.
    """
    optimizer = lookup(name)
    shape = tuple(shape)
    n = math.prod(shape)
    if optimizer.layout == "elementwise":
        return [(key, shape, dtype) for key in optimizer.states]
    if optimizer.layout == "factored":
        if len(shape) > 1:
            return [("row_var", shape[:-1] + (1,), dtype), ("col_var", shape[:-2] + (1, shape[-1]), dtype)]
        return [("variance", shape, dtype)]
    if not is_8bit(optimizer, n, min_8bit_size):
        return [(key, shape, "float32") for key in optimizer.states]
    blocks = -(-n // BNB_BLOCKSIZE)
    out = []
    for i, key in enumerate(optimizer.states, start=1):
        out.append((key, shape, "uint8"))
        out.append((f"absmax{i}", (blocks,), "float32"))
    return out


def shared_tensors(name: str, states) -> list[tuple[str, tuple, str]]:
    """Tensors the optimizer keeps once, not per parameter: bitsandbytes' quantization
    maps, on the device as soon as one parameter has 8-bit state (`states`: the
    optimizer-state items of all parameters, anything with a `.dtype`)."""
    optimizer = lookup(name)
    if optimizer.layout != "blockwise8" or not any(getattr(s, "dtype", None) == "uint8" for s in states):
        return []
    return [(key, (BNB_QMAP_ELEMENTS,), "float32") for key in optimizer.qmaps]


def schema_description() -> str:
    """The optimizer key's description, generated from the table."""
    parts = []
    for o in OPTIMIZERS.values():
        if o.layout == "elementwise":
            parts.append(f"{o.name} ({len(o.states)} state{'s' if len(o.states) != 1 else ''})")
        elif o.layout == "blockwise8":
            parts.append(f"{o.name} (bitsandbytes, {len(o.states)} x 8-bit + absmax)")
        else:
            parts.append(f"{o.name} (factored row/column statistics)")
    return "The optimizer, case-insensitive; sets the state kept per trainable parameter: " + ", ".join(parts) + "."

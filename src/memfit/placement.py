"""Tensors x a device layout -> the bytes each device holds.

Everything that shows or judges a byte count (the footprint, the budget gate, explain, hover,
inlay hints, every reporter) reads it from a Placement, so a strategy that shards, replicates
or offloads tensors (ZeRO, FSDP, tensor and pipeline parallel) changes this stage only. Today
there is one layout, a single device holding every tensor whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .costs import totals


@dataclass(frozen=True, slots=True)
class Layout:
    """Where training runs: `devices` devices (1 today)."""

    devices: int = 1


SINGLE = Layout()


@dataclass(slots=True)
class Placement:
    layout: Layout
    devices: list = field(default_factory=list)  # per device: category -> bytes, and "total"

    @property
    def binding(self) -> int:
        """The device that must fit: the one holding the most."""
        return max(range(len(self.devices)), key=lambda i: self.devices[i]["total"])

    @property
    def footprint(self) -> dict:
        return self.devices[self.binding]

    def of(self, tensor, device: int = 0) -> dict:
        """Bytes per category that `tensor` puts on `device` (a single device holds it whole)."""
        return tensor.bytes


def place(tensors, layout: Layout = SINGLE) -> Placement:
    if layout.devices != 1:
        raise ValueError(f"{layout.devices} devices: only a single-device layout is modelled")
    return Placement(layout, [totals(t.bytes for t in tensors)])

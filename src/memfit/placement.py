"""Tensors x a device layout -> the bytes each device holds.

Everything that shows or judges a byte count (the footprint, the budget gate, explain, hover,
inlay hints, every reporter) reads it from a Placement, so a strategy that shards, replicates
or offloads tensors (ZeRO, FSDP, tensor and pipeline parallel) changes this stage only. Today
there is one layout, a single device holding every tensor whole.
"""

from __future__ import annotations

from .costs import CATEGORIES


class Layout:
    """Where training runs: `devices` devices (1 today). Plain classes here: built on every start."""

    __slots__ = ("devices",)

    def __init__(self, devices: int = 1) -> None:
        self.devices = devices


SINGLE = Layout()


class Placement:
    __slots__ = ("devices", "layout")

    def __init__(self, layout: Layout, devices: list) -> None:
        self.layout = layout
        self.devices = devices  # per device: category -> bytes, and "total"

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
    held = dict.fromkeys(CATEGORIES, 0)
    for tensor in tensors:
        for category, size in tensor.bytes.items():
            held[category] += size
    held["total"] = sum(held[c] for c in CATEGORIES)
    return Placement(layout, [held])

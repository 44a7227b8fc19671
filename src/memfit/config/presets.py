"""GPU presets: the memory each card reports, and the runtime overhead a PyTorch training process
adds on it, as named lines with their sources. Data only; docs/peak.md shows the table.

`memory` is what the driver reports as the device's total (nvidia-smi's memory.total, NVML's
total, in MiB, times 2**20; for the MI300X, ROCm's coarse-grained VRAM pool), not the marketing
figure: an "80 GB" A100 reports 81920 MiB, an "80 GB" H100 81559 MiB. Each row names where the
figure was read. `overhead: auto` is the sum of the lines of `overhead_lines(preset)`: nothing
else, no multiplier.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

MIB = 2**20


@dataclass(frozen=True)
class Preset:
    name: str
    memory: int  # bytes, as the driver reports the total
    source: str  # where the figure was read
    vendor: str  # "nvidia" | "amd"
    sm90: bool = False  # compute capability 9.0 (Hopper): PyTorch's larger cuBLAS workspace


MODAL = "nvidia-smi totals listed in modal-labs/modal-client#2797"
PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("V100-16GB", 16160 * MIB, "nvidia-smi, Tesla V100-SXM2-16GB: 4paradigm/k8s-vgpu-scheduler#7", "nvidia"),
        Preset("V100-32GB", 32480 * MIB, "nvidia-smi, Tesla V100-SXM2-32GB: godweiyang/GrabGPU#5", "nvidia"),
        Preset("T4", 15360 * MIB, MODAL, "nvidia"),
        Preset("A10G", 23028 * MIB, "nvidia-smi, NVIDIA A10G (AWS): NVIDIA/DCGM#232", "nvidia"),
        Preset("L4", 23034 * MIB, MODAL, "nvidia"),
        Preset("L40S", 46068 * MIB, MODAL + "; nvidia-smi --query-gpu=memory.total in akash-network/provider-configs#99", "nvidia"),
        Preset("RTX-3090", 24576 * MIB, "nvidia-smi, GeForce RTX 3090: noonghunna/club-3090#390", "nvidia"),
        Preset("RTX-4090", 24564 * MIB, "nvidia-smi, GeForce RTX 4090: RLinf/RLinf#255, vllm-project/vllm#7553", "nvidia"),
        Preset("A100-40GB", 40960 * MIB, MODAL, "nvidia"),
        Preset("A100-80GB", 81920 * MIB, MODAL, "nvidia"),
        Preset("H100-80GB", 81559 * MIB, MODAL + "; nvidia-smi, H100 80GB HBM3: NVIDIA/nccl#1264", "nvidia", sm90=True),
        Preset("H200", 143153 * MIB, "reported total of one NVIDIA H200 (143,153 MiB): JustVugg/colibri#688", "nvidia", sm90=True),
        Preset("B200", 183359 * MIB, "nvidia-smi, NVIDIA B200: NVIDIA/TensorRT-LLM#10278", "nvidia"),
        Preset("MI300X", 201310208 * 1024, "rocminfo, AMD Instinct MI300X, GLOBAL coarse-grained pool 201310208 KB: ROCm/rocm-examples#187", "amd"),
    )
}
# Short names for a card the table has in one memory size only. A name that starts several presets of
# different memory (A100: 40 or 80 GB; V100: 16 or 32 GB) is no alias: it is ambiguous, and an error.
ALIASES = {"H100": "H100-80GB", "RTX3090": "RTX-3090", "RTX4090": "RTX-4090", "3090": "RTX-3090", "4090": "RTX-4090"}


def _key(name: str) -> str:
    return "".join(ch for ch in name.upper() if ch.isalnum())


_BY_KEY = {**{_key(n): n for n in PRESETS}, **{_key(a): n for a, n in ALIASES.items()}}


def lookup(name: str) -> Preset | None:
    """Case, spaces, dashes and underscores do not matter: 'a100 80gb' is A100-80GB."""
    found = _BY_KEY.get(_key(str(name)))
    return PRESETS[found] if found else None


def ambiguous(name: str) -> list[str]:
    """The presets a short name could mean when they differ in memory ('A100': A100-40GB, A100-80GB);
    [] when the name is exact, unknown or means one card."""
    if lookup(name) is not None:
        return []
    key = _key(str(name))
    if not key:
        return []
    found = [n for n in PRESETS if _key(n).startswith(key)]
    return found if len({PRESETS[n].memory for n in found}) > 1 else []


def closest(name: str, n: int = 3) -> list[str]:
    keys = difflib.get_close_matches(_key(str(name)), list(_BY_KEY), n=n * 2, cutoff=0.4)
    out: list[str] = []
    for k in keys:
        if _BY_KEY[k] not in out:
            out.append(_BY_KEY[k])
    return out[:n]


# --- runtime overhead: each line with its source ------------------------------------------
@dataclass(frozen=True)
class Line:
    name: str
    bytes: int
    source: str


# PyTorch measured cudaMemGetInfo's total - free after creating its first CUDA tensor with lazy
# module loading (its default since 1.13); the figure includes that tensor's 6.4 MB allocation.
CUDA_CONTEXT = Line(
    "CUDA context (lazy module loading)",
    287_047_680,
    "total - free after the first CUDA tensor, pytorch/pytorch#86509 (PyTorch sets CUDA_MODULE_LOADING=LAZY); "
    "varies with GPU, driver and the kernels a run loads (~300-400 MB: pytorch/pytorch#107667, #109888)",
)
CUBLAS_SOURCE = "aten/src/ATen/cuda/CublasHandlePool.cpp, parseChosenWorkspaceSize / parseCUDABlasLtWorkspaceSize"
# One cuBLAS handle per thread: the forward runs on the Python thread, backward on autograd's
# device thread, so a training step holds two (handle, stream) workspaces.
CUBLAS_HANDLES = 2


def overhead_lines(preset: Preset) -> list[Line]:
    """`overhead: auto` for a preset; the allocator's 512-byte rounding is added by the peak
    model per tensor (peak.py), not here, since it depends on the tensors."""
    if preset.vendor == "amd":
        # ROCm: hipBLAS 128 MiB on gfx94x; hipBLASLt 76 MiB. No public figure for the HIP context.
        return [
            Line("hipBLAS workspace (gfx94x default, x2 threads)", CUBLAS_HANDLES * 128 * MIB, CUBLAS_SOURCE),
            Line("hipBLASLt workspace (default 76 MiB)", 76 * MIB, CUBLAS_SOURCE),
        ]
    workspace = 4096 * 8 * 1024 if preset.sm90 else 4096 * 1024 * 2 + 16 * 1024 * 8
    label = ":4096:8 on sm90" if preset.sm90 else ":4096:2:16:8"
    return [
        CUDA_CONTEXT,
        Line(f"cuBLAS workspace ({label}, x{CUBLAS_HANDLES} threads)", CUBLAS_HANDLES * workspace, CUBLAS_SOURCE),
        Line(f"cuBLASLt workspace (default 1 MiB, x{CUBLAS_HANDLES} threads)", CUBLAS_HANDLES * MIB, CUBLAS_SOURCE),
    ]


ALLOCATOR_GRANULE = 512  # c10/cuda/CUDACachingAllocator.cpp kMinBlockSize: every block is a multiple of 512 bytes
ALLOCATOR_SOURCE = "c10/cuda/CUDACachingAllocator.cpp kMinBlockSize = 512 (MemTracker rounds the same way on CUDA)"


# --- which torch device runs the step (device.type) ----------------------------------------
# Every preset is a CUDA or ROCm card, and memfit's budget is a GPU's memory, so a config that names no type runs on
# "cuda" (ROCm's torch is "cuda" too): its `*-mixed` activations are priced with CUDA autocast's policy
# (recipe/autocast.py), the one a GPU run gets. `device.type: cpu` prices CPU autocast's instead (what a step run on
# the CPU keeps: the policy memfit's CPU measurements run under).
DEFAULT_DEVICE_TYPE = "cuda"


def device_type(device) -> str:
    """The torch device type a config's `device` section says the step runs on (default DEFAULT_DEVICE_TYPE)."""
    stated = device.get("type") if isinstance(device, dict) else None
    return stated if stated in ("cuda", "cpu") else DEFAULT_DEVICE_TYPE

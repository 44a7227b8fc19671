"""What torch.autocast computes in, per device: the one table of the ops whose dtype under `*-mixed` depends on
which autocast runs (models/hf_act_eval's dtype roles read it; the activation rules name these ops' roles; the
`[trace]` fake step casts by it, models/traced._device_policy, and Whisper's eager softmaxes read it).

Which autocast runs is a fact of the device (a config's `device.type`, default config/presets.DEFAULT_DEVICE_TYPE).
torch 2.13.0's CUDA autocast lists (ATen/autocast_mode.h `AT_FORALL_FP32`: `pow` line 870, `layer_norm` 874;
`AT_FORALL_FP32_SET_OPT_DTYPE`: `softmax` 919, where no dtype is stated) run these ops in float32; CPU autocast's
(aten/src/ATen/autocast_mode.cpp `TORCH_LIBRARY_IMPL(aten, AutocastCPU, m)`) lists none of them, so they run in
their input's dtype. Every other op memfit's rules price is the same on both (tests/models/test_autocast_devices.py
runs both policies, the CUDA one on FakeTensorMode tensors). ROCm's autocast is the CUDA key's."""

from __future__ import annotations

AUTOCAST_DEVICES = ("cuda", "cpu")
# device -> the priced ops its autocast runs in float32 where the other keeps the low dtype
AUTOCAST_FP32_OPS = {"cuda": frozenset({"softmax", "pow", "layer_norm"}), "cpu": frozenset()}
# the ops whose dtype depends on the device (each names a dtype role "<op>:<role of its input>")
DEVICE_OPS = ("softmax", "pow", "layer_norm")


def op_dtype(op: str, device: str, input_dtype: str, mixed: bool) -> str:
    """The dtype `op` computes in (and its saved tensors are kept in) on an `input_dtype` input: float32 where the
    device's autocast lists it as an fp32 op (under `*-mixed`), else the input's dtype."""
    return "float32" if mixed and op in AUTOCAST_FP32_OPS[device] else input_dtype

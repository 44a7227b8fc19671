"""`training.paged_optimizer`: bitsandbytes' paged optimizers keep `state1`/`state2` of every parameter of 100,000+
elements in CUDA unified memory (optim/optimizer.py `get_state_buffer` -> functional.py `get_paged`:
cudaMallocManaged under `torch.frombuffer`), which PyTorch's allocator never sees and the driver pages to the host.

Measured: bitsandbytes' own PagedAdamW8bit stepped once over a tiny transformers Llama on the CPU (where
`get_state_buffer` falls back to ordinary tensors, so the state is all there to read): the bytes of the tensors it
would have made with `get_paged` on a GPU (its state1/state2 of the parameters at or over its threshold) are exactly
what `memfit check` takes off the device's peak, and nothing else moves."""

from __future__ import annotations

import inspect

import needs
import pytest

needs.module("torch")
needs.module("transformers")
bnb = needs.module("bitsandbytes")

from test_peak_transformers import hf_run_peak, hf_tiny  # noqa: E402


def _paged_reference(cfg: dict, cls=None) -> tuple[int, int]:
    """(bytes bitsandbytes would page, bytes of all its state) for the model of `cfg` after one step of `cls`
    (PagedAdamW8bit by default)."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
    optimizer = (cls or bnb.optim.PagedAdamW8bit)(model.parameters(), lr=1e-3)
    ids = torch.randint(0, cfg["vocab_size"], (1, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    paged = total = 0
    seen = set()   # the quantization maps are one tensor shared by every parameter's state
    for p in model.parameters():
        state = optimizer.state[p]
        for key, value in state.items():
            if not isinstance(value, torch.Tensor) or value.untyped_storage().data_ptr() in seen:
                continue
            seen.add(value.untyped_storage().data_ptr())
            total += value.numel() * value.element_size()
            # get_state_buffer's own test: `if not self.is_paged or p.numel() < 1e5` keeps device memory
            if key in ("state1", "state2") and not p.numel() < 1e5:
                paged += value.numel() * value.element_size()
    return paged, total


def test_the_threshold_is_bitsandbytes_own():
    source = inspect.getsource(bnb.optim.optimizer.Optimizer8bit.get_state_buffer)
    assert "p.numel() < 1e5" in source and "get_paged" in source
    assert "cget_managed_ptr" in inspect.getsource(bnb.functional.get_paged)


@pytest.mark.filterwarnings("ignore")
def test_paged_state_is_off_the_device_peak(tmp_path):
    cfg = dict(hf_tiny("llama"), vocab_size=2048)   # the embedding and the head: 131,072 elements each, paged
    paged, total = _paged_reference(cfg)
    assert 0 < paged < total
    run = dict(micro_batch=1, seq_len=8, optimizer_impl="foreach", attention="sdpa")
    on = hf_run_peak(cfg, tmp_path, optimizer="paged_adamw8bit", **run)
    off = hf_run_peak(cfg, tmp_path, optimizer="paged_adamw8bit", paged_optimizer=False, **run)
    plain = hf_run_peak(cfg, tmp_path, optimizer="adamw8bit", **run)
    # the footprint counts every state byte (it exists, in unified memory): the same as the non-paged optimizer's
    assert on["footprint"] == off["footprint"] == plain["footprint"]
    assert on["footprint"]["optimizer_state"] >= total
    # the device's peak holds all but the paged bytes; switched off, it is the non-paged optimizer's
    assert off["peak"] == plain["peak"]
    assert off["peak"]["live"]["optimizer_state"] - on["peak"]["live"]["optimizer_state"] == paged
    assert off["peak"]["bytes"] - on["peak"]["bytes"] == paged
    # a note at the optimizer says how much is paged; none when it is counted on the device
    notes = [d for d in on["diagnostics"] if d["code"] == "paged-state"]
    assert len(notes) == 1 and notes[0]["severity"] == "information" and f"{paged:,} B" in notes[0]["message"]
    assert not [d for d in off["diagnostics"] + plain["diagnostics"] if d["code"] == "paged-state"]


@pytest.mark.filterwarnings("ignore")
def test_a_32bit_paged_optimizer_pages_its_whole_state_when_the_config_says_so(tmp_path):
    """bitsandbytes' PagedAdamW (32-bit: fp32 state1/state2 through get_state_buffer): memfit reads it as AdamW with fp32
    state; `paged_optimizer: true` takes the state of each parameter at or over the threshold off the device."""
    import json
    import subprocess
    import sys

    import yaml

    cfg = dict(hf_tiny("llama"), vocab_size=2048)
    paged, total = _paged_reference(cfg, bnb.optim.PagedAdamW)
    assert 0 < paged < total
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    peaks = []
    for stated in (True, False):
        doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "optimizer": "adamw", "model": {"hf_config": "config.json"},
               "dtypes": {"optimizer_state": "float32"},
               "training": {"micro_batch": 1, "seq_len": 8, "optimizer_impl": "for_loop", "attention": "sdpa",
                            "paged_optimizer": stated}}
        (tmp_path / "run.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(tmp_path / "run.yaml")],
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        peaks.append(json.loads(done.stdout)["files"][0])
    on, off = peaks
    assert on["footprint"] == off["footprint"] and off["footprint"]["optimizer_state"] == total
    assert off["peak"]["live"]["optimizer_state"] - on["peak"]["live"]["optimizer_state"] == paged

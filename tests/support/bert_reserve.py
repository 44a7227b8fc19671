"""Issue 32: do the BERT-large rows (transformers' perf_train_gpu_one page, docs/accuracy.md) read the CUDA caching
allocator's reserve? Record the real allocation events of the rows' training steps and replay them through
tests/support/caching_allocator.py.

The step is transformers' BertForSequenceClassification built from bert-large-uncased's config (no hub), eager
attention, the rows' settings, run as the Trainer of January 2022 (transformers 4.15, torch 1.10) ran it:

- the model's parameters and buffers are put on the device first, in `Module._apply`'s order (`model.to(device)`);
- each micro-batch: `input_ids` and `labels` put on the device, forward (under autocast for fp16), the loss divided by
  the accumulation steps, backward (fp16: the loss scaled, as GradScaler.scale does);
- every `gradient_accumulation` micro-batches: the gradients unscaled in place (fp16), `clip_grad_norm_(1.0)` as torch
  1.10 wrote it (one norm per gradient, stacked), the optimizer's step, then `model.zero_grad()` (set_to_none=False in
  torch 1.10: the gradients stay allocated, zeroed);
- the optimizers as they were: transformers 4.15's own AdamW (`adamw_hf`, one parameter at a time, written out below),
  transformers' Adafactor (`scale_parameter=False, relative_step=False`, the Trainer's `adafactor`), and bitsandbytes'
  Adam8bit's state as its `Optimizer2State.init_state` makes it (uint8 state1/state2 for tensors of >= 4096 elements,
  fp32 absmax per block of 2048 as the 2022 releases blocked, fp32 states below 4096; the update is in place), the
  update kernel itself not run (a CUDA kernel: fake tensors cannot run it);
- dropout through torch.native_dropout (the fused kernel CUDA runs: a 1-byte mask), CUDA's autocast softmax (fp32) on
  the CPU's autocast (tests/support/hf_measure.py, docs/accuracy.md "CPU and CUDA autocast"); gradient checkpointing
  reentrant (torch 1.10 had no other).

Everything runs under FakeTensorMode (nothing is allocated). A TorchDispatchMode notes each storage an op creates
(its nbytes) and a weakref.finalize on the storage notes its death, in order: the event stream a CUDA run would send
the allocator (the allocator is asked for a storage's nbytes). MemTracker runs around the same steps, so its peak
is the cross-check of the stream's own peak.

Two streams per row: the step as torch 2.13 and today's transformers run it, and the same with the attention softmax
as transformers 4.15 on torch 1.10 ran it (`Softmax2022`: the fp32 additive mask, then a softmax whose backward
saved its input as well as its output, which torch 1.11 stopped doing).

What the stream cannot hold: cuBLAS's workspace (in NVML's reading, not an ATen op's output), the CUDA kernels' own
scratch, and the difference between torch 2.13's / today's
transformers' op sequence and 1.10's / 4.15's (e.g. 4.15 added an all-zero extended attention mask to the scores:
one more scores-sized temporary per layer in the forward, which the second stream adds).

    PYTHONPATH=src python tests/support/bert_reserve.py [--steps 2] [--rows 1,4] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import re
import subprocess
import sys
import time
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from torch.distributed._tools.mem_tracker import MemTracker
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

sys.path.insert(0, str(Path(__file__).resolve().parent))
import caching_allocator  # noqa: E402
from hf_measure import cuda_dropout  # noqa: E402
from peak_reference import NoModules  # noqa: E402

PUBLISHED = Path(__file__).resolve().parent / "published"
MiB = 1048576
CONTEXT = 1343 * MiB          # the page's own reading with a 1 x 1 tensor on the device (tests/support/published/memfit.toml)
V100_TOTAL = 16160 * MiB      # nvidia-smi's total for the V100-SXM2-16GB the page printed
ROWS = {   # the row's file: (micro_batch, gradient_accumulation, checkpointing, fp16, optimizer)
    "hf-bert-large-1-vanilla": (4, 1, False, False, "adamw_hf"),
    "hf-bert-large-2-accumulation": (1, 4, False, False, "adamw_hf"),
    "hf-bert-large-3-checkpointing": (1, 4, True, False, "adamw_hf"),
    "hf-bert-large-4-fp16": (4, 1, False, True, "adamw_hf"),
    "hf-bert-large-5-fp16-all": (1, 4, True, True, "adamw_hf"),
    "hf-bert-large-6-adafactor": (4, 1, False, False, "adafactor"),
    "hf-bert-large-7-adafactor-all": (1, 4, True, True, "adafactor"),
    "hf-bert-large-8-adam8bit": (4, 1, False, False, "adam8bit"),
    "hf-bert-large-9-adam8bit-all": (1, 4, True, True, "adam8bit"),
}


class StorageEvents(TorchDispatchMode):
    """("alloc", id, nbytes) when an op's output has a storage not seen before, ("free", id) when it dies."""

    def __init__(self):
        super().__init__()
        self.events: list = []
        self._ids = itertools.count()
        self._seen = WeakIdKeyDictionary()

    def note(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        if st in self._seen:
            return
        key = next(self._ids)
        self._seen[st] = key
        self.events.append(("alloc", key, st.nbytes()))
        weakref.finalize(st, self.events.append, ("free", key))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.note(t)
        return out


class CudaSoftmax(TorchFunctionMode):
    """CUDA autocast's softmax (fp32_set_opt_dtype): a half input without a stated dtype gives fp32."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (torch.softmax, F.softmax, torch.Tensor.softmax) and torch.is_autocast_enabled("cpu"):
            at = 3 if func is F.softmax else 2
            stated = kwargs.get("dtype") is not None or (len(args) > at and args[at] is not None)
            if not stated and args[0].dtype == torch.float16:
                kwargs["dtype"] = torch.float32
        return func(*args, **kwargs)


class Softmax110(torch.autograd.Function):
    """torch 1.10's `_softmax` derivative, `self: _softmax_backward_data(grad, result, dim, self)`: autograd saved the
    softmax's input beside its output (pytorch/pytorch#49600; opened as PR #65242 in September 2021 and landed as
    #66018, the backward `_softmax_backward_data(grad, output, dim, input_dtype)` saves the output only)."""

    @staticmethod
    def forward(ctx, x, dim):
        out = torch._softmax(x, dim, False)
        ctx.save_for_backward(x, out)
        ctx.dim = dim
        return out

    @staticmethod
    def backward(ctx, grad):
        x, out = ctx.saved_tensors
        return torch._softmax_backward_data(grad, out, ctx.dim, x.dtype), None


class Softmax2022(TorchFunctionMode):
    """The attention softmax as transformers 4.15 on torch 1.10 ran it: the scores plus the extended attention mask
    (`(1.0 - mask) * -10000.0`, (batch, 1, 1, seq) in the model's dtype, fp32: it promotes fp16 scores to fp32), then
    a softmax that saves its input (Softmax110)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (torch.softmax, F.softmax, torch.Tensor.softmax) and args[0].dim() == 4:
            x = args[0]
            mask = torch.zeros((x.shape[0], 1, 1, x.shape[-1]), dtype=torch.float32)
            x = x + mask
            del mask
            dim = kwargs.get("dim", args[1] if len(args) > 1 else -1)
            return Softmax110.apply(x, dim)
        return func(*args, **kwargs)


class AdamWHF:
    """transformers 4.15's AdamW (optimization.py; the Trainer's `adamw_hf`): one parameter at a time."""

    def __init__(self, params, lr=5e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        self.params, self.lr, self.betas, self.eps, self.wd = list(params), lr, betas, eps, weight_decay
        self.state: dict = {}

    @torch.no_grad()
    def step(self):
        beta1, beta2 = self.betas
        for p in self.params:
            if p.grad is None:
                continue
            grad = p.grad.data
            state = self.state.setdefault(p, {})
            if not state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p.data)
                state["exp_avg_sq"] = torch.zeros_like(p.data)
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            state["step"] += 1
            exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
            denom = exp_avg_sq.sqrt().add_(self.eps)
            step_size = self.lr * math.sqrt(1.0 - beta2 ** state["step"]) / (1.0 - beta1 ** state["step"])
            p.data.addcdiv_(exp_avg, denom, value=-step_size)
            if self.wd > 0.0:
                p.data.add_(p.data, alpha=-self.lr * self.wd)


class Adam8bitState:
    """bitsandbytes Adam8bit's allocations (Optimizer2State.init_state; the update kernels work in place)."""

    def __init__(self, params, min_8bit_size=4096, blocksize=2048):
        self.params, self.min_8bit_size, self.blocksize = list(params), min_8bit_size, blocksize
        self.state: dict = {}
        self.qmaps = None

    @torch.no_grad()
    def step(self):
        for p in self.params:
            if p.grad is None or p in self.state:
                continue
            state = self.state[p] = {"step": 0}
            if p.numel() < self.min_8bit_size:
                state["state1"] = torch.zeros_like(p, dtype=torch.float32)
                state["state2"] = torch.zeros_like(p, dtype=torch.float32)
                continue
            if self.qmaps is None:       # the dynamic maps, moved to the device once
                self.qmaps = (torch.zeros(256), torch.zeros(256))
            state["state1"] = torch.zeros_like(p, dtype=torch.uint8)
            state["state2"] = torch.zeros_like(p, dtype=torch.uint8)
            blocks = -(-p.numel() // self.blocksize)
            state["absmax1"] = torch.zeros((blocks,), dtype=torch.float32)
            state["absmax2"] = torch.zeros((blocks,), dtype=torch.float32)


def clip_grad_norm_110(parameters, max_norm=1.0):
    """torch 1.10's clip_grad_norm_ (norm_type 2)."""
    parameters = [p for p in parameters if p.grad is not None]
    total_norm = torch.norm(torch.stack([torch.norm(p.grad.detach(), 2.0) for p in parameters]), 2.0)
    clip_coef = max_norm / (total_norm + 1e-6)
    clip_coef_clamped = torch.clamp(clip_coef, max=1.0)
    for p in parameters:
        p.grad.detach().mul_(clip_coef_clamped)
    return total_norm


def apply_order(module):
    """`Module._apply`'s order (model.to(device)): children first, then the module's parameters, then buffers."""
    for child in module.children():
        yield from apply_order(child)
    yield from (p for p in module._parameters.values() if p is not None)
    yield from (b for b in module._buffers.values() if b is not None)


def model_config(layers: int | None = None, **overrides) -> transformers.BertConfig:
    raw = json.loads((PUBLISHED / "bert-large-uncased.json").read_text())
    fields = {k: v for k, v in raw.items() if k not in ("model_type", "architectures")}
    if layers is not None:
        fields["num_hidden_layers"] = layers
    fields.update(overrides)
    return transformers.BertConfig(**fields)


def record(config, micro_batch, accumulation, checkpointing, fp16, optimizer, steps=2, seq_len=512,
           track=True, marks=None, softmax_2022=False, autocast_cache=True):
    """The event stream of `steps` optimizer steps; `marks` (a list) gets (label, index into the stream) pairs.
    Returns (events, MemTracker's peak or None)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch.manual_seed(0)
    marks = [] if marks is None else marks
    recorder = StorageEvents()
    with FakeTensorMode():
        model = transformers.BertForSequenceClassification._from_config(config, attn_implementation="eager")
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        for t in apply_order(model):     # the model moved to the device
            if t.untyped_storage() not in recorder._seen:
                recorder._seen[t.untyped_storage()] = -1
                recorder.events.append(("alloc", next(recorder._ids), t.untyped_storage().nbytes()))
        params = [p for p in model.parameters() if p.requires_grad]
        opt = {"adamw_hf": lambda: AdamWHF(params),
               "adafactor": lambda: transformers.optimization.Adafactor(params, lr=5e-5, scale_parameter=False,
                                                                        relative_step=False, warmup_init=False),
               "adam8bit": lambda: Adam8bitState(params)}[optimizer]()
        tracker = MemTracker() if track else None
        with contextlib.ExitStack() as stack:
            if tracker is not None:
                tracker._mod_tracker = NoModules()     # every storage counted, no module bookkeeping (peak_reference)
                tracker.track_external(model)
                stack.enter_context(tracker)
            stack.enter_context(recorder)
            stack.enter_context(cuda_dropout())
            stack.enter_context(CudaSoftmax())
            if softmax_2022:
                stack.enter_context(Softmax2022())
            _loop(model, opt, params, micro_batch, accumulation, fp16, steps, seq_len, config.vocab_size, recorder,
                  marks, autocast_cache)
            peak = None
            if tracker is not None:
                peak = sum(v.get("Total", 0) for v in tracker.get_tracker_snapshot("peak").values())
        events = list(recorder.events)
    return events, peak


def _loop(model, opt, params, micro_batch, accumulation, fp16, steps, seq_len, vocab, recorder, marks,
          autocast_cache=True):
    scale = torch.full((1,), 65536.0) if fp16 else None          # GradScaler's _scale
    tr_loss = torch.tensor(0.0)
    model.zero_grad()
    for step in range(steps * accumulation):
        inputs = {"input_ids": torch.randint(0, vocab, (micro_batch, seq_len)),
                  "labels": torch.randint(0, 2, (micro_batch,))}
        with torch.autocast("cpu", dtype=torch.float16, enabled=fp16, cache_enabled=autocast_cache):
            loss = model(**inputs).loss
        if accumulation > 1:
            loss = loss / accumulation
        (loss * scale if fp16 else loss).backward()
        tr_loss += loss.detach()
        del inputs, loss
        if (step + 1) % accumulation == 0:
            if fp16:                   # GradScaler.unscale_: found_inf, inv_scale, the gradients unscaled in place
                found_inf = torch.full((1,), 0.0)
                inv_scale = scale.double().reciprocal().float()
                with torch.no_grad():
                    for p in params:
                        p.grad.mul_(inv_scale)
                del found_inf, inv_scale
            clip_grad_norm_110(params, 1.0)
            opt.step()
            model.zero_grad(set_to_none=False)
            marks.append((f"optimizer step {(step + 1) // accumulation}", len(recorder.events)))


def replay_marks(events, marks, capacity=None):
    """The replay's peaks and, at each mark, the reserve reached by then."""
    out = []
    for label, index in marks:
        r = caching_allocator.replay(events[:index], capacity=capacity)
        out.append((label, r.peak_reserved))
    return caching_allocator.replay(events, capacity=capacity), out


def published(name: str) -> int:
    text = (PUBLISHED / f"{name}.yaml").read_text()
    return int(re.search(r"# measured: (\d+) MiB", text).group(1)) * MiB


def memfit_bytes(name: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(PUBLISHED / f"{name}.yaml")],
                         capture_output=True, text=True, check=True)
    peak = json.loads(out.stdout)["files"][0]["peak"]
    return {"bytes": peak["bytes"], "overhead": peak["live"]["overhead"]}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rows", default="", help="row numbers, e.g. 1,4 (default: all)")
    parser.add_argument("--json", default="")
    parser.add_argument("--no-autocast-cache", action="store_true",
                        help="autocast without its cast cache (the fp16 weight copies it keeps through a forward)")
    args = parser.parse_args(argv)
    wanted = {int(x) for x in args.rows.split(",") if x}
    config = model_config()
    results = {}
    for name, (mb, accum, ckpt, fp16, optimizer) in ROWS.items():
        if wanted and int(name.split("-")[3]) not in wanted:
            continue
        mf = memfit_bytes(name)
        pub = published(name)
        row = {"published": pub, "memfit": mf["bytes"], "memfit_minus_overhead": mf["bytes"] - mf["overhead"],
               "ratio_memfit": round(mf["bytes"] / pub, 3)}
        for variant, softmax_2022 in (("torch213", False), ("softmax2022", True)):
            started = time.monotonic()
            marks: list = []
            events, tracked = record(config, mb, accum, ckpt, fp16, optimizer, steps=args.steps, marks=marks,
                                     softmax_2022=softmax_2022, autocast_cache=not args.no_autocast_cache)
            r, by_step = replay_marks(events, marks)
            capped = caching_allocator.replay(events, capacity=V100_TOTAL - CONTEXT)
            row[variant] = {"memtracker_peak": tracked, "stream_peak": r.peak_requested,
                            "allocator_peak_allocated": r.peak_allocated, "peak_reserved": r.peak_reserved,
                            "reserved_by_step": by_step, "reserved_capped": capped.peak_reserved,
                            "capped_retries": capped.retries, "events": len(events),
                            "ratio_allocated": round((r.peak_allocated + CONTEXT) / pub, 3),
                            "ratio_reserved": round((r.peak_reserved + CONTEXT) / pub, 3),
                            "ratio_reserved_capped": round((capped.peak_reserved + CONTEXT) / pub, 3),
                            "seconds": round(time.monotonic() - started, 1)}
        results[name] = row
        print(name, json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()

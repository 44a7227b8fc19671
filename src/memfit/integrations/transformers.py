"""memfit inside a Hugging Face Trainer run (TRL's trainers are Trainers): `MemfitCallback` checks the run that is
about to start against the device's memory before its first optimizer step, stops it (`on_fail="raise"`) or warns,
and can leave a record of predicted against measured memory (`record=path`, read by `memfit runs`).

    from memfit.integrations.transformers import MemfitCallback
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[MemfitCallback(device="H100-80GB")])
    trainer.train()  # DoesNotFit before the first step when the run will not fit

The config is built from the live objects (integrations/live.py) and checked by the pipeline `memfit check` runs
(`memfit.check_config`). The sequence length is the one the run fixes (TRL's `max_length`, a `max_seq_length`, a
collator's `max_length`: the longest a batch can be), else the longest batch seen so far: each training forward is
looked at, before it runs, and a longer batch than any before is checked again.

This is the only module of memfit that imports transformers.
"""

from __future__ import annotations

import atexit
import sys
import time
import uuid
import warnings

from transformers import TrainerCallback

from memfit import __version__
from memfit.api.checking import DoesNotFit, check_config, options
from memfit.integrations import live, record

__all__ = ["DoesNotFit", "MemfitCallback", "MemfitWarning"]

ON_FAIL = ("raise", "warn")
MEASURE_STEPS = 3  # the record's measured figures are taken after each of the first steps and at the end of the run
LENGTH_KEYS = ("max_length", "max_seq_length")  # TrainingArguments subclasses (TRL's SFTConfig) and collators


class MemfitWarning(UserWarning):
    """The run does not fit (on_fail="warn"), or memfit leaves something of it out."""


class MemfitCallback(TrainerCallback):
    """Check the run against the device's memory before its first optimizer step.

    device: a GPU preset name (e.g. "H100-80GB"); budget: a size as the CLI takes it (e.g. "80 GB", or an int of
    bytes). Without either, the GPU the run is on (its preset where one has its memory, else its total memory); on a
    machine without one, the run is only recorded. on_fail: "raise" stops the run with DoesNotFit before the first
    step's backward, "warn" warns and goes on. record: a file to append this run's record to (one JSON line).
    seq_len: the tokens per sequence, when the run's own setting is not where memfit looks for it."""

    def __init__(self, device: str | None = None, budget=None, on_fail: str = "raise", record: str | None = None, seq_len: int | None = None) -> None:
        if on_fail not in ON_FAIL:
            raise ValueError(f"on_fail: {on_fail!r} is not one of {', '.join(map(repr, ON_FAIL))}")
        options(device=device, budget=budget)  # a bad preset type or size is refused now, as the CLI refuses its flag
        if device is not None:
            from memfit.config import presets

            if presets.lookup(device) is None:
                near = presets.ambiguous(device) or presets.closest(device)
                raise ValueError(f"device: {device!r} is not a GPU preset{' (did you mean ' + ', '.join(near) + '?)' if near else ''}; docs/peak.md lists them")
        if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1):
            raise ValueError(f"seq_len: {seq_len!r} is not a positive number")
        self.device, self.budget, self.on_fail, self.record, self.seq_len = device, budget, on_fail, record, seq_len
        self.result = None  # memfit.Result of the last check
        self.config: dict | None = None  # the memfit config it checked (the model inline)
        self.checked_len: int | None = None
        self.seq_source: str | None = None
        self._args = self._model = self._hook = None
        self._gate = False
        self._run_id: str | None = None
        self._status: str | None = None
        self._noted: set = set()
        self._writer = False
        self._steps = 0  # optimizer steps done, as the Trainer's state last said

    # --- the Trainer's events ---------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        self._args, self._model = args, model
        self._run_id = self._status = self.checked_len = self.result = self.config = None  # a second train() is another run
        self._steps = 0
        self._writer = bool(self.record) and state.is_world_process_zero
        self._device, self._budget, self._gate = self._target(args)
        fixed, source = self._fixed_length(args, train_dataloader)
        if not hasattr(getattr(model, "config", None), "to_dict"):
            warnings.warn(f"memfit: cannot check this run ({type(model).__name__} has no transformers config: memfit needs its shapes); it goes on unchecked", MemfitWarning, stacklevel=2)
            return control
        if fixed is not None:
            self._check(fixed, source)
        elif model is not None:
            self._hook = model.register_forward_pre_hook(self._before_forward, with_kwargs=True)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        self._steps = state.global_step
        if self._writer and self._run_id and state.global_step <= MEASURE_STEPS:
            record.update(self.record, self._run_id, {"measured": self._measured(state.global_step)})
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self._unhook()
        if self._writer and self._run_id and self._status == "started":
            self._status = "completed"
            record.update(self.record, self._run_id, {"status": "completed", "measured": self._measured(state.global_step)})
        return control

    # --- what the run is checked against --------------------------------------------------
    def _target(self, args):
        """(device preset, budget, whether the gate applies)."""
        if self.device is not None or self.budget is not None:
            return self.device, self.budget, True
        device = getattr(args, "device", None)
        if getattr(device, "type", None) != "cuda":
            return None, None, False  # no GPU to check against: only recorded
        import torch

        from memfit.config.presets import PRESETS

        total = torch.cuda.get_device_properties(device).total_memory
        preset = next((p.name for p in PRESETS.values() if p.memory == total and p.vendor == "nvidia"), None)
        return (preset, None, True) if preset is not None else (None, total, True)

    def _fixed_length(self, args, dataloader):
        if self.seq_len is not None:
            return self.seq_len, "seq_len"
        for key in LENGTH_KEYS:
            value = getattr(args, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value, f"{type(args).__name__}.{key}"
        collator = getattr(dataloader, "collate_fn", None)
        for key in LENGTH_KEYS:
            value = getattr(collator, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value, f"{type(collator).__name__}.{key}"
        return None, None

    def _before_forward(self, module, args, kwargs):
        if not module.training:
            return None
        tokens = kwargs.get("input_ids")
        if tokens is None and args:
            tokens = args[0]
        if tokens is None and kwargs.get("inputs_embeds") is not None:
            length = kwargs["inputs_embeds"].shape[1]
        elif tokens is not None and getattr(tokens, "ndim", 0) >= 1:
            length = tokens.shape[-1]
        else:
            self._unhook()  # the same on every rank: no collective is left unmatched
            warnings.warn("memfit: cannot check this run (its forward takes no input_ids or inputs_embeds to read the sequence length from; "
                          "MemfitCallback(seq_len=...) names it); it goes on unchecked", MemfitWarning, stacklevel=2)
            return None
        length = _agree(int(length), self._args, "max")  # every rank checks the same length: all stop, or none
        if self.checked_len is None or length > self.checked_len:
            self._check(length, "the longest batch so far")
        return None

    # --- the check --------------------------------------------------------------------------
    def _check(self, seq_len: int, source: str) -> None:
        args, model = self._args, self._model
        try:
            doc, notes = live.memfit_config(args, model, seq_len, device=self._device, budget=self._budget)
        except Exception as error:  # noqa: BLE001 (what memfit cannot read never stops a run: it goes on unchecked)
            self._unhook()
            warnings.warn(f"memfit: cannot check this run ({type(error).__name__}: {error}); it goes on unchecked", MemfitWarning, stacklevel=2)
            return
        for note in notes:
            if note not in self._noted:
                self._noted.add(note)
                warnings.warn(f"memfit: {note}", MemfitWarning, stacklevel=2)
        result = check_config(doc, base="", name="<trainer>", settings=False)
        self.result, self.config, self.checked_len, self.seq_source = result, doc, seq_len, source
        judged = result.needs is not None and result.budget is not None  # a figure and a budget: the gate can say
        fails = self._gate and judged and not result.fits
        if self._gate:
            fails = bool(_agree(int(fails), args, "max"))
        if self._writer:
            self._write(result, doc, seq_len, source)
        if self._gate and not judged:
            warnings.warn(f"memfit: cannot check this run; it goes on unchecked:\n{result.report().rstrip()}", MemfitWarning, stacklevel=2)
        if not fails:
            return
        if self.on_fail == "raise":
            self._unhook()
            if self._writer:
                self._status = "stopped"
                record.update(self.record, self._run_id, {"status": "stopped"})
            raise DoesNotFit(result)
        warnings.warn(f"memfit: this run does not fit ({source}: {seq_len} tokens):\n{result.report().rstrip()}", MemfitWarning, stacklevel=2)

    def _predicted(self, result, seq_len: int, source: str) -> dict:
        return {
            "peak": result.peak,
            "phase": result.phase,
            "breakdown": result.breakdown,
            "footprint": result.footprint,
            "budget": result.budget,
            "fits": result.fits if self._gate else None,
            "seq_len": seq_len,
            "seq_source": source,
            "diagnostics": [{"code": d.code, "severity": d.severity, "message": d.message} for d in result.diagnostics],
        }

    def _write(self, result, doc: dict, seq_len: int, source: str) -> None:
        predicted = self._predicted(result, seq_len, source)
        if self._run_id is not None:
            record.update(self.record, self._run_id, {"config": doc, "predicted": predicted})
            return
        self._run_id, self._status = uuid.uuid4().hex, "started"
        entry = {
            "record": record.LAYOUT,
            "id": self._run_id,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "memfit": __version__,
            "status": "started",
            "device": self._device_name(),
            "world_size": max(int(getattr(self._args, "world_size", 1) or 1), 1),
            "versions": record.versions(),
            "config": doc,
            "predicted": predicted,
            "measured": self._measured(0),
            "error": None,
        }
        record.append(self.record, entry)
        atexit.register(self._at_exit)

    def _device_name(self) -> str:
        device = getattr(self._args, "device", None)
        if getattr(device, "type", None) == "cuda":
            import torch

            return torch.cuda.get_device_name(device)
        return str(getattr(device, "type", "cpu"))

    def _measured(self, steps: int) -> dict:
        device = getattr(self._args, "device", None)
        if getattr(device, "type", None) != "cuda":
            return {"allocated": None, "reserved": None, "steps": steps}
        import torch

        return {"allocated": torch.cuda.max_memory_allocated(device), "reserved": torch.cuda.max_memory_reserved(device), "steps": steps}

    def _at_exit(self) -> None:
        """A run whose line still says `started` when the process ends did not finish: the exception that ended it
        (an out-of-memory error is `oom`), or `interrupted`."""
        if self._status != "started" or not self._run_id:
            return
        error = getattr(sys, "last_value", None)
        if error is None:
            status, said = "interrupted", None
        elif _out_of_memory(error):
            status, said = "oom", f"{type(error).__name__}: {str(error)[:500]}"
        else:
            status, said = "failed", f"{type(error).__name__}: {str(error)[:500]}"
        self._status = status
        try:
            record.update(self.record, self._run_id, {"status": status, "error": said, "measured": self._measured(self._steps)})
        except OSError:
            pass

    def _unhook(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None


def _out_of_memory(error: BaseException) -> bool:
    try:
        import torch

        if isinstance(error, torch.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):
        pass
    return isinstance(error, MemoryError) or "out of memory" in str(error).lower()


def _agree(value: int, args, op: str) -> int:
    """The largest `value` over the ranks of a multi-process run (the value itself in one process)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return value
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    device = getattr(args, "device", None) if dist.get_backend() == "nccl" else "cpu"
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())

"""One real training step of the tiny Llama of fsdp1_cast_worker.py without FSDP (one process on the CPU), transformers'
gradient checkpointing on (non-reentrant, its default), under bf16 CPU autocast or in fp32, reporting MemTracker's
peak of each phase and the forward's worst moment by the innermost module running (the worker's own forward hooks:
they allocate nothing).

Run as a script by tests/ledger/test_checkpointed_forward.py under a hard timeout:
    python tests/support/checkpointed_forward_worker.py OUT.json PRECISION(32-true|bf16-mixed)
"""

import contextlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import fsdp1_cast_worker as worker  # noqa: E402
import hf_measure  # noqa: E402
import peak_reference as ref  # noqa: E402


def main(out: str, precision: str) -> None:
    torch.set_num_threads(1)
    cfg = worker.config()
    model = hf_measure.build(cfg, "sdpa", "32-true", None)
    model.activation_checkpointing_enable()
    running = []  # the modules whose forward is running, innermost last
    for name, module in model.named_modules():
        if name:
            module.register_forward_pre_hook(lambda m, a, name=name: running.append(name) and None)
            module.register_forward_hook(lambda m, a, o, name=name: running.pop() and None)

    class Phases(ref.PhaseTracker):
        def _update_peak_stats(self, peak_state):
            super()._update_peak_stats(peak_state)
            now = self._curr_mem_snap[ref.CPU]["Total"]
            if self.phase == "forward":
                inner = running[-1] if running else ""
                self.by_module[inner] = max(self.by_module.get(inner, 0), now)
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), now)

    opt = torch.optim.SGD(model.parameters(), lr=1e-4, foreach=False)
    batch = hf_measure.inputs(cfg, worker.MICRO_BATCH, worker.SEQ_LEN, seed=1)
    tracker = Phases(model.parameters())
    tracker.peaks, tracker.by_module = {}, {}
    # the loss (transformers computes it in the model's forward, after the head): its own phase, as memfit's timeline
    model.lm_head.register_forward_hook(lambda *_: setattr(tracker, "phase", "loss"))
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16-mixed" else contextlib.nullcontext
    tracker = ref.warm_step(model, opt, batch["input_ids"], batch["labels"], 1, autocast, tracker, modules=False)
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"peaks": tracker.peaks, "by_module": tracker.by_module}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""Run by an interpreter with litgpt 0.5.13 (LitGPT's HEAD 26857050; MEMFIT_LITGPT_PYTHON, .ci/litgpt-requirements.txt):
`litgpt pretrain`'s own step, its own code, on a tiny model, under MemTracker; the peak and the phase it is reached in,
printed as JSON (one line per spec, in order).

    python litgpt_pretrain_step.py '[{"fields": {...}, "precision": "bf16-mixed", "micro_batch": 2, "seq_len": 256,
                                      "tie_embeddings": false}, ...]'

What it runs is litgpt/pretrain.py's at 26857050 (setup, main, fit), on the CPU:
- `lightning.Fabric(accelerator="cpu", devices=1, strategy="auto", precision=...)` (setup: one device, no FSDP);
- main: `GPT(Config(**fields))` under `fabric.init_module(empty_init=True)`, `initialize_weights(fabric, model, ...)`,
  the tied head where `tie_embeddings`, `model.max_seq_length = seq_len`, `fabric.setup(model)`; `torch.compile(model)`
  is left out (memfit prices the eager step and says so);
- the optimizer: `instantiate_torch_optimizer("AdamW", model.parameters(), fused=True)` (main's
  `extra_kwargs = {"fused": fabric.device.type == "cuda"}`: fused on a GPU; torch's fused AdamW runs on the CPU too),
  `fabric.setup_optimizers`;
- fit's step: `logits = model(input_ids)`, `loss = chunked_cross_entropy(logits, targets)`,
  `fabric.backward(loss / 1)`, `fabric.clip_gradients(model, optimizer, max_norm=1.0)`, `optimizer.step()`,
  `optimizer.zero_grad()`; `logits` stays bound (fit's local) until the next step's forward returns.
Two warm-up steps, then two steps under MemTracker (peak_reference.PhaseTracker: the phase of the peak).
"""

import json
import sys
from pathlib import Path

import lightning as L
import torch
from litgpt.config import Config
from litgpt.model import GPT
from litgpt.pretrain import initialize_weights
from litgpt.utils import chunked_cross_entropy, instantiate_torch_optimizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peak_reference import tracked  # noqa: E402  (imports torch only)


def run(spec: dict) -> dict:
    fabric = L.Fabric(accelerator="cpu", devices=1, strategy="auto", precision=spec["precision"])
    fabric.seed_everything(42)
    config = Config(**spec["fields"])
    with fabric.init_module(empty_init=True):
        model = GPT(config)
    initialize_weights(fabric, model, n_layer=config.n_layer, n_embd=config.n_embd)
    if spec.get("tie_embeddings"):
        model.transformer.wte.weight = model.lm_head.weight
    model.max_seq_length = spec["seq_len"]
    model = fabric.setup(model)
    optimizer = instantiate_torch_optimizer("AdamW", model.parameters(), fused=True)
    optimizer = fabric.setup_optimizers(optimizer)
    b, t = spec["micro_batch"], spec["seq_len"]
    data = torch.randint(0, config.vocab_size, (b, t + 1), generator=torch.Generator().manual_seed(1))
    input_ids = data[:, 0:t].contiguous().long()
    targets = data[:, 1:(t + 1)].contiguous().long()
    loop = {}

    def step(tracker=None):
        def phase(name):
            if tracker is not None:
                tracker.phase = name

        phase("forward")
        logits = model(input_ids)
        loop["logits"] = logits   # fit's `logits`, rebound by the next step's forward
        loss = chunked_cross_entropy(logits, targets)
        phase("backward")
        fabric.backward(loss / 1)
        phase("optimizer_step")
        fabric.clip_gradients(model, optimizer, max_norm=1.0)
        optimizer.step()
        optimizer.zero_grad()
        del logits, loss

    tracker = tracked(step, model, optimizer, input_ids, targets, times=2)
    peak, phase = tracker.peak()
    categories = {str(k): v for k, v in tracker.get_tracker_snapshot("peak")[torch.device("cpu")].items() if v}
    return {"bytes": peak, "phase": phase, "categories": categories,
            "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}


if __name__ == "__main__":
    given = json.loads(sys.argv[1])
    for one in (given if isinstance(given, list) else [given]):
        print(json.dumps(run(one)), flush=True)

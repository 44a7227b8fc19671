"""Run by an interpreter with litgpt 0.5.13 (LitGPT's HEAD 26857050, the config hub's HEAD; MEMFIT_LITGPT_PYTHON,
.ci/litgpt-requirements.txt): LitGPT's own fine-tuning step, its own code, on a tiny model, under MemTracker; the
peak and the phase it is reached in, printed as JSON (one line per spec, in order).

    python litgpt_head_step.py '[{"checkpoint_dir": DIR, "script": "lora", "lora": {...}, "micro_batch": 2,
                                  "seq_len": 256}, ...]'

What it runs is litgpt 0.5.13's (litgpt/finetune/lora.py and full.py, setup and fit):
- the model is `Config.from_file(checkpoint_dir / "model_config.yaml")` (Config.from_checkpoint's first choice),
  `litgpt.lora.GPT` with the spec's lora_* arguments (lora.py) or `litgpt.model.GPT` (full.py), built under
  `fabric.init_module()` of a `lightning.Fabric(accelerator="cpu", devices=1, precision="bf16-true")`;
  lora.py: `mark_only_lora_as_trainable(model)`, `fabric.setup_module(model)`; full.py: `fabric.setup(model)`;
- the optimizer is `instantiate_torch_optimizer("AdamW", model.parameters())` with `foreach=True` (what torch picks
  for CUDA tensors; on the CPU its default is the for-loop), `fabric.setup_optimizers`;
- fit's step: lora.py `logits = model(input_ids, lm_head_chunk_size=128)`, `logits[-1] = logits[-1][..., :-1, :]`,
  `loss = chunked_cross_entropy(logits, targets[..., 1:])`; full.py `logits = model(input_ids)`,
  `loss = chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])`; then `fabric.backward(loss / 1)`,
  `optimizer.step()`, `optimizer.zero_grad()`; `logits` stays bound (fit's local) until the next step's forward
  returns;
- LoRA's dropout goes through torch.native_dropout, as on CUDA (a bool mask; the CPU's F.dropout keeps a mask in the
  input's dtype).
Two warm-up steps, then two steps under MemTracker (peak_reference.PhaseTracker: the phase of the peak).
"""

import json
import sys
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from litgpt import lora as litgpt_lora
from litgpt.config import Config
from litgpt.model import GPT
from litgpt.utils import chunked_cross_entropy, instantiate_torch_optimizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peak_reference import tracked  # noqa: E402  (imports torch only)

LORA_KEYS = ("r", "alpha", "dropout", "query", "key", "value", "projection", "mlp", "head")


def _native_dropout(input, p=0.5, training=True, inplace=False):
    if not training or p == 0.0:
        return input
    out, _mask = torch.native_dropout(input, p, True)
    return input.copy_(out) if inplace else out


def build(spec: dict, fabric):
    config_file = Path(spec["checkpoint_dir"]) / "model_config.yaml"
    if spec["script"] == "lora":
        lora = spec["lora"]
        config = litgpt_lora.Config.from_file(config_file, **{f"lora_{k}": lora[k] for k in LORA_KEYS})
        with fabric.init_module(empty_init=False):
            model = litgpt_lora.GPT(config)
        litgpt_lora.mark_only_lora_as_trainable(model)
        model = fabric.setup_module(model)
    else:
        config = Config.from_file(config_file)
        with fabric.init_module(empty_init=False):
            model = GPT(config)
        model = fabric.setup(model)
    optimizer = instantiate_torch_optimizer({"class_path": "torch.optim.AdamW", "init_args": {"foreach": True}},
                                            model.parameters())
    return model, fabric.setup_optimizers(optimizer), config


def run(spec: dict) -> dict:
    fabric = L.Fabric(accelerator="cpu", devices=1, precision="bf16-true")
    fabric.seed_everything(1337)
    model, optimizer, config = build(spec, fabric)
    b, t = spec["micro_batch"], spec["seq_len"]
    input_ids = torch.randint(0, config.vocab_size, (b, t), generator=torch.Generator().manual_seed(1))
    targets = input_ids.clone()
    loop = {}

    def step(tracker=None):
        def phase(name):
            if tracker is not None:
                tracker.phase = name

        phase("forward")
        if spec["script"] == "lora":
            logits = model(input_ids, lm_head_chunk_size=128)
            loop["logits"] = logits   # fit's `logits`, rebound by the next step's forward
            logits[-1] = logits[-1][..., :-1, :]
            loss = chunked_cross_entropy(logits, targets[..., 1:])
        else:
            logits = model(input_ids)
            loop["logits"] = logits
            loss = chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])
        phase("backward")
        fabric.backward(loss / 1)
        phase("optimizer_step")
        optimizer.step()
        optimizer.zero_grad()
        del logits

    original, F.dropout = F.dropout, _native_dropout
    try:
        tracker = tracked(step, model, optimizer, input_ids, targets, times=2)
        peak, phase = tracker.peak()
    finally:
        F.dropout = original
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    categories = {str(k): v for k, v in tracker.get_tracker_snapshot("peak")[torch.device("cpu")].items() if v}
    return {"bytes": peak, "phase": phase, "categories": categories, "trainable_bytes": trainable,
            "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}


if __name__ == "__main__":
    given = json.loads(sys.argv[1])
    for one in (given if isinstance(given, list) else [given]):
        print(json.dumps(run(one)), flush=True)

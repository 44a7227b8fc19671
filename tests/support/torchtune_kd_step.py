"""Run by a torchtune 0.6.1 interpreter (MEMFIT_TORCHTUNE_PYTHON): one knowledge-distillation step of a tiny LoRA
Llama 3 student with a larger Llama 3 teacher, the way recipes/knowledge_distillation_single_device.py (0.6.1) runs
it, under MemTracker (peak), printed as JSON.

    python torchtune_kd_step.py '{"dtype": "bf16", "chunks": 8, "student": {...}, "teacher": {...}, "batch_size": 2, "seq_len": 64}'

What it does is the recipe's:
- `_setup_model`: the student `lora_llama3(**student)` under `training.set_default_dtype(dtype)`, only its adapters
  trainable (`set_trainable_params(model, get_adapter_params(model))`);
- `_setup_teacher_model`: the teacher `llama3(**teacher)` under the same default dtype, `model.eval()`, no gradients
  (the recipe never hands its parameters to the optimizer; they are frozen here as they are frozen in effect);
- `chunks` > 0: `loss: CEWithChunkedOutputLoss` and `kd_loss: ForwardKLWithChunkedOutputLoss` with that
  num_output_chunks, `set_num_output_chunks` on both models; `chunks` 0: `torch.nn.CrossEntropyLoss` and
  `ForwardKLLoss` on the whole logits;
- `_loss_step`: the student's forward, then `with torch.no_grad(): teacher_logits = self._teacher_model(tokens)`, the
  labels shifted with hstack, `kd_loss = self._kd_loss_fn(logits, teacher_logits, labels)`,
  `loss = self._loss_fn(logits, labels)`, `del logits; del teacher_logits`;
  `(1 - kd_ratio) * class_loss + kd_ratio * kd_loss` then `.backward()`;
- torch.optim.AdamW(fused=True) over the adapters, `optimizer.step(); optimizer.zero_grad(set_to_none=True)`.
Two warm-up steps first.
"""

import json
import sys
from pathlib import Path

import torch
from torchtune import training
from torchtune.models.llama3 import llama3, lora_llama3
from torchtune.modules.loss import CEWithChunkedOutputLoss, ForwardKLLoss, ForwardKLWithChunkedOutputLoss
from torchtune.modules.peft import get_adapter_params, set_trainable_params

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peak_reference import CPU, PhaseTracker  # noqa: E402  (imports torch only)


def run(spec: dict) -> dict:
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[spec["dtype"]]
    torch.manual_seed(0)
    with training.set_default_dtype(dtype):
        model = lora_llama3(**spec["student"])
        teacher = llama3(**spec["teacher"])
    set_trainable_params(model, get_adapter_params(model))
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    chunks = spec["chunks"]
    if chunks:
        loss_fn, kd_loss_fn = CEWithChunkedOutputLoss(num_output_chunks=chunks), ForwardKLWithChunkedOutputLoss(num_output_chunks=chunks)
        model.set_num_output_chunks(chunks)
        teacher.set_num_output_chunks(chunks)
    else:
        loss_fn, kd_loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-100), ForwardKLLoss(ignore_index=-100)
    optimizer = torch.optim.AdamW(trainable, fused=True)
    b, s = spec["batch_size"], spec["seq_len"]
    tokens = torch.randint(0, spec["student"]["vocab_size"], (b, s))
    labels_in = tokens.clone()
    ignore_labels_cache = torch.full((b, 1), -100)
    kd_ratio = 0.5

    def loss_step(tokens, labels):
        logits = model(tokens)
        with torch.no_grad():
            teacher_logits = teacher(tokens)
        labels = torch.hstack((labels[..., 1:], ignore_labels_cache[: labels.shape[0]]))
        if not isinstance(logits, list):
            labels = labels.reshape(-1)
            logits = logits.reshape(-1, logits.size(-1))
            teacher_logits = teacher_logits.reshape(-1, teacher_logits.size(-1))
        kd_loss = kd_loss_fn(logits, teacher_logits, labels)
        loss = loss_fn(logits, labels)
        del logits
        del teacher_logits
        return loss, kd_loss

    def step(tracker=None):
        def phase(name):
            if tracker is not None:
                tracker.phase = name

        phase("forward")
        class_loss, kd_loss = loss_step(tokens, labels_in)
        loss = (1 - kd_ratio) * class_loss + kd_ratio * kd_loss
        phase("backward")
        loss.backward()
        phase("optimizer_step")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    tracker = PhaseTracker(list(model.parameters()))
    tracker.track_external(model, teacher, tokens, labels_in, optimizer)
    with tracker:
        step(tracker)
    peak = tracker.get_tracker_snapshot("peak")[CPU]
    return {"bytes": peak["Total"], "phase": tracker.peak_phase,
            "teacher_bytes": sum(p.numel() * p.element_size() for p in teacher.parameters())}


if __name__ == "__main__":
    given = json.loads(sys.argv[1])
    for one in (given if isinstance(given, list) else [given]):
        print(json.dumps(run(one)), flush=True)

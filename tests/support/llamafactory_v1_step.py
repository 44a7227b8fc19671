"""A faithful pure-torch port of LLaMA-Factory v1's SFT step (hiyouga/LLaMA-Factory at ff6d4d12e, under
src/llamafactory/v1/), run on a tiny transformers model under MemTracker (tests/support/peak_reference.py): the
reference memfit's figure for a v1 config is checked against (tests/ledger/test_second_loss.py).

What the step runs, line by line (one GPU: no mesh, fsdp2 wraps nothing; cp_size 1; no deepspeed):
- core/model_engine.py _init_model: the checkpoint in its own dtype; a full fine-tune cast `model.to(torch.float32)`;
  with peft_config lora, peft's get_peft_model (adapters in float32, autocast_adapter_dtype's default).
- core/base_trainer.py __init__ (line 95): `self.model.gradient_checkpointing_enable({"use_reentrant": False})` when
  enable_activation_checkpointing (the default); `_init_optimizer` (line 208): `torch.optim.AdamW(_trainable_params,
  lr=...)` (foreach, its default on a device).
- fit (lines 261-322), per micro-batch: `loss = self.compute_loss(micro_batch)` (line 280), scaled by
  `mini_step_valid_tokens * self.dp_size / (step_valid_tokens + 1e-6)`, `loss.backward()` (line 290); then
  `torch.nn.utils.get_total_norm(grads)` (line 306), `clip_grads_with_norm_` (line 311), `self.optimizer.step()`
  (line 319), `self.lr_scheduler.step()`, `self.optimizer.zero_grad()` (line 322: set_to_none, its default).
- trainers/sft_trainer.py SFTTrainer.compute_loss (lines 25-29): `shift_loss_weights = batch["loss_weights"]...[..., 1:]`,
  `log_probs = self.compute_log_probs(self.model, batch)`, `loss = (-log_probs * shift_loss_weights).sum() /
  (shift_loss_weights.sum() + 1e-6)`.
- core/base_trainer.py compute_log_probs (lines 226-243): `model_inputs` = every tensor of the batch (input_ids,
  attention_mask, labels and loss_weights: core/utils/collation.py pad_and_truncate pads each key of the sample), so
  `outputs = model(**model_inputs)` (line 239) computes transformers' own causal-LM loss (ForCausalLMLoss: its own
  `logits.float()`, a log-softmax kept for backward while `outputs` is alive); then `logits = outputs.logits.float()`
  (line 240), `shift_labels = labels[..., 1:].contiguous().view(-1)` (241), `shift_logits = logits[..., :-1,
  :].contiguous().view(shift_labels.size(0), -1)` (242), `return -F.cross_entropy(shift_logits, shift_labels,
  reduction="none").view(batch_size, -1)` (243). `outputs` (and with it the model's loss and its graph) is freed when
  compute_log_probs returns.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def batch(cfg: dict, micro_batch: int, seq_len: int, seed: int = 1) -> dict:
    """A padded micro-batch as core/utils/collation.py pad_and_truncate makes it: int64 input_ids, attention_mask and
    labels, float32 loss_weights (torch.tensor of Python floats), every token labelled."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg["vocab_size"], (micro_batch, seq_len), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone(),
            "loss_weights": torch.ones(micro_batch, seq_len, dtype=torch.float32)}


def compute_log_probs(model, batch: dict) -> torch.Tensor:
    """core/base_trainer.py BaseTrainer.compute_log_probs (lines 226-243), on the CPU (`.to(self.device)` a no-op)."""
    batch_size, _ = batch["labels"].shape
    model_inputs = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}   # labels included
    labels = batch["labels"]
    outputs = model(**model_inputs)   # line 239: the model's own loss too (labels passed)
    logits = outputs.logits.float()   # line 240
    shift_labels = labels[..., 1:].contiguous().view(-1)   # line 241
    shift_logits = logits[..., :-1, :].contiguous().view(shift_labels.size(0), -1)   # line 242
    return -F.cross_entropy(shift_logits, shift_labels, reduction="none").view(batch_size, -1)   # line 243


def compute_loss(model, batch: dict) -> torch.Tensor:
    """trainers/sft_trainer.py SFTTrainer.compute_loss (lines 25-29)."""
    shift_loss_weights = batch["loss_weights"][..., 1:]
    log_probs = compute_log_probs(model, batch)
    return (-log_probs * shift_loss_weights).sum() / (shift_loss_weights.sum() + 1e-6)


def valid_tokens(batches: list) -> int:
    """utils/helper.py compute_valid_tokens."""
    return sum((b["labels"] != IGNORE_INDEX).sum().item() for b in batches)


def build(cfg: dict, lora: dict | None, checkpointing: bool, quantization: dict | None = None):
    """core/model_engine.py's model: the checkpoint's dtype (cfg's torch_dtype), float32 for a full fine-tune, peft
    adapters in float32 with LoRA (on a bitsandbytes 4-bit base with `quantization`: plugins/model_plugins/
    quantization.py quantization_with_bnb, no prepare_model_for_kbit_training); gradient checkpointing as
    core/base_trainer.py enables it."""
    import hf_measure

    stored = cfg.get("torch_dtype", "float32")
    precision = {"bfloat16": "bf16-true", "float16": "16-true"}.get(stored, "32-true")
    model = hf_measure.build(cfg, precision=precision if lora else "32-true",
                             lora={**lora, "target_modules": lora.get("target_modules", "all-linear")} if lora else None,
                             quantization=quantization)
    if lora is None:
        model = model.to(torch.float32)   # model_engine.py: a full fine-tune in float32
    if checkpointing:
        model.gradient_checkpointing_enable({"use_reentrant": False})   # base_trainer.py line 95
    model.train()
    return model


def measure(cfg: dict, *, micro_batch: int, seq_len: int, lora: dict | None = None, checkpointing: bool = True,
            accumulation: int = 1, max_grad_norm: float = 1.0, quantization: dict | None = None) -> dict:
    """One warm optimizer step of `accumulation` micro-batches as fit (lines 261-322) runs it, under MemTracker:
    {"bytes", "phase", "parameters", "optimizer_state"}."""
    import hf_measure
    import peak_reference as ref

    model = build(cfg, lora, checkpointing, quantization)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4)   # base_trainer.py _init_optimizer (foreach on a device)
    micro_batches = [batch(cfg, micro_batch, seq_len, seed=1 + n) for n in range(accumulation)]
    dp_size = 1

    def step(tracker=None):
        def phase(name):
            if tracker is not None:
                tracker.phase = name

        step_valid_tokens = valid_tokens(micro_batches)
        for micro in micro_batches:
            phase("forward")
            loss = compute_loss(model, micro)
            loss = loss * valid_tokens([micro]) * dp_size / (step_valid_tokens + 1e-6)
            phase("backward")
            loss.backward()
            loss.item()
            del loss
        phase("optimizer_step")
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        total_norm = torch.nn.utils.get_total_norm(grads)
        torch.nn.utils.clip_grads_with_norm_(model.parameters(), max_grad_norm, total_norm)
        del grads
        optimizer.step()
        optimizer.zero_grad()

    with hf_measure.cuda_dropout():
        tracker = ref.tracked(step, model, optimizer, *[t for b in micro_batches for t in b.values()])
    snap = tracker.get_tracker_snapshot("peak")[ref.CPU]
    cats = {k.value if hasattr(k, "value") else k: v for k, v in snap.items()}
    return {"bytes": snap["Total"], "phase": tracker.peak_phase, "parameters": cats["Parameter"] + cats["Buffer"],
            "optimizer_state": ref.state_bytes(optimizer, scalars=False), "categories": cats}

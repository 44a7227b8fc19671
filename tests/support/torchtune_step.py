"""Run by a torchtune 0.6.1 interpreter (its own venv): one training step of a tiny Llama 3 the way torchtune's
single-device recipes run it, under MemTracker (peak) and saved_tensors_hooks (what autograd keeps), printed as JSON.

    python torchtune_step.py '{"dtype": "bf16", "lora": false, "chunks": 8, "in_bwd": false, "builder": {...}}'
    python torchtune_step.py '[{...}, {...}]'   (several steps in one process, one JSON line per step, in order:
                                                 torchtune's import is most of the time)

What it does is the recipe's (recipes/full_finetune_single_device.py and lora_finetune_single_device.py, 0.6.1):
- the model built under `training.set_default_dtype(dtype)` (LoRA: `set_trainable_params(model, get_adapter_params(model))`);
- `linear` true: `loss: LinearCrossEntropyLoss(num_output_chunks=chunks)` (torchtune's main branch, copied into
  torchtune_linear_loss.py with its source) and, as the recipes' `_setup` does for an `SFTLoss`,
  `loss.set_model_output(model)`: the model returns its final norm's output, the loss runs the output projection a
  chunk of the (unmasked) tokens at a time; `_loss_step` passes the outputs and labels unreshaped;
- else `chunks` > 0: `loss: CEWithChunkedOutputLoss(num_output_chunks=chunks)` and, as `_setup_model` does for it,
  `model.set_num_output_chunks(chunks)`: the model returns the logits as a list of chunks (TransformerDecoder.chunked_output);
  `chunks` 0: `torch.nn.CrossEntropyLoss` on the model's `self.output(h).float()` (TransformerDecoder.unembed);
- `_loss_step`: labels shifted with hstack and the ignore index; `loss = self._loss_fn(logits, labels); del logits`;
- `in_bwd`: `_setup_optimizer(optimizer_in_bwd=True)`: one optimizer per parameter and
  `training.register_optim_in_bwd_hooks` (each parameter steps and zeroes its gradient in its post-accumulate hook);
  otherwise one optimizer over the trainable parameters, `optimizer.step(); optimizer.zero_grad(set_to_none=True)`.
The optimizer is torch.optim.AdamW(fused=True) (torchtune's configs' `fused: True`). Two warm-up steps first.
"""

import json
import sys
from pathlib import Path

import torch
from torchtune import training
from torchtune.models.llama3 import llama3, lora_llama3
from torchtune.models.llama3_2 import llama3_2, lora_llama3_2
from torchtune.modules.loss import CEWithChunkedOutputLoss
from torchtune.modules.peft import get_adapter_params, set_trainable_params

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peak_reference import CPU, PhaseTracker  # noqa: E402  (imports torch only)
from torchtune_linear_loss import LinearCrossEntropyLoss, add_skip_output_layer  # noqa: E402


def run(spec: dict) -> dict:
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[spec["dtype"]]
    torch.manual_seed(0)
    builder = dict(spec["builder"])
    with training.set_default_dtype(dtype):
        # `family` llama3_2: its builders (tie_word_embeddings: the output projection a TiedLinear of the embedding)
        full, lora = (llama3_2, lora_llama3_2) if spec.get("family") == "llama3_2" else (llama3, lora_llama3)
        model = lora(**builder) if spec["lora"] else full(**{k: v for k, v in builder.items() if not k.startswith(("lora", "apply_lora", "use_dora"))})
    if spec["lora"]:
        set_trainable_params(model, get_adapter_params(model))
    trainable = [p for p in model.parameters() if p.requires_grad]
    chunks = spec["chunks"]
    if spec.get("linear"):
        add_skip_output_layer(model)
        loss_fn = LinearCrossEntropyLoss(num_output_chunks=chunks)
        loss_fn.set_model_output(model)
    elif chunks:
        loss_fn = CEWithChunkedOutputLoss(num_output_chunks=chunks)
        model.set_num_output_chunks(chunks)
    else:
        loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-100)
    if spec["in_bwd"]:
        optim_dict = {p: torch.optim.AdamW([p], fused=True) for p in model.parameters() if p.requires_grad}
        training.register_optim_in_bwd_hooks(model=model, optim_dict=optim_dict)
        optimizer = None
    else:
        optimizer = torch.optim.AdamW(trainable, fused=True)
    b, s = spec["batch_size"], spec["seq_len"]
    tokens = torch.randint(0, builder["vocab_size"], (b, s))
    labels_in = tokens.clone()
    ignore_labels_cache = torch.full((b, 1), -100)


    def loss_step(tokens, labels):
        logits = model(tokens)
        labels = torch.hstack((labels[..., 1:], ignore_labels_cache[: labels.shape[0]]))
        if not isinstance(logits, list) and not spec.get("linear"):
            labels = labels.reshape(-1)
            logits = logits.reshape(-1, logits.size(-1))
        loss = loss_fn(logits, labels)
        del logits
        return loss


    def step(tracker=None):
        def phase(name):
            if tracker is not None:
                tracker.phase = name

        phase("forward")
        loss = loss_step(tokens, labels_in)
        phase("backward")
        loss.backward()
        phase("optimizer_step")
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return loss


    for _ in range(2):
        step()
    tracker = PhaseTracker(list(model.parameters()))
    tracker.track_external(model, tokens, labels_in, *(optim_dict.values() if optimizer is None else [optimizer]))
    with tracker:
        step(tracker)
    peak = tracker.get_tracker_snapshot("peak")[CPU]

    # what autograd keeps: every tensor saved for backward during the forward and the loss, each storage once
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_step(tokens, labels_in)
    kept = sum(n for ptr, n in saved.items() if ptr not in params)
    loss.backward()
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    return {"bytes": peak["Total"], "phase": tracker.peak_phase, "saved": kept,
            "trainable_bytes": sum(p.numel() * p.element_size() for p in trainable)}


if __name__ == "__main__":
    given = json.loads(sys.argv[1])
    for one in (given if isinstance(given, list) else [given]):
        print(json.dumps(run(one)), flush=True)

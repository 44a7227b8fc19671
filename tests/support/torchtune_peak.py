"""Run by a torchtune 0.6.1 interpreter (test_torchtune_peak.py): one eager LoRA/QLoRA step of torchtune's own
modules as recipes/lora_finetune_single_device.py sets it up, its peak under MemTracker (peak_reference.measure: the
third step, after two warm ones), printed as JSON.

    python torchtune_peak.py '{"quantize_base": false, "ac": true, "batch": 2, "seq": 128, "builder": {...}}'

_setup_model: the model built under `training.set_default_dtype(bf16)` (quantize_base: its base weights torchao NF4,
as qlora_llama3 builds them), `set_trainable_params(model, get_adapter_params(model))`, with checkpointing
`training.set_activation_checkpointing(model, auto_wrap_policy={modules.TransformerSelfAttentionLayer})`; _setup_loss:
`model.set_num_output_chunks(loss_fn.num_output_chunks)` for CEWithChunkedOutputLoss; _loss_step: the labels shifted
with ignore_index, `loss_fn(model(tokens), labels)`; the optimizer: the shipped configs' fused AdamW."""
import json
import sys
from pathlib import Path

import torch
from torchtune import modules, training
from torchtune.models.llama3 import lora_llama3
from torchtune.modules.loss import CEWithChunkedOutputLoss
from torchtune.modules.peft import get_adapter_params, set_trainable_params

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peak_reference  # noqa: E402

spec = json.loads(sys.argv[1])
torch.manual_seed(0)
with training.set_default_dtype(torch.bfloat16):
    model = lora_llama3(**spec["builder"], quantize_base=spec.get("quantize_base", False))
set_trainable_params(model, get_adapter_params(model))
if spec.get("ac", True):
    training.set_activation_checkpointing(model, auto_wrap_policy={modules.TransformerSelfAttentionLayer})
ce = CEWithChunkedOutputLoss()
model.set_num_output_chunks(ce.num_output_chunks)
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)
B, T, V = spec["batch"], spec["seq"], spec["builder"]["vocab_size"]
g = torch.Generator().manual_seed(1)
tokens = torch.randint(0, V, (B, T), generator=g)
labels = torch.randint(0, V, (B, T), generator=g)



def loss_fn(model, tokens, labels):
    labels = torch.hstack((labels[..., 1:], torch.full((B, 1), ce.ignore_index)))
    logits = model(tokens)
    return ce(logits, labels)

out = peak_reference.measure(model, (tokens, labels), loss_fn, opt)
print(json.dumps({k: out[k] for k in ("bytes", "phase")}))

"""Run by a torchtune 0.6.1 interpreter (its own venv: torchtune 0.6.1 needs torchao 0.10.0): build a LoRA Llama 3 the
way recipes/lora_finetune_single_device.py _setup_model does, take one AdamW step, print its trainable tensors as JSON.

    python torchtune_build.py '{"dtype": "bf16", "builder": {...lora_llama3 arguments...}}'

_setup_model: `with training.set_default_dtype(self._dtype), self._device: model = config.instantiate(cfg_model)`;
`self.adapter_params = get_adapter_params(model)`; `set_trainable_params(model, self.adapter_params)`; DoRA layers get
`initialize_dora_magnitude()` once the base weights are in. The optimizer (torch.optim.AdamW here) takes the
trainable parameters."""

import json
import sys

import torch
from torchtune import training
from torchtune.models.llama3 import lora_llama3
from torchtune.modules.peft import DoRALinear, get_adapter_params, set_trainable_params

spec = json.loads(sys.argv[1])
dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[spec["dtype"]]
torch.manual_seed(0)
with training.set_default_dtype(dtype):
    model = lora_llama3(**spec["builder"])
adapter = get_adapter_params(model)
set_trainable_params(model, adapter)
for m in model.modules():
    if isinstance(m, DoRALinear):
        m.initialize_dora_magnitude()
trainable = [p for p in model.parameters() if p.requires_grad]
for p in trainable:
    p.grad = torch.zeros_like(p)
opt = torch.optim.AdamW(trainable, foreach=True)
opt.step()
moments = sum(t.numel() * t.element_size() for s in opt.state.values() for k, t in s.items() if k != "step")
print(json.dumps({
    "trainable": [[n, list(p.shape), str(p.dtype).replace("torch.", "")] for n, p in model.named_parameters() if p.requires_grad],
    "trainable_bytes": sum(p.numel() * p.element_size() for p in trainable),
    "adamw_moments": moments,
}))

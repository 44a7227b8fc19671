"""Run by a torchtune 0.6.1 interpreter (MEMFIT_TORCHTUNE_PYTHON): build each named builder (`family.builder`, e.g.
gemma2.gemma2_2b) on the meta device and print, as JSON, its parameter count; a `lora_*` builder is built with q, v,
output and the MLP adapted at rank 8 (alpha 16) and counts its adapters (`get_adapter_params`, what the LoRA recipe
trains).

    python torchtune_count.py gemma2.gemma2_2b gemma2.lora_gemma2_2b
"""

import importlib
import json
import sys

import torch
from torchtune.modules.peft import get_adapter_params

LORA = {"lora_attn_modules": ["q_proj", "v_proj", "output_proj"], "apply_lora_to_mlp": True, "lora_rank": 8, "lora_alpha": 16}
out = {}
for b in sys.argv[1:]:
    mod, name = b.rsplit(".", 1)
    fn = getattr(importlib.import_module("torchtune.models." + mod), name)  # imported outside the meta device (torchao's tables)
    lora = name.startswith("lora_")
    with torch.device("meta"):
        model = fn(**LORA) if lora else fn()
    params = get_adapter_params(model).values() if lora else model.parameters()
    out[b] = sum(p.numel() for p in params)
print(json.dumps(out))
